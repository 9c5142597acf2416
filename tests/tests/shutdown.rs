//! Graceful shutdown: SIGTERM (and SIGINT) make the server answer open long-polls, flush the
//! progress it has not written yet, and exit 0; after a restart, what was ACKed before the
//! signal is not delivered again and what was in flight is.
//!
//! The progress flush interval is set to ten minutes, so within the test only the shutdown
//! itself can make the ACKs durable: without that flush they would all come back.

use std::collections::BTreeSet;
use std::time::Duration;

use unimesh_tests::{event, json, published, Delivery, Options, Server, Value};

const WAIT: Duration = Duration::from_secs(60);

/// (partition, offset) of records.
type Positions = BTreeSet<(u32, u64)>;

fn slow_flush() -> Options {
    Options::new().toml("[mesh]\nflush_interval_ms = 600000\n[server]\nshutdown_grace_ms = 3000\n")
}

fn setup(s: &Server, group: &str, topic: &str, n: usize) -> Vec<Delivery> {
    s.subscribe(group, &json!({ "topic": topic, "ackTimeoutMs": 600000 }));
    let events: Vec<Value> = (0..n)
        .map(|i| event(&format!("{topic}-{i}"), "t", json!(i)))
        .collect();
    published(&s.publish_batch(topic, &events), n);
    s.poll_n(group, "c", n, WAIT)
}

/// ACKs every delivery but every fourth, out of order; returns (acked, held) positions.
fn ack_most(s: &Server, group: &str, d: &[Delivery]) -> (Positions, Positions) {
    let mut acked = BTreeSet::new();
    let mut held = BTreeSet::new();
    let mut ids = Vec::new();
    for (i, x) in d.iter().enumerate().rev() {
        if i % 4 == 3 {
            held.insert((x.partition, x.offset));
        } else {
            acked.insert((x.partition, x.offset));
            ids.push(x.id.as_str());
        }
    }
    s.ack(group, &ids).all_ok(ids.len());
    (acked, held)
}

fn check_after_restart(s: &Server, group: &str, old: &[Delivery], held: &BTreeSet<(u32, u64)>) {
    let back = s.poll_n(group, "c", held.len(), WAIT);
    let positions: BTreeSet<(u32, u64)> = back.iter().map(|x| (x.partition, x.offset)).collect();
    assert_eq!(
        &positions, held,
        "exactly the deliveries in flight at the signal come back"
    );
    let more = s.poll(group, "c", 100, 500);
    assert!(
        more.is_empty(),
        "ACKed events came back after a graceful stop: {more:?}"
    );
    let stale = s.ack(group, &[&old[0].id]);
    assert_eq!(
        stale.rejected,
        vec![(old[0].id.clone(), "stale".to_owned())]
    );
    let ids: Vec<&str> = back.iter().map(|x| x.id.as_str()).collect();
    s.ack(group, &ids).all_ok(ids.len());
}

#[test]
fn sigterm_flushes_acks_so_they_are_not_redelivered() {
    let mut s = Server::start(slow_flush());
    let d = setup(&s, "sd-g", "sd-t", 40);
    let (acked, held) = ack_most(&s, "sd-g", &d);
    assert_eq!((acked.len(), held.len()), (30, 10));
    // The ACKs are not durable yet (the flush interval is long): the flush at shutdown is
    // what the rest of the test depends on.
    let rows = s.offsets("sd-t");
    assert!(
        rows.values()
            .any(|r| r["durableWatermark"].as_u64() < r["watermark"].as_u64()),
        "some progress should still be in memory only: {rows:?}"
    );

    // A long-poll is open when the signal comes: it is answered, and the process exits 0.
    let agent = s.agent();
    let url = s.http_url("/v1/subscriptions/sd-g/events?client=waiting&max=10&waitMs=60000");
    let waiting =
        std::thread::spawn(move || unimesh_tests::Call::new(&agent, "GET", url).try_send());
    std::thread::sleep(Duration::from_millis(200));
    let status = s.terminate();
    assert!(status.success(), "exit status after SIGTERM: {status}");
    match waiting.join() {
        Ok(Ok(r)) => assert!(
            r.status == 200 || r.status == 503,
            "the open long-poll got {} {}",
            r.status,
            r.text()
        ),
        // The connection may be closed once the grace period ends; it must not hang.
        Ok(Err(_)) => {}
        Err(_) => panic!("the long-poll thread panicked"),
    }
    let log = s.stderr();
    assert!(log.contains("SIGTERM"), "the signal is logged:\n{log}");
    assert!(log.contains("engine flushed its progress"), "{log}");

    s.restart();
    check_after_restart(&s, "sd-g", &d, &held);
}

#[test]
fn sigint_stops_gracefully_too() {
    let mut s = Server::start(slow_flush());
    let d = setup(&s, "si-g", "si-t", 12);
    let (_, held) = ack_most(&s, "si-g", &d);
    let status = s.interrupt();
    assert!(status.success(), "exit status after SIGINT: {status}");
    assert!(s.stderr().contains("SIGINT"));
    s.restart();
    check_after_restart(&s, "si-g", &d, &held);
}

#[test]
fn sigkill_without_a_flush_redelivers_what_was_not_durable() {
    // The counterpart: with the same long flush interval, SIGKILL may lose ACKs that were
    // not durable yet, and at-least-once means those events come back. Everything in flight
    // comes back; nothing below the durable watermark does.
    let mut s = Server::start(slow_flush());
    let d = setup(&s, "sk-g", "sk-t", 12);
    let (acked, held) = ack_most(&s, "sk-g", &d);
    let durable: std::collections::BTreeMap<u32, u64> = s
        .offsets("sk-t")
        .iter()
        .map(|((_, p), r)| (*p, r["durableWatermark"].as_u64().unwrap_or(0)))
        .collect();
    s.kill9();
    s.restart();
    let mut back = BTreeSet::new();
    loop {
        let got = s.poll("sk-g", "c", 100, 500);
        if got.is_empty() {
            break;
        }
        back.extend(got.iter().map(|x| (x.partition, x.offset)));
    }
    assert!(
        back.is_superset(&held),
        "in-flight records come back: {back:?} {held:?}"
    );
    for (p, o) in &back {
        assert!(
            held.contains(&(*p, *o)) || acked.contains(&(*p, *o)),
            "({p}, {o}) was never delivered"
        );
        assert!(
            *o >= durable.get(p).copied().unwrap_or(0),
            "({p}, {o}) is below the durable watermark yet came back"
        );
    }
    let lost_acks = back.len() - held.len();
    eprintln!(
        "sigkill: {lost_acks} of {} unflushed ACKs were lost and redelivered",
        acked.len()
    );
}
