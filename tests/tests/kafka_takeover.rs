//! Takeover after a SIGKILL on Kafka (issue 18): two `unimesh serve --storage kafka`
//! instances share one subscription group; the group's *leader* (the instance that joined
//! first, which computes the assignment) is killed with SIGKILL under load; the survivor
//! must take its partitions over once the broker's session timeout has passed, and in the
//! end every published event is delivered and ACKed (C1), nothing whose ACK was durable
//! before the kill comes back (C2), duplicates counted.
//!
//! On tansu (the broker the tests install) with every default (a 45 s session) and with
//! the setting the README names for a faster takeover (`session.timeout.ms = 6000`,
//! `heartbeat.interval.ms = 500` in `[kafka.consumer]`); on librdkafka's mock cluster with
//! every default (its short-session kill is `kafka_failover.rs`). Everything a user does
//! not set is librdkafka's default.
//!
//! Why the leader case needs the backend's nudge on tansu 0.6.0 (evidence from its group
//! coordinator, `tansu-broker/src/coordinator/group/administrator.rs` at v0.6.0, and the
//! logs of this test with `UNIMESH_TEST_TANSU_LOG=warn,tansu_broker::coordinator=info`,
//! `UNIMESH_TEST_KAFKA_DEBUG=cgrp`): in the formed group, the survivor's heartbeat evicts
//! the dead leader (`Inner<Formed>::heartbeat` calls the member-level `missed_heartbeat`,
//! "missed heartbeat for a-… after 45398ms") without moving the group to forming or
//! clearing its leader (only the group-level `Wrapper::missed_heartbeat`, run after it and
//! finding nothing left to evict, would); the survivor's rejoin then makes the group
//! forming with the dead member still its leader, and a forming group clears its leader
//! only when that member times out while listed, which it no longer is. Every JoinGroup
//! answers "LeaderId a-…, member metadata count 0" after tansu's 3 s follower pause, every
//! SyncGroup "rebalance in progress", forever. With a 6 s session the survivor is evicted
//! too (no heartbeats while it waits in join and sync; seen in this test's logs), and a
//! killed *follower* can end the same way: the surviving leader, evicted while it waits,
//! leaves its own old member id as the dead leader (seen once in five runs). Recreating the consumer would not help (a new member joins a group
//! whose leader is still the dead id). What clears it is a reload of the group from tansu's
//! store, which a concurrent group request during the 3 s pause causes: the backend's
//! nudge (`shell/src/storage/kafka/nudge.rs`, DESIGN §8). nisshi (tansu's later name) has the same
//! code at 939be10 (31 July 2026).
//!
//! Prints the figures: events, duplicates, the time from the kill to the first delivery of
//! a moved partition and to the last ACK, and the nudges the survivor sent (figures, not
//! assertions). Every wait is a bounded loop; the bounds only turn a hang into a failure.

use std::time::{Duration, Instant};

use unimesh_tests::kafka::Broker;
use unimesh_tests::pair::{Book, Scenario};
use unimesh_tests::Server;

const SC: Scenario = Scenario {
    topic: "jobs",
    group: "runners",
    partitions: 4,
};
const EVENTS: usize = 600;
const SPLIT_TIMEOUT: Duration = Duration::from_secs(120);
/// The bound on the drain after the kill: the session timeout, a rebalance or two, and a
/// loaded machine.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(240);

/// The README's setting for a faster takeover.
const SHORT_SESSION: &str =
    "\"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"500\"\n";

fn options(broker: &Broker, name: &str, consumer: &str) -> unimesh_tests::Options {
    // `UNIMESH_TEST_KAFKA_DEBUG=cgrp`: librdkafka's debug contexts for the consumers.
    let debug = std::env::var("UNIMESH_TEST_KAFKA_DEBUG")
        .map(|d| format!("\"debug\" = \"{d}\"\n"))
        .unwrap_or_default();
    broker.server_options(name, SC.partitions).toml(&format!(
        "[kafka.consumer]\n{consumer}{debug}[mesh]\nflush_interval_ms = 20\n"
    ))
}

