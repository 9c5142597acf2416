//! The world outside the mesh node: what survives a kill. It holds the contract checker
//! and feeds it — from the engine's tap (inputs and effects with the mesh's time), from the
//! storage ports (records and batches as they become durable) and from the front (what
//! clients got) — plus the harness's own checks of the shell's effect mapping (`tracker`),
//! the trace, the fault counts and the first violation.
//!
//! Time: the checker wants the mesh's clock, which restarts at 0 with every incarnation.
//! Each incarnation's mesh time is shifted by a base chosen at its start (no earlier than
//! anything the checker saw), so the checker's clock never goes back and, within an
//! incarnation, differs from the mesh's by a constant: deadlines compare exactly.
//!
//! Several mesh nodes (the Kafka group shape): each is an instance of the checker's
//! cluster, with its own front door, clock, incarnations, persists in flight and tracker;
//! what the broker holds, the groups and the checker are shared. Node 0 is the one mesh of
//! the other shapes, whose traces are as they were.
//!
//! Everything here runs on the one simulator thread; the lock is never held across an
//! `await` and no call made under it calls back into the world.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use bytes::Bytes;
use madsim_tokio as tokio;
use tokio::sync::mpsc;
use tokio::time::Instant;
use unimesh_core::{
    ClientId, Delivery, DeliveryId, Effect, Epoch, FetchResult, GroupName, Input, Millis, Offset,
    Partition, PersistBatch, Record, RecordMeta, Response, Settle, SubscriptionSpec, Ticket,
    TopicName,
};
use unimesh_shell::engine::{EngineError, LogPort, PublishResult};
use unimesh_shell::http::push::PUSH_CLIENT;
use unimesh_sim::trace::{Entry, Trace};
use unimesh_sim::{Checker, Clause, SettleKind, Violation};

use crate::counts::Counts;
use crate::node::Job;
use crate::options::Options;
use crate::tracker::Tracker;

/// Whether an assignment a mesh node's mesh accepted (node, group, partition) is one the
/// broker's group coordinator has overtaken since it sent it (see [`World::set_ownership`]).
pub type Overtaken = Box<dyn Fn(usize, &GroupName, Partition) -> bool + Send + Sync>;

/// Which batch checkpoint wrote the record a mesh node resumed a lane from (group,
/// partition, the checkpoint resumed from): mesh node, batch, position (see
/// [`World::set_sources`]).
pub type Sources = Box<
    dyn Fn(
            &GroupName,
            Partition,
            &unimesh_core::Checkpoint,
        ) -> Option<(usize, Arc<PersistBatch>, usize)>
        + Send
        + Sync,
>;

/// The shared world of one run. Cheap to share (`Arc<World>`).
pub struct World {
    pub opts: Options,
    origin: Instant,
    /// The run is over: clients stop.
    done: AtomicBool,
    inner: Mutex<Inner>,
    /// The broker's group coordinator, asked whether an assignment is stale (none: every
    /// assignment comes from the mesh itself).
    overtaken: Mutex<Option<Overtaken>>,
    /// The store that fences at read, asked which record a resume point came from.
    sources: Mutex<Option<Sources>>,
}

struct Inner {
    checker: Checker,
    trace: Trace,
    step: u64,
    failure: Option<Violation>,
    faults_on: bool,
    counts: Counts,
    /// Total of the clock jumps so far (the tracker measures time without them).
    jumped: Duration,
    /// The spec the mesh took when each group was first created (retries send it again).
    specs: BTreeMap<GroupName, SubscriptionSpec>,
    /// Each group's settings as the live mesh has them, and as the store has them (a crash
    /// undoes an update that was not durable yet).
    live_specs: BTreeMap<GroupName, SubscriptionSpec>,
    durable_specs: BTreeMap<GroupName, SubscriptionSpec>,
    /// The event id of every durable record (None: it does not decode), by position.
    ids: BTreeMap<(TopicName, Partition), Vec<Option<String>>>,
    /// The mesh nodes, by instance number.
    nodes: Vec<Node>,
    /// Incarnations over every node.
    incarnations: u32,
    steps: u64,
    /// The broker fences a replaced owner (Kafka): commits are judged when the broker takes
    /// them ([`World::committed`]), not when the mesh issues them; the progress store fences
    /// at read, so each assignment's resume point is judged as read ([`Inner::read_back`]).
    fences_at_broker: bool,
    /// What each webhook target answered for the deliveries it took, until the pusher
    /// settles them: the pusher ACKs only a 2xx and NACKs a 429/503 by its `Retry-After`.
    /// Keyed by node and group too: a delivery id is unique only within one mesh node's
    /// engine (two nodes count epochs and leases alike).
    pushes: BTreeMap<(usize, GroupName, DeliveryId), Answered>,
}

/// What the world knows of one mesh node.
#[derive(Default)]
struct Node {
    clock: Clock,
    /// Batches queued for the persist writer and not yet written, by the address of their
    /// `Arc` (held here, so an address is not reused while its entry exists).
    persisting: BTreeMap<usize, (Ticket, Arc<PersistBatch>)>,
    last_applied: Option<Ticket>,
    tracker: Tracker,
    /// The live incarnation's front door (None while the node is down).
    front: Option<mpsc::UnboundedSender<Job>>,
    /// The live incarnation's log port (what a graceful stop closes first). Weak: the port
    /// holds the world (a strong one was a cycle that kept every run's world, ~1.7 MB per
    /// group seed, after the run: `valgrind --leak-check=full` on a 3-seed sweep).
    log: Option<Weak<dyn LogPort>>,
    incarnations: u32,
    /// The checker's number of the live (or last) incarnation: tickets count again from 1
    /// in each, so a persist is named by both.
    incarnation: u32,
    /// The last batches made durable (address, incarnation, ticket, the batch: held so the
    /// address is not reused), to name the persist a record a reader took came from.
    written: VecDeque<(usize, u32, Ticket, Arc<PersistBatch>)>,
    /// How long the node was paused so far, and since when it is paused now.
    paused_for: Duration,
    paused_since: Option<Instant>,
}

