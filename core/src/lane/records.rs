//! The life of a lane's records once admitted: located for settling, handed out,
//! requeued after a delivery ends, retired when done, dropped when forgotten.

use super::entries::{EntryState, InFlight};
use super::{FetchState, Lane};
use crate::delivery_id::DeliveryId;
use crate::io::{DeadLetter, Delivery, DlqKey, RejectReason, Ticket};
use crate::mesh::timers::{Timer, TimerTable};
use crate::mesh::Ctx;
use crate::record::RecordMeta;
use crate::slots::ClientSlot;
use crate::types::{Millis, Offset, Partition, TopicName};

/// Where a retired record came from: what its DLQ key is made of.
pub(crate) struct Retired {
    pub origin: Partition,
    pub record_offset: Offset,
}

impl Lane {
    /// Whether attempt `attempt` of `offset` can be settled now, and the record's state
    /// and attempts if so.
    #[inline]
    pub fn locate(&self, offset: Offset, attempt: u32) -> Result<(EntryState, u32), RejectReason> {
        if offset >= self.cursor {
            return Err(RejectReason::Unknown);
        }
        if self.progress.is_done(offset) {
            return Err(RejectReason::AlreadyDone);
        }
        let Some(e) = self.entries.get(&offset) else {
            return Err(RejectReason::Unknown);
        };
        if attempt < e.first_here || attempt > e.attempts {
            return Err(RejectReason::Unknown);
        }
        Ok((e.state, e.attempts))
    }

    /// Hands the ready record at `offset` (just popped from the ready set) to `client`,
    /// due at `deadline`: its next attempt. Returns the delivery and how it is in flight.
    #[inline]
    pub fn hand_out(
        &mut self,
        cx: &mut Ctx,
        offset: Offset,
        client: ClientSlot,
        deadline: Millis,
        moved: bool,
        topic: &TopicName,
    ) -> Option<(Delivery, InFlight)> {
        let entry = self.entries.get_mut(&offset)?;
        debug_assert!(entry.eligible());
        entry.attempts += 1;
        let f = InFlight {
            client,
            deadline,
            seq: cx.next_seq.take_next(),
            moved,
        };
        entry.state = EntryState::InFlight(f);
        self.push_end = self.push_end.max(offset + 1);
        let delivery = Delivery {
            id: DeliveryId {
                epoch: cx.epoch,
                lease: self.lease.get(),
                partition: self.partition,
                offset,
                attempt: entry.attempts,
            },
            attempt: entry.attempts,
            topic: topic.clone(),
            partition: entry.origin,
            record: entry.record.clone(),
        };
        Some((delivery, f))
    }

    /// Removes a record because it is done (ACKed or dead-lettered): marks progress, drops
    /// its ledger entry and wait and its backoff timer, keeps its broker handle to ACK once
    /// durable, lets the next record of its key go. Returns where it came from and the
    /// state it was in, for the group to free its client and ACK deadline. The entry is
    /// dropped where it lies (moving ~160 bytes out of the store was a visible cost),
    /// unless its key is needed to release the next record of that key.
    #[inline]
    pub fn retire(
        &mut self,
        cx: &mut Ctx,
        offset: Offset,
        keyed: bool,
    ) -> Option<(Retired, EntryState)> {
        let at = self.entries.position(offset)?;
        let entry = self.entries.at(at)?;
        let (state, ledger_needed) = (entry.state, entry.ledger_needed);
        let retired = Retired {
            origin: entry.origin,
            record_offset: entry.record.offset,
        };
        let eligible = entry.eligible();
        let handle = entry.record.broker_handle.clone();
        // A blocked entry never held its key (only dead-on-arrival entries retire blocked).
        let holds_key = keyed && !entry.key_blocked && entry.record.partition_key().is_some();
        let owned = if holds_key {
            self.entries.remove_at(at)
        } else {
            self.entries.discard_at(at);
            None
        };
        if eligible {
            self.ready.remove(&offset);
        }
        if matches!(state, EntryState::Backoff) {
            cx.timers.stop(self.backoff_timer(offset));
        }
        if let Some(t) = ledger_needed {
            self.awaiting_ledger.remove(&(t, offset));
        }
        self.ledger.remove(&offset);
        debug_assert!(!self.progress.is_done(offset), "a done record is not held");
        self.mark_done(offset);
        if let Some(h) = handle {
            self.unsynced_broker_acks.push((cx.next_ticket, h));
        }
        if let Some(k) = owned.as_ref().and_then(|e| e.record.partition_key()) {
            self.release_key(k, offset);
        }
        cx.dirty(self);
        cx.touch_lane(self);
        Some((retired, state))
    }

