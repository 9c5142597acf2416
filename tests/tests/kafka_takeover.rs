//! Takeover after a SIGKILL on Kafka (issue 18): two `unimesh serve --storage kafka`
//! instances share one subscription group; one is killed with SIGKILL under load; the
//! survivor must take the killed one's partitions over once the broker's session timeout
//! has passed, and in the end every published event is delivered and ACKed (C1), nothing
//! whose ACK was durable before the kill comes back (C2), duplicates counted.
//!
//! On tansu (the broker the tests install) with librdkafka's default settings for
//! everything a user does not set, and on librdkafka's mock cluster with
//! `UNIMESH_TEST_BROKER=mock`. Two cases: every default (a 45 s session), and a user's
//! `session.timeout.ms = 6000` in `[kafka.consumer]` (the setting the README names for a
//! faster takeover).
//!
//! Durability barriers instead of clocks (as in `crash.rs`): `PUT /v1/subscriptions/{g}`
//! answers once everything pending, progress included, is durable.
//!
//! Why it fails on tansu 0.6.0 (issue 18; evidence from its group coordinator,
//! `tansu-broker/src/coordinator/group/administrator.rs` at v0.6.0, and the logs of this
//! test with `UNIMESH_TEST_TANSU_LOG=warn,tansu_broker::coordinator=info,tansu_broker::broker::group=info`,
//! `UNIMESH_TEST_KAFKA_DEBUG=cgrp`, `UNIMESH_TEST_SERVER_LOG=info,librdkafka=debug`): the
//! killed instance joined first, so it was the group's *leader*. In the formed group, the
//! survivor's heartbeat evicts the dead member (`Inner<Formed>::missed_heartbeat`, "missed
//! heartbeat for a-… after 45398ms") without moving the group to forming or clearing the
//! leader; the survivor's rejoin then makes the group forming with the dead member still
//! its leader, and a forming group clears its leader only when that member itself times
//! out, which it never will again (it is gone). Every JoinGroup answers "LeaderId a-…,
//! member metadata count 0" after tansu's 3 s follower pause, every SyncGroup "rebalance in
//! progress", forever. With a 6 s session the survivor is evicted too (no heartbeats while
//! it waits in join and sync, heartbeat up to 3 s stale plus the 3 s pause), rejoins as a
//! new member, and loses its own partitions. `tests/python/takeover_probe.py` took over
//! because its survivor started first and was the leader. So the tests are ignored until
//! the backend works around it.
//!
//! Prints the figures: events, duplicates, and the time from the kill to the first
//! delivery of a moved partition (a figure, not an assertion). Every wait is a bounded loop;
//! the bounds only turn a hang into a failure.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use unimesh_tests::kafka::Broker;
use unimesh_tests::{event, json, published, Server, Value};

const TOPIC: &str = "jobs";
const GROUP: &str = "runners";
const PARTITIONS: u32 = 4;
const EVENTS: usize = 600;
/// Events published per request during the load.
const BATCH: usize = 20;
const SPLIT_TIMEOUT: Duration = Duration::from_secs(120);
/// The bound on the drain after the kill: the session timeout, a rebalance or two, and a
/// loaded machine.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(240);

fn options(broker: &Broker, name: &str, consumer: &str) -> unimesh_tests::Options {
    // `UNIMESH_TEST_KAFKA_DEBUG=cgrp`: librdkafka's debug contexts for the consumers.
    let debug = std::env::var("UNIMESH_TEST_KAFKA_DEBUG")
        .map(|d| format!("\"debug\" = \"{d}\"\n"))
        .unwrap_or_default();
    let consumer = format!("{consumer}{debug}");
    broker.server_options(name, PARTITIONS).toml(&format!(
        "[kafka.consumer]\n{consumer}[mesh]\nflush_interval_ms = 20\n"
    ))
}

fn spec() -> Value {
    json!({"topic": TOPIC, "startFrom": "earliest", "ackTimeoutMs": 60000, "maxInFlightPerClient": 200})
}

/// The partitions an instance serves, from its own `/admin/offsets`.
fn owned(s: &Server) -> BTreeSet<u32> {
    s.offsets(TOPIC)
        .into_iter()
        .filter(|((g, _), row)| g == GROUP && row["owner"].is_string())
        .map(|((_, p), _)| p)
        .collect()
}

