//! The ports through which the engine reaches storage: the event log (the broker) and the
//! state store. The engine sees only these traits, so a simulation can run it against
//! in-memory ports with simulated time, faults and crashes.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use madsim_tokio as tokio;
use tokio::sync::mpsc;
use unimesh_core::{
    Assignment, DlqKey, GroupName, Offset, Partition, PersistBatch, RateRule, Record, TopicName,
};

use crate::log::AppendItem;
#[cfg(feature = "rocksdb")]
use crate::log::{EmbeddedLog, LogError, ReadResult};
use crate::state::{DlqEntry, Loaded, StateStore, StoreError};

/// A record found by [`LogPort::recent_appends`]: (append wall ms, partition, offset, the
/// stored bytes).
pub type RecentAppend = (u64, Partition, Offset, Bytes);

/// What [`LogPort::recent_appends`] found: per topic, its records in the window; `None`
/// when the log cannot tell.
pub type RecentAppends = Option<Result<Vec<(TopicName, Vec<RecentAppend>)>, String>>;

pub type BoxFut<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// What a fetch found, before decoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogRead {
    Records(Vec<(Offset, Bytes)>),
    /// Records the port already decoded (a broker whose records are not in the stored
    /// form, such as Kafka's CloudEvents binding): undecodable ones carry their reason.
    Decoded(Vec<Record>),
    OutOfRange {
        earliest: Offset,
        end: Offset,
    },
    Failed(String),
}

impl LogRead {
    /// No records and nothing wrong: the read was at the end of the partition.
    fn at_end(&self) -> bool {
        matches!(self, LogRead::Records(r) if r.is_empty())
    }
}

/// Why a publish failed: the caller's fault (4xx) or the storage's (503).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AppendError {
    TooLarge(String),
    Invalid(String),
    Unavailable(String),
}

/// What a log reports about itself for `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogMetrics {
    /// Records durably appended since the log was opened.
    pub records_appended: u64,
    /// Synced writes that carried them (records per write shows how well appends group).
    pub synced_writes: u64,
    /// Appends refused because a write failed.
    pub write_failures: u64,
    /// Bytes of table files on disk, if the log can tell.
    pub disk_bytes: Option<u64>,
    /// What a broker with consumer groups counts (the Kafka backend).
    pub broker: Option<BrokerMetrics>,
}

/// Counters of a broker with consumer groups, for `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BrokerMetrics {
    /// Rebalance callbacks (assignments and revocations) run.
    pub rebalances: u64,
    /// Writes the broker refused or did not acknowledge (each publish answered 503).
    pub producer_errors: u64,
    /// Fetches answered "offset out of range" (the core repositions and reports it).
    pub out_of_range: u64,
    /// Offset commits that failed (the next commit carries the watermark).
    pub commit_failures: u64,
    /// ACK ranges and attempt counts left out of progress records to keep them bounded.
    pub progress_ranges_dropped: u64,
    /// Lanes whose log diverged from what they knew (a lost tail, found by leader epochs
    /// or a log shorter than the checkpoint): the core forgot from there and reported it.
    pub log_divergences: u64,
    /// Partition ends the broker claimed below records it still held (a claim the log
    /// refuted; nothing was dropped for it).
    pub end_anomalies: u64,
    /// Offsets a broker answered as absent right after a reposition that a read from
    /// further back showed to exist (tansu answers a fetch from inside a batch with the
    /// next batch).
    pub gaps_refuted: u64,
    /// Reads of the progress topic at an assignment that failed and were tried again.
    pub progress_read_retries: u64,
    /// Whether the broker answered the last probe (a gauge).
    pub broker_up: bool,
    /// Clients built anew because the one in use was in a fatal state.
    pub client_rebuilds: u64,
    /// Group requests sent to a coordinator whose rebalance seemed stuck (a broker that
    /// keeps a dead member as the group's leader; DESIGN §8).
    pub group_nudges: u64,
}

/// What the engine learns of a topic before a group reads it ([`LogPort::prepare_topic`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopicFacts {
    pub partitions: u32,
    /// (earliest, end) of each partition, in partition order, when they were asked for;
    /// else empty.
    pub offsets: Vec<(Offset, Offset)>,
}

