//! The environment's faults and the operators, while faults last: kills and restarts of
//! mesh nodes, pauses of them and lost heartbeats (the group shape), clock jumps, seeks,
//! DLQ replays, client evictions, and records written to the broker by something else than
//! the mesh. Each arrives as a Poisson process of the mean the seed drew (none for a mean
//! of 0).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use madsim::runtime::Handle;
use madsim::task::NodeId;
use madsim_tokio as tokio;
use unimesh_core::{ClientId, GroupName, Millis, TopicName};
use unimesh_sim::rng::Rng;

use crate::node::call_on;
use crate::storage::Backend;
use crate::world::World;

/// An exponentially distributed delay of mean `mean_ms` (at least 1 ms).
pub fn exp(rng: &mut Rng, mean_ms: Millis) -> Duration {
    let u = rng.unit().max(1e-9);
    Duration::from_millis(((-u.ln()) * mean_ms as f64) as Millis + 1)
}

/// A mesh node drawn from `rng` (no draw when there is one).
fn pick(world: &World, rng: &mut Rng) -> usize {
    match world.nodes() {
        0 | 1 => 0,
        n => rng.index(n),
    }
}

/// Kills a mesh node now and then, and restarts it after a downtime; returns once faults
/// stopped, with every node up.
pub async fn kills(world: Arc<World>, backend: Arc<dyn Backend>, nodes: Vec<NodeId>, mut rng: Rng) {
    let f = world.opts.faults.clone();
    if f.kill_every_ms == 0 {
        return;
    }
    loop {
        tokio::time::sleep(exp(&mut rng, f.kill_every_ms)).await;
        if !world.faults_on() || world.failure().is_some() {
            return;
        }
        let n = pick(&world, &mut rng);
        if rng.chance(f.graceful_stop) {
            // SIGTERM first, as `serve` does it: a broker with consumer groups is left
            // (each revocation flushes and commits), then the engine flushes, answers its
            // polls and stops taking requests; then the process exits.
            let log = world.log_port(n);
            let stop = call_on(&world, n, 0, |h| async move {
                if let Some(log) = log {
                    log.close().await;
                }
                h.shutdown().await
            });
            if let Ok(Ok(Ok(()))) = tokio::time::timeout(Duration::from_secs(2), stop).await {
                world.count(|c| &mut c.graceful_stops);
            }
        }
        Handle::current().kill(nodes[n]);
        backend.killed(&world, n).await;
        world.crashed(n);
        let down = rng.range(0, f.down_ms);
        if down > 0 {
            tokio::time::sleep(Duration::from_millis(down)).await;
        }
        world.count(|c| &mut c.restarts);
        world.note_at(n, "restart", [down, 0, 0, 0]);
        Handle::current().restart(nodes[n]);
    }
}

/// Pauses a mesh node now and then (a stopped VM, a long collection pause): nothing of it
/// runs, and past the coordinator's session timeout it comes back a zombie. Returns once
/// faults stopped, with every node running.
pub async fn pauses(world: Arc<World>, nodes: Vec<NodeId>, mut rng: Rng) {
    let c = world.opts.cluster.clone();
    if c.pause_every_ms == 0 {
        return;
    }
    loop {
        tokio::time::sleep(exp(&mut rng, c.pause_every_ms)).await;
        if !world.faults_on() || world.failure().is_some() {
            return;
        }
        let n = pick(&world, &mut rng);
        let ms = rng.range(1, c.pause_ms);
        world.count(|c| &mut c.pauses);
        world.note_at(n, "pause", [ms, 0, 0, 0]);
        world.paused(n);
        Handle::current().pause(nodes[n]);
        tokio::time::sleep(Duration::from_millis(ms)).await;
        world.note_at(n, "resume", [ms, 0, 0, 0]);
        world.resumed(n);
        Handle::current().resume(nodes[n]);
    }
}

/// Loses the heartbeats of a mesh node now and then while it runs on: a zombie once the
/// coordinator expired it, until a heartbeat gets through.
pub async fn heartbeat_losses(world: Arc<World>, backend: Arc<dyn Backend>, mut rng: Rng) {
    let c = world.opts.cluster.clone();
    if c.heartbeat_loss_every_ms == 0 {
        return;
    }
    loop {
        tokio::time::sleep(exp(&mut rng, c.heartbeat_loss_every_ms)).await;
        if !world.faults_on() || world.failure().is_some() {
            return;
        }
        let n = pick(&world, &mut rng);
        let ms = rng.range(1, c.heartbeat_loss_ms);
        backend.lose_heartbeats(&world, n, ms);
    }
}

/// Moves the clock forward now and then (every node sees it: a suspended host).
pub async fn clock_jumps(world: Arc<World>, mut rng: Rng) {
    let every = world.opts.faults.clock_jump_every_ms;
    if every == 0 {
        return;
    }
    loop {
        tokio::time::sleep(exp(&mut rng, every)).await;
        if !world.faults_on() || world.failure().is_some() {
            return;
        }
        let by = Duration::from_millis(rng.range(200, 5_000));
        madsim::time::advance(by);
        world.jumped(by);
    }
}

