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

use unimesh_sim_shell::{check_determinism_kafka, kafka_backend, run_seed_on, Counts};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn kafka_sweep() {
    let n = env_u64("UNIMESH_KAFKA_SEEDS", 24);
    let from = env_u64("MADSIM_TEST_SEED", 0);
    let started = std::time::Instant::now();
    let mut failed = Vec::new();
    let mut counts = Counts::default();
    let determinism = std::env::var_os("MADSIM_TEST_CHECK_DETERMINISM").is_some();
    for seed in from..from + n {
        let run = if determinism {
            check_determinism_kafka(seed)
        } else {
            run_seed_on(seed, kafka_backend)
        };
        match run {
            Ok(r) => counts += &r.counts,
            Err(f) => {
                eprintln!("{f}");
                eprintln!("(on the Kafka backend: replay with `--test kafka kafka_replay`)");
                failed.push(seed);
            }
        }
    }
    let secs = started.elapsed().as_secs_f64();
    eprintln!(
        "kafka: {n} seeds in {secs:.1} s ({:.2} seeds/s, determinism checked: {determinism}); injected: {counts}",
        n as f64 / secs.max(1e-9)
    );
    assert!(failed.is_empty(), "failing seeds on Kafka: {failed:?}");
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
    let seed = env_u64("MADSIM_TEST_SEED", 0);
    match run_seed_on(seed, kafka_backend) {
        Ok(r) => eprintln!(
            "kafka seed {seed}: {} steps, {} incarnations, {} ms simulated, trace {:016x}\n  injected: {}\n  checker: {:?}",
            r.steps, r.incarnations, r.sim_ms, r.trace_hash, r.counts, r.stats
        ),
        Err(f) => panic!("{f}"),
    }
}

#[test]
fn kafka_same_seed_same_trace() {
    let seed = env_u64("MADSIM_TEST_SEED", 3);
    let first = run_seed_on(seed, kafka_backend).unwrap_or_else(|f| panic!("{f}"));
    let again = run_seed_on(seed, kafka_backend).unwrap_or_else(|f| panic!("{f}"));
    assert_eq!(
        first.trace_hash, again.trace_hash,
        "seed {seed} replayed differently on Kafka"
    );
    assert_eq!(first.steps, again.steps);
    if std::env::var_os("MADSIM_TEST_CHECK_DETERMINISM").is_some() {
        let checked = check_determinism_kafka(seed).unwrap_or_else(|f| panic!("{f}"));
        assert_eq!(checked.trace_hash, first.trace_hash);
    }
}
