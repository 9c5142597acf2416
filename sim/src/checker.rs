//! The contract checker: C1–C9 of DESIGN.md §3, checked from the outside.
//!
//! The checker is told what the world saw — records the broker acknowledged, deliveries
//! handed to clients, answers to ACK/NACK/extend, persists emitted and applied by the store,
//! commits, broker ACKs, skips, crashes, rebalances, seeks — and fails at the first
//! observation that breaks the contract. It keeps its own mirror of what is durable and
//! never looks inside the mesh, so the same checker can watch the real shell (a madsim
//! harness feeds it from the HTTP API and a fake storage port) as well as the pure core.
//!
//! Safety is checked at every observation; [`Checker::check_quiescent`] adds liveness once
//! faults have stopped and the system has converged.
//!
//! # Driving it from another harness
//! Call the hooks in the order things happen, passing the mesh's own notion of `now`
//! (what its deadlines are computed from):
//! - world: [`Checker::add_group`] once per group, [`Checker::published`] for every record
//!   the broker acknowledged, [`Checker::retention`] when the broker deletes a prefix;
//! - incarnations: [`Checker::started`] with the new epoch, [`Checker::crashed`];
//! - inputs, right after the mesh answered them and before their effects:
//!   [`Checker::client_poll`], [`Checker::client_gone`], [`Checker::settled`],
//!   [`Checker::assigned`], [`Checker::revoked`], [`Checker::sought`] — fire due timers
//!   before a seek or revocation, so a flush they trigger is not mistaken for the new lane's;
//! - effects: [`Checker::delivered`], [`Checker::persist_emitted`], [`Checker::committed`],
//!   [`Checker::broker_acked`] / [`Checker::replay_broker_acked`], [`Checker::skipped`];
//! - the store: [`Checker::persist_applied`] when a batch is durable (also when the process
//!   dies before hearing so), [`Checker::persist_notified`] when the mesh is told,
//!   [`Checker::persist_failed`];
//! - at the end: [`Checker::converged`] to know when to stop, [`Checker::check_quiescent`].
//!
//! A harness of the real shell that cannot see `Persist` batches directly can feed the
//! same hooks from a storage port that reports what it wrote.
//!
//! # Generations
//! Each (group, partition) lane has a *generation*, bumped by a seek, a revocation and a
//! crash: every event after which the mesh may legitimately forget what was done in memory.
//! An ACK counts for the generation it was given in; a checkpoint is tagged with the
//! generation in which it was emitted; a checkpoint may mark an offset done only if the
//! offset was ACKed (or dead-lettered, filtered, skipped by retention, or passed over by an
//! operator seek) in that generation. This is how "nothing is committed past an un-ACKed
//! record" is checked without trusting the mesh's own bookkeeping.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use unimesh_core::{
    Checkpoint, ClientId, Delivery, DeliveryId, DlqKey, Epoch, Filter, GroupName, Millis, Offset,
    Ordering, Partition, PersistBatch, Progress, Record, RecordMeta, RejectReason, Response,
    Settle, SkipReason, StartFrom, SubscriptionSpec, Ticket, TopicName, REPLAY_PARTITION,
};

/// The clause of the contract a violation breaks. `Core` is the mesh's own invariant check.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Clause {
    C1,
    C2,
    C3,
    C4,
    C5,
    C6,
    C7,
    C8,
    C9,
    Core,
}

impl fmt::Display for Clause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub clause: Clause,
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.clause, self.message)
    }
}

impl std::error::Error for Violation {}

pub type Check = Result<(), Violation>;

fn fail(clause: Clause, message: String) -> Check {
    Err(Violation { clause, message })
}

/// How a client tried to settle a delivery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SettleKind {
    Ack,
    /// With the delay before redelivery (None: the group's backoff).
    Nack(Option<Millis>),
    Extend(Option<Millis>),
}

/// Figures the checker gathers along the way (shown in reports).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckerStats {
    pub deliveries: u64,
    pub first_deliveries: u64,
    /// First attempts of a record handed out again (after a crash or rebalance).
    pub repeated_first_attempts: u64,
    pub acks_accepted: u64,
    pub late_acks_accepted: u64,
    pub settles_rejected: u64,
    pub stale_rejected: u64,
    pub persists_applied: u64,
    pub dead_letters: u64,
    pub skipped_offsets: u64,
}

#[derive(Clone, Debug)]
struct PubRec {
    meta: RecordMeta,
    /// Whether the record came with a POP receipt handle (C6 applies).
    handle: bool,
}

#[derive(Clone, Debug, Default)]
struct Log {
    recs: Vec<PubRec>,
    earliest: Offset,
}

