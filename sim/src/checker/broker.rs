//! What the mesh tells the broker: commits of group offsets (C3: never beyond what the
//! committing owner made durable, never back except after a seek — a commit counting as
//! clipped at every loss of the broker's tail its committer had not heard of — never from
//! a fenced owner), POP broker ACKs (C6: only for records durably done)
//! and records reported skipped (C1: retention only what retention deleted; a truncation
//! only what the broker lost and the lane had not heard of yet).

use unimesh_core::{DlqKey, GroupName, Offset, Partition, SkipReason};

use super::{fail, Check, Checker, Clause};

impl Checker {
    /// The selected instance's mesh emitted `Commit{offset}` of the lane, which a broker
    /// that fences commits takes later ([`Checker::committed`] then): the seeks so far are
    /// the ones that commit may go back across. A commit emitted before a seek and taken
    /// after it (Kafka's consumer holds the commits asked during a revocation until the
    /// revocation ends) says nothing of the seek, and must not use it up.
    pub fn commit_emitted(&mut self, group: &GroupName, p: Partition, offset: Offset) {
        let inst = self.current;
        if let Some(lane) = self.groups.get_mut(group).and_then(|g| g.lanes.get_mut(&p)) {
            let (rewinds, stamp) = (lane.rewinds, lane.owner_stamp);
            let o = lane.owner(inst);
            o.commit_emitted = Some((offset, rewinds, o.fenced(stamp)));
        }
    }

    /// `Commit` of a durable watermark, by the selected instance, to a broker with group
    /// offsets (one the broker accepted: a fenced owner's must have been refused).
    pub fn committed(&mut self, group: &GroupName, p: Partition, offset: Offset) -> Check {
        let inst = self.current;
        let truncations = self
            .groups
            .get(group)
            .and_then(|g| self.logs.get(&(g.topic.clone(), p)))
            .map(|l| l.truncations.clone())
            .unwrap_or_default();
        let Some(lane) = self.groups.get_mut(group).and_then(|g| g.lanes.get_mut(&p)) else {
            return fail(
                Clause::C3,
                format!("{group}/{p}: commit for an unknown lane"),
            );
        };
        let stamp = lane.owner_stamp;
        let o = lane.owner(inst);
        // A commit emitted as taken is judged by the fence at its emission: Kafka's consumer
        // holds the commits asked during a revocation and sends them when it ends, in the
        // generation of the revocation, which the coordinator checks (group seed 13603: the
        // owner of generation 5 dropped the lane, a zombie then acted on an assignment of
        // generation 4, and the owner's revocation commit, which the coordinator rightly
        // took in generation 5, was judged fenced). A commit emitted by a fenced owner (a
        // zombie) is a violation whenever it is taken.
        let emitted = o.commit_emitted.filter(|&(e, _, _)| e == offset);
        if emitted.map_or_else(|| o.fenced(stamp), |(_, _, fenced)| fenced) {
            return fail(
                Clause::C3,
                format!("{group}/{p}: commit {offset} of instance {inst} accepted although the lane was given to another owner (it must be fenced)"),
            );
        }
        if o.applied_wm.is_none_or(|wm| offset > wm) {
            return fail(
                Clause::C3,
                format!(
                    "{group}/{p}: committed {offset} beyond what instance {inst} made durable ({:?})",
                    o.applied_wm
                ),
            );
        }
        // What the commit says of the log as it is now: nothing past a loss of the broker's
        // tail the committer had not heard of (a reader honouring leader epochs clips it).
        let unknown = truncations.get(o.knows..).unwrap_or(&[]);
        // The seeks before the commit's emission, when it was emitted as taken (else now).
        let rewinds = emitted.map_or(lane.rewinds, |(_, r, _)| r);
        let offset = unknown.iter().map(|t| t.new_end).fold(offset, Offset::min);
        if let Some(prev) = lane.committed {
            if offset < prev && lane.commit_rewinds >= rewinds {
                return fail(
                    Clause::C3,
                    format!("{group}/{p}: commit went back {prev} -> {offset}"),
                );
            }
        }
        lane.committed = Some(offset);
        lane.commit_rewinds = lane.commit_rewinds.max(rewinds);
        Ok(())
    }

    /// Whether the DLQ ledger holds the record now at `p/o` for the group.
    pub(super) fn dead_lettered(&self, group: &GroupName, p: Partition, o: Offset) -> bool {
        let key = DlqKey {
            group: group.clone(),
            partition: p,
            offset: o,
        };
        let serial = self
            .groups
            .get(group)
            .and_then(|g| self.logs.get(&(g.topic.clone(), p)))
            .and_then(|l| l.serial_at(o));
        serial.is_some_and(|s| self.dlq.get(&key).is_some_and(|held| held.contains(&s)))
    }

