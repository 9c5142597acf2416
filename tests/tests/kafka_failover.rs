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
//! The kill runs on librdkafka's mock cluster (see the test's comment on tansu); the graceful
//! stop and the restart run on tansu too.
//!
//! Prints the figures: events, kills, duplicates delivered, and the time from the kill to
//! the first delivery of a moved partition (a figure, not an assertion).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use unimesh_tests::kafka::Broker;
use unimesh_tests::{event, json, published, Server, Value};

const TOPIC: &str = "work";
const GROUP: &str = "workers";
const PARTITIONS: u32 = 4;
const EVENTS_PER_PHASE: usize = 400;
const DRAIN_TIMEOUT: Duration = Duration::from_secs(180);
const SPLIT_TIMEOUT: Duration = Duration::from_secs(90);

/// `properties`: more `[kafka.properties]` lines.
fn options(broker: &Broker, name: &str, properties: &str) -> unimesh_tests::Options {
    // A short session, so a killed instance's partitions move within seconds.
    broker.server_options(name, PARTITIONS).toml(&format!(
        "[kafka.properties]\n\"session.timeout.ms\" = \"6000\"\n\"heartbeat.interval.ms\" = \"500\"\n\
         {properties}[mesh]\nflush_interval_ms = 20\n"
    ))
}

fn spec() -> Value {
    json!({"topic": TOPIC, "startFrom": "earliest", "ackTimeoutMs": 60000, "maxInFlightPerClient": 200})
}

/// The partitions each instance serves, from its own `/admin/offsets`.
fn owned(s: &Server) -> BTreeSet<u32> {
    s.offsets(TOPIC)
        .into_iter()
        .filter(|((g, _), _)| g == GROUP)
        .map(|((_, p), row)| {
            assert!(row["owner"].is_string(), "owner missing: {row}");
            p
        })
        .collect()
}

/// Waits until the live instances serve disjoint sets covering every partition, each at
/// least one; returns them.
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
    /// One poll on `s` and the ACK of everything it returned.
    fn poll_and_ack(&mut self, s: &Server, name: &'static str) -> Vec<(u32, String)> {
        let got = s.poll(GROUP, &format!("client-{name}"), 100, 200);
        let mut out = Vec::new();
        let ids: Vec<&str> = got.iter().map(|d| d.id.as_str()).collect();
        for d in &got {
            *self.deliveries.entry(d.event_id().to_owned()).or_default() += 1;
            out.push((d.partition, d.event_id().to_owned()));
        }
        if ids.is_empty() {
            return out;
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
        out
    }

    /// A durability barrier on `s`: every ACK it answered so far is durable after this.
    fn barrier(&mut self, s: &Server, name: &'static str) {
        s.subscribe(GROUP, &spec());
        self.barrier.insert(name, self.seq);
    }

    fn publish(&mut self, s: &Server, phase: &str, from: usize, n: usize) {
        let events: Vec<Value> = (from..from + n)
            .map(|i| {
                let mut e = event(&format!("{phase}-{i}"), "work.item", json!({"i": i}));
                e["partitionkey"] = json!(format!("key-{}", i % 16));
                e
            })
            .collect();
        let placed = published(&s.publish_batch(TOPIC, &events), n);
        for p in placed {
            self.published.insert(p.id);
        }
    }

    fn all_acked(&self, phase: &str) -> bool {
        self.published
            .iter()
            .filter(|id| id.starts_with(phase))
            .all(|id| self.acked.contains_key(id))
    }

    fn duplicates(&self, phase: &str) -> Vec<(String, u32)> {
        self.deliveries
            .iter()
            .filter(|(id, &n)| id.starts_with(phase) && n > 1)
            .map(|(id, &n)| (id.clone(), n))
            .collect()
    }
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
    book.publish(live, phase, 0, EVENTS_PER_PHASE / 2);
    let before = book.acked.len();
    let mut rounds = 0;
    while book.acked.len() < before + EVENTS_PER_PHASE / 4 {
        book.poll_and_ack(live, "a");
        book.poll_and_ack(stopping, "b");
        rounds += 1;
        assert!(rounds < 2_000, "{phase}: no progress before the stop");
    }
    let revoked_before_stop = book.revoked.len();
    let status = stopping.terminate();
    assert!(
        status.success(),
        "stopped with {status}\n{}",
        stopping.stderr()
    );
    book.publish(live, phase, EVENTS_PER_PHASE / 2, EVENTS_PER_PHASE / 2);
    let started = Instant::now();
    while !book.all_acked(phase) {
        if started.elapsed() > DRAIN_TIMEOUT {
            let missing: Vec<&String> = book
                .published
                .iter()
                .filter(|id| id.starts_with(phase) && !book.acked.contains_key(*id))
                .take(20)
                .collect();
            panic!(
                "{phase}: not every event ACKed after the stop; missing {missing:?}\n\
                 offsets {:?}\n--- live ---\n{}",
                live.offsets(TOPIC),
                live.stderr()
            );
        }
        book.poll_and_ack(live, "a");
    }
    let dups = book.duplicates(phase);
    // A delivery whose ACK raced an earlier rebalance may come back (it was in flight);
    // nothing else may.
    for (id, n) in &dups {
        assert!(
            book.revoked.contains(id),
            "{id} delivered {n} times across a graceful stop"
        );
    }
    assert_eq!(
        book.revoked.len(),
        revoked_before_stop,
        "{phase}: no ACK is refused as revoked during a graceful stop"
    );
    dups
}

