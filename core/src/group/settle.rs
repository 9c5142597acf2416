//! How a delivery ends: ACKed, NACKed, extended, expired, its client gone, or its record
//! dead-lettered; and a backoff ending.

use super::Group;
use crate::config::Ordering;
use crate::delivery_id::DeliveryId;
use crate::io::{
    DeadLetter, DeadLetterReason, DlqKey, RejectReason, Response, Settle, REPLAY_PARTITION,
};
use crate::lane::{EntryState, Retired};
use crate::mesh::Ctx;
use crate::slots::Lease;
use crate::types::{Millis, Offset, Partition};

/// What a client asks of the deliveries it names.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Settling {
    Ack,
    /// Give back, redelivered after the delay (or the backoff).
    Nack(Option<Millis>),
    /// More time, the ACK deadline moving to now + this (or the ACK timeout).
    Extend(Option<Millis>),
}

/// Why a delivery ended without its record being done. Variants in alphabetical order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum End {
    ClientGone,
    Nack,
    Timeout,
}

impl Group {
    /// Settles each delivery id in turn; one answer per id.
    pub fn settle_ids(&mut self, cx: &mut Ctx, ids: &[DeliveryId], how: Settling) -> Response {
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let outcome = match self.locate(cx, id) {
                Err(reason) => Settle::Rejected(reason),
                Ok((state, attempts)) => self.settle_one(cx, id, how, state, attempts),
            };
            if matches!(outcome, Settle::Rejected(_)) {
                self.stats.rejected += 1;
            }
            out.push(outcome);
        }
        cx.touch_group(self);
        Response::Settled(out)
    }

    /// Settles one located delivery. Any attempt's ACK makes the record done (a late ACK
    /// still counts); only the delivery currently out may be NACKed or extended.
    #[inline]
    fn settle_one(
        &mut self,
        cx: &mut Ctx,
        id: &DeliveryId,
        how: Settling,
        state: EntryState,
        attempts: u32,
    ) -> Settle {
        let current = matches!(state, EntryState::InFlight(_)) && attempts == id.attempt;
        match how {
            Settling::Ack => {
                self.ack(cx, id.partition, id.offset);
                if current {
                    self.stats.acked += 1;
                } else {
                    self.stats.late_acked += 1;
                }
                Settle::Accepted
            }
            Settling::Nack(delay) if current => {
                let delay = delay.map(|d| d.min(self.spec.backoff.max_ms));
                self.stats.nacked += 1;
                self.end_delivery(cx, id.partition, id.offset, End::Nack, delay);
                Settle::Accepted
            }
            Settling::Extend(by) if current => {
                let max = cx.config.limits.max_ack_timeout_ms;
                let by = by.unwrap_or(self.spec.ack_timeout_ms).min(max);
                self.extend(cx, id.partition, id.offset, cx.now + by);
                Settle::Accepted
            }
            Settling::Nack(_) | Settling::Extend(_) => Settle::Rejected(RejectReason::AlreadyDone),
        }
    }

    /// Resolves a delivery id to the state of its record, or says why it cannot be settled.
    #[inline]
    fn locate(&self, cx: &Ctx, id: &DeliveryId) -> Result<(EntryState, u32), RejectReason> {
        if id.epoch < cx.epoch {
            return Err(RejectReason::Stale);
        }
        if id.epoch > cx.epoch {
            return Err(RejectReason::Unknown);
        }
        // A lease of this group on this partition that is no longer current was revoked
        // (or re-seeked); anything else was never issued.
        let lease = Lease::new(id.lease);
        let was_ours = lease < cx.next_lease && self.leases.issued(id.partition, lease);
        let Some(lane) = self.lanes.get(id.partition) else {
            return Err(if was_ours {
                RejectReason::Revoked
            } else {
                RejectReason::Unknown
            });
        };
        if lease != lane.lease() {
            return Err(if was_ours && lease < lane.lease() {
                RejectReason::Revoked
            } else {
                RejectReason::Unknown
            });
        }
        lane.locate(id.offset, id.attempt)
    }

    /// The record is done for the group: ACKed (possibly by an earlier attempt's late ACK).
    #[inline]
    fn ack(&mut self, cx: &mut Ctx, p: Partition, offset: Offset) {
        let replayed = (p == REPLAY_PARTITION)
            .then(|| self.lanes.get(p).and_then(|l| l.entry(offset)))
            .flatten()
            .map(|e| e.record().meta.clone());
        let Some(retired) = self.retire(cx, p, offset) else {
            return;
        };
        if let Some(meta) = replayed {
            let key = DlqKey {
                group: self.name.clone(),
                partition: retired.origin,
                offset: retired.record_offset,
            };
            if let Some(lane) = self.lanes.get_mut(p) {
                lane.resolve_dead_letter(cx, key, meta);
            }
        }
    }

    /// Removes a not-done record because it is now done (ACKed or dead-lettered): the lane
    /// marks it (`Lane::retire`), its client and ACK deadline are freed here.
    #[inline]
    fn retire(&mut self, cx: &mut Ctx, p: Partition, offset: Offset) -> Option<Retired> {
        let keyed = self.spec.ordering == Ordering::Key;
        let lane = self.lanes.get_mut(p)?;
        let (retired, state) = lane.retire(cx, offset, keyed)?;
        if let EntryState::InFlight(f) = state {
            self.acks.forget(&mut cx.timers, p, offset, f);
        }
        self.lanes.sync(p);
        if let EntryState::InFlight(f) = state {
            self.unhold(cx, f.client);
        }
        cx.touch_group(self);
        Some(retired)
    }

    /// Ends the current delivery of a record without it being done: redelivery after a
    /// backoff (with the next attempt number made durable first), or dead-lettering at the
    /// last attempt.
    pub(super) fn end_delivery(
        &mut self,
        cx: &mut Ctx,
        p: Partition,
        offset: Offset,
        why: End,
        delay: Option<Millis>,
    ) {
        let Some(lane) = self.lanes.get_mut(p) else {
            return;
        };
        let Some((f, attempts)) = lane.delivery(offset) else {
            return;
        };
        if attempts >= self.spec.max_attempts {
            let reason = match why {
                End::ClientGone => DeadLetterReason::ClientGone,
                End::Nack => DeadLetterReason::Nacked,
                End::Timeout => DeadLetterReason::AckTimeout,
            };
            self.dead_letter(cx, p, offset, reason);
            return;
        }
        self.acks.forget(&mut cx.timers, p, offset, f);
        let delay = delay.unwrap_or_else(|| self.spec.backoff.delay_ms(attempts + 1));
        lane.requeue(cx, offset, delay);
        self.lanes.sync(p);
        self.stats.redelivered += 1;
        self.unhold(cx, f.client);
        cx.touch_group(self);
    }

    /// The record goes to the dead-letter queue: done for the group once that is durable.
    pub(super) fn dead_letter(
        &mut self,
        cx: &mut Ctx,
        p: Partition,
        offset: Offset,
        reason: DeadLetterReason,
    ) {
        let topic = self.spec.topic.clone();
        let name = self.name.clone();
        let Some((record, attempts)) = self
            .lanes
            .get(p)
            .and_then(|l| l.entry(offset))
            .map(|e| (e.record().clone(), e.attempts()))
        else {
            return;
        };
        let Some(retired) = self.retire(cx, p, offset) else {
            return;
        };
        let letter = DeadLetter {
            key: DlqKey {
                group: name,
                partition: retired.origin,
                offset: retired.record_offset,
            },
            topic,
            record,
            attempts,
            reason,
        };
        // A resolution of this record's entry from an earlier replay, not yet durable,
        // would delete the entry this dead letter writes (seed 216855).
        if p != REPLAY_PARTITION {
            if let Some(replay) = self.lanes.get_mut(REPLAY_PARTITION) {
                replay.drop_resolution(&letter.key, &letter.record.meta);
            }
        }
        if let Some(lane) = self.lanes.get_mut(p) {
            lane.add_dead_letter(cx.next_ticket, letter);
        }
        self.stats.dead_lettered += 1;
    }

    /// The delivery out of `offset` is now due at `to`.
    fn extend(&mut self, cx: &mut Ctx, p: Partition, offset: Offset, to: Millis) {
        let Some(lane) = self.lanes.get_mut(p) else {
            return;
        };
        if let Some(was) = lane.extend(offset, to) {
            self.acks.move_to(&mut cx.timers, p, offset, was, to);
        }
    }

    /// A record's redelivery backoff is over.
    pub fn end_backoff(&mut self, cx: &mut Ctx, p: Partition, offset: Offset) {
        if let Some(lane) = self.lanes.get_mut(p) {
            lane.end_backoff(offset);
        }
        self.lanes.sync(p);
        cx.touch_group(self);
    }
}
