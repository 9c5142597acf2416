//! A durable store with a barrier: a `Persist` batch counts only once applied, batches are
//! applied in ticket order and atomically, and a crash loses every batch not yet applied.
//! Checkpoints are kept in their byte encoding so every restart exercises the decoder.
//!
//! One store serves a whole cluster, as a Kafka deployment's topics do: subscriptions, the
//! progress of every lane (the progress topic) and the DLQ ledger are shared; the epoch and
//! the queue of batches not yet written are each instance's own. The shell stamps every
//! checkpoint it submits with what the group coordinator and the broker told it — the
//! generation of its ownership of the lane and the leader epoch its position came from —
//! so the store *fences* a checkpoint of an owner the coordinator has since replaced (a
//! zombie: the whole batch fails, as a fenced transaction does), and a reader *clips* a
//! checkpoint written before the broker lost its tail (nothing done at or above the
//! divergence point: those offsets name new records).
//!
//! DLQ entries are keyed by their record's coordinates, which a lost tail reuses: the
//! ledger keeps one entry per *record* at a key (writing a record's dead letter again
//! replaces its own entry: exactly once per group and record), so the dead letters of a
//! lost record and of the new record at its offset both stay. A batch resolving a key (a
//! replay was ACKed) deletes the entry of the record that instance was given to replay
//! (the shell knows what it replayed; the core's resolution names only the key). So that
//! this is never ambiguous where a key can hold two records (after a lost tail), an
//! instance is then given at most one record of a key to replay at a time: the next only
//! once a batch of that instance resolved the key or dead-lettered the record again (or
//! the instance died).

use std::collections::{BTreeMap, VecDeque};

use unimesh_core::{
    Checkpoint, CheckpointError, DeadLetter, DlqKey, Epoch, GroupName, Offset, Partition,
    PersistBatch, Record, Recovered, SubscriptionSpec, Ticket,
};

/// One instance of the cluster (index into the harness's nodes).
pub type NodeId = u32;

/// What the shell knew of a lane when it submitted one of its checkpoints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stamp {
    /// The coordinator's generation of the lane's ownership when the writer was given it.
    pub owner_gen: u64,
    /// The partition's leader epoch the writer's position came from.
    pub leader_epoch: usize,
}

/// What became of the batch at the front of an instance's queue.
#[derive(Clone, Debug)]
pub enum Front {
    Applied(Ticket, PersistBatch),
    /// A checkpoint's owner was replaced: nothing of the batch was written.
    Fenced(Ticket),
}

#[derive(Clone, Debug)]
struct Stored {
    bytes: Vec<u8>,
    leader_epoch: usize,
}

#[derive(Clone, Debug)]
struct Pending {
    ticket: Ticket,
    batch: PersistBatch,
    /// One per checkpoint of the batch.
    stamps: Vec<Stamp>,
}

#[derive(Clone, Debug, Default)]
pub struct Store {
    epochs: BTreeMap<NodeId, Epoch>,
    subscriptions: BTreeMap<GroupName, SubscriptionSpec>,
    checkpoints: BTreeMap<(GroupName, Partition), Stored>,
    /// Per key, one entry per record (in the order first written).
    dlq: BTreeMap<DlqKey, Vec<DeadLetter>>,
    pending: BTreeMap<NodeId, VecDeque<Pending>>,
    /// The record each instance is replaying, per DLQ key (at most one).
    replayed: BTreeMap<(NodeId, DlqKey), Record>,
}

/// Forgets what a checkpoint knew at and above `end` (progress and attempts).
pub fn clip(c: &mut Checkpoint, end: Offset) {
    c.progress.truncate_from(end);
    c.attempts.retain(|&(o, _)| o < end);
}

impl Store {
    /// Queues a batch of `node`; `stamps` has one entry per checkpoint (or none at all,
    /// for a shell that never fences nor clips).
    pub fn submit_for(
        &mut self,
        node: NodeId,
        ticket: Ticket,
        batch: PersistBatch,
        stamps: Vec<Stamp>,
    ) {
        self.pending.entry(node).or_default().push_back(Pending {
            ticket,
            batch,
            stamps,
        });
    }

    pub fn has_pending_for(&self, node: NodeId) -> bool {
        self.pending.get(&node).is_some_and(|q| !q.is_empty())
    }

    pub fn front_ticket_for(&self, node: NodeId) -> Option<Ticket> {
        self.pending.get(&node)?.front().map(|p| p.ticket)
    }