impl TopicFacts {
    /// The facts of a topic whose offsets can be read at once (a log in memory, or one
    /// whose reads do not block): `offsets` is asked for each partition when `with_offsets`.
    pub fn read(
        partitions: u32,
        with_offsets: bool,
        offsets: impl Fn(Partition) -> Result<(Offset, Offset), String>,
    ) -> Result<TopicFacts, AppendError> {
        let offsets = if with_offsets {
            (0..partitions)
                .map(&offsets)
                .collect::<Result<Vec<_>, _>>()
                .map_err(AppendError::Unavailable)?
        } else {
            Vec::new()
        };
        Ok(TopicFacts {
            partitions,
            offsets,
        })
    }
}

/// What a broker that assigns partitions itself (Kafka's group coordinator) tells the
/// engine about a group it joined through [`LogPort::join`].
#[derive(Debug)]
pub enum GroupEvent {
    /// The group now owns these partitions here, each with the progress read for it.
    Assigned {
        group: GroupName,
        partitions: Vec<Assignment>,
    },
    /// The group is losing these partitions. The engine makes the group's progress durable
    /// (which commits it), stops every effect for them, then answers `done`; the broker
    /// hands them on only after that answer. When `lost` (the broker already gave them to
    /// another instance: a session timeout), nothing is written for them any more — a
    /// late write of this zombie would overwrite the new owner's progress.
    Revoking {
        group: GroupName,
        partitions: Vec<Partition>,
        lost: bool,
        done: std::sync::mpsc::SyncSender<()>,
    },
}

/// The broker as the engine uses it.
pub trait LogPort: Send + Sync + 'static {
    /// Up to `max` records (about `max_bytes`) from `from`, read for `group` (a broker with
    /// consumer groups reads through the group's consumer). When `from` is the end, waits up
    /// to `wait_ms` for new records before answering empty, so the engine can ask again at
    /// once without spinning.
    #[allow(clippy::too_many_arguments)]
    fn fetch(
        &self,
        group: GroupName,
        topic: TopicName,
        partition: Partition,
        from: Offset,
        max: usize,
        max_bytes: usize,
        wait_ms: u64,
    ) -> BoxFut<LogRead>;

    /// Durably appends; answers (partition, offset) per item, in order.
    fn append(
        &self,
        topic: TopicName,
        items: Vec<AppendItem>,
    ) -> BoxFut<Result<Vec<(Partition, Offset)>, AppendError>>;

    /// The partition count of a topic, creating it with the default count if needed, and
    /// with `with_offsets` the (earliest, end) of each partition. `Invalid` when the caller
    /// asked for too much (the topic limit), `Unavailable` when storage failed. Answered off
    /// the engine task: a creation is a synced write, a broker answers over the network, and
    /// the engine serves everyone else meanwhile.
    fn prepare_topic(
        &self,
        topic: TopicName,
        with_offsets: bool,
    ) -> BoxFut<Result<TopicFacts, AppendError>>;

    /// The partition count of an existing topic.
    fn partitions(&self, topic: &TopicName) -> Option<u32>;

    /// (earliest, end) of a partition.
    fn offsets(&self, topic: &TopicName, partition: Partition) -> Result<(Offset, Offset), String>;

    /// The first offset of a partition whose record was appended at or after `time_ms` (ms
    /// since the Unix epoch; on Kafka the record's timestamp, as offsets-for-times reads
    /// it): the earliest offset for a time before every record, the end for one after them
    /// all. `Invalid` for a topic or partition the log does not have, `Unavailable` when
    /// storage failed. Answered off the engine task (a few reads, or a broker round trip).
    /// A log that keeps no append times (the simulation's) refuses it.
    fn offset_for_time(
        &self,
        topic: TopicName,
        _partition: Partition,
        _time_ms: u64,
    ) -> BoxFut<Result<Offset, AppendError>> {
        Box::pin(async move {
            Err(AppendError::Invalid(format!(
                "the log of topic {topic} keeps no append times: seek by offset"
            )))
        })
    }

    /// Applies retention; returns how many partitions moved their earliest offset.
    /// Applies retention as of the log's own clock (the one that stamped its records).
    fn enforce_retention(&self) -> Result<usize, String>;

    /// A fault that keeps the log from taking appends until the process restarts, if any.
    /// The health check reports it.
    fn fault(&self) -> Option<String> {
        None
    }

    /// Counters for `/metrics`, when the log keeps them. Cheap: called at every scrape.
    fn metrics(&self) -> Option<LogMetrics> {
        None
    }

    /// True when the broker assigns partitions to groups ([`LogPort::join`] and
    /// [`GroupEvent`]); false when this instance owns every partition (the engine assigns
    /// them all at subscribe).
    fn assigns_partitions(&self) -> bool {
        false
    }

    /// Where [`GroupEvent`]s go; called once, before any `join`.
    fn attach(&self, _events: mpsc::Sender<GroupEvent>) {}

    /// Joins `group` (reading `topic`) at the broker; its partitions arrive as
    /// [`GroupEvent::Assigned`].
    fn join(&self, _group: &GroupName, _topic: &TopicName) -> Result<(), String> {
        Ok(())
    }

    /// Leaves `group` at the broker (the group was deleted).
    fn leave(&self, _group: &GroupName) {}

    /// Commits `group`'s durable watermark of a partition to the broker.
    fn commit(
        &self,
        _group: &GroupName,
        _topic: &TopicName,
        _partition: Partition,
        _offset: Offset,
    ) {
    }

    /// This instance's name, when several instances share the broker (shown as the owner
    /// of the partitions it holds).
    fn instance(&self) -> Option<String> {
        None
    }

    /// For the publish dedup windows, refilled at start (DESIGN §8): each topic this log
    /// holds for which `window_of` answers (appended since ms, most records per partition),
    /// with those of its records, newest first per partition. `None`: this log cannot tell
    /// when its records were appended, and the windows start empty. Blocking: called once,
    /// off the async workers.
    fn recent_appends(
        &self,
        _window_of: &dyn Fn(&TopicName) -> Option<(u64, usize)>,
    ) -> RecentAppends {
        None
    }

    /// Stops every consumer (revoking what they hold, so the progress is committed); called
    /// once at shutdown, after the engine flushed.
    fn close(&self) -> BoxFut<()> {
        Box::pin(async {})
    }
}

