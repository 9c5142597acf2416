//! What the mesh tells the broker: commits of group offsets (C3: never beyond the durable
//! watermark, never back except after a seek), POP broker ACKs (C6: only for records
//! durably done) and records reported skipped (C1: only what retention deleted).

use unimesh_core::{DlqKey, GroupName, Offset, Partition, SkipReason};

use super::{fail, Check, Checker, Clause};

impl Checker {
    /// `Commit` of a durable watermark to a broker with group offsets.
    pub fn committed(&mut self, group: &GroupName, p: Partition, offset: Offset) -> Check {
        let Some(lane) = self.groups.get_mut(group).and_then(|g| g.lanes.get_mut(&p)) else {
            return fail(
                Clause::C3,
                format!("{group}/{p}: commit for an unknown lane"),
            );
        };
        let durable = lane.durable.as_ref().map(|c| c.progress.watermark());
        if durable.is_none_or(|wm| offset > wm) {
            return fail(
                Clause::C3,
                format!("{group}/{p}: committed {offset} beyond the durable watermark {durable:?}"),
            );
        }
        if let Some(prev) = lane.committed {
            if offset < prev && lane.commit_seek_gen == lane.seek_gen {
                return fail(
                    Clause::C3,
                    format!("{group}/{p}: commit went back {prev} -> {offset}"),
                );
            }
        }
        lane.committed = Some(offset);
        lane.commit_seek_gen = lane.seek_gen;
        Ok(())
    }

    /// C6: a POP broker is ACKed for a record only once it is durably done for the group.
    /// One exception: a seek keeps the broker ACKs of records already done before it (the
    /// client's ACK stands; the operator only chose to see the record again), so those may
    /// go out once the seek's own checkpoint is durable.
    pub fn broker_acked(&mut self, group: &GroupName, p: Partition, offset: Offset) -> Check {
        let dlq = self.dlq.contains(&DlqKey {
            group: group.clone(),
            partition: p,
            offset,
        });
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
        let seek_gen = lane.seek_gen;
        let seek_durable = !lane.seek_pending;
        let r = lane.rec(offset);
        let kept_by_seek = seek_gen > 0
            && seek_durable
            && (r.first_ack_gen.is_some_and(|g| g < seek_gen) || filtered);
        if !durable && !dlq && !kept_by_seek {
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
        let dlq = self.dlq.contains(&DlqKey {
            group: group.clone(),
            partition: p,
            offset,
        });
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

    /// The mesh reported records it will never deliver.
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
        let earliest = self
            .logs
            .get(&(g.topic.clone(), p))
            .map_or(0, |l| l.earliest);
        if reason != SkipReason::Retention || to > earliest {
            return fail(
                Clause::C1,
                format!("{group}/{p}: skipped [{from}, {to}) ({reason:?}) but the broker still has from {earliest}"),
            );
        }
        self.stats.skipped_offsets += to.saturating_sub(from);
        if let Some(lane) = self.lane_mut(group, p) {
            lane.skipped.push((from, to));
        }
        Ok(())
    }
}
