//! Swarm options: every size, behaviour and fault rate of one run is drawn from its seed
//! (TigerBeetle's `options_swarm`), so different seeds exercise different mixes — some with
//! no crash at all and many rebalances, some with a crash every few hundred milliseconds.
//! The options are printed before the run, so a failure report says what was going on.
//!
//! Two worlds. The *classic* world ([`Options::swarm_classic`]) is one mesh over a tidy
//! log: every offset holds a record, partitions come back only to the instance that lost
//! them, the broker never loses what it acknowledged. The *Kafka* world ([`Options::swarm`],
//! what `cargo test` and the long mode run) adds, from [`KafkaOptions`], what a real
//! Kafka-protocol cluster does: several instances sharing the broker and a progress store
//! under a group coordinator (joins, leaves, crashes, zombies fenced by generation), offset
//! gaps (transaction markers, aborted transactions, compaction), retention into recovered
//! ACK ranges, the loss of a partition's tail, a store that answers late, out of order or
//! twice, and richer events and filters. The Kafka options are drawn from their own RNG,
//! so the classic draws of a seed — and the classic world's trace hashes — stay as they
//! were recorded.

use std::fmt;

use unimesh_core::{Backoff, Filter, Millis, Ordering};

use crate::rng::Rng;

/// Which world a seed runs in (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum World {
    Classic,
    Kafka,
}

impl World {
    /// The options a seed draws in this world.
    pub fn options(self, seed: u64, size: Size) -> Options {
        match self {
            World::Classic => Options::swarm_classic(seed, size),
            World::Kafka => Options::swarm(seed, size),
        }
    }
}

/// How big a run is. Tests use `Small` to stay fast in debug builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Size {
    Small,
    Normal,
}

/// Probabilities and rates of every fault the harness injects. A rate of 0 disables it.
/// Per-event probabilities unless said otherwise.
#[derive(Clone, Debug, Default)]
pub struct FaultRates {
    /// Mean time between mesh crashes during the fault phase (0: none).
    pub crash_every_ms: Millis,
    /// When crashing, chance that the oldest pending persist was written but not reported.
    pub crash_mid_persist: f64,
    /// How long the mesh stays down.
    pub restart_after_ms: Millis,
    pub persist_fail: f64,
    pub persist_latency_ms: Millis,
    pub fetch_fail: f64,
    /// The answer holds duplicate records.
    pub fetch_duplicates: f64,
    /// The answer starts below the asked offset (a broker rewind).
    pub fetch_rewind: f64,
    /// The broker says "out of range" although the offset is in range.
    pub fetch_spurious_out_of_range: f64,
    /// The same answer arrives twice.
    pub fetch_answer_twice: f64,
    pub fetch_latency_ms: Millis,
    /// A delivery never reaches its client (the long-poll response was lost).
    pub delivery_lost: f64,
    /// Mean time between retention runs that delete old records (0: none).
    pub retention_every_ms: Millis,
    pub rebalance_every_ms: Millis,
    pub seek_every_ms: Millis,
    pub replay_every_ms: Millis,
    /// Mean time between forward clock jumps.
    pub clock_jump_every_ms: Millis,
    /// Chance that an input carries a time below the previous one.
    pub clock_glitch: f64,
    pub flush_now: f64,
}

/// How one model client behaves during the fault phase.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    pub ack: f64,
    pub nack: f64,
    /// Never settle: the delivery times out.
    pub ignore: f64,
    /// ACK after the ACK timeout.
    pub late_ack: f64,
    pub double_ack: f64,
    pub extend: f64,
    /// Chance per wake-up of ACKing an id from the past (possibly a former incarnation).
    pub stale_ack: f64,
    /// Chance per wake-up of ACKing an id that was never issued.
    pub bogus_ack: f64,
    pub disconnect: f64,
    pub ack_delay_ms: Millis,
    pub poll_max: u32,
    pub wake_ms: Millis,
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
    /// Start at the end offsets seen at creation instead of the earliest.
    pub start_latest: bool,
    pub clients: Vec<ClientOptions>,
}

