//! Answers to ACK, NACK and extend (C4): a former epoch's id is stale, a revoked lane's id
//! is revoked, a done record is done, the current unexpired delivery is never refused, and
//! only it may be NACKed or extended. An accepted ACK is what later justifies a checkpoint
//! marking the record done (C1, in [`super::persist`]).

use unimesh_core::{
    DeliveryId, Epoch, GroupName, Millis, Offset, Partition, RejectReason, Response, Settle,
    REPLAY_PARTITION,
};

use super::state::{bit, GroupState, Issued};
use super::{fail, Check, Checker, Clause, SettleKind, Violation};

impl Checker {
    /// A client settled `ids`; `response` is the mesh's answer.
    pub fn settled(
        &mut self,
        now: Millis,
        group: &GroupName,
        kind: SettleKind,
        ids: &[DeliveryId],
        response: &Response,
    ) -> Check {
        self.tick(now);
        let outcomes = match response {
            Response::Settled(v) if v.len() == ids.len() => v,
            Response::Refused(_) if !self.groups.contains_key(group) => return Ok(()),
            other => {
                return fail(
                    Clause::C4,
                    format!("{group}: {kind:?} of {} ids answered {other:?}", ids.len()),
                )
            }
        };
        for (id, outcome) in ids.iter().zip(outcomes) {
            self.settle_one(group, kind, id, *outcome)?;
        }
        Ok(())
    }

    fn settle_one(
        &mut self,
        group: &GroupName,
        kind: SettleKind,
        id: &DeliveryId,
        outcome: Settle,
    ) -> Check {
        let now = self.now;
        let at = format!("{group} {kind:?} {id} -> {outcome:?}");
        if matches!(outcome, Settle::Rejected(_)) {
            self.stats.settles_rejected += 1;
        }
        let Some(issued) = self.issued_for_settle(&at, group, id, outcome)? else {
            return Ok(());
        };
        let epoch = self.epoch;
        let max_ack_timeout_ms = self.max_ack_timeout_ms;
        let Some(g) = self.groups.get_mut(group) else {
            return Ok(());
        };
        let slot = (id.partition, id.offset);
        let current = g
            .inflight
            .get(&slot)
            .is_some_and(|h| h.id == *id && h.deadline > now);
        if !g.check_settle_target(&at, id, outcome, epoch)? {
            return Ok(());
        }
        match (kind, outcome) {
            (SettleKind::Ack, Settle::Accepted) => {
                self.stats.acks_accepted += 1;
                if !current {
                    self.stats.late_acks_accepted += 1;
                }
                g.ack_accepted(id, &issued, epoch);
            }
            (SettleKind::Nack(_), Settle::Accepted) | (SettleKind::Extend(_), Settle::Accepted) => {
                if !current {
                    return fail(
                        Clause::C4,
                        format!("{at}: only the current delivery may be NACKed or extended"),
                    );
                }
                g.nack_or_extend_accepted(kind, slot, now, max_ack_timeout_ms);
            }
            (_, Settle::Rejected(_)) => {
                if current {
                    return fail(
                        Clause::C4,
                        format!("{at}: the current, unexpired delivery was refused"),
                    );
                }
            }
        }
        Ok(())
    }

    /// C4 by the id alone: an id of a former epoch must be refused as stale, one never
    /// issued (to this group) must not be accepted, and one of this epoch was issued by
    /// this incarnation. The issue record when the answer needs judging further, None when
    /// it is settled here.
    fn issued_for_settle(
        &mut self,
        at: &str,
        group: &GroupName,
        id: &DeliveryId,
        outcome: Settle,
    ) -> Result<Option<Issued>, Violation> {
        if id.epoch < self.epoch {
            if outcome != Settle::Rejected(RejectReason::Stale) {
                return Err(Violation {
                    clause: Clause::C4,
                    message: format!("{at}: id of a former epoch not refused as stale"),
                });
            }
            self.stats.stale_rejected += 1;
            return Ok(None);
        }
        let issued = self.issued.get(id).cloned();
        let Some(issued) = issued.filter(|i| i.group == *group) else {
            if outcome == Settle::Accepted {
                return Err(Violation {
                    clause: Clause::C4,
                    message: format!("{at}: accepted an id that was never issued"),
                });
            }
            return Ok(None);
        };
        if issued.incarnation != self.incarnation {
            return Err(Violation {
                clause: Clause::C4,
                message: format!(
                    "{at}: id issued by incarnation {} answered by incarnation {} (must be stale)",
                    issued.incarnation, self.incarnation
                ),
            });
        }
        Ok(Some(issued))
    }
}