    /// C6: a POP broker is ACKed for a record only once it is durably done for the group.
    /// One exception: a seek keeps the broker ACKs of records already done before it (the
    /// client's ACK stands; the operator only chose to see the record again), so those may
    /// go out once the seek's own checkpoint is durable — and, when the seek was another
    /// owner's, the ACK an instance owes for a record its own persist had made durably done
    /// before the seek (a zombie told late that its write, applied before it was replaced,
    /// is durable: seed 123136).
    pub fn broker_acked(&mut self, group: &GroupName, p: Partition, offset: Offset) -> Check {
        let inst = self.current;
        let dlq = self.dead_lettered(group, p, offset);
        let Some(g) = self.groups.get(group) else {
            return fail(
                Clause::C6,
                format!("{group}/{p}: broker ACK for an unknown group"),
            );
        };
        let filtered = self.matches(g, p, offset) == Some(false);
        let Some(lane) = self.groups.get_mut(group).and_then(|g| g.lanes.get_mut(&p)) else {
            return fail(
                Clause::C6,
                format!("{group}/{p}: broker ACK for an unknown lane"),
            );
        };
        let durable = lane.durable_done(offset);
        let (seek_gen, seek_durable) = {
            let o = lane.owner(inst);
            (o.seek_gen, !o.seek_pending)
        };
        let r = lane.rec(offset);
        let kept_by_seek = seek_gen > 0
            && seek_durable
            && (r.first_ack_gen.is_some_and(|g| g < seek_gen) || filtered);
        let kept_by_others_seek = r.done_when_sought && r.broker_ack_due == Some(inst);
        if !durable && !dlq && !kept_by_seek && !kept_by_others_seek {
            return fail(
                Clause::C6,
                format!("{group}/{p}/{offset}: broker ACKed before it was durably done"),
            );
        }
        r.broker_acked = true;
        Ok(())
    }

    /// A broker ACK from a group's replay lane: the record was dead-lettered (and ACKed to
    /// the broker then), and its replay is now done: ACKed by a client, or dead-lettered again.
    pub fn replay_broker_acked(
        &mut self,
        group: &GroupName,
        p: Partition,
        offset: Offset,
    ) -> Check {
        let dlq = self.dead_lettered(group, p, offset);
        let Some(lane) = self.groups.get_mut(group).and_then(|g| g.lanes.get_mut(&p)) else {
            return fail(
                Clause::C6,
                format!("{group}/{p}: replay broker ACK for an unknown lane"),
            );
        };
        let r = lane.rec(offset);
        if !r.acked_any && !dlq {
            return fail(
                Clause::C6,
                format!("{group}/{p}/{offset}: replay lane ACKed the broker for a record no client ACKed"),
            );
        }
        Ok(())
    }

    /// The selected instance's mesh reported records it will never deliver: deleted by
    /// retention, or lost by the broker (`[from, to)` named records the lane had fetched,
    /// and the lane starts again at `from`).
    pub fn skipped(
        &mut self,
        group: &GroupName,
        p: Partition,
        from: Offset,
        to: Offset,
        reason: SkipReason,
    ) -> Check {
        let Some(g) = self.groups.get(group) else {
            return Ok(());
        };
        let Some(log) = self.logs.get(&(g.topic.clone(), p)) else {
            return fail(
                Clause::C1,
                format!("{group}/{p}: skip in an unknown partition"),
            );
        };
        let earliest = log.earliest;
        match reason {
            SkipReason::Retention => {
                if to > earliest {
                    return fail(
                        Clause::C1,
                        format!("{group}/{p}: skipped [{from}, {to}) (retention) but the broker still has from {earliest}"),
                    );
                }
                self.stats.skipped_offsets += to.saturating_sub(from);
                if let Some(lane) = self.lane_mut(group, p) {
                    lane.skipped.push((from, to));
                }
                Ok(())
            }
            SkipReason::BrokerTruncated => self.truncation_reported(group, p, from, to),
        }
    }

    /// A lane of the selected instance reported that the broker lost `[from, to)`: only a
    /// loss it had not heard of, from the lowest such truncation. The lane goes on under a
    /// new lease, as after a seek (so records reusing the offsets get ids of their own):
    /// its deliveries end and their ids must answer `revoked`.
    fn truncation_reported(
        &mut self,
        group: &GroupName,
        p: Partition,
        from: Offset,
        to: Offset,
    ) -> Check {
        let inst = self.current;
        let truncations = self
            .groups
            .get(group)
            .and_then(|g| self.logs.get(&(g.topic.clone(), p)))
            .map(|l| l.truncations.clone())
            .unwrap_or_default();
        let Some(g) = self.groups.get_mut(group) else {
            return Ok(());
        };
        let lane = g.lanes.entry(p).or_default();
        let o = lane.owner(inst);
        let unknown = truncations.get(o.knows..).unwrap_or(&[]);
        let lowest = unknown.iter().map(|t| t.new_end).min();
        let highest = unknown.iter().map(|t| t.old_end).max();
        if lowest != Some(from) || highest.is_none_or(|h| to > h) || to <= from {
            return fail(
                Clause::C1,
                format!("{group}/{p}: skipped [{from}, {to}) as lost by the broker, but the losses it had not heard of are {unknown:?}"),
            );
        }
        o.must_report = None;
        o.delivered_end = o.delivered_end.min(from);
        o.revoked_below = o.max_lease + 1;
        o.key_last.clear();
        g.inflight.retain(|&(i, lp, _), _| !(i == inst && lp == p));
        self.stats.truncations_reported += 1;
        Ok(())
    }
}
