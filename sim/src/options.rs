//! Swarm options: every size, behaviour and fault rate of one run is drawn from its seed
//! (TigerBeetle's `options_swarm`), so different seeds exercise different mixes — some with
//! no crash at all and many rebalances, some with a crash every few hundred milliseconds.
//! The options are printed before the run, so a failure report says what was going on.

use std::fmt;

use unimesh_core::{Backoff, Millis, Ordering};

use crate::rng::Rng;

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
    pub fn swarm(seed: u64, size: Size) -> Self {
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
        }
    }
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
        for g in &self.groups {
            writeln!(
                f,
                "  group {}: filter={:?} ordering={:?} ack_timeout_ms={} max_attempts={} backoff={:?} max_in_flight={} latest={}",
                g.name, g.type_filter, g.ordering, g.ack_timeout_ms, g.max_attempts, g.backoff, g.max_in_flight, g.start_latest
            )?;
            for (i, c) in g.clients.iter().enumerate() {
                writeln!(f, "    client {i}: {c:?}")?;
            }
        }
        Ok(())
    }
}
