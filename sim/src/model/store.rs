//! A durable store with a barrier: a `Persist` batch counts only once applied, batches are
//! applied in ticket order and atomically, and a crash loses every batch not yet applied.
//! Checkpoints are kept in their byte encoding so every restart exercises the decoder.

use std::collections::{BTreeMap, VecDeque};

use unimesh_core::{
    Checkpoint, CheckpointError, DeadLetter, DlqKey, Epoch, GroupName, Partition, PersistBatch,
    Record, Recovered, SubscriptionSpec, Ticket, TopicName,
};

#[derive(Clone, Debug, Default)]
pub struct Store {
    epoch: Epoch,
    subscriptions: BTreeMap<GroupName, SubscriptionSpec>,
    checkpoints: BTreeMap<(GroupName, Partition), (TopicName, Vec<u8>)>,
    dlq: BTreeMap<DlqKey, DeadLetter>,
    pending: VecDeque<(Ticket, PersistBatch)>,
}

impl Store {
    pub fn submit(&mut self, ticket: Ticket, batch: PersistBatch) {
        self.pending.push_back((ticket, batch));
    }

    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    pub fn front_ticket(&self) -> Option<Ticket> {
        self.pending.front().map(|(t, _)| *t)
    }

    /// Makes the oldest pending batch durable and returns it.
    pub fn apply_front(&mut self) -> Option<(Ticket, PersistBatch)> {
        let (ticket, batch) = self.pending.pop_front()?;
        for g in &batch.removed_groups {
            self.subscriptions.remove(g);
            self.checkpoints.retain(|(cg, _), _| cg != g);
            self.dlq.retain(|k, _| k.group != *g);
        }
        for s in &batch.subscriptions {
            self.subscriptions.insert(s.group.clone(), s.clone());
        }
        for c in &batch.checkpoints {
            self.checkpoints.insert(
                (c.group.clone(), c.partition),
                (c.topic.clone(), c.checkpoint.encode()),
            );
        }
        for d in &batch.dead_letters {
            self.dlq.insert(d.key.clone(), d.clone());
        }
        for k in &batch.dlq_resolved {
            self.dlq.remove(k);
        }
        if let Some(e) = batch.epoch {
            self.epoch = e;
        }
        Some((ticket, batch))
    }

    /// The oldest pending batch could not be written: it is dropped, nothing of it counts.
    pub fn fail_front(&mut self) -> Option<Ticket> {
        self.pending.pop_front().map(|(t, _)| t)
    }

    /// The process died: unapplied batches are lost.
    pub fn crash(&mut self) {
        self.pending.clear();
    }

    pub fn checkpoint(
        &self,
        g: &GroupName,
        p: Partition,
    ) -> Result<Option<Checkpoint>, CheckpointError> {
        self.checkpoints
            .get(&(g.clone(), p))
            .map(|(_, bytes)| Checkpoint::decode(bytes))
            .transpose()
    }

    pub fn recovered(&self) -> Result<Recovered, CheckpointError> {
        let mut checkpoints = Vec::with_capacity(self.checkpoints.len());
        for ((g, p), (_, bytes)) in &self.checkpoints {
            checkpoints.push((g.clone(), *p, Checkpoint::decode(bytes)?));
        }
        Ok(Recovered {
            epoch: self.epoch,
            subscriptions: self.subscriptions.values().cloned().collect(),
            checkpoints,
        })
    }

    /// Up to `max` dead letters of a group, oldest key first, for a replay.
    pub fn dead_letters(&self, g: &GroupName, max: usize) -> Vec<(Partition, Record)> {
        self.dlq
            .iter()
            .filter(|(k, _)| k.group == *g)
            .take(max)
            .map(|(k, d)| (k.partition, d.record.clone()))
            .collect()
    }

    pub fn dlq_len(&self) -> usize {
        self.dlq.len()
    }
}
