//! What the test files of every shape share (`tests/{seeds,kafka,groups}.rs`): reading
//! their variables, a sweep of seeds with its figures, a replay, and the same seed run
//! twice.

use crate::counts::Counts;
use crate::run::{Failure, Report};

/// A seed's run: `Ok` with its report, or everything needed to replay its failure.
pub type RunSeed = dyn Fn(u64) -> Result<Report, Box<Failure>>;

/// The number in variable `name`, or `default` when it is unset or not a number.
pub fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Whether `MADSIM_TEST_CHECK_DETERMINISM` is set.
pub fn checking_determinism() -> bool {
    std::env::var_os("MADSIM_TEST_CHECK_DETERMINISM").is_some()
}

/// What a sweep did.
#[derive(Debug, Default)]
pub struct Swept {
    pub seeds: u64,
    pub secs: f64,
    /// Summed over the passing seeds.
    pub counts: Counts,
    pub failed: Vec<u64>,
}

impl Swept {
    pub fn seeds_per_sec(&self) -> f64 {
        self.seeds as f64 / self.secs.max(1e-9)
    }
}

/// Runs seeds `from..from + n` with `run`, printing each failure (with the test that
/// replays it, `replay_test`: "FILE NAME") and then `what` with the seeds/s and the faults
/// injected (`note` added in the parentheses, when not empty).
pub fn sweep(what: &str, replay_test: &str, note: &str, from: u64, n: u64, run: &RunSeed) -> Swept {
    let (file, name) = replay_test.split_once(' ').unwrap_or((replay_test, ""));
    let started = std::time::Instant::now();
    let mut swept = Swept {
        seeds: n,
        ..Swept::default()
    };
    for seed in from..from + n {
        match run(seed) {
            Ok(r) => swept.counts += &r.counts,
            Err(f) => {
                eprintln!("{f}");
                eprintln!(
                    "({what}: replay with `MADSIM_TEST_SEED={seed} RUSTFLAGS=\"--cfg madsim\" cargo test -p unimesh-sim-shell --test {file} {name} -- --nocapture`)"
                );
                swept.failed.push(seed);
            }
        }
    }
    swept.secs = started.elapsed().as_secs_f64();
    let note = if note.is_empty() {
        String::new()
    } else {
        format!(", {note}")
    };
    eprintln!(
        "{what}: {n} seeds in {:.1} s ({:.2} seeds/s{note}); injected: {}",
        swept.secs,
        swept.seeds_per_sec(),
        swept.counts
    );
    swept
}

/// Runs one seed and prints its report; panics with the failure.
pub fn replay(what: &str, seed: u64, run: &RunSeed) -> Report {
    match run(seed) {
        Ok(r) => {
            eprintln!(
                "{what} seed {seed}: {} steps, {} incarnations, {} ms simulated, trace {:016x}\n  injected: {}\n  checker: {:?}",
                r.steps, r.incarnations, r.sim_ms, r.trace_hash, r.counts, r.stats
            );
            r
        }
        Err(f) => panic!("{f}"),
    }
}

/// Runs one seed twice in this process and asserts the same trace and steps; returns the
/// first run's report.
pub fn same_seed_twice(what: &str, seed: u64, run: &RunSeed) -> Report {
    let first = run(seed).unwrap_or_else(|f| panic!("{f}"));
    let again = run(seed).unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(
        first.trace_hash, again.trace_hash,
        "seed {seed} replayed differently ({what})"
    );
    assert_eq!(first.steps, again.steps, "seed {seed} ({what})");
    first
}