/// Waits until the instances serve disjoint sets covering every partition, each at least
/// one; returns them.
fn wait_split(servers: &[&Server]) -> Vec<BTreeSet<u32>> {
    unimesh_tests::wait_for(
        "the partitions split between the instances",
        SPLIT_TIMEOUT,
        || {
            let sets: Vec<BTreeSet<u32>> = servers.iter().map(|s| owned(s)).collect();
            let total: usize = sets.iter().map(BTreeSet::len).sum();
            let union: BTreeSet<u32> = sets.iter().flatten().copied().collect();
            let ok = total == PARTITIONS as usize
                && union.len() == PARTITIONS as usize
                && sets.iter().all(|s| !s.is_empty());
            ok.then_some(sets)
        },
    )
}

/// What the load saw.
#[derive(Default)]
struct Book {
    published: BTreeSet<String>,
    next: usize,
    /// Deliveries per event id.
    deliveries: BTreeMap<String, u32>,
    /// Accepted ACKs: id → (sequence, instance).
    acked: BTreeMap<String, (u64, &'static str)>,
    /// Per instance, the ACK sequence number covered by its last durability barrier.
    barrier: BTreeMap<&'static str, u64>,
    seq: u64,
    /// ACKs refused as `revoked` (the partition moved between the poll and the ACK).
    revoked: BTreeSet<String>,
}

impl Book {
    /// One poll on `s` and the ACK of everything it returned; the partitions delivered.
    fn poll_and_ack(&mut self, s: &Server, name: &'static str) -> Vec<u32> {
        let got = s.poll(GROUP, &format!("client-{name}"), 100, 200);
        let ids: Vec<&str> = got.iter().map(|d| d.id.as_str()).collect();
        for d in &got {
            *self.deliveries.entry(d.event_id().to_owned()).or_default() += 1;
        }
        if ids.is_empty() {
            return Vec::new();
        }
        let settled = s.ack(GROUP, &ids);
        let rejected: BTreeMap<&str, &str> = settled
            .rejected
            .iter()
            .map(|(id, why)| (id.as_str(), why.as_str()))
            .collect();
        for d in &got {
            match rejected.get(d.id.as_str()) {
                None => {
                    self.seq += 1;
                    self.acked
                        .entry(d.event_id().to_owned())
                        .or_insert((self.seq, name));
                }
                Some(&"revoked") => {
                    self.revoked.insert(d.event_id().to_owned());
                }
                Some(other) => panic!("ACK of {} refused: {other}", d.event_id()),
            }
        }
        got.iter().map(|d| d.partition).collect()
    }

    /// A durability barrier on `s`: every ACK it answered so far is durable after this.
    fn barrier(&mut self, s: &Server, name: &'static str) {
        s.subscribe(GROUP, &spec());
        self.barrier.insert(name, self.seq);
    }

    /// Publishes the next `n` events (keys spread over every partition) through `s`.
    fn publish(&mut self, s: &Server, n: usize) {
        let events: Vec<Value> = (self.next..self.next + n)
            .map(|i| {
                let mut e = event(&format!("t-{i}"), "job.run", json!({"i": i}));
                e["partitionkey"] = json!(format!("key-{}", i % 16));
                e
            })
            .collect();
        self.next += n;
        for p in published(&s.publish_batch(TOPIC, &events), n) {
            self.published.insert(p.id);
        }
    }

