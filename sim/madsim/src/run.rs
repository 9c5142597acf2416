//! One run of one seed: a madsim runtime seeded with it, a mesh node (several in the group
//! shape) running the real engine on simulated storage, a node of model clients, faults
//! for a while, then liveness: faults stop, every node is up, clients behave, and the run
//! must converge — every record ACKed, dead-lettered or reported skipped by every matching
//! group, durably — within a budget; the checker's quiescence check closes it.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use madsim::runtime::{Handle, Runtime};
use madsim_tokio as tokio;
use unimesh_core::{
    Backoff, ClientId, Filter, GroupName, Millis, StartFrom, SubscriptionSpec, TopicName,
};
use unimesh_sim::checker::CheckerStats;
use unimesh_sim::rng::Rng;
use unimesh_sim::{Clause, Violation};

use crate::clients::{publish, Poller};
use crate::counts::Counts;
use crate::node::{call_on, node_main};
use crate::operators::{clock_jumps, foreign_writer, heartbeat_losses, kills, operator, pauses};
use crate::options::Options;
use crate::storage::{Backend, KafkaBackend, MemoryBackend};
use crate::world::{violation, World};

/// How long, once faults stopped, a run may take to converge (simulated time).
const LIVENESS_BUDGET_MS: Millis = 120_000;

/// What a passing run did.
#[derive(Clone, Debug)]
pub struct Report {
    pub seed: u64,
    /// Inputs the engine fed its mesh.
    pub steps: u64,
    pub incarnations: u32,
    /// Simulated time the run took.
    pub sim_ms: Millis,
    pub trace_hash: u64,
    pub counts: Counts,
    pub stats: CheckerStats,
}

/// A failing run: everything needed to understand and replay it.
#[derive(Clone, Debug)]
pub struct Failure {
    pub seed: u64,
    pub violation: Violation,
    pub options: String,
    pub last_steps: Vec<String>,
    pub trace_hash: u64,
    pub counts: Counts,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "seed {} failed: {}", self.seed, self.violation)?;
        write!(f, "{}", self.options)?;
        writeln!(f, "  injected: {}", self.counts)?;
        writeln!(f, "  trace hash {:016x}; last steps:", self.trace_hash)?;
        // The replay command is the sweep's to print (`sweep::sweep`): it knows the shape's
        // test, which this failure does not.
        for s in &self.last_steps {
            writeln!(f, "    {s}")?;
        }
        Ok(())
    }
}

type Slot = Arc<Mutex<Option<Arc<World>>>>;

/// Makes the storage of a run, inside its runtime (so it may build nodes of its own).
pub type MakeBackend = fn(&Options) -> Arc<dyn Backend>;

/// A shape of the simulation: how its options are drawn from a seed, and its storage.
#[derive(Clone, Copy)]
pub struct Shape {
    pub options: fn(u64) -> Options,
    pub backend: MakeBackend,
}

/// The Kafka group shape: two or three mesh nodes on one simulated broker, under the
/// harness's group coordinator (`Options::swarm_cluster`), with pauses and lost heartbeats.
pub const GROUPS: Shape = Shape {
    options: Options::swarm_cluster,
    backend: kafka_backend,
};

/// The embedded shape: simulated log and the shell's memory state store.
pub fn memory_backend(opts: &Options) -> Arc<dyn Backend> {
    Arc::new(MemoryBackend::new(opts.partitions))
}

/// The Kafka shape: the shell's Kafka port against madsim-rdkafka's simulated broker.
pub fn kafka_backend(opts: &Options) -> Arc<dyn Backend> {
    Arc::new(KafkaBackend::new(opts))
}

/// The first mesh node's address (a broker's clients need one to connect from); node `i`
/// has the next `i`th.
pub const MESH_IP: [u8; 4] = [10, 0, 0, 2];

/// Runs one seed to its end on [`memory_backend`].
pub fn run_seed(seed: u64) -> Result<Report, Box<Failure>> {
    run_seed_on(seed, memory_backend)
}

/// Runs one seed to its end on the storage `make` builds.
pub fn run_seed_on(seed: u64, make: MakeBackend) -> Result<Report, Box<Failure>> {
    run_shape(
        seed,
        Shape {
            options: Options::swarm,
            backend: make,
        },
    )
}

