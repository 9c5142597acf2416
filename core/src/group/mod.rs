//! A subscription group: its definition, its lanes (one per assigned partition, plus the
//! replay lane) and its live clients, which compete for its records.
//!
//! # Rooms
//! The group's state is here; what it does lives by subject: `clients` (who can take a
//! delivery), `ack_deadlines` (when deliveries expire), `dispatch` (handing records out),
//! `settle` (ACK, NACK, extend, expiry, dead letters), `partitions` (lanes coming and
//! going, persists of them) and `fetch` (what a fetch brings). The lanes themselves are
//! in `crate::lane`.

mod ack_deadlines;
mod clients;
mod dispatch;
mod fetch;
mod partitions;
mod settle;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

pub(crate) use settle::Settling;

use crate::config::{MeshConfig, SubscriptionSpec};
use crate::io::REPLAY_PARTITION;
use crate::lane::LaneTable;
use crate::mesh::timers::{Timer, TimerTable};
use crate::mesh::{Ctx, Expected, GroupView};
use crate::slots::{Generation, GroupSlot, Lease};
use crate::types::{GroupName, Partition};
use ack_deadlines::AckDeadlines;
use clients::Clients;

/// Delivery counters of one group, for metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupStats {
    pub delivered: u64,
    pub redelivered: u64,
    pub acked: u64,
    pub late_acked: u64,
    pub nacked: u64,
    pub expired: u64,
    pub dead_lettered: u64,
    pub filtered: u64,
    pub rejected: u64,
    pub skipped_retention: u64,
}

impl GroupStats {
    /// Adds another group's counters (saturating: counters never wrap).
    pub fn absorb(&mut self, other: &GroupStats) {
        let GroupStats {
            delivered,
            redelivered,
            acked,
            late_acked,
            nacked,
            expired,
            dead_lettered,
            filtered,
            rejected,
            skipped_retention,
        } = other;
        self.delivered = self.delivered.saturating_add(*delivered);
        self.redelivered = self.redelivered.saturating_add(*redelivered);
        self.acked = self.acked.saturating_add(*acked);
        self.late_acked = self.late_acked.saturating_add(*late_acked);
        self.nacked = self.nacked.saturating_add(*nacked);
        self.expired = self.expired.saturating_add(*expired);
        self.dead_lettered = self.dead_lettered.saturating_add(*dead_lettered);
        self.filtered = self.filtered.saturating_add(*filtered);
        self.rejected = self.rejected.saturating_add(*rejected);
        self.skipped_retention = self.skipped_retention.saturating_add(*skipped_retention);
    }
}

/// Leases remembered per partition of a group (see `Leases`).
const LEASE_MEMORY: usize = 64;

/// The leases given out per partition, newest last, at most `LEASE_MEMORY` each: an id of
/// a revoked or re-seeked lane answers `revoked`, a never-issued one `unknown`.
#[derive(Clone, Debug)]
struct Leases {
    /// Leases below this were never this group's.
    floor: Lease,
    issued: BTreeMap<Partition, VecDeque<Lease>>,
}

impl Leases {
    /// Remembers a lease given to a lane of `partition`.
    fn record(&mut self, partition: Partition, lease: Lease) {
        let q = self.issued.entry(partition).or_default();
        if q.len() >= LEASE_MEMORY {
            q.pop_front();
        }
        q.push_back(lease);
    }

