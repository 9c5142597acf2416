//! The persist writer: applies the core's batches to the state store one at a time, in
//! ticket order, and reports each outcome back to the engine task.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use madsim_tokio as tokio;
use tokio::sync::mpsc;
use unimesh_core::{GroupName, Partition, PersistBatch, Ticket};

use super::command::Event;
use super::ports::{StatePort, StorageError};

/// Lanes whose persists issued before a ticket must not reach the store. A lost
/// revocation (the coordinator gave the partitions to another instance without telling
/// this one) fences every batch issued before it that holds a checkpoint of the lanes,
/// however late the writer gets to it: also after the lanes came back to this instance,
/// whose ownership is a new one then — a checkpoint of the old lane written under it
/// would outrank what the owners in between wrote (docs/DESIGN.md §8, "a lost
/// revocation fences what was issued before it"). Shared by the engine task, which
/// fences, and the persist writer, which checks and forgets what it has passed. Bounded:
/// one entry per lane.
#[derive(Clone, Debug, Default)]
pub(crate) struct Fences(Arc<Mutex<BTreeMap<(GroupName, Partition), Ticket>>>);

impl Fences {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<(GroupName, Partition), Ticket>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Batches with a ticket below `below` fail for `partitions` of `group`.
    pub fn fence(&self, group: &GroupName, partitions: &[Partition], below: Ticket) {
        let mut fences = self.lock();
        for &p in partitions {
            let e = fences.entry((group.clone(), p)).or_insert(below);
            *e = (*e).max(below);
        }
    }

    /// Why the batch of `ticket` is fenced, if it is; forgets the fences it is past.
    pub fn check(&self, ticket: Ticket, batch: &PersistBatch) -> Option<StorageError> {
        let mut fences = self.lock();
        let why = batch.checkpoints.iter().find_map(|c| {
            let below = fences.get(&(c.group.clone(), c.partition))?;
            (ticket < *below).then(|| {
                StorageError::Fenced(format!(
                    "persist {ticket} holds a checkpoint of partition {} of group {} issued before the partition was lost",
                    c.partition, c.group
                ))
            })
        });
        fences.retain(|_, below| *below > ticket + 1);
        why
    }
}

/// Writes persists one at a time, in the order the core issued them; a batch `fences`
/// refuses fails without reaching the store.
pub(crate) async fn persist_writer(
    state: Arc<dyn StatePort>,
    mut batches: mpsc::Receiver<(Ticket, Arc<PersistBatch>)>,
    events: mpsc::Sender<Event>,
    fences: Fences,
) {
    while let Some((ticket, batch)) = batches.recv().await {
        let result = match fences.check(ticket, &batch) {
            Some(why) => {
                tracing::warn!(ticket, reason = %why, "persist fenced");
                Err(why)
            }
            None => state.apply(batch, wall_ms()).await,
        };
        if events
            .send(Event::Persisted { ticket, result })
            .await
            .is_err()
        {
            break;
        }
    }
}

pub(crate) fn wall_ms() -> u64 {
    crate::storage::log::WallClock::now_ms(&crate::storage::log::SystemClock)
}

#[cfg(test)]
mod tests {
    use unimesh_core::{Checkpoint, LaneCheckpoint, TopicName};

    use super::*;

    fn batch(lanes: &[(&str, Partition)]) -> PersistBatch {
        PersistBatch {
            checkpoints: lanes
                .iter()
                .map(|&(g, p)| LaneCheckpoint {
                    group: GroupName::new(g).expect("valid"),
                    topic: TopicName::new("t").expect("valid"),
                    partition: p,
                    checkpoint: Checkpoint::new(0),
                })
                .collect(),
            ..PersistBatch::default()
        }
    }

    /// Goal: a fence refuses exactly the batches issued before it that hold a fenced lane,
    /// and is forgotten once the writer is past it. Method: lane g/1 fenced below ticket
    /// 6; the writer's batches in ticket order: 3 (g/0 and g/1) refused, 4 (g/0 only)
    /// written, 5 (g/1) refused, 6 (g/1) written, and the fence is gone.
    #[test]
    fn a_fence_refuses_what_was_issued_before_it() {
        let fences = Fences::default();
        let g = GroupName::new("g").expect("valid");
        fences.fence(&g, &[1], 6);
        assert!(fences.check(3, &batch(&[("g", 0), ("g", 1)])).is_some());
        assert!(fences.check(4, &batch(&[("g", 0)])).is_none());
        assert!(fences.check(5, &batch(&[("g", 1)])).is_some());
        assert!(fences.lock().is_empty());
        assert!(fences.check(6, &batch(&[("g", 1)])).is_none());
    }
}
