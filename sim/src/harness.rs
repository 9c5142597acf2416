//! The discrete-event harness: one seeded, single-threaded run of the pure core against the
//! model broker, store and clients, with faults drawn from the seed, checked at every step
//! by the mesh's own invariants and by the contract [`Checker`].
//!
//! A run has two phases. During the fault phase everything may go wrong. Then faults stop
//! (TigerBeetle's liveness mode): the mesh restarts if it is down, revoked partitions come
//! back, clients reconnect and ACK every healthy record in time, and the run must converge
//! — every lane durably done up to the end of the log — within a time budget, after which
//! the quiescent checks (C1 liveness, DLQ, C6, the duplicate bound) run.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use bytes::Bytes;
use unimesh_core::{
    Assignment, ClientId, DeliveryId, Effect, EventMeta, FetchResult, Filter, GroupName, Input,
    Mesh, MeshConfig, Millis, Partition, Record, RecordMeta, Response, StartFrom,
    SubscriptionLimits, SubscriptionSpec, Ticket, TopicName, REPLAY_PARTITION,
};

use crate::checker::{Checker, CheckerStats, Clause, SettleKind, Violation};
use crate::faults::{distort_fetch, FaultCounts, FetchDistortion};
use crate::model::broker::{decode_handle, Broker};
use crate::model::client::{Behaviour, Client};
use crate::model::store::Store;
use crate::options::{Options, Size};
use crate::rng::Rng;
use crate::trace::{Entry, Trace};

/// How long after faults stop the run must converge (virtual time).
const LIVENESS_BUDGET_MS: Millis = 600_000;
/// A hard cap on steps, so a livelock cannot hang a sweep.
const MAX_STEPS: u64 = 3_000_000;

/// What a passing run reports.
#[derive(Clone, Debug)]
pub struct RunReport {
    pub seed: u64,
    pub steps: u64,
    pub virtual_ms: Millis,
    pub trace_hash: u64,
    pub faults: FaultCounts,
    pub stats: CheckerStats,
    pub records: u64,
    pub dead_letters: usize,
    /// A hash of the trace and of what the mesh shows at the end of the run (its stats and
    /// every group's view): equal digests for a seed mean the same inputs gave the same
    /// effects, answers and views. `sim/tests/trace_hashes.rs` holds them to a list.
    pub digest: u64,
}

/// A failing run: what broke, and where.
#[derive(Clone, Debug)]
pub struct Failure {
    pub seed: u64,
    pub violation: Violation,
    pub step: u64,
    pub now: Millis,
    pub options: String,
    pub trace: Vec<String>,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "FAILED seed={} at step {} (t={}ms)",
            self.seed, self.step, self.now
        )?;
        writeln!(f, "violated {}", self.violation)?;
        write!(f, "{}", self.options)?;
        writeln!(f, "last steps:")?;
        for line in &self.trace {
            writeln!(f, "  {line}")?;
        }
        let size = if self.options.contains("size=Small") {
            "UNIMESH_SIZE=small "
        } else {
            ""
        };
        write!(
            f,
            "replay with: UNIMESH_SEED={} {size}cargo test -p unimesh-sim replay_seed -- --nocapture",
            self.seed
        )
    }
}

#[derive(Clone, Debug)]
enum Ev {
    Publish,
    FetchAnswer {
        inc: u32,
        group: usize,
        partition: Partition,
        fetch_id: u64,
        from: u64,
        max: usize,
        waited: bool,
    },
    FetchRepeat {
        inc: u32,
        group: usize,
        partition: Partition,
        fetch_id: u64,
        result: FetchResult,
    },
    StoreWork {
        inc: u32,
    },
    Tick,
    ClientWake {
        client: usize,
    },
    ClientSettle {
        client: usize,
        id: DeliveryId,
        kind: SettleKind,
    },
    Crash,
    Restart,
    Rebalance,
    Reassign {
        inc: u32,
        group: usize,
        partition: Partition,
        after_ticket: Ticket,
    },
    Seek,
    Replay,
    Retention,
    ClockJump,
    EndFaults,
}