impl GroupState {
    /// C4 by what the id points at: a replayed record is settled once, an id of a revoked
    /// lease must be refused as revoked (false: nothing more to judge), a record already
    /// ACKed under the same lease must be refused as done.
    fn check_settle_target(
        &mut self,
        at: &str,
        id: &DeliveryId,
        outcome: Settle,
        epoch: Epoch,
    ) -> Result<bool, Violation> {
        let rejected = |reason: RejectReason| outcome == Settle::Rejected(reason);
        if id.partition == REPLAY_PARTITION {
            let s = self
                .replay
                .entry((id.epoch, id.lease, id.offset))
                .or_default();
            if s.done && outcome == Settle::Accepted {
                fail(Clause::C4, format!("{at}: replayed record settled twice"))?;
            }
            return Ok(true);
        }
        let lane = self.lanes.entry(id.partition).or_default();
        if id.lease < lane.revoked_below {
            if !rejected(RejectReason::Revoked) {
                fail(
                    Clause::C4,
                    format!("{at}: id of a revoked lane not refused as revoked"),
                )?;
            }
            return Ok(false);
        }
        let r = lane.rec(id.offset);
        if r.done_in == Some((epoch, id.lease)) && !rejected(RejectReason::AlreadyDone) {
            fail(
                Clause::C4,
                format!("{at}: record already ACKed, not refused as done"),
            )?;
        }
        Ok(true)
    }

    /// An accepted ACK: the delivery ends and the record counts as ACKed in the lane's
    /// current generation. A replayed record's ACK counts for its origin lane too (a
    /// resolution may delete its DLQ entry in the same batch that marks a later
    /// dead-lettering done).
    fn ack_accepted(&mut self, id: &DeliveryId, issued: &Issued, epoch: Epoch) {
        self.inflight.remove(&(id.partition, id.offset));
        if id.partition == REPLAY_PARTITION {
            if let Some(s) = self.replay.get_mut(&(id.epoch, id.lease, id.offset)) {
                s.done = true;
            }
            let lane = self.lanes.entry(issued.origin).or_default();
            let gen = lane.gen;
            let r = lane.rec(issued.offset);
            r.acked_any = true;
            r.acked_mask |= bit(gen);
        } else {
            let lane = self.lanes.entry(id.partition).or_default();
            let gen = lane.gen;
            let r = lane.rec(id.offset);
            r.acked_mask |= bit(gen);
            r.acked_any = true;
            r.first_ack_gen.get_or_insert(gen);
            r.done_in = Some((epoch, id.lease));
        }
    }

    /// An accepted NACK ends the current delivery; an accepted extend moves its deadline
    /// (by the group's ACK timeout if none was given, at most `deadline_cap_ms`).
    fn nack_or_extend_accepted(
        &mut self,
        kind: SettleKind,
        slot: (Partition, Offset),
        now: Millis,
        deadline_cap_ms: Millis,
    ) {
        if matches!(kind, SettleKind::Nack(_)) {
            self.inflight.remove(&slot);
        } else if let (SettleKind::Extend(by), Some(h)) = (kind, self.inflight.get_mut(&slot)) {
            h.deadline = now + by.unwrap_or(self.ack_timeout_ms).min(deadline_cap_ms);
        }
    }
}
