//! The mesh: one state machine for every group, lane and client of one instance.
//!
//! # How to drive it
//! - `handle(now_ms, input)` for everything that happened; it answers requests directly.
//! - `poll_effect()` until `None` after every `handle`, and carry the effects out in order.
//! - `poll_timeout()` says when to call `handle(now, Input::Tick)` at the latest.
//!
//! # Rules of time
//! `now_ms` comes from the shell's monotonic clock. A `now_ms` below an earlier one is
//! treated as the earlier one (and counted): time never runs backwards inside the core.
//! Due timers fire at the start of every `handle`, so an input arriving after a deadline
//! sees the deadline's consequences first.
//!
//! # Durability
//! Nothing counts as durable until the shell reports `Persisted` for the ticket that
//! carried it: the epoch (no delivery is handed out before), attempt numbers >= 2 (no
//! redelivery before), dead letters, and the watermark that `Commit` reports.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::checkpoint::Checkpoint;
use crate::config::{MeshConfig, Ordering, SpecError, StartFrom, SubscriptionSpec};
use crate::delivery_id::DeliveryId;
use crate::group::{AckDeadlines, AckDue, Client, Group, GroupStats, ACK_SLACK};
use crate::io::{
    Assignment, DeadLetter, DeadLetterReason, Delivery, DlqKey, Effect, FetchId, FetchResult,
    Input, LaneCheckpoint, PersistBatch, Recovered, Refusal, RejectReason, Response, Settle,
    SkipReason, Ticket, REPLAY_PARTITION,
};
use crate::lane::{Entry, EntryState, FetchState, KeyQueue, Lane};
use crate::record::{Record, RecordMeta};
use crate::timers::{Timer, TimerTable};
use crate::types::{ClientId, Epoch, GroupName, Millis, Offset, Partition};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EpochState {
    Unsaved,
    Saving(Ticket),
    Durable,
}

/// What one outstanding persist carried, to apply when it is reported durable.
#[derive(Clone, Debug, Default)]
struct TicketInfo {
    epoch: bool,
    /// (group slot, group generation, partition, lease, watermark written)
    lanes: Vec<(u32, u64, Partition, u64, Offset)>,
    subscriptions: Vec<(u32, u64)>,
    removed_groups: Vec<GroupName>,
}

/// Counters of the whole instance, for metrics and the simulation's fault accounting.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MeshStats {
    pub fetches: u64,
    pub fetch_failures: u64,
    pub stale_fetch_answers: u64,
    pub duplicate_records: u64,
    pub realigned_records: u64,
    pub gap_offsets: u64,
    pub skipped_retention: u64,
    pub truncations: u64,
    pub persists: u64,
    pub persist_failures: u64,
    pub unknown_tickets: u64,
    pub clock_regressions: u64,
    pub fetch_pauses_for_ranges: u64,
    /// The counters of groups removed in this incarnation, so totals over all groups never
    /// go down when a group is deleted (a falling counter reads as a reset to Prometheus).
    pub removed_group_totals: GroupStats,
}

/// Read-only view of one lane, for admin and metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaneView {
    pub partition: Partition,
    pub lease: u64,
    pub cursor: Offset,
    pub push_end: Offset,
    pub watermark: Offset,
    pub durable_watermark: Option<Offset>,
    pub ack_ranges: Vec<(Offset, Offset)>,
    pub in_flight: usize,
    pub queued: usize,
    pub backoff: usize,
    pub fetch_outstanding: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientView {
    pub id: ClientId,
    pub credit: u32,
    pub in_flight: u32,
    pub last_active_ms: Millis,
}

#[derive(Clone, Debug)]
pub struct GroupView {
    pub spec: SubscriptionSpec,
    pub lanes: Vec<LaneView>,
    pub replay: Option<LaneView>,
    pub clients: Vec<ClientView>,
    pub stats: GroupStats,
}

/// Why a `Recovered` snapshot could not be used.
#[derive(Clone, Debug, PartialEq)]
pub enum RecoveryError {
    EpochExhausted,
    DuplicateGroup(GroupName),
    TooManyGroups { max: usize },
    InvalidSubscription { group: GroupName, error: SpecError },
}

impl std::fmt::Display for RecoveryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecoveryError::EpochExhausted => write!(f, "the epoch counter is exhausted"),
            RecoveryError::DuplicateGroup(g) => write!(f, "group {g} is stored twice"),
            RecoveryError::TooManyGroups { max } => {
                write!(f, "more stored groups than max_groups ({max})")
            }
            RecoveryError::InvalidSubscription { group, error } => {
                write!(
                    f,
                    "stored group {group} is invalid under this configuration: {error}"
                )
            }
        }
    }
}

impl std::error::Error for RecoveryError {}

/// State shared by all groups: the parts an operation on one group also touches.
struct Ctx {
    config: MeshConfig,
    epoch: Epoch,
    dispatch_enabled: bool,
    now: Millis,
    next_ticket: Ticket,
    next_fetch_id: FetchId,
    /// Names each delivery in its group's ACK-deadline FIFO.
    next_seq: u64,
    timers: TimerTable,
    effects: VecDeque<Effect>,
    dirty_lanes: Vec<(u32, Partition)>,
    touched_groups: Vec<u32>,
    touched_lanes: Vec<(u32, Partition)>,
    stats: MeshStats,
}

impl Ctx {
    fn dirty(&mut self, g: u32, lane: &mut Lane) {
        if !lane.dirty {
            lane.dirty = true;
            self.dirty_lanes.push((g, lane.partition));
        }
    }

    fn touch_lane(&mut self, g: u32, lane: &mut Lane) {
        if !lane.touched {
            lane.touched = true;
            self.touched_lanes.push((g, lane.partition));
        }
    }

    fn touch_group(&mut self, g: u32, group: &mut Group) {
        if !group.touched {
            group.touched = true;
            self.touched_groups.push(g);
        }
    }
}

/// The pure delivery core of one unimesh instance. See the module documentation.
pub struct Mesh {
    cx: Ctx,
    epoch_state: EpochState,
    groups: Vec<Option<Group>>,
    free_groups: Vec<u32>,
    group_ids: BTreeMap<GroupName, u32>,
    next_generation: u64,
    next_lease: u64,
    tickets: BTreeMap<Ticket, TicketInfo>,
    flush_blocked: bool,
    dirty_subscriptions: BTreeSet<u32>,
    removed_groups: Vec<GroupName>,
    /// Checkpoints read at start, waiting for their partition to be assigned.
    recovered: BTreeMap<(GroupName, Partition), Checkpoint>,
    /// Check every invariant after every `handle` (tests, simulation, debug builds).
    pub check_every_step: bool,
}

impl Mesh {
    /// Builds the mesh from what the stores kept. The new epoch is persisted first: no
    /// delivery is handed out until it is durable, so ids can never repeat across restarts.
    pub fn new(
        config: MeshConfig,
        recovered: Recovered,
        now_ms: Millis,
    ) -> Result<Self, RecoveryError> {
        let epoch = recovered
            .epoch
            .checked_add(1)
            .ok_or(RecoveryError::EpochExhausted)?;
        if recovered.subscriptions.len() > config.max_groups {
            return Err(RecoveryError::TooManyGroups {
                max: config.max_groups,
            });
        }
        let mut mesh = Mesh {
            cx: Ctx {
                config,
                epoch,
                dispatch_enabled: false,
                now: now_ms,
                next_ticket: 1,
                next_fetch_id: 1,
                next_seq: 1,
                timers: TimerTable::default(),
                effects: VecDeque::new(),
                dirty_lanes: Vec::new(),
                touched_groups: Vec::new(),
                touched_lanes: Vec::new(),
                stats: MeshStats::default(),
            },
            epoch_state: EpochState::Unsaved,
            groups: Vec::new(),
            free_groups: Vec::new(),
            group_ids: BTreeMap::new(),
            next_generation: 1,
            next_lease: 1,
            tickets: BTreeMap::new(),
            flush_blocked: false,
            dirty_subscriptions: BTreeSet::new(),
            removed_groups: Vec::new(),
            recovered: BTreeMap::new(),
            check_every_step: cfg!(debug_assertions),
        };
        for spec in recovered.subscriptions {
            if mesh.group_ids.contains_key(&spec.group) {
                return Err(RecoveryError::DuplicateGroup(spec.group));
            }
            spec.validate(&mesh.cx.config.limits).map_err(|error| {
                RecoveryError::InvalidSubscription {
                    group: spec.group.clone(),
                    error,
                }
            })?;
            let g = mesh.add_group(spec);
            if let Some(group) = mesh.groups[g as usize].as_mut() {
                group.spec_durable = true;
            }
        }
        for (group, partition, checkpoint) in recovered.checkpoints {
            // Checkpoints of groups that no longer exist are ignored, never resurrected.
            if mesh.group_ids.contains_key(&group) && partition != REPLAY_PARTITION {
                mesh.recovered.insert((group, partition), checkpoint);
            }
        }
        mesh.flush();
        Ok(mesh)
    }

    pub fn epoch(&self) -> Epoch {
        self.cx.epoch
    }

    /// True once the epoch is durable and deliveries can be handed out.
    pub fn is_ready(&self) -> bool {
        self.cx.dispatch_enabled
    }

    pub fn config(&self) -> &MeshConfig {
        &self.cx.config
    }

    pub fn stats(&self) -> &MeshStats {
        &self.cx.stats
    }

    pub fn now(&self) -> Millis {
        self.cx.now
    }

    /// The next effect to carry out, in order.
    pub fn poll_effect(&mut self) -> Option<Effect> {
        self.cx.effects.pop_front()
    }

