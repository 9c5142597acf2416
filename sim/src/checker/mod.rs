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
//! # Layout
//! One file per clause family, each an `impl Checker` block over the mirror in `state`:
//! - `state`: the mirror (logs, groups, lanes and their owners, records, deliveries,
//!   emitted persists, instances);
//! - `world`: groups, the broker's log (C9), holes, compaction, retention, truncation;
//! - `filter`: the checker's own reading of a subscription filter;
//! - `generations`: instances and incarnations (C4), assignment, expiry, revocation, seeks,
//!   fetch answers;
//! - `delivery`: deliveries and client credit (C1, C2, C4, C5, C7, C8);
//! - `settle`: answers to ACK, NACK and extend (C4);
//! - `persist`: persists emitted, applied, notified, failed (C1, C3, C4, C5);
//! - `broker`: commits (C3), POP broker ACKs (C6), skips (C1);
//! - `quiescence`: liveness at the end (C1, C2, C6) and queries of the durable state.
//! - `update`: new settings of an existing group (ACK timeout, in-flight bound).
//!
//! # Driving it from another harness
//! Every hook that takes `now` wants the mesh's own notion of time — what its deadlines
//! are computed from (the core's `Mesh::now()`, the engine's clock in the shell), not the
//! harness's wall clock; a `now` below an earlier one counts as the earlier one. Every hook
//! that returns a [`Check`] fails with the first [`Violation`]; after one, the checker's
//! state is unspecified (stop the run). "Before its effects" below means: after the mesh
//! answered the input and before the effects that input produced are reported (so a
//! delivery finds the credit of the poll that caused it). Hooks in the order things happen:
//!
//! The world, which the checker must see whole and in order:
//! - [`Checker::add_group`]: once per group, before any record of the group is delivered,
//!   with the spec the mesh was given (`StartFrom::Latest` holding the end offsets the
//!   group starts from). [`Checker::update_group`]: when the mesh accepted new settings
//!   for it (ACK timeout, in-flight bound; see `update`).
//! - [`Checker::published`]: every record the broker acknowledged, each partition in
//!   offset order from offset 0 (C9 fails on a gap not announced by [`Checker::holes`]).
//!   [`Checker::publish_answered`]: when the publisher got its answer.
//! - [`Checker::retention`]: when the broker deleted a prefix, with the new earliest.
//! - [`Checker::holes`], [`Checker::compacted`], [`Checker::truncated`]: see "The world of
//!   a Kafka-protocol broker" below.
//!
//! Incarnations and ownership:
//! - [`Checker::started`]: once the mesh recovered, with the epoch it uses, before its first
//!   effect (the persist of that epoch); at most one incarnation per instance is alive.
//! - [`Checker::crashed`]: when the process dies. A batch the store made durable without
//!   the mesh hearing of it goes to [`Checker::persist_applied`] *before* this call.
//! - [`Checker::assigned`]: when the mesh accepted a partition (at start and on
//!   reassignment), before its effects. [`Checker::revoked`]: right after the revocation
//!   was fed, before its effects.
//! - [`Checker::sought`]: when the mesh accepted an operator seek, before its effects.
//! - [`Checker::expired`]: when the coordinator dropped the (running) instance.
//! - [`Checker::fetch_answered`]: after the effects of a fetch answer the mesh took.
//!
//!   Before feeding a revocation or a seek, fire the mesh's due timers and report their
//!   effects: the core fires due timers at the start of every `handle`, and a flush they
//!   trigger carries the lane as it was before (it must not be judged as the new lane's).
//!
//! Clients:
//! - [`Checker::client_poll`]: after the mesh answered a poll, with the absolute credit
//!   asked for and whether the poll was taken, before its effects.
//! - [`Checker::client_gone`]: after the mesh was told a client left, before its effects.
//! - [`Checker::settled`]: after the mesh answered an ACK, NACK or extend, with the ids in
//!   the order sent and the whole [`unimesh_core::Response`], before its effects.
//!
//! Effects, each as the mesh emits it, in order:
//! - [`Checker::delivered`]: every `Deliver` (also one a client never receives).
//! - [`Checker::persist_emitted`]: every `Persist`, before the store may apply it.
//! - [`Checker::committed`]: every `Commit`.
//! - [`Checker::broker_acked`]: every `BrokerAck` of a lane, with the partition and offset
//!   the handle names; [`Checker::replay_broker_acked`]: one from the replay lane
//!   (`REPLAY_PARTITION`).
//! - [`Checker::skipped`]: every `Skipped`.
//!
//! The store, keyed by ticket within the live incarnation (a store may answer late, out of
//! order or twice: the hooks follow what the store *did*, in ticket order; a repeated
//! answer is not reported again):
//! - [`Checker::persist_applied`]: when a batch is durable (also when the process dies
//!   before hearing so), then [`Checker::persist_notified`] right before the mesh is told
//!   `Persisted` — not at all if it never is;
//! - [`Checker::persist_failed`]: when the store refused a batch (also when it fenced a
//!   zombie's), before the mesh is told.
//!
//! At the end: [`Checker::converged`] says whether the durable state is complete (a harness
//! also asks the mesh that its lanes are idle), then [`Checker::check_quiescent`] once,
//! after faults stopped. [`Checker::is_pinned`], [`Checker::durable_watermark`],
//! [`Checker::max_first_attempts`] and [`Checker::stats`] are read-only figures.
//!
//! A harness of the real shell that cannot see `Persist` batches directly can feed the
//! same hooks from a storage port that reports what it wrote.
//!
//! A store that fences at read (Kafka's progress topic: every owner writes under its
//! ownership generation, and a reader takes the highest) holds what a replaced owner wrote
//! too, below its successor's records. Such a store reports a batch with
//! [`Checker::persist_applied_outranked`] (the checkpoints no reader takes are not
//! applied), a checkpoint a reader took before the rest of its batch was durable with
//! [`Checker::persist_lane_applied`], and every assignment's resume point, before
//! [`Checker::assigned`], to [`Checker::read_back`]: what is durable on such a store is
//! what readers take — a replaced owner's late checkpoint that no later owner outranked
//! yet is taken (and judged in its writer's generation), one a later owner's durable
//! checkpoint outranks never is (C3).
//!
//! # Several instances (a cluster sharing one broker and one progress store)
//! Every hook about a process — its incarnations, the lanes it owns, its clients, its
//! deliveries, answers and persists — applies to the instance last selected with
//! [`Checker::instance`] (instance 0 until one is selected; a harness of one mesh never
//! calls it). Each instance has its own line of incarnations and epochs (its own local
//! store), its own clock and leases; persists are keyed by (incarnation, ticket), and
//! incarnations are numbered over the whole run. What is durable is the cluster's: one
//! durable checkpoint per (group, partition) (the progress store), one DLQ ledger, and what
//! was done to each record, so C1 and C2 hold for the cluster as a whole, whichever
//! instance delivered or ACKed a record.
//!
//! Ownership follows the group coordinator: [`Checker::assigned`] gives a lane to the
//! selected instance; if another instance still holds it (it was never told), that one is
//! a *zombie* for the lane from then on, as is every lane of an instance the coordinator
//! expired ([`Checker::expired`]). A zombie may keep delivering and accepting ACKs (its
//! records are allowed duplicates; C2 and C5's per-record sequences are not held against
//! it), but nothing it writes may become durable (its persists and commits must be fenced:
//! one applied is a C3 violation) until it is told `PartitionsRevoked` ([`Checker::revoked`]).
//!
//! # The world of a Kafka-protocol broker
//! - [`Checker::holes`]: offsets the broker will never show a consumer (transaction
//!   markers, aborted transactions); the log continues after them (C9 holds across them).
//! - [`Checker::compacted`]: compaction removed the record at an offset.
//!   A lane may mark a hole or a compacted offset done by absence — only one the broker
//!   no longer showed when the checkpoint was emitted — and never needs to deliver it.
//! - [`Checker::truncated`]: the broker lost its tail (an unclean leader election); later
//!   records reuse the offsets. The durable checkpoints are clipped there (what a reader
//!   honouring leader epochs sees), ACKs of lost records justify nothing, and a lane that
//!   had delivered a lost record must report the loss (`Skipped{BrokerTruncated}`) before
//!   its next fetch answer is through (the lane then goes on under a new lease: its
//!   deliveries end, their ids answer `revoked`): [`Checker::fetch_answered`], after the
//!   effects of every fetch answer the mesh took (records or out of range), says the lane
//!   now knows every truncation so far. A checkpoint is clipped at every truncation the
//!   lane that emitted it did not know of; a commit likewise. A lane is done once its
//!   watermark holds every record the broker still shows (`Checker::log_target`): holes
//!   after the last record are never seen, so the watermark need not pass them.
//! - DLQ entries are keyed by coordinates, which a lost tail reuses: the ledger holds one
//!   entry per record at a key (the lost record's and the new record's dead letters both
//!   stay), and a resolution (a replay was ACKed) removes the entry of the record the
//!   resolving instance replayed — as the store must.
//! - Filters are judged by the checker's own model (`filter`), never by the core's.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fmt;