    /// Writes the oldest pending batch of `node`, unless one of its checkpoints is fenced
    /// (`is_current(group, partition, owner_gen)` says no): then nothing of it is written.
    pub fn apply_front_for(
        &mut self,
        node: NodeId,
        is_current: impl Fn(&GroupName, Partition, u64) -> bool,
    ) -> Option<Front> {
        let p = self.pending.get_mut(&node)?.pop_front()?;
        let fenced = p
            .batch
            .checkpoints
            .iter()
            .zip(&p.stamps)
            .any(|(c, s)| !is_current(&c.group, c.partition, s.owner_gen));
        if fenced {
            return Some(Front::Fenced(p.ticket));
        }
        let batch = p.batch;
        for g in &batch.removed_groups {
            self.subscriptions.remove(g);
            self.checkpoints.retain(|(cg, _), _| cg != g);
            self.dlq.retain(|k, _| k.group != *g);
        }
        for s in &batch.subscriptions {
            self.subscriptions.insert(s.group.clone(), s.clone());
        }
        for (i, c) in batch.checkpoints.iter().enumerate() {
            let leader_epoch = p.stamps.get(i).map_or(0, |s| s.leader_epoch);
            self.checkpoints.insert(
                (c.group.clone(), c.partition),
                Stored {
                    bytes: c.checkpoint.encode(),
                    leader_epoch,
                },
            );
        }
        for d in &batch.dead_letters {
            let in_replay = (node, d.key.clone());
            if self
                .replayed
                .get(&in_replay)
                .is_some_and(|r| r.meta == d.record.meta)
            {
                // Its replay failed again: the replay is over.
                self.replayed.remove(&in_replay);
            }
            let entries = self.dlq.entry(d.key.clone()).or_default();
            match entries.iter_mut().find(|e| e.record.meta == d.record.meta) {
                Some(e) => *e = d.clone(),
                None => entries.push(d.clone()),
            }
        }
        for k in &batch.dlq_resolved {
            let replayed = self.replayed.remove(&(node, k.clone()));
            let replayed = replayed.as_ref();
            if let Some(entries) = self.dlq.get_mut(k) {
                entries.retain(|d| replayed.is_some_and(|r| r.meta != d.record.meta));
                if entries.is_empty() {
                    self.dlq.remove(k);
                }
            }
        }
        if let Some(e) = batch.epoch {
            self.epochs.insert(node, e);
        }
        Some(Front::Applied(p.ticket, batch))
    }

    /// The oldest pending batch of `node` could not be written: it is dropped, nothing of
    /// it counts.
    pub fn fail_front_for(&mut self, node: NodeId) -> Option<Ticket> {
        self.pending.get_mut(&node)?.pop_front().map(|p| p.ticket)
    }

    /// The process of `node` died: its unapplied batches are lost.
    pub fn crash_node(&mut self, node: NodeId) {
        if let Some(q) = self.pending.get_mut(&node) {
            q.clear();
        }
        self.replayed.retain(|(n, _), _| *n != node);
    }

    /// The checkpoint of a lane as a reader sees it: clipped where the broker lost its
    /// tail since the leader epoch it was written in (`divergence(partition, epoch)`).
    pub fn checkpoint_read(
        &self,
        g: &GroupName,
        p: Partition,
        divergence: impl Fn(Partition, usize) -> Option<Offset>,
    ) -> Result<Option<Checkpoint>, CheckpointError> {
        self.checkpoints
            .get(&(g.clone(), p))
            .map(|s| read(s, p, &divergence))
            .transpose()
    }

    /// What an instance recovers at start: its epoch, and the cluster's subscriptions and
    /// checkpoints (each read as [`Store::checkpoint_read`] does).
    pub fn recovered_for(
        &self,
        node: NodeId,
        divergence: impl Fn(Partition, usize) -> Option<Offset>,
    ) -> Result<Recovered, CheckpointError> {
        let mut checkpoints = Vec::with_capacity(self.checkpoints.len());
        for ((g, p), s) in &self.checkpoints {
            checkpoints.push((g.clone(), *p, read(s, *p, &divergence)?));
        }
        Ok(Recovered {
            epoch: self.epochs.get(&node).copied().unwrap_or(0),
            subscriptions: self.subscriptions.values().cloned().collect(),
            checkpoints,
        })
    }

    /// The stored bytes of a lane's checkpoint (to tell whether it changed).
    pub fn checkpoint_bytes(&self, g: &GroupName, p: Partition) -> Option<&[u8]> {
        self.checkpoints
            .get(&(g.clone(), p))
            .map(|s| s.bytes.as_slice())
    }

    /// Up to `max` dead letters of a group, oldest key first, for a replay by `node`
    /// (remembered, to tell what a later resolution of their keys refers to).
    /// With `exclusive`, keys `node` is replaying already are left out (see the module
    /// documentation; needed once a key can hold two records).
    pub fn dead_letters_for(
        &mut self,
        node: NodeId,
        g: &GroupName,
        max: usize,
        exclusive: bool,
    ) -> Vec<(Partition, Record)> {
        let replayed = &self.replayed;
        let out: Vec<(DlqKey, Record)> = self
            .dlq
            .iter()
            .filter(|(k, _)| {
                k.group == *g && !(exclusive && replayed.contains_key(&(node, (*k).clone())))
            })
            .filter_map(|(k, entries)| Some((k.clone(), entries.first()?.record.clone())))
            .take(max)
            .collect();
        for (key, r) in &out {
            self.replayed.insert((node, key.clone()), r.clone());
        }
        out.into_iter().map(|(k, r)| (k.partition, r)).collect()
    }

