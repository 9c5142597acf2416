//! Incarnations (C4: one alive at a time, each with the next durable epoch), ownership of
//! lanes, and operator seeks: every event after which the mesh may legitimately forget what
//! it did in memory, so each bumps the generation of the lanes it touches (see
//! "Generations" in the documentation of [`super`]).

use unimesh_core::{Epoch, GroupName, Millis, Offset, Partition};

use super::state::{bit, LaneState, Rec};
use super::{fail, Check, Checker, Clause};

impl Checker {
    /// A mesh incarnation starts with `epoch`.
    pub fn started(&mut self, now: Millis, epoch: Epoch) -> Check {
        self.tick(now);
        if self.alive {
            return fail(
                Clause::C4,
                "a second incarnation started while one is alive".into(),
            );
        }
        if epoch != self.durable_epoch.wrapping_add(1) {
            return fail(
                Clause::C4,
                format!(
                    "incarnation uses epoch {epoch} but the durable epoch is {}",
                    self.durable_epoch
                ),
            );
        }
        self.alive = true;
        self.epoch = epoch;
        self.incarnation += 1;
        Ok(())
    }

    /// The mesh died: whatever it held in memory is gone.
    pub fn crashed(&mut self, now: Millis) {
        self.tick(now);
        self.alive = false;
        self.emitted.clear();
        for g in self.groups.values_mut() {
            g.credit.clear();
            g.inflight.clear();
            g.replay.clear();
            for lane in g.lanes.values_mut() {
                lane.gen += 1;
                lane.resets += 1;
                lane.drop_gen += 1;
                lane.seek_pending = false;
                lane.void_pending_broker_acks();
                lane.revoked_below = 0;
                lane.max_lease = 0;
                lane.assigned = false;
                lane.key_last.clear();
            }
        }
    }

    /// The lane, created on first sight; None for a group never added (or removed).
    pub(super) fn lane_mut(&mut self, group: &GroupName, p: Partition) -> Option<&mut LaneState> {
        Some(self.groups.get_mut(group)?.lanes.entry(p).or_default())
    }

    /// The group owns the partition now (the mesh accepted the assignment).
    pub fn assigned(&mut self, group: &GroupName, p: Partition) {
        if let Some(lane) = self.lane_mut(group, p) {
            lane.assigned = true;
        }
    }

    /// The group lost the partition: its deliveries end and may be handed out again later.
    pub fn revoked(&mut self, now: Millis, group: &GroupName, p: Partition) {
        self.tick(now);
        let Some(g) = self.groups.get_mut(group) else {
            return;
        };
        g.inflight.retain(|&(lp, _), _| lp != p);
        let lane = g.lanes.entry(p).or_default();
        lane.gen += 1;
        lane.resets += 1;
        lane.drop_gen += 1;
        lane.revoked_below = lane.max_lease + 1;
        lane.assigned = false;
        lane.void_pending_broker_acks();
        // A seek whose lane is dropped before its checkpoint was written is lost with it:
        // the next owner starts from the store (a checkpoint written after the seek, if one
        // is still on its way, clears this anyway when it lands).
        lane.seek_pending = false;
        lane.key_last.clear();
    }

    /// An operator moved the lane to `offset`: below it is skipped, from it on redelivered.
    pub fn sought(&mut self, now: Millis, group: &GroupName, p: Partition, offset: Offset) {
        self.tick(now);
        let Some(g) = self.groups.get_mut(group) else {
            return;
        };
        g.inflight.retain(|&(lp, _), _| lp != p);
        let lane = g.lanes.entry(p).or_default();
        lane.gen += 1;
        lane.seek_gen = lane.gen;
        lane.seek_gens.insert(lane.gen);
        lane.seek_pending = true;
        lane.revoked_below = lane.max_lease + 1;
        lane.key_last.clear();
        let b = bit(lane.gen);
        if (lane.recs.len() as Offset) < offset {
            lane.recs.resize_with(offset as usize, Rec::default);
        }
        for (o, r) in lane.recs.iter_mut().enumerate() {
            if (o as Offset) < offset {
                r.op_mask |= b;
            } else {
                // The new lane starts with a fresh attempt ledger (C5 history restarts).
                r.max_attempt = 0;
                r.had_ge2 = false;
                r.first_count = 0;
                r.done_in = None;
            }
        }
    }
}
