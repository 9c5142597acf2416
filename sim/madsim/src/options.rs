//! Swarm options: every size, behaviour and fault rate of one run is drawn from its seed
//! (TigerBeetle's `options_swarm`), half of the faults off in any one run, so seeds differ in
//! kind and not only in timing. Printed before a failing run's report.

use std::fmt;

use unimesh_core::{Backoff, Millis, Ordering};
use unimesh_sim::rng::Rng;

/// How one model client behaves while faults last (afterwards every client ACKs).
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// Of the deliveries it gets: NACK (with a delay drawn, or none), never settle, ACK
    /// after the ACK timeout, ACK twice, extend before ACKing; the rest is ACKed in time.
    pub nack: f64,
    pub ignore: f64,
    pub late_ack: f64,
    pub double_ack: f64,
    pub extend: f64,
    /// Per poll: ACK an id from its past (possibly a former incarnation's), or one never
    /// issued.
    pub stale_ack: f64,
    pub bogus_ack: f64,
    /// Per poll: go away mid-poll (the request is dropped, as by a closed connection).
    pub vanish: f64,
    /// Per answered poll: the answer never arrives (lost on the wire after the mesh sent it).
    pub lose_response: f64,
    pub ack_delay_ms: Millis,
    pub poll_max: u32,
    /// Longest `waitMs` of a poll (0..=this, now and then 0).
    pub wait_ms: Millis,
    /// Pause between polls.
    pub pause_ms: Millis,
    /// How it takes its deliveries.
    pub transport: Transport,
}

/// The delivery path a client uses: those that ship.
#[derive(Clone, Debug, PartialEq)]
pub enum Transport {
    /// Long-polls (the fields above).
    LongPoll,
    /// A stream session (SSE or WebSocket: the engine's session API their HTTP handlers
    /// use), its credit `window`. While faults last a write fails with `write_fail` (the
    /// transport reports it and the session ends, as the WebSocket handler does),
    /// after a batch the connection closes with `close` (what is still queued goes back),
    /// and a closing connection is left open a while after the client reconnected with the
    /// same id with `overlap` (the engine ends the older session).
    Stream {
        window: u32,
        write_fail: f64,
        close: f64,
        overlap: f64,
    },
}

#[derive(Clone, Debug)]
pub struct GroupOptions {
    pub name: String,
    /// Only events of this type (None: every event).
    pub type_filter: Option<String>,
    pub ordering: Ordering,
    pub ack_timeout_ms: Millis,
    pub max_attempts: u32,
    pub backoff: Backoff,
    pub max_in_flight: u32,
    /// Starts at the end offsets of the moment it is created.
    pub start_latest: bool,
    pub clients: Vec<ClientOptions>,
    /// A webhook target (`push.url`): the mesh's pusher is one more client of the group.
    pub push: Option<PushOptions>,
}

/// A group's webhook target, as the shipped pusher (`http/push`) meets it. While faults
/// last a request is answered 429 or 503 with `Retry-After` (`deferred`), with another
/// failure status (`fail`), never (`hang`: the pusher's timeout ends it), its connection is
/// refused (`refuse`), or its host resolves to an address `push.allowed_hosts` does not
/// let through (`not_allowed`); the rest is answered 2xx. Afterwards every request is.
#[derive(Clone, Debug, PartialEq)]
pub struct PushOptions {
    /// Events per request (`push.batch`: 1 is binary mode).
    pub batch: u32,
    pub deferred: f64,
    /// The longest `Retry-After` (seconds).
    pub retry_after_s: u64,
    pub fail: f64,
    pub hang: f64,
    pub refuse: f64,
    pub not_allowed: f64,
    /// The longest time a target takes to answer.
    pub latency_ms: Millis,
}

/// The mesh's `[push]` settings of a run with webhook targets.
#[derive(Clone, Debug, PartialEq)]
pub struct PushRun {
    pub max_concurrency: u32,
    pub request_timeout_ms: Millis,
    pub scan_interval_ms: Millis,
}