    /// The mesh of `node` refused a replay: those records are not in replay there.
    pub fn replay_refused(&mut self, node: NodeId, g: &GroupName, records: &[(Partition, Record)]) {
        for (p, r) in records {
            let key = DlqKey {
                group: g.clone(),
                partition: *p,
                offset: r.offset,
            };
            self.replayed.remove(&(node, key));
        }
    }

    /// Dead letters held (one per group and record).
    pub fn dlq_len(&self) -> usize {
        self.dlq.values().map(Vec::len).sum()
    }

    // The store as one mesh sees it (instance 0, nothing fenced or clipped): what a
    // harness of a single mesh uses.

    pub fn submit(&mut self, ticket: Ticket, batch: PersistBatch) {
        self.submit_for(0, ticket, batch, Vec::new());
    }

    pub fn has_pending(&self) -> bool {
        self.has_pending_for(0)
    }

    pub fn front_ticket(&self) -> Option<Ticket> {
        self.front_ticket_for(0)
    }

    /// Makes the oldest pending batch durable and returns it.
    pub fn apply_front(&mut self) -> Option<(Ticket, PersistBatch)> {
        match self.apply_front_for(0, |_, _, _| true)? {
            Front::Applied(ticket, batch) => Some((ticket, batch)),
            Front::Fenced(_) => None,
        }
    }

    /// The oldest pending batch could not be written: it is dropped, nothing of it counts.
    pub fn fail_front(&mut self) -> Option<Ticket> {
        self.fail_front_for(0)
    }

    /// The process died: unapplied batches are lost.
    pub fn crash(&mut self) {
        self.crash_node(0);
    }

    pub fn checkpoint(
        &self,
        g: &GroupName,
        p: Partition,
    ) -> Result<Option<Checkpoint>, CheckpointError> {
        self.checkpoint_read(g, p, |_, _| None)
    }

    pub fn recovered(&self) -> Result<Recovered, CheckpointError> {
        self.recovered_for(0, |_, _| None)
    }

    /// Up to `max` dead letters of a group, oldest key first, for a replay.
    pub fn dead_letters(&mut self, g: &GroupName, max: usize) -> Vec<(Partition, Record)> {
        self.dead_letters_for(0, g, max, false)
    }
}

/// Decodes a stored checkpoint and clips it at the divergence of its leader epoch.
fn read(
    s: &Stored,
    p: Partition,
    divergence: &impl Fn(Partition, usize) -> Option<Offset>,
) -> Result<Checkpoint, CheckpointError> {
    let mut c = Checkpoint::decode(&s.bytes)?;
    if let Some(end) = divergence(p, s.leader_epoch) {
        clip(&mut c, end);
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use unimesh_core::{LaneCheckpoint, Progress, TopicName};

    fn lane(wm: Offset, ranges: &[(Offset, Offset)]) -> LaneCheckpoint {
        LaneCheckpoint {
            group: GroupName::new("g").unwrap(),
            topic: TopicName::new("t").unwrap(),
            partition: 0,
            checkpoint: Checkpoint {
                progress: Progress::from_parts(wm, ranges.iter().copied()).unwrap(),
                attempts: vec![],
            },
        }
    }

    #[test]
    fn a_replaced_owner_is_fenced_and_a_lost_tail_clipped() {
        let mut s = Store::default();
        let batch = |c| PersistBatch {
            checkpoints: vec![c],
            ..PersistBatch::default()
        };
        let stamp = |owner_gen, leader_epoch| Stamp {
            owner_gen,
            leader_epoch,
        };
        s.submit_for(0, 1, batch(lane(4, &[(6, 9)])), vec![stamp(1, 0)]);
        s.submit_for(1, 1, batch(lane(2, &[])), vec![stamp(1, 0)]);
        let current = |_: &GroupName, _: Partition, gen: u64| gen >= 2;
        assert!(matches!(
            s.apply_front_for(1, current),
            Some(Front::Fenced(1))
        ));
        assert!(matches!(
            s.apply_front_for(0, |_, _, _| true),
            Some(Front::Applied(1, _))
        ));
        let g = GroupName::new("g").unwrap();
        let never = |_: Partition, _: usize| None;
        let lost_at_7 = |_: Partition, epoch: usize| (epoch == 0).then_some(7);
        let c = s.checkpoint_read(&g, 0, never).unwrap().unwrap();
        assert_eq!(c.progress.ranges().collect::<Vec<_>>(), vec![(6, 9)]);
        let c = s.checkpoint_read(&g, 0, lost_at_7).unwrap().unwrap();
        assert_eq!(c.progress.ranges().collect::<Vec<_>>(), vec![(6, 7)]);
        assert_eq!(s.recovered_for(0, never).unwrap().checkpoints.len(), 1);
        assert_eq!(
            s.checkpoint(&g, 0).unwrap(),
            s.checkpoint_read(&g, 0, never).unwrap()
        );
    }
}
