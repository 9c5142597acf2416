//! Broker outages on Kafka, through a fault-injecting proxy (`unimesh_tests::proxy`) that
//! the broker advertises, so every connection of every client of the mesh goes through it.
//! On tansu with librdkafka's default settings, and on librdkafka's mock cluster with
//! `UNIMESH_TEST_BROKER=mock`.
//!
//! 1. A 30 s cut under load (the broker keeps its data): publishes during the cut are
//!    answered 503 (or 200 once the write really got through), never 200 for a write that
//!    then vanishes; `/admin/health` and `/admin/ready` answer 503 naming the broker while
//!    it is cut off, and 200 once it is back, without a restart of the mesh; deliveries
//!    held un-ACKed across the cut are delivered again (progress writes resume); in the
//!    end every event answered 200 is delivered and ACKed (C1), duplicates counted.
//! 2. The broker restarted empty (its topics, groups and offsets gone; on the mock cluster,
//!    see the test): the mesh creates its topics again on use, publishes succeed again and
//!    health is 200 again. (Not yet: delivering what is published then. The group's lanes
//!    keep positions above the new log's end, which the lost-tail rule of the consumer is
//!    to settle; see issue 18.)
//!
//! 3. The broker unreachable at start (tansu only: the mock cluster picks its own port):
//!    health says so, the log holds a few lines, and the mesh starts once the broker comes.
//!
//! Every wait is a bounded loop; the bounds only turn a hang into a failure. Prints the
//! figures: events lost (must be 0), duplicates, time from the broker's return to healthy
//! and to the first delivery (figures, not assertions).
//!
//! Events are published one per request by one publisher, so every record batch holds one
//! record: tansu misreports a partition's end after a batch of several records (issue
//! 18's first part, fixed separately), which the lost-tail rule would take for a loss.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use unimesh_tests::kafka::Broker;
use unimesh_tests::{event, json, metric, parse_deliveries, Call, Resp, Server};

const TOPIC: &str = "orders";
const GROUP: &str = "billing";
const PARTITIONS: u32 = 2;
/// How long the broker is cut off.
const CUT: Duration = Duration::from_secs(30);
/// Bounds of the waits (generous: a loaded two-core machine).
const HEALTH_TIMEOUT: Duration = Duration::from_secs(90);
const RECOVERY_TIMEOUT: Duration = Duration::from_secs(150);
const DRAIN_TIMEOUT: Duration = Duration::from_secs(240);
/// Deliveries held un-ACKed across the cut (they must come again).
const HELD: usize = 5;
/// ACK timeout of the group: what is held comes again after it, which falls in the cut
/// (held about 3 s before it), so the attempt count written then needs the broker back.
const ACK_TIMEOUT_MS: u64 = 20_000;

fn server(broker: &Broker, name: &str) -> Server {
    Server::start(
        broker
            .server_options(name, PARTITIONS)
            .toml("[mesh]\nflush_interval_ms = 20\n"),
    )
}

fn subscribe(s: &Server) {
    s.subscribe(
        GROUP,
        &json!({"topic": TOPIC, "startFrom": "earliest", "ackTimeoutMs": ACK_TIMEOUT_MS,
                "maxInFlightPerClient": 200}),
    );
}

/// One event published in structured mode (one record per request).
fn publish_one(s: &Server, id: &str) -> Result<Resp, String> {
    Call::new(
        &s.agent(),
        "POST",
        s.http_url(&format!("/v1/topics/{TOPIC}/events")),
    )
    .header("content-type", "application/cloudevents+json")
    .body(event(id, "order.created", json!({"id": id})).to_string())
    .try_send()
}

/// What the publisher and the consumer saw.
#[derive(Default)]
struct Book {
    /// Answered 200.
    accepted: BTreeSet<String>,
    /// Answered 503, by the message's first words.
    refused: BTreeMap<String, u32>,
    /// Deliveries per event id, and the highest attempt seen.
    deliveries: BTreeMap<String, (u32, u32)>,
    acked: BTreeSet<String>,
    /// When each delivery came.
    delivered_at: Vec<Instant>,
    /// Event ids delivered and deliberately not ACKed (they must come again).
    held: BTreeSet<String>,
}

impl Book {
    fn lost(&self) -> Vec<&String> {
        self.accepted.difference(&self.acked).collect()
    }