/// Rates of the faults of the environment. A rate of 0 disables a fault.
#[derive(Clone, Debug, Default)]
pub struct FaultRates {
    /// Mean time between kills of the mesh node (0: none), and the longest downtime.
    pub kill_every_ms: Millis,
    pub down_ms: Millis,
    /// Chance that a kill is preceded by a graceful stop (what SIGTERM does: flush, answer
    /// the polls, stop taking requests).
    pub graceful_stop: f64,
    /// Mean time between forward jumps of the clock (a suspended VM).
    pub clock_jump_every_ms: Millis,
    /// Appends: refused, or refused although written; the time one takes to sync.
    pub append_fail: f64,
    pub append_fail_written: f64,
    pub append_latency_ms: Millis,
    /// State writes: the same.
    pub persist_fail: f64,
    pub persist_fail_written: f64,
    pub persist_latency_ms: Millis,
    /// Fetch answers: failed, with duplicates, starting below the asked offset, "out of
    /// range" although in range, delayed (by up to `fetch_delay_ms`).
    pub fetch_fail: f64,
    pub fetch_duplicates: f64,
    pub fetch_rewind: f64,
    pub fetch_out_of_range: f64,
    pub fetch_delay: f64,
    pub fetch_delay_ms: Millis,
    /// Per retention pass: chance that a prefix of one partition is deleted.
    pub retention: f64,
    /// Mean time between records written to the broker by something else than the mesh
    /// (bytes that do not decode as an event).
    pub foreign_every_ms: Millis,
    /// Operators: seeks, DLQ replays, client evictions, new settings for a group (its ACK
    /// timeout and in-flight bound).
    pub seek_every_ms: Millis,
    pub replay_every_ms: Millis,
    pub evict_every_ms: Millis,
    pub update_every_ms: Millis,
    /// Longest delay of a request on its way to the mesh.
    pub net_delay_ms: Millis,
}

/// The group shape's own draws: several mesh nodes under the Kafka group coordinator.
#[derive(Clone, Debug, Default)]
pub struct ClusterOptions {
    /// The coordinator's session timeout and the members' heartbeat interval (0: the
    /// coordinator's defaults), and how long a revocation may take before its member is
    /// expelled.
    pub session_ms: Millis,
    pub heartbeat_ms: Millis,
    pub rebalance_timeout_ms: Millis,
    /// Mean time between pauses of a mesh node (0: none: a stopped VM, a long GC), and the
    /// longest pause (beyond the session timeout the node comes back a zombie).
    pub pause_every_ms: Millis,
    pub pause_ms: Millis,
    /// Mean time between windows in which a node's heartbeats are lost while it runs on
    /// (0: none), and the longest window.
    pub heartbeat_loss_every_ms: Millis,
    pub heartbeat_loss_ms: Millis,
}

/// The engine's own knobs (what `EngineConfig` and `MeshConfig` take).
#[derive(Clone, Debug)]
pub struct EngineOptions {
    pub flush_interval_ms: Millis,
    pub max_outstanding_persists: usize,
    pub max_window_per_lane: usize,
    pub max_ack_ranges_per_lane: usize,
    pub fetch_batch: usize,
    pub fetch_retry_ms: Millis,
    pub client_idle_timeout_ms: Millis,
    pub fetch_wait_ms: u64,
    pub command_capacity: usize,
    pub retention_interval_ms: u64,
}

#[derive(Clone, Debug)]
pub struct Options {
    pub seed: u64,
    /// Mesh nodes (instances) sharing the broker: 1 but in the group shape.
    pub nodes: u32,
    pub cluster: ClusterOptions,
    pub partitions: u32,
    /// Events published before the groups exist (what `latest` groups never see).
    pub events_before: u32,
    /// Events published while faults last.
    pub events: u32,
    pub publishers: u32,
    /// Events per publish request (1..=this).
    pub batch_max: u32,
    /// Share of events every client NACKs (they end in the DLQ).
    pub poison: f64,
    /// Distinct partition keys (events carry one with `key_share`).
    pub keys: u32,
    pub key_share: f64,
    pub groups: Vec<GroupOptions>,
    pub fault_phase_ms: Millis,
    pub engine: EngineOptions,
    pub faults: FaultRates,
    /// Set when some group has a webhook target.
    pub push: Option<PushRun>,
}

/// Half of the time a fault is off; otherwise its rate is drawn from `lo..=hi`.
fn maybe(rng: &mut Rng, lo: f64, hi: f64) -> f64 {
    if rng.chance(0.5) {
        0.0
    } else {
        lo + (hi - lo) * rng.unit()
    }
}

fn maybe_every(rng: &mut Rng, lo: Millis, hi: Millis) -> Millis {
    if rng.chance(0.5) {
        0
    } else {
        rng.range(lo, hi)
    }
}