/// The state store as the engine uses it.
pub trait StatePort: Send + Sync + 'static {
    fn load(&self) -> Result<Loaded, String>;
    /// Applies a batch atomically and durably. Batches are handed over in ticket order and
    /// one at a time, so the store sees them in order.
    fn apply(&self, batch: Arc<PersistBatch>, now_wall_ms: u64) -> BoxFut<Result<(), String>>;
    fn dlq_list(&self, group: GroupName, max: usize) -> BoxFut<Result<Vec<DlqEntry>, String>>;
    /// The dead letters to hand the core for a replay. A store that can hold two records
    /// at one key (the Kafka backend, after a lost tail) hands at most one record of a key
    /// at a time and remembers which, because a resolution names only the key.
    fn dlq_list_for_replay(
        &self,
        group: GroupName,
        max: usize,
    ) -> BoxFut<Result<Vec<DlqEntry>, String>> {
        self.dlq_list(group, max)
    }
    /// The core did not take the replay of these entries (of [`Self::dlq_list_for_replay`]).
    fn dlq_replay_refused(&self, _group: &GroupName, _keys: &[DlqKey]) {}
    fn put_rate_rule(&self, topic: TopicName, rule: Option<RateRule>)
        -> BoxFut<Result<(), String>>;
}

// ----- the embedded log -----

/// One read of the embedded log on the blocking pool (RocksDB calls block).
#[cfg(feature = "rocksdb")]
async fn read_blocking(
    log: EmbeddedLog,
    topic: TopicName,
    partition: Partition,
    from: Offset,
    max: usize,
    max_bytes: usize,
) -> LogRead {
    // What memory can answer (a group that keeps up reads the newest records) needs no
    // RocksDB read and no trip to the blocking pool.
    if let Some(read) = log.read_recent(&topic, partition, from, max, max_bytes) {
        return log_read(read);
    }
    let read =
        super::spawn_blocking(move || log.read(&topic, partition, from, max, max_bytes)).await;
    match read {
        Ok(Ok(read)) => log_read(read),
        Ok(Err(e)) => LogRead::Failed(e.to_string()),
        Err(e) => LogRead::Failed(format!("read task failed: {e}")),
    }
}

#[cfg(feature = "rocksdb")]
fn log_read(read: ReadResult) -> LogRead {
    match read {
        ReadResult::Records { records, .. } => LogRead::Records(records),
        ReadResult::OutOfRange { earliest, end } => LogRead::OutOfRange { earliest, end },
    }
}

/// Sorts the embedded log's errors into what the caller did wrong and what failed.
#[cfg(feature = "rocksdb")]
fn append_error(e: LogError) -> AppendError {
    match e {
        LogError::RecordTooLarge { .. }
        | LogError::AppendTooLarge { .. }
        | LogError::TooManyRecords { .. } => AppendError::TooLarge(e.to_string()),
        e if e.is_caller_error() => AppendError::Invalid(e.to_string()),
        e => AppendError::Unavailable(e.to_string()),
    }
}

