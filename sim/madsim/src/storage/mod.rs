//! Storage for the mesh node, and where a new storage port plugs in.
//!
//! A [`Backend`] gives each incarnation of the node its two ports; the harness wraps them in
//! the fault injectors of `faulty` (fetch answers failed, delayed, duplicated, rewound,
//! "out of range"; appends and state writes failed, also after writing) and starts the
//! engine on them exactly as `serve` does. What a backend owes the harness is honest
//! durability, reported to the [`World`] at the instant a write becomes durable:
//! - every record the broker keeps: [`World::published`], each partition in offset order
//!   from 0, before any fetch can return it and before its append is answered;
//! - every prefix retention deletes: [`World::retention`];
//! - every state batch: [`World::persist_durable`], from inside the commit (the `Arc` the
//!   engine queued is the one its `StatePort::apply` gets).
//!
//! A kill of the node must lose exactly what was not durable: state that outlives the node
//! (a disk, a broker on its own node) lives in the backend, which the harness keeps outside.
//! A backend is made inside the runtime (`run::run_seed_on`), so it may build nodes of its
//! own there (a broker).
//! [`MemoryBackend`] is the embedded-log shape: the log and the state store on the node's
//! disk. [`KafkaBackend`] is the shell's Kafka port against madsim-rdkafka's simulated
//! broker on a node of its own, with the harness's group coordinator (see `kafka`,
//! `coordinator`), for one mesh node or several.

mod coordinator;
mod faulty;
mod kafka;
mod log;
mod state;

use std::sync::Arc;

use bytes::Bytes;
use unimesh_core::TopicName;
use unimesh_shell::engine::{BoxFut, EngineConfig, LogPort};
use unimesh_shell::state::{MemoryDisk, MemoryStore};
use unimesh_shell::storage;
use unimesh_sim::rng::Rng;

pub use faulty::{FaultyLog, FaultyState};
pub use kafka::KafkaBackend;
pub use log::{LogDisk, SimLog};
pub use state::ReportingStore;

use crate::world::World;

/// Storage the mesh node runs on (see the module documentation).
pub trait Backend: Send + Sync + 'static {
    fn name(&self) -> &'static str;

    /// The ports of one incarnation of mesh node `node`, built on the node at every start
    /// (a broker's clients connect first). `rng` is the incarnation's own (drawn from the
    /// seed).
    fn ports(&self, world: &Arc<World>, node: usize, rng: Rng) -> BoxFut<Result<Ports, String>>;

    /// Adjusts the engine's configuration to the broker (a broker that keeps group
    /// offsets wants `mesh.commit_to_broker`, whose `Commit` effects the checker judges).
    fn configure(&self, config: &mut EngineConfig) {
        let _ = config;
    }

    /// Mesh node `node` was just killed: report what became durable before the kill and
    /// was not reported yet (a broker on its own node that answers after a delay). The
    /// world hears of the crash after this.
    fn killed(&self, world: &Arc<World>, node: usize) -> BoxFut<()> {
        let _ = (world, node);
        Box::pin(std::future::ready(()))
    }

    /// The simulated nodes the backend made (a broker's, a tap's), killed with the run's
    /// own at its end (see `run::simulate`).
    fn nodes(&self) -> Vec<madsim::task::NodeId> {
        Vec::new()
    }

    /// Loses the heartbeats of mesh node `node` to the group coordinator for `for_ms`
    /// (while faults last), if the broker has one: the node runs on, and once its session
    /// expired it is a zombie until a heartbeat gets through. False when it has none.
    fn lose_heartbeats(&self, world: &Arc<World>, node: usize, for_ms: u64) -> bool {
        let _ = (world, node, for_ms);
        false
    }

    /// Writes a record to the broker from outside the mesh (bytes that need not decode as
    /// an event), if the backend can. Reported like any other record.
    fn write_foreign(&self, world: &Arc<World>, topic: &TopicName, body: Bytes) -> bool {
        let _ = (world, topic, body);
        false
    }
}

/// The log and state ports of one incarnation.
pub use unimesh_shell::storage::Ports;

/// The embedded shape: the simulated log and the shell's memory state store, both on a
/// disk that outlives the node.
pub struct MemoryBackend {
    log: Arc<LogDisk>,
    disk: MemoryDisk,
}

impl MemoryBackend {
    pub fn new(default_partitions: u32) -> Self {
        Self {
            log: Arc::new(LogDisk::new(default_partitions)),
            disk: MemoryDisk::new(),
        }
    }
}

impl Backend for MemoryBackend {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn ports(&self, world: &Arc<World>, node: usize, rng: Rng) -> BoxFut<Result<Ports, String>> {
        // Through the shell's factory, as `serve` opens storage: the simulated log stands
        // in for the embedded one.
        let log: Arc<dyn LogPort> = Arc::new(SimLog::new(self.log.clone(), world.clone(), rng));
        let store = ReportingStore::new(MemoryStore::open(self.disk.clone()), world.clone(), node);
        Box::pin(async move {
            let opened = storage::Backend::Given(log)
                .open(Box::new(store), None)
                .await?
                .ok_or("the storage factory stopped without a broker to wait for")?;
            Ok(opened.ports())
        })
    }

    fn write_foreign(&self, world: &Arc<World>, topic: &TopicName, body: Bytes) -> bool {
        self.log.ensure_topic(topic);
        self.log.write_foreign(world, topic, body);
        true
    }
}
