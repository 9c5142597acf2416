//! The shell's Kafka port under madsim, against madsim-rdkafka's simulated broker (built
//! only with `RUSTFLAGS="--cfg madsim"`): the harness's whole workload — publishes,
//! deliveries, ACKs, NACKs, dead letters, replays, kills and restarts of the mesh node —
//! with the contract checker on, seed by seed. The broker has no consumer groups: the port
//! assigns every partition explicitly and resumes each from its record in the progress
//! topic, so every restart is an exact resume the checker holds to "an ACK made durable is
//! never delivered again".
//!
//! - `kafka_sweep`: `UNIMESH_KAFKA_SEEDS` seeds (default 24) from `MADSIM_TEST_SEED`
//!   (default 0); every failure printed with its replay command. With
//!   `MADSIM_TEST_CHECK_DETERMINISM` set, every seed goes through madsim's determinism
//!   check (run twice, every random draw compared) and a third run's trace hash is compared.
//! - `kafka_replay`: the seed in `MADSIM_TEST_SEED` (default 0), with its report.
//! - `kafka_same_seed_same_trace`: a seed run twice gives the same trace; with
//!   `MADSIM_TEST_CHECK_DETERMINISM` set, also madsim's own check (every random draw).

#![cfg(madsim)]

use unimesh_sim_shell::sweep::{checking_determinism, env_u64, replay, same_seed_twice, sweep};
use unimesh_sim_shell::{check_determinism_kafka, kafka_backend, run_seed_on};

fn run_kafka(seed: u64) -> Result<unimesh_sim_shell::Report, Box<unimesh_sim_shell::Failure>> {
    run_seed_on(seed, kafka_backend)
}

#[test]
fn kafka_sweep() {
    let n = env_u64("UNIMESH_KAFKA_SEEDS", 24);
    let from = env_u64("MADSIM_TEST_SEED", 0);
    let determinism = checking_determinism();
    let run: &unimesh_sim_shell::sweep::RunSeed = if determinism {
        &check_determinism_kafka
    } else {
        &run_kafka
    };
    let note = format!("determinism checked: {determinism}");
    let swept = sweep("kafka", "kafka kafka_replay", &note, from, n, run);
    let counts = swept.counts;
    assert!(
        swept.failed.is_empty(),
        "failing seeds on Kafka: {:?}",
        swept.failed
    );
    // A sweep in which no node was killed, or no restart resumed a partition from its
    // progress record, proved nothing about exact resume.
    if n >= 8 {
        assert!(counts.kills > 0, "no kill in {n} seeds: {counts}");
        assert!(
            counts.resumed_from_progress > 0,
            "no partition resumed from the progress topic in {n} seeds: {counts}"
        );
        assert!(counts.acks > 0, "nothing ACKed: {counts}");
    }
}

#[test]
fn kafka_replay() {
    replay("kafka", env_u64("MADSIM_TEST_SEED", 0), &run_kafka);
}

#[test]
fn kafka_same_seed_same_trace() {
    let seed = env_u64("MADSIM_TEST_SEED", 3);
    let first = same_seed_twice("kafka", seed, &run_kafka);
    if checking_determinism() {
        let checked = check_determinism_kafka(seed).unwrap_or_else(|f| panic!("{f}"));
        assert_eq!(checked.trace_hash, first.trace_hash);
    }
}