/// What the checker knows of one record for one group.
#[derive(Clone, Debug, Default)]
struct Rec {
    /// Bit `gen % 64` set when ACKed (accepted) in that generation of the lane.
    acked_mask: u64,
    /// Bit set when an operator seek passed over the record in that generation.
    op_mask: u64,
    acked_any: bool,
    /// The generation of the first accepted ACK.
    first_ack_gen: Option<u32>,
    /// Highest attempt delivered in the lane since the last seek reset (C5).
    max_attempt: u32,
    had_ge2: bool,
    first_count: u32,
    /// The lane's reset counter when the last first attempt was delivered.
    first_reset: u32,
    /// Highest attempt ever delivered, replay lane included (justifies dead letters).
    max_attempt_any: u32,
    /// Highest attempt number seen in a durable ledger.
    ledger_max: u32,
    /// (epoch, lease) in which the record was last done (ACK accepted).
    done_in: Option<(Epoch, u64)>,
    broker_ack_due: bool,
    broker_acked: bool,
    deliveries: u32,
}

#[derive(Clone, Debug, Default)]
struct LaneState {
    recs: Vec<Rec>,
    durable: Option<Checkpoint>,
    gen: u32,
    /// Generation of the last seek.
    seek_gen: u32,
    /// Generations of every seek (a durable watermark may go back across one).
    seek_gens: BTreeSet<u32>,
    /// Generation of the checkpoint last applied.
    applied_gen: u32,
    /// A seek happened and no checkpoint written after it is durable yet.
    seek_pending: bool,
    /// Crashes and revocations: after one, a first attempt may be handed out again.
    resets: u32,
    /// Bumped by revocation and crash: broker ACKs promised by older persists are void.
    drop_gen: u32,
    /// Leases below this were revoked in this incarnation.
    revoked_below: u64,
    max_lease: u64,
    assigned: bool,
    skipped: Vec<(Offset, Offset)>,
    committed: Option<Offset>,
    commit_seek_gen: u32,
    /// Key order: the highest offset delivered per key in the current lease.
    key_last: BTreeMap<String, (u64, Offset)>,
}

impl LaneState {
    /// A revocation or crash voids broker ACKs not yet sent (every effect for the lane
    /// stops; a POP broker hands such records out again after their invisibility time).
    fn void_pending_broker_acks(&mut self) {
        for r in &mut self.recs {
            if !r.broker_acked {
                r.broker_ack_due = false;
            }
        }
    }

    fn rec(&mut self, o: Offset) -> &mut Rec {
        let i = o as usize;
        if self.recs.len() <= i {
            self.recs.resize_with(i + 1, Rec::default);
        }
        &mut self.recs[i]
    }

    fn durable_done(&self, o: Offset) -> bool {
        self.durable.as_ref().is_some_and(|c| c.progress.is_done(o))
    }

    fn is_skipped(&self, o: Offset) -> bool {
        self.skipped.iter().any(|&(a, b)| a <= o && o < b)
    }
}

#[derive(Clone, Debug)]
struct Held {
    id: DeliveryId,
    client: ClientId,
    deadline: Millis,
    key: Option<String>,
}

#[derive(Clone, Debug, Default)]
struct ReplaySlot {
    attempt: u32,
    done: bool,
}

#[derive(Clone, Debug)]
struct GroupState {
    topic: TopicName,
    filter: Filter,
    ordering: Ordering,
    max_attempts: u32,
    ack_timeout_ms: Millis,
    max_in_flight: u32,
    start: BTreeMap<Partition, Offset>,
    lanes: BTreeMap<Partition, LaneState>,
    credit: BTreeMap<ClientId, u32>,
    /// The current delivery of every lane slot, by (lane partition, lane offset).
    inflight: BTreeMap<(Partition, Offset), Held>,
    replay: HashMap<(Epoch, u64, Offset), ReplaySlot>,
}

#[derive(Clone, Debug)]
struct Issued {
    incarnation: u32,
    group: GroupName,
    origin: Partition,
    offset: Offset,
}

/// Offsets one persist made durably done in one lane: (group, partition, drop generation,
/// intervals).
type NewlyDone = (GroupName, Partition, u32, Vec<(Offset, Offset)>);

/// What one emitted persist carried, to judge it when the store applies it.
#[derive(Clone, Debug)]
struct Emitted {
    /// (group, partition, generation, drop generation) of every checkpoint.
    lanes: Vec<(GroupName, Partition, u32, u32)>,
    /// Offsets newly made durable, recorded at apply, for C6 once the mesh is told.
    newly_done: Vec<NewlyDone>,
}

/// The contract checker. See the module documentation.
#[derive(Debug)]
pub struct Checker {
    now: Millis,
    alive: bool,
    epoch: Epoch,
    incarnation: u32,
    durable_epoch: Epoch,
    max_ack_timeout_ms: Millis,
    logs: BTreeMap<(TopicName, Partition), Log>,
    groups: BTreeMap<GroupName, GroupState>,
    issued: HashMap<DeliveryId, Issued>,
    dlq: BTreeSet<DlqKey>,
    emitted: BTreeMap<(u32, Ticket), Emitted>,
    pub stats: CheckerStats,
}

fn bit(gen: u32) -> u64 {
    1u64 << (gen % 64)
}

