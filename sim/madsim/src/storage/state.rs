//! The state store of the simulation: the shell's own [`MemoryStore`] (its keys, codec and
//! batch translation) on a [`MemoryDisk`] that outlives the node, behind the shell's own
//! [`StoreAdapter`] — wrapped so the world hears of each batch at the instant its commit
//! lands, the only moment at which "durable" is true (a kill right after still keeps it).

use std::sync::Arc;

use unimesh_core::{DlqKey, GroupName, PersistBatch, RateRule, TopicName};
use unimesh_shell::state::{DlqEntry, Loaded, MemoryStore, StateStore, StoreError};

use crate::world::World;

/// A [`StateStore`] of mesh node `node` that reports every commit to the world.
pub struct ReportingStore {
    inner: MemoryStore,
    world: Arc<World>,
    node: usize,
    /// Only the epoch of each commit: the store is the local part of another state port
    /// (the Kafka backend's), whose batches count elsewhere.
    epochs_only: bool,
}

impl ReportingStore {
    pub fn new(inner: MemoryStore, world: Arc<World>, node: usize) -> Self {
        Self {
            inner,
            world,
            node,
            epochs_only: false,
        }
    }

    /// A store that reports the epoch of each commit (`World::epoch_durable`), not the
    /// commit as a batch.
    pub fn epochs(inner: MemoryStore, world: Arc<World>, node: usize) -> Self {
        Self {
            epochs_only: true,
            ..Self::new(inner, world, node)
        }
    }
}

impl StateStore for ReportingStore {
    fn load(&self) -> Result<Loaded, StoreError> {
        self.inner.load()
    }

    fn apply(&mut self, batch: &PersistBatch, now_wall_ms: u64) -> Result<(), StoreError> {
        self.inner.apply(batch, now_wall_ms)?;
        match batch.epoch {
            _ if !self.epochs_only => self.world.persist_durable(self.node, batch),
            Some(epoch) => self.world.epoch_durable(self.node, epoch),
            None => {}
        }
        Ok(())
    }

    fn dlq_list(
        &self,
        group: &GroupName,
        after: Option<&DlqKey>,
        max: usize,
    ) -> Result<Vec<DlqEntry>, StoreError> {
        self.inner.dlq_list(group, after, max)
    }

    fn dlq_count(&self, group: &GroupName) -> Result<u64, StoreError> {
        self.inner.dlq_count(group)
    }

    fn put_rate_rule(
        &mut self,
        topic: &TopicName,
        rule: Option<RateRule>,
    ) -> Result<(), StoreError> {
        self.inner.put_rate_rule(topic, rule)
    }
}
