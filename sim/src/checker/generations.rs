//! Instances and their incarnations (C4: one alive per instance at a time, each with the
//! next durable epoch of that instance), ownership of lanes as the group coordinator hands
//! it out (assignment, expiry of an instance, revocation), operator seeks, and fetch
//! answers: every event after which a mesh may legitimately forget what it did in memory
//! bumps the generation of the lanes it touches (see "Generations" in the documentation of
//! [`super`]).

use unimesh_core::{Epoch, GroupName, Millis, Offset, Partition};

use super::state::{bit, LaneState, Owner, Rec};
use super::{fail, Check, Checker, Clause};

impl Checker {
    /// A mesh incarnation of the selected instance starts with `epoch`.
    pub fn started(&mut self, now: Millis, epoch: Epoch) -> Check {
        self.tick(now);
        self.incarnations += 1;
        let incarnation = self.incarnations;
        let n = self.node();
        if n.alive {
            return fail(
                Clause::C4,
                "a second incarnation started while one is alive".into(),
            );
        }
        if epoch != n.durable_epoch.wrapping_add(1) {
            return fail(
                Clause::C4,
                format!(
                    "incarnation uses epoch {epoch} but the durable epoch is {}",
                    n.durable_epoch
                ),
            );
        }
        n.alive = true;
        n.epoch = epoch;
        n.incarnation = incarnation;
        Ok(())
    }

    /// The selected instance's store made `epoch` durable on its own, apart from the rest
    /// of its batch (a state port whose local part, the epoch, lands before the batch
    /// counts: the Kafka backend's). The next incarnation must use the one after it.
    pub fn epoch_durable(&mut self, epoch: Epoch) {
        let n = self.node();
        n.durable_epoch = n.durable_epoch.max(epoch);
    }

    /// The selected instance's mesh died: whatever it held in memory is gone.
    pub fn crashed(&mut self, now: Millis) {
        self.tick(now);
        let inst = self.current;
        let n = self.node();
        n.alive = false;
        let incarnation = n.incarnation;
        self.emitted.retain(|&(i, _), _| i != incarnation);
        for g in self.groups.values_mut() {
            g.credit.retain(|(i, _), _| *i != inst);
            g.inflight.retain(|(i, _, _), _| *i != inst);
            g.replay.retain(|(i, _, _, _), _| *i != inst);
            for lane in g.lanes.values_mut() {
                if !lane.owners.contains_key(&inst) {
                    continue;
                }
                let gen = lane.next_gen();
                lane.resets += 1;
                lane.void_pending_broker_acks(inst);
                let o = lane.owner(inst);
                *o = Owner {
                    gen,
                    seek_gen: o.seek_gen,
                    drop_gen: o.drop_gen + 1,
                    stamp: o.stamp,
                    knows: o.knows,
                    ..Owner::default()
                };
            }
        }
    }

    /// The lane, created on first sight; None for a group never added (or removed).
    pub(super) fn lane_mut(&mut self, group: &GroupName, p: Partition) -> Option<&mut LaneState> {
        Some(self.groups.get_mut(group)?.lanes.entry(p).or_default())
    }

    /// The group coordinator gave the lane to the selected instance and its mesh accepted
    /// it. Another instance that still holds the lane is a zombie for it from now on.
    pub fn assigned(&mut self, group: &GroupName, p: Partition) {
        let inst = self.current;
        let knows = self.truncations_of(group, p);
        let Some(lane) = self.lane_mut(group, p) else {
            return;
        };
        lane.owner_stamp += 1;
        let stamp = lane.owner_stamp;
        if lane.owners.iter().any(|(&i, o)| i != inst && o.assigned) {
            // The zombie's records may be handed out again by the new owner.
            lane.resets += 1;
        }
        lane.owner(inst).take(stamp, knows);
    }

    /// The selected instance's mesh accepted the lane from an assignment the coordinator
    /// has since overtaken (it handed the lane on in a later generation, or expelled the
    /// member, before the instance acted on it): the instance holds the lane as a zombie
    /// from the start — it may deliver (duplicates), nothing it writes may become durable.
    /// The lane's owner, if its mesh took the lane already, stays the owner.
    pub fn assigned_stale(&mut self, group: &GroupName, p: Partition) {
        let inst = self.current;
        let knows = self.truncations_of(group, p);
        let Some(lane) = self.lane_mut(group, p) else {
            return;
        };
        // A stamp below the lane's: fenced from the start (the owner keeps the lane's).
        let current = lane
            .owners
            .iter()
            .any(|(&i, o)| i != inst && o.assigned && o.stamp == lane.owner_stamp);
        if !current {
            lane.owner_stamp += 1;
        }
        let stamp = lane.owner_stamp - 1;
        lane.resets += 1;
        lane.owner(inst).take(stamp, knows);
    }