    /// When `handle(now, Input::Tick)` must be called at the latest. It can be earlier than
    /// any real deadline (an ACK deadline whose delivery was settled since, an idle client
    /// that was busy in between): such a Tick finds nothing due and moves the timer on.
    pub fn poll_timeout(&self) -> Option<Millis> {
        self.cx.timers.next().map(|(t, _)| t)
    }

    /// Feeds one input; returns the answer to it. Effects are queued for `poll_effect`.
    pub fn handle(&mut self, now_ms: Millis, input: Input) -> Response {
        if now_ms < self.cx.now {
            self.cx.stats.clock_regressions += 1;
        } else {
            self.cx.now = now_ms;
        }
        self.fire_timers();
        let response = match input {
            Input::Ack { group, ids } => self.settle_ids(&group, &ids, Settling::Ack),
            Input::ClientGone { group, client } => self.client_gone(&group, &client),
            Input::ClientPoll { group, client, max } => self.client_poll(&group, client, max),
            Input::Extend {
                group,
                ids,
                extend_ms,
            } => self.settle_ids(&group, &ids, Settling::Extend(extend_ms)),
            Input::Fetched {
                group,
                partition,
                fetch_id,
                result,
            } => self.fetched(&group, partition, fetch_id, result),
            Input::FlushNow => {
                self.flush();
                Response::Ok
            }
            Input::Nack {
                group,
                ids,
                delay_ms,
            } => self.settle_ids(&group, &ids, Settling::Nack(delay_ms)),
            Input::PartitionsAssigned { group, partitions } => self.assign(&group, partitions),
            Input::PartitionsRevoked { group, partitions } => self.revoke(&group, &partitions),
            Input::PersistFailed { ticket } => self.persist_failed(ticket),
            Input::Persisted { ticket } => self.persisted(ticket),
            Input::Replay { group, records } => self.replay(&group, records),
            Input::Seek {
                group,
                partition,
                offset,
            } => self.seek(&group, partition, offset),
            Input::Subscribe(spec) => self.subscribe(spec),
            Input::Tick => Response::Ok,
            Input::Unsubscribe { group } => self.unsubscribe(&group),
        };
        self.settle();
        if self.check_every_step {
            if let Err(violation) = self.check_invariants() {
                panic!("unimesh-core invariant violated: {violation}");
            }
        }
        response
    }

    // ----- groups and subscriptions -----

    fn add_group(&mut self, spec: SubscriptionSpec) -> u32 {
        let generation = self.next_generation;
        self.next_generation += 1;
        let name = spec.group.clone();
        let group = Group::new(generation, spec, self.next_lease);
        let slot = match self.free_groups.pop() {
            Some(slot) => {
                self.groups[slot as usize] = Some(group);
                slot
            }
            None => {
                self.groups.push(Some(group));
                (self.groups.len() - 1) as u32
            }
        };
        self.group_ids.insert(name, slot);
        slot
    }

    fn group_slot(&self, name: &GroupName) -> Option<u32> {
        self.group_ids.get(name).copied()
    }

    /// Whether `Input::Subscribe(spec)` would be accepted now, without changing anything,
    /// so the shell can refuse before it does work of its own (creating the topic).
    pub fn check_subscribe(&self, spec: &SubscriptionSpec) -> Result<(), Refusal> {
        self.judge_subscribe(spec).map(|_| ())
    }

    /// `check_subscribe`, answering the slot of the group when it exists already.
    fn judge_subscribe(&self, spec: &SubscriptionSpec) -> Result<Option<u32>, Refusal> {
        spec.validate(&self.cx.config.limits)
            .map_err(Refusal::InvalidSpec)?;
        match self.group_slot(&spec.group) {
            Some(g) => {
                let group = self.groups[g as usize]
                    .as_ref()
                    .ok_or(Refusal::UnknownGroup)?;
                if group.spec.topic != spec.topic {
                    return Err(Refusal::TopicCannotChange {
                        topic: group.spec.topic.clone(),
                    });
                }
                if group.spec.ordering != spec.ordering {
                    return Err(Refusal::OrderingCannotChange);
                }
                Ok(Some(g))
            }
            None if self.group_ids.len() >= self.cx.config.max_groups => {
                Err(Refusal::TooManyGroups {
                    max: self.cx.config.max_groups,
                })
            }
            None => Ok(None),
        }
    }

    fn subscribe(&mut self, spec: SubscriptionSpec) -> Response {
        let existing = match self.judge_subscribe(&spec) {
            Ok(existing) => existing,
            Err(r) => return Response::Refused(r),
        };
        if let Some(g) = existing {
            let Some(group) = self.groups[g as usize].as_mut() else {
                return Response::Refused(Refusal::UnknownGroup);
            };
            // New settings apply to new deliveries; a filter applies to records not yet
            // fetched. In-flight deliveries keep the deadline they were given.
            group.spec = spec;
            let slots: Vec<u32> = (0..group.clients.len() as u32).collect();
            for slot in slots {
                group.update_client(slot, |_| ());
            }
            self.cx.touch_group(g, group);
            self.dirty_subscriptions.insert(g);
            return Response::Ok;
        }
        let g = self.add_group(spec);
        self.dirty_subscriptions.insert(g);
        Response::Ok
    }

    fn unsubscribe(&mut self, name: &GroupName) -> Response {
        let Some(g) = self.group_slot(name) else {
            return Response::Refused(Refusal::UnknownGroup);
        };
        let Some(mut group) = self.groups[g as usize].take() else {
            return Response::Refused(Refusal::UnknownGroup);
        };
        let partitions: Vec<Partition> = group.lanes.keys().copied().collect();
        for p in partitions {
            drop_lane(&mut self.cx, g, &mut group, p);
        }
        self.cx.timers.stop(Timer::Acks { group: g });
        for (slot, c) in group.clients.iter().enumerate() {
            if c.is_some() {
                self.cx.timers.stop(Timer::ClientIdle {
                    group: g,
                    client: slot as u32,
                });
            }
        }
        self.group_ids.remove(name);
        self.free_groups.push(g);
        self.dirty_subscriptions.remove(&g);
        self.cx.dirty_lanes.retain(|&(dg, _)| dg != g);
        self.cx.touched_lanes.retain(|&(dg, _)| dg != g);
        self.cx.touched_groups.retain(|&dg| dg != g);
        self.recovered.retain(|(gn, _), _| gn != name);
        self.removed_groups.push(name.clone());
        self.cx.stats.removed_group_totals.absorb(&group.stats);
        Response::Ok
    }

    // ----- clients -----

    fn client_poll(&mut self, name: &GroupName, client: ClientId, max: u32) -> Response {
        let Some(g) = self.group_slot(name) else {
            return Response::Refused(Refusal::UnknownGroup);
        };
        let max_clients = self.cx.config.max_clients_per_group;
        let Some(group) = self.groups[g as usize].as_mut() else {
            return Response::Refused(Refusal::UnknownGroup);
        };
        let slot = match group.client_ids.get(&client) {
            Some(&slot) => slot,
            None => {
                if group.client_ids.len() >= max_clients {
                    return Response::Refused(Refusal::TooManyClients { max: max_clients });
                }
                let c = Client {
                    id: client.clone(),
                    credit: 0,
                    in_flight: 0,
                    last_active_ms: self.cx.now,
                    listed: false,
                    idle_at: None,
                    limit_at_delivery: 0,
                };
                let slot = match group.free_clients.pop() {
                    Some(slot) => {
                        group.clients[slot as usize] = Some(c);
                        slot
                    }
                    None => {
                        group.clients.push(Some(c));
                        (group.clients.len() - 1) as u32
                    }
                };
                group.client_ids.insert(client, slot);
                slot
            }
        };
        let now = self.cx.now;
        group.update_client(slot, |c| {
            c.credit = max;
            c.last_active_ms = now;
        });
        refresh_idle(&mut self.cx, g, group, slot);
        self.cx.touch_group(g, group);
        Response::Ok
    }

    fn client_gone(&mut self, name: &GroupName, client: &ClientId) -> Response {
        let Some(g) = self.group_slot(name) else {
            return Response::Refused(Refusal::UnknownGroup);
        };
        let Some(group) = self.groups[g as usize].as_mut() else {
            return Response::Refused(Refusal::UnknownGroup);
        };
        if let Some(&slot) = group.client_ids.get(client) {
            remove_client(&mut self.cx, g, group, slot);
        }
        Response::Ok
    }

    // ----- partitions -----

    fn assign(&mut self, name: &GroupName, partitions: Vec<Assignment>) -> Response {
        let Some(g) = self.group_slot(name) else {
            return Response::Refused(Refusal::UnknownGroup);
        };
        let max = self.cx.config.max_partitions_per_group;
        let Some(group) = self.groups[g as usize].as_mut() else {
            return Response::Refused(Refusal::UnknownGroup);
        };
        if let Some(a) = partitions.iter().find(|a| a.partition == REPLAY_PARTITION) {
            return Response::Refused(Refusal::InvalidPartition(a.partition));
        }
        let new: BTreeSet<Partition> = partitions
            .iter()
            .map(|a| a.partition)
            .filter(|p| !group.lanes.contains_key(p))
            .collect();
        let real_lanes = group
            .lanes
            .keys()
            .filter(|&&p| p != REPLAY_PARTITION)
            .count();
        if real_lanes + new.len() > max {
            return Response::Refused(Refusal::TooManyPartitions { max });
        }
        for a in partitions {
            if group.lanes.contains_key(&a.partition) {
                continue;
            }
            let stored = a
                .checkpoint
                .or_else(|| self.recovered.remove(&(name.clone(), a.partition)));
            let fresh = stored.is_none();
            let checkpoint = stored.unwrap_or_else(|| {
                let start = match &group.spec.start_from {
                    StartFrom::Earliest => a.earliest,
                    StartFrom::Latest(ends) => ends.get(&a.partition).copied().unwrap_or(a.end),
                };
                Checkpoint::new(start)
            });
            let lease = self.next_lease;
            self.next_lease += 1;
            group.record_lease(a.partition, lease);
            let mut lane = Lane::new(a.partition, lease, true, checkpoint);
            if fresh {
                // Pin the start position, so a restart does not re-resolve "latest".
                self.cx.dirty(g, &mut lane);
            }
            self.cx.touch_lane(g, &mut lane);
            group.lanes.insert(a.partition, lane);
        }
        Response::Ok
    }