/// The scenario of the file header; `consumer` is the `[kafka.consumer]` table's lines.
fn kill_the_leader(case: &str, broker: Broker, consumer: &str) {
    // `a` defines the group, so it joins first and is the group's leader (the member that
    // computes the assignment).
    let mut a = Server::start(options(&broker, "a", consumer));
    let b = Server::start(options(&broker, "b", consumer));
    let [dead_parts, _] = SC.share(&a, &b, SPLIT_TIMEOUT);
    let (dead_name, live, live_name) = ("a", &b, "b");

    let mut book = Book::new(SC);
    book.load(
        (&a, dead_name),
        (live, live_name),
        "t",
        EVENTS / 2,
        EVENTS / 4,
    );
    book.killed(dead_name);
    a.kill9();
    let killed = Instant::now();

    // The load goes on through the survivor; it must serve every partition and drain
    // everything.
    let first_moved = book.drain(
        &[(live, live_name)],
        "t",
        EVENTS,
        &dead_parts,
        killed,
        DRAIN_TIMEOUT,
        &|| {
            format!(
                "{case}: {dead_name} served {dead_parts:?}\n--- broker ---\n{}",
                broker.log_text()
            )
        },
    );
    let drained = killed.elapsed();
    assert_eq!(
        SC.owned(live).len(),
        SC.partitions as usize,
        "{case}: {live_name} serves every partition"
    );
    let after = book.check_after_kill("t", dead_name);
    // What the survivor's group went through (shown with --nocapture).
    for line in live.stderr().lines().filter(|l| {
        [
            "assigned partitions",
            "revoked partitions",
            "lost",
            "nudg",
            "SESSTMOUT",
        ]
        .iter()
        .any(|w| l.contains(w))
    }) {
        eprintln!("{live_name}: {line}");
    }
    let metrics = live.metrics();
    let metric = |name| unimesh_tests::metric(&metrics, name, "").unwrap_or(-1.0);
    eprintln!(
        "FIGURES kafka takeover ({case}): events={} lost=0 duplicates={} \
         acks_after_last_barrier_of_killed={} kill_to_first_moved_delivery_ms={} \
         kill_to_drained_ms={} rebalances_seen_by_survivor={} nudges_by_survivor={}",
        book.published("t"),
        after.extra_deliveries(),
        after.acks_after_last_barrier,
        first_moved.map_or(-1, |d| d.as_millis() as i64),
        drained.as_millis(),
        metric("unimesh_kafka_rebalances_total"),
        metric("unimesh_kafka_group_nudges_total"),
    );
}

/// Goal: with every librdkafka default (a 45 s session), the survivor takes over the
/// partitions of a killed group leader and every event is delivered and ACKed. Method: the
/// file header, on librdkafka's mock cluster. (The README's faster-takeover setting on the
/// mock cluster: `kafka_failover.rs`.)
#[test]
fn on_the_mock_cluster_the_survivor_takes_over_a_killed_leader_with_default_settings() {
    kill_the_leader("mock, defaults", Broker::start_mock(), "");
}

/// Goal: on tansu 0.6.0 with every default, the survivor takes over a killed leader's
/// partitions, which tansu alone never gives it (the header: the nudge does). Method: the
/// file header.
#[test]
fn on_tansu_the_survivor_takes_over_a_killed_leader_with_default_settings() {
    kill_the_leader("tansu, defaults", Broker::start_tansu(), "");
}

/// Goal: the same on tansu with the README's faster-takeover setting, where the survivor is
/// evicted too while it waits (its own old member id is then a dead leader as well) and gets
/// every partition back. Method: the file header.
#[test]
fn on_tansu_the_survivor_takes_over_a_killed_leader_with_a_short_session() {
    kill_the_leader("tansu, session 6 s", Broker::start_tansu(), SHORT_SESSION);
}