    fn duplicates(&self) -> u32 {
        self.deliveries
            .values()
            .map(|(n, _)| n.saturating_sub(1))
            .sum()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One publish, booked: 200 accepted, 503 refused with a JSON error; anything else fails.
fn publish_booked(s: &Server, book: &Mutex<Book>, id: &str) -> bool {
    let r = match publish_one(s, id) {
        Ok(r) => r,
        Err(e) => panic!("the publish of {id} got no answer: {e}"),
    };
    match r.status {
        200 => {
            lock(book).accepted.insert(id.to_owned());
            true
        }
        503 => {
            let message = r.expect_error(503, "unavailable");
            let head: String = message.chars().take(100).collect();
            *lock(book).refused.entry(head).or_default() += 1;
            false
        }
        other => panic!("publish of {id}: {other} {}", r.text()),
    }
}

/// One poll and the ACK of what came, except the first `hold` deliveries of first
/// attempts (kept un-ACKed, booked as held). Returns how many came.
fn consume_once(s: &Server, book: &Mutex<Book>, hold: usize) -> usize {
    let r = Call::new(
        &s.agent(),
        "GET",
        s.http_url(&format!(
            "/v1/subscriptions/{GROUP}/events?client=c1&max=50&waitMs=500"
        )),
    )
    .try_send();
    let r = match r {
        Ok(r) if r.status == 200 => r,
        // A poll during the outage may be refused; the next one asks again.
        Ok(r) => {
            assert!(r.status >= 500, "a poll answered {} {}", r.status, r.text());
            std::thread::sleep(Duration::from_millis(200));
            return 0;
        }
        Err(e) => panic!("a poll got no answer: {e}"),
    };
    let got = parse_deliveries(&r);
    let now = Instant::now();
    let mut ack = Vec::new();
    {
        let mut b = lock(book);
        for d in &got {
            let id = d.event_id().to_owned();
            let entry = b.deliveries.entry(id.clone()).or_default();
            entry.0 += 1;
            entry.1 = entry.1.max(d.attempt);
            b.delivered_at.push(now);
            if d.attempt == 1 && b.held.len() < hold && !b.held.contains(&id) {
                b.held.insert(id);
            } else {
                ack.push(d.id.clone());
            }
        }
    }
    if !ack.is_empty() {
        let ids: Vec<&str> = ack.iter().map(String::as_str).collect();
        let settled = s.ack(GROUP, &ids);
        let mut b = lock(book);
        let refused: BTreeSet<&str> = settled.rejected.iter().map(|(id, _)| id.as_str()).collect();
        for d in &got {
            if ack.contains(&d.id) && !refused.contains(d.id.as_str()) {
                b.acked.insert(d.event_id().to_owned());
            }
        }
    }
    got.len()
}

/// Waits until `/admin/health` answers `status`; returns the answer.
fn wait_health(s: &Server, status: u16, what: &str) -> Resp {
    unimesh_tests::wait_for(what, HEALTH_TIMEOUT, || {
        let r = s.admin_get("/admin/health");
        if r.status == status {
            return Some(r);
        }
        std::thread::sleep(Duration::from_millis(200));
        None
    })
}

#[test]
fn a_30s_broker_cut_under_load_loses_nothing_and_health_reports_it() {
    let broker = Broker::start_behind_proxy();
    let s = server(&broker, "cut");
    subscribe(&s);
    let book = Mutex::new(Book::default());
    let stop = AtomicBool::new(false);
    let publishing = AtomicBool::new(true);
    let mut seq = 0u64;
    let mut next_id = || {
        seq += 1;
        format!("e{seq}")
    };

    // Before: a steady flow, and HELD deliveries kept un-ACKed.
    for _ in 0..40 {
        let id = next_id();
        assert!(
            publish_booked(&s, &book, &id),
            "publish before the cut refused"
        );
    }
    unimesh_tests::wait_for("the first deliveries", HEALTH_TIMEOUT, || {
        consume_once(&s, &book, HELD);
        (lock(&book).held.len() == HELD).then_some(())
    });
    wait_health(&s, 200, "health 200 before the cut");

    let (healthy_after, first_delivery_after, cut_health, cut_ready, broker_up_during) =
        std::thread::scope(|scope| {
            // The consumer runs throughout, ACKing everything but the held ones.
            scope.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    consume_once(&s, &book, HELD);
                }
            });
            // The publisher too: one event per request.
            let publisher = scope.spawn(|| {
                let mut n = 0u64;
                while publishing.load(Ordering::Relaxed) {
                    n += 1;
                    let ok = publish_booked(&s, &book, &format!("load{n}"));
                    if !ok {
                        std::thread::sleep(Duration::from_millis(200));
                    }
                }
            });

            std::thread::sleep(Duration::from_secs(2));
            broker.proxy().cut();
            let cut_at = Instant::now();
            let health = wait_health(&s, 503, "health 503 during the cut");
            let ready = s.admin_get("/admin/ready");
            let up = metric(&s.metrics(), "unimesh_kafka_broker_up", "");
            let left = CUT.saturating_sub(cut_at.elapsed());
            std::thread::sleep(left);
            broker.proxy().heal();
            let healed_at = Instant::now();
            eprintln!("broker cut for {:?}", cut_at.elapsed());

            wait_health(&s, 200, "health 200 after the broker returned");
            let healthy_after = healed_at.elapsed();
            let first = unimesh_tests::wait_for(
                "a delivery after the broker returned",
                RECOVERY_TIMEOUT,
                || {
                    let b = lock(&book);
                    b.delivered_at
                        .iter()
                        .find(|t| **t >= healed_at)
                        .map(|t| *t - healed_at)
                },
            );
            // Publishes succeed again: 50 accepted after the return.
            let before = lock(&book).accepted.len();
            unimesh_tests::wait_for("publishes accepted again", RECOVERY_TIMEOUT, || {
                std::thread::sleep(Duration::from_millis(100));
                (lock(&book).accepted.len() >= before + 50).then_some(())
            });
            publishing.store(false, Ordering::Relaxed);
            let _ = publisher.join();

            // Drain: every accepted event ACKed, the held ones delivered again first.
            unimesh_tests::wait_for("every accepted event ACKed", DRAIN_TIMEOUT, || {
                std::thread::sleep(Duration::from_millis(200));
                let b = lock(&book);
                let held_back = b
                    .held
                    .iter()
                    .all(|id| b.deliveries.get(id).is_some_and(|(n, _)| *n >= 2));
                (held_back && b.lost().is_empty()).then_some(())
            });
            stop.store(true, Ordering::Relaxed);
            (healthy_after, first, health, ready, up)
        });

    let b = lock(&book);
    let address = broker.brokers();
    let message = cut_health.expect_error_naming(503, "unavailable", &["Kafka broker", &address]);
    eprintln!("health during the cut: {message}");
    let ready_message = cut_ready.expect_error_naming(503, "unavailable", &["not ready"]);
    eprintln!("ready during the cut: {ready_message}");
    assert_eq!(
        broker_up_during,
        Some(0.0),
        "unimesh_kafka_broker_up during the cut"
    );
    let r = s.admin_get("/admin/ready");
    r.expect(200);
    assert_eq!(
        metric(&s.metrics(), "unimesh_kafka_broker_up", ""),
        Some(1.0),
        "unimesh_kafka_broker_up after the return"
    );
    let refused: u32 = b.refused.values().sum();
    assert!(refused > 0, "no publish was refused during a {CUT:?} cut");
    for id in &b.held {
        let (n, attempt) = b.deliveries.get(id).copied().unwrap_or_default();
        assert!(
            n >= 2 && attempt >= 2,
            "held {id} was not delivered again ({n}, attempt {attempt})"
        );
    }
    let lost = b.lost();
    assert!(
        lost.is_empty(),
        "{} accepted events never ACKed: {lost:?}",
        lost.len()
    );
    eprintln!(
        "figures (cut {CUT:?}, {}): accepted {}, refused {refused} {:?}, lost {}, duplicates {}, \
         healthy {healthy_after:?} after the return, first delivery {first_delivery_after:?} after \
         it, client rebuilds {:?}",
        if broker.is_mock() {
            "mock cluster"
        } else {
            "tansu"
        },
        b.accepted.len(),
        b.refused,
        lost.len(),
        b.duplicates(),
        metric(&s.metrics(), "unimesh_kafka_client_rebuilds_total", ""),
    );
}

