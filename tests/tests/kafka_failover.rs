//! Scale-out and failover on Kafka: two `unimesh serve --storage kafka` instances share one
//! subscription group on a real Kafka-protocol broker (tansu); Kafka's group coordinator
//! splits the partitions between them.
//!
//! Phases, each checked against docs/DESIGN.md §3:
//! 1. sharing and split: a group defined on one instance is served by both (definitions
//!    live in a compacted topic); each instance serves a disjoint part of the partitions, together all of them
//!    (seen in each one's `/admin/offsets`, `owner`);
//! 2. SIGKILL one mid-load: the other takes its partitions over and every event is ACKed
//!    (C1: no loss). An event comes back only if it was in flight at the kill: its ACK was
//!    answered by the killed instance after that instance's last durability barrier (C2:
//!    nothing whose ACK was persisted is delivered again);
//! 3. the killed instance restarts and the partitions spread again;
//! 4. SIGTERM of one mid-load: the other takes over with zero duplicates (a graceful stop
//!    flushes and commits before it hands the partitions on).
//!
//! Durability barriers instead of clocks (as in `crash.rs`): `PUT /v1/subscriptions/{g}`
//! answers once everything pending, progress included, is durable, so every ACK answered
//! before it was sent is in the progress topic.
//!
//! The kill runs on librdkafka's mock cluster with the README's faster-takeover setting in
//! `[kafka.consumer]` (the kill on tansu, and with every default: `kafka_takeover.rs`); the
//! graceful stop and the restart run on tansu too.
//!
//! Prints the figures: events, kills, duplicates delivered, and the time from the kill to
//! the first delivery of a moved partition (a figure, not an assertion).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use unimesh_tests::kafka::Broker;
use unimesh_tests::pair::{Book, Scenario};
use unimesh_tests::Server;

const SC: Scenario = Scenario {
    topic: "work",
    group: "workers",
    partitions: 4,
};
const EVENTS_PER_PHASE: usize = 400;
const DRAIN_TIMEOUT: Duration = Duration::from_secs(180);
const SPLIT_TIMEOUT: Duration = Duration::from_secs(90);

fn options(broker: &Broker, name: &str) -> unimesh_tests::Options {
    // The README's setting for a faster takeover, so a killed instance's partitions move
    // within seconds (librdkafka's defaults: `kafka_takeover.rs`).
    broker.server_options(name, SC.partitions).toml(
        "[kafka.consumer]\n\"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"500\"\n\
         [mesh]\nflush_interval_ms = 20\n",
    )
}

/// Load through both instances, SIGTERM `stopping` mid-load, drain through `live`: every
/// event ACKed and none delivered twice (a graceful stop flushes and commits before it
/// hands its partitions on). Returns the duplicates (checked to be only deliveries whose
/// ACK raced an earlier rebalance).
fn stop_phase(
    book: &mut Book,
    live: &Server,
    stopping: &mut Server,
    phase: &str,
) -> Vec<(String, u32)> {
    book.load(
        (&*stopping, "b"),
        (live, "a"),
        phase,
        EVENTS_PER_PHASE / 2,
        EVENTS_PER_PHASE / 4,
    );
    let revoked_before_stop = book.revoked();
    let status = stopping.terminate();
    assert!(
        status.success(),
        "stopped with {status}\n{}",
        stopping.stderr()
    );
    book.drain(
        &[(live, "a")],
        phase,
        EVENTS_PER_PHASE,
        &BTreeSet::new(),
        Instant::now(),
        DRAIN_TIMEOUT,
        &|| format!("offsets {:?}", live.offsets(SC.topic)),
    );
    let dups = book.duplicates(phase);
    // A delivery whose ACK raced an earlier rebalance may come back (it was in flight);
    // nothing else may.
    for (id, n) in &dups {
        assert!(
            book.was_revoked(id),
            "{id} delivered {n} times across a graceful stop"
        );
    }
    assert_eq!(
        book.revoked(),
        revoked_before_stop,
        "{phase}: no ACK is refused as revoked during a graceful stop"
    );
    dups
}

/// Goal: partitions move between instances through Kafka's group coordinator with the
/// delivery contract intact, on a crash and on a graceful stop. Method: the phases of the
/// file header, on librdkafka's mock cluster (the kill on tansu, and with every default:
/// `kafka_takeover.rs`; the graceful path on tansu: below).
#[test]
fn two_instances_split_partitions_and_take_over_on_kill_and_on_stop() {
    let broker = Broker::start_mock();
    let mut a = Server::start(options(&broker, "a"));
    let mut b = Server::start(options(&broker, "b"));
    // Defined on one instance, served by both: definitions are shared through Kafka.
    let [a_parts, _] = SC.share(&a, &b, SPLIT_TIMEOUT);

    // ----- phase 1: load, then SIGKILL a mid-load -----
    let mut book = Book::new(SC);
    book.load(
        (&a, "a"),
        (&b, "b"),
        "p1",
        EVENTS_PER_PHASE / 2,
        EVENTS_PER_PHASE / 4,
    );
    book.killed("a");
    a.kill9();
    let killed = Instant::now();
    let first_moved = book.drain(
        &[(&b, "b")],
        "p1",
        EVENTS_PER_PHASE,
        &a_parts,
        killed,
        DRAIN_TIMEOUT,
        &String::new,
    );
    // C2, and the bound on duplicates: ACKs the killed instance answered after its last
    // barrier.
    let after_kill = book.check_after_kill("p1", "a");
    assert!(book.all_acked("p1"), "C1: every event ACKed");

    // ----- phase 2: the killed instance restarts, the partitions spread again -----
    a.restart();
    let sets = SC.wait_split(&[&a, &b], SPLIT_TIMEOUT);
    eprintln!(
        "after restart: a serves {:?}, b serves {:?}",
        sets[0], sets[1]
    );

    // ----- phase 3: load, SIGTERM b mid-load: zero duplicates -----
    let dups3 = stop_phase(&mut book, &a, &mut b, "p3");

    let metrics = a.admin_get("/metrics").text();
    let rebalances = unimesh_tests::metric(&metrics, "unimesh_kafka_rebalances_total", "");
    eprintln!(
        "FIGURES kafka failover: events={} kills=1 stops=1 duplicates_after_kill={} \
         acks_after_last_barrier_of_killed={} duplicates_after_stop={} kill_to_first_moved_delivery_ms={} rebalances_seen_by_a={:?}",
        book.published(""),
        after_kill.extra_deliveries(),
        after_kill.acks_after_last_barrier,
        dups3.iter().map(|(_, n)| n - 1).sum::<u32>(),
        first_moved.map_or(-1, |d| d.as_millis() as i64),
        rebalances
    );
    assert!(rebalances.is_some_and(|r| r >= 1.0), "{metrics}");
}