/// Offsets done in `new` and not in `old`, as half-open intervals.
fn newly_done(old: &Progress, new: &Progress) -> Vec<(Offset, Offset)> {
    let intervals = |p: &Progress| {
        let mut v = Vec::with_capacity(p.range_count() + 1);
        if p.watermark() > 0 {
            v.push((0, p.watermark()));
        }
        v.extend(p.ranges());
        v
    };
    let old_iv = intervals(old);
    let mut out = Vec::new();
    for (mut a, b) in intervals(new) {
        for &(s, e) in &old_iv {
            if e <= a {
                continue;
            }
            if s >= b {
                break;
            }
            if s > a {
                out.push((a, s));
            }
            a = a.max(e);
            if a >= b {
                break;
            }
        }
        if a < b {
            out.push((a, b));
        }
    }
    out
}

impl Default for Checker {
    fn default() -> Self {
        Self::new(unimesh_core::SubscriptionLimits::default().max_ack_timeout_ms)
    }
}

impl Checker {
    /// `max_ack_timeout_ms` is the mesh's limit on extensions (to know their deadlines).
    pub fn new(max_ack_timeout_ms: Millis) -> Self {
        Self {
            now: 0,
            alive: false,
            epoch: 0,
            incarnation: 0,
            durable_epoch: 0,
            max_ack_timeout_ms,
            logs: BTreeMap::new(),
            groups: BTreeMap::new(),
            issued: HashMap::new(),
            dlq: BTreeSet::new(),
            emitted: BTreeMap::new(),
            stats: CheckerStats::default(),
        }
    }

    fn tick(&mut self, now: Millis) {
        // The mesh treats a time below an earlier one as the earlier one; so do we.
        self.now = self.now.max(now);
    }

    // ----- the world -----

    /// A group exists with this definition (the checker's scope for it starts here).
    pub fn add_group(&mut self, spec: &SubscriptionSpec) {
        let start = match &spec.start_from {
            StartFrom::Earliest => BTreeMap::new(),
            StartFrom::Latest(ends) => ends.clone(),
        };
        self.groups.insert(
            spec.group.clone(),
            GroupState {
                topic: spec.topic.clone(),
                filter: spec.filter.clone(),
                ordering: spec.ordering,
                max_attempts: spec.max_attempts,
                ack_timeout_ms: spec.ack_timeout_ms,
                max_in_flight: spec.max_in_flight_per_client,
                start,
                lanes: BTreeMap::new(),
                credit: BTreeMap::new(),
                inflight: BTreeMap::new(),
                replay: HashMap::new(),
            },
        );
    }

    /// The broker acknowledged `record` to its publisher at `(topic, partition, offset)`.
    pub fn published(&mut self, topic: &TopicName, partition: Partition, record: &Record) -> Check {
        let log = self.logs.entry((topic.clone(), partition)).or_default();
        if record.offset != log.recs.len() as Offset {
            return fail(
                Clause::C9,
                format!(
                    "{topic}/{partition}: broker acknowledged offset {} but its log ends at {}",
                    record.offset,
                    log.recs.len()
                ),
            );
        }
        log.recs.push(PubRec {
            meta: record.meta.clone(),
            handle: record.broker_handle.is_some(),
        });
        Ok(())
    }

    /// A publisher got an answer. C9: success only for a write the broker acknowledged.
    pub fn publish_answered(
        &mut self,
        topic: &TopicName,
        ok: bool,
        acknowledged_at: Option<(Partition, Offset)>,
    ) -> Check {
        if !ok {
            return Ok(());
        }
        match acknowledged_at {
            Some((p, o))
                if self
                    .logs
                    .get(&(topic.clone(), p))
                    .is_some_and(|l| (o as usize) < l.recs.len()) =>
            {
                Ok(())
            }
            _ => fail(
                Clause::C9,
                format!("{topic}: publish answered OK without a broker acknowledgement"),
            ),
        }
    }

    /// Retention deleted everything below `earliest`.
    pub fn retention(&mut self, topic: &TopicName, partition: Partition, earliest: Offset) {
        let log = self.logs.entry((topic.clone(), partition)).or_default();
        log.earliest = log.earliest.max(earliest);
    }

    fn matches(&self, g: &GroupState, p: Partition, o: Offset) -> Option<bool> {
        let log = self.logs.get(&(g.topic.clone(), p))?;
        let r = log.recs.get(o as usize)?;
        Some(match &r.meta {
            RecordMeta::Event(m) => g.filter.matches(m),
            RecordMeta::Undecodable(_) => true,
        })
    }

    // ----- incarnations -----

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

    fn lane_mut(&mut self, group: &GroupName, p: Partition) -> Option<&mut LaneState> {
        Some(self.groups.get_mut(group)?.lanes.entry(p).or_default())
    }

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

    // ----- clients -----

    /// A client asked for `max` deliveries (absolute). `accepted`: the mesh took the poll.
    pub fn client_poll(&mut self, group: &GroupName, client: &ClientId, max: u32, accepted: bool) {
        if let Some(g) = self.groups.get_mut(group) {
            if accepted {
                g.credit.insert(client.clone(), max);
            }
        }
    }