#[cfg(feature = "rocksdb")]
impl LogPort for EmbeddedLog {
    fn fetch(
        &self,
        _group: GroupName,
        topic: TopicName,
        partition: Partition,
        from: Offset,
        max: usize,
        max_bytes: usize,
        wait_ms: u64,
    ) -> BoxFut<LogRead> {
        let log = self.clone();
        Box::pin(async move {
            let first =
                read_blocking(log.clone(), topic.clone(), partition, from, max, max_bytes).await;
            if !first.at_end() {
                return first;
            }
            // At the end: park until the writer publishes a new end, or the wait is over.
            // The watch holds the current end, so an append since the read is not missed.
            let Ok(mut end) = log.watch_end(&topic, partition) else {
                return first;
            };
            let waited = tokio::time::timeout(Duration::from_millis(wait_ms), async {
                while *end.borrow_and_update() <= from {
                    if end.changed().await.is_err() {
                        break;
                    }
                }
            })
            .await;
            if waited.is_err() {
                return first;
            }
            read_blocking(log, topic, partition, from, max, max_bytes).await
        })
    }

    fn append(
        &self,
        topic: TopicName,
        items: Vec<AppendItem>,
    ) -> BoxFut<Result<Vec<(Partition, Offset)>, AppendError>> {
        let log = self.clone();
        Box::pin(async move { log.append(&topic, items).await.map_err(append_error) })
    }

    fn prepare_topic(
        &self,
        topic: TopicName,
        with_offsets: bool,
    ) -> BoxFut<Result<TopicFacts, AppendError>> {
        let log = self.clone();
        Box::pin(async move {
            // Creating a topic is a synced RocksDB write: the blocking pool's.
            super::spawn_blocking(move || {
                let info = EmbeddedLog::ensure_topic(&log, &topic).map_err(append_error)?;
                TopicFacts::read(info.partitions, with_offsets, |p| {
                    EmbeddedLog::offsets(&log, &topic, p).map_err(|e| e.to_string())
                })
            })
            .await
            .unwrap_or_else(|e| Err(AppendError::Unavailable(format!("topic task failed: {e}"))))
        })
    }

    fn partitions(&self, topic: &TopicName) -> Option<u32> {
        self.topic(topic).map(|t| t.partitions)
    }

    fn offset_for_time(
        &self,
        topic: TopicName,
        partition: Partition,
        time_ms: u64,
    ) -> BoxFut<Result<Offset, AppendError>> {
        let log = self.clone();
        Box::pin(async move {
            // A few RocksDB point reads: the blocking pool's.
            super::spawn_blocking(move || {
                EmbeddedLog::offset_for_time(&log, &topic, partition, time_ms).map_err(append_error)
            })
            .await
            .unwrap_or_else(|e| Err(AppendError::Unavailable(format!("lookup task failed: {e}"))))
        })
    }

    fn offsets(&self, topic: &TopicName, partition: Partition) -> Result<(Offset, Offset), String> {
        EmbeddedLog::offsets(self, topic, partition).map_err(|e| e.to_string())
    }

    fn enforce_retention(&self) -> Result<usize, String> {
        let now_wall_ms = self.config().clock.now_ms();
        let report =
            EmbeddedLog::enforce_retention(self, now_wall_ms).map_err(|e| e.to_string())?;
        for (topic, partition, error) in &report.failed {
            tracing::warn!(%topic, partition, %error, "retention failed for a partition");
        }
        Ok(report.truncated.len())
    }

    fn recent_appends(
        &self,
        window_of: &dyn Fn(&TopicName) -> Option<(u64, usize)>,
    ) -> RecentAppends {
        let mut out = Vec::new();
        for info in self.topics() {
            let Some((since_ms, max)) = window_of(&info.name) else {
                continue;
            };
            let mut records = Vec::new();
            for partition in 0..info.partitions {
                match self.appended_since(&info.name, partition, since_ms, max) {
                    Ok(found) => records.extend(
                        found
                            .into_iter()
                            .map(|(at, offset, bytes)| (at, partition, offset, bytes)),
                    ),
                    Err(e) => return Some(Err(format!("{}/{partition}: {e}", info.name))),
                }
            }
            out.push((info.name, records));
        }
        Some(Ok(out))
    }

    fn fault(&self) -> Option<String> {
        EmbeddedLog::fault(self)
    }