    /// The group coordinator took the lane from the selected instance without telling it
    /// (its group member's session expired, or it was expelled): [`Checker::expired`] for
    /// one lane — what the instance holds of it is fenced from now on, and the lane may be
    /// handed to another instance. A harness whose coordinator tracks membership per group
    /// (Kafka's: one member per instance and group) reports each lane the member held.
    pub fn lane_expired(&mut self, now: Millis, group: &GroupName, p: Partition) {
        self.tick(now);
        let inst = self.current;
        let Some(lane) = self.lane_mut(group, p) else {
            return;
        };
        let stamp = lane.owner_stamp;
        if lane
            .owners
            .get(&inst)
            .is_some_and(|o| o.assigned && o.stamp == stamp)
        {
            lane.owner_stamp += 1;
            lane.resets += 1;
        }
    }

    /// The group coordinator no longer counts the selected instance as a member (its
    /// session expired) although its mesh keeps running: every lane it holds is fenced from
    /// now on, and may be handed to another instance.
    pub fn expired(&mut self, now: Millis) {
        self.tick(now);
        let inst = self.current;
        for g in self.groups.values_mut() {
            for lane in g.lanes.values_mut() {
                if lane.owners.get(&inst).is_some_and(|o| o.assigned) {
                    lane.owner_stamp += 1;
                    lane.resets += 1;
                }
            }
        }
    }

    /// The selected instance's group lost the partition: its deliveries end and may be
    /// handed out again later.
    pub fn revoked(&mut self, now: Millis, group: &GroupName, p: Partition) {
        self.tick(now);
        let inst = self.current;
        let Some(g) = self.groups.get_mut(group) else {
            return;
        };
        g.inflight.retain(|&(i, lp, _), _| !(i == inst && lp == p));
        let lane = g.lanes.entry(p).or_default();
        let gen = lane.next_gen();
        lane.resets += 1;
        lane.void_pending_broker_acks(inst);
        let o = lane.owner(inst);
        o.gen = gen;
        o.drop_gen += 1;
        o.revoked_below = o.max_lease + 1;
        o.assigned = false;
        // A seek whose lane is dropped before its checkpoint was written is lost with it:
        // the next owner starts from the store (a checkpoint written after the seek, if one
        // is still on its way, clears this anyway when it lands).
        o.seek_pending = false;
        o.key_last.clear();
        o.must_report = None;
        o.delivered_end = 0;
    }

    /// An operator moved the selected instance's lane to `offset`: below it is skipped,
    /// from it on redelivered. The new lane knows the log as it is now.
    pub fn sought(&mut self, now: Millis, group: &GroupName, p: Partition, offset: Offset) {
        self.tick(now);
        let inst = self.current;
        let knows = self.truncations_of(group, p);
        let Some(g) = self.groups.get_mut(group) else {
            return;
        };
        g.inflight.retain(|&(i, lp, _), _| !(i == inst && lp == p));
        let lane = g.lanes.entry(p).or_default();
        let gen = lane.next_gen();
        lane.seek_gens.insert(gen);
        lane.rewinds += 1;
        let o = lane.owner(inst);
        o.gen = gen;
        o.seek_gen = gen;
        o.seek_pending = true;
        o.revoked_below = o.max_lease + 1;
        o.key_last.clear();
        o.must_report = None;
        o.delivered_end = 0;
        o.knows = knows;
        let b = bit(gen);
        if (lane.recs.len() as Offset) < offset {
            lane.recs.resize_with(offset as usize, Rec::default);
        }
        let (durable, recs) = (&lane.durable, &mut lane.recs);
        for (o, r) in recs.iter_mut().enumerate() {
            if (o as Offset) < offset {
                r.op_mask |= b;
            } else {
                if durable
                    .as_ref()
                    .is_some_and(|c| c.progress.is_done(o as Offset))
                {
                    r.done_when_sought = true;
                }
                // The new lane starts with a fresh attempt ledger (C5 history restarts).
                r.max_attempt = 0;
                r.had_ge2 = false;
                r.first_count = 0;
                r.done_in = None;
            }
        }
    }

    /// The mesh of the selected instance took a fetch answer of the lane (records, or out
    /// of range) and its effects were reported: the lane now knows every loss of the
    /// broker's tail so far. C1: a loss of records it had delivered was reported first.
    pub fn fetch_answered(&mut self, group: &GroupName, p: Partition) -> Check {
        let inst = self.current;
        let knows = self.truncations_of(group, p);
        let Some(lane) = self.lane_mut(group, p) else {
            return Ok(());
        };
        let o = lane.owner(inst);
        if let Some(x) = o.must_report.take() {
            return fail(
                Clause::C1,
                format!(
                    "{group}/{p}: the broker lost its records from {x}, which the lane had delivered, and the lane fetched again without reporting the loss"
                ),
            );
        }
        o.knows = knows;
        Ok(())
    }

    /// How many times the broker lost the tail of the group's partition so far.
    pub(super) fn truncations_of(&self, group: &GroupName, p: Partition) -> usize {
        self.groups
            .get(group)
            .and_then(|g| self.logs.get(&(g.topic.clone(), p)))
            .map_or(0, |l| l.truncations.len())
    }
}
