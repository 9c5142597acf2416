//! A group's lanes coming and going (assignment, revocation, seek, replay) and their
//! part in persists.

use std::collections::{BTreeMap, BTreeSet};

use super::Group;
use crate::checkpoint::Checkpoint;
use crate::config::StartFrom;
use crate::io::{Assignment, PersistBatch, Refusal, Response, Ticket, REPLAY_PARTITION};
use crate::lane::{Lane, WrittenLane};
use crate::mesh::Ctx;
use crate::record::Record;
use crate::slots::Lease;
use crate::types::{GroupName, Offset, Partition};

impl Group {
    /// The broker assigned partitions to this instance: each new one gets a lane starting
    /// at its stored checkpoint (from the assignment or read at start), else where the
    /// subscription says.
    pub fn assign(
        &mut self,
        cx: &mut Ctx,
        recovered: &mut BTreeMap<(GroupName, Partition), Checkpoint>,
        partitions: Vec<Assignment>,
    ) -> Response {
        let max = cx.config.max_partitions_per_group;
        if let Some(a) = partitions.iter().find(|a| a.partition == REPLAY_PARTITION) {
            return Response::Refused(Refusal::InvalidPartition(a.partition));
        }
        let new: BTreeSet<Partition> = partitions
            .iter()
            .map(|a| a.partition)
            .filter(|&p| !self.lanes.contains(p))
            .collect();
        if self.lanes.real_lanes() + new.len() > max {
            return Response::Refused(Refusal::TooManyPartitions { max });
        }
        for a in partitions {
            if self.lanes.contains(a.partition) {
                continue;
            }
            let stored = a
                .checkpoint
                .or_else(|| recovered.remove(&(self.name.clone(), a.partition)));
            let fresh = stored.is_none();
            let checkpoint = stored.unwrap_or_else(|| {
                let start = match &self.spec.start_from {
                    StartFrom::Earliest => a.earliest,
                    StartFrom::Latest(ends) => ends.get(&a.partition).copied().unwrap_or(a.end),
                };
                Checkpoint::new(start)
            });
            let lease = self.issue_lease(cx, a.partition);
            let mut lane = Lane::new(self.slot, a.partition, lease, true, checkpoint);
            if fresh {
                // Pin the start position, so a restart does not re-resolve "latest".
                cx.dirty(&mut lane);
            }
            cx.touch_lane(&mut lane);
            self.lanes.insert(lane);
        }
        Response::Ok
    }

    /// These partitions are about to be revoked: their lanes hand out and fetch nothing
    /// more, and settle what is in flight until `revoke` (`Input::PartitionsRevoking`).
    pub fn start_revoke(&mut self, cx: &mut Ctx, partitions: &[Partition]) -> Response {
        for &p in partitions {
            if p == REPLAY_PARTITION {
                continue;
            }
            if let Some(lane) = self.lanes.get_mut(p) {
                lane.start_draining();
                self.lanes.sync(p);
            }
        }
        cx.touch_group(self);
        Response::Ok
    }

    pub fn revoke(&mut self, cx: &mut Ctx, partitions: &[Partition]) -> Response {
        for &p in partitions {
            if p != REPLAY_PARTITION {
                self.drop_lane(cx, p);
            }
        }
        cx.touch_group(self);
        Response::Ok
    }

    /// Starts a partition's lane again at `offset`, under a new lease.
    pub fn seek(&mut self, cx: &mut Ctx, partition: Partition, offset: Offset) -> Response {
        if partition == REPLAY_PARTITION {
            return Response::Refused(Refusal::InvalidPartition(partition));
        }
        let Some(old) = self.drop_lane(cx, partition) else {
            return Response::Refused(Refusal::NotAssigned(partition));
        };
        let lease = self.issue_lease(cx, partition);
        let mut lane = Lane::reseeked(old, lease, offset);
        cx.dirty(&mut lane);
        cx.touch_lane(&mut lane);
        self.lanes.insert(lane);
        cx.touch_group(self);
        Response::Ok
    }

