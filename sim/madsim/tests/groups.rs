//! The Kafka group path under madsim (built only with `RUSTFLAGS="--cfg madsim"`): two or
//! three mesh nodes on one simulated broker, each node's consumer a member of the
//! harness's group coordinator and driving the shell's own `kafka/rules/` (the decisions
//! the librdkafka consumer ships with): joins, leaves, session expiry of killed and paused
//! nodes, generations, cooperative-sticky incremental assignment, zombies that run on after
//! their partitions moved (lost heartbeats, pauses past the session timeout), kills and
//! restarts — with the contract checker judging C1–C9 across the instances.
//!
//! - `groups_sweep`: `UNIMESH_GROUP_SEEDS` seeds (default 40) from `MADSIM_TEST_SEED`
//!   (default 0); every failure printed with its replay command. With
//!   `MADSIM_TEST_CHECK_DETERMINISM` set, the first `UNIMESH_GROUP_DETERMINISM_SEEDS`
//!   (default 4) also go through madsim's determinism check.
//! - `groups_replay`: the seed in `MADSIM_TEST_SEED` (default 0), with its report.
//! - `groups_same_seed_same_trace`: a seed run twice gives the same trace.

#![cfg(madsim)]

use unimesh_sim_shell::sweep::{checking_determinism, env_u64, replay, same_seed_twice, sweep};
use unimesh_sim_shell::{check_determinism_groups, run_shape, Failure, Report, GROUPS};

fn run_groups(seed: u64) -> Result<Report, Box<Failure>> {
    run_shape(seed, GROUPS)
}

#[test]
fn groups_sweep() {
    let n = env_u64("UNIMESH_GROUP_SEEDS", 40);
    let from = env_u64("MADSIM_TEST_SEED", 0);
    let checked = if checking_determinism() {
        env_u64("UNIMESH_GROUP_DETERMINISM_SEEDS", 4)
    } else {
        0
    };
    let run = move |seed: u64| {
        if seed < from + checked {
            check_determinism_groups(seed)
        } else {
            run_groups(seed)
        }
    };
    let note = format!("determinism checked: {checked}");
    let swept = sweep("groups", "groups groups_replay", &note, from, n, &run);
    let counts = swept.counts;
    assert!(
        swept.failed.is_empty(),
        "failing seeds of the group shape: {:?}",
        swept.failed
    );
    // A sweep in which no member was expired, nothing moved between nodes or no zombie's
    // commit was refused proved nothing about the group path.
    if n >= 20 {
        assert!(counts.kills > 0, "no kill in {n} seeds: {counts}");
        assert!(
            counts.pauses > 0 && counts.heartbeat_losses > 0,
            "no pause or no lost heartbeat in {n} seeds: {counts}"
        );
        assert!(
            counts.members_expired > 0,
            "no member expired in {n} seeds: {counts}"
        );
        assert!(
            counts.commits_fenced > 0,
            "no commit of a replaced member refused in {n} seeds: {counts}"
        );
        assert!(
            counts.resumed_from_progress > 0,
            "no partition resumed from the progress topic in {n} seeds: {counts}"
        );
    }
}

#[test]
fn groups_replay() {
    replay("groups", env_u64("MADSIM_TEST_SEED", 0), &run_groups);
}

#[test]
fn groups_same_seed_same_trace() {
    same_seed_twice(
        "the group shape",
        env_u64("MADSIM_TEST_SEED", 5),
        &run_groups,
    );
}
