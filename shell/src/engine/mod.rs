//! The engine: the async driver of the pure core. One task owns the `Mesh`; storage is
//! reached through ports; the HTTP front holds an [`EngineHandle`].
//!
//! It uses tokio only through `madsim-tokio`, so the same engine runs under the madsim
//! simulator with in-memory ports (see `ports::MemoryLog`, `state::MemoryStore`).

//!
//! The rooms: `api` (errors and views, what callers get back), `command` (the task's
//! messages), `handle` (the front door), `task` (the owner of the mesh), `persist` (the
//! persist writer), `records` (stored bytes as core records), `ports` (storage traits and
//! in-memory ports), `tap` (an observer of the task, for the madsim harness), `dedup` (the
//! publish deduplication windows, used by the handle only). `handle` and
//! `task` share only `api` and `command`.

mod api;
mod command;
pub mod dedup;
mod handle;
mod persist;
mod shared;
pub use crate::storage::ports;
mod stream;
mod tap;
pub(crate) use crate::storage::{decode_record, spawn_blocking};
mod task;

#[cfg(test)]
mod tests;

use std::sync::atomic::Ordering as AtomicOrdering;
use std::sync::{Arc, Mutex};

use madsim_tokio as tokio;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use unimesh_core::{Mesh, MeshConfig, RateLimiter};

pub use crate::storage::memory::MemoryLog;
pub use crate::storage::state::StoreAdapter;
pub use api::{
    ClientInfo, DlqItem, EngineError, MetricsSnapshot, OffsetRow, PublishResult, PushTarget,
    Settling, Shared, SubscriptionInfo,
};
pub use handle::EngineHandle;
pub use ports::{
    BoxFut, BrokerMetrics, GroupEvent, GroupLog, LogMetrics, LogPort, LogRead, RecentAppend,
    RecentAppends, StatePort, StorageError, SubscriptionSink, TopicFacts,
};
pub use stream::{PushOutcome, Stream};

pub use tap::EngineTap;

use persist::persist_writer;
use task::EngineTask;

/// How the engine runs, beyond the core's own configuration.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    pub mesh: MeshConfig,
    /// How long a fetch at the end of a partition waits at the log for new records.
    pub fetch_wait_ms: u64,
    /// About how many bytes one fetch reads.
    pub fetch_max_bytes: usize,
    /// Requests queued for the engine task before callers wait (back-pressure).
    pub command_capacity: usize,
    /// Most rate-limit rules.
    pub max_rate_rules: usize,
    /// How often retention runs (0: never).
    pub retention_interval_ms: u64,
    /// Publish deduplication (off unless some topic has a window).
    pub dedup: dedup::DedupConfig,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            mesh: MeshConfig::default(),
            fetch_wait_ms: 1_000,
            fetch_max_bytes: 4 << 20,
            command_capacity: 4_096,
            max_rate_rules: 10_000,
            retention_interval_ms: 60_000,
            dedup: dedup::DedupConfig::default(),
        }
    }
}

/// Loads the state, builds the mesh (epoch + 1), assigns every recovered group its
/// partitions, and starts the engine task and the persist writer.
pub async fn start(
    config: EngineConfig,
    log: Arc<dyn LogPort>,
    state: Arc<dyn StatePort>,
) -> Result<(EngineHandle, JoinHandle<()>), EngineError> {
    start_observed(config, log, state, None).await
}