#[derive(Clone, Debug)]
pub struct Options {
    pub seed: u64,
    pub size: Size,
    pub partitions: u32,
    /// Records published before the groups exist (what `latest` groups never see).
    pub records_before: u32,
    pub records: u32,
    pub poison: f64,
    pub undecodable: f64,
    pub keys: u32,
    pub groups: Vec<GroupOptions>,
    pub fault_phase_ms: Millis,
    pub max_window_per_lane: usize,
    pub max_ack_ranges_per_lane: usize,
    pub fetch_batch: usize,
    pub flush_interval_ms: Millis,
    pub max_outstanding_persists: usize,
    pub client_idle_timeout_ms: Millis,
    pub commit_to_broker: bool,
    /// Records carry POP receipt handles (C6).
    pub pop: bool,
    pub broker_wait_ms: Millis,
    pub faults: FaultRates,
    /// The Kafka world's options; None in the classic world.
    pub kafka: Option<KafkaOptions>,
}

/// What the Kafka world adds to a seed (see the module documentation). Rates of 0 are off.
#[derive(Clone, Debug)]
pub struct KafkaOptions {
    /// Mesh instances sharing the broker and the progress store (1..=3).
    pub instances: u32,
    /// Partitions added to the classic draw (more lanes to spread over the instances).
    pub extra_partitions: u32,
    /// Chance per published record that a transaction marker follows it.
    pub markers: f64,
    /// Chance per published record that an aborted transaction (records and its marker)
    /// comes before it.
    pub aborted: f64,
    /// Mean time between compaction runs, and the chance that a superseded record goes.
    pub compaction_every_ms: Millis,
    pub compaction_rate: f64,
    /// Mean time between losses of a partition's tail (unclean leader elections).
    pub truncation_every_ms: Millis,
    /// Chance, when a lane is handed out with ACK ranges in its checkpoint, that retention
    /// deletes into those ranges first.
    pub retention_over_ranges: f64,
    /// Each answer of the store is late by up to this (so answers overtake each other).
    pub persist_answer_ms: Millis,
    /// Chance that the store answers a batch twice.
    pub persist_answer_twice: f64,
    /// How long the coordinator keeps a dead instance's lanes before it expires it.
    pub session_ms: Millis,
    /// Mean time between a member leaving the group (cleanly) for `away_ms`.
    pub leave_every_ms: Millis,
    pub away_ms: Millis,
    /// Mean time between an instance becoming a zombie (its session expires while it runs)
    /// for `zombie_ms`.
    pub zombie_every_ms: Millis,
    pub zombie_ms: Millis,
    /// Chance per wake-up that a client polls another instance than last time.
    pub client_switch: f64,
    /// One filter per group (replacing the classic type filter), on the richer events.
    pub filters: Vec<Filter>,
    /// The seed of the Kafka world's own draws during the run.
    pub seed: u64,
}