    /// Whether `lease` was given to a lane of `partition`. Past `LEASE_MEMORY` re-seeks of
    /// one partition the oldest are forgotten; a lease below the oldest remembered one, and
    /// of this group, then still counts as issued (the answer stays a refusal either way).
    fn issued(&self, partition: Partition, lease: Lease) -> bool {
        let Some(q) = self.issued.get(&partition) else {
            return false;
        };
        if q.contains(&lease) {
            return true;
        }
        q.len() >= LEASE_MEMORY
            && q.front().is_some_and(|&first| lease < first)
            && lease >= self.floor
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Group {
    slot: GroupSlot,
    generation: Generation,
    name: GroupName,
    spec: SubscriptionSpec,
    lanes: LaneTable,
    leases: Leases,
    clients: Clients,
    acks: AckDeadlines,
    /// It is in the `Ctx`'s list of groups to dispatch.
    touched: bool,
    stats: GroupStats,
    /// The group's definition is in a durable persist. Until it is, every persist that
    /// carries one of its checkpoints carries the definition too, so a store never holds
    /// progress of a group it does not know (found by unimesh-sim seed 3973).
    spec_durable: bool,
}

impl Group {
    /// A new group in `slot`; leases below `lease_floor` were never its own.
    pub fn new(
        slot: GroupSlot,
        generation: Generation,
        spec: SubscriptionSpec,
        lease_floor: Lease,
    ) -> Self {
        Self {
            slot,
            generation,
            name: spec.group.clone(),
            spec,
            lanes: LaneTable::default(),
            leases: Leases {
                floor: lease_floor,
                issued: BTreeMap::new(),
            },
            clients: Clients::new(slot),
            acks: AckDeadlines::new(slot),
            touched: false,
            stats: GroupStats::default(),
            spec_durable: false,
        }
    }

    #[inline]
    pub fn slot(&self) -> GroupSlot {
        self.slot
    }

    #[inline]
    pub fn generation(&self) -> Generation {
        self.generation
    }

    #[inline]
    pub fn spec(&self) -> &SubscriptionSpec {
        &self.spec
    }

    pub fn stats(&self) -> &GroupStats {
        &self.stats
    }

    pub fn spec_durable(&self) -> bool {
        self.spec_durable
    }

    /// A persist that carried the group's definition is durable.
    pub fn set_spec_durable(&mut self) {
        self.spec_durable = true;
    }

    /// Marks the group for dispatch; true if it was not (see `Ctx::touch_group`).
    #[inline]
    pub fn set_touched(&mut self) -> bool {
        !std::mem::replace(&mut self.touched, true)
    }

    #[inline]
    pub fn clear_touched(&mut self) {
        self.touched = false;
    }

    /// Gives a lane of `partition` a fresh lease.
    fn issue_lease(&mut self, cx: &mut Ctx, partition: Partition) -> Lease {
        let lease = cx.next_lease.take_next();
        self.leases.record(partition, lease);
        lease
    }

    /// A new definition (same topic and ordering). New settings apply to new deliveries;
    /// a filter applies to records not yet fetched. In-flight deliveries keep the deadline
    /// they were given; a changed in-flight limit re-ranks the clients.
    pub fn respec(&mut self, cx: &mut Ctx, spec: SubscriptionSpec) {
        self.spec = spec;
        self.clients.relist_all(self.spec.max_in_flight_per_client);
        cx.touch_group(self);
    }

    /// The group is being removed: its lanes go without marking anything done, and its
    /// timers stop.
    pub fn shut_down(&mut self, cx: &mut Ctx) {
        for p in self.lanes.partitions() {
            self.drop_lane(cx, p);
        }
        cx.timers.stop(Timer::Acks { group: self.slot });
        self.clients.stop_timers(&mut cx.timers);
    }

    pub fn view(&self) -> GroupView {
        GroupView {
            spec: self.spec.clone(),
            lanes: self
                .lanes
                .iter()
                .filter(|l| l.partition() != REPLAY_PARTITION)
                .map(|l| l.view())
                .collect(),
            replay: self.lanes.get(REPLAY_PARTITION).map(|l| l.view()),
            clients: self.clients.views(),
            stats: self.stats.clone(),
        }
    }

    /// Checks the group's structures against each other (see `mesh::invariants`) and
    /// adds the timers its state accounts for to `armed`.
    pub fn check(
        &self,
        config: &MeshConfig,
        timers: &TimerTable,
        armed: &mut BTreeSet<Timer>,
    ) -> Result<(), String> {
        let name = self.name.as_str();
        let mut want = Expected::default();
        for lane in self.lanes.iter() {
            lane.check(name, config, self.spec.max_attempts, &mut want, armed)?;
        }
        self.lanes.check(name)?;
        // C8: a group holds at most max_partitions lanes of max_window records and the
        // replay lane.
        let cap = config.max_window_per_lane * config.max_partitions_per_group
            + config.max_replay_per_group;
        self.acks.check(name, &mut want, cap, timers, armed)?;
        let max_in_flight = self.spec.max_in_flight_per_client;
        self.clients
            .check(name, max_in_flight, want.held, timers, armed)
    }
}