/// [`start`], with `tap` told everything the engine task does (see [`EngineTap`]).
pub async fn start_observed(
    config: EngineConfig,
    log: Arc<dyn LogPort>,
    state: Arc<dyn StatePort>,
    tap: Option<Arc<dyn EngineTap>>,
) -> Result<(EngineHandle, JoinHandle<()>), EngineError> {
    let mut loaded = state.load().await.map_err(EngineError::from)?;
    if loaded.shared_definitions {
        let read = std::mem::take(&mut loaded.recovered.subscriptions);
        loaded.recovered.subscriptions = shared::admitted(&config.mesh, read);
    }
    let mesh = Mesh::new(config.mesh.clone(), loaded.recovered, 0)
        .map_err(|e| EngineError::Unavailable(format!("cannot recover: {e}")))?;
    // Debug builds check the invariants as they serve, at most a tenth of the time (the
    // engine task's `InvariantSampler`), not inside every step.
    let mut mesh = mesh;
    mesh.check_every_step = false;
    let epoch = mesh.epoch();
    if let Some(tap) = &tap {
        tap.started(mesh.now(), epoch);
    }

    let start = Instant::now();
    let mut limiter = RateLimiter::new(config.max_rate_rules);
    for (topic, rule) in loaded.rate_rules {
        if let Err(e) = limiter.set_rule(0, topic.clone(), rule) {
            tracing::warn!(%topic, error = %e, "stored rate rule ignored");
        }
    }
    let dedup = dedup::Dedup::new(config.dedup.clone());
    if let Some(dedup) = &dedup {
        restore_dedup(dedup, &log).await;
    }
    let shared = Arc::new(Shared::default());
    shared.healthy.store(true, AtomicOrdering::Relaxed);

    let (commands_tx, commands_rx) = mpsc::channel(config.command_capacity.max(1));
    let (events_tx, events_rx) = mpsc::channel(config.command_capacity.max(1));
    let (persist_tx, persist_rx) = mpsc::channel(64);
    // Unbounded, but each notice answers deliveries the engine handed out (at most one
    // `Written` per batch taken, one `Failed` or `Settled` per delivery, one `Closed` per
    // session), which credit and `maxInFlightPerClient` bound.
    let (notices_tx, notices_rx) = mpsc::unbounded_channel();

    let mut task = EngineTask::new(
        mesh,
        log.clone(),
        shared.clone(),
        commands_rx,
        persist_tx,
        (events_tx.clone(), events_rx),
        (notices_tx, notices_rx),
        config.fetch_wait_ms,
        config.fetch_max_bytes,
    );
    task.start = start;
    task.tap = tap;
    let fences = task.fences.clone();
    if let Some(groups) = log.group() {
        let (group_tx, group_rx) = mpsc::channel(1_024);
        groups.attach(group_tx);
        task.group_events = Some(group_rx);
    }
    task.assign_recovered().await?;
    tracing::info!(epoch, "engine started");

    tokio::spawn(persist_writer(state.clone(), persist_rx, events_tx, fences));
    if config.retention_interval_ms > 0 {
        let log = log.clone();
        let every = std::time::Duration::from_millis(config.retention_interval_ms);
        let alive = commands_tx.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if alive.is_closed() {
                    break;
                }
                // A pass of its own (the log runs its deletes off the async workers).
                match tokio::spawn(log.enforce_retention()).await {
                    Ok(Ok(0)) => {}
                    Ok(Ok(n)) => tracing::info!(partitions = n, "retention deleted old records"),
                    Ok(Err(e)) => tracing::warn!(error = %e, "retention failed"),
                    Err(e) => tracing::warn!(error = %e, "retention task failed"),
                }
            }
        });
    }
    let join = tokio::spawn(task.run());
    Ok((
        EngineHandle {
            commands: commands_tx,
            log,
            state,
            limiter: Arc::new(Mutex::new(limiter)),
            shared,
            start,
            dedup,
        },
        join,
    ))
}

/// Refills the publish dedup windows from the log's newest records, when the log can tell
/// when they were appended (the embedded log). Bounded: at most `max_entries` records per
/// partition of each deduplicating topic are read, none older than its window. A log that
/// cannot tell (Kafka) leaves the windows empty, which is said once (DESIGN §8); a failed
/// read is said and leaves that much empty too: the mesh still starts.
async fn restore_dedup(dedup: &Arc<dedup::Dedup>, log: &Arc<dyn LogPort>) {
    let now_ms = persist::wall_ms();
    let found = {
        let (log, config) = (log.clone(), dedup.config().clone());
        spawn_blocking(move || {
            log.recent_appends(&|topic| {
                config
                    .rule(topic)
                    .map(|r| (now_ms.saturating_sub(r.window_ms), r.max_entries))
            })
        })
        .await
    };
    let topics = match found {
        Ok(Some(Ok(topics))) => topics,
        Ok(None) => {
            tracing::warn!(
                "publish deduplication: this log cannot tell when its records were appended, \
                 so each window starts empty and holds only what this instance accepted \
                 since it started (a repeat after a restart, or sent to another instance, \
                 is appended again)"
            );
            return;
        }
        Ok(Some(Err(e))) => {
            tracing::warn!(error = %e, "publish deduplication: the log's newest records could not be read; the windows start empty");
            return;
        }
        Err(e) => {
            tracing::warn!(error = %e, "publish deduplication: the restoring task failed; the windows start empty");
            return;
        }
    };
    for (topic, records) in topics {
        let found: Vec<_> = records
            .into_iter()
            .filter_map(|(at, partition, offset, stored)| {
                // A record the mesh did not write, or cannot read, has no identity to keep.
                let meta = crate::event::decode_stored(&stored).ok()?;
                Some((
                    at,
                    dedup::Identity::of(&meta.source, &meta.id),
                    (partition, offset),
                ))
            })
            .collect();
        let kept = dedup.restore(&topic, now_ms, found);
        tracing::info!(%topic, kept, "publish deduplication window restored from the log");
    }
}