/// Sources, subjects and extension values the Kafka world's events are drawn from.
pub const SOURCES: [&str; 3] = ["/sim", "/sim/eu", "/shop"];
pub const SUBJECTS: [&str; 3] = ["eu/1", "eu/2", "us/1"];
pub const REGIONS: [&str; 2] = ["eu", "us"];
pub const TIERS: [&str; 2] = ["gold", "silver"];

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
    /// The Kafka world of a seed: its classic options and the Kafka world's on top.
    pub fn swarm(seed: u64, size: Size) -> Self {
        let mut o = Self::swarm_classic(seed, size);
        let k = KafkaOptions::swarm(seed, &o);
        // A POP broker (RocketMQ's) has dense offsets and keeps its tail: the Kafka
        // broker's own faults stay off there; the cluster's apply all the same.
        let k = if o.pop {
            KafkaOptions {
                markers: 0.0,
                aborted: 0.0,
                compaction_every_ms: 0,
                truncation_every_ms: 0,
                ..k
            }
        } else {
            k
        };
        o.partitions += k.extra_partitions;
        o.kafka = Some(k);
        o
    }

    /// The classic world of a seed, drawn exactly as before the Kafka world existed.
    pub fn swarm_classic(seed: u64, size: Size) -> Self {
        let mut rng = Rng::new(seed ^ 0x5157_4152_4d00_0000);
        let (max_records, phase) = match size {
            Size::Small => (60, 3_000),
            Size::Normal => (240, 8_000),
        };
        let partitions = rng.range(1, 3) as u32;
        let group_count = rng.range(1, 3);
        let mut groups = Vec::new();
        for i in 0..group_count {
            let ack_timeout_ms = rng.range(20, 400);
            let clients = (0..rng.range(1, 3))
                .map(|_| ClientOptions {
                    ack: 0.5 + 0.5 * rng.unit(),
                    nack: maybe(&mut rng, 0.02, 0.3),
                    ignore: maybe(&mut rng, 0.02, 0.3),
                    late_ack: maybe(&mut rng, 0.02, 0.3),
                    double_ack: maybe(&mut rng, 0.02, 0.3),
                    extend: maybe(&mut rng, 0.02, 0.2),
                    stale_ack: maybe(&mut rng, 0.05, 0.5),
                    bogus_ack: maybe(&mut rng, 0.01, 0.2),
                    disconnect: maybe(&mut rng, 0.005, 0.05),
                    ack_delay_ms: rng.range(0, ack_timeout_ms),
                    poll_max: rng.range(1, 8) as u32,
                    wake_ms: rng.range(2, 60),
                })
                .collect();
            groups.push(GroupOptions {
                name: format!("g{i}"),
                type_filter: if rng.chance(0.3) {
                    Some(["a.created", "b.created"][rng.index(2)].to_string())
                } else {
                    None
                },
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
            });
        }
        let faults = FaultRates {
            crash_every_ms: maybe_every(&mut rng, 150, 2_000),
            crash_mid_persist: rng.unit(),
            restart_after_ms: rng.range(0, 300),
            persist_fail: maybe(&mut rng, 0.01, 0.2),
            persist_latency_ms: rng.range(0, 40),
            fetch_fail: maybe(&mut rng, 0.01, 0.2),
            fetch_duplicates: maybe(&mut rng, 0.05, 0.5),
            fetch_rewind: maybe(&mut rng, 0.05, 0.3),
            fetch_spurious_out_of_range: maybe(&mut rng, 0.01, 0.1),
            fetch_answer_twice: maybe(&mut rng, 0.05, 0.3),
            fetch_latency_ms: rng.range(0, 60),
            delivery_lost: maybe(&mut rng, 0.01, 0.1),
            retention_every_ms: maybe_every(&mut rng, 200, 2_000),
            rebalance_every_ms: maybe_every(&mut rng, 200, 2_000),
            seek_every_ms: maybe_every(&mut rng, 300, 3_000),
            replay_every_ms: maybe_every(&mut rng, 200, 2_000),
            clock_jump_every_ms: maybe_every(&mut rng, 300, 3_000),
            clock_glitch: maybe(&mut rng, 0.001, 0.05),
            flush_now: maybe(&mut rng, 0.001, 0.05),
        };
        let records = rng.range(5, max_records) as u32;
        Options {
            seed,
            size,
            partitions,
            records_before: rng.range(0, 10) as u32,
            records,
            poison: maybe(&mut rng, 0.01, 0.1),
            undecodable: maybe(&mut rng, 0.01, 0.05),
            keys: rng.range(1, 6) as u32,
            groups,
            fault_phase_ms: rng.range(phase / 3, phase),
            max_window_per_lane: rng.range(2, 64) as usize,
            max_ack_ranges_per_lane: rng.range(1, 32) as usize,
            fetch_batch: rng.range(1, 32) as usize,
            flush_interval_ms: rng.range(1, 50),
            max_outstanding_persists: rng.range(1, 4) as usize,
            client_idle_timeout_ms: rng.range(200, 5_000),
            commit_to_broker: rng.chance(0.5),
            pop: rng.chance(0.3),
            broker_wait_ms: rng.range(5, 100),
            faults,
            kafka: None,
        }
    }
}

impl KafkaOptions {
    /// Draws the Kafka world's options of a seed from their own generator.
    fn swarm(seed: u64, classic: &Options) -> Self {
        let mut rng = Rng::new(seed ^ 0x4b41_464b_4157_4c44);
        let phase = classic.fault_phase_ms.max(1);
        let instances = rng.range(1, 3) as u32;
        let mut k = KafkaOptions {
            instances,
            extra_partitions: rng.range(0, 2) as u32,
            markers: maybe(&mut rng, 0.05, 0.5),
            aborted: maybe(&mut rng, 0.02, 0.2),
            compaction_every_ms: maybe_every(&mut rng, phase / 8, phase),
            compaction_rate: 0.2 + 0.8 * rng.unit(),
            truncation_every_ms: maybe_every(&mut rng, phase / 6, phase),
            retention_over_ranges: maybe(&mut rng, 0.2, 1.0),
            persist_answer_ms: if rng.chance(0.5) { 0 } else { rng.range(1, 60) },
            persist_answer_twice: maybe(&mut rng, 0.05, 0.3),
            session_ms: rng.range(20, 400),
            leave_every_ms: maybe_every(&mut rng, 300, 3_000),
            away_ms: rng.range(0, 500),
            zombie_every_ms: maybe_every(&mut rng, 300, 3_000),
            zombie_ms: rng.range(10, 600),
            client_switch: if instances > 1 {
                0.05 + 0.5 * rng.unit()
            } else {
                0.0
            },
            filters: Vec::new(),
            seed: rng.next_u64(),
        };
        for g in &classic.groups {
            k.filters.push(draw_filter(&mut rng, g.type_filter.clone()));
        }
        k
    }
}