/// Goal: on tansu, partitions split between two instances, a SIGTERM hands them over with
/// zero duplicates, and the stopped instance's restart spreads them again. Method: phases 1
/// (without the kill), 4 and 3 of the file header.
///
/// With librdkafka's default batching: tansu 0.6.0 answers a fetch from an offset inside a
/// record batch with the *next* batch (a fetch from offset 3 of a 10-record batch returns
/// offset 10 first) and claims a partition's end at its last batch's start plus one; the
/// backend reads from further back and checks such claims (issue 18), so a resume
/// mid-batch loses nothing.
#[test]
fn graceful_stop_hands_partitions_over_and_a_restart_spreads_them() {
    let broker = Broker::start();
    let a = Server::start(options(&broker, "a"));
    let mut b = Server::start(options(&broker, "b"));
    SC.share(&a, &b, SPLIT_TIMEOUT);
    let mut book = Book::new(SC);
    let dups = stop_phase(&mut book, &a, &mut b, "g1");
    assert!(
        dups.is_empty(),
        "duplicates across a graceful stop: {dups:?}"
    );
    assert_eq!(
        SC.owned(&a).len(),
        SC.partitions as usize,
        "a serves every partition"
    );
    b.restart();
    let sets = SC.wait_split(&[&a, &b], SPLIT_TIMEOUT);
    eprintln!(
        "after restart: a serves {:?}, b serves {:?}",
        sets[0], sets[1]
    );
    eprintln!(
        "FIGURES kafka graceful stop on tansu: events={} duplicates_after_stop={}",
        book.published(""),
        dups.iter().map(|(_, n)| n - 1).sum::<u32>()
    );
}

/// Goal: a read of the log that hangs holds up neither an assignment nor a revocation, so
/// an instance whose reads wait on the broker still hands a restarted peer its share.
/// Before, those reads (the leader-epoch probe: where a resumed stream must start, the
/// check of a lane against the log) ran on the group's consumer thread, the thread that
/// serves the rebalance callbacks: on tansu, on a loaded machine, a revocation waited
/// 37 s behind them and the group gave the partitions back (docs/DESIGN.md §8).
/// Method: `a` serves the group alone and ACKs part of a load (so each lane resumes
/// above the log's earliest and its first fetch reads where its stream starts); the proxy
/// then refuses `a`'s probe client, `a` restarts with a 5-minute request timeout (a read
/// through the probe waits that long for the broker); `a` must take every partition, and
/// `b`, started next, its share; then the probe is let through and every event is ACKed
/// (C1), none ACKed before the restart delivered again (C2).
#[test]
fn a_read_of_the_log_that_hangs_holds_up_no_rebalance() {
    let broker = Broker::start_behind_proxy();
    let probe_hangs =
        |name: &str| options(&broker, name).env("UNIMESH_KAFKA_REQUEST_TIMEOUT_MS", "300000");
    let mut a = Server::start(probe_hangs("a"));
    a.subscribe(SC.group, &SC.spec());
    let mut book = Book::new(SC);
    book.load(
        (&a, "a"),
        (&a, "a"),
        "h",
        EVENTS_PER_PHASE / 2,
        EVENTS_PER_PHASE / 4,
    );
    book.barrier(&a, "a");
    let acked_before = book.acked();
    let status = a.terminate();
    assert!(status.success(), "stopped with {status}\n{}", a.stderr());

    broker.proxy().refuse_client("a-epoch-probe");
    a.restart();
    unimesh_tests::wait_for("a to take every partition", SPLIT_TIMEOUT, || {
        (SC.owned(&a).len() == SC.partitions as usize).then_some(())
    });
    let b = Server::start(options(&broker, "b"));
    let sets = SC.wait_split(&[&a, &b], SPLIT_TIMEOUT);
    eprintln!(
        "with a's probe refused: a serves {:?}, b serves {:?}",
        sets[0], sets[1]
    );

    broker.proxy().heal();
    book.drain(
        &[(&a, "a"), (&b, "b")],
        "h",
        EVENTS_PER_PHASE,
        &BTreeSet::new(),
        Instant::now(),
        DRAIN_TIMEOUT,
        &|| format!("a: {}\nb: {}", a.stderr(), b.stderr()),
    );
    assert!(book.all_acked("h"), "C1: every event ACKed");
    for (id, n) in book.duplicates("h") {
        assert!(
            book.was_revoked(&id),
            "{id} delivered {n} times ({acked_before} ACKs made durable before the restart)"
        );
    }
}