    fn revoke(&mut self, name: &GroupName, partitions: &[Partition]) -> Response {
        let Some(g) = self.group_slot(name) else {
            return Response::Refused(Refusal::UnknownGroup);
        };
        let Some(group) = self.groups[g as usize].as_mut() else {
            return Response::Refused(Refusal::UnknownGroup);
        };
        for &p in partitions {
            if p != REPLAY_PARTITION {
                drop_lane(&mut self.cx, g, group, p);
            }
        }
        self.cx.touch_group(g, group);
        Response::Ok
    }

    fn seek(&mut self, name: &GroupName, partition: Partition, offset: Offset) -> Response {
        let Some(g) = self.group_slot(name) else {
            return Response::Refused(Refusal::UnknownGroup);
        };
        let Some(group) = self.groups[g as usize].as_mut() else {
            return Response::Refused(Refusal::UnknownGroup);
        };
        if partition == REPLAY_PARTITION {
            return Response::Refused(Refusal::InvalidPartition(partition));
        }
        let Some(old) = drop_lane(&mut self.cx, g, group, partition) else {
            return Response::Refused(Refusal::NotAssigned(partition));
        };
        let lease = self.next_lease;
        self.next_lease += 1;
        group.record_lease(partition, lease);
        let mut lane = Lane::new(partition, lease, true, Checkpoint::new(offset));
        // Decisions already taken stay: dead letters and broker ACKs still get written.
        lane.unsynced_dead_letters = old.unsynced_dead_letters;
        lane.unsynced_resolved = old.unsynced_resolved;
        lane.unsynced_broker_acks = old.unsynced_broker_acks;
        lane.rewound = true;
        self.cx.dirty(g, &mut lane);
        self.cx.touch_lane(g, &mut lane);
        group.lanes.insert(partition, lane);
        self.cx.touch_group(g, group);
        Response::Ok
    }

    fn replay(&mut self, name: &GroupName, records: Vec<(Partition, Record)>) -> Response {
        let Some(g) = self.group_slot(name) else {
            return Response::Refused(Refusal::UnknownGroup);
        };
        let max = self.cx.config.max_replay_per_group;
        let Some(group) = self.groups[g as usize].as_mut() else {
            return Response::Refused(Refusal::UnknownGroup);
        };
        let held = group
            .lanes
            .get(&REPLAY_PARTITION)
            .map_or(0, Lane::window_used);
        if held + records.len() > max {
            return Response::Refused(Refusal::ReplayFull { max });
        }
        if !group.lanes.contains_key(&REPLAY_PARTITION) {
            let lease = self.next_lease;
            self.next_lease += 1;
            group.record_lease(REPLAY_PARTITION, lease);
            let lane = Lane::new(REPLAY_PARTITION, lease, false, Checkpoint::new(0));
            group.lanes.insert(REPLAY_PARTITION, lane);
        }
        for (origin, record) in records {
            let Some(lane) = group.lanes.get_mut(&REPLAY_PARTITION) else {
                break;
            };
            let slot = lane.cursor;
            lane.cursor += 1;
            admit(
                &mut self.cx,
                g,
                group,
                REPLAY_PARTITION,
                slot,
                origin,
                record,
                0,
            );
        }
        group.sync_lane(REPLAY_PARTITION);
        self.cx.touch_group(g, group);
        Response::Ok
    }

    // ----- fetching -----

    fn fetched(
        &mut self,
        name: &GroupName,
        partition: Partition,
        fetch_id: FetchId,
        result: FetchResult,
    ) -> Response {
        let Some(g) = self.group_slot(name) else {
            self.cx.stats.stale_fetch_answers += 1;
            return Response::Refused(Refusal::UnknownGroup);
        };
        let Some(group) = self.groups[g as usize].as_mut() else {
            return Response::Refused(Refusal::UnknownGroup);
        };
        let cx = &mut self.cx;
        let Some(lane) = group.lanes.get_mut(&partition) else {
            cx.stats.stale_fetch_answers += 1;
            return Response::Ok;
        };
        if lane.fetch != FetchState::Outstanding(fetch_id) {
            cx.stats.stale_fetch_answers += 1;
            return Response::Ok;
        }
        lane.fetch = FetchState::Idle;
        cx.touch_lane(g, lane);
        match result {
            FetchResult::Records(records) => intake(cx, g, group, partition, records),
            FetchResult::OutOfRange { earliest, end } => {
                out_of_range(cx, g, group, partition, earliest, end)
            }
            FetchResult::Failed { .. } => {
                cx.stats.fetch_failures += 1;
                let at = cx.now + cx.config.fetch_retry_ms;
                lane.fetch = FetchState::Retrying;
                cx.timers.set(
                    Timer::FetchRetry {
                        group: g,
                        partition,
                    },
                    at,
                );
            }
        }
        cx.touch_group(g, group);
        Response::Ok
    }

    // ----- settling deliveries -----

