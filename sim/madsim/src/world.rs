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
//! Everything here runs on the one simulator thread; the lock is never held across an
//! `await` and no call made under it calls back into the world.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, MutexGuard};
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
use unimesh_shell::engine::{EngineError, PublishResult};
use unimesh_sim::trace::{Entry, Trace};
use unimesh_sim::{Checker, Clause, SettleKind, Violation};

use crate::counts::Counts;
use crate::node::Job;
use crate::options::Options;
use crate::tracker::Tracker;

/// The shared world of one run. Cheap to share (`Arc<World>`).
pub struct World {
    pub opts: Options,
    origin: Instant,
    /// The run is over: clients stop.
    done: AtomicBool,
    inner: Mutex<Inner>,
}

struct Inner {
    checker: Checker,
    trace: Trace,
    step: u64,
    failure: Option<Violation>,
    faults_on: bool,
    counts: Counts,
    clock: Clock,
    /// Batches queued for the persist writer and not yet written, by the address of their
    /// `Arc` (held here, so an address is not reused while its entry exists).
    persisting: BTreeMap<usize, (Ticket, Arc<PersistBatch>)>,
    last_applied: Option<Ticket>,
    /// The spec the mesh took when each group was first created (retries send it again).
    specs: BTreeMap<GroupName, SubscriptionSpec>,
    /// Each group's settings as the live mesh has them, and as the store has them (a crash
    /// undoes an update that was not durable yet).
    live_specs: BTreeMap<GroupName, SubscriptionSpec>,
    durable_specs: BTreeMap<GroupName, SubscriptionSpec>,
    /// The event id of every durable record (None: it does not decode), by position.
    ids: BTreeMap<(TopicName, Partition), Vec<Option<String>>>,
    tracker: Tracker,
    /// The live incarnation's front door (None while the node is down).
    front: Option<mpsc::UnboundedSender<Job>>,
    incarnations: u32,
    steps: u64,
}

/// The checker's clock: the mesh's time of the live incarnation plus `base_ms`.
#[derive(Default)]
struct Clock {
    base_ms: Millis,
    last_ms: Millis,
    /// When the live incarnation started (the mesh's time 0).
    started: Option<Instant>,
    /// Total of the clock jumps so far (the tracker measures time without them).
    jumped: Duration,
}

fn at(now: Duration) -> Millis {
    now.as_millis() as Millis
}

