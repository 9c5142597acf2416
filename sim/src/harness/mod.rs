//! The discrete-event harness: one seeded, single-threaded run of the pure core against the
//! model broker, store and clients, with faults drawn from the seed, checked at every step
//! by the mesh's own invariants and by the contract [`Checker`].
//!
//! A run has two phases. During the fault phase everything may go wrong. Then faults stop
//! (TigerBeetle's liveness mode): the mesh restarts if it is down, revoked partitions come
//! back, clients reconnect and ACK every healthy record in time, and the run must converge
//! — every lane durably done up to the end of the log — within a time budget, after which
//! the quiescent checks (C1 liveness, DLQ, C6, the duplicate bound) run.
//!
//! # Layout
//! `Sim` and its run loop are here; the rest is one file per concern, each an
//! `impl Sim` block:
//! - `queue`: the events and the queue that orders them (`Sim::at`);
//! - `events`: one handler per kind of event, dispatched;
//! - `mesh`: driving the mesh — the time it is given, one input at a time, its timers;
//! - `effects`: draining effects, one function per kind;
//! - `broker`: publishing, and fetches answered (long poll, distortions, answers twice);
//! - `store`: the store applying or failing persists;
//! - `clients`: polls, deliveries received, settles, disconnects, stale and bogus ACKs;
//! - `faults/`: recurring faults — `crash` (and restart), `rebalance`, `operator` (seek,
//!   DLQ replay), `retention`, and clock jumps;
//! - `liveness`: the end of faults, convergence, the verdict;
//! - `report`: what a run reports, and its digest.
//!
//! # Determinism
//! A run is a pure function of its options: three RNGs forked from the seed (`rng` for
//! records and faults of the environment, `client_rng` for the clients, `broker_rng` for
//! the latencies of broker and store and the broker's distortions), drawn in program order;
//! events at equal times run in the order they were scheduled. The order of draws is what `tests/trace_hashes.txt`
//! holds the harness to: moving a draw changes the hashes.

use std::cmp::Reverse;
use std::collections::{BTreeSet, BinaryHeap};

use unimesh_core::{
    ClientId, Effect, Filter, GroupName, Mesh, MeshConfig, Millis, Partition, StartFrom,
    SubscriptionLimits, SubscriptionSpec, Ticket, TopicName,
};

use crate::checker::{Checker, Clause, Violation};
use crate::faults::FaultCounts;
use crate::model::broker::Broker;
use crate::model::client::Client;
use crate::model::store::Store;
use crate::options::{Options, Size};
use crate::rng::Rng;
use crate::trace::{Entry, Trace};

mod broker;
mod clients;
mod effects;
mod events;
mod faults;
mod liveness;
mod mesh;
mod queue;
mod report;
mod store;

pub use report::{Failure, RunReport};

use queue::{Ev, Scheduled};

/// A hard cap on steps, so a livelock cannot hang a sweep.
const MAX_STEPS: u64 = 3_000_000;

/// What the harness keeps of one group: its definition and the partitions it lost.
struct GroupRt {
    name: GroupName,
    spec: SubscriptionSpec,
    revoked: BTreeSet<Partition>,
}

/// One run: the mesh (None while it is down), the models, the checker, the event queue.
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

/// A violation found by the harness itself (not by the checker).
fn violation(clause: Clause, message: String) -> Violation {
    Violation { clause, message }
}

/// The one topic of a run.
fn topic() -> TopicName {
    TopicName::new("orders").unwrap_or_else(|_| unreachable!("a valid literal name"))
}

impl Sim {
    /// A run of `opt` before its first event: the RNGs forked from the seed, the mesh's
    /// configuration drawn from the options, the models empty.
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

    /// Records one step in the trace (its hash and the ring of last steps).
    fn note(&mut self, what: &'static str, args: [u64; 4]) {
        self.trace.record(Entry {
            step: self.steps,
            now: self.now,
            what,
            args,
        });
    }

    /// The run loop: events in time order until the run converges after faults stopped, a
    /// violation is found, or the step cap is hit.
    fn run(&mut self) -> Result<(), Violation> {
        self.set_up()?;
        self.at(1, Ev::Publish);
        for c in 0..self.clients.len() {
            let d = self.client_rng.range(0, 20);
            self.at(d, Ev::ClientWake { client: c });
        }
        self.schedule_fault_arrivals();
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
                if let Some(verdict) = self.liveness_verdict() {
                    return verdict;
                }
            }
        }
        Err(violation(
            Clause::C1,
            "the event queue ran dry before convergence".into(),
        ))
    }

    /// The world before the first event: records that exist before the groups do
    /// (`latest` groups never see them), the groups and their clients, the first
    /// incarnation.
    fn set_up(&mut self) -> Result<(), Violation> {
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
        self.restart()
    }

    /// The groups' definitions, as drawn in the options.
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

    /// The index of the group named `name`.
    fn group_index(&self, name: &GroupName) -> Result<usize, Violation> {
        self.groups
            .iter()
            .position(|g| g.name == *name)
            .ok_or_else(|| violation(Clause::C7, format!("effect for unknown group {name}")))
    }
}