impl Options {
    pub fn swarm(seed: u64) -> Self {
        let mut rng = Rng::new(seed ^ 0x4d41_4453_494d_0000);
        let partitions = rng.range(1, 3) as u32;
        let mut groups = Vec::new();
        for i in 0..rng.range(1, 3) {
            let ack_timeout_ms = rng.range(50, 800);
            let clients = (0..rng.range(1, 3))
                .map(|_| ClientOptions {
                    nack: maybe(&mut rng, 0.02, 0.3),
                    ignore: maybe(&mut rng, 0.02, 0.2),
                    late_ack: maybe(&mut rng, 0.02, 0.2),
                    double_ack: maybe(&mut rng, 0.02, 0.3),
                    extend: maybe(&mut rng, 0.02, 0.2),
                    stale_ack: maybe(&mut rng, 0.05, 0.4),
                    bogus_ack: maybe(&mut rng, 0.01, 0.1),
                    vanish: maybe(&mut rng, 0.02, 0.2),
                    lose_response: maybe(&mut rng, 0.01, 0.1),
                    ack_delay_ms: rng.range(0, ack_timeout_ms / 2),
                    poll_max: rng.range(1, 8) as u32,
                    wait_ms: rng.range(0, 300),
                    pause_ms: rng.range(1, 40),
                    transport: Transport::LongPoll,
                })
                .collect();
            groups.push(GroupOptions {
                name: format!("g{i}"),
                type_filter: rng
                    .chance(0.3)
                    .then(|| ["a.created", "b.created"][rng.index(2)].to_owned()),
                ordering: if rng.chance(0.3) {
                    Ordering::Key
                } else {
                    Ordering::None
                },
                ack_timeout_ms,
                max_attempts: rng.range(1, 5) as u32,
                backoff: Backoff {
                    initial_ms: rng.range(0, 50),
                    max_ms: 200,
                    multiplier: 1.0 + rng.unit() * 2.0,
                },
                max_in_flight: rng.range(1, 8) as u32,
                start_latest: rng.chance(0.2),
                clients,
                push: None,
            });
        }
        let faults = FaultRates {
            kill_every_ms: maybe_every(&mut rng, 200, 2_000),
            down_ms: rng.range(0, 300),
            graceful_stop: maybe(&mut rng, 0.1, 0.5),
            clock_jump_every_ms: maybe_every(&mut rng, 500, 3_000),
            append_fail: maybe(&mut rng, 0.01, 0.15),
            append_fail_written: maybe(&mut rng, 0.01, 0.15),
            append_latency_ms: rng.range(0, 20),
            persist_fail: maybe(&mut rng, 0.01, 0.15),
            persist_fail_written: maybe(&mut rng, 0.01, 0.15),
            persist_latency_ms: rng.range(0, 30),
            fetch_fail: maybe(&mut rng, 0.01, 0.15),
            fetch_duplicates: maybe(&mut rng, 0.05, 0.4),
            fetch_rewind: maybe(&mut rng, 0.05, 0.3),
            fetch_out_of_range: maybe(&mut rng, 0.01, 0.1),
            fetch_delay: maybe(&mut rng, 0.05, 0.3),
            fetch_delay_ms: rng.range(1, 100),
            retention: maybe(&mut rng, 0.05, 0.5),
            foreign_every_ms: maybe_every(&mut rng, 300, 2_000),
            seek_every_ms: maybe_every(&mut rng, 300, 2_000),
            replay_every_ms: maybe_every(&mut rng, 200, 1_500),
            evict_every_ms: maybe_every(&mut rng, 300, 2_000),
            update_every_ms: maybe_every(&mut rng, 300, 2_000),
            net_delay_ms: rng.range(0, 3),
        };
        let engine = EngineOptions {
            flush_interval_ms: rng.range(1, 50),
            max_outstanding_persists: rng.range(1, 4) as usize,
            max_window_per_lane: rng.range(2, 64) as usize,
            max_ack_ranges_per_lane: rng.range(1, 32) as usize,
            fetch_batch: rng.range(1, 32) as usize,
            fetch_retry_ms: rng.range(5, 100),
            client_idle_timeout_ms: rng.range(200, 5_000),
            fetch_wait_ms: rng.range(5, 200),
            command_capacity: if rng.chance(0.3) {
                rng.range(1, 8) as usize
            } else {
                256
            },
            retention_interval_ms: if faults.retention > 0.0 {
                rng.range(50, 500)
            } else {
                0
            },
        };
        // Transports from a draw of their own, so every other draw of a seed is as before.
        let mut t = Rng::new(seed ^ 0x5452_414e_5350_0000);
        for c in groups.iter_mut().flat_map(|g| g.clients.iter_mut()) {
            if t.chance(0.5) {
                c.transport = Transport::Stream {
                    window: t.range(1, 8) as u32,
                    write_fail: maybe(&mut t, 0.02, 0.2),
                    close: maybe(&mut t, 0.05, 0.4),
                    overlap: maybe(&mut t, 0.1, 0.5),
                };
            }
        }
        // Webhook targets from a draw of their own too.
        let mut w = Rng::new(seed ^ 0x5055_5348_0000_0000);
        for g in &mut groups {
            if w.chance(0.4) {
                g.push = Some(PushOptions {
                    batch: if w.chance(0.5) {
                        1
                    } else {
                        w.range(2, 6) as u32
                    },
                    deferred: maybe(&mut w, 0.05, 0.3),
                    retry_after_s: w.range(0, 2),
                    fail: maybe(&mut w, 0.05, 0.3),
                    hang: maybe(&mut w, 0.02, 0.15),
                    refuse: maybe(&mut w, 0.05, 0.3),
                    not_allowed: maybe(&mut w, 0.01, 0.1),
                    latency_ms: w.range(0, 40),
                });
            }
        }
        let push = groups.iter().any(|g| g.push.is_some()).then(|| PushRun {
            max_concurrency: w.range(1, 4) as u32,
            request_timeout_ms: w.range(50, 1_000),
            scan_interval_ms: w.range(10, 200),
        });
        Options {
            seed,
            nodes: 1,
            cluster: ClusterOptions::default(),
            partitions,
            events_before: rng.range(0, 8) as u32,
            events: rng.range(5, 80) as u32,
            publishers: rng.range(1, 2) as u32,
            batch_max: rng.range(1, 4) as u32,
            poison: maybe(&mut rng, 0.01, 0.1),
            keys: rng.range(1, 6) as u32,
            key_share: rng.unit(),
            groups,
            fault_phase_ms: rng.range(1_000, 4_000),
            engine,
            faults,
            push,
        }
    }
}