/// Goal: partitions move between instances through Kafka's group coordinator with the
/// delivery contract intact, on a crash and on a graceful stop. Method: the phases of the
/// file header.
///
/// On librdkafka's mock cluster: tansu 0.6.0's coordinator does not take a dead member out
/// of the group (with cooperative-sticky the survivor's assignment is declared lost and
/// never given back; with the eager range assignor the dead member keeps its partitions),
/// so a SIGKILL takeover cannot happen there. The graceful path runs on tansu below.
#[test]
fn two_instances_split_partitions_and_take_over_on_kill_and_on_stop() {
    let broker = Broker::start_mock();
    let mut a = Server::start(options(&broker, "a", ""));
    let mut b = Server::start(options(&broker, "b", ""));
    // Defined on one instance, served by both: definitions are shared through Kafka.
    a.subscribe(GROUP, &spec());
    unimesh_tests::wait_for(
        "b to learn the group from the subscriptions topic",
        SPLIT_TIMEOUT,
        || (b.get(&format!("/v1/subscriptions/{GROUP}")).status == 200).then_some(()),
    );
    let sets = wait_split(&[&a, &b]);
    eprintln!("split: a serves {:?}, b serves {:?}", sets[0], sets[1]);
    let a_parts = sets[0].clone();

    // ----- phase 1: load, then SIGKILL a mid-load -----
    let mut book = Book::default();
    book.publish(&a, "p1", 0, EVENTS_PER_PHASE / 2);
    let mut rounds = 0;
    while book.acked.len() < EVENTS_PER_PHASE / 4 {
        book.poll_and_ack(&a, "a");
        book.poll_and_ack(&b, "b");
        rounds += 1;
        if rounds % 3 == 0 {
            book.barrier(&a, "a");
        }
        assert!(rounds < 2_000, "phase 1 made no progress");
    }
    // A few more ACKs on a after its last barrier: these may come back (in flight).
    book.poll_and_ack(&a, "a");
    a.kill9();
    let killed = Instant::now();
    book.publish(&b, "p1", EVENTS_PER_PHASE / 2, EVENTS_PER_PHASE / 2);
    let mut first_moved: Option<Duration> = None;
    let started = Instant::now();
    while !book.all_acked("p1") {
        assert!(
            started.elapsed() < DRAIN_TIMEOUT,
            "phase 1: {} of {} events ACKed after the kill\n--- b ---\n{}",
            book.acked.len(),
            book.published.len(),
            b.stderr()
        );
        for (p, _) in book.poll_and_ack(&b, "b") {
            if first_moved.is_none() && a_parts.contains(&p) {
                first_moved = Some(killed.elapsed());
            }
        }
    }
    let a_barrier = book.barrier.get("a").copied().unwrap_or(0);
    let dups1 = book.duplicates("p1");
    // The bound on duplicates: ACKs the killed instance answered after its last barrier.
    let in_flight_at_kill = book
        .acked
        .iter()
        .filter(|(id, &(seq, who))| id.starts_with("p1") && who == "a" && seq > a_barrier)
        .count();
    for (id, n) in &dups1 {
        let allowed = match book.acked.get(id) {
            // ACKed by the killed instance after its last barrier: maybe not persisted.
            Some(&(seq, "a")) => seq > a_barrier || book.revoked.contains(id),
            _ => book.revoked.contains(id),
        };
        assert!(
            allowed,
            "{id} delivered {n} times although its ACK was durable before the kill (C2)"
        );
    }
    assert!(book.all_acked("p1"), "C1: every event ACKed");

    // ----- phase 2: the killed instance restarts, the partitions spread again -----
    a.restart();
    let sets = wait_split(&[&a, &b]);
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
        book.published.len(),
        dups1.iter().map(|(_, n)| n - 1).sum::<u32>(),
        in_flight_at_kill,
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
    let a = Server::start(options(&broker, "a", ""));
    let mut b = Server::start(options(&broker, "b", ""));
    a.subscribe(GROUP, &spec());
    unimesh_tests::wait_for(
        "b to learn the group from the subscriptions topic",
        SPLIT_TIMEOUT,
        || (b.get(&format!("/v1/subscriptions/{GROUP}")).status == 200).then_some(()),
    );
    let sets = wait_split(&[&a, &b]);
    eprintln!("split: a serves {:?}, b serves {:?}", sets[0], sets[1]);
    let mut book = Book::default();
    let dups = stop_phase(&mut book, &a, &mut b, "g1");
    assert!(
        dups.is_empty(),
        "duplicates across a graceful stop: {dups:?}"
    );
    assert_eq!(
        owned(&a).len(),
        PARTITIONS as usize,
        "a serves every partition"
    );
    b.restart();
    let sets = wait_split(&[&a, &b]);
    eprintln!(
        "after restart: a serves {:?}, b serves {:?}",
        sets[0], sets[1]
    );
    eprintln!(
        "FIGURES kafka graceful stop on tansu: events={} duplicates_after_stop={}",
        book.published.len(),
        dups.iter().map(|(_, n)| n - 1).sum::<u32>()
    );
}