    pub fn client_gone(&mut self, now: Millis, group: &GroupName, client: &ClientId) {
        self.tick(now);
        if let Some(g) = self.groups.get_mut(group) {
            g.credit.remove(client);
            g.inflight.retain(|_, h| h.client != *client);
        }
    }

    /// The mesh handed `delivery` to `client`.
    pub fn delivered(
        &mut self,
        now: Millis,
        group: &GroupName,
        client: &ClientId,
        d: &Delivery,
    ) -> Check {
        self.tick(now);
        let now = self.now;
        self.stats.deliveries += 1;
        let id = d.id;
        let at = format!("{group} {id} to {client}");
        if !self.alive {
            return fail(
                Clause::C4,
                format!("{at}: delivery while no incarnation is alive"),
            );
        }
        // C4: ids carry this incarnation's epoch, which is durable first, and never repeat.
        if id.epoch != self.epoch {
            return fail(
                Clause::C4,
                format!(
                    "{at}: id carries epoch {} in incarnation of epoch {}",
                    id.epoch, self.epoch
                ),
            );
        }
        if self.durable_epoch < self.epoch {
            return fail(
                Clause::C4,
                format!("{at}: delivered before epoch {} was durable", self.epoch),
            );
        }
        if let Some(prev) = self.issued.get(&id) {
            return fail(
                Clause::C4,
                format!(
                    "{at}: delivery id already issued (incarnation {}, now {})",
                    prev.incarnation, self.incarnation
                ),
            );
        }
        if id.attempt != d.attempt {
            return fail(
                Clause::C5,
                format!("{at}: attempt {} != id attempt", d.attempt),
            );
        }
        let (origin, o) = (d.partition, d.record.offset);
        let Some(g) = self.groups.get(group) else {
            return fail(Clause::C7, format!("{at}: delivery for an unknown group"));
        };
        if d.topic != g.topic {
            return fail(
                Clause::C7,
                format!("{at}: topic {} is not the group's", d.topic),
            );
        }
        // The record is the broker's record at that position.
        let Some(log) = self.logs.get(&(g.topic.clone(), origin)) else {
            return fail(Clause::C1, format!("{at}: no such partition {origin}"));
        };
        let same = log
            .recs
            .get(o as usize)
            .is_some_and(|r| match (&r.meta, &d.record.meta) {
                (RecordMeta::Event(a), RecordMeta::Event(b)) => a.id == b.id,
                _ => false,
            });
        if !same {
            return fail(
                Clause::C1,
                format!("{at}: record {origin}/{o} is not the broker's record there"),
            );
        }
        if self.matches(g, origin, o) != Some(true) {
            return fail(
                Clause::C7,
                format!("{at}: record {origin}/{o} does not match the group's filter"),
            );
        }
        let max_attempts = g.max_attempts;
        let ack_timeout = g.ack_timeout_ms;
        let max_in_flight = g.max_in_flight;
        let ordering = g.ordering;
        let key = d.record.partition_key().map(str::to_owned);
        let g = self.groups.get_mut(group).ok_or_else(|| Violation {
            clause: Clause::C7,
            message: format!("{at}: group vanished"),
        })?;
        // C8: credit and the in-flight bound.
        let credit = g.credit.get(client).copied().unwrap_or(0);
        if credit == 0 {
            return fail(Clause::C8, format!("{at}: client had no credit left"));
        }
        g.credit.insert(client.clone(), credit - 1);
        let slot = (id.partition, id.offset);
        let held = g
            .inflight
            .iter()
            .filter(|(k, h)| h.client == *client && h.deadline > now && **k != slot)
            .count() as u32;
        if held >= max_in_flight {
            return fail(
                Clause::C8,
                format!("{at}: client already holds {held} of at most {max_in_flight}"),
            );
        }
        if d.attempt == 0 || d.attempt > max_attempts {
            return fail(
                Clause::C5,
                format!("{at}: attempt {} outside 1..={max_attempts}", d.attempt),
            );
        }
        if id.partition == REPLAY_PARTITION {
            let s = g.replay.entry((id.epoch, id.lease, id.offset)).or_default();
            if s.done {
                return fail(
                    Clause::C2,
                    format!("{at}: replayed record delivered after its ACK"),
                );
            }
            if d.attempt != s.attempt + 1 {
                return fail(
                    Clause::C5,
                    format!(
                        "{at}: replay attempt {} after attempt {}",
                        d.attempt, s.attempt
                    ),
                );
            }
            s.attempt = d.attempt;
            let lane = g.lanes.entry(origin).or_default();
            let r = lane.rec(o);
            r.max_attempt_any = r.max_attempt_any.max(d.attempt);
            r.deliveries += 1;
        } else {
            if origin != id.partition || o != id.offset {
                return fail(
                    Clause::C1,
                    format!("{at}: carries record {origin}/{o}, not the id's position"),
                );
            }
            let epoch = self.epoch;
            let lane = g.lanes.entry(id.partition).or_default();
            if !lane.assigned {
                return fail(
                    Clause::C7,
                    format!("{at}: delivery from a partition the group does not own (#5360)"),
                );
            }
            if id.lease < lane.revoked_below {
                return fail(Clause::C4, format!("{at}: delivery under a revoked lease"));
            }
            lane.max_lease = lane.max_lease.max(id.lease);
            // C2: nothing durably done is delivered again (except after an operator seek).
            if !lane.seek_pending && lane.durable_done(o) {
                return fail(
                    Clause::C2,
                    format!("{at}: record is done in the persisted checkpoint"),
                );
            }
            // C5: a redelivery's attempt number is durable before it goes out.
            if d.attempt >= 2 {
                let durable = lane.durable.as_ref().map_or(0, |c| c.attempts_of(o));
                if durable < d.attempt {
                    return fail(
                        Clause::C5,
                        format!(
                            "{at}: attempt {} handed out while the durable ledger says {durable}",
                            d.attempt
                        ),
                    );
                }
            }
            // Key order: within a lease, a key's records go out in offset order.
            if ordering == Ordering::Key {
                if let Some(k) = &key {
                    if let Some(&(lease, last)) = lane.key_last.get(k) {
                        if lease == id.lease && o < last {
                            return fail(
                                Clause::C7,
                                format!("{at}: key {k} delivered {o} after {last}"),
                            );
                        }
                    }
                    lane.key_last.insert(k.clone(), (id.lease, o));
                }
            }
            let resets = lane.resets;
            let r = lane.rec(o);
            if r.done_in == Some((epoch, id.lease)) {
                return fail(
                    Clause::C2,
                    format!("{at}: record was already ACKed in this lane"),
                );
            }
            if d.attempt == 1 {
                if r.first_count > 0 {
                    if r.had_ge2 {
                        return fail(
                            Clause::C5,
                            format!(
                                "{at}: first attempt again after attempt {} was delivered",
                                r.max_attempt
                            ),
                        );
                    }
                    if resets <= r.first_reset {
                        return fail(
                            Clause::C2,
                            format!("{at}: first attempt repeated without a crash or rebalance"),
                        );
                    }
                    self.stats.repeated_first_attempts += 1;
                } else {
                    self.stats.first_deliveries += 1;
                }
                r.first_count += 1;
                r.first_reset = resets;
            } else if d.attempt <= r.max_attempt {
                return fail(
                    Clause::C5,
                    format!(
                        "{at}: attempt {} does not exceed attempt {} delivered before",
                        d.attempt, r.max_attempt
                    ),
                );
            } else {
                r.had_ge2 = true;
            }
            r.max_attempt = r.max_attempt.max(d.attempt);
            r.max_attempt_any = r.max_attempt_any.max(d.attempt);
            r.deliveries += 1;
            if ordering == Ordering::Key {
                if let Some(k) = &key {
                    let clash = g.inflight.iter().find(|(&(lp, lo), h)| {
                        lp == id.partition
                            && lo != o
                            && h.deadline > now
                            && h.key.as_ref() == Some(k)
                    });
                    if let Some((&(_, other), _)) = clash {
                        return fail(
                            Clause::C7,
                            format!("{at}: key {k} is also in flight at offset {other}"),
                        );
                    }
                }
            }
        }
        g.inflight.insert(
            slot,
            Held {
                id,
                client: client.clone(),
                deadline: now + ack_timeout,
                key,
            },
        );
        self.issued.insert(
            id,
            Issued {
                incarnation: self.incarnation,
                group: group.clone(),
                origin,
                offset: o,
            },
        );
        Ok(())
    }