impl Options {
    /// The group shape's options: [`Options::swarm`], then two or three mesh nodes, more
    /// partitions, the coordinator's timing and the faults of membership, from a draw of
    /// their own (so the other shapes' draws are untouched). Every node gets clients of
    /// every group (a lane is served where it is owned), and operators do not change a
    /// group's settings (each node would be told alone; in Kafka they travel through the
    /// subscriptions topic, whose watcher the simulation does not run).
    pub fn swarm_cluster(seed: u64) -> Self {
        let mut o = Self::swarm(seed);
        let mut rng = Rng::new(seed ^ 0x434c_5553_5445_5200);
        o.nodes = rng.range(2, 3) as u32;
        o.partitions = rng.range(2, 6) as u32;
        let session_ms = rng.range(300, 1_500);
        o.cluster = ClusterOptions {
            session_ms,
            heartbeat_ms: rng.range(20, session_ms / 3),
            rebalance_timeout_ms: rng.range(session_ms, 4 * session_ms),
            pause_every_ms: maybe_every(&mut rng, 300, 2_000),
            pause_ms: rng.range(50, 3 * session_ms),
            heartbeat_loss_every_ms: maybe_every(&mut rng, 300, 2_000),
            heartbeat_loss_ms: rng.range(session_ms / 2, 4 * session_ms),
        };
        o.faults.update_every_ms = 0;
        let nodes = o.nodes as usize;
        for g in &mut o.groups {
            let drawn = g.clients.len();
            for i in drawn..nodes {
                let c = g.clients[i % drawn].clone();
                g.clients.push(c);
            }
        }
        o
    }
}

impl fmt::Display for Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "SEED={}", self.seed)?;
        writeln!(
            f,
            "  partitions={} events_before={} events={} publishers={} batch_max={} poison={:.3} keys={} key_share={:.2} fault_phase_ms={}",
            self.partitions, self.events_before, self.events, self.publishers, self.batch_max,
            self.poison, self.keys, self.key_share, self.fault_phase_ms
        )?;
        if self.nodes > 1 {
            writeln!(f, "  nodes={} cluster: {:?}", self.nodes, self.cluster)?;
        }
        writeln!(f, "  engine: {:?}", self.engine)?;
        writeln!(f, "  faults: {:?}", self.faults)?;
        if let Some(p) = &self.push {
            writeln!(f, "  push: {p:?}")?;
        }
        for g in &self.groups {
            writeln!(
                f,
                "  group {}: filter={:?} ordering={:?} ack_timeout_ms={} max_attempts={} backoff={:?} max_in_flight={} latest={}",
                g.name, g.type_filter, g.ordering, g.ack_timeout_ms, g.max_attempts, g.backoff,
                g.max_in_flight, g.start_latest
            )?;
            for (i, c) in g.clients.iter().enumerate() {
                writeln!(f, "    client {i}: {c:?}")?;
            }
            if let Some(p) = &g.push {
                writeln!(f, "    webhook: {p:?}")?;
            }
        }
        Ok(())
    }
}
