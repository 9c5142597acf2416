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
//! - `state`: the mirror (logs, groups, lanes, records, deliveries, emitted persists);
//! - `world`: groups, the broker's log (C9), retention;
//! - `generations`: incarnations (C4), assignment, revocation, seeks;
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
//!   offset order from offset 0 (C9 fails on a gap).
//!   [`Checker::publish_answered`]: when the publisher got its answer.
//! - [`Checker::retention`]: when the broker deleted a prefix, with the new earliest.
//!
//! Incarnations and ownership:
//! - [`Checker::started`]: once the mesh recovered, with the epoch it uses, before its first
//!   effect (the persist of that epoch); at most one incarnation is alive at a time.
//! - [`Checker::crashed`]: when the process dies. A batch the store made durable without
//!   the mesh hearing of it goes to [`Checker::persist_applied`] *before* this call.
//! - [`Checker::assigned`]: when the mesh accepted a partition (at start and on
//!   reassignment), before its effects. [`Checker::revoked`]: right after the revocation
//!   was fed, before its effects.
//! - [`Checker::sought`]: when the mesh accepted an operator seek, before its effects.
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
//! The store, keyed by ticket within the live incarnation:
//! - [`Checker::persist_applied`]: when a batch is durable (also when the process dies
//!   before hearing so), then [`Checker::persist_notified`] right before the mesh is told
//!   `Persisted` — not at all if it never is;
//! - [`Checker::persist_failed`]: when the store refused a batch, before the mesh is told.
//!
//! At the end: [`Checker::converged`] says whether the durable state is complete (a harness
//! also asks the mesh that its lanes are idle), then [`Checker::check_quiescent`] once,
//! after faults stopped. [`Checker::is_pinned`], [`Checker::durable_watermark`],
//! [`Checker::max_first_attempts`] and [`Checker::stats`] are read-only figures.
//!
//! A harness of the real shell that cannot see `Persist` batches directly can feed the
//! same hooks from a storage port that reports what it wrote.
//!
//! # Scope: one mesh at a time
//! The checker follows one line of incarnations over one broker: one alive at a time, each
//! with the next durable epoch, persists keyed by (incarnation, ticket). Several instances
//! sharing a broker (issue 9) need those per instance; the record-level mirror (`state`)
//! is already per group and lane, not per instance.
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

use unimesh_core::{DeliveryId, DlqKey, Epoch, GroupName, Millis, Partition, Ticket, TopicName};

mod broker;
mod delivery;
mod generations;
mod persist;
mod quiescence;
mod settle;
mod state;
mod update;
mod world;

use state::{Emitted, GroupState, Issued, Log};

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
}