    fn settle_ids(&mut self, name: &GroupName, ids: &[DeliveryId], how: Settling) -> Response {
        let Some(g) = self.group_slot(name) else {
            return Response::Refused(Refusal::UnknownGroup);
        };
        let next_lease = self.next_lease;
        let Some(group) = self.groups[g as usize].as_mut() else {
            return Response::Refused(Refusal::UnknownGroup);
        };
        let cx = &mut self.cx;
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let outcome = match locate(cx.epoch, next_lease, group, id) {
                Err(reason) => Settle::Rejected(reason),
                Ok((state, attempts)) => match how {
                    Settling::Ack => {
                        let current =
                            matches!(state, EntryState::InFlight { .. }) && attempts == id.attempt;
                        ack(cx, g, group, id.partition, id.offset);
                        if current {
                            group.stats.acked += 1;
                        } else {
                            group.stats.late_acked += 1;
                        }
                        Settle::Accepted
                    }
                    Settling::Nack(delay) => {
                        if is_current(state, attempts, id) {
                            let delay = delay.map(|d| d.min(group.spec.backoff.max_ms));
                            group.stats.nacked += 1;
                            end_delivery(cx, g, group, id.partition, id.offset, End::Nack, delay);
                            Settle::Accepted
                        } else {
                            Settle::Rejected(RejectReason::AlreadyDone)
                        }
                    }
                    Settling::Extend(by) => {
                        if is_current(state, attempts, id) {
                            let max = cx.config.limits.max_ack_timeout_ms;
                            let by = by.unwrap_or(group.spec.ack_timeout_ms).min(max);
                            extend(cx, g, group, id.partition, id.offset, cx.now + by);
                            Settle::Accepted
                        } else {
                            Settle::Rejected(RejectReason::AlreadyDone)
                        }
                    }
                },
            };
            if matches!(outcome, Settle::Rejected(_)) {
                group.stats.rejected += 1;
            }
            out.push(outcome);
        }
        cx.touch_group(g, group);
        Response::Settled(out)
    }

    // ----- timers -----

    fn fire_timers(&mut self) {
        while let Some((at, timer)) = self.cx.timers.pop_due(self.cx.now) {
            match timer {
                Timer::Flush => self.flush(),
                Timer::Acks { group } => {
                    if let Some(gr) = self.groups.get_mut(group as usize).and_then(Option::as_mut) {
                        // In the order of the per-delivery timers this replaces.
                        for (partition, offset) in take_due_acks(gr, at) {
                            gr.stats.expired += 1;
                            end_delivery(
                                &mut self.cx,
                                group,
                                gr,
                                partition,
                                offset,
                                End::Timeout,
                                None,
                            );
                        }
                        rearm_acks(&mut self.cx, group, &mut gr.acks);
                    }
                }
                Timer::Backoff {
                    group,
                    partition,
                    offset,
                } => {
                    if let Some(gr) = self.groups.get_mut(group as usize).and_then(Option::as_mut) {
                        if let Some(lane) = gr.lanes.get_mut(&partition) {
                            if let Some(e) = lane.entries.get_mut(&offset) {
                                e.state = EntryState::Queued;
                                lane.offer(offset);
                            }
                        }
                        gr.sync_lane(partition);
                        self.cx.touch_group(group, gr);
                    }
                }
                Timer::ClientIdle { group, client } => {
                    if let Some(gr) = self.groups.get_mut(group as usize).and_then(Option::as_mut) {
                        if let Some(Some(c)) = gr.clients.get_mut(client as usize) {
                            match c.idle_at {
                                Some(t) if t <= at => {
                                    remove_client(&mut self.cx, group, gr, client)
                                }
                                Some(t) => {
                                    // Busy in between and idle again since: not yet.
                                    self.cx.timers.set(timer, t);
                                }
                                None => {}
                            }
                        }
                    }
                }
                Timer::FetchRetry { group, partition } => {
                    if let Some(gr) = self.groups.get_mut(group as usize).and_then(Option::as_mut) {
                        if let Some(lane) = gr.lanes.get_mut(&partition) {
                            lane.fetch = FetchState::Idle;
                            self.cx.touch_lane(group, lane);
                        }
                    }
                }
            }
        }
    }

    /// After every input: hand out what can be handed out, fetch where there is room, and
    /// make sure dirty state will be flushed.
    fn settle(&mut self) {
        // The lists go back empty but with their capacity: no allocation per input.
        let mut lanes = std::mem::take(&mut self.cx.touched_lanes);
        for &(g, p) in &lanes {
            if let Some(group) = self.groups.get_mut(g as usize).and_then(Option::as_mut) {
                if let Some(lane) = group.lanes.get_mut(&p) {
                    lane.touched = false;
                }
                maybe_fetch(&mut self.cx, group, p);
            }
        }
        lanes.clear();
        if self.cx.touched_lanes.is_empty() {
            self.cx.touched_lanes = lanes;
        }
        let mut groups = std::mem::take(&mut self.cx.touched_groups);
        for &g in &groups {
            if let Some(group) = self.groups.get_mut(g as usize).and_then(Option::as_mut) {
                group.touched = false;
                dispatch(&mut self.cx, g, group);
            }
        }
        groups.clear();
        if self.cx.touched_groups.is_empty() {
            self.cx.touched_groups = groups;
        }
        let pending = !self.cx.dirty_lanes.is_empty()
            || !self.dirty_subscriptions.is_empty()
            || !self.removed_groups.is_empty()
            || self.epoch_state == EpochState::Unsaved;
        if pending && self.cx.timers.due(Timer::Flush).is_none() && !self.flush_blocked {
            let at = self.cx.now + self.cx.config.flush_interval_ms;
            self.cx.timers.set(Timer::Flush, at);
        }
    }

    // ----- persistence -----

    fn flush(&mut self) {
        self.cx.timers.stop(Timer::Flush);
        if self.tickets.len() >= self.cx.config.max_outstanding_persists {
            self.flush_blocked = true;
            return;
        }
        self.flush_blocked = false;
        let ticket = self.cx.next_ticket;
        let mut info = TicketInfo::default();
        let mut batch = PersistBatch::default();
        if self.epoch_state == EpochState::Unsaved {
            batch.epoch = Some(self.cx.epoch);
            info.epoch = true;
            self.epoch_state = EpochState::Saving(ticket);
        }
        batch.removed_groups = std::mem::take(&mut self.removed_groups);
        info.removed_groups = batch.removed_groups.clone();
        for g in std::mem::take(&mut self.dirty_subscriptions) {
            if let Some(group) = self.groups.get(g as usize).and_then(Option::as_ref) {
                batch.subscriptions.push(group.spec.clone());
                info.subscriptions.push((g, group.generation));
            }
        }
        for (g, p) in std::mem::take(&mut self.cx.dirty_lanes) {
            let Some(group) = self.groups.get_mut(g as usize).and_then(Option::as_mut) else {
                continue;
            };
            let Some(lane) = group.lanes.get_mut(&p) else {
                continue;
            };
            lane.dirty = false;
            if lane.persistent {
                // A checkpoint never becomes durable without its group's definition: an
                // earlier persist that carried the definition may have failed.
                if !group.spec_durable && !info.subscriptions.contains(&(g, group.generation)) {
                    batch.subscriptions.push(group.spec.clone());
                    info.subscriptions.push((g, group.generation));
                }
                batch.checkpoints.push(LaneCheckpoint {
                    group: group.name.clone(),
                    topic: group.spec.topic.clone(),
                    partition: p,
                    checkpoint: lane.checkpoint(),
                });
            }
            batch
                .dead_letters
                .extend(lane.unsynced_dead_letters.iter().map(|(_, d)| d.clone()));
            batch
                .dlq_resolved
                .extend(lane.unsynced_resolved.iter().map(|(_, k)| k.clone()));
            info.lanes.push((
                g,
                group.generation,
                p,
                lane.lease,
                lane.progress.watermark(),
            ));
        }
        if batch.is_empty() {
            return;
        }
        self.cx.next_ticket += 1;
        self.cx.stats.persists += 1;
        self.tickets.insert(ticket, info);
        self.cx.effects.push_back(Effect::Persist {
            ticket,
            batch: Box::new(batch),
        });
    }

    fn persisted(&mut self, ticket: Ticket) -> Response {
        let Some(info) = self.tickets.remove(&ticket) else {
            self.cx.stats.unknown_tickets += 1;
            return Response::Ok;
        };
        if info.epoch && self.epoch_state == EpochState::Saving(ticket) {
            self.epoch_state = EpochState::Durable;
            self.cx.dispatch_enabled = true;
            for g in 0..self.groups.len() as u32 {
                if let Some(group) = self.groups[g as usize].as_mut() {
                    self.cx.touch_group(g, group);
                }
            }
        }
        for &(g, generation) in &info.subscriptions {
            if let Some(group) = self.groups.get_mut(g as usize).and_then(Option::as_mut) {
                if group.generation == generation {
                    group.spec_durable = true;
                }
            }
        }
        let commit = self.cx.config.commit_to_broker;
        for (g, generation, p, lease, watermark) in info.lanes {
            let Some(group) = self.groups.get_mut(g as usize).and_then(Option::as_mut) else {
                continue;
            };
            if group.generation != generation {
                continue;
            }
            let cx = &mut self.cx;
            let Some(lane) = group.lanes.get_mut(&p) else {
                continue;
            };
            if lane.lease != lease || ticket <= lane.durable_ticket {
                continue;
            }
            lane.durable_ticket = ticket;
            lane.durable_watermark = Some(watermark);
            while let Some(&(needed, offset)) = lane.awaiting_ledger.first() {
                if needed > ticket {
                    break;
                }
                lane.awaiting_ledger.pop_first();
                if let Some(e) = lane.entries.get_mut(&offset) {
                    e.ledger_needed = None;
                }
                lane.offer(offset);
            }
            lane.unsynced_dead_letters.retain(|(t, _)| *t > ticket);
            lane.unsynced_resolved.retain(|(t, _)| *t > ticket);
            let (acks, keep): (Vec<_>, Vec<_>) = std::mem::take(&mut lane.unsynced_broker_acks)
                .into_iter()
                .partition(|(t, _)| *t <= ticket);
            lane.unsynced_broker_acks = keep;
            for (_, handle) in acks {
                cx.effects.push_back(Effect::BrokerAck {
                    group: group.name.clone(),
                    topic: group.spec.topic.clone(),
                    partition: p,
                    handle,
                });
            }
            if commit && p != REPLAY_PARTITION && lane.committed != Some(watermark) {
                lane.committed = Some(watermark);
                cx.effects.push_back(Effect::Commit {
                    group: group.name.clone(),
                    topic: group.spec.topic.clone(),
                    partition: p,
                    offset: watermark,
                });
            }
            cx.touch_lane(g, lane);
            group.sync_lane(p);
            cx.touch_group(g, group);
        }
        if self.flush_blocked {
            self.flush();
        }
        Response::Ok
    }

    fn persist_failed(&mut self, ticket: Ticket) -> Response {
        let Some(info) = self.tickets.remove(&ticket) else {
            self.cx.stats.unknown_tickets += 1;
            return Response::Ok;
        };
        self.cx.stats.persist_failures += 1;
        if info.epoch && self.epoch_state == EpochState::Saving(ticket) {
            self.epoch_state = EpochState::Unsaved;
        }
        for (g, generation, p, lease, _) in info.lanes {
            let Some(group) = self.groups.get_mut(g as usize).and_then(Option::as_mut) else {
                continue;
            };
            if group.generation != generation {
                continue;
            }
            if let Some(lane) = group.lanes.get_mut(&p) {
                if lane.lease == lease {
                    self.cx.dirty(g, lane);
                }
            }
        }
        for (g, generation) in info.subscriptions {
            if let Some(group) = self.groups.get(g as usize).and_then(Option::as_ref) {
                if group.generation == generation {
                    self.dirty_subscriptions.insert(g);
                }
            }
        }
        for name in info.removed_groups {
            if !self.group_ids.contains_key(&name) {
                self.removed_groups.push(name);
            }
        }
        // Retry after a pause rather than at once: the store is failing.
        let at = self.cx.now + self.cx.config.fetch_retry_ms.max(1);
        self.cx.timers.set(Timer::Flush, at);
        self.flush_blocked = false;
        Response::Ok
    }

    // ----- views -----

    pub fn group_names(&self) -> impl Iterator<Item = &GroupName> {
        self.group_ids.keys()
    }

    pub fn subscription(&self, name: &GroupName) -> Option<&SubscriptionSpec> {
        let g = self.group_slot(name)?;
        self.groups[g as usize].as_ref().map(|gr| &gr.spec)
    }

    pub fn group_view(&self, name: &GroupName) -> Option<GroupView> {
        let g = self.group_slot(name)?;
        let group = self.groups[g as usize].as_ref()?;
        let view = |lane: &Lane| LaneView {
            partition: lane.partition,
            lease: lane.lease,
            cursor: lane.cursor,
            push_end: lane.push_end,
            watermark: lane.progress.watermark(),
            durable_watermark: lane.durable_watermark,
            ack_ranges: lane.progress.ranges().collect(),
            in_flight: lane
                .entries
                .values()
                .filter(|e| matches!(e.state, EntryState::InFlight { .. }))
                .count(),
            queued: lane
                .entries
                .values()
                .filter(|e| e.state == EntryState::Queued)
                .count(),
            backoff: lane
                .entries
                .values()
                .filter(|e| e.state == EntryState::Backoff)
                .count(),
            fetch_outstanding: matches!(lane.fetch, FetchState::Outstanding(_)),
        };
        Some(GroupView {
            spec: group.spec.clone(),
            lanes: group
                .lanes
                .values()
                .filter(|l| l.partition != REPLAY_PARTITION)
                .map(view)
                .collect(),
            replay: group.lanes.get(&REPLAY_PARTITION).map(view),
            clients: group
                .clients
                .iter()
                .flatten()
                .map(|c| ClientView {
                    id: c.id.clone(),
                    credit: c.credit,
                    in_flight: c.in_flight,
                    last_active_ms: c.last_active_ms,
                })
                .collect(),
            stats: group.stats.clone(),
        })
    }

    /// The persists handed out and not yet answered.
    pub fn outstanding_persists(&self) -> usize {
        self.tickets.len()
    }

    // ----- invariants -----

    /// Checks C3, C7, C8 and the internal consistency of every structure. O(state): for
    /// tests, the simulation and debug builds.
    pub fn check_invariants(&mut self) -> Result<(), String> {
        let cfg = &self.cx.config;
        let timers = &self.cx.timers;
        timers.check()?;
        // The timers the state says are armed (their deadlines are checked where the
        // state constrains them).
        let mut live_timers: BTreeSet<Timer> = BTreeSet::new();
        if timers.due(Timer::Flush).is_some() {
            live_timers.insert(Timer::Flush);
        }
        for (name, &g) in &self.group_ids {
            let group = self.groups[g as usize]
                .as_mut()
                .ok_or_else(|| format!("group {name} has an empty slot"))?;
            let max_in_flight = group.spec.max_in_flight_per_client;
            let mut held: BTreeMap<u32, BTreeSet<(Partition, Offset)>> = BTreeMap::new();
            // What the ACK-deadline structures must hold: seq -> (deadline, partition,
            // offset) for the FIFO, (deadline, partition, offset) for the moved set.
            let mut want_fifo: BTreeMap<u64, (Millis, Partition, Offset)> = BTreeMap::new();
            let mut want_moved: BTreeSet<(Millis, Partition, Offset)> = BTreeSet::new();
            for (&p, lane) in group.lanes.iter_mut() {
                let at = format!("{name}/{p}");
                lane.progress.check().map_err(|e| format!("{at}: {e:?}"))?;
                lane.entries.check().map_err(|e| format!("{at}: {e}"))?;
                lane.ready.check().map_err(|e| format!("{at}: {e}"))?;
                let wm = lane.progress.watermark();
                // C3: never passes an un-done offset...
                if let Some((&first, _)) = lane.entries.first_key_value() {
                    if first < wm {
                        return Err(format!("{at}: C3 watermark {wm} passed un-done {first}"));
                    }
                }
                // The watermark may be beyond the cursor: after a restart, closing the gap
                // below a persisted ACK range folds the range in before its offsets are
                // fetched again (they are done, and skipped when they come).
                // ...and never goes back except by seek or broker truncation.
                if wm < lane.checked_watermark && !lane.rewound {
                    return Err(format!(
                        "{at}: C3 watermark regressed {} -> {wm}",
                        lane.checked_watermark
                    ));
                }
                lane.checked_watermark = wm;
                lane.rewound = false;
                // C8: memory bounded by configuration.
                let cap = if p == REPLAY_PARTITION {
                    cfg.max_replay_per_group
                } else {
                    cfg.max_window_per_lane
                };
                if lane.entries.len() > cap {
                    return Err(format!(
                        "{at}: C8 {} records held > {cap}",
                        lane.entries.len()
                    ));
                }
                if lane.progress.range_count() > cfg.max_ack_ranges_per_lane + cap + 1 {
                    return Err(format!(
                        "{at}: C8 {} ack ranges",
                        lane.progress.range_count()
                    ));
                }
                for (&o, e) in &lane.entries {
                    if lane.progress.is_done(o) {
                        return Err(format!("{at}: entry {o} is done but still held"));
                    }
                    if o >= lane.cursor {
                        return Err(format!("{at}: entry {o} at or beyond cursor"));
                    }
                    if e.attempts > group.spec.max_attempts {
                        return Err(format!("{at}/{o}: C5 attempt {} > max", e.attempts));
                    }
                    if lane.ready.contains(&o) != e.eligible() {
                        return Err(format!("{at}/{o}: ready set disagrees with state"));
                    }
                    match e.state {
                        EntryState::InFlight {
                            client,
                            deadline,
                            seq,
                            moved,
                        } => {
                            held.entry(client).or_default().insert((p, o));
                            if moved {
                                want_moved.insert((deadline, p, o));
                            } else if want_fifo.insert(seq, (deadline, p, o)).is_some() {
                                return Err(format!("{at}/{o}: delivery seq {seq} reused"));
                            }
                        }
                        EntryState::Backoff => {
                            live_timers.insert(Timer::Backoff {
                                group: g,
                                partition: p,
                                offset: o,
                            });
                        }
                        EntryState::Queued => {}
                    }
                    if let Some(t) = e.ledger_needed {
                        if !lane.awaiting_ledger.contains(&(t, o)) {
                            return Err(format!("{at}/{o}: ledger wait not indexed"));
                        }
                    }
                }
                if lane.ready.len() > lane.entries.len() {
                    return Err(format!("{at}: ready set holds unknown entries"));
                }
                if group.ready_lanes.contains(&p) == lane.ready.is_empty()
                    || lane.listed == lane.ready.is_empty()
                {
                    return Err(format!("{at}: ready-lane set disagrees"));
                }
                if lane.fetch == FetchState::Retrying {
                    live_timers.insert(Timer::FetchRetry {
                        group: g,
                        partition: p,
                    });
                }
                for (k, q) in &lane.keys {
                    let head = lane.entries.get(&q.head);
                    if head.is_none_or(|e| e.key_blocked) {
                        return Err(format!("{at}: key {k} head {} missing or blocked", q.head));
                    }
                    for w in &q.waiting {
                        if !lane.entries.get(w).is_some_and(|e| e.key_blocked) {
                            return Err(format!("{at}: key {k} waiter {w} not blocked"));
                        }
                    }
                }
            }
            // ACK deadlines: the FIFO's live entries are exactly the in-flight deliveries not
            // moved, in deadline order; the moved set is exact; one timer at the earliest.
            let acks = &group.acks;
            let mut live = 0;
            let mut prev = 0;
            for d in &acks.fifo {
                if d.deadline < prev {
                    return Err(format!("{name}: ACK FIFO out of deadline order"));
                }
                prev = d.deadline;
                if want_fifo.get(&d.seq) == Some(&(d.deadline, d.partition, d.offset)) {
                    want_fifo.remove(&d.seq);
                    live += 1;
                }
            }
            if !want_fifo.is_empty() {
                return Err(format!(
                    "{name}: {} deliveries have no ACK deadline",
                    want_fifo.len()
                ));
            }
            if live != acks.live {
                return Err(format!(
                    "{name}: ACK FIFO counts {} live, {live} are",
                    acks.live
                ));
            }
            if acks.moved != want_moved {
                return Err(format!("{name}: moved ACK deadlines disagree with state"));
            }
            // C8: a group holds at most max_partitions lanes of max_window records and the
            // replay lane; the FIFO at most twice that + the slack + the push before it.
            let cap =
                cfg.max_window_per_lane * cfg.max_partitions_per_group + cfg.max_replay_per_group;
            if acks.fifo.len() > 2 * cap + ACK_SLACK + 1 {
                return Err(format!("{name}: C8 ACK FIFO holds {}", acks.fifo.len()));
            }
            let acks_timer = Timer::Acks { group: g };
            if timers.due(acks_timer) != acks.next_due() {
                return Err(format!("{name}: ACK timer not at the earliest deadline"));
            }
            if timers.due(acks_timer).is_some() {
                live_timers.insert(acks_timer);
            }
            for (slot, c) in group.clients.iter().enumerate() {
                let Some(c) = c else { continue };
                let slot = slot as u32;
                // C8: a client never holds more than max_in_flight (the one in force when
                // it last received a delivery: lowering the limit revokes nothing).
                if c.in_flight > max_in_flight.max(c.limit_at_delivery) {
                    return Err(format!("{name}/{}: C8 {} in flight", c.id, c.in_flight));
                }
                let holds = held.remove(&slot).unwrap_or_default();
                if c.in_flight as usize != holds.len() {
                    return Err(format!("{name}/{}: holdings disagree", c.id));
                }
                let ready = c.credit > 0 && c.in_flight < max_in_flight;
                if group.ready_clients.contains(&(c.in_flight, slot)) != ready || c.listed != ready
                {
                    return Err(format!("{name}/{}: ready-client set disagrees", c.id));
                }
                if c.idle_at.is_some() != (c.credit == 0 && c.in_flight == 0) {
                    return Err(format!("{name}/{}: idle state disagrees", c.id));
                }
                let idle_timer = Timer::ClientIdle {
                    group: g,
                    client: slot,
                };
                let idle_due = timers.due(idle_timer);
                if c.idle_at.is_some_and(|t| idle_due.is_none_or(|d| d > t)) {
                    return Err(format!("{name}/{}: idle timer missing or late", c.id));
                }
                if idle_due.is_some() {
                    live_timers.insert(idle_timer);
                }
            }
            if !held.is_empty() {
                return Err(format!("{name}: deliveries held by unknown clients"));
            }
            if group.ready_clients.len() > group.client_ids.len() {
                return Err(format!("{name}: ready-client set too large"));
            }
        }
        if !live_timers
            .iter()
            .copied()
            .eq(timers.iter().map(|(_, t)| t).collect::<BTreeSet<_>>())
        {
            return Err(format!(
                "timer table disagrees with state: {} live, {} in table",
                live_timers.len(),
                timers.len()
            ));
        }
        if self.tickets.len() > cfg.max_outstanding_persists {
            return Err("more persists outstanding than allowed".into());
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug)]
enum Settling {
    Ack,
    Nack(Option<Millis>),
    Extend(Option<Millis>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum End {
    Timeout,
    Nack,
    ClientGone,
}

/// Resolves a delivery id to the state of its record, or says why it cannot be settled.
fn locate(
    epoch: Epoch,
    next_lease: u64,
    group: &Group,
    id: &DeliveryId,
) -> Result<(EntryState, u32), RejectReason> {
    if id.epoch < epoch {
        return Err(RejectReason::Stale);
    }
    if id.epoch > epoch {
        return Err(RejectReason::Unknown);
    }
    // A lease of this group on this partition that is no longer current was revoked (or
    // re-seeked); anything else was never issued.
    let was_ours = id.lease < next_lease && group.lease_issued(id.partition, id.lease);
    let Some(lane) = group.lanes.get(&id.partition) else {
        return Err(if was_ours {
            RejectReason::Revoked
        } else {
            RejectReason::Unknown
        });
    };
    if id.lease != lane.lease {
        return Err(if was_ours && id.lease < lane.lease {
            RejectReason::Revoked
        } else {
            RejectReason::Unknown
        });
    }
    if id.offset >= lane.cursor {
        return Err(RejectReason::Unknown);
    }
    if lane.progress.is_done(id.offset) {
        return Err(RejectReason::AlreadyDone);
    }
    let Some(e) = lane.entries.get(&id.offset) else {
        return Err(RejectReason::Unknown);
    };
    if id.attempt < e.first_here || id.attempt > e.attempts {
        return Err(RejectReason::Unknown);
    }
    Ok((e.state, e.attempts))
}

/// Only the delivery currently out may be NACKed or extended.
fn is_current(state: EntryState, attempts: u32, id: &DeliveryId) -> bool {
    matches!(state, EntryState::InFlight { .. }) && attempts == id.attempt
}

/// The record is done for the group: ACKed (possibly by an earlier attempt's late ACK).
fn ack(cx: &mut Ctx, g: u32, group: &mut Group, p: Partition, offset: Offset) {
    if let Some(retired) = retire(cx, g, group, p, offset) {
        if p == REPLAY_PARTITION {
            let name = group.name.clone();
            if let Some(lane) = group.lanes.get_mut(&p) {
                lane.unsynced_resolved.push((
                    cx.next_ticket,
                    DlqKey {
                        group: name,
                        partition: retired.origin,
                        offset: retired.record_offset,
                    },
                ));
                cx.dirty(g, lane);
            }
        }
    }
}

/// Where a retired record came from: what its DLQ key is made of.
struct Retired {
    origin: Partition,
    record_offset: Offset,
}

/// Removes a not-done record because it is now done (ACKed or dead-lettered): frees its
/// client and timers, marks progress, lets the next record of its key go. The entry is
/// dropped where it lies (moving ~160 bytes out of the store was a visible cost), unless
/// its key is needed to release the next record of that key.
fn retire(
    cx: &mut Ctx,
    g: u32,
    group: &mut Group,
    p: Partition,
    offset: Offset,
) -> Option<Retired> {
    let keyed = group.spec.ordering == Ordering::Key;
    let lane = group.lanes.get_mut(&p)?;
    let at = lane.entries.position(offset)?;
    let entry = lane.entries.at(at)?;
    let (state, ledger_needed) = (entry.state, entry.ledger_needed);
    let retired = Retired {
        origin: entry.origin,
        record_offset: entry.record.offset,
    };
    let eligible = entry.eligible();
    let handle = entry.record.broker_handle.clone();
    // A blocked entry never held its key (only dead-on-arrival entries retire blocked).
    let holds_key = keyed && !entry.key_blocked && entry.record.partition_key().is_some();
    let owned = if holds_key {
        lane.entries.remove_at(at)
    } else {
        lane.entries.discard_at(at);
        None
    };
    if eligible {
        lane.ready.remove(&offset);
    }
    let mut client = None;
    match state {
        EntryState::InFlight {
            client: c,
            deadline,
            moved,
            seq,
        } => {
            forget_deadline(cx, g, &mut group.acks, p, offset, deadline, seq, moved);
            client = Some(c);
        }
        EntryState::Backoff => {
            cx.timers.stop(Timer::Backoff {
                group: g,
                partition: p,
                offset,
            });
        }
        EntryState::Queued => {}
    }
    if let Some(t) = ledger_needed {
        lane.awaiting_ledger.remove(&(t, offset));
    }
    lane.ledger.remove(&offset);
    lane.progress.mark_done(offset);
    if let Some(h) = handle {
        lane.unsynced_broker_acks.push((cx.next_ticket, h));
    }
    if let Some(k) = owned.as_ref().and_then(|e| e.record.partition_key()) {
        lane.release_key(k, offset);
    }
    cx.dirty(g, lane);
    cx.touch_lane(g, lane);
    group.sync_lane(p);
    if let Some(c) = client {
        unhold(cx, g, group, c);
    }
    cx.touch_group(g, group);
    Some(retired)
}

/// Ends the current delivery of a record without it being done: redelivery after a backoff
/// (with the next attempt number made durable first), or dead-lettering at the last attempt.
fn end_delivery(
    cx: &mut Ctx,
    g: u32,
    group: &mut Group,
    p: Partition,
    offset: Offset,
    why: End,
    delay: Option<Millis>,
) {
    let max_attempts = group.spec.max_attempts;
    let Some(lane) = group.lanes.get_mut(&p) else {
        return;
    };
    let Some(entry) = lane.entries.get_mut(&offset) else {
        return;
    };
    let EntryState::InFlight {
        client,
        deadline,
        moved,
        seq,
    } = entry.state
    else {
        return;
    };
    if entry.attempts >= max_attempts {
        let reason = match why {
            End::Timeout => DeadLetterReason::AckTimeout,
            End::Nack => DeadLetterReason::Nacked,
            End::ClientGone => DeadLetterReason::ClientGone,
        };
        dead_letter(cx, g, group, p, offset, reason);
        return;
    }
    forget_deadline(cx, g, &mut group.acks, p, offset, deadline, seq, moved);
    let next = entry.attempts + 1;
    let delay = delay.unwrap_or_else(|| group.spec.backoff.delay_ms(next));
    if lane.persistent {
        lane.ledger.insert(offset, next);
        let needed = cx.next_ticket;
        entry.ledger_needed = Some(needed);
        lane.awaiting_ledger.insert((needed, offset));
    }
    if delay == 0 {
        entry.state = EntryState::Queued;
    } else {
        entry.state = EntryState::Backoff;
        cx.timers.set(
            Timer::Backoff {
                group: g,
                partition: p,
                offset,
            },
            cx.now + delay,
        );
    }
    lane.offer(offset);
    cx.dirty(g, lane);
    group.sync_lane(p);
    group.stats.redelivered += 1;
    unhold(cx, g, group, client);
    cx.touch_group(g, group);
}

fn dead_letter(
    cx: &mut Ctx,
    g: u32,
    group: &mut Group,
    p: Partition,
    offset: Offset,
    reason: DeadLetterReason,
) {
    let topic = group.spec.topic.clone();
    let name = group.name.clone();
    let Some((record, attempts)) = group
        .lanes
        .get(&p)
        .and_then(|l| l.entries.get(&offset))
        .map(|e| (e.record.clone(), e.attempts))
    else {
        return;
    };
    let Some(retired) = retire(cx, g, group, p, offset) else {
        return;
    };
    if let Some(lane) = group.lanes.get_mut(&p) {
        lane.unsynced_dead_letters.push((
            cx.next_ticket,
            DeadLetter {
                key: DlqKey {
                    group: name,
                    partition: retired.origin,
                    offset: retired.record_offset,
                },
                topic,
                record,
                attempts,
                reason,
            },
        ));
    }
    group.stats.dead_lettered += 1;
}

fn extend(cx: &mut Ctx, g: u32, group: &mut Group, p: Partition, offset: Offset, to: Millis) {
    let Some(e) = group
        .lanes
        .get_mut(&p)
        .and_then(|l| l.entries.get_mut(&offset))
    else {
        return;
    };
    if let EntryState::InFlight {
        client,
        deadline,
        seq,
        moved,
    } = e.state
    {
        // Out of delivery order from now on: the FIFO entry dies, the moved set holds it.
        e.state = EntryState::InFlight {
            client,
            deadline: to,
            seq,
            moved: true,
        };
        forget_deadline(cx, g, &mut group.acks, p, offset, deadline, seq, moved);
        group.acks.moved.insert((to, p, offset));
        rearm_acks(cx, g, &mut group.acks);
    }
}

/// A delivery stops being in flight under its deadline: its FIFO entry stops counting as
/// live, or its moved deadline goes. A dead entry at the back, or at the front with an
/// equal deadline behind it, is dropped at once (the timer's deadline stays the same):
/// with ACKs in delivery order the FIFO then needs no compaction.
#[allow(clippy::too_many_arguments)]
fn forget_deadline(
    cx: &mut Ctx,
    g: u32,
    acks: &mut AckDeadlines,
    p: Partition,
    offset: Offset,
    deadline: Millis,
    seq: u64,
    moved: bool,
) {
    if moved {
        acks.moved.remove(&(deadline, p, offset));
        rearm_acks(cx, g, acks);
        return;
    }
    acks.live -= 1;
    let fifo = &mut acks.fifo;
    if fifo.len() >= 2 && fifo.back().is_some_and(|d| d.seq == seq) {
        fifo.pop_back();
    } else if fifo.front().is_some_and(|d| d.seq == seq)
        && fifo.get(1).is_some_and(|d| d.deadline == deadline)
    {
        fifo.pop_front();
    }
}

/// Keeps the group's one `Acks` timer at its earliest deadline.
fn rearm_acks(cx: &mut Ctx, g: u32, acks: &mut AckDeadlines) {
    let timer = Timer::Acks { group: g };
    let want = acks.next_due();
    if want != cx.timers.due(timer) {
        match want {
            Some(t) => cx.timers.set(timer, t),
            None => cx.timers.stop(timer),
        }
    }
}

/// A FIFO entry is live while its delivery is still in flight with that deadline.
fn ack_due_live(lanes: &BTreeMap<Partition, Lane>, d: &AckDue) -> bool {
    lanes
        .get(&d.partition)
        .and_then(|l| l.entries.get(&d.offset))
        .is_some_and(
            |e| matches!(e.state, EntryState::InFlight { seq, moved: false, .. } if seq == d.seq),
        )
}

/// Drops dead FIFO entries once they outnumber the live ones + `ACK_SLACK` (amortised O(1)
/// per delivery), so the FIFO stays within twice the deliveries in flight.
fn compact_acks(group: &mut Group) {
    let acks = &mut group.acks;
    if acks.fifo.len() > 2 * acks.live + ACK_SLACK {
        let lanes = &group.lanes;
        acks.fifo.retain(|d| ack_due_live(lanes, d));
        debug_assert_eq!(acks.fifo.len(), acks.live);
    }
}

/// Takes the deliveries due at `at` (the group's timer, its earliest deadline) off the
/// FIFO and the moved set, dropping dead FIFO entries met on the way, in (partition,
/// offset) order. The FIFO is left with a live front, so the next timer is a real deadline.
fn take_due_acks(group: &mut Group, at: Millis) -> Vec<(Partition, Offset)> {
    let mut due = Vec::new();
    let acks = &mut group.acks;
    while let Some(d) = acks.fifo.front() {
        if ack_due_live(&group.lanes, d) {
            if d.deadline > at {
                break;
            }
            due.push((d.partition, d.offset));
        }
        acks.fifo.pop_front();
    }
    while let Some(&(t, p, o)) = acks.moved.first() {
        if t > at {
            break;
        }
        acks.moved.pop_first();
        due.push((p, o));
    }
    due.sort_unstable();
    due
}

/// A client gives up a delivery it held.
fn unhold(cx: &mut Ctx, g: u32, group: &mut Group, slot: u32) {
    group.update_client(slot, |c| {
        c.in_flight = c.in_flight.saturating_sub(1);
    });
    refresh_idle(cx, g, group, slot);
}

/// Sets when a client will be forgotten: only a client with no credit and nothing in
/// flight can be. Its timer is armed if none is (an armed one is never later: `idle_at`
/// only grows, as time does) and otherwise left to fire early and move on.
fn refresh_idle(cx: &mut Ctx, g: u32, group: &mut Group, slot: u32) {
    let timeout = cx.config.client_idle_timeout_ms;
    let now = cx.now;
    let Some(Some(c)) = group.clients.get_mut(slot as usize) else {
        return;
    };
    if c.credit == 0 && c.in_flight == 0 {
        let t = now.max(c.last_active_ms) + timeout;
        c.idle_at = Some(t);
        let timer = Timer::ClientIdle {
            group: g,
            client: slot,
        };
        if cx.timers.due(timer).is_none() {
            cx.timers.set(timer, t);
        }
    } else {
        c.idle_at = None;
    }
}

fn remove_client(cx: &mut Ctx, g: u32, group: &mut Group, slot: u32) {
    let Some(Some(c)) = group.clients.get(slot as usize) else {
        return;
    };
    let holding = if c.in_flight > 0 {
        held_by(group, slot)
    } else {
        Vec::new()
    };
    for (p, offset) in holding {
        end_delivery(cx, g, group, p, offset, End::ClientGone, Some(0));
    }
    let Some(Some(c)) = group.clients.get_mut(slot as usize) else {
        return;
    };
    cx.timers.stop(Timer::ClientIdle {
        group: g,
        client: slot,
    });
    let id = c.id.clone();
    group.ready_clients.remove(&(c.in_flight, slot));
    group.clients[slot as usize] = None;
    group.client_ids.remove(&id);
    group.free_clients.push(slot);
    cx.touch_group(g, group);
}

/// The deliveries a client holds, in (partition, offset) order: every in-flight delivery
/// has a live entry in its group's ACK FIFO or is in the moved set. O(deadlines held).
fn held_by(group: &Group, slot: u32) -> Vec<(Partition, Offset)> {
    let holder = |p: Partition, o: Offset| {
        group
            .lanes
            .get(&p)
            .and_then(|l| l.entries.get(&o))
            .and_then(|e| match e.state {
                EntryState::InFlight { client, .. } => Some(client),
                _ => None,
            })
    };
    let mut held: Vec<(Partition, Offset)> = group
        .acks
        .fifo
        .iter()
        .filter(|d| ack_due_live(&group.lanes, d) && holder(d.partition, d.offset) == Some(slot))
        .map(|d| (d.partition, d.offset))
        .collect();
    held.extend(
        group
            .acks
            .moved
            .iter()
            .filter(|&&(_, p, o)| holder(p, o) == Some(slot))
            .map(|&(_, p, o)| (p, o)),
    );
    held.sort_unstable();
    held
}

/// Removes a lane and everything it holds without marking anything done (revocation, seek,
/// unsubscribe). Returns the lane for what must outlive it.
fn drop_lane(cx: &mut Ctx, g: u32, group: &mut Group, p: Partition) -> Option<Lane> {
    let lane = group.lanes.remove(&p)?;
    for (&offset, e) in &lane.entries {
        match e.state {
            EntryState::InFlight {
                client,
                deadline,
                moved,
                seq,
            } => {
                forget_deadline(cx, g, &mut group.acks, p, offset, deadline, seq, moved);
                unhold(cx, g, group, client);
            }
            EntryState::Backoff => {
                cx.timers.stop(Timer::Backoff {
                    group: g,
                    partition: p,
                    offset,
                });
            }
            EntryState::Queued => {}
        }
    }
    if lane.fetch == FetchState::Retrying {
        cx.timers.stop(Timer::FetchRetry {
            group: g,
            partition: p,
        });
    }
    // The lane's FIFO entries are all dead now.
    compact_acks(group);
    rearm_acks(cx, g, &mut group.acks);
    group.ready_lanes.remove(&p);
    cx.dirty_lanes.retain(|&(dg, dp)| !(dg == g && dp == p));
    cx.touched_lanes.retain(|&(dg, dp)| !(dg == g && dp == p));
    Some(lane)
}

/// Takes fetched records into a lane: skips what is already known or done (duplicates,
/// rewinds, restart alignment), completes filtered records, queues the rest.
fn intake(cx: &mut Ctx, g: u32, group: &mut Group, p: Partition, records: Vec<Record>) {
    let max_window = cx.config.max_window_per_lane;
    for record in records {
        let Some(lane) = group.lanes.get_mut(&p) else {
            return;
        };
        let offset = record.offset;
        if offset < lane.cursor {
            cx.stats.duplicate_records += 1;
            continue;
        }
        if lane.window_used() >= max_window {
            // More than was asked for: the rest is fetched again later.
            break;
        }
        if offset > lane.cursor {
            // Offsets the broker does not have (compaction, transaction markers).
            cx.stats.gap_offsets += offset - lane.cursor;
            lane.progress.mark_done_span(lane.cursor, offset);
            cx.dirty(g, lane);
        }
        lane.cursor = offset + 1;
        if lane.progress.is_done(offset) {
            // Done before a restart (in a persisted ACK range): never delivered again (C2).
            cx.stats.realigned_records += 1;
            continue;
        }
        let matches = match &record.meta {
            RecordMeta::Event(meta) => group.spec.filter.matches(meta),
            RecordMeta::Undecodable(_) => true,
        };
        if !matches {
            lane.progress.mark_done(offset);
            lane.ledger.remove(&offset);
            if let Some(h) = &record.broker_handle {
                lane.unsynced_broker_acks.push((cx.next_ticket, h.clone()));
            }
            cx.dirty(g, lane);
            group.stats.filtered += 1;
            continue;
        }
        let attempts = lane.ledger.get(&offset).copied().unwrap_or(0);
        admit(cx, g, group, p, offset, p, record, attempts);
    }
    group.sync_lane(p);
    if let Some(lane) = group.lanes.get_mut(&p) {
        // Ledger entries below the watermark belong to records that are done.
        let wm = lane.progress.watermark();
        if lane.ledger.first_key_value().is_some_and(|(&o, _)| o < wm) {
            lane.ledger = lane.ledger.split_off(&wm);
        }
    }
}

/// Places one record in a lane as an entry (or dead-letters it at once). The caller then
/// calls `sync_lane` once for its whole batch.
#[allow(clippy::too_many_arguments)]
fn admit(
    cx: &mut Ctx,
    g: u32,
    group: &mut Group,
    p: Partition,
    slot: Offset,
    origin: Partition,
    record: Record,
    attempts: u32,
) {
    let keyed = group.spec.ordering == Ordering::Key;
    let max_attempts = group.spec.max_attempts;
    let undecodable = match &record.meta {
        RecordMeta::Undecodable(why) => Some(DeadLetterReason::Undecodable(why.to_string())),
        RecordMeta::Event(_) => None,
    };
    // An undecodable record, or one whose attempts ran out before a restart, is dead-lettered
    // without a delivery. It goes in as an entry so the one retirement path handles it.
    let dead_now = undecodable.or(if attempts >= max_attempts {
        Some(DeadLetterReason::AckTimeout)
    } else {
        None
    });
    let Some(lane) = group.lanes.get_mut(&p) else {
        return;
    };
    let mut entry = Entry {
        record,
        origin,
        attempts,
        first_here: attempts + 1,
        state: EntryState::Queued,
        ledger_needed: None,
        key_blocked: false,
    };
    if let Some(reason) = dead_now {
        entry.key_blocked = true; // never ready; retired below
        lane.entries.insert(slot, entry);
        dead_letter(cx, g, group, p, slot, reason);
        return;
    }
    if attempts > 0 && lane.persistent {
        // Attempt `attempts` may have been issued before a restart: the next must be
        // recorded durably before it goes out.
        lane.ledger.insert(slot, attempts + 1);
        let needed = cx.next_ticket;
        entry.ledger_needed = Some(needed);
        lane.awaiting_ledger.insert((needed, slot));
        cx.dirty(g, lane);
    }
    if keyed {
        if let Some(k) = entry.record.partition_key() {
            match lane.keys.get_mut(k) {
                Some(q) => {
                    q.waiting.push_back(slot);
                    entry.key_blocked = true;
                }
                None => {
                    lane.keys.insert(
                        k.to_owned(),
                        KeyQueue {
                            head: slot,
                            waiting: VecDeque::new(),
                        },
                    );
                }
            }
        }
    }
    lane.entries.insert(slot, entry);
    lane.offer_fresh(slot);
    // The caller syncs the lane's place in ready_lanes once, after its batch.
}

fn out_of_range(
    cx: &mut Ctx,
    g: u32,
    group: &mut Group,
    p: Partition,
    earliest: Offset,
    end: Offset,
) {
    let name = group.name.clone();
    let topic = group.spec.topic.clone();
    let Some(lane) = group.lanes.get_mut(&p) else {
        return;
    };
    if lane.cursor < earliest {
        // Retention deleted what the group had not fetched yet. Records already held in
        // memory are not lost: only [cursor, earliest) is.
        let from = lane.cursor;
        let not_done = lane.progress.not_done_between(from, earliest);
        lane.progress.mark_done_span(from, earliest);
        lane.cursor = earliest;
        if lane
            .ledger
            .first_key_value()
            .is_some_and(|(&o, _)| o < earliest)
        {
            let keep = lane.ledger.split_off(&earliest);
            lane.ledger.retain(|o, _| lane.entries.contains_key(o));
            lane.ledger.extend(keep);
        }
        cx.stats.skipped_retention += not_done;
        group.stats.skipped_retention += not_done;
        cx.dirty(g, lane);
        cx.effects.push_back(Effect::Skipped {
            group: name,
            topic,
            partition: p,
            from,
            to: earliest,
            not_done,
            reason: SkipReason::Retention,
        });
    } else if lane.cursor > end {
        // The broker lost its tail: offsets from `end` will name new records. Forget what
        // we knew above it and start again there, reporting it.
        let to = lane.cursor;
        let above: Vec<Offset> = lane.entries.offsets_from(end).collect();
        let not_done = lane.progress.not_done_between(end, to);
        // From the top: fresh ready offsets then leave the end of their deque.
        for o in above.into_iter().rev() {
            drop_entry(cx, g, group, p, o);
        }
        let Some(lane) = group.lanes.get_mut(&p) else {
            return;
        };
        lane.progress.truncate_from(end);
        lane.cursor = end;
        lane.push_end = lane.push_end.min(end);
        let _forgotten_above_end = lane.ledger.split_off(&end);
        lane.rewound = true;
        cx.stats.truncations += 1;
        cx.dirty(g, lane);
        cx.effects.push_back(Effect::Skipped {
            group: name,
            topic,
            partition: p,
            from: end,
            to,
            not_done,
            reason: SkipReason::BrokerTruncated,
        });
    } else {
        // The broker contradicts itself; try again later rather than guess.
        cx.stats.fetch_failures += 1;
        let at = cx.now + cx.config.fetch_retry_ms;
        lane.fetch = FetchState::Retrying;
        cx.timers.set(
            Timer::FetchRetry {
                group: g,
                partition: p,
            },
            at,
        );
    }
}

/// Forgets one entry without marking it done (its offset will be fetched again or no
/// longer exists).
fn drop_entry(cx: &mut Ctx, g: u32, group: &mut Group, p: Partition, offset: Offset) {
    let keyed = group.spec.ordering == Ordering::Key;
    let Some(lane) = group.lanes.get_mut(&p) else {
        return;
    };
    let Some(entry) = lane.entries.remove(&offset) else {
        return;
    };
    if entry.eligible() {
        lane.ready.remove(&offset);
    }
    if let Some(t) = entry.ledger_needed {
        lane.awaiting_ledger.remove(&(t, offset));
    }
    if keyed {
        if let Some(k) = entry.record.partition_key() {
            if let Some(q) = lane.keys.get_mut(k) {
                if q.head == offset {
                    lane.release_key(k, offset);
                } else {
                    q.waiting.retain(|&o| o != offset);
                }
            }
        }
    }
    let mut client = None;
    match entry.state {
        EntryState::InFlight {
            client: c,
            deadline,
            moved,
            seq,
        } => {
            forget_deadline(cx, g, &mut group.acks, p, offset, deadline, seq, moved);
            client = Some(c);
        }
        EntryState::Backoff => {
            cx.timers.stop(Timer::Backoff {
                group: g,
                partition: p,
                offset,
            });
        }
        EntryState::Queued => {}
    }
    group.sync_lane(p);
    if let Some(c) = client {
        unhold(cx, g, group, c);
    }
}

fn maybe_fetch(cx: &mut Ctx, group: &mut Group, p: Partition) {
    let Some(lane) = group.lanes.get_mut(&p) else {
        return;
    };
    if !lane.persistent || lane.fetch != FetchState::Idle {
        return;
    }
    // At the cap on ACK ranges, fetching pauses only above the highest range: below it, a
    // fetch can only fill gaps (offsets inside ranges are skipped on intake), which is what
    // closes ranges. A restart that recovered a checkpoint with the maximum number of ranges
    // would otherwise never fetch the gaps, and the lane would stall for good (found by
    // unimesh-sim seed 22).
    if lane.progress.range_count() >= cx.config.max_ack_ranges_per_lane
        && lane.cursor >= lane.progress.done_end()
    {
        if !lane.paused_for_ranges {
            lane.paused_for_ranges = true;
            cx.stats.fetch_pauses_for_ranges += 1;
        }
        return;
    }
    lane.paused_for_ranges = false;
    let max_window = cx.config.max_window_per_lane;
    let room = max_window.saturating_sub(lane.window_used());
    let min_room = (cx.config.fetch_batch.min(max_window) / 2).max(1);
    if room < min_room {
        return;
    }
    let fetch_id = cx.next_fetch_id;
    cx.next_fetch_id += 1;
    lane.fetch = FetchState::Outstanding(fetch_id);
    cx.stats.fetches += 1;
    cx.effects.push_back(Effect::Fetch {
        group: group.name.clone(),
        topic: group.spec.topic.clone(),
        partition: p,
        fetch_id,
        from: lane.cursor,
        max: room.min(cx.config.fetch_batch),
    });
}

/// Hands ready records to clients that asked for them: the least loaded client first,
/// lanes round-robin, lowest offset first within a lane.
fn dispatch(cx: &mut Ctx, g: u32, group: &mut Group) {
    if !cx.dispatch_enabled {
        return;
    }
    let ack_timeout_ms = group.spec.ack_timeout_ms;
    while let Some(&(_, slot)) = group.ready_clients.first() {
        let Some(p) = group.pick_lane() else {
            break;
        };
        let Some(lane) = group.lanes.get_mut(&p) else {
            group.ready_lanes.remove(&p);
            continue;
        };
        let popped = lane.ready.pop_first();
        if lane.ready.is_empty() {
            lane.listed = false;
            group.ready_lanes.remove(&p);
        }
        let Some(offset) = popped else {
            continue;
        };
        let Some(entry) = lane.entries.get_mut(&offset) else {
            continue;
        };
        debug_assert!(entry.eligible());
        entry.attempts += 1;
        let deadline = cx.now + ack_timeout_ms;
        let seq = cx.next_seq;
        cx.next_seq += 1;
        // Deadlines only go into the FIFO in order (the ACK timeout may have been lowered).
        let moved = group
            .acks
            .fifo
            .back()
            .is_some_and(|d| d.deadline > deadline);
        entry.state = EntryState::InFlight {
            client: slot,
            deadline,
            seq,
            moved,
        };
        if moved {
            group.acks.moved.insert((deadline, p, offset));
        } else {
            group.acks.fifo.push_back(AckDue {
                deadline,
                partition: p,
                offset,
                seq,
            });
            group.acks.live += 1;
        }
        lane.push_end = lane.push_end.max(offset + 1);
        let delivery = Delivery {
            id: DeliveryId {
                epoch: cx.epoch,
                lease: lane.lease,
                partition: p,
                offset,
                attempt: entry.attempts,
            },
            attempt: entry.attempts,
            topic: group.spec.topic.clone(),
            partition: entry.origin,
            record: entry.record.clone(),
        };
        compact_acks(group);
        rearm_acks(cx, g, &mut group.acks);
        if delivery.attempt == 1 {
            group.stats.delivered += 1;
        }
        let limit = group.spec.max_in_flight_per_client;
        let Some(client) = group.update_client(slot, |c| {
            c.in_flight += 1;
            c.credit -= 1;
            c.limit_at_delivery = limit;
            c.id.clone()
        }) else {
            continue;
        };
        refresh_idle(cx, g, group, slot);
        cx.effects.push_back(Effect::Deliver {
            group: group.name.clone(),
            client,
            delivery,
        });
    }
}