/// Runs one seed of `shape` to its end, on a thread of its own: std's `HashMap` keys are
/// per thread, and madsim seeds them only in a thread's first runtime, so a seed run after
/// others on one thread would iterate maps (madsim-rdkafka's broker keeps its topics in
/// one) in another order than the same seed run alone — a sweep's failure would not
/// replay.
pub fn run_shape(seed: u64, shape: Shape) -> Result<Report, Box<Failure>> {
    std::thread::spawn(move || run_here(seed, shape))
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// [`run_shape`] on the calling thread.
fn run_here(seed: u64, shape: Shape) -> Result<Report, Box<Failure>> {
    let slot: Slot = Arc::new(Mutex::new(None));
    let mut rt = Runtime::with_seed_and_config(seed, madsim::Config::default());
    // A run that goes on this long (simulated) is stuck, not slow.
    rt.set_time_limit(Duration::from_secs(3_600));
    let s = slot.clone();
    match catch_unwind(AssertUnwindSafe(|| rt.block_on(simulate(Some(s), shape)))) {
        Ok(outcome) => outcome,
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "a panic".to_owned());
            let world = slot.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let v = violation(Clause::Core, format!("panicked: {message}"));
            Err(match world {
                Some(w) => failure(&w, v),
                None => Box::new(Failure {
                    seed,
                    violation: v,
                    options: (shape.options)(seed).to_string(),
                    last_steps: Vec::new(),
                    trace_hash: 0,
                    counts: Counts::default(),
                }),
            })
        }
    }
}

/// Runs one seed twice under madsim's determinism check (every random draw of the second
/// run must equal the first's), then compares the two trace hashes.
pub fn check_determinism(seed: u64) -> Result<Report, Box<Failure>> {
    let first = Runtime::check_determinism(seed, madsim::Config::default(), || {
        simulate(None, shape_of(memory_backend))
    })?;
    same_trace_again(seed, first, shape_of(memory_backend))
}

/// [`check_determinism`] on [`kafka_backend`] (madsim wants a plain function to run twice).
pub fn check_determinism_kafka(seed: u64) -> Result<Report, Box<Failure>> {
    let first = Runtime::check_determinism(seed, madsim::Config::default(), || {
        simulate(None, shape_of(kafka_backend))
    })?;
    same_trace_again(seed, first, shape_of(kafka_backend))
}

/// [`check_determinism`] on the group shape ([`GROUPS`]).
pub fn check_determinism_groups(seed: u64) -> Result<Report, Box<Failure>> {
    let first =
        Runtime::check_determinism(seed, madsim::Config::default(), || simulate(None, GROUPS))?;
    same_trace_again(seed, first, GROUPS)
}

/// The one-node shape on `make`'s storage.
fn shape_of(make: MakeBackend) -> Shape {
    Shape {
        options: Options::swarm,
        backend: make,
    }
}

/// Runs `seed` once more on `shape` and compares its trace hash with `first`'s.
fn same_trace_again(seed: u64, first: Report, shape: Shape) -> Result<Report, Box<Failure>> {
    let second = run_shape(seed, shape)?;
    if first.trace_hash != second.trace_hash {
        return Err(Box::new(Failure {
            seed,
            violation: violation(
                Clause::Core,
                format!(
                    "the same seed gave trace hashes {:016x} and {:016x}",
                    first.trace_hash, second.trace_hash
                ),
            ),
            options: (shape.options)(seed).to_string(),
            last_steps: Vec::new(),
            trace_hash: second.trace_hash,
            counts: second.counts,
        }));
    }
    Ok(first)
}

fn failure(world: &World, v: Violation) -> Box<Failure> {
    Box::new(Failure {
        seed: world.opts.seed,
        violation: v,
        options: world.opts.to_string(),
        last_steps: world.last_steps(),
        trace_hash: world.trace_hash(),
        counts: world.counts(),
    })
}

pub(crate) fn topic() -> TopicName {
    TopicName::new("orders").unwrap_or_else(|_| unreachable!("a valid name"))
}