    fn missing(&self) -> Vec<&String> {
        self.published
            .iter()
            .filter(|id| !self.acked.contains_key(*id))
            .collect()
    }
}

/// The scenario of the file header; `consumer` is the `[kafka.consumer]` table's lines.
fn kill_one_of_two(case: &str, consumer: &str) {
    let broker = Broker::start();
    let mut a = Server::start(options(&broker, "a", consumer));
    let b = Server::start(options(&broker, "b", consumer));
    a.subscribe(GROUP, &spec());
    unimesh_tests::wait_for(
        "b to learn the group from the subscriptions topic",
        SPLIT_TIMEOUT,
        || (b.get(&format!("/v1/subscriptions/{GROUP}")).status == 200).then_some(()),
    );
    let sets = wait_split(&[&a, &b]);
    eprintln!(
        "{case}: split: a serves {:?}, b serves {:?}",
        sets[0], sets[1]
    );
    let a_parts = sets[0].clone();

    // Load through both until half the events are published and a quarter ACKed.
    let mut book = Book::default();
    let mut rounds = 0;
    while book.next < EVENTS / 2 || book.acked.len() < EVENTS / 4 {
        if book.next < EVENTS / 2 {
            book.publish(if rounds % 2 == 0 { &a } else { &b }, BATCH);
        }
        book.poll_and_ack(&a, "a");
        book.poll_and_ack(&b, "b");
        rounds += 1;
        if rounds % 3 == 0 {
            book.barrier(&a, "a");
        }
        assert!(rounds < 2_000, "{case}: no progress before the kill");
    }
    // A few more ACKs on a after its last barrier: these may come back (in flight).
    book.poll_and_ack(&a, "a");
    a.kill9();
    let killed = Instant::now();

    // The load goes on through b; b must serve every partition and drain everything.
    let mut first_moved: Option<Duration> = None;
    while !book.missing().is_empty() || book.next < EVENTS {
        if book.next < EVENTS {
            book.publish(&b, BATCH);
        }
        if killed.elapsed() > DRAIN_TIMEOUT {
            let missing = book.missing();
            panic!(
                "{case}: {} of {} events not ACKed {DRAIN_TIMEOUT:?} after the kill \
                 (a served {a_parts:?}; b serves {:?}), e.g. {:?}\n--- b ---\n{}\n--- broker ---\n{}",
                missing.len(),
                book.published.len(),
                owned(&b),
                missing.iter().take(10).collect::<Vec<_>>(),
                b.stderr(),
                broker.log_text()
            );
        }
        for p in book.poll_and_ack(&b, "b") {
            if first_moved.is_none() && a_parts.contains(&p) {
                first_moved = Some(killed.elapsed());
            }
        }
    }
    assert_eq!(
        owned(&b).len(),
        PARTITIONS as usize,
        "{case}: b serves every partition"
    );
    let a_barrier = book.barrier.get("a").copied().unwrap_or(0);
    let dups: Vec<(&String, u32)> = book
        .deliveries
        .iter()
        .filter(|(_, &n)| n > 1)
        .map(|(id, &n)| (id, n))
        .collect();
    let in_flight_at_kill = book
        .acked
        .values()
        .filter(|&&(seq, who)| who == "a" && seq > a_barrier)
        .count();
    for (id, n) in &dups {
        let allowed = match book.acked.get(*id) {
            Some(&(seq, "a")) => seq > a_barrier || book.revoked.contains(*id),
            _ => book.revoked.contains(*id),
        };
        assert!(
            allowed,
            "{case}: {id} delivered {n} times although its ACK was durable before the kill (C2)"
        );
    }
    let rebalances = unimesh_tests::metric(&b.metrics(), "unimesh_kafka_rebalances_total", "");
    eprintln!(
        "FIGURES kafka takeover ({case}, {}): events={} lost=0 duplicates={} \
         acks_after_last_barrier_of_killed={in_flight_at_kill} kill_to_first_moved_delivery_ms={} \
         kill_to_drained_ms={} rebalances_seen_by_b={rebalances:?}",
        if broker.is_mock() {
            "mock cluster"
        } else {
            "tansu"
        },
        book.published.len(),
        dups.iter().map(|(_, n)| n - 1).sum::<u32>(),
        first_moved.map_or(-1, |d| d.as_millis() as i64),
        killed.elapsed().as_millis(),
    );
}

/// Goal: with every librdkafka default (a 45 s session), the survivor takes over a killed
/// instance's partitions and every event is delivered and ACKed. Method: the file header.
#[test]
#[ignore = "issue 18: fails on tansu 0.6.0 when the killed instance was the group leader (see the header)"]
fn survivor_takes_over_a_killed_instance_with_default_settings() {
    kill_one_of_two("defaults", "");
}

/// Goal: the same with the session timeout a user sets for a faster takeover. Method: the
/// file header, `session.timeout.ms = 6000` in `[kafka.consumer]`.
#[test]
#[ignore = "issue 18: fails on tansu 0.6.0 when the killed instance was the group leader (see the header)"]
fn survivor_takes_over_a_killed_instance_with_a_short_session() {
    kill_one_of_two("session 6 s", "\"session.timeout.ms\" = \"6000\"\n");
}
