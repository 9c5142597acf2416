//! The shell under madsim, seed by seed (built only with `RUSTFLAGS="--cfg madsim"`).
//!
//! - `sweep`: `MADSIM_TEST_NUM` seeds (default 200) from `MADSIM_TEST_SEED` (default 0),
//!   madsim's own variables; every failure is printed with its seed, options, the faults
//!   injected, the last steps and the command that replays it.
//! - `replay`: the seed in `MADSIM_TEST_SEED` (default 0), with its report.
//! - `same_seed_same_trace`: a seed run twice gives the same trace hash, and another seed
//!   another one; with `MADSIM_TEST_CHECK_DETERMINISM` set, the seed also goes through
//!   madsim's own determinism check (every random draw compared).

#![cfg(madsim)]

use unimesh_sim_shell::sweep::{
    checking_determinism, env_u64, replay as replay_seed, same_seed_twice, sweep as run_sweep,
};
use unimesh_sim_shell::{check_determinism, run_seed};

#[test]
fn sweep() {
    let n = env_u64("MADSIM_TEST_NUM", 200);
    let from = env_u64("MADSIM_TEST_SEED", 0);
    let swept = run_sweep("embedded", "seeds replay", "", from, n, &run_seed);
    let counts = swept.counts;
    assert!(swept.failed.is_empty(), "failing seeds: {:?}", swept.failed);
    // A sweep of many seeds that injected nothing proves nothing; nor one in which no
    // engine ever handed back what a poll whose request had gone was handed (the #5282
    // path, which the tracker holds to "at once").
    if n >= 50 {
        assert!(counts.kills > 0 && counts.fetch_duplicates > 0 && counts.persist_failures > 0);
        assert!(
            counts.polls_handed_back > 0,
            "no hand-back of an ended poll: {counts}"
        );
    }
}

#[test]
fn replay() {
    replay_seed("embedded", env_u64("MADSIM_TEST_SEED", 0), &run_seed);
}

#[test]
fn same_seed_same_trace() {
    let seed = env_u64("MADSIM_TEST_SEED", 7);
    let first = same_seed_twice("embedded", seed, &run_seed);
    let other = run_seed(seed + 1).unwrap_or_else(|f| panic!("{f}"));
    assert_ne!(
        first.trace_hash, other.trace_hash,
        "the trace hash ignores the seed"
    );
    if checking_determinism() {
        let checked = check_determinism(seed).unwrap_or_else(|f| panic!("{f}"));
        assert_eq!(checked.trace_hash, first.trace_hash);
    }
}
