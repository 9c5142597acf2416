//! Running many seeds: in order, on a few threads, with progress and totals.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use crate::faults::FaultCounts;
use crate::harness::{run, Failure};
use crate::options::{Size, World};

/// Totals over a sweep.
#[derive(Clone, Debug, Default)]
pub struct Totals {
    pub seeds: u64,
    pub steps: u64,
    pub records: u64,
    pub deliveries: u64,
    pub repeated_first_attempts: u64,
    pub late_acks: u64,
    pub stale_rejected: u64,
    pub dead_letters: u64,
    pub zombie_deliveries: u64,
    pub lost_deliveries: u64,
    pub truncations_reported: u64,
    pub done_by_absence: u64,
    pub faults: FaultCounts,
}

/// Runs seeds `from..from + count` of the Kafka world on `jobs` threads (see
/// [`sweep_world`]).
pub fn sweep(
    from: u64,
    count: u64,
    size: Size,
    jobs: usize,
    progress: impl FnMut(&Totals, f64) + Send,
) -> (Totals, Option<Failure>) {
    sweep_world(from, count, size, World::Kafka, jobs, progress)
}

/// Runs seeds `from..from + count` of `world` on `jobs` threads. Returns the totals and
/// the failure with the lowest seed, if any (the sweep stops handing out seeds after a
/// failure).
pub fn sweep_world(
    from: u64,
    count: u64,
    size: Size,
    world: World,
    jobs: usize,
    mut progress: impl FnMut(&Totals, f64) + Send,
) -> (Totals, Option<Failure>) {
    let next = AtomicU64::new(from);
    let stop = AtomicBool::new(false);
    let totals = Mutex::new(Totals::default());
    let failure: Mutex<Option<Failure>> = Mutex::new(None);
    let progress = Mutex::new(&mut progress);
    let start = Instant::now();
    let end = from.saturating_add(count);
    std::thread::scope(|s| {
        for _ in 0..jobs.max(1) {
            s.spawn(|| loop {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= end {
                    return;
                }
                match run(world.options(seed, size)) {
                    Ok(r) => {
                        let snapshot = {
                            let mut t = totals.lock().unwrap_or_else(|e| e.into_inner());
                            t.seeds += 1;
                            t.steps += r.steps;
                            t.records += r.records;
                            t.deliveries += r.stats.deliveries;
                            t.repeated_first_attempts += r.stats.repeated_first_attempts;
                            t.late_acks += r.stats.late_acks_accepted;
                            t.stale_rejected += r.stats.stale_rejected;
                            t.dead_letters += r.dead_letters as u64;
                            t.zombie_deliveries += r.stats.zombie_deliveries;
                            t.lost_deliveries += r.stats.lost_deliveries;
                            t.truncations_reported += r.stats.truncations_reported;
                            t.done_by_absence += r.stats.done_by_absence;
                            t.faults += &r.faults;
                            (t.seeds % 1000 == 0).then(|| t.clone())
                        };
                        if let Some(t) = snapshot {
                            let mut p = progress.lock().unwrap_or_else(|e| e.into_inner());
                            (*p)(&t, start.elapsed().as_secs_f64());
                        }
                    }
                    Err(f) => {
                        stop.store(true, Ordering::Relaxed);
                        let mut slot = failure.lock().unwrap_or_else(|e| e.into_inner());
                        if slot.as_ref().is_none_or(|old| f.seed < old.seed) {
                            *slot = Some(f);
                        }
                    }
                }
            });
        }
    });
    (
        totals.into_inner().unwrap_or_else(|e| e.into_inner()),
        failure.into_inner().unwrap_or_else(|e| e.into_inner()),
    )
}

/// Reads a list of `seed trace-hash digest` lines (hex hashes; `#` starts a comment).
pub fn parse_hash_list(text: &str) -> Result<Vec<(u64, u64, u64)>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut it = line.split_whitespace();
        let mut field = |what: &str, radix: u32| -> Result<u64, String> {
            let v = it
                .next()
                .ok_or_else(|| format!("line {}: no {what}", n + 1))?;
            u64::from_str_radix(v, radix).map_err(|_| format!("line {}: bad {what} {v:?}", n + 1))
        };
        let seed = field("seed", 10)?;
        let trace = field("trace hash", 16)?;
        let digest = field("digest", 16)?;
        out.push((seed, trace, digest));
    }
    Ok(out)
}