impl Node {
    /// The node's time paused so far.
    fn paused(&self) -> Duration {
        self.paused_for + self.paused_since.map_or(Duration::ZERO, |s| s.elapsed())
    }
}

/// The checker's clock of one node: the mesh's time of its live incarnation plus
/// `base_ms`.
#[derive(Default)]
struct Clock {
    base_ms: Millis,
    last_ms: Millis,
    /// When the live incarnation started (the mesh's time 0).
    started: Option<Instant>,
}

/// What the broker says of the partitions an assignment hands a mesh: per partition,
/// whether the coordinator overtook the assignment, and which batch checkpoint wrote the
/// record it resumes from.
struct Taken {
    stale: Vec<bool>,
    sources: Vec<Option<(usize, Arc<PersistBatch>, usize)>>,
}

/// Batches made durable a node keeps naming ([`Node::written`]).
const WRITTEN_KEPT: usize = 64;

/// How a webhook target answered a request (`webhook`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answered {
    /// Taken, no answer yet (or never: the pusher's timeout ends it).
    Taken,
    Ok,
    /// 429 or 503 with `Retry-After` of this many seconds.
    Deferred(u64),
    /// Any other status.
    Failed,
}

fn at(now: Duration) -> Millis {
    now.as_millis() as Millis
}