    /// A client settled `ids`; `response` is the mesh's answer.
    pub fn settled(
        &mut self,
        now: Millis,
        group: &GroupName,
        kind: SettleKind,
        ids: &[DeliveryId],
        response: &Response,
    ) -> Check {
        self.tick(now);
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
        let now = self.now;
        let at = format!("{group} {kind:?} {id} -> {outcome:?}");
        let rejected = |reason: RejectReason| outcome == Settle::Rejected(reason);
        if matches!(outcome, Settle::Rejected(_)) {
            self.stats.settles_rejected += 1;
        }
        // C4: ids of a former epoch are stale.
        if id.epoch < self.epoch {
            if !rejected(RejectReason::Stale) {
                return fail(
                    Clause::C4,
                    format!("{at}: id of a former epoch not refused as stale"),
                );
            }
            self.stats.stale_rejected += 1;
            return Ok(());
        }
        let issued = self.issued.get(id).cloned();
        let Some(issued) = issued.filter(|i| i.group == *group) else {
            if outcome == Settle::Accepted {
                return fail(
                    Clause::C4,
                    format!("{at}: accepted an id that was never issued"),
                );
            }
            return Ok(());
        };
        if issued.incarnation != self.incarnation {
            return fail(
                Clause::C4,
                format!(
                    "{at}: id issued by incarnation {} answered by incarnation {} (must be stale)",
                    issued.incarnation, self.incarnation
                ),
            );
        }
        let epoch = self.epoch;
        let Some(g) = self.groups.get_mut(group) else {
            return Ok(());
        };
        let slot = (id.partition, id.offset);
        let current = g
            .inflight
            .get(&slot)
            .is_some_and(|h| h.id == *id && h.deadline > now);
        if id.partition == REPLAY_PARTITION {
            let s = g.replay.entry((id.epoch, id.lease, id.offset)).or_default();
            if s.done && outcome == Settle::Accepted {
                return fail(Clause::C4, format!("{at}: replayed record settled twice"));
            }
        } else {
            let lane = g.lanes.entry(id.partition).or_default();
            if id.lease < lane.revoked_below {
                if !rejected(RejectReason::Revoked) {
                    return fail(
                        Clause::C4,
                        format!("{at}: id of a revoked lane not refused as revoked"),
                    );
                }
                return Ok(());
            }
            let r = lane.rec(id.offset);
            if r.done_in == Some((epoch, id.lease)) && !rejected(RejectReason::AlreadyDone) {
                return fail(
                    Clause::C4,
                    format!("{at}: record already ACKed, not refused as done"),
                );
            }
        }
        match (kind, outcome) {
            (SettleKind::Ack, Settle::Accepted) => {
                self.stats.acks_accepted += 1;
                if !current {
                    self.stats.late_acks_accepted += 1;
                }
                g.inflight.remove(&slot);
                if id.partition == REPLAY_PARTITION {
                    if let Some(s) = g.replay.get_mut(&(id.epoch, id.lease, id.offset)) {
                        s.done = true;
                    }
                    // A client ACKed the record itself: that justifies it being done in the
                    // lane's current generation too (a resolution may delete its DLQ entry
                    // in the same batch that marks a later dead-lettering done).
                    let lane = g.lanes.entry(issued.origin).or_default();
                    let gen = lane.gen;
                    let r = lane.rec(issued.offset);
                    r.acked_any = true;
                    r.acked_mask |= bit(gen);
                } else {
                    let lane = g.lanes.entry(id.partition).or_default();
                    let gen = lane.gen;
                    let r = lane.rec(id.offset);
                    r.acked_mask |= bit(gen);
                    r.acked_any = true;
                    r.first_ack_gen.get_or_insert(gen);
                    r.done_in = Some((epoch, id.lease));
                }
            }
            (SettleKind::Nack(_), Settle::Accepted) | (SettleKind::Extend(_), Settle::Accepted) => {
                if !current {
                    return fail(
                        Clause::C4,
                        format!("{at}: only the current delivery may be NACKed or extended"),
                    );
                }
                if matches!(kind, SettleKind::Nack(_)) {
                    g.inflight.remove(&slot);
                } else if let (SettleKind::Extend(by), Some(h)) = (kind, g.inflight.get_mut(&slot))
                {
                    h.deadline = now + by.unwrap_or(g.ack_timeout_ms).min(self.max_ack_timeout_ms);
                }
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

    // ----- durability -----

    /// The mesh asked for `batch` to be persisted (before the store applies it).
    pub fn persist_emitted(&mut self, ticket: Ticket, batch: &PersistBatch) -> Check {
        if let Some(e) = batch.epoch {
            if e != self.epoch {
                return fail(
                    Clause::C4,
                    format!(
                        "persist {ticket} writes epoch {e}, incarnation has {}",
                        self.epoch
                    ),
                );
            }
        }
        let mut lanes = Vec::with_capacity(batch.checkpoints.len());
        for c in &batch.checkpoints {
            if let Some(lane) = self.lane_mut(&c.group, c.partition) {
                lanes.push((c.group.clone(), c.partition, lane.gen, lane.drop_gen));
            }
        }
        self.emitted.insert(
            (self.incarnation, ticket),
            Emitted {
                lanes,
                newly_done: Vec::new(),
            },
        );
        Ok(())
    }

    /// The store made `batch` durable (whether or not the mesh hears of it).
    pub fn persist_applied(&mut self, ticket: Ticket, batch: &PersistBatch) -> Check {
        self.stats.persists_applied += 1;
        let key = (self.incarnation, ticket);
        let Some(mut em) = self.emitted.remove(&key) else {
            return fail(
                Clause::C3,
                format!("persist {ticket} applied but never emitted by this incarnation"),
            );
        };
        for name in &batch.removed_groups {
            self.groups.remove(name);
            self.dlq.retain(|k| k.group != *name);
        }
        for d in &batch.dead_letters {
            self.stats.dead_letters += 1;
            let Some(g) = self.groups.get(&d.key.group) else {
                continue;
            };
            let max_attempts = g.max_attempts;
            let undecodable = matches!(d.record.meta, RecordMeta::Undecodable(_));
            let Some(lane) = g.lanes.get(&d.key.partition) else {
                return fail(
                    Clause::C5,
                    format!("dead letter {:?} for a lane never seen", d.key),
                );
            };
            let r = lane
                .recs
                .get(d.key.offset as usize)
                .cloned()
                .unwrap_or_default();
            // C5: dead-lettered only when its last allowed attempt failed, or a durable
            // ledger said the attempts ran out, or it cannot be decoded.
            if !undecodable && r.max_attempt_any < max_attempts && r.ledger_max < max_attempts {
                return fail(
                    Clause::C5,
                    format!(
                        "dead letter {:?} after attempt {} (ledger {}) of {max_attempts}",
                        d.key, r.max_attempt_any, r.ledger_max
                    ),
                );
            }
            self.dlq.insert(d.key.clone());
        }
        for k in &batch.dlq_resolved {
            self.dlq.remove(k);
        }
        for (c, (gname, p, gen, drop_gen)) in batch.checkpoints.iter().zip(em.lanes.iter()) {
            let Some(g) = self.groups.get(&c.group) else {
                continue;
            };
            let start = g.start.get(&c.partition).copied().unwrap_or(0);
            let log = self.logs.get(&(g.topic.clone(), c.partition));
            let log_len = log.map_or(0, |l| l.recs.len() as Offset);
            let dlq = &self.dlq;
            let Some(g) = self.groups.get_mut(&c.group) else {
                continue;
            };
            let (filter, lanes) = (&g.filter, &mut g.lanes);
            let filtered_out = |o: Offset| {
                log.and_then(|l| l.recs.get(o as usize))
                    .is_some_and(|r| match &r.meta {
                        RecordMeta::Event(m) => !filter.matches(m),
                        RecordMeta::Undecodable(_) => false,
                    })
            };
            let lane = lanes.entry(c.partition).or_default();
            let old = lane
                .durable
                .as_ref()
                .map(|d| d.progress.clone())
                .unwrap_or_else(|| Progress::new(start));
            let fresh = newly_done(&old, &c.checkpoint.progress);
            let rewound_ok = *gen > lane.applied_gen
                && lane
                    .seek_gens
                    .range(lane.applied_gen + 1..=*gen)
                    .next()
                    .is_some();
            // C3: the durable watermark never goes back except by an operator seek.
            if c.checkpoint.progress.watermark() < old.watermark() && !rewound_ok {
                return fail(
                    Clause::C3,
                    format!(
                        "{gname}/{p}: durable watermark went back {} -> {}",
                        old.watermark(),
                        c.checkpoint.progress.watermark()
                    ),
                );
            }
            // C1: every newly durable done offset was ACKed, dead-lettered, filtered out,
            // skipped by retention (reported) or passed over by a seek — in that generation.
            let b = bit(*gen);
            for &(a, e) in &fresh {
                if e > log_len {
                    return fail(
                        Clause::C1,
                        format!("{gname}/{p}: offsets up to {e} marked done but the log ends at {log_len}"),
                    );
                }
                for o in a..e {
                    if o < start {
                        continue;
                    }
                    let r = lane.rec(o);
                    let ok = r.acked_mask & b != 0
                        || r.op_mask & b != 0
                        || dlq.contains(&DlqKey {
                            group: c.group.clone(),
                            partition: c.partition,
                            offset: o,
                        });
                    if !ok && !filtered_out(o) && !lane.is_skipped(o) {
                        return fail(
                            Clause::C1,
                            format!(
                                "{gname}/{p}: offset {o} made durable as done (watermark {}, generation {gen}) but never ACKed or dead-lettered",
                                c.checkpoint.progress.watermark()
                            ),
                        );
                    }
                }
            }
            for &(o, n) in &c.checkpoint.attempts {
                let r = lane.rec(o);
                r.ledger_max = r.ledger_max.max(n);
            }
            if *gen >= lane.seek_gen {
                lane.seek_pending = false;
            }
            lane.applied_gen = lane.applied_gen.max(*gen);
            lane.durable = Some(c.checkpoint.clone());
            if *drop_gen == lane.drop_gen {
                em.newly_done
                    .push((c.group.clone(), c.partition, *drop_gen, fresh));
            }
        }
        if let Some(e) = batch.epoch {
            self.durable_epoch = self.durable_epoch.max(e);
        }
        self.emitted.insert(key, em);
        Ok(())
    }

    /// The mesh was told `Persisted{ticket}`: the broker ACKs it promised are now due (C6).
    pub fn persist_notified(&mut self, ticket: Ticket) {
        let Some(em) = self.emitted.remove(&(self.incarnation, ticket)) else {
            return;
        };
        for (gname, p, drop_gen, fresh) in em.newly_done {
            let Some(g) = self.groups.get_mut(&gname) else {
                continue;
            };
            let Some(log) = self.logs.get(&(g.topic.clone(), p)) else {
                continue;
            };
            let Some(lane) = g.lanes.get_mut(&p) else {
                continue;
            };
            if lane.drop_gen != drop_gen {
                continue;
            }
            for (a, e) in fresh {
                for o in a..e {
                    let handle = log.recs.get(o as usize).is_some_and(|r| r.handle);
                    if handle && !lane.is_skipped(o) {
                        let r = lane.rec(o);
                        if r.op_mask == 0 {
                            r.broker_ack_due = true;
                        }
                    }
                }
            }
        }
    }

    /// The store refused `ticket`: nothing in it counts.
    pub fn persist_failed(&mut self, ticket: Ticket) {
        self.emitted.remove(&(self.incarnation, ticket));
    }

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

    // ----- quiescence -----

    /// After faults stopped and the run converged: liveness (C1, C5 exactly-once, C6).
    pub fn check_quiescent(&self) -> Check {
        for (gname, g) in &self.groups {
            for ((topic, p), log) in &self.logs {
                if *topic != g.topic {
                    continue;
                }
                let start = g.start.get(p).copied().unwrap_or(0);
                let lane = g.lanes.get(p);
                let end = log.recs.len() as Offset;
                let wm = lane
                    .and_then(|l| l.durable.as_ref())
                    .map(|c| c.progress.watermark());
                if start < end && wm != Some(end) {
                    return fail(
                        Clause::C1,
                        format!(
                            "{gname}/{p}: durable watermark {wm:?} never reached the log end {end}"
                        ),
                    );
                }
                for o in start..end {
                    if self.matches(g, *p, o) != Some(true) {
                        continue;
                    }
                    let r = lane.and_then(|l| l.recs.get(o as usize));
                    let dlq = self.dlq.contains(&DlqKey {
                        group: gname.clone(),
                        partition: *p,
                        offset: o,
                    });
                    let skipped = lane.is_some_and(|l| l.is_skipped(o));
                    let acked = r.is_some_and(|r| r.acked_any || r.op_mask != 0);
                    if !(acked || dlq || skipped) {
                        return fail(
                            Clause::C1,
                            format!("{gname}/{p}/{o}: never ACKed nor dead-lettered"),
                        );
                    }
                    if let Some(r) = r {
                        if r.broker_ack_due && !r.broker_acked {
                            return fail(
                                Clause::C6,
                                format!("{gname}/{p}/{o}: durably done but never ACKed to the POP broker"),
                            );
                        }
                        // Duplicates: one first attempt per reset the record went through.
                        let resets = lane.map_or(0, |l| l.resets);
                        if r.first_count > resets + 1 {
                            return fail(
                                Clause::C2,
                                format!("{gname}/{p}/{o}: first attempt delivered {} times over {resets} resets", r.first_count),
                            );
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether every lane of every group is durably done up to the log end, with no seek
    /// whose own checkpoint is not durable yet.
    pub fn converged(&self) -> bool {
        self.groups.values().all(|g| {
            if g.lanes.values().any(|l| l.seek_pending) {
                return false;
            }
            self.logs.iter().all(|((topic, p), log)| {
                if *topic != g.topic {
                    return true;
                }
                let start = g.start.get(p).copied().unwrap_or(0);
                let end = log.recs.len() as Offset;
                start >= end
                    || g.lanes
                        .get(p)
                        .and_then(|l| l.durable.as_ref())
                        .is_some_and(|c| c.progress.watermark() == end)
            })
        })
    }

    /// Whether the lane has a durable checkpoint (its start position is pinned).
    pub fn is_pinned(&self, group: &GroupName, p: Partition) -> bool {
        self.groups
            .get(group)
            .and_then(|g| g.lanes.get(&p))
            .is_some_and(|l| l.durable.is_some())
    }

    /// The durable watermark of a lane, for diagnostics.
    pub fn durable_watermark(&self, group: &GroupName, p: Partition) -> Option<Offset> {
        self.groups
            .get(group)
            .and_then(|g| g.lanes.get(&p))
            .and_then(|l| l.durable.as_ref())
            .map(|c| c.progress.watermark())
    }

    /// Most first attempts of one record, over all groups (a figure for reports).
    pub fn max_first_attempts(&self) -> u32 {
        self.groups
            .values()
            .flat_map(|g| g.lanes.values())
            .flat_map(|l| l.recs.iter())
            .map(|r| r.first_count)
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(wm: Offset, ranges: &[(Offset, Offset)]) -> Progress {
        Progress::from_parts(wm, ranges.iter().copied()).unwrap()
    }

    #[test]
    fn newly_done_subtracts_what_was_done() {
        assert_eq!(newly_done(&p(0, &[]), &p(3, &[])), vec![(0, 3)]);
        assert_eq!(
            newly_done(&p(2, &[(5, 7)]), &p(3, &[(4, 9)])),
            vec![(2, 3), (4, 5), (7, 9)]
        );
        assert_eq!(newly_done(&p(10, &[]), &p(4, &[])), vec![]);
        assert_eq!(
            newly_done(&p(2, &[(4, 6)]), &p(8, &[])),
            vec![(2, 4), (6, 8)]
        );
    }
}