/// On the mock cluster only: tansu 0.6.0 restarted empty crashes librdkafka 2.12.1's
/// consumers (SIGSEGV in `rd_kafka_metadata_update_op` after "Topic (null) not found in
/// cache"; a plain confluent-kafka consumer crashes the same way), so the mesh cannot
/// live through it there. The mock cluster creates a topic a producer names, so there
/// this holds without the mesh creating it again.
#[test]
fn a_broker_restarted_empty_gets_its_topics_created_again() {
    let mut broker = Broker::start_mock_behind_proxy();
    let s = server(&broker, "restart");
    subscribe(&s);
    let book = Mutex::new(Book::default());
    for i in 0..10 {
        assert!(publish_booked(&s, &book, &format!("before{i}")));
    }
    unimesh_tests::wait_for("the events before the restart ACKed", DRAIN_TIMEOUT, || {
        consume_once(&s, &book, 0);
        lock(&book).lost().is_empty().then_some(())
    });

    broker.restart_empty();
    let restarted_at = Instant::now();
    // Publish until accepted again; every refusal meanwhile is a 503 with its reason.
    let mut n = 0;
    unimesh_tests::wait_for(
        "a publish accepted after the restart",
        RECOVERY_TIMEOUT,
        || {
            n += 1;
            if publish_booked(&s, &book, &format!("after{n}")) {
                return Some(());
            }
            std::thread::sleep(Duration::from_millis(500));
            None
        },
    );
    let accepted_after = restarted_at.elapsed();
    for i in 0..10 {
        let id = format!("later{i}");
        unimesh_tests::wait_for("a later publish accepted", RECOVERY_TIMEOUT, || {
            publish_booked(&s, &book, &id).then_some(())
        });
    }
    wait_health(&s, 200, "health 200 after the restart");
    let healthy_after = restarted_at.elapsed();
    let b = lock(&book);
    let after = b
        .accepted
        .iter()
        .filter(|id| !id.starts_with("before"))
        .count();
    assert!(after >= 11, "publishes after the restart: {after} accepted");
    eprintln!(
        "figures (restart empty, {}): accepted {} ({after} after the restart), refused {:?}, \
         publishes accepted {accepted_after:?} after the restart, healthy {healthy_after:?}",
        if broker.is_mock() {
            "mock cluster"
        } else {
            "tansu"
        },
        b.accepted.len(),
        b.refused,
    );
}