/// One operator: seeks, replays and evictions at the rates drawn, until faults stop.
pub async fn operator(
    world: Arc<World>,
    topic: TopicName,
    groups: Vec<GroupName>,
    clients: Vec<ClientId>,
    mut rng: Rng,
) {
    let f = world.opts.faults.clone();
    let next = |rng: &mut Rng, mean: Millis| (mean > 0).then(|| exp(rng, mean));
    let mut seek = next(&mut rng, f.seek_every_ms);
    let mut replay = next(&mut rng, f.replay_every_ms);
    let mut evict = next(&mut rng, f.evict_every_ms);
    let mut update = next(&mut rng, f.update_every_ms);
    loop {
        let Some(wait) = [seek, replay, evict, update].into_iter().flatten().min() else {
            return;
        };
        tokio::time::sleep(wait).await;
        for d in [&mut seek, &mut replay, &mut evict, &mut update]
            .into_iter()
            .flatten()
        {
            *d = d.saturating_sub(wait);
        }
        if !world.faults_on() || world.failure().is_some() {
            return;
        }
        let delay = rng.range(0, f.net_delay_ms);
        let node = pick(&world, &mut rng);
        if seek.is_some_and(|d| d.is_zero()) {
            seek = next(&mut rng, f.seek_every_ms);
            let group = groups[rng.index(groups.len())].clone();
            do_seek(&world, node, &topic, group, delay, &mut rng).await;
        }
        if replay.is_some_and(|d| d.is_zero()) {
            replay = next(&mut rng, f.replay_every_ms);
            let group = groups[rng.index(groups.len())].clone();
            let max = rng.range(1, 6) as usize;
            let answer = call_on(&world, node, delay, move |h| async move {
                h.dlq_replay(&group, max).await
            })
            .await;
            if matches!(answer, Ok(Ok(n)) if n > 0) {
                world.count(|c| &mut c.replays);
            }
        }
        if evict.is_some_and(|d| d.is_zero()) {
            evict = next(&mut rng, f.evict_every_ms);
            let client = clients[rng.index(clients.len())].clone();
            let answer = call_on(&world, node, delay, move |h| async move {
                h.evict(&client).await
            })
            .await;
            if matches!(answer, Ok(Ok(n)) if n > 0) {
                world.count(|c| &mut c.evictions);
            }
        }
        if update.is_some_and(|d| d.is_zero()) {
            update = next(&mut rng, f.update_every_ms);
            let group = &groups[rng.index(groups.len())];
            if let Some(mut spec) = world.live_spec(group) {
                spec.ack_timeout_ms = rng.range(50, 800);
                spec.max_in_flight_per_client = rng.range(1, 8) as u32;
                let answer = call_on(&world, node, delay, move |h| async move {
                    h.subscribe(spec).await
                })
                .await;
                if matches!(answer, Ok(Ok(false))) {
                    world.count(|c| &mut c.updates);
                }
            }
        }
    }
}

/// An operator seek of one partition of `group` to an offset drawn from what the log holds
/// (now and then just past its end, which the engine must refuse).
async fn do_seek(
    world: &Arc<World>,
    node: usize,
    topic: &TopicName,
    group: GroupName,
    delay: Millis,
    rng: &mut Rng,
) {
    let t = topic.clone();
    let Ok(Ok(rows)) = call_on(
        world,
        node,
        delay,
        move |h| async move { h.offsets(&t).await },
    )
    .await
    else {
        return;
    };
    let rows: Vec<_> = rows.into_iter().filter(|r| r.group == group).collect();
    if rows.is_empty() {
        return;
    }
    let row = &rows[rng.index(rows.len())];
    let (partition, offset) = (row.partition, rng.range(0, row.end + 1));
    let answer = call_on(world, node, delay, move |h| async move {
        h.seek(&group, partition, offset).await
    })
    .await;
    if matches!(answer, Ok(Ok(()))) {
        world.count(|c| &mut c.seeks);
    }
}

/// Writes bytes that are no event to the broker now and then (a foreign producer).
pub async fn foreign_writer(
    world: Arc<World>,
    backend: Arc<dyn Backend>,
    topic: TopicName,
    mut rng: Rng,
) {
    let every = world.opts.faults.foreign_every_ms;
    if every == 0 {
        return;
    }
    loop {
        tokio::time::sleep(exp(&mut rng, every)).await;
        if !world.faults_on() || world.failure().is_some() {
            return;
        }
        let body = Bytes::from(format!("not an event {}", rng.below(1_000_000)));
        if backend.write_foreign(&world, &topic, body) {
            world.count(|c| &mut c.foreign_records);
        }
    }
}