    /// Queues an in-flight record again for its next attempt, after `delay_ms` (at once for
    /// 0). In a persistent lane the next attempt number must be durable before it goes out.
    #[inline]
    pub fn requeue(&mut self, cx: &mut Ctx, offset: Offset, delay_ms: Millis) {
        let timer = self.backoff_timer(offset);
        let Some(entry) = self.entries.get_mut(&offset) else {
            return;
        };
        if self.persistent {
            self.ledger.insert(offset, entry.attempts + 1);
            let needed = cx.next_ticket;
            entry.ledger_needed = Some(needed);
            self.awaiting_ledger.insert((needed, offset));
        }
        if delay_ms == 0 {
            entry.state = EntryState::Queued;
        } else {
            entry.state = EntryState::Backoff;
            cx.timers.set(timer, cx.now + delay_ms);
        }
        self.offer(offset);
        cx.dirty(self);
    }

    /// A record's backoff timer fired: it may go out again.
    pub fn end_backoff(&mut self, offset: Offset) {
        if let Some(e) = self.entries.get_mut(&offset) {
            e.state = EntryState::Queued;
            self.offer(offset);
        }
    }

    /// Moves the deadline of the delivery out of `offset` to `to`; from now on it is out of
    /// delivery order. Returns the delivery as it was.
    #[inline]
    pub fn extend(&mut self, offset: Offset, to: Millis) -> Option<InFlight> {
        let e = self.entries.get_mut(&offset)?;
        let was = e.in_flight()?;
        e.state = EntryState::InFlight(InFlight {
            deadline: to,
            moved: true,
            ..was
        });
        Some(was)
    }

    /// Forgets one entry without marking it done (a truncation). Returns `None` if there
    /// was none, else the delivery it was out under, for the group to free.
    pub fn drop_entry(
        &mut self,
        cx: &mut Ctx,
        offset: Offset,
        keyed: bool,
    ) -> Option<Option<InFlight>> {
        let entry = self.entries.remove(&offset)?;
        if entry.eligible() {
            self.ready.remove(&offset);
        }
        if let Some(t) = entry.ledger_needed {
            self.awaiting_ledger.remove(&(t, offset));
        }
        if keyed {
            if let Some(k) = entry.record.partition_key() {
                if let Some(q) = self.keys.get_mut(k) {
                    if q.head == offset {
                        self.release_key(k, offset);
                    } else {
                        q.waiting.retain(|&o| o != offset);
                    }
                }
            }
        }
        if matches!(entry.state, EntryState::Backoff) {
            cx.timers.stop(self.backoff_timer(offset));
        }
        Some(entry.in_flight())
    }

    /// Stops the lane's own timers (it is being dropped).
    pub fn stop_timers(&self, timers: &mut TimerTable) {
        for (&offset, e) in &self.entries {
            if matches!(e.state, EntryState::Backoff) {
                timers.stop(self.backoff_timer(offset));
            }
        }
        if matches!(self.fetch, FetchState::Retrying) {
            timers.stop(Timer::FetchRetry {
                group: self.group,
                partition: self.partition,
            });
        }
    }

    /// A replayed record (`replayed`) is ACKed: its DLQ entry is deleted once that is
    /// durable.
    pub fn resolve_dead_letter(&mut self, cx: &mut Ctx, key: DlqKey, replayed: RecordMeta) {
        self.unsynced_resolved.push((cx.next_ticket, key, replayed));
        cx.dirty(self);
    }

    /// The record `meta` at `key` is dead-lettered again (by its own lane, after a seek
    /// re-opened it): a resolution of its entry not yet durable is dropped. The new dead
    /// letter replaces that entry, and a batch applies resolutions after dead letters, so
    /// the older resolution written with it would delete the entry the checkpoint relies
    /// on for the record's done mark (C1; unimesh-sim, Kafka world, seed 216855).
    pub fn drop_resolution(&mut self, key: &DlqKey, meta: &RecordMeta) {
        self.unsynced_resolved
            .retain(|(_, k, m)| !(k == key && m == meta));
    }

    /// A dead letter decided with the record's retirement; written with `ticket`.
    pub fn add_dead_letter(&mut self, ticket: Ticket, letter: DeadLetter) {
        self.unsynced_dead_letters.push((ticket, letter));
    }
}
