//! What an operation on one group shares with the rest of the mesh: configuration, time,
//! the counters that name things, the timer table, the effect queue and the lists of
//! lanes and groups to revisit after the input.

use std::collections::VecDeque;

use super::timers::TimerTable;
use super::MeshStats;
use crate::config::MeshConfig;
use crate::group::Group;
use crate::io::{Effect, FetchId, Ticket};
use crate::lane::Lane;
use crate::slots::{DeliverySeq, GroupSlot, Lease};
use crate::types::{Epoch, Millis, Partition};

/// Shared state handed to every group, lane and client operation (rustls' borrow-split
/// `Context`). The lists are kept exact by `dirty`, `touch_lane` and `touch_group`: a lane
/// or group is in its list once, exactly while its own flag is set.
pub(crate) struct Ctx {
    pub config: MeshConfig,
    pub epoch: Epoch,
    /// The epoch is durable: deliveries may be handed out.
    pub dispatch_enabled: bool,
    pub now: Millis,
    /// The ticket the next persist will carry: what is decided now becomes durable with it.
    pub next_ticket: Ticket,
    pub next_fetch_id: FetchId,
    pub next_seq: DeliverySeq,
    pub next_lease: Lease,
    pub timers: TimerTable,
    pub effects: VecDeque<Effect>,
    pub stats: MeshStats,
    /// Lanes with state not yet handed to a persist, in the order they became dirty.
    dirty_lanes: Vec<(GroupSlot, Partition)>,
    /// Groups to dispatch after the input, in the order they were touched.
    touched_groups: Vec<GroupSlot>,
    /// Lanes to consider fetching for after the input, in the order they were touched.
    touched_lanes: Vec<(GroupSlot, Partition)>,
}

impl Ctx {
    pub fn new(config: MeshConfig, epoch: Epoch, now: Millis) -> Self {
        Self {
            config,
            epoch,
            dispatch_enabled: false,
            now,
            next_ticket: 1,
            next_fetch_id: 1,
            next_seq: DeliverySeq::FIRST,
            next_lease: Lease::FIRST,
            timers: TimerTable::default(),
            effects: VecDeque::new(),
            stats: MeshStats::default(),
            dirty_lanes: Vec::new(),
            touched_groups: Vec::new(),
            touched_lanes: Vec::new(),
        }
    }

    /// The lane has state the next persist must carry.
    #[inline]
    pub fn dirty(&mut self, lane: &mut Lane) {
        if lane.set_dirty() {
            self.dirty_lanes.push((lane.group(), lane.partition()));
        }
    }

    /// The lane may want a fetch after this input.
    #[inline]
    pub fn touch_lane(&mut self, lane: &mut Lane) {
        if lane.set_touched() {
            self.touched_lanes.push((lane.group(), lane.partition()));
        }
    }

    /// The group may be able to hand out records after this input.
    #[inline]
    pub fn touch_group(&mut self, group: &mut Group) {
        if group.set_touched() {
            self.touched_groups.push(group.slot());
        }
    }

    #[inline]
    pub fn has_dirty_lanes(&self) -> bool {
        !self.dirty_lanes.is_empty()
    }

    /// The dirty lanes, in order; each lane's flag is cleared by whoever writes it.
    pub fn take_dirty_lanes(&mut self) -> Vec<(GroupSlot, Partition)> {
        std::mem::take(&mut self.dirty_lanes)
    }

    /// The touched lanes, in order, leaving the list empty (each lane's flag is cleared by
    /// whoever visits it). Hand the list back with `return_touched_lanes`.
    pub fn take_touched_lanes(&mut self) -> Vec<(GroupSlot, Partition)> {
        std::mem::take(&mut self.touched_lanes)
    }

    /// Gives a visited list back, so its capacity is reused: no allocation per input.
    pub fn return_touched_lanes(&mut self, mut lanes: Vec<(GroupSlot, Partition)>) {
        lanes.clear();
        if self.touched_lanes.is_empty() {
            self.touched_lanes = lanes;
        }
    }

    /// `take_touched_lanes` for groups.
    pub fn take_touched_groups(&mut self) -> Vec<GroupSlot> {
        std::mem::take(&mut self.touched_groups)
    }

    /// `return_touched_lanes` for groups.
    pub fn return_touched_groups(&mut self, mut groups: Vec<GroupSlot>) {
        groups.clear();
        if self.touched_groups.is_empty() {
            self.touched_groups = groups;
        }
    }

    /// A lane is gone: it is in no list any more.
    pub fn forget_lane(&mut self, group: GroupSlot, partition: Partition) {
        let other = |&(g, p): &(GroupSlot, Partition)| !(g == group && p == partition);
        self.dirty_lanes.retain(other);
        self.touched_lanes.retain(other);
    }

    /// A group is gone: neither it nor its lanes are in any list any more.
    pub fn forget_group(&mut self, group: GroupSlot) {
        self.dirty_lanes.retain(|&(g, _)| g != group);
        self.touched_lanes.retain(|&(g, _)| g != group);
        self.touched_groups.retain(|&g| g != group);
    }
}