struct Scheduled {
    at: Millis,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Scheduled {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

struct GroupRt {
    name: GroupName,
    spec: SubscriptionSpec,
    revoked: BTreeSet<Partition>,
}

struct Sim {
    opt: Options,
    config: MeshConfig,
    rng: Rng,
    client_rng: Rng,
    broker_rng: Rng,
    now: Millis,
    skew: Millis,
    queue: BinaryHeap<Reverse<Scheduled>>,
    seq: u64,
    mesh: Option<Mesh>,
    inc: u32,
    last_emitted: Ticket,
    store_busy: bool,
    tick_at: Option<Millis>,
    broker: Broker,
    store: Store,
    checker: Checker,
    groups: Vec<GroupRt>,
    clients: Vec<Client>,
    published: u32,
    liveness: bool,
    liveness_since: Millis,
    faults: FaultCounts,
    trace: Trace,
    steps: u64,
    effects: Vec<Effect>,
    /// Run the mesh's own invariant check after every step (off with
    /// `UNIMESH_NO_CORE_CHECK=1`, to show the contract checker alone catches a broken core).
    core_check: bool,
}

/// Runs one seed with options drawn for it.
pub fn run_seed(seed: u64, size: Size) -> Result<RunReport, Failure> {
    run(Options::swarm(seed, size))
}

/// Runs one set of options.
pub fn run(opt: Options) -> Result<RunReport, Failure> {
    let mut sim = Sim::new(opt);
    sim.trace.verbose = std::env::var_os("UNIMESH_TRACE").is_some();
    match sim.run() {
        Ok(()) => Ok(RunReport {
            seed: sim.opt.seed,
            steps: sim.steps,
            virtual_ms: sim.now,
            trace_hash: sim.trace.hash(),
            faults: sim.faults.clone(),
            stats: sim.checker.stats.clone(),
            records: u64::from(sim.published),
            dead_letters: sim.store.dlq_len(),
            digest: sim.digest(),
        }),
        Err(violation) => Err(Failure {
            seed: sim.opt.seed,
            violation,
            step: sim.steps,
            now: sim.now,
            options: sim.opt.to_string(),
            trace: sim.trace.last(),
        }),
    }
}

fn violation(clause: Clause, message: String) -> Violation {
    Violation { clause, message }
}

fn topic() -> TopicName {
    TopicName::new("orders").unwrap_or_else(|_| unreachable!("a valid literal name"))
}

const TYPES: [&str; 3] = ["a.created", "a.updated", "b.created"];

impl Sim {
    fn new(opt: Options) -> Self {
        let mut rng = Rng::new(opt.seed);
        let client_rng = rng.fork();
        let broker_rng = rng.fork();
        let config = MeshConfig {
            max_groups: 8,
            max_clients_per_group: 8,
            max_partitions_per_group: 8,
            max_window_per_lane: opt.max_window_per_lane,
            max_ack_ranges_per_lane: opt.max_ack_ranges_per_lane,
            fetch_batch: opt.fetch_batch,
            fetch_retry_ms: 20,
            flush_interval_ms: opt.flush_interval_ms,
            max_outstanding_persists: opt.max_outstanding_persists,
            client_idle_timeout_ms: opt.client_idle_timeout_ms,
            max_replay_per_group: 16,
            commit_to_broker: opt.commit_to_broker,
            limits: SubscriptionLimits {
                max_ack_timeout_ms: 5_000,
                ..SubscriptionLimits::default()
            },
        };
        let checker = Checker::new(config.limits.max_ack_timeout_ms);
        let broker = Broker::new(topic(), opt.partitions);
        Self {
            config,
            rng,
            client_rng,
            broker_rng,
            now: 0,
            skew: 0,
            queue: BinaryHeap::new(),
            seq: 0,
            mesh: None,
            inc: 0,
            last_emitted: 0,
            store_busy: false,
            tick_at: None,
            broker,
            store: Store::default(),
            checker,
            groups: Vec::new(),
            clients: Vec::new(),
            published: 0,
            liveness: false,
            liveness_since: 0,
            faults: FaultCounts::default(),
            trace: Trace::default(),
            steps: 0,
            effects: Vec::new(),
            core_check: std::env::var_os("UNIMESH_NO_CORE_CHECK").is_none(),
            opt,
        }
    }

    fn at(&mut self, delay: Millis, ev: Ev) {
        self.seq += 1;
        self.queue.push(Reverse(Scheduled {
            at: self.now + delay,
            seq: self.seq,
            ev,
        }));
    }

    /// Exponentially distributed delay with the given mean (for fault arrivals).
    fn exp(&mut self, mean: Millis) -> Millis {
        let u = self.rng.unit().max(1e-9);
        ((-u.ln()) * mean as f64) as Millis + 1
    }

    /// The trace hash mixed with the mesh's final stats and views (see `RunReport::digest`).
    fn digest(&self) -> u64 {
        let mut text = format!("{:016x}", self.trace.hash());
        if let Some(mesh) = &self.mesh {
            text.push_str(&format!(
                "|{}|{:?}|{}",
                mesh.epoch(),
                mesh.stats(),
                mesh.outstanding_persists()
            ));
            for name in mesh.group_names() {
                text.push_str(&format!("|{:?}", mesh.group_view(name)));
            }
        }
        crate::trace::fnv1a(text.as_bytes())
    }

    fn note(&mut self, what: &'static str, args: [u64; 4]) {
        self.trace.record(Entry {
            step: self.steps,
            now: self.now,
            what,
            args,
        });
    }

    fn run(&mut self) -> Result<(), Violation> {
        // Records that exist before the groups do: `latest` groups never see them.
        for _ in 0..self.opt.records_before {
            self.publish_one()?;
        }
        let specs = self.specs();
        for (i, spec) in specs.into_iter().enumerate() {
            self.checker.add_group(&spec);
            let gopt = self.opt.groups[i].clone();
            for (c, copt) in gopt.clients.iter().enumerate() {
                let id = ClientId::new(&format!("{}-c{c}", gopt.name))
                    .map_err(|e| violation(Clause::Core, e.to_string()))?;
                self.clients.push(Client::new(i, id, copt.clone()));
            }
            self.groups.push(GroupRt {
                name: spec.group.clone(),
                spec,
                revoked: BTreeSet::new(),
            });
        }
        self.restart()?;
        let f = self.opt.faults.clone();
        self.at(1, Ev::Publish);
        for c in 0..self.clients.len() {
            let d = self.client_rng.range(0, 20);
            self.at(d, Ev::ClientWake { client: c });
        }
        let arrivals = [
            (f.crash_every_ms, Ev::Crash),
            (f.rebalance_every_ms, Ev::Rebalance),
            (f.seek_every_ms, Ev::Seek),
            (f.replay_every_ms, Ev::Replay),
            (f.retention_every_ms, Ev::Retention),
            (f.clock_jump_every_ms, Ev::ClockJump),
        ];
        for (mean, ev) in arrivals {
            if mean > 0 {
                let d = self.exp(mean);
                self.at(d, ev);
            }
        }
        self.at(self.opt.fault_phase_ms, Ev::EndFaults);
        let mut events: u64 = 0;
        while let Some(Reverse(s)) = self.queue.pop() {
            self.now = self.now.max(s.at);
            self.event(s.ev)?;
            events += 1;
            if self.steps > MAX_STEPS || events > 4 * MAX_STEPS {
                return Err(violation(
                    Clause::C1,
                    format!(
                        "livelock: {} steps, {events} events, still at t={}ms: {}",
                        self.steps,
                        self.now,
                        self.lag_report()
                    ),
                ));
            }
            if self.liveness {
                if self.converged() {
                    return self.checker.check_quiescent();
                }
                if self.now > self.liveness_since + LIVENESS_BUDGET_MS || self.steps > MAX_STEPS {
                    return Err(violation(
                        Clause::C1,
                        format!(
                            "no convergence {}ms after faults stopped: {}",
                            self.now - self.liveness_since,
                            self.lag_report()
                        ),
                    ));
                }
            }
        }
        Err(violation(
            Clause::C1,
            "the event queue ran dry before convergence".into(),
        ))
    }

    fn specs(&self) -> Vec<SubscriptionSpec> {
        self.opt
            .groups
            .iter()
            .map(|g| {
                let name = GroupName::new(&g.name).unwrap_or_else(|_| unreachable!("g<digit>"));
                let mut s = SubscriptionSpec::new(name, topic());
                s.filter = Filter {
                    ty: g.type_filter.clone(),
                    ..Filter::default()
                };
                s.ordering = g.ordering;
                s.ack_timeout_ms = g.ack_timeout_ms;
                s.max_attempts = g.max_attempts;
                s.backoff = g.backoff;
                s.max_in_flight_per_client = g.max_in_flight;
                if g.start_latest {
                    // The shell reads the end offsets once, when the group is created.
                    s.start_from = StartFrom::Latest(
                        (0..self.opt.partitions)
                            .map(|p| (p, self.broker.end(p)))
                            .collect(),
                    );
                }
                s
            })
            .collect()
    }

    fn converged(&self) -> bool {
        let Some(mesh) = &self.mesh else {
            return false;
        };
        if !self.checker.converged() || mesh.outstanding_persists() > 0 || self.store.has_pending()
        {
            return false;
        }
        // The durable state alone is not enough: a seek may have moved a lane back after
        // its last checkpoint was written, so the mesh's own lanes must agree.
        self.groups.iter().all(|g| {
            g.revoked.is_empty()
                && mesh.group_view(&g.name).is_some_and(|v| {
                    v.replay
                        .is_none_or(|r| r.in_flight + r.queued + r.backoff == 0)
                        && v.lanes.iter().all(|l| {
                            let end = self.broker.end(l.partition);
                            l.watermark == end
                                // None: not written in this incarnation (the store has it).
                                && l.durable_watermark.is_none_or(|d| d == end)
                                && l.in_flight + l.queued + l.backoff == 0
                        })
                })
        })
    }

    fn lag_report(&self) -> String {
        let mut out = String::new();
        for g in &self.groups {
            for p in 0..self.opt.partitions {
                let wm = self.checker.durable_watermark(&g.name, p);
                out.push_str(&format!(
                    "{}/{p}: durable {:?} end {}; ",
                    g.name,
                    wm,
                    self.broker.end(p)
                ));
            }
            if let Some(v) = self.mesh.as_ref().and_then(|m| m.group_view(&g.name)) {
                for l in &v.lanes {
                    out.push_str(&format!(
                        "[lane {} cursor {} wm {} ranges {:?} in_flight {} queued {} backoff {} fetch {}] ",
                        l.partition, l.cursor, l.watermark, l.ack_ranges, l.in_flight, l.queued, l.backoff, l.fetch_outstanding
                    ));
                }
                out.push_str(&format!("clients {:?}; ", v.clients));
            }
        }
        out
    }

    // ----- driving the mesh -----

    fn mesh_now(&mut self) -> Millis {
        let t = self.now + self.skew;
        if !self.liveness && self.rng.chance(self.opt.faults.clock_glitch) {
            self.faults.clock_glitches += 1;
            return t.saturating_sub(self.rng.range(1, 500));
        }
        t
    }

    /// The time the mesh last acted at: what its deadlines were computed from (a glitched,
    /// earlier time is ignored by the core, so it may lag the harness clock).
    fn core_now(&self) -> Millis {
        self.mesh.as_ref().map_or(self.now + self.skew, Mesh::now)
    }

    /// Feeds one input (no effects drained yet) and checks the mesh's own invariants.
    fn input(&mut self, input: Input) -> Result<Option<Response>, Violation> {
        let t = self.mesh_now();
        let Some(mesh) = self.mesh.as_mut() else {
            return Ok(None);
        };
        self.steps += 1;
        let r = catch_unwind(AssertUnwindSafe(|| mesh.handle(t, input)));
        let response = r.map_err(|e| {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            violation(Clause::Core, format!("the core panicked: {msg}"))
        })?;
        if self.core_check {
            mesh.check_invariants()
                .map_err(|m| violation(Clause::Core, m))?;
        }
        Ok(Some(response))
    }

    /// Carries out every effect the mesh asked for, checking each.
    fn drain(&mut self) -> Result<(), Violation> {
        let Some(mesh) = self.mesh.as_mut() else {
            return Ok(());
        };
        let mut effects = std::mem::take(&mut self.effects);
        while let Some(e) = mesh.poll_effect() {
            effects.push(e);
        }
        let t = self.core_now();
        for e in effects.drain(..) {
            match e {
                Effect::Fetch {
                    group,
                    partition,
                    fetch_id,
                    from,
                    max,
                    ..
                } => {
                    let g = self.group_index(&group)?;
                    self.note("fetch", [g as u64, u64::from(partition), from, max as u64]);
                    let lat = self.broker_rng.range(0, self.opt.faults.fetch_latency_ms);
                    let inc = self.inc;
                    self.at(
                        lat,
                        Ev::FetchAnswer {
                            inc,
                            group: g,
                            partition,
                            fetch_id,
                            from,
                            max,
                            waited: false,
                        },
                    );
                }
                Effect::Deliver {
                    group,
                    client,
                    delivery,
                } => {
                    self.note(
                        "deliver",
                        [
                            delivery.id.lease,
                            u64::from(delivery.id.partition),
                            delivery.id.offset,
                            u64::from(delivery.attempt),
                        ],
                    );
                    self.checker.delivered(t, &group, &client, &delivery)?;
                    self.receive(&group, &client, delivery.id, &delivery.record)?;
                }
                Effect::Persist { ticket, batch } => {
                    self.note(
                        "persist",
                        [
                            ticket,
                            batch.checkpoints.len() as u64,
                            batch.dead_letters.len() as u64,
                            u64::from(batch.epoch.is_some()),
                        ],
                    );
                    self.checker.persist_emitted(ticket, &batch)?;
                    self.last_emitted = self.last_emitted.max(ticket);
                    self.store.submit(ticket, *batch);
                    self.kick_store();
                }
                Effect::Commit {
                    group,
                    partition,
                    offset,
                    ..
                } => {
                    self.note("commit", [0, u64::from(partition), offset, 0]);
                    self.checker.committed(&group, partition, offset)?;
                }
                Effect::BrokerAck {
                    group,
                    partition,
                    handle,
                    ..
                } => {
                    let Some((p, o)) = decode_handle(&handle) else {
                        return Err(violation(
                            Clause::C6,
                            "broker ACK with a handle the broker never gave".into(),
                        ));
                    };
                    self.note(
                        "broker-ack",
                        [0, u64::from(p), o, u64::from(partition == REPLAY_PARTITION)],
                    );
                    if partition != REPLAY_PARTITION && partition != p {
                        return Err(violation(
                            Clause::C6,
                            format!("broker ACK of {p}/{o} sent for partition {partition}"),
                        ));
                    }
                    if partition == REPLAY_PARTITION {
                        self.checker.replay_broker_acked(&group, p, o)?;
                    } else {
                        self.checker.broker_acked(&group, p, o)?;
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
                    self.note("skipped", [0, u64::from(partition), from, to]);
                    self.checker.skipped(&group, partition, from, to, reason)?;
                }
                other => {
                    return Err(violation(Clause::Core, format!("unknown effect {other:?}")));
                }
            }
        }
        self.effects = effects;
        self.schedule_tick();
        Ok(())
    }

    /// Fires every due timer first, so effects of timers are not mistaken for effects of the
    /// next input (the core fires due timers at the start of every `handle`; a flush fired
    /// by a seek's `handle` carries the lane as it was before the seek).
    fn fire_due_timers(&mut self) -> Result<(), Violation> {
        for _ in 0..8 {
            let due = self
                .mesh
                .as_ref()
                .and_then(Mesh::poll_timeout)
                .is_some_and(|t| t <= self.now + self.skew);
            if !due {
                break;
            }
            self.note("tick", [1, 0, 0, 0]);
            self.input(Input::Tick)?;
            self.drain()?;
        }
        Ok(())
    }

    fn schedule_tick(&mut self) {
        let Some(t) = self.mesh.as_ref().and_then(Mesh::poll_timeout) else {
            return;
        };
        let at = t.saturating_sub(self.skew).max(self.now);
        if self.tick_at.is_none_or(|p| at < p) {
            self.tick_at = Some(at);
            self.at(at - self.now, Ev::Tick);
        }
    }

    fn kick_store(&mut self) {
        if !self.store_busy && self.store.has_pending() {
            self.store_busy = true;
            let lat = self.broker_rng.range(0, self.opt.faults.persist_latency_ms);
            let inc = self.inc;
            self.at(lat, Ev::StoreWork { inc });
        }
    }

    fn group_index(&self, name: &GroupName) -> Result<usize, Violation> {
        self.groups
            .iter()
            .position(|g| g.name == *name)
            .ok_or_else(|| violation(Clause::C7, format!("effect for unknown group {name}")))
    }

    fn client_index(&self, g: usize, id: &ClientId) -> Option<usize> {
        self.clients
            .iter()
            .position(|c| c.group == g && c.id == *id)
    }

    // ----- events -----

    fn event(&mut self, ev: Ev) -> Result<(), Violation> {
        match ev {
            Ev::Publish => {
                if self.published < self.opt.records_before + self.opt.records {
                    self.publish_one()?;
                    let gap =
                        (2 * self.opt.fault_phase_ms / u64::from(self.opt.records.max(1))).max(1);
                    let d = self.rng.range(0, gap);
                    self.at(d, Ev::Publish);
                }
            }
            Ev::FetchAnswer {
                inc,
                group,
                partition,
                fetch_id,
                from,
                max,
                waited,
            } => {
                if inc != self.inc || self.mesh.is_none() {
                    return Ok(());
                }
                let honest = self.broker.fetch(partition, from, max);
                if !waited && matches!(&honest, FetchResult::Records(r) if r.is_empty()) {
                    // Long poll: the broker holds an empty fetch a while before answering.
                    let wait = self.opt.broker_wait_ms;
                    self.at(
                        wait,
                        Ev::FetchAnswer {
                            inc,
                            group,
                            partition,
                            fetch_id,
                            from,
                            max,
                            waited: true,
                        },
                    );
                    return Ok(());
                }
                let (result, how) = if self.liveness {
                    (honest, FetchDistortion::None)
                } else {
                    let earliest = self.broker.earliest(partition);
                    let end = self.broker.end(partition);
                    let broker = &self.broker;
                    distort_fetch(
                        &mut self.broker_rng,
                        &self.opt.faults,
                        honest,
                        earliest,
                        end,
                        from,
                        |start| broker.records(partition, start, from).to_vec(),
                    )
                };
                match how {
                    FetchDistortion::None => {}
                    FetchDistortion::Failed => self.faults.fetch_failures += 1,
                    FetchDistortion::SpuriousOutOfRange => self.faults.spurious_out_of_range += 1,
                    FetchDistortion::Rewound => self.faults.fetch_rewinds += 1,
                    FetchDistortion::Duplicated => self.faults.fetch_duplicates += 1,
                }
                if !self.liveness && self.broker_rng.chance(self.opt.faults.fetch_answer_twice) {
                    self.faults.answers_twice += 1;
                    let d = self.broker_rng.range(0, 100);
                    self.at(
                        d,
                        Ev::FetchRepeat {
                            inc,
                            group,
                            partition,
                            fetch_id,
                            result: result.clone(),
                        },
                    );
                }
                self.fetched(group, partition, fetch_id, result)?;
            }
            Ev::FetchRepeat {
                inc,
                group,
                partition,
                fetch_id,
                result,
            } => {
                if inc == self.inc {
                    self.fetched(group, partition, fetch_id, result)?;
                }
            }
            Ev::StoreWork { inc } => {
                if inc != self.inc {
                    return Ok(());
                }
                self.store_busy = false;
                if !self.liveness && self.rng.chance(self.opt.faults.persist_fail) {
                    if let Some(ticket) = self.store.fail_front() {
                        self.faults.persist_failures += 1;
                        self.note("persist-failed", [ticket, 0, 0, 0]);
                        self.checker.persist_failed(ticket);
                        self.input(Input::PersistFailed { ticket })?;
                        self.drain()?;
                    }
                } else if let Some((ticket, batch)) = self.store.apply_front() {
                    self.note("persisted", [ticket, 0, 0, 0]);
                    self.checker.persist_applied(ticket, &batch)?;
                    self.checker.persist_notified(ticket);
                    self.input(Input::Persisted { ticket })?;
                    self.drain()?;
                }
                self.kick_store();
            }
            Ev::Tick => {
                if self.tick_at.is_some_and(|t| t <= self.now) {
                    self.tick_at = None;
                }
                let due = self
                    .mesh
                    .as_ref()
                    .and_then(Mesh::poll_timeout)
                    .is_some_and(|t| t <= self.now + self.skew);
                if due {
                    let pt = self.mesh.as_ref().and_then(Mesh::poll_timeout).unwrap_or(0);
                    let cn = self.core_now();
                    self.note("tick", [0, pt, cn, self.skew]);
                    self.input(Input::Tick)?;
                    self.drain()?;
                } else {
                    self.schedule_tick();
                }
            }
            Ev::ClientWake { client } => self.client_wake(client)?,
            Ev::ClientSettle { client, id, kind } => self.client_settle(client, id, kind)?,
            Ev::Crash => {
                if !self.liveness {
                    if self.mesh.is_some() {
                        self.crash()?;
                    }
                    let mean = self.opt.faults.crash_every_ms;
                    let d = self.exp(mean);
                    self.at(d, Ev::Crash);
                }
            }
            Ev::Restart => {
                if self.mesh.is_none() {
                    self.restart()?;
                }
            }
            Ev::Rebalance => {
                if !self.liveness {
                    self.rebalance()?;
                    let mean = self.opt.faults.rebalance_every_ms;
                    let d = self.exp(mean);
                    self.at(d, Ev::Rebalance);
                }
            }
            Ev::Reassign {
                inc,
                group,
                partition,
                after_ticket,
            } => {
                if inc != self.inc || self.mesh.is_none() {
                    return Ok(());
                }
                if self.store.front_ticket().is_some_and(|t| t <= after_ticket) {
                    // The shell waits until what the old owner wrote is durable, then reads it.
                    self.at(
                        5,
                        Ev::Reassign {
                            inc,
                            group,
                            partition,
                            after_ticket,
                        },
                    );
                    return Ok(());
                }
                self.reassign(group, partition)?;
            }
            Ev::Seek => {
                if !self.liveness {
                    self.seek()?;
                    let mean = self.opt.faults.seek_every_ms;
                    let d = self.exp(mean);
                    self.at(d, Ev::Seek);
                }
            }
            Ev::Replay => {
                if !self.liveness {
                    self.replay()?;
                    let mean = self.opt.faults.replay_every_ms;
                    let d = self.exp(mean);
                    self.at(d, Ev::Replay);
                }
            }
            Ev::Retention => {
                if !self.liveness {
                    self.retention()?;
                    let mean = self.opt.faults.retention_every_ms;
                    let d = self.exp(mean);
                    self.at(d, Ev::Retention);
                }
            }
            Ev::ClockJump => {
                if !self.liveness {
                    self.faults.clock_jumps += 1;
                    let j = self.rng.range(500, 20_000);
                    self.skew += j;
                    self.note("clock-jump", [j, 0, 0, 0]);
                    self.input(Input::Tick)?;
                    self.drain()?;
                    let mean = self.opt.faults.clock_jump_every_ms;
                    let d = self.exp(mean);
                    self.at(d, Ev::ClockJump);
                }
            }
            Ev::EndFaults => {
                self.note("end-faults", [0; 4]);
                self.liveness = true;
                self.liveness_since = self.now;
                while self.published < self.opt.records_before + self.opt.records {
                    self.publish_one()?;
                }
                if self.mesh.is_none() {
                    self.at(0, Ev::Restart);
                }
            }
        }
        Ok(())
    }

    fn publish_one(&mut self) -> Result<(), Violation> {
        let n = self.published;
        self.published += 1;
        let key = self.rng.below(u64::from(self.opt.keys));
        // Key-partitioned, as producers with a partition key are.
        let p = (key % u64::from(self.opt.partitions)) as Partition;
        let p = if self.rng.chance(0.3) {
            self.rng.below(u64::from(self.opt.partitions)) as Partition
        } else {
            p
        };
        let meta = if self.rng.chance(self.opt.undecodable) {
            self.faults.undecodable_records += 1;
            RecordMeta::Undecodable(Arc::from("not a CloudEvent"))
        } else {
            RecordMeta::Event(Arc::new(EventMeta {
                id: format!("e{n}"),
                source: "/sim".into(),
                ty: TYPES[self.rng.index(TYPES.len())].into(),
                subject: None,
                partition_key: Some(format!("k{key}")),
                extensions: Vec::new(),
            }))
        };
        let poison = self.rng.chance(self.opt.poison);
        if poison {
            self.faults.poison_records += 1;
        }
        let body = Bytes::from_static(if poison { b"poison" } else { b"ok" });
        let record = self.broker.publish(p, meta, body, self.opt.pop);
        self.note(
            "publish",
            [u64::from(p), record.offset, u64::from(poison), 0],
        );
        let t = topic();
        self.checker.published(&t, p, &record)?;
        self.checker
            .publish_answered(&t, true, Some((p, record.offset)))
    }

    fn fetched(
        &mut self,
        group: usize,
        partition: Partition,
        fetch_id: u64,
        result: FetchResult,
    ) -> Result<(), Violation> {
        let (what, a, b) = match &result {
            FetchResult::Records(r) => {
                ("fetched", r.len() as u64, r.first().map_or(0, |r| r.offset))
            }
            FetchResult::OutOfRange { earliest, end } => ("out-of-range", *earliest, *end),
            FetchResult::Failed { .. } => ("fetch-failed", 0, 0),
        };
        self.note(what, [group as u64, u64::from(partition), a, b]);
        let name = self.groups[group].name.clone();
        self.input(Input::Fetched {
            group: name,
            partition,
            fetch_id,
            result,
        })?;
        self.drain()
    }

    fn receive(
        &mut self,
        group: &GroupName,
        client: &ClientId,
        id: DeliveryId,
        record: &Record,
    ) -> Result<(), Violation> {
        let g = self.group_index(group)?;
        let Some(c) = self.client_index(g, client) else {
            return Err(violation(
                Clause::C8,
                format!("delivery to {client}, which never polled"),
            ));
        };
        if !self.liveness && self.client_rng.chance(self.opt.faults.delivery_lost) {
            self.faults.deliveries_lost += 1;
            return Ok(());
        }
        let poison = record.body.as_ref() == b"poison";
        let timeout = self.groups[g].spec.ack_timeout_ms;
        let (plan, behaviour) =
            self.clients[c].plan(&mut self.client_rng, poison, timeout, self.liveness);
        match behaviour {
            Behaviour::Ack => {}
            Behaviour::LateAck => self.faults.late_acks += 1,
            Behaviour::DoubleAck => self.faults.double_acks += 1,
            Behaviour::Nack => self.faults.nacks += 1,
            Behaviour::Ignore => self.faults.ignored += 1,
            Behaviour::Extend => self.faults.extends += 1,
        }
        let cl = &mut self.clients[c];
        cl.held.insert(id);
        cl.remember(id);
        for (after, kind) in plan {
            self.at(
                after,
                Ev::ClientSettle {
                    client: c,
                    id,
                    kind,
                },
            );
        }
        Ok(())
    }

    fn client_wake(&mut self, c: usize) -> Result<(), Violation> {
        let wake = self.clients[c].opts.wake_ms;
        let d = self.client_rng.range(1, wake);
        self.at(d, Ev::ClientWake { client: c });
        if self.mesh.is_none() {
            return Ok(());
        }
        let g = self.clients[c].group;
        let group = self.groups[g].name.clone();
        let id = self.clients[c].id.clone();
        let opts = self.clients[c].opts.clone();
        if !self.liveness && self.clients[c].connected && self.client_rng.chance(opts.disconnect) {
            self.faults.disconnects += 1;
            self.clients[c].connected = false;
            self.note("client-gone", [c as u64, 0, 0, 0]);
            self.input(Input::ClientGone {
                group: group.clone(),
                client: id.clone(),
            })?;
            let t = self.core_now();
            self.checker.client_gone(t, &group, &id);
            self.drain()?;
            return Ok(());
        }
        if !self.clients[c].connected && !self.liveness && self.client_rng.chance(0.5) {
            // Stays away a little longer.
            return Ok(());
        }
        self.clients[c].connected = true;
        let max = if self.liveness {
            opts.poll_max.max(1)
        } else {
            self.client_rng.range(0, u64::from(opts.poll_max)) as u32
        };
        self.note("poll", [c as u64, u64::from(max), 0, 0]);
        let r = self.input(Input::ClientPoll {
            group: group.clone(),
            client: id.clone(),
            max,
        })?;
        self.checker
            .client_poll(&group, &id, max, r == Some(Response::Ok));
        self.drain()?;
        if self.liveness {
            return Ok(());
        }
        if self.client_rng.chance(opts.stale_ack) {
            if let Some(old) = self.clients[c].past_id(&mut self.client_rng) {
                self.faults.stale_acks += 1;
                self.settle(c, vec![old], SettleKind::Ack)?;
            }
        }
        if self.client_rng.chance(opts.bogus_ack) {
            self.faults.bogus_acks += 1;
            let epoch = self.mesh.as_ref().map_or(1, Mesh::epoch);
            let bogus = DeliveryId {
                epoch: epoch + self.client_rng.below(2) as u32,
                lease: self.client_rng.range(0, 40),
                partition: self.client_rng.below(4) as u32,
                offset: self.client_rng.range(0, 300),
                attempt: self.client_rng.range(0, 6) as u32,
            };
            self.settle(c, vec![bogus], SettleKind::Ack)?;
        }
        if self.client_rng.chance(self.opt.faults.flush_now) {
            self.faults.flush_nows += 1;
            self.input(Input::FlushNow)?;
            self.drain()?;
        }
        Ok(())
    }

    fn client_settle(
        &mut self,
        c: usize,
        id: DeliveryId,
        kind: SettleKind,
    ) -> Result<(), Violation> {
        if matches!(kind, SettleKind::Ack | SettleKind::Nack(_)) {
            self.clients[c].held.remove(&id);
        }
        self.settle(c, vec![id], kind)
    }

    fn settle(
        &mut self,
        c: usize,
        ids: Vec<DeliveryId>,
        kind: SettleKind,
    ) -> Result<(), Violation> {
        if self.mesh.is_none() {
            return Ok(());
        }
        let group = self.groups[self.clients[c].group].name.clone();
        let (what, first) = match kind {
            SettleKind::Ack => ("ack", ids[0]),
            SettleKind::Nack(_) => ("nack", ids[0]),
            SettleKind::Extend(_) => ("extend", ids[0]),
        };
        self.note(
            what,
            [
                u64::from(first.epoch) << 32 | first.lease,
                u64::from(first.partition),
                first.offset,
                u64::from(first.attempt),
            ],
        );
        let input = match kind {
            SettleKind::Ack => Input::Ack {
                group: group.clone(),
                ids: ids.clone(),
            },
            SettleKind::Nack(delay_ms) => Input::Nack {
                group: group.clone(),
                ids: ids.clone(),
                delay_ms,
            },
            SettleKind::Extend(extend_ms) => Input::Extend {
                group: group.clone(),
                ids: ids.clone(),
                extend_ms,
            },
        };
        let Some(response) = self.input(input)? else {
            return Ok(());
        };
        let t = self.core_now();
        if let Response::Settled(v) = &response {
            let code = match v.first() {
                Some(unimesh_core::Settle::Accepted) => 0,
                Some(unimesh_core::Settle::Rejected(r)) => 1 + *r as u64,
                None => 9,
            };
            self.note("settled", [code, 0, 0, 0]);
        }
        self.checker.settled(t, &group, kind, &ids, &response)?;
        self.drain()
    }

    fn crash(&mut self) -> Result<(), Violation> {
        self.faults.crashes += 1;
        if self.rng.chance(self.opt.faults.crash_mid_persist) {
            // The write reached the disk; the process died before hearing so.
            if let Some((ticket, batch)) = self.store.apply_front() {
                self.faults.crashes_mid_persist += 1;
                self.checker.persist_applied(ticket, &batch)?;
            }
        }
        self.note("crash", [u64::from(self.inc), 0, 0, 0]);
        self.mesh = None;
        self.store.crash();
        self.store_busy = false;
        self.tick_at = None;
        self.inc += 1;
        self.last_emitted = 0;
        let t = self.core_now();
        self.checker.crashed(t);
        for g in &mut self.groups {
            g.revoked.clear();
        }
        let d = self.rng.range(0, self.opt.faults.restart_after_ms);
        self.at(d, Ev::Restart);
        Ok(())
    }

    fn restart(&mut self) -> Result<(), Violation> {
        let recovered = self.store.recovered().map_err(|e| {
            violation(
                Clause::Core,
                format!("the store holds a checkpoint the core cannot read: {e}"),
            )
        })?;
        let t = self.core_now();
        let mut mesh = Mesh::new(self.config.clone(), recovered, t)
            .map_err(|e| violation(Clause::Core, format!("recovery refused: {e}")))?;
        mesh.check_every_step = false;
        self.inc += 1;
        self.checker.started(t, mesh.epoch())?;
        self.note("start", [u64::from(mesh.epoch()), 0, 0, 0]);
        self.mesh = Some(mesh);
        self.drain()?;
        for g in 0..self.groups.len() {
            let spec = self.groups[g].spec.clone();
            let name = spec.group.clone();
            let r = self.input(Input::Subscribe(spec))?;
            if r != Some(Response::Ok) {
                return Err(violation(
                    Clause::Core,
                    format!("subscribe {name} answered {r:?}"),
                ));
            }
            let partitions = (0..self.opt.partitions)
                .map(|p| Assignment {
                    partition: p,
                    earliest: self.broker.earliest(p),
                    end: self.broker.end(p),
                    checkpoint: None,
                })
                .collect();
            let r = self.input(Input::PartitionsAssigned {
                group: name.clone(),
                partitions,
            })?;
            if r != Some(Response::Ok) {
                return Err(violation(
                    Clause::Core,
                    format!("assign {name} answered {r:?}"),
                ));
            }
            for p in 0..self.opt.partitions {
                self.checker.assigned(&name, p);
            }
            self.groups[g].revoked.clear();
            self.drain()?;
        }
        // Clients find out the mesh restarted when their next poll registers them anew.
        for c in &mut self.clients {
            c.connected = false;
        }
        Ok(())
    }

    fn rebalance(&mut self) -> Result<(), Violation> {
        if self.mesh.is_none() {
            return Ok(());
        }
        let g = self.rng.index(self.groups.len());
        let p = self.rng.below(u64::from(self.opt.partitions)) as Partition;
        if self.groups[g].revoked.contains(&p) {
            return Ok(());
        }
        self.faults.rebalances += 1;
        self.fire_due_timers()?;
        let name = self.groups[g].name.clone();
        self.note("revoke", [g as u64, u64::from(p), 0, 0]);
        self.input(Input::PartitionsRevoked {
            group: name.clone(),
            partitions: vec![p],
        })?;
        let t = self.core_now();
        self.checker.revoked(t, &name, p);
        self.groups[g].revoked.insert(p);
        self.drain()?;
        let d = self.rng.range(0, 300);
        let inc = self.inc;
        let after_ticket = self.last_emitted;
        self.at(
            d,
            Ev::Reassign {
                inc,
                group: g,
                partition: p,
                after_ticket,
            },
        );
        Ok(())
    }

    fn reassign(&mut self, g: usize, p: Partition) -> Result<(), Violation> {
        if !self.groups[g].revoked.remove(&p) {
            return Ok(());
        }
        let name = self.groups[g].name.clone();
        let checkpoint = self
            .store
            .checkpoint(&name, p)
            .map_err(|e| violation(Clause::Core, format!("unreadable checkpoint: {e}")))?;
        self.note(
            "assign",
            [g as u64, u64::from(p), u64::from(checkpoint.is_some()), 0],
        );
        let r = self.input(Input::PartitionsAssigned {
            group: name.clone(),
            partitions: vec![Assignment {
                partition: p,
                earliest: self.broker.earliest(p),
                end: self.broker.end(p),
                checkpoint,
            }],
        })?;
        if r != Some(Response::Ok) {
            return Err(violation(
                Clause::Core,
                format!("reassign {name}/{p} answered {r:?}"),
            ));
        }
        self.checker.assigned(&name, p);
        self.drain()
    }

    fn seek(&mut self) -> Result<(), Violation> {
        if self.mesh.is_none() {
            return Ok(());
        }
        let g = self.rng.index(self.groups.len());
        let p = self.rng.below(u64::from(self.opt.partitions)) as Partition;
        if self.groups[g].revoked.contains(&p) {
            return Ok(());
        }
        let earliest = self.broker.earliest(p);
        let end = self.broker.end(p);
        let offset = self.rng.range(earliest.saturating_sub(2), end);
        self.faults.seeks += 1;
        self.fire_due_timers()?;
        let name = self.groups[g].name.clone();
        self.note("seek", [g as u64, u64::from(p), offset, 0]);
        let r = self.input(Input::Seek {
            group: name.clone(),
            partition: p,
            offset,
        })?;
        if r == Some(Response::Ok) {
            let t = self.core_now();
            self.checker.sought(t, &name, p, offset);
        }
        self.drain()
    }

    fn replay(&mut self) -> Result<(), Violation> {
        if self.mesh.is_none() {
            return Ok(());
        }
        let g = self.rng.index(self.groups.len());
        let name = self.groups[g].name.clone();
        let max = self.rng.range(1, 6) as usize;
        let records = self.store.dead_letters(&name, max);
        if records.is_empty() {
            return Ok(());
        }
        self.faults.replays += 1;
        self.note("replay", [g as u64, records.len() as u64, 0, 0]);
        self.input(Input::Replay {
            group: name,
            records,
        })?;
        self.drain()
    }

    fn retention(&mut self) -> Result<(), Violation> {
        // Retention starts once every lane's start is durable: a group that never had a
        // durable position legitimately starts at whatever is earliest then.
        let all_pinned = self
            .groups
            .iter()
            .all(|g| (0..self.opt.partitions).all(|p| self.checker.is_pinned(&g.name, p)));
        if !all_pinned {
            return Ok(());
        }
        let p = self.rng.below(u64::from(self.opt.partitions)) as Partition;
        let earliest = self.broker.earliest(p);
        let end = self.broker.end(p);
        if end <= earliest {
            return Ok(());
        }
        let to = earliest + self.rng.range(1, ((end - earliest) / 2).max(1));
        self.faults.retention_runs += 1;
        self.note("retention", [u64::from(p), to, 0, 0]);
        self.broker.delete_below(p, to);
        self.checker.retention(&topic(), p, self.broker.earliest(p));
        Ok(())
    }
}