/// How long the mesh is watched while its broker is unreachable at start: two of its
/// tries of the broker (each waits up to the 10 s request timeout) and 20 of
/// librdkafka's reconnects, which logged about 200 lines in ten seconds before (issue 18).
const UNREACHABLE_WATCH: Duration = Duration::from_secs(20);

/// The bound on the mesh's log lines after [`UNREACHABLE_WATCH`]: its own lines (starting,
/// configuration, storage, "waiting for the Kafka broker", the watch's "the Kafka broker is
/// unreachable": 5) and the first of each kind of librdkafka's (a failed connect, and the
/// two global errors it raises, "broker transport failure" and "all brokers are down": 3),
/// 8 in all here; 12 leaves room for a kind of librdkafka line another machine may add.
/// Repeats within a minute are counted, not logged (`shell/src/storage/kafka/client_log.rs`).
const UNREACHABLE_LINES: usize = 12;

/// Goal: a mesh started while its broker is unreachable says so in one place instead of
/// librdkafka's hundreds of lines, and starts once the broker comes, without a restart:
/// meanwhile `/admin/health` and `/admin/ready` answer 503 naming the broker, and its log
/// holds a few lines. Method: `serve --storage kafka` told a loopback port nobody listens
/// on; health and readiness read every second for [`UNREACHABLE_WATCH`], each 503 naming
/// the broker; the log's lines counted; then tansu started on that port; the mesh becomes
/// ready, and an event published through it is delivered.
#[test]
fn a_broker_unreachable_at_start_is_named_by_health_in_a_few_log_lines_and_then_used() {
    let addr = unimesh_tests::kafka::free_port();
    let s = Server::start(
        unimesh_tests::Options::new()
            .toml(&format!(
                "[storage]\nbackend = \"kafka\"\ndefault_partitions = {PARTITIONS}\n\
                 [kafka]\nbrokers = \"{addr}\"\ninstance = \"early\"\nrequest_timeout_ms = 10000\n\
                 [mesh]\nflush_interval_ms = 20\n"
            ))
            .answering(),
    );
    let named = |r: &Resp| r.status == 503 && r.text().contains(&addr.to_string());
    let watched = Instant::now();
    while watched.elapsed() < UNREACHABLE_WATCH {
        for route in ["/admin/health", "/admin/ready"] {
            let r = s.admin_get(route);
            assert!(
                named(&r),
                "{route} while the broker is unreachable: {} {}",
                r.status,
                r.text()
            );
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    let log = s.stderr();
    let lines = log.lines().count();
    eprintln!(
        "FIGURES kafka broker unreachable at start: log_lines_after_{}s={lines} (bound {UNREACHABLE_LINES}); health: {}",
        UNREACHABLE_WATCH.as_secs(),
        s.admin_get("/admin/health").text()
    );
    assert!(
        lines <= UNREACHABLE_LINES,
        "{lines} log lines while the broker is unreachable:\n{log}"
    );

    let _broker = Broker::start_tansu_on(addr);
    let came = Instant::now();
    unimesh_tests::wait_for(
        "the mesh to be ready once the broker listens",
        RECOVERY_TIMEOUT,
        || {
            std::thread::sleep(Duration::from_millis(200));
            (s.admin_get("/admin/ready").status == 200).then_some(())
        },
    );
    let ready_after = came.elapsed();
    subscribe(&s);
    let id = "early-1";
    let r = publish_one(&s, id).unwrap_or_else(|e| panic!("publish: {e}"));
    r.expect(200);
    let got = unimesh_tests::wait_for("the event to be delivered", RECOVERY_TIMEOUT, || {
        let got = s.poll(GROUP, "c", 10, 1_000);
        (!got.is_empty()).then_some(got)
    });
    assert_eq!(got[0].event_id(), id);
    eprintln!(
        "FIGURES kafka broker unreachable at start: ready {} ms after the broker listened",
        ready_after.as_millis()
    );
}
