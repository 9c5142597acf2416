//! A lane's part in persists: what a persist writes of it, and what becomes of what was
//! waiting for durability once the persist is durable.

use super::Lane;
use crate::checkpoint::Checkpoint;
use crate::io::{Effect, LaneCheckpoint, PersistBatch, Ticket, REPLAY_PARTITION};
use crate::mesh::Ctx;
use crate::slots::Lease;
use crate::types::{GroupName, Offset, TopicName};

/// What a persist carried of a lane, to recognise the lane when it answers.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WrittenLane {
    pub lease: Lease,
    pub watermark: Offset,
    /// A checkpoint was written (not for the replay lane).
    pub persistent: bool,
}

impl Lane {
    /// The state a persist of this lane writes now.
    fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            progress: self.progress.clone(),
            attempts: self.ledger.iter().map(|(&o, &n)| (o, n)).collect(),
        }
    }

    /// Writes the lane into persist `ticket`: its checkpoint (if persistent), and every
    /// dead letter and resolved DLQ entry not yet durable. The lane is clean afterwards.
    pub fn write(
        &mut self,
        batch: &mut PersistBatch,
        ticket: Ticket,
        group: &GroupName,
        topic: &TopicName,
    ) -> WrittenLane {
        // Equal when the last flush wrote the lane into a batch that stayed empty (a
        // replay lane with nothing to write): that ticket was not used, and is reused.
        debug_assert!(ticket >= self.written_ticket, "tickets never go back");
        self.dirty = false;
        self.written_ticket = ticket;
        if self.persistent {
            batch.checkpoints.push(LaneCheckpoint {
                group: group.clone(),
                topic: topic.clone(),
                partition: self.partition,
                checkpoint: self.checkpoint(),
            });
        }
        batch
            .dead_letters
            .extend(self.unsynced_dead_letters.iter().map(|(_, d)| d.clone()));
        batch
            .dlq_resolved
            .extend(self.unsynced_resolved.iter().map(|(_, k, _)| k.clone()));
        WrittenLane {
            lease: self.lease,
            watermark: self.progress.watermark(),
            persistent: self.persistent,
        }
    }

    /// A persist that wrote this lane under `lease` with `watermark` is durable. Returns
    /// false if it is not news (another incarnation's, or older than one already durable).
    /// Otherwise: attempt numbers it carried are durable (their records may go out), dead
    /// letters and resolved entries it carried are done, broker ACKs of records done
    /// before it go out, and the watermark is committed to the broker if so configured.
    pub fn persisted(
        &mut self,
        cx: &mut Ctx,
        lease: Lease,
        ticket: Ticket,
        watermark: Offset,
        group: &GroupName,
        topic: &TopicName,
    ) -> bool {
        if self.lease != lease || ticket <= self.durable_ticket {
            return false;
        }
        self.durable_ticket = ticket;
        self.durable_watermark = Some(watermark);
        while let Some(&(needed, offset)) = self.awaiting_ledger.first() {
            if needed > ticket {
                break;
            }
            self.awaiting_ledger.pop_first();
            if let Some(e) = self.entries.get_mut(&offset) {
                e.ledger_needed = None;
            }
            self.offer(offset);
        }
        self.unsynced_dead_letters.retain(|(t, _)| *t > ticket);
        self.unsynced_resolved.retain(|(t, _, _)| *t > ticket);
        let (acks, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut self.unsynced_broker_acks)
            .into_iter()
            .partition(|(t, _)| *t <= ticket);
        self.unsynced_broker_acks = keep;
        for (_, handle) in acks {
            cx.effects.push_back(Effect::BrokerAck {
                group: group.clone(),
                topic: topic.clone(),
                partition: self.partition,
                handle,
            });
        }
        let commit = cx.config.commit_to_broker;
        if commit && self.partition != REPLAY_PARTITION && self.committed != Some(watermark) {
            self.committed = Some(watermark);
            cx.effects.push_back(Effect::Commit {
                group: group.clone(),
                topic: topic.clone(),
                partition: self.partition,
                offset: watermark,
            });
        }
        cx.touch_lane(self);
        true
    }
}