    fn metrics(&self) -> Option<LogMetrics> {
        let stats = self.stats();
        Some(LogMetrics {
            records_appended: stats.records_appended,
            synced_writes: stats.synced_writes,
            write_failures: stats.write_failures,
            disk_bytes: self.disk_bytes().ok(),
            broker: None,
        })
    }
}

// ----- state stores -----

/// Any [`StateStore`] as a port: blocking calls run on the blocking pool, one at a time.
pub struct StoreAdapter {
    store: Arc<Mutex<Box<dyn StateStore>>>,
}

impl StoreAdapter {
    pub fn new(store: Box<dyn StateStore>) -> Self {
        Self {
            store: Arc::new(Mutex::new(store)),
        }
    }

    fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut dyn StateStore) -> Result<T, StoreError> + Send + 'static,
    ) -> BoxFut<Result<T, String>> {
        let store = self.store.clone();
        Box::pin(async move {
            super::spawn_blocking(move || {
                // A poisoned lock means a store call panicked; the store itself is still
                // the one on disk, so carry on with it rather than wedge every caller.
                let mut guard = store.lock().unwrap_or_else(|p| p.into_inner());
                f(guard.as_mut()).map_err(|e| e.to_string())
            })
            .await
            .map_err(|e| format!("store task failed: {e}"))?
        })
    }
}

impl StatePort for StoreAdapter {
    fn load(&self) -> Result<Loaded, String> {
        let guard = self.store.lock().unwrap_or_else(|p| p.into_inner());
        guard.load().map_err(|e| e.to_string())
    }

    fn apply(&self, batch: Arc<PersistBatch>, now_wall_ms: u64) -> BoxFut<Result<(), String>> {
        self.blocking(move |s| s.apply(&batch, now_wall_ms))
    }

    fn dlq_list(&self, group: GroupName, max: usize) -> BoxFut<Result<Vec<DlqEntry>, String>> {
        self.blocking(move |s| s.dlq_list(&group, None, max))
    }

    fn put_rate_rule(
        &self,
        topic: TopicName,
        rule: Option<RateRule>,
    ) -> BoxFut<Result<(), String>> {
        self.blocking(move |s| s.put_rate_rule(&topic, rule))
    }
}

// ----- an in-memory log, for tests and simulation -----

#[derive(Default)]
struct MemTopic {
    partitions: Vec<Vec<Bytes>>,
    /// Each record's append time (wall clock ms), kept non-decreasing per partition.
    times: Vec<Vec<u64>>,
    earliest: Vec<Offset>,
}

/// A log in memory: dense offsets, round-robin or keyed partitioning, no durability. A fetch
/// at the end waits up to its `wait_ms` for an append, so the engine does not spin.
pub struct MemoryLog {
    topics: Mutex<BTreeMap<TopicName, MemTopic>>,
    default_partitions: u32,
    notify: tokio::sync::Notify,
    round_robin: std::sync::atomic::AtomicU32,
    fault: Mutex<Option<String>>,
}

impl MemoryLog {
    pub fn new(default_partitions: u32) -> Self {
        Self {
            topics: Mutex::new(BTreeMap::new()),
            default_partitions: default_partitions.max(1),
            notify: tokio::sync::Notify::new(),
            round_robin: std::sync::atomic::AtomicU32::new(0),
            fault: Mutex::new(None),
        }
    }

    /// The partition count of a topic, created with the default count if needed.
    pub fn ensure_topic(&self, topic: &TopicName) -> u32 {
        let mut topics = self.topics.lock().unwrap_or_else(|p| p.into_inner());
        let n = self.default_partitions;
        let t = topics.entry(topic.clone()).or_insert_with(|| MemTopic {
            partitions: vec![Vec::new(); n as usize],
            times: vec![Vec::new(); n as usize],
            earliest: vec![0; n as usize],
        });
        t.partitions.len() as u32
    }

    /// Refuses every append with this reason (as the embedded log does after a failed
    /// write), or takes appends again with `None`; for tests.
    pub fn set_fault(&self, fault: Option<String>) {
        *self.fault.lock().unwrap_or_else(|p| p.into_inner()) = fault;
    }

    fn read(&self, topic: &TopicName, partition: Partition, from: Offset, max: usize) -> LogRead {
        let topics = self.topics.lock().unwrap_or_else(|p| p.into_inner());
        let Some(t) = topics.get(topic) else {
            return LogRead::Failed(format!("unknown topic {topic}"));
        };
        let Some(p) = t.partitions.get(partition as usize) else {
            return LogRead::Failed(format!("unknown partition {partition}"));
        };
        let earliest = t.earliest[partition as usize];
        let end = p.len() as Offset;
        if from < earliest || from > end {
            return LogRead::OutOfRange { earliest, end };
        }
        let hi = (from as usize).saturating_add(max).min(p.len());
        LogRead::Records(
            (from as usize..hi)
                .map(|o| (o as Offset, p[o].clone()))
                .collect(),
        )
    }
}