use unimesh_core::{DeliveryId, DlqKey, GroupName, Millis, Partition, Ticket, TopicName};

mod broker;
mod delivery;
mod filter;
mod generations;
mod persist;
mod quiescence;
mod settle;
mod state;
mod update;
mod world;

use state::{Emitted, GroupState, Issued, Log, Node, Unread};

pub use filter::admits;

/// One mesh instance of a cluster (see "Several instances" above).
pub type Instance = u32;

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

/// An observation that breaks the contract: which clause, and what was seen.
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

/// What every checking hook returns: the first violation it saw, if any.
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
    /// Deliveries by an instance whose lane had moved without it knowing (allowed
    /// duplicates).
    pub zombie_deliveries: u64,
    /// Deliveries of records the broker had lost (from a lane that did not know yet).
    pub lost_deliveries: u64,
    /// Losses of the broker's tail a lane reported (`Skipped{BrokerTruncated}`).
    pub truncations_reported: u64,
    /// Offsets made durably done because the broker does not show them (holes, compaction).
    pub done_by_absence: u64,
    /// Late checkpoints of a replaced owner that a reader of a store fencing at read took,
    /// because no later owner had written yet ([`Checker::read_back`]).
    pub adopted_late_writes: u64,
}

/// The contract checker. See the module documentation.
#[derive(Debug)]
pub struct Checker {
    /// The instance the process hooks apply to (see [`Checker::instance`]).
    current: Instance,
    nodes: BTreeMap<Instance, Node>,
    /// Incarnations started so far, over every instance.
    incarnations: u32,
    max_ack_timeout_ms: Millis,
    logs: BTreeMap<(TopicName, Partition), Log>,
    groups: BTreeMap<GroupName, GroupState>,
    issued: HashMap<(Instance, DeliveryId), Issued>,
    /// The DLQ ledger: per key, the serials of the records it holds (a lost tail reuses
    /// coordinates: the lost record's and the new record's may both be there).
    dlq: BTreeMap<DlqKey, BTreeSet<u64>>,
    /// Per key, the serials of every record ever made durable in the DLQ, resolved since or
    /// not: what justifies a checkpoint marking a dead-lettered record done (C1). A
    /// checkpoint written beside its dead letters may be judged only after a replay's ACK
    /// resolved them (a late write, read back later: [`Checker::read_back`]).
    dead_lettered: BTreeMap<DlqKey, BTreeSet<u64>>,
    /// The record each instance last delivered from its replay lane, per DLQ key: what a
    /// resolution of that key by that instance refers to.
    replayed: BTreeMap<(Instance, DlqKey), u64>,
    emitted: BTreeMap<(u32, Ticket), Emitted>,
    /// Per lane, the last checkpoints a store that fences at read holds but no reader may
    /// take (outranked: see [`Checker::persist_applied_outranked`]), to recognise one a
    /// reader resumes from anyway ([`Checker::read_back`]).
    unread: BTreeMap<(GroupName, Partition), VecDeque<Unread>>,
    /// Counts changes of what the broker shows (holes, compaction), for judging gaps.
    world_seq: u64,
    /// Serials handed to published records.
    serials: u64,
    /// Figures gathered so far.
    pub stats: CheckerStats,
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
            current: 0,
            nodes: BTreeMap::new(),
            incarnations: 0,
            max_ack_timeout_ms,
            logs: BTreeMap::new(),
            groups: BTreeMap::new(),
            issued: HashMap::new(),
            dlq: BTreeMap::new(),
            dead_lettered: BTreeMap::new(),
            replayed: BTreeMap::new(),
            emitted: BTreeMap::new(),
            unread: BTreeMap::new(),
            world_seq: 0,
            serials: 0,
            stats: CheckerStats::default(),
        }
    }

    /// Selects the instance the process hooks apply to from now on (instance 0 until
    /// called), and returns the checker for chaining: `checker.instance(1).delivered(..)`.
    pub fn instance(&mut self, instance: Instance) -> &mut Self {
        self.current = instance;
        self
    }

    /// The selected instance's process.
    fn node(&mut self) -> &mut Node {
        self.nodes.entry(self.current).or_default()
    }

    /// The selected instance's time: a `now` below an earlier one counts as the earlier
    /// one (the mesh treats it so).
    fn tick(&mut self, now: Millis) -> Millis {
        let n = self.node();
        n.now = n.now.max(now);
        n.now
    }
}
