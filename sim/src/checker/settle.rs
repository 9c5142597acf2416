//! Answers to ACK, NACK and extend (C4), per instance: a former epoch's id is stale, a
//! revoked lane's id is revoked, a done record is done, the current unexpired delivery is
//! never refused, and only it may be NACKed or extended. An accepted ACK is what later
//! justifies a checkpoint marking the record done (C1, in [`super::persist`]) — unless the
//! broker lost the record since (the offset names another record now).

use unimesh_core::{
    DeliveryId, Epoch, GroupName, Millis, Offset, Partition, RejectReason, Response, Settle,
    REPLAY_PARTITION,
};

use super::state::{bit, GroupState, Issued};
use super::{fail, Check, Checker, Clause, Instance, SettleKind, Violation};

impl Checker {
    /// A client settled `ids` at the selected instance; `response` is the mesh's answer.
    pub fn settled(
        &mut self,
        now: Millis,
        group: &GroupName,
        kind: SettleKind,
        ids: &[DeliveryId],
        response: &Response,
    ) -> Check {
        let _ = self.tick(now);
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
        let inst = self.current;
        let (now, epoch) = {
            let n = self.node();
            (n.now, n.epoch)
        };
        let at = format!("{group} {kind:?} {id} -> {outcome:?} (instance {inst})");
        if matches!(outcome, Settle::Rejected(_)) {
            self.stats.settles_rejected += 1;
        }
        let Some(issued) = self.issued_for_settle(&at, group, id, outcome)? else {
            return Ok(());
        };
        let max_ack_timeout_ms = self.max_ack_timeout_ms;
        let serials = self.current_serials(group, &issued);
        let Some(g) = self.groups.get_mut(group) else {
            return Ok(());
        };
        let slot = (inst, id.partition, id.offset);
        let current = g
            .inflight
            .get(&slot)
            .is_some_and(|h| h.id == *id && h.deadline > now);
        if !g.check_settle_target(&at, inst, id, outcome, epoch)? {
            return Ok(());
        }
        match (kind, outcome) {
            (SettleKind::Ack, Settle::Accepted) => {
                self.stats.acks_accepted += 1;
                if !current {
                    self.stats.late_acks_accepted += 1;
                }
                g.ack_accepted(inst, id, &issued, epoch, serials);
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
        let inst = self.current;
        let (epoch, incarnation) = {
            let n = self.node();
            (n.epoch, n.incarnation)
        };
        if id.epoch < epoch {
            if outcome != Settle::Rejected(RejectReason::Stale) {
                return Err(Violation {
                    clause: Clause::C4,
                    message: format!("{at}: id of a former epoch not refused as stale"),
                });
            }
            self.stats.stale_rejected += 1;
            return Ok(None);
        }
        let issued = self.issued.get(&(inst, *id)).cloned();
        let Some(issued) = issued.filter(|i| i.group == *group) else {
            if outcome == Settle::Accepted {
                return Err(Violation {
                    clause: Clause::C4,
                    message: format!("{at}: accepted an id that was never issued"),
                });
            }
            return Ok(None);
        };
        if issued.incarnation != incarnation {
            return Err(Violation {
                clause: Clause::C4,
                message: format!(
                    "{at}: id issued by incarnation {} answered by incarnation {incarnation} (must be stale)",
                    issued.incarnation
                ),
            });
        }
        Ok(Some(issued))
    }

    /// Whether the record an id was issued for is still the broker's record at its
    /// offset (then its ACK counts), and the same for its origin lane (a replayed record).
    fn current_serials(&self, group: &GroupName, issued: &Issued) -> bool {
        self.groups
            .get(group)
            .and_then(|g| self.logs.get(&(g.topic.clone(), issued.origin)))
            .is_some_and(|l| l.serial_at(issued.offset) == Some(issued.serial))
    }
}

impl GroupState {
    /// C4 by what the id points at: a replayed record is settled once, an id of a revoked
    /// lease must be refused as revoked (false: nothing more to judge), a record already
    /// ACKed under the same lease must be refused as done.
    fn check_settle_target(
        &mut self,
        at: &str,
        inst: Instance,
        id: &DeliveryId,
        outcome: Settle,
        epoch: Epoch,
    ) -> Result<bool, Violation> {
        let rejected = |reason: RejectReason| outcome == Settle::Rejected(reason);
        if id.partition == REPLAY_PARTITION {
            let s = self
                .replay
                .entry((inst, id.epoch, id.lease, id.offset))
                .or_default();
            if s.done && outcome == Settle::Accepted {
                fail(Clause::C4, format!("{at}: replayed record settled twice"))?;
            }
            return Ok(true);
        }
        let lane = self.lanes.entry(id.partition).or_default();
        if id.lease < lane.owner(inst).revoked_below {
            if !rejected(RejectReason::Revoked) {
                fail(
                    Clause::C4,
                    format!("{at}: id of a revoked lane not refused as revoked"),
                )?;
            }
            return Ok(false);
        }
        let r = lane.rec(id.offset);
        if r.done_in == Some((inst, epoch, id.lease)) && !rejected(RejectReason::AlreadyDone) {
            fail(
                Clause::C4,
                format!("{at}: record already ACKed, not refused as done"),
            )?;
        }
        Ok(true)
    }

    /// An accepted ACK: the delivery ends and the record counts as ACKed in the lane's
    /// current generation on this instance — if `current`, i.e. it is still the broker's
    /// record at its offset. A replayed record's ACK counts for its origin lane too (a
    /// resolution may delete its DLQ entry in the same batch that marks a later
    /// dead-lettering done).
    fn ack_accepted(
        &mut self,
        inst: Instance,
        id: &DeliveryId,
        issued: &Issued,
        epoch: Epoch,
        current: bool,
    ) {
        self.inflight.remove(&(inst, id.partition, id.offset));
        if id.partition == REPLAY_PARTITION {
            if let Some(s) = self.replay.get_mut(&(inst, id.epoch, id.lease, id.offset)) {
                s.done = true;
            }
            if !current {
                return;
            }
            let lane = self.lanes.entry(issued.origin).or_default();
            let gen = lane.owners.get(&inst).map(|o| o.gen);
            let r = lane.rec(issued.offset);
            r.acked_any = true;
            if let Some(gen) = gen {
                r.acked_mask |= bit(gen);
            }
        } else if current {
            let lane = self.lanes.entry(id.partition).or_default();
            let gen = lane.owner(inst).gen;
            let r = lane.rec(id.offset);
            r.acked_mask |= bit(gen);
            r.acked_any = true;
            r.first_ack_gen.get_or_insert(gen);
            r.done_in = Some((inst, epoch, id.lease));
        }
    }

    /// An accepted NACK ends the current delivery; an accepted extend moves its deadline
    /// (by the group's ACK timeout if none was given, at most `deadline_cap_ms`).
    fn nack_or_extend_accepted(
        &mut self,
        kind: SettleKind,
        slot: (Instance, Partition, Offset),
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