fn spec(opts: &Options, i: usize) -> Option<SubscriptionSpec> {
    let g = &opts.groups[i];
    let mut s = SubscriptionSpec::new(GroupName::new(&g.name).ok()?, topic());
    s.filter = Filter {
        ty: g.type_filter.clone(),
        ..Filter::default()
    };
    s.ordering = g.ordering;
    s.ack_timeout_ms = g.ack_timeout_ms;
    s.max_attempts = g.max_attempts;
    s.backoff = Backoff { ..g.backoff };
    s.max_in_flight_per_client = g.max_in_flight;
    if let Some(p) = &g.push {
        s.push_url = Some(crate::webhook::url(&g.name));
        s.push_batch = p.batch;
    }
    if g.start_latest {
        // Empty: the engine reads the end offsets when it creates the group.
        s.start_from = StartFrom::Latest(Default::default());
    }
    Some(s)
}

async fn simulate(slot: Option<Slot>, shape: Shape) -> Result<Report, Box<Failure>> {
    let handle = Handle::current();
    let seed = handle.seed();
    let opts = (shape.options)(seed);
    let world = World::new(opts.clone());
    if let Some(slot) = slot {
        *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(world.clone());
    }
    let mut rng = Rng::new(seed ^ 0x7275_6e00);
    let backend = (shape.backend)(&opts);
    let nodes = world.nodes();
    let mesh: Vec<_> = (0..nodes)
        .map(|n| {
            let (w, b) = (world.clone(), backend.clone());
            let [a, b1, c, d] = MESH_IP;
            handle
                .create_node()
                .name(if n == 0 {
                    "mesh".to_owned()
                } else {
                    format!("mesh-{n}")
                })
                .ip([a, b1, c, d + n as u8].into())
                .init(move || node_main(w.clone(), b.clone(), n))
                .build()
        })
        .collect();
    let mesh_ids: Vec<_> = mesh.iter().map(|m| m.id()).collect();
    let clients = handle.create_node().name("clients").build();
    let topic = topic();

    let kill_task = handle.create_node().name("chaos").build();
    let kills = kill_task.spawn(kills(
        world.clone(),
        backend.clone(),
        mesh_ids.clone(),
        rng.fork(),
    ));
    let jumps = kill_task.spawn(clock_jumps(world.clone(), rng.fork()));
    // The group shape's own faults, from RNGs of their own (the other shapes draw none).
    let cluster_faults = (nodes > 1).then(|| {
        let mut crng = Rng::new(seed ^ 0x6e6f_6465_7300);
        (
            kill_task.spawn(pauses(world.clone(), mesh_ids.clone(), crng.fork())),
            kill_task.spawn(heartbeat_losses(
                world.clone(),
                backend.clone(),
                crng.fork(),
            )),
        )
    });

    // The world before the clients: events no `latest` group sees, then the groups.
    let before = opts.events_before;
    clients
        .spawn(publish(
            world.clone(),
            topic.clone(),
            0,
            0,
            before,
            1,
            rng.fork(),
        ))
        .await
        .ok();
    let mut groups = Vec::new();
    let mut client_ids = Vec::new();
    for i in 0..opts.groups.len() {
        let Some(s) = spec(&opts, i) else {
            return Err(failure(
                &world,
                violation(Clause::Core, "a bad group name".into()),
            ));
        };
        // Every node is told of the group, node 0 first: the others get the spec it took
        // (a `latest` group's ends as node 0 resolved them), as Kafka's subscriptions topic
        // would hand it to them.
        for n in 0..nodes {
            let (w, s) = (world.clone(), s.clone());
            clients
                .spawn(async move {
                    while w.failure().is_none() {
                        let s = w.spec_for(s.clone());
                        if let Ok(Ok(_)) =
                            call_on(&w, n, 0, move |h| async move { h.subscribe(s).await }).await
                        {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                })
                .await
                .ok();
        }
        let g = &opts.groups[i];
        let name = GroupName::new(&g.name).unwrap_or_else(|_| unreachable!("checked above"));
        for (c, copt) in g.clients.iter().enumerate() {
            let id = ClientId::new(&format!("{}-c{c}", g.name))
                .unwrap_or_else(|_| unreachable!("a valid id"));
            client_ids.push(id.clone());
            let poller = Poller::new(
                world.clone(),
                c % nodes,
                name.clone(),
                id,
                copt.clone(),
                g.ack_timeout_ms,
                rng.fork(),
            );
            clients.spawn(poller.run());
        }
        groups.push(name);
    }

    // The fault phase: publishers spread their events over it, operators and faults act.
    let per = opts.events / opts.publishers.max(1);
    let batches = (per / opts.batch_max.div_ceil(2).max(1)).max(1);
    let pace = (opts.fault_phase_ms / Millis::from(batches)).max(1);
    let mut publishers = Vec::new();
    for p in 0..opts.publishers {
        let first = if p == 0 { before } else { 0 };
        publishers.push(clients.spawn(publish(
            world.clone(),
            topic.clone(),
            p,
            first,
            per,
            pace,
            rng.fork(),
        )));
    }
    clients.spawn(operator(
        world.clone(),
        topic.clone(),
        groups.clone(),
        client_ids,
        rng.fork(),
    ));
    clients.spawn(foreign_writer(
        world.clone(),
        backend.clone(),
        topic.clone(),
        rng.fork(),
    ));
    sleep_unless_failed(&world, opts.fault_phase_ms).await;

    // Liveness: faults stop (the node comes back if it is down), clients behave.
    world.stop_faults();
    let _ = kills.await;
    let _ = jumps.await;
    if let Some((p, h)) = cluster_faults {
        let _ = p.await;
        let _ = h.await;
    }
    for p in publishers {
        let _ = p.await;
    }
    let start = world.elapsed_ms();
    let mut converged = false;
    while world.failure().is_none() && world.elapsed_ms() < start + LIVENESS_BUDGET_MS {
        if world.with_checker(|c| c.converged()) && idle(&world).await {
            converged = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    world.set_done();
    // A delivery that never reached its request is named as such, not as a lag.
    if world.failure().is_none() && !converged {
        world.check_stranded(true);
    }
    if world.failure().is_none() && !converged {
        let lag = lag_report(&world, &groups, opts.partitions);
        world.fail(violation(
            Clause::C1,
            format!("no convergence {LIVENESS_BUDGET_MS} ms after faults stopped: {lag}"),
        ));
    }
    if world.failure().is_none() {
        world.check_stranded(true);
    }
    if world.failure().is_none() {
        if let Err(v) = world.with_checker(|c| c.check_quiescent()) {
            world.fail(v);
        }
    }
    let outcome = match world.failure() {
        Some(v) => Err(failure(&world, v)),
        None => Ok(Report {
            seed,
            steps: world.steps(),
            incarnations: world.incarnations(),
            sim_ms: world.elapsed_ms(),
            trace_hash: world.trace_hash(),
            counts: world.counts(),
            stats: world.with_checker(|c| c.stats.clone()),
        }),
    };
    // The nodes' tasks are dropped with their nodes, not with the runtime: a task still
    // waiting (a client's consumer, bound to a simulated socket) would keep madsim's
    // network, and with it the whole world of the run, ~1.7 MB per group seed
    // (`valgrind --leak-check=full` on a 3-seed sweep: a `BindGuard` of a reader's
    // consumer, definitely lost, holding 5.5 MB).
    let others = [clients.id(), kill_task.id()];
    for id in mesh_ids.iter().chain(&others).chain(&backend.nodes()) {
        handle.kill(*id);
    }
    outcome
}

async fn sleep_unless_failed(world: &World, ms: Millis) {
    let end = world.elapsed_ms() + ms;
    while world.elapsed_ms() < end && world.failure().is_none() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether every node's engine says nothing is in flight and no dead letter is being
/// replayed.
/// Nothing in flight at any node, and every delivery handed out has reached its request:
/// a pusher may hold the next batch while its request hangs, until its request timeout
/// (longer than the group's ACK timeout: the delivery was handed on meanwhile), and sends
/// it then.
async fn idle(world: &World) -> bool {
    if world.handed_out() > 0 {
        return false;
    }
    for n in 0..world.nodes() {
        let idle = match call_on(world, n, 0, |h| async move { h.subscriptions().await }).await {
            Ok(Ok(subs)) => subs
                .iter()
                .all(|s| s.replaying == 0 && s.lanes.iter().all(|l| l.in_flight == 0)),
            _ => false,
        };
        if !idle {
            return false;
        }
    }
    true
}

fn lag_report(world: &World, groups: &[GroupName], partitions: u32) -> String {
    world.with_checker(|c| {
        let mut out = Vec::new();
        for g in groups {
            for p in 0..partitions {
                out.push(format!(
                    "{g}/{p} durable watermark {:?}",
                    c.durable_watermark(g, p)
                ));
            }
        }
        out.join(", ")
    })
}