impl LogPort for Arc<MemoryLog> {
    fn fetch(
        &self,
        _group: GroupName,
        topic: TopicName,
        partition: Partition,
        from: Offset,
        max: usize,
        _max_bytes: usize,
        wait_ms: u64,
    ) -> BoxFut<LogRead> {
        let log = self.clone();
        Box::pin(async move {
            // Created before the read, the `Notified` catches an append that lands between
            // the read and the wait.
            let notified = log.notify.notified();
            let first = log.read(&topic, partition, from, max);
            if !first.at_end() {
                return first;
            }
            let _ = tokio::time::timeout(Duration::from_millis(wait_ms), notified).await;
            log.read(&topic, partition, from, max)
        })
    }

    fn append(
        &self,
        topic: TopicName,
        items: Vec<AppendItem>,
    ) -> BoxFut<Result<Vec<(Partition, Offset)>, AppendError>> {
        let log = self.clone();
        Box::pin(async move {
            if let Some(fault) = LogPort::fault(&log) {
                return Err(AppendError::Unavailable(fault));
            }
            let n = log.ensure_topic(&topic);
            let mut out = Vec::with_capacity(items.len());
            {
                let mut topics = log.topics.lock().unwrap_or_else(|p| p.into_inner());
                let t = topics
                    .get_mut(&topic)
                    .ok_or_else(|| AppendError::Unavailable("topic vanished".into()))?;
                for item in items {
                    let p = match &item.key {
                        Some(k) => crate::log::partition_for_key(k.as_bytes(), n),
                        None => {
                            log.round_robin
                                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                                % n
                        }
                    };
                    let part = &mut t.partitions[p as usize];
                    out.push((p, part.len() as Offset));
                    part.push(item.value);
                    let times = &mut t.times[p as usize];
                    let last = times.last().copied().unwrap_or(0);
                    times.push(crate::log::WallClock::now_ms(&crate::log::SystemClock).max(last));
                }
            }
            log.notify.notify_waiters();
            Ok(out)
        })
    }

    fn prepare_topic(
        &self,
        topic: TopicName,
        with_offsets: bool,
    ) -> BoxFut<Result<TopicFacts, AppendError>> {
        let facts = TopicFacts::read(self.ensure_topic(&topic), with_offsets, |p| {
            self.offsets(&topic, p)
        });
        Box::pin(async move { facts })
    }

    fn partitions(&self, topic: &TopicName) -> Option<u32> {
        let topics = self.topics.lock().unwrap_or_else(|p| p.into_inner());
        topics.get(topic).map(|t| t.partitions.len() as u32)
    }

    fn offset_for_time(
        &self,
        topic: TopicName,
        partition: Partition,
        time_ms: u64,
    ) -> BoxFut<Result<Offset, AppendError>> {
        let found = {
            let topics = self.topics.lock().unwrap_or_else(|p| p.into_inner());
            match topics.get(&topic) {
                None => Err(AppendError::Invalid(format!("unknown topic {topic}"))),
                Some(t) => match t.times.get(partition as usize) {
                    None => Err(AppendError::Invalid(format!(
                        "topic {topic} has no partition {partition}"
                    ))),
                    Some(times) => {
                        let earliest = t.earliest[partition as usize];
                        let first = times.partition_point(|&ms| ms < time_ms) as Offset;
                        Ok(first.max(earliest))
                    }
                },
            }
        };
        Box::pin(async move { found })
    }

    fn offsets(&self, topic: &TopicName, partition: Partition) -> Result<(Offset, Offset), String> {
        let topics = self.topics.lock().unwrap_or_else(|p| p.into_inner());
        let t = topics
            .get(topic)
            .ok_or_else(|| format!("unknown topic {topic}"))?;
        let p = t
            .partitions
            .get(partition as usize)
            .ok_or_else(|| format!("unknown partition {partition}"))?;
        Ok((t.earliest[partition as usize], p.len() as Offset))
    }

    fn enforce_retention(&self) -> Result<usize, String> {
        Ok(0)
    }

    fn fault(&self) -> Option<String> {
        self.fault.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