    /// Records from the dead-letter queue, delivered again through the replay lane.
    pub fn replay(&mut self, cx: &mut Ctx, records: Vec<(Partition, Record)>) -> Response {
        let max = cx.config.max_replay_per_group;
        let held = self
            .lanes
            .get(REPLAY_PARTITION)
            .map_or(0, Lane::window_used);
        if held + records.len() > max {
            return Response::Refused(Refusal::ReplayFull { max });
        }
        if !self.lanes.contains(REPLAY_PARTITION) {
            let lease = self.issue_lease(cx, REPLAY_PARTITION);
            let lane = Lane::new(
                self.slot,
                REPLAY_PARTITION,
                lease,
                false,
                Checkpoint::new(0),
            );
            self.lanes.insert(lane);
        }
        for (origin, record) in records {
            let Some(lane) = self.lanes.get_mut(REPLAY_PARTITION) else {
                break;
            };
            let slot = lane.take_replay_slot();
            self.admit(cx, REPLAY_PARTITION, slot, origin, record, 0);
        }
        self.lanes.sync(REPLAY_PARTITION);
        cx.touch_group(self);
        Response::Ok
    }

    /// Removes a lane and everything it holds without marking anything done (revocation,
    /// seek, unsubscribe). Returns the lane for what must outlive it.
    pub(super) fn drop_lane(&mut self, cx: &mut Ctx, p: Partition) -> Option<Lane> {
        let lane = self.lanes.remove(p)?;
        for (offset, f) in lane.deliveries() {
            self.acks.forget(&mut cx.timers, p, offset, f);
            self.unhold(cx, f.client);
        }
        lane.stop_timers(&mut cx.timers);
        // The lane's FIFO entries are all dead now.
        self.acks.compact(&self.lanes);
        self.acks.rearm(&mut cx.timers);
        cx.forget_lane(self.slot, p);
        Some(lane)
    }

    /// After an input that touched the lane: fetch if there is room.
    pub fn visit_lane(&mut self, cx: &mut Ctx, p: Partition) {
        if let Some(lane) = self.lanes.get_mut(p) {
            lane.clear_touched();
            lane.maybe_fetch(cx, &self.name, &self.spec.topic);
        }
    }

    /// Writes a dirty lane into persist `ticket`.
    pub fn write_lane(
        &mut self,
        p: Partition,
        batch: &mut PersistBatch,
        ticket: Ticket,
    ) -> Option<WrittenLane> {
        let lane = self.lanes.get_mut(p)?;
        Some(lane.write(batch, ticket, &self.name, &self.spec.topic))
    }

    /// Something of one of these partitions' lanes is not durable yet (see
    /// `Input::PartitionsRevoking`).
    pub fn unsaved(&self, partitions: &[Partition]) -> bool {
        partitions
            .iter()
            .filter_map(|&p| self.lanes.get(p))
            .any(Lane::unsaved)
    }

    /// A persist that wrote the lane under `lease` with `watermark` is durable.
    pub fn lane_persisted(
        &mut self,
        cx: &mut Ctx,
        p: Partition,
        lease: Lease,
        ticket: Ticket,
        watermark: Offset,
    ) {
        let Some(lane) = self.lanes.get_mut(p) else {
            return;
        };
        if lane.persisted(cx, lease, ticket, watermark, &self.name, &self.spec.topic) {
            self.lanes.sync(p);
            cx.touch_group(self);
        }
    }

    /// A persist that wrote the lane under `lease` failed: it must be written again.
    pub fn lane_persist_failed(&mut self, cx: &mut Ctx, p: Partition, lease: Lease) {
        if let Some(lane) = self.lanes.get_mut(p) {
            if lane.lease() == lease {
                cx.dirty(lane);
            }
        }
    }
}