impl World {
    pub fn new(opts: Options) -> Arc<Self> {
        let max_ack_timeout_ms = unimesh_core::SubscriptionLimits::default().max_ack_timeout_ms;
        let mut trace = Trace::default();
        trace.verbose = std::env::var_os("UNIMESH_TRACE").is_some();
        Arc::new(Self {
            opts,
            origin: Instant::now(),
            done: AtomicBool::new(false),
            inner: Mutex::new(Inner {
                checker: Checker::new(max_ack_timeout_ms),
                trace,
                step: 0,
                failure: None,
                faults_on: true,
                counts: Counts::default(),
                clock: Clock::default(),
                persisting: BTreeMap::new(),
                last_applied: None,
                specs: BTreeMap::new(),
                live_specs: BTreeMap::new(),
                durable_specs: BTreeMap::new(),
                ids: BTreeMap::new(),
                tracker: Tracker::default(),
                front: None,
                incarnations: 0,
                steps: 0,
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
        w.note(self.elapsed_ms(), "faults-end", [0; 4]);
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
        let t = self.elapsed_ms();
        self.lock().note(t, what, args);
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

    /// A clock jump of `by`: the mesh sees the time move on at once.
    pub fn jumped(&self, by: Duration) {
        let mut w = self.lock();
        w.clock.jumped += by;
        w.counts.clock_jumps += 1;
        let t = at(self.origin.elapsed());
        w.note(t, "clock-jump", [by.as_millis() as u64, 0, 0, 0]);
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

    /// The tracker's look at the time: the simulated clock without the jumps.
    fn unjumped(&self, w: &Inner) -> Duration {
        self.origin.elapsed().saturating_sub(w.clock.jumped)
    }

    /// Deliveries the mesh handed to a finished poll that neither reached a client nor
    /// went back (checked also at every observation).
    pub fn check_stranded(&self, final_check: bool) {
        let mut w = self.lock();
        let now = self.unjumped(&w);
        if let Err(v) = w.tracker.check(now, final_check) {
            w.fail(v);
        }
    }

    // ----- the front door -----

    pub fn front(&self) -> Option<mpsc::UnboundedSender<Job>> {
        self.lock().front.clone()
    }

    pub fn set_front(&self, front: mpsc::UnboundedSender<Job>) {
        self.lock().front = Some(front);
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

    /// The node was killed: the mesh's memory and every write not yet durable are gone.
    pub fn crashed(&self) {
        let mut w = self.lock();
        let t = w.clock.now_ms();
        w.front = None;
        w.counts.kills += 1;
        w.persisting.clear();
        w.last_applied = None;
        w.tracker.clear();
        w.clock.started = None;
        w.note(t, "kill", [0; 4]);
        if w.failure.is_none() {
            w.checker.crashed(t);
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

    /// A new incarnation built its mesh with `epoch` at mesh time `now`.
    pub(crate) fn started(&self, now: Millis, epoch: Epoch) {
        let elapsed = self.origin.elapsed();
        let mut w = self.lock();
        let base = w.clock.last_ms.max(at(elapsed) + 1);
        w.clock.base_ms = base;
        w.clock.started = Some(Instant::now());
        w.incarnations += 1;
        let t = w.clock.t(now);
        w.note(t, "start", [u64::from(epoch), 0, 0, 0]);
        let r = w.checker.started(t, epoch);
        w.check(r);
    }

    pub(crate) fn input(&self, now: Millis, input: &Input, response: &Response) {
        let mut w = self.lock();
        let unjumped = self.unjumped(&w);
        w.steps += 1;
        let t = w.clock.t(now);
        w.observe_input(t, unjumped, input, response);
        if let Err(v) = w.tracker.check(unjumped, false) {
            w.fail(v);
        }
    }

    pub(crate) fn effect(&self, now: Millis, effect: &Effect) {
        let mut w = self.lock();
        let t = w.clock.t(now);
        w.observe_effect(t, effect);
    }

    pub(crate) fn persist(&self, now: Millis, ticket: Ticket, batch: &Arc<PersistBatch>) {
        let mut w = self.lock();
        let t = w.clock.t(now);
        w.note(t, "persist", [ticket, batch.checkpoints.len() as u64, 0, 0]);
        let r = w.checker.persist_emitted(ticket, batch);
        w.check(r);
        w.persisting
            .insert(Arc::as_ptr(batch) as usize, (ticket, batch.clone()));
    }

    // ----- the storage ports -----

    /// The state store made `batch` durable (called at the moment of the commit, from
    /// inside the store, so a kill right after still counts it).
    pub fn persist_durable(&self, batch: &PersistBatch) {
        let mut w = self.lock();
        let t = w.clock.now_ms();
        let key = batch as *const PersistBatch as usize;
        let Some((ticket, _)) = w.persisting.remove(&key) else {
            w.fail(violation(
                Clause::C3,
                "the store wrote a batch the engine never queued (or wrote one twice)".into(),
            ));
            return;
        };
        w.note(t, "durable", [ticket, 0, 0, 0]);
        // The state port's contract: batches are handed over in ticket order, one at a time.
        if let Some(last) = w.last_applied {
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
        w.last_applied = Some(ticket);
        for spec in &batch.subscriptions {
            w.durable_specs.insert(spec.group.clone(), spec.clone());
        }
        let r = w.checker.persist_applied(ticket, batch);
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
        let t = w.clock.now_ms();
        w.note(t, "published", [u64::from(partition), offset, 0, 0]);
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
        let t = w.clock.now_ms();
        w.counts.retention_deletions += 1;
        w.note(t, "retention", [u64::from(partition), earliest, 0, 0]);
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
        let t = w.clock.now_ms();
        let Ok(results) = answer else {
            w.note(t, "publish-error", [ids.len() as u64, 0, 0, 0]);
            let r = w.checker.publish_answered(topic, false, None);
            w.check(r);
            return;
        };
        w.note(t, "publish-ok", [results.len() as u64, 0, 0, 0]);
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

    /// A poll of `client` (asking for `max`) came back to its request with `got`.
    pub fn poll_received(&self, group: &GroupName, client: &ClientId, max: u32, got: &[Delivery]) {
        let mut w = self.lock();
        let t = w.clock.now_ms();
        w.note(t, "poll-answer", [got.len() as u64, u64::from(max), 0, 0]);
        if let Err(v) = w.tracker.received(group, client, max, got) {
            w.fail(v);
        }
    }

    /// An ACK, NACK or extend came back to its request: it must be the mesh's answer.
    pub fn settle_answered(
        &self,
        group: &GroupName,
        kind: SettleKind,
        ids: &[DeliveryId],
        answer: &Result<Vec<Settle>, EngineError>,
    ) {
        let mut w = self.lock();
        if let Err(v) = w.tracker.answered(group, kind, ids, answer) {
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
    fn fail(&mut self, v: Violation) {
        if self.failure.is_none() {
            let t = self.clock.last_ms;
            self.note(t, "VIOLATION", [0; 4]);
            self.failure = Some(v);
        }
    }

    fn check(&mut self, r: Result<(), Violation>) {
        if let Err(v) = r {
            self.fail(v);
        }
    }

    /// Records a step; nothing after the first violation (so the last steps end there).
    fn note(&mut self, now: Millis, what: &'static str, args: [u64; 4]) {
        if self.failure.is_some() {
            return;
        }
        self.step += 1;
        self.trace.record(Entry {
            step: self.step,
            now,
            what,
            args,
        });
    }

    fn observe_input(&mut self, t: Millis, unjumped: Duration, input: &Input, response: &Response) {
        let ok = !matches!(response, Response::Refused(_));
        match input {
            Input::Ack { group, ids } => self.settled(t, group, SettleKind::Ack, ids, response),
            Input::Nack {
                group,
                ids,
                delay_ms,
            } => self.settled(t, group, SettleKind::Nack(*delay_ms), ids, response),
            Input::Extend {
                group,
                ids,
                extend_ms,
            } => self.settled(t, group, SettleKind::Extend(*extend_ms), ids, response),
            Input::ClientGone { group, client } => {
                self.note(t, "client-gone", [0; 4]);
                self.checker.client_gone(t, group, client);
                self.tracker.gone(group, client);
            }
            Input::ClientPoll { group, client, max } => {
                self.note(t, "client-poll", [u64::from(*max), u64::from(ok), 0, 0]);
                self.checker.client_poll(group, client, *max, ok);
                self.tracker.credit(group, client, *max, unjumped);
            }
            Input::PartitionsAssigned { group, partitions } if ok => {
                for a in partitions {
                    if a.checkpoint.is_some() {
                        self.counts.resumed_from_progress += 1;
                    }
                    self.note(t, "assigned", [u64::from(a.partition), a.end, 0, 0]);
                    self.checker.assigned(group, a.partition);
                }
            }
            Input::PartitionsRevoked { group, partitions } if ok => {
                for &p in partitions {
                    self.note(t, "revoked", [u64::from(p), 0, 0, 0]);
                    self.checker.revoked(t, group, p);
                }
            }
            Input::Seek {
                group,
                partition,
                offset,
            } if ok => {
                self.note(t, "seek", [u64::from(*partition), *offset, 0, 0]);
                self.checker.sought(t, group, *partition, *offset);
            }
            Input::Subscribe(spec) if ok => {
                self.note(t, "subscribe", [0; 4]);
                if self.specs.contains_key(&spec.group) {
                    self.checker.update_group(spec);
                } else {
                    self.checker.add_group(spec);
                    self.specs.insert(spec.group.clone(), spec.clone());
                }
                self.live_specs.insert(spec.group.clone(), spec.clone());
            }
            Input::Persisted { ticket } => {
                self.note(t, "persisted", [*ticket, 0, 0, 0]);
                self.checker.persist_notified(*ticket);
            }
            Input::PersistFailed { ticket } => {
                self.note(t, "persist-failed", [*ticket, 0, 0, 0]);
                self.checker.persist_failed(*ticket);
                self.persisting.retain(|_, (k, _)| k != ticket);
            }
            Input::Fetched {
                partition, result, ..
            } => match result {
                FetchResult::Records(r) => {
                    let first = r.first().map_or(0, |r| r.offset);
                    self.note(
                        t,
                        "fetched",
                        [u64::from(*partition), r.len() as u64, first, 0],
                    );
                }
                FetchResult::OutOfRange { earliest, end } => {
                    self.note(
                        t,
                        "fetched-oor",
                        [u64::from(*partition), *earliest, *end, 0],
                    );
                }
                FetchResult::Failed { .. } => {
                    self.note(t, "fetch-failed", [u64::from(*partition), 0, 0, 0])
                }
            },
            Input::Tick => self.note(t, "tick", [0; 4]),
            Input::FlushNow => self.note(t, "flush-now", [0; 4]),
            Input::Replay { records, .. } => {
                self.note(t, "replay", [records.len() as u64, u64::from(ok), 0, 0])
            }
            Input::Unsubscribe { .. } => self.note(t, "unsubscribe", [u64::from(ok), 0, 0, 0]),
            _ => self.note(t, "input", [u64::from(ok), 0, 0, 0]),
        }
    }

    fn settled(
        &mut self,
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
        self.note(t, "settle", [code, ids.len() as u64, first, 0]);
        let r = self.checker.settled(t, group, kind, ids, response);
        self.check(r);
        if !matches!(kind, SettleKind::Extend(_)) {
            self.counts.polls_handed_back += self.tracker.settled(ids);
        }
        self.tracker.mesh_answered(group, kind, ids, response);
    }

    fn observe_effect(&mut self, t: Millis, effect: &Effect) {
        match effect {
            Effect::Deliver {
                group,
                client,
                delivery,
            } => {
                let id = delivery.id;
                self.note(
                    t,
                    "deliver",
                    [u64::from(id.partition), id.offset, u64::from(id.attempt), 0],
                );
                let r = self.checker.delivered(t, group, client, delivery);
                self.check(r);
                self.tracker.delivered(group, client, id);
            }
            Effect::Commit {
                group,
                partition,
                offset,
                ..
            } => {
                self.note(t, "commit", [u64::from(*partition), *offset, 0, 0]);
                let r = self.checker.committed(group, *partition, *offset);
                self.check(r);
            }
            Effect::Skipped {
                group,
                partition,
                from,
                to,
                reason,
                ..
            } => {
                self.note(t, "skipped", [u64::from(*partition), *from, *to, 0]);
                let r = self.checker.skipped(group, *partition, *from, *to, *reason);
                self.check(r);
            }
            Effect::Fetch {
                partition,
                from,
                max,
                ..
            } => self.note(t, "fetch", [u64::from(*partition), *from, *max as u64, 0]),
            Effect::BrokerAck { partition, .. } => {
                // The simulated brokers give no receipt handles: a POP broker ACK cannot be.
                self.fail(violation(
                    Clause::C6,
                    format!("a broker ACK for partition {partition} of a broker without receipts"),
                ));
            }
            _ => self.note(t, "effect", [0; 4]),
        }
    }
}
