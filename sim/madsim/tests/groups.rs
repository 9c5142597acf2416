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

use unimesh_sim_shell::{check_determinism_groups, run_shape, Counts, GROUPS};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn groups_sweep() {
    let n = env_u64("UNIMESH_GROUP_SEEDS", 40);
    let from = env_u64("MADSIM_TEST_SEED", 0);
    let checked = if std::env::var_os("MADSIM_TEST_CHECK_DETERMINISM").is_some() {
        env_u64("UNIMESH_GROUP_DETERMINISM_SEEDS", 4)
    } else {
        0
    };
    let started = std::time::Instant::now();
    let mut failed = Vec::new();
    let mut counts = Counts::default();
    for seed in from..from + n {
        let run = if seed < from + checked {
            check_determinism_groups(seed)
        } else {
            run_shape(seed, GROUPS)
        };
        match run {
            Ok(r) => counts += &r.counts,
            Err(f) => {
                eprintln!("{f}");
                eprintln!("(the group shape: replay with `--test groups groups_replay`)");
                failed.push(seed);
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "groups: {n} seeds in {secs:.1} s ({:.2} seeds/s, determinism checked: {checked}); injected: {counts}",
        n as f64 / secs.max(1e-9)
    );
    assert!(
        failed.is_empty(),
        "failing seeds of the group shape: {failed:?}"
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
    let seed = env_u64("MADSIM_TEST_SEED", 0);
    match run_shape(seed, GROUPS) {
        Ok(r) => eprintln!(
            "groups seed {seed}: {} steps, {} incarnations, {} ms simulated, trace {:016x}\n  injected: {}\n  checker: {:?}",
            r.steps, r.incarnations, r.sim_ms, r.trace_hash, r.counts, r.stats
        ),
        Err(f) => panic!("{f}"),
    }
}

#[test]
fn groups_same_seed_same_trace() {
    let seed = env_u64("MADSIM_TEST_SEED", 5);
    let first = run_shape(seed, GROUPS).unwrap_or_else(|f| panic!("{f}"));
    let again = run_shape(seed, GROUPS).unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(
        first.trace_hash, again.trace_hash,
        "seed {seed} of the group shape replayed differently"
    );
    assert_eq!(first.steps, again.steps);
}
