//! Static membership on Kafka (`kafka.static_membership = true`, KIP-345; issue 18): every
//! group consumer joins with `group.instance.id` = `kafka.instance`, so an instance that
//! is killed and restarted under the same name within the session timeout gets its own
//! partitions back without the broker moving them to the other instances in between.
//!
//! Two `unimesh serve --storage kafka` instances with static membership share a group under
//! load; one is killed with SIGKILL and restarted at once with the same `kafka.instance`
//! (and data directory), everything else librdkafka's default (a 45 s session). Checked:
//! the other instance serves exactly what it served before, throughout, and sees no
//! rebalance (`unimesh_kafka_rebalances_total` unchanged); the restarted one serves its
//! own partitions again; every event is delivered and ACKed (C1), nothing whose ACK was
//! durable before the kill comes back (C2), duplicates counted.
//!
//! A graceful stop does not keep the partitions: the mesh leaves the group so that the
//! revocation flushes and commits its progress (librdkafka sends a static member's
//! LeaveGroup on unsubscribe), and the others take its partitions at once (DESIGN §8).
//!
//! Prints the figures: events, duplicates, the time from the restart to the first delivery
//! of the restarted instance's partitions (figures, not assertions). Every wait is a
//! bounded loop; the bounds only turn a hang into a failure.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use unimesh_tests::kafka::Broker;
use unimesh_tests::pair::{Book, Scenario};
use unimesh_tests::Server;

const SC: Scenario = Scenario {
    topic: "tasks",
    group: "workers",
    partitions: 4,
};
const EVENTS: usize = 600;
const SPLIT_TIMEOUT: Duration = Duration::from_secs(120);
const DRAIN_TIMEOUT: Duration = Duration::from_secs(180);

fn options(broker: &Broker, name: &str) -> unimesh_tests::Options {
    broker
        .server_options(name, SC.partitions)
        .toml("static_membership = true\n[mesh]\nflush_interval_ms = 20\n")
}

fn rebalances(s: &Server) -> f64 {
    unimesh_tests::metric(&s.metrics(), "unimesh_kafka_rebalances_total", "").unwrap_or(-1.0)
}

/// The scenario of the file header; `victim` is `a` (the group's leader: it defines the
/// group, so it joins first) or `b`.
fn restart_one_of_two(case: &str, broker: Broker, victim: &'static str) {
    let mut a = Server::start(options(&broker, "a"));
    let mut b = Server::start(options(&broker, "b"));
    let [a_parts, b_parts] = SC.share(&a, &b, SPLIT_TIMEOUT);
    let (dead, other, other_name, own, others) = if victim == "a" {
        (&mut a, &b, "b", a_parts, b_parts)
    } else {
        (&mut b, &a, "a", b_parts, a_parts)
    };
    let mut book = Book::new(SC);
    book.load(
        (&*dead, victim),
        (other, other_name),
        "s",
        EVENTS / 2,
        EVENTS / 4,
    );
    let other_rebalances = rebalances(other);

    book.killed(victim);
    dead.kill9();
    dead.restart();
    let restarted = Instant::now();
    // The other instance keeps exactly its partitions while the restarted one comes back.
    let back = unimesh_tests::wait_for(
        "the restarted instance to serve its partitions again",
        SPLIT_TIMEOUT,
        || {
            let now = SC.owned(other);
            assert_eq!(
                now, others,
                "{case}: {other_name}'s partitions changed while {victim} restarted"
            );
            (SC.owned(dead) == own).then(|| restarted.elapsed())
        },
    );
    let first_back = book.drain(
        &[(&*dead, victim), (other, other_name)],
        "s",
        EVENTS,
        &own,
        restarted,
        DRAIN_TIMEOUT,
        &|| format!("{case}\n--- broker ---\n{}", broker.log_text()),
    );
    assert_eq!(SC.owned(other), others, "{case}: {other_name}'s partitions");
    assert_eq!(SC.owned(dead), own, "{case}: {victim}'s partitions");
    assert_eq!(
        rebalances(other),
        other_rebalances,
        "{case}: {other_name} saw a rebalance while {victim} restarted"
    );
    let after = book.check_after_kill("s", victim);
    let (a_now, b_now): (BTreeSet<u32>, BTreeSet<u32>) = (SC.owned(&a), SC.owned(&b));
    eprintln!(
        "FIGURES kafka static membership ({case}): events={} lost=0 duplicates={} \
         acks_after_last_barrier_of_killed={} restart_to_own_partitions_ms={} \
         restart_to_first_delivery_of_them_ms={} a={a_now:?} b={b_now:?}",
        book.published("s"),
        after.extra_deliveries(),
        after.acks_after_last_barrier,
        back.as_millis(),
        first_back.map_or(-1, |d| d.as_millis() as i64),
    );
}

/// Goal: on tansu, a killed instance restarted with the same name gets its partitions back
/// without a rebalance of the other. Method: the file header, the group's follower killed.
#[test]
fn on_tansu_a_restarted_static_member_gets_its_partitions_back_alone() {
    restart_one_of_two("tansu, follower", Broker::start_tansu(), "b");
}

/// Goal: the same when the restarted instance is the group's leader.
#[test]
fn on_tansu_a_restarted_static_leader_gets_its_partitions_back_alone() {
    restart_one_of_two("tansu, leader", Broker::start_tansu(), "a");
}