/// A filter on the Kafka world's events: the classic type filter plus, each now and then,
/// a type prefix, a source, a subject or subject prefix, and extension conditions.
fn draw_filter(rng: &mut Rng, ty: Option<String>) -> Filter {
    let pick = |rng: &mut Rng, v: &[&str]| v[rng.index(v.len())].to_string();
    let mut f = Filter {
        ty,
        ..Filter::default()
    };
    if rng.chance(0.15) {
        f.type_prefix = Some(pick(rng, &["a.", "b", "a.cr", ""]));
    }
    if rng.chance(0.15) {
        f.source = Some(pick(rng, &SOURCES));
    }
    if rng.chance(0.1) {
        f.subject = Some(pick(rng, &SUBJECTS));
    } else if rng.chance(0.15) {
        f.subject_prefix = Some(pick(rng, &["eu/", "us", ""]));
    }
    if rng.chance(0.15) {
        f.extensions.push(("region".into(), pick(rng, &REGIONS)));
    }
    if rng.chance(0.1) {
        f.extensions
            .push(("partitionkey".into(), format!("k{}", rng.below(3))));
    }
    if rng.chance(0.1) {
        f.extensions.push(("tier".into(), pick(rng, &TIERS)));
    }
    f.extensions.sort();
    f
}

impl fmt::Display for Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "SEED={} size={:?}", self.seed, self.size)?;
        writeln!(
            f,
            "  partitions={} records_before={} records={} poison={:.3} undecodable={:.3} keys={} fault_phase_ms={}",
            self.partitions, self.records_before, self.records, self.poison, self.undecodable, self.keys, self.fault_phase_ms
        )?;
        writeln!(
            f,
            "  window={} ack_ranges={} fetch_batch={} flush_ms={} outstanding_persists={} idle_ms={} commit={} pop={} broker_wait_ms={}",
            self.max_window_per_lane,
            self.max_ack_ranges_per_lane,
            self.fetch_batch,
            self.flush_interval_ms,
            self.max_outstanding_persists,
            self.client_idle_timeout_ms,
            self.commit_to_broker,
            self.pop,
            self.broker_wait_ms
        )?;
        writeln!(f, "  faults: {:?}", self.faults)?;
        if let Some(k) = &self.kafka {
            writeln!(
                f,
                "  kafka: instances={} extra_partitions={} markers={:.3} aborted={:.3} compaction_every_ms={} compaction_rate={:.2} truncation_every_ms={} retention_over_ranges={:.2} persist_answer_ms={} persist_answer_twice={:.3} session_ms={} leave_every_ms={} away_ms={} zombie_every_ms={} zombie_ms={} client_switch={:.2}",
                k.instances, k.extra_partitions, k.markers, k.aborted, k.compaction_every_ms, k.compaction_rate, k.truncation_every_ms, k.retention_over_ranges, k.persist_answer_ms, k.persist_answer_twice, k.session_ms, k.leave_every_ms, k.away_ms, k.zombie_every_ms, k.zombie_ms, k.client_switch
            )?;
        } else {
            writeln!(f, "  world: classic")?;
        }
        for g in &self.groups {
            writeln!(
                f,
                "  group {}: filter={:?} ordering={:?} ack_timeout_ms={} max_attempts={} backoff={:?} max_in_flight={} latest={}",
                g.name, g.type_filter, g.ordering, g.ack_timeout_ms, g.max_attempts, g.backoff, g.max_in_flight, g.start_latest
            )?;
            if let Some(k) = &self.kafka {
                if let Some(filter) = self
                    .groups
                    .iter()
                    .position(|x| x.name == g.name)
                    .and_then(|i| k.filters.get(i))
                {
                    writeln!(f, "    kafka filter: {filter:?}")?;
                }
            }
            for (i, c) in g.clients.iter().enumerate() {
                writeln!(f, "    client {i}: {c:?}")?;
            }
        }
        Ok(())
    }
}