impl World {
    pub fn new(opts: Options) -> Arc<Self> {
        let max_ack_timeout_ms = unimesh_core::SubscriptionLimits::default().max_ack_timeout_ms;
        let mut trace = Trace::default();
        trace.verbose = std::env::var_os("UNIMESH_TRACE").is_some();
        let nodes = opts.nodes.max(1) as usize;
        Arc::new(Self {
            opts,
            origin: Instant::now(),
            done: AtomicBool::new(false),
            overtaken: Mutex::new(None),
            sources: Mutex::new(None),
            inner: Mutex::new(Inner {
                checker: Checker::new(max_ack_timeout_ms),
                trace,
                step: 0,
                failure: None,
                faults_on: true,
                counts: Counts::default(),
                jumped: Duration::ZERO,
                specs: BTreeMap::new(),
                live_specs: BTreeMap::new(),
                durable_specs: BTreeMap::new(),
                ids: BTreeMap::new(),
                nodes: (0..nodes).map(|_| Node::default()).collect(),
                incarnations: 0,
                steps: 0,
                fences_at_broker: false,
                pushes: BTreeMap::new(),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Single-threaded simulation: a poisoned lock means a panic, which ends the run.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Time since the run began, in milliseconds of the simulated clock.
    pub fn elapsed_ms(&self) -> Millis {
        at(self.origin.elapsed())
    }

    // ----- the run -----

    pub fn is_done(&self) -> bool {
        self.done.load(AtomicOrdering::Relaxed)
    }

    pub fn set_done(&self) {
        self.done.store(true, AtomicOrdering::Relaxed);
    }

    pub fn failure(&self) -> Option<Violation> {
        self.lock().failure.clone()
    }

    pub fn fail(&self, v: Violation) {
        self.lock().fail(v);
    }

    pub fn faults_on(&self) -> bool {
        self.lock().faults_on
    }

    /// Faults stop: the ports answer honestly, clients behave, operators rest.
    pub fn stop_faults(&self) {
        let mut w = self.lock();
        w.faults_on = false;
        w.note(0, self.elapsed_ms(), "faults-end", [0; 4]);
    }

    /// Counts one injected fault or client action (`f` picks the counter).
    pub fn count(&self, f: impl FnOnce(&mut Counts) -> &mut u64) {
        *f(&mut self.lock().counts) += 1;
    }

    pub fn counts(&self) -> Counts {
        self.lock().counts.clone()
    }

    /// A step of the harness's own (a client's call, a fault), for the trace.
    pub fn note(&self, what: &'static str, args: [u64; 4]) {
        self.note_at(0, what, args);
    }

    /// [`World::note`] of a step at mesh node `node`.
    pub fn note_at(&self, node: usize, what: &'static str, args: [u64; 4]) {
        let t = self.elapsed_ms();
        self.lock().note(node, t, what, args);
    }

    /// A group's number in the trace (see `Inner::tag`).
    pub fn tag(&self, group: &GroupName) -> u64 {
        self.lock().tag(group)
    }

    /// How many mesh nodes the run has.
    pub fn nodes(&self) -> usize {
        self.lock().nodes.len()
    }

    /// Where to ask whether an assignment a mesh accepts was overtaken by the broker's
    /// group coordinator (a member acts on an assignment after the coordinator expelled it
    /// or handed the lane on): the checker then counts the mesh a zombie for the lane from
    /// the start, not its new owner.
    pub fn set_ownership(&self, overtaken: Overtaken) {
        *self.overtaken.lock().unwrap_or_else(|p| p.into_inner()) = Some(overtaken);
    }

    /// Where to ask which batch checkpoint wrote the record a resume point came from (a
    /// store that fences at read: `Checker::read_back` judges what was read).
    pub fn set_sources(&self, sources: Sources) {
        *self.sources.lock().unwrap_or_else(|p| p.into_inner()) = Some(sources);
    }

    /// The broker fences a replaced owner (Kafka): from now on commits are judged when the
    /// broker takes them ([`World::committed`]) and resume points as read.
    pub fn fences_at_broker(&self) {
        self.lock().fences_at_broker = true;
    }

    pub fn trace_hash(&self) -> u64 {
        self.lock().trace.hash()
    }

    pub fn last_steps(&self) -> Vec<String> {
        self.lock().trace.last()
    }

    /// Inputs the mesh took over the run (all incarnations).
    pub fn steps(&self) -> u64 {
        self.lock().steps
    }

    pub fn incarnations(&self) -> u32 {
        self.lock().incarnations
    }

    /// Incarnations of node `node` so far.
    pub fn incarnations_of(&self, node: usize) -> u32 {
        self.lock().nodes.get(node).map_or(0, |n| n.incarnations)
    }

    /// A clock jump of `by`: the mesh sees the time move on at once.
    pub fn jumped(&self, by: Duration) {
        let mut w = self.lock();
        w.jumped += by;
        w.counts.clock_jumps += 1;
        let t = at(self.origin.elapsed());
        w.note(0, t, "clock-jump", [by.as_millis() as u64, 0, 0, 0]);
    }

    /// Whether retention may delete now: once every group's start on every partition is
    /// durable (a group that never had a durable position legitimately starts at whatever
    /// is earliest then, as in the core's simulation).
    pub fn retention_allowed(&self) -> bool {
        let w = self.lock();
        self.opts.groups.iter().all(|g| {
            GroupName::new(&g.name)
                .is_ok_and(|name| (0..self.opts.partitions).all(|p| w.checker.is_pinned(&name, p)))
        })
    }

    /// Runs `f` on the checker (read-only questions at the end of a run).
    pub fn with_checker<T>(&self, f: impl FnOnce(&Checker) -> T) -> T {
        f(&self.lock().checker)
    }

    /// The tracker's look at the time on node `node`: the simulated clock without the
    /// jumps and without the node's pauses ("at once" is the node's own time).
    fn unjumped(&self, w: &Inner, node: usize) -> Duration {
        let paused = w.nodes.get(node).map_or(Duration::ZERO, Node::paused);
        self.origin
            .elapsed()
            .saturating_sub(w.jumped)
            .saturating_sub(paused)
    }

    /// Node `node` is paused from now on (none of its tasks runs).
    pub fn paused(&self, node: usize) {
        if let Some(n) = self.lock().nodes.get_mut(node) {
            n.paused_since = Some(Instant::now());
        }
    }

    /// Node `node` runs again.
    pub fn resumed(&self, node: usize) {
        if let Some(n) = self.lock().nodes.get_mut(node) {
            if let Some(since) = n.paused_since.take() {
                n.paused_for += since.elapsed();
            }
        }
    }

    /// Deliveries handed out, over every node, that have not reached a request yet (see
    /// [`crate::tracker::Tracker::outstanding`]).
    pub fn handed_out(&self) -> usize {
        self.lock()
            .nodes
            .iter()
            .map(|n| n.tracker.outstanding())
            .sum()
    }

    /// Deliveries the mesh handed to a finished poll that neither reached a client nor
    /// went back (checked also at every observation).
    pub fn check_stranded(&self, final_check: bool) {
        let mut w = self.lock();
        let nows: Vec<Duration> = (0..w.nodes.len()).map(|n| self.unjumped(&w, n)).collect();
        let checked: Result<(), Violation> = w
            .nodes
            .iter_mut()
            .zip(nows)
            .try_for_each(|(n, now)| n.tracker.check(now, final_check));
        if let Err(v) = checked {
            w.fail(v);
        }
    }

    // ----- the front door -----

    /// Node `node`'s front door, while it is up.
    pub fn front(&self, node: usize) -> Option<mpsc::UnboundedSender<Job>> {
        self.lock().nodes.get(node).and_then(|n| n.front.clone())
    }

    /// Node `node`'s live log port, while it is up.
    pub fn log_port(&self, node: usize) -> Option<Arc<dyn LogPort>> {
        self.lock()
            .nodes
            .get(node)
            .and_then(|n| n.log.as_ref()?.upgrade())
    }

    pub fn set_front(&self, node: usize, front: mpsc::UnboundedSender<Job>, log: Arc<dyn LogPort>) {
        if let Some(n) = self.lock().nodes.get_mut(node) {
            n.front = Some(front);
            n.log = Some(Arc::downgrade(&log));
        }
    }

    /// The spec to send when (re)creating `group`: the one the mesh took first, if any.
    pub fn spec_for(&self, spec: SubscriptionSpec) -> SubscriptionSpec {
        self.lock().specs.get(&spec.group).cloned().unwrap_or(spec)
    }

    /// The settings the live mesh has for `group`.
    pub fn live_spec(&self, group: &GroupName) -> Option<SubscriptionSpec> {
        self.lock().live_specs.get(group).cloned()
    }

    // ----- the process -----

    /// Node `node` was killed: its mesh's memory and every write not yet durable are gone.
    pub fn crashed(&self, node: usize) {
        let mut w = self.lock();
        let Some(n) = w.nodes.get_mut(node) else {
            return;
        };
        let t = n.clock.now_ms();
        n.front = None;
        n.log = None;
        n.persisting.clear();
        n.last_applied = None;
        n.tracker.clear();
        n.clock.started = None;
        w.counts.kills += 1;
        w.note(node, t, "kill", [0; 4]);
        if w.failure.is_none() {
            w.checker.instance(node as u32).crashed(t);
        }
        // Updates that were not durable are gone with the process.
        let undone: Vec<SubscriptionSpec> = w
            .live_specs
            .iter()
            .filter_map(|(g, live)| w.durable_specs.get(g).filter(|d| *d != live).cloned())
            .collect();
        for spec in undone {
            w.checker.update_group(&spec);
            w.live_specs.insert(spec.group.clone(), spec);
        }
    }

    // ----- the engine's tap -----

    /// A new incarnation of node `node` built its mesh with `epoch` at mesh time `now`.
    pub(crate) fn started(&self, node: usize, now: Millis, epoch: Epoch) {
        let elapsed = self.origin.elapsed();
        let mut w = self.lock();
        w.incarnations += 1;
        let incarnation = w.incarnations;
        let Some(n) = w.nodes.get_mut(node) else {
            return;
        };
        n.incarnation = incarnation;
        let base = n.clock.last_ms.max(at(elapsed) + 1);
        n.clock.base_ms = base;
        n.clock.started = Some(Instant::now());
        n.incarnations += 1;
        let t = n.clock.t(now);
        w.note(node, t, "start", [u64::from(epoch), 0, 0, 0]);
        let r = w.checker.instance(node as u32).started(t, epoch);
        w.check(r);
    }

    pub(crate) fn input(&self, node: usize, now: Millis, input: &Input, response: &Response) {
        // Asked before the world's lock is taken (the coordinator notes into the world).
        let (stale, sources) = match input {
            Input::PartitionsAssigned { group, partitions } => {
                let overtaken = self.overtaken.lock().unwrap_or_else(|p| p.into_inner());
                let stale = partitions
                    .iter()
                    .map(|a| {
                        overtaken
                            .as_ref()
                            .is_some_and(|f| f(node, group, a.partition))
                    })
                    .collect();
                let sources = self.sources.lock().unwrap_or_else(|p| p.into_inner());
                let found = partitions
                    .iter()
                    .map(|a| {
                        let c = a.checkpoint.as_ref()?;
                        sources.as_ref()?(group, a.partition, c)
                    })
                    .collect();
                (stale, found)
            }
            _ => (Vec::new(), Vec::new()),
        };
        let mut w = self.lock();
        let unjumped = self.unjumped(&w, node);
        w.steps += 1;
        let Some(t) = w.nodes.get_mut(node).map(|n| n.clock.t(now)) else {
            return;
        };
        let taken = Taken { stale, sources };
        w.observe_input(node, t, unjumped, input, response, &taken);
        if let Err(v) = w.nodes[node].tracker.check(unjumped, false) {
            w.fail(v);
        }
    }

    pub(crate) fn effect(&self, node: usize, now: Millis, effect: &Effect) {
        let mut w = self.lock();
        let Some(t) = w.nodes.get_mut(node).map(|n| n.clock.t(now)) else {
            return;
        };
        w.observe_effect(node, t, effect);
    }

    pub(crate) fn persist(
        &self,
        node: usize,
        now: Millis,
        ticket: Ticket,
        batch: &Arc<PersistBatch>,
    ) {
        let mut w = self.lock();
        let Some(t) = w.nodes.get_mut(node).map(|n| n.clock.t(now)) else {
            return;
        };
        w.note(
            node,
            t,
            "persist",
            [ticket, batch.checkpoints.len() as u64, 0, 0],
        );
        let r = w
            .checker
            .instance(node as u32)
            .persist_emitted(ticket, batch);
        w.check(r);
        w.nodes[node]
            .persisting
            .insert(Arc::as_ptr(batch) as usize, (ticket, batch.clone()));
    }

    // ----- the storage ports -----

    /// The state store made `batch` of node `node` durable (called at the moment of the
    /// commit, from inside the store, so a kill right after still counts it).
    pub fn persist_durable(&self, node: usize, batch: &PersistBatch) {
        self.persist_durable_outranked(node, batch, &[]);
    }

    /// [`World::persist_durable`] on a store that fences at read: the checkpoints marked in
    /// `outranked` are outranked by a later owner's records, never read
    /// ([`unimesh_sim::Checker::persist_applied_outranked`]).
    pub fn persist_durable_outranked(&self, node: usize, batch: &PersistBatch, outranked: &[bool]) {
        let mut w = self.lock();
        let Some(n) = w.nodes.get_mut(node) else {
            return;
        };
        let t = n.clock.now_ms();
        let key = batch as *const PersistBatch as usize;
        let Some((ticket, held)) = n.persisting.remove(&key) else {
            w.fail(violation(
                Clause::C3,
                "the store wrote a batch the engine never queued (or wrote one twice)".into(),
            ));
            return;
        };
        if n.written.len() >= WRITTEN_KEPT {
            n.written.pop_front();
        }
        let incarnation = n.incarnation;
        n.written.push_back((key, incarnation, ticket, held));
        let fenced = outranked.iter().filter(|&&o| o).count() as u64;
        w.note(node, t, "durable", [ticket, fenced, 0, 0]);
        // The state port's contract: batches are handed over in ticket order, one at a time.
        if let Some(last) = w.nodes[node].last_applied {
            if ticket <= last {
                w.fail(violation(
                    Clause::C3,
                    format!(
                        "persist {ticket} was written after persist {last} (out of ticket order)"
                    ),
                ));
                return;
            }
        }
        w.nodes[node].last_applied = Some(ticket);
        for spec in &batch.subscriptions {
            w.durable_specs.insert(spec.group.clone(), spec.clone());
        }
        let replaced = w
            .checker
            .instance(node as u32)
            .replaced_lanes(ticket, batch);
        let outranked: Vec<bool> = replaced
            .iter()
            .enumerate()
            .map(|(i, &r)| r || outranked.get(i).copied().unwrap_or(false))
            .collect();
        let r = w
            .checker
            .instance(node as u32)
            .persist_applied_outranked(ticket, batch, &outranked);
        w.check(r);
    }

    /// Node `node`'s local store made `epoch` durable apart from the rest of its batch
    /// (the Kafka state port writes its local part, the epoch, first).
    pub fn epoch_durable(&self, node: usize, epoch: Epoch) {
        let mut w = self.lock();
        if w.failure.is_none() {
            w.checker.instance(node as u32).epoch_durable(epoch);
        }
    }

    /// A group's definition reached the store a restart reads it from (Kafka's
    /// subscriptions topic), whether or not the rest of its batch did.
    pub fn spec_durable(&self, spec: &SubscriptionSpec) {
        self.lock()
            .durable_specs
            .insert(spec.group.clone(), spec.clone());
    }

    /// The broker's group coordinator took `partitions` of `group` from node `node`'s
    /// member without telling it (its session expired, or it was expelled).
    pub fn lanes_expired(&self, node: usize, group: &GroupName, partitions: &[Partition]) {
        let mut w = self.lock();
        let Some(t) = w.nodes.get_mut(node).map(|n| n.clock.now_ms()) else {
            return;
        };
        for &p in partitions {
            w.checker.instance(node as u32).lane_expired(t, group, p);
        }
    }

    /// The broker took a commit of node `node` (one it did not fence).
    pub fn committed(&self, node: usize, group: &GroupName, partition: Partition, offset: Offset) {
        let mut w = self.lock();
        let Some(t) = w.nodes.get_mut(node).map(|n| n.clock.now_ms()) else {
            return;
        };
        let g = w.tag(group);
        w.note(node, t, "committed", [u64::from(partition), offset, g, 0]);
        let r = w
            .checker
            .instance(node as u32)
            .committed(group, partition, offset);
        w.check(r);
    }

    /// The broker made a record durable at `topic/partition/offset`: every partition's
    /// records in offset order from 0 (the checker holds C9 to it).
    pub fn published(&self, topic: &TopicName, partition: Partition, offset: Offset, body: &Bytes) {
        let meta = match unimesh_shell::event::decode_stored(body) {
            Ok(m) => RecordMeta::Event(Arc::new(m)),
            Err(e) => RecordMeta::Undecodable(Arc::from(e.to_string())),
        };
        self.published_record(
            topic,
            partition,
            &Record {
                offset,
                meta,
                body: body.clone(),
                broker_handle: None,
            },
        );
    }

    /// [`World::published`] of a record as its reader decoded it (a broker whose records
    /// are not in the stored form, such as Kafka's CloudEvents binding).
    pub fn published_record(&self, topic: &TopicName, partition: Partition, record: &Record) {
        let offset = record.offset;
        let id = match &record.meta {
            RecordMeta::Event(m) => Some(m.id.clone()),
            RecordMeta::Undecodable(_) => None,
        };
        let mut w = self.lock();
        let t = w.now_ms();
        w.note(0, t, "published", [u64::from(partition), offset, 0, 0]);
        let r = w.checker.published(topic, partition, record);
        w.check(r);
        w.ids
            .entry((topic.clone(), partition))
            .or_default()
            .push(id);
    }

    /// Retention deleted everything of `topic/partition` below `earliest`.
    pub fn retention(&self, topic: &TopicName, partition: Partition, earliest: Offset) {
        let mut w = self.lock();
        let t = w.now_ms();
        w.counts.retention_deletions += 1;
        w.note(0, t, "retention", [u64::from(partition), earliest, 0, 0]);
        w.checker.retention(topic, partition, earliest);
    }

    // ----- what clients got, through the front -----

    /// A publisher's answer. C9: success names, for every event, the durable position of
    /// that very event.
    pub fn publish_answered(
        &self,
        topic: &TopicName,
        ids: &[String],
        answer: &Result<Vec<PublishResult>, EngineError>,
    ) {
        let mut w = self.lock();
        let t = w.now_ms();
        let Ok(results) = answer else {
            w.note(0, t, "publish-error", [ids.len() as u64, 0, 0, 0]);
            let r = w.checker.publish_answered(topic, false, None);
            w.check(r);
            return;
        };
        w.note(0, t, "publish-ok", [results.len() as u64, 0, 0, 0]);
        if results.len() != ids.len() {
            w.fail(violation(
                Clause::C9,
                format!(
                    "{} events published, {} results answered",
                    ids.len(),
                    results.len()
                ),
            ));
            return;
        }
        for (sent, r) in ids.iter().zip(results) {
            let c = w
                .checker
                .publish_answered(topic, true, Some((r.partition, r.offset)));
            w.check(c);
            let stored = w
                .ids
                .get(&(topic.clone(), r.partition))
                .and_then(|v| v.get(r.offset as usize))
                .cloned()
                .flatten();
            if r.id != *sent || stored.as_deref() != Some(sent.as_str()) {
                w.fail(violation(
                    Clause::C9,
                    format!(
                        "event {sent} answered as {} at {}/{}, where the log holds {stored:?}",
                        r.id, r.partition, r.offset
                    ),
                ));
                return;
            }
        }
    }

    /// A poll of `client` (asking for `max`) at node `node` came back to its request with
    /// `got`.
    pub fn poll_received(
        &self,
        node: usize,
        group: &GroupName,
        client: &ClientId,
        max: u32,
        got: &[Delivery],
    ) {
        let ids: Vec<DeliveryId> = got.iter().map(|d| d.id).collect();
        self.received(node, group, client, max, &ids, "poll-answer");
    }

    /// A stream session's transport wrote these deliveries to its connection (a stream of
    /// credit `window`): from here they are the client's, as a poll's answer is.
    pub fn stream_written(
        &self,
        node: usize,
        group: &GroupName,
        client: &ClientId,
        window: u32,
        got: &[Delivery],
    ) {
        let ids: Vec<DeliveryId> = got.iter().map(|d| d.id).collect();
        self.received(node, group, client, window, &ids, "stream-write");
    }

    /// A webhook target answered (or not yet) the request naming these deliveries.
    pub fn push_answered(
        &self,
        node: usize,
        group: &GroupName,
        ids: &[DeliveryId],
        answered: Answered,
    ) {
        let mut w = self.lock();
        for id in ids {
            w.pushes.insert((node, group.clone(), *id), answered);
        }
    }

    /// A webhook target took a request naming these deliveries (its pusher has credit
    /// `credit`): from here they are the target's, as a poll's answer is its client's.
    pub fn pushed(
        &self,
        node: usize,
        group: &GroupName,
        client: &ClientId,
        credit: u32,
        ids: &[DeliveryId],
    ) {
        self.received(node, group, client, credit, ids, "push-request");
    }

    fn received(
        &self,
        node: usize,
        group: &GroupName,
        client: &ClientId,
        max: u32,
        got: &[DeliveryId],
        what: &'static str,
    ) {
        let mut w = self.lock();
        let Some(n) = w.nodes.get_mut(node) else {
            return;
        };
        let t = n.clock.now_ms();
        let r = n.tracker.received(group, client, max, got);
        w.note(node, t, what, [got.len() as u64, u64::from(max), 0, 0]);
        if let Err(v) = r {
            w.fail(v);
        }
    }

    /// An ACK, NACK or extend came back to its request: it must be the mesh's answer.
    pub fn settle_answered(
        &self,
        node: usize,
        group: &GroupName,
        kind: SettleKind,
        ids: &[DeliveryId],
        answer: &Result<Vec<Settle>, EngineError>,
    ) {
        let mut w = self.lock();
        let Some(n) = w.nodes.get_mut(node) else {
            return;
        };
        if let Err(v) = n.tracker.answered(group, kind, ids, answer) {
            w.fail(v);
        }
    }
}

impl Clock {
    fn t(&mut self, mesh_ms: Millis) -> Millis {
        let t = self.base_ms + mesh_ms;
        self.last_ms = self.last_ms.max(t);
        self.last_ms
    }

    /// The checker's time now, for observations that do not come with the mesh's time.
    fn now_ms(&mut self) -> Millis {
        let mesh = self.started.map_or(0, |s| at(s.elapsed()));
        self.t(mesh)
    }
}

pub(crate) fn violation(clause: Clause, message: String) -> Violation {
    Violation { clause, message }
}

impl Inner {
    /// Node `node` resumes `group/partition` from `checkpoint`, read from a store that
    /// fences at read, from the record `source` wrote (when the store can tell): the checker
    /// judges what was read (`Checker::read_back`). Leaves node `node` selected.
    fn read_back(
        &mut self,
        node: usize,
        group: &GroupName,
        partition: Partition,
        checkpoint: &unimesh_core::Checkpoint,
        source: Option<(usize, Arc<PersistBatch>, usize)>,
        stale: bool,
    ) -> Result<(), Violation> {
        let source = source.and_then(|(writer, batch, index)| {
            let key = Arc::as_ptr(&batch) as usize;
            let w = self.nodes.get(writer)?;
            // Queued batches are the live incarnation's (a kill clears them).
            let (incarnation, ticket) = w
                .persisting
                .get(&key)
                .map(|(t, _)| (w.incarnation, *t))
                .or_else(|| {
                    w.written
                        .iter()
                        .find(|(k, _, _, _)| *k == key)
                        .map(|(_, i, t, _)| (*i, *t))
                })?;
            Some((writer as u32, incarnation, ticket, batch, index))
        });
        let source = source
            .as_ref()
            .map(|(w, n, t, b, i)| (*w, *n, *t, b.as_ref(), *i));
        let checker = self.checker.instance(node as u32);
        if stale {
            checker.read_back_stale(group, partition, checkpoint, source)
        } else {
            checker.read_back(group, partition, checkpoint, source)
        }
    }

    /// A group's number in the trace of several mesh nodes (its position among the groups,
    /// from 1); 0 with one node, whose trace reads as it always did.
    fn tag(&self, group: &GroupName) -> u64 {
        if self.nodes.len() < 2 {
            return 0;
        }
        self.specs
            .keys()
            .position(|g| g == group)
            .map_or(0, |i| i as u64 + 1)
    }

    /// The checker's time now at node 0, for observations of the shared world.
    fn now_ms(&mut self) -> Millis {
        self.nodes.first_mut().map_or(0, |n| n.clock.now_ms())
    }

    fn fail(&mut self, v: Violation) {
        if self.failure.is_none() {
            let t = self.nodes.first().map_or(0, |n| n.clock.last_ms);
            self.note(0, t, "VIOLATION", [0; 4]);
            self.failure = Some(v);
        }
    }

    fn check(&mut self, r: Result<(), Violation>) {
        if let Err(v) = r {
            self.fail(v);
        }
    }

    /// Records a step at mesh node `node`; nothing after the first violation (so the last
    /// steps end there).
    fn note(&mut self, node: usize, now: Millis, what: &'static str, args: [u64; 4]) {
        if self.failure.is_some() {
            return;
        }
        self.step += 1;
        self.trace.record_at(
            node as u32,
            Entry {
                step: self.step,
                now,
                what,
                args,
            },
        );
    }

    fn observe_input(
        &mut self,
        node: usize,
        t: Millis,
        unjumped: Duration,
        input: &Input,
        response: &Response,
        taken: &Taken,
    ) {
        self.checker.instance(node as u32);
        let ok = !matches!(response, Response::Refused(_));
        match input {
            Input::Ack { group, ids } => {
                self.settled(node, t, group, SettleKind::Ack, ids, response)
            }
            Input::Nack {
                group,
                ids,
                delay_ms,
            } => self.settled(node, t, group, SettleKind::Nack(*delay_ms), ids, response),
            Input::Extend {
                group,
                ids,
                extend_ms,
            } => self.settled(
                node,
                t,
                group,
                SettleKind::Extend(*extend_ms),
                ids,
                response,
            ),
            Input::ClientGone { group, client } => {
                self.note(node, t, "client-gone", [0; 4]);
                self.checker.client_gone(t, group, client);
                self.nodes[node].tracker.gone(group, client);
            }
            Input::ClientPoll { group, client, max } => {
                self.note(
                    node,
                    t,
                    "client-poll",
                    [u64::from(*max), u64::from(ok), 0, 0],
                );
                self.checker.client_poll(group, client, *max, ok);
                // A webhook pusher's credit at 0 ends nothing: what it took is in requests
                // on their way to the target (each ends in an answer, an error or the
                // pusher's timeout, and settles then), not an answer that goes at once.
                if client.as_str() != PUSH_CLIENT {
                    self.nodes[node]
                        .tracker
                        .credit(group, client, *max, unjumped);
                }
            }
            Input::PartitionsAssigned { group, partitions } if ok => {
                for (i, a) in partitions.iter().enumerate() {
                    if a.checkpoint.is_some() {
                        self.counts.resumed_from_progress += 1;
                    }
                    let stale = taken.stale.get(i).copied().unwrap_or(false);
                    // What a member the coordinator still counts as the lane's owner read is
                    // judged as a read of the lane's durable state. What a zombie read is
                    // not (its writes rank below the live owner's, and a reader that takes
                    // one is judged then): it is the base its own checkpoints are judged from
                    // (`Checker::read_back_stale`).
                    if let Some(c) = a.checkpoint.as_ref().filter(|_| self.fences_at_broker) {
                        let source = taken.sources.get(i).cloned().flatten();
                        let r = self.read_back(node, group, a.partition, c, source, stale);
                        self.check(r);
                    }
                    if stale {
                        self.counts.stale_assignments += 1;
                        let g = self.tag(group);
                        self.note(
                            node,
                            t,
                            "assigned-stale",
                            [u64::from(a.partition), a.end, g, 0],
                        );
                        self.checker.assigned_stale(group, a.partition);
                    } else {
                        let g = self.tag(group);
                        // With several nodes: where the lane resumes (1 + the watermark).
                        let wm = if g > 0 {
                            a.checkpoint
                                .as_ref()
                                .map_or(0, |c| c.progress.watermark() + 1)
                        } else {
                            0
                        };
                        self.note(node, t, "assigned", [u64::from(a.partition), a.end, g, wm]);
                        self.checker.assigned(group, a.partition);
                    }
                }
            }
            Input::PartitionsRevoked { group, partitions } if ok => {
                for &p in partitions {
                    let g = self.tag(group);
                    self.note(node, t, "revoked", [u64::from(p), g, 0, 0]);
                    self.checker.revoked(t, group, p);
                }
            }
            Input::Seek {
                group,
                partition,
                offset,
            } if ok => {
                self.note(node, t, "seek", [u64::from(*partition), *offset, 0, 0]);
                self.checker.sought(t, group, *partition, *offset);
            }
            Input::Subscribe(spec) if ok => {
                self.note(node, t, "subscribe", [0; 4]);
                if self.specs.contains_key(&spec.group) {
                    self.checker.update_group(spec);
                } else {
                    self.checker.add_group(spec);
                    self.specs.insert(spec.group.clone(), spec.clone());
                }
                self.live_specs.insert(spec.group.clone(), spec.clone());
            }
            Input::Persisted { ticket } => {
                self.note(node, t, "persisted", [*ticket, 0, 0, 0]);
                self.checker.persist_notified(*ticket);
            }
            Input::PersistFailed { ticket } => {
                self.note(node, t, "persist-failed", [*ticket, 0, 0, 0]);
                let failed = self.nodes[node]
                    .persisting
                    .iter()
                    .find(|(_, (k, _))| k == ticket)
                    .map(|(&key, (_, batch))| (key, batch.clone()));
                match failed.filter(|_| self.fences_at_broker) {
                    // Written record by record: what landed before the failure may be read.
                    Some((key, batch)) => {
                        self.checker.persist_failed_partly(*ticket, &batch);
                        let n = &mut self.nodes[node];
                        if n.written.len() >= WRITTEN_KEPT {
                            n.written.pop_front();
                        }
                        let incarnation = n.incarnation;
                        n.written.push_back((key, incarnation, *ticket, batch));
                    }
                    None => self.checker.persist_failed(*ticket),
                }
                self.nodes[node].persisting.retain(|_, (k, _)| k != ticket);
            }
            Input::Fetched {
                group,
                partition,
                result,
                ..
            } => match result {
                FetchResult::Records(r) => {
                    let first = r.first().map_or(0, |r| r.offset);
                    let g = self.tag(group);
                    self.note(
                        node,
                        t,
                        "fetched",
                        [u64::from(*partition), r.len() as u64, first, g],
                    );
                }
                FetchResult::OutOfRange { earliest, end } => {
                    self.note(
                        node,
                        t,
                        "fetched-oor",
                        [u64::from(*partition), *earliest, *end, 0],
                    );
                }
                FetchResult::Failed { .. } => {
                    self.note(node, t, "fetch-failed", [u64::from(*partition), 0, 0, 0])
                }
            },
            Input::Tick => self.note(node, t, "tick", [0; 4]),
            Input::FlushNow => self.note(node, t, "flush-now", [0; 4]),
            Input::Replay { records, .. } => self.note(
                node,
                t,
                "replay",
                [records.len() as u64, u64::from(ok), 0, 0],
            ),
            Input::Unsubscribe { .. } => {
                self.note(node, t, "unsubscribe", [u64::from(ok), 0, 0, 0])
            }
            _ => self.note(node, t, "input", [u64::from(ok), 0, 0, 0]),
        }
    }

    fn settled(
        &mut self,
        node: usize,
        t: Millis,
        group: &GroupName,
        kind: SettleKind,
        ids: &[DeliveryId],
        response: &Response,
    ) {
        let code = match kind {
            SettleKind::Ack => 0,
            SettleKind::Nack(_) => 1,
            SettleKind::Extend(_) => 2,
        };
        let first = ids.first().map_or(0, |id| id.offset);
        self.note(node, t, "settle", [code, ids.len() as u64, first, 0]);
        if !matches!(kind, SettleKind::Extend(_)) {
            self.check_pushed(node, group, kind, ids);
        }
        let r = self.checker.settled(t, group, kind, ids, response);
        self.check(r);
        if !matches!(kind, SettleKind::Extend(_)) {
            self.counts.polls_handed_back += self.nodes[node].tracker.settled(ids);
        }
        self.nodes[node]
            .tracker
            .mesh_answered(group, kind, ids, response);
    }

    /// A settle of deliveries a webhook target took must follow its answer: an ACK only
    /// after a 2xx; a NACK after a 429/503 with `Retry-After` delayed by it, capped by the
    /// group's backoff maximum; after any other answer or none, the group's backoff.
    fn check_pushed(
        &mut self,
        node: usize,
        group: &GroupName,
        kind: SettleKind,
        ids: &[DeliveryId],
    ) {
        let max_ms = self
            .live_specs
            .get(group)
            .map_or(u64::MAX, |s| s.backoff.max_ms);
        for id in ids {
            let Some(answered) = self.pushes.remove(&(node, group.clone(), *id)) else {
                continue;
            };
            let expected = match answered {
                Answered::Ok => SettleKind::Ack,
                Answered::Deferred(secs) => {
                    SettleKind::Nack(Some(secs.saturating_mul(1000).min(max_ms)))
                }
                Answered::Failed | Answered::Taken => SettleKind::Nack(None),
            };
            if kind != expected {
                self.fail(violation(
                    Clause::C1,
                    format!(
                        "{group}: the pusher settled {id} as {kind:?}, but its target answered {answered:?} (expected {expected:?})"
                    ),
                ));
                return;
            }
        }
    }

    fn observe_effect(&mut self, node: usize, t: Millis, effect: &Effect) {
        self.checker.instance(node as u32);
        match effect {
            Effect::Deliver {
                group,
                client,
                delivery,
            } => {
                let id = delivery.id;
                let g = self.tag(group);
                self.note(
                    node,
                    t,
                    "deliver",
                    [u64::from(id.partition), id.offset, u64::from(id.attempt), g],
                );
                let r = self.checker.delivered(t, group, client, delivery);
                self.check(r);
                self.nodes[node].tracker.delivered(group, client, id);
            }
            Effect::Commit {
                group,
                partition,
                offset,
                ..
            } => {
                let g = self.tag(group);
                self.note(node, t, "commit", [u64::from(*partition), *offset, g, 0]);
                // A broker that fences commits judges them when it takes them, by the
                // seeks before this emission.
                if self.fences_at_broker {
                    self.checker.commit_emitted(group, *partition, *offset);
                } else {
                    let r = self.checker.committed(group, *partition, *offset);
                    self.check(r);
                }
            }
            Effect::Skipped {
                group,
                partition,
                from,
                to,
                reason,
                ..
            } => {
                self.note(node, t, "skipped", [u64::from(*partition), *from, *to, 0]);
                let r = self.checker.skipped(group, *partition, *from, *to, *reason);
                self.check(r);
            }
            Effect::Fetch {
                partition,
                from,
                max,
                ..
            } => self.note(
                node,
                t,
                "fetch",
                [u64::from(*partition), *from, *max as u64, 0],
            ),
            Effect::BrokerAck { partition, .. } => {
                // The simulated brokers give no receipt handles: a POP broker ACK cannot be.
                self.fail(violation(
                    Clause::C6,
                    format!("a broker ACK for partition {partition} of a broker without receipts"),
                ));
            }
            _ => self.note(node, t, "effect", [0; 4]),
        }
    }
}
