//! A subscription group: its definition, its lanes (one per assigned partition, plus the
//! replay lane) and its live clients, which compete for its records.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::config::SubscriptionSpec;
use crate::lane::Lane;
use crate::types::{ClientId, GroupName, Millis, Offset, Partition};

/// Leases remembered per partition of a group (see `Group::leases`).
pub(crate) const LEASE_MEMORY: usize = 64;

#[derive(Clone, Debug)]
pub(crate) struct Client {
    pub id: ClientId,
    /// How many more deliveries the client asked for.
    pub credit: u32,
    /// Deliveries it holds. Which ones is found from the group's ACK deadlines when it
    /// leaves (rare), so a departure hands them back at once instead of waiting for their
    /// ACK timeouts (upstream #5282) without an index updated on every delivery.
    pub in_flight: u32,
    pub last_active_ms: Millis,
    /// When the client will be forgotten if it stays without credit and deliveries; `None`
    /// while it has either.
    pub idle_at: Option<Millis>,
    /// It is in the group's `ready_clients`.
    pub listed: bool,
    /// The group's `max_in_flight_per_client` when it last received a delivery. Lowering
    /// the limit revokes nothing: the client may hold up to this until it ACKs down.
    pub limit_at_delivery: u32,
}

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

/// One delivery's ACK deadline, queued in delivery order. It is live while the record is
/// still in flight under this delivery (`seq`) and its deadline was not moved since.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AckDue {
    pub deadline: Millis,
    pub partition: Partition,
    pub offset: Offset,
    pub seq: u64,
}

/// The ACK deadlines of a group's deliveries. Deliveries get `now + ack_timeout`, which
/// only grows while the timeout stays the same, so the deadlines go into a FIFO in delivery
/// order and an ACK just leaves its entry behind (dead, skipped when it reaches the front);
/// the few deadlines out of that order (an extension, a lowered timeout) go into `moved`.
/// The timer table holds one `Acks` timer per group at the earliest of both fronts, so
/// delivering and ACKing touch no shared ordered structure. Dead FIFO entries are dropped
/// when the timer fires and by compaction once they outnumber live ones + `ACK_SLACK`:
/// the FIFO holds at most twice the deliveries in flight + `ACK_SLACK` + 1.
#[derive(Clone, Debug, Default)]
pub(crate) struct AckDeadlines {
    pub fifo: VecDeque<AckDue>,
    /// Deliveries whose deadline is not in FIFO order: (deadline, partition, offset).
    pub moved: BTreeSet<(Millis, Partition, Offset)>,
    /// How many FIFO entries are live.
    pub live: usize,
}

/// Dead FIFO entries tolerated beyond one per live one before compaction.
pub(crate) const ACK_SLACK: usize = 64;

impl AckDeadlines {
    /// The earliest deadline held, live or not: when the group's timer is due.
    pub fn next_due(&self) -> Option<Millis> {
        let fifo = self.fifo.front().map(|d| d.deadline);
        let moved = self.moved.first().map(|&(t, _, _)| t);
        match (fifo, moved) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Group {
    /// Distinguishes this group from an earlier one in the same slot.
    pub generation: u64,
    pub name: GroupName,
    pub spec: SubscriptionSpec,
    /// Leases below this were never this group's.
    pub lease_floor: u64,
    pub lanes: BTreeMap<Partition, Lane>,
    /// The leases given out per partition, newest last, at most `LEASE_MEMORY` each: an id
    /// of a revoked or re-seeked lane answers `revoked`, a never-issued one `unknown`.
    pub leases: BTreeMap<Partition, VecDeque<u64>>,
    pub clients: Vec<Option<Client>>,
    pub free_clients: Vec<u32>,
    pub client_ids: BTreeMap<ClientId, u32>,
    /// Clients that can take a delivery now, least loaded first: (in_flight, slot).
    pub ready_clients: BTreeSet<(u32, u32)>,
    /// Lanes with a ready record.
    pub ready_lanes: BTreeSet<Partition>,
    /// Round-robin position over ready lanes, so no partition starves another.
    pub next_lane: Partition,
    pub touched: bool,
    pub acks: AckDeadlines,
    pub stats: GroupStats,
    /// The group's definition is in a durable persist. Until it is, every persist that
    /// carries one of its checkpoints carries the definition too, so a store never holds
    /// progress of a group it does not know (found by unimesh-sim seed 3973).
    pub spec_durable: bool,
}

impl Group {
    pub fn new(generation: u64, spec: SubscriptionSpec, lease_floor: u64) -> Self {
        Self {
            generation,
            name: spec.group.clone(),
            spec,
            lease_floor,
            lanes: BTreeMap::new(),
            leases: BTreeMap::new(),
            clients: Vec::new(),
            free_clients: Vec::new(),
            client_ids: BTreeMap::new(),
            ready_clients: BTreeSet::new(),
            ready_lanes: BTreeSet::new(),
            next_lane: 0,
            touched: false,
            acks: AckDeadlines::default(),
            stats: GroupStats::default(),
            spec_durable: false,
        }
    }

    /// Changes a client and keeps `ready_clients` exact, touching the set only when the
    /// client's place in it changes.
    pub fn update_client<R>(&mut self, slot: u32, f: impl FnOnce(&mut Client) -> R) -> Option<R> {
        let max = self.spec.max_in_flight_per_client;
        let c = self.clients.get_mut(slot as usize)?.as_mut()?;
        let (was, before) = (c.listed, c.in_flight);
        let r = f(c);
        let ready = c.credit > 0 && c.in_flight < max;
        if was && (!ready || c.in_flight != before) {
            self.ready_clients.remove(&(before, slot));
        }
        if ready && (!was || c.in_flight != before) {
            self.ready_clients.insert((c.in_flight, slot));
        }
        c.listed = ready;
        Some(r)
    }

    /// Remembers a lease given to a lane of `partition`.
    pub fn record_lease(&mut self, partition: Partition, lease: u64) {
        let q = self.leases.entry(partition).or_default();
        if q.len() >= LEASE_MEMORY {
            q.pop_front();
        }
        q.push_back(lease);
    }

    /// Whether `lease` was given to a lane of `partition`. Past `LEASE_MEMORY` re-seeks of
    /// one partition the oldest are forgotten; a lease below the oldest remembered one, and
    /// of this group, then still counts as issued (the answer stays a refusal either way).
    pub fn lease_issued(&self, partition: Partition, lease: u64) -> bool {
        let Some(q) = self.leases.get(&partition) else {
            return false;
        };
        if q.contains(&lease) {
            return true;
        }
        q.len() >= LEASE_MEMORY
            && q.front().is_some_and(|&first| lease < first)
            && lease >= self.lease_floor
    }

    /// Re-evaluates a lane's place in `ready_lanes`.
    pub fn sync_lane(&mut self, partition: Partition) {
        let Some(lane) = self.lanes.get_mut(&partition) else {
            self.ready_lanes.remove(&partition);
            return;
        };
        let ready = !lane.ready.is_empty();
        if ready != lane.listed {
            if ready {
                self.ready_lanes.insert(partition);
            } else {
                self.ready_lanes.remove(&partition);
            }
            lane.listed = ready;
        }
    }

    /// The next lane to serve, round-robin.
    pub fn pick_lane(&mut self) -> Option<Partition> {
        let p = self
            .ready_lanes
            .range(self.next_lane..)
            .next()
            .or_else(|| self.ready_lanes.first())
            .copied()?;
        self.next_lane = p.wrapping_add(1);
        Some(p)
    }
}
