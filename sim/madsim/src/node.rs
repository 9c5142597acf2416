//! The mesh node: at every (re)start it opens the backend's ports, wraps them in the fault
//! injectors and starts the engine with `engine::start_observed` — the start-up `serve`
//! uses (`engine::start` is the same function without a tap): load the state, a new epoch,
//! every recovered group assigned. Then it serves requests until it is killed.
//!
//! The front door stands in for the HTTP server: a request is a job run in a task of its
//! own on the node, as hyper runs a handler, so a kill ends it with the node and its client
//! sees the connection reset; a client that goes away drops its answer channel, and the job
//! drops the engine call, as hyper drops a handler whose connection closed.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use madsim_tokio as tokio;
use tokio::sync::{mpsc, oneshot};
use unimesh_core::{Effect, Epoch, Input, MeshConfig, Millis, PersistBatch, Response, Ticket};
use unimesh_shell::engine::{self, BoxFut, EngineConfig, EngineHandle, EngineTap};
use unimesh_shell::http::push;
use unimesh_shell::policy::TargetPolicy;
use unimesh_sim::rng::Rng;
use unimesh_sim::Clause;

use crate::options::Options;
use crate::storage::{Backend, FaultyLog, FaultyState};
use crate::world::{violation, World};

/// One request: run on the node against the live engine.
pub type Job = Box<dyn FnOnce(EngineHandle) -> BoxFut<()> + Send>;

/// Why a request got no answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallError {
    /// The node is down (connection refused).
    Down,
    /// The node died while the request was in it (connection reset).
    Reset,
}

/// The engine's configuration for a run, as drawn from the seed.
pub fn engine_config(opts: &Options) -> EngineConfig {
    let e = &opts.engine;
    EngineConfig {
        mesh: MeshConfig {
            max_window_per_lane: e.max_window_per_lane,
            max_ack_ranges_per_lane: e.max_ack_ranges_per_lane,
            fetch_batch: e.fetch_batch,
            fetch_retry_ms: e.fetch_retry_ms,
            flush_interval_ms: e.flush_interval_ms,
            max_outstanding_persists: e.max_outstanding_persists,
            client_idle_timeout_ms: e.client_idle_timeout_ms,
            ..MeshConfig::default()
        },
        fetch_wait_ms: e.fetch_wait_ms,
        command_capacity: e.command_capacity,
        retention_interval_ms: e.retention_interval_ms,
        ..EngineConfig::default()
    }
}

/// Mesh node `node`'s life: start the engine on fresh ports, then serve requests until
/// killed.
pub async fn node_main(world: Arc<World>, backend: Arc<dyn Backend>, node: usize) {
    let inc = u64::from(world.incarnations()) + 1;
    let mut rng = Rng::new(world.opts.seed ^ (inc << 40) ^ ((node as u64) << 56) ^ 0x6e6f_6465);
    let (log, state) = match backend.ports(&world, node, rng.fork()).await {
        Ok(ports) => ports,
        Err(e) => {
            world.fail(violation(
                Clause::Core,
                format!("the {} storage did not open: {e}", backend.name()),
            ));
            return;
        }
    };
    let log: Arc<dyn engine::LogPort> = Arc::new(FaultyLog::new(log, world.clone(), rng.fork()));
    let state = Arc::new(FaultyState::new(state, world.clone(), rng.fork()));
    let tap: Arc<dyn EngineTap> = Arc::new(Observer(world.clone(), node));
    let mut config = engine_config(&world.opts);
    backend.configure(&mut config);
    let (handle, _join) = match engine::start_observed(config, log.clone(), state, Some(tap)).await
    {
        Ok(started) => started,
        Err(e) => {
            world.fail(violation(
                Clause::Core,
                format!("the engine did not start: {e}"),
            ));
            return;
        }
    };
    if let Some(run) = &world.opts.push {
        // The webhook pushers, as `serve` runs them, on the simulated targets.
        let connect = crate::webhook::connect(world.clone(), node, rng.fork());
        tokio::spawn(push::supervise_with(
            handle.clone(),
            crate::webhook::config(run),
            Arc::new(TargetPolicy::default()),
            connect,
            // The harness writes subscriptions through the engine, not the HTTP API.
            Arc::new(tokio::sync::Notify::new()),
        ));
    }
    let (tx, mut rx) = mpsc::unbounded_channel::<Job>();
    world.set_front(node, tx, log);
    while let Some(job) = rx.recv().await {
        tokio::spawn(job(handle.clone()));
    }
}

/// Sends a request to the live engine of node 0 and waits for its answer. `delay` is the
/// request's time on the wire.
pub async fn call<T, F, Fut>(world: &World, delay: Millis, f: F) -> Result<T, CallError>
where
    T: Send + 'static,
    F: FnOnce(EngineHandle) -> Fut + Send + 'static,
    Fut: Future<Output = T> + Send + 'static,
{
    call_on(world, 0, delay, f).await
}

/// [`call`] to the live engine of mesh node `node`.
pub async fn call_on<T, F, Fut>(
    world: &World,
    node: usize,
    delay: Millis,
    f: F,
) -> Result<T, CallError>
where
    T: Send + 'static,
    F: FnOnce(EngineHandle) -> Fut + Send + 'static,
    Fut: Future<Output = T> + Send + 'static,
{
    let front = world.front(node).ok_or(CallError::Down)?;
    let (mut tx, rx) = oneshot::channel::<T>();
    let job: Job = Box::new(move |engine| {
        Box::pin(async move {
            if delay > 0 {
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            let answer = tokio::select! {
                biased;
                r = f(engine) => Some(r),
                // The client went away: drop the call, as hyper drops the handler.
                _ = tx.closed() => None,
            };
            if let Some(r) = answer {
                let _ = tx.send(r);
            }
        })
    });
    front.send(job).map_err(|_| CallError::Down)?;
    rx.await.map_err(|_| CallError::Reset)
}

/// The engine's tap of one mesh node, forwarding to the world.
struct Observer(Arc<World>, usize);

impl EngineTap for Observer {
    fn started(&self, now_ms: Millis, epoch: Epoch) {
        self.0.started(self.1, now_ms, epoch);
    }

    fn input(&self, now_ms: Millis, input: &Input, response: &Response) {
        self.0.input(self.1, now_ms, input, response);
    }

    fn effect(&self, now_ms: Millis, effect: &Effect) {
        self.0.effect(self.1, now_ms, effect);
    }

    fn persist(&self, now_ms: Millis, ticket: Ticket, batch: &Arc<PersistBatch>) {
        self.0.persist(self.1, now_ms, ticket, batch);
    }
}
