//! Publish deduplication (issue 22; DESIGN §5.1, §8) against the real binary on the
//! embedded log: within a topic's window a repeated CloudEvents identity (`source`, `id`)
//! is answered 200 with its first publish's partition and offset and `"duplicate": true`,
//! is not appended, and so is delivered once — across a SIGKILL and restart too (the window
//! is refilled from the log). A topic without a window appends every repeat; a bad window
//! setting stops `serve` naming its key.

use std::process::{Command, Stdio};
use std::time::Duration;

use unimesh_tests::{event, json, metric, Options, Server, Value};

const WAIT: Duration = Duration::from_secs(30);

/// The `results` of a publish answer (asserting 200).
fn results(r: &unimesh_tests::Resp) -> Vec<Value> {
    let v = r.ok_json(200);
    v["results"]
        .as_array()
        .unwrap_or_else(|| panic!("no results: {v}"))
        .clone()
}

fn place(x: &Value) -> (u64, u64) {
    (
        x["partition"].as_u64().unwrap_or(u64::MAX),
        x["offset"].as_u64().unwrap_or(u64::MAX),
    )
}

/// Goal: the same event published twice with a SIGKILL and a restart between is stored and
/// delivered once; the repeat's answer says so and names the first place. Method: a group
/// on the topic, publish, kill -9, restart, publish the same id (structured, then inside a
/// batch with a new event), consume everything, see each id once; the metrics count the
/// duplicates; a topic without a window appends the same repeat.
#[test]
fn a_repeat_across_a_restart_is_answered_as_accepted_and_delivered_once() {
    let mut s = Server::start(
        Options::new()
            .toml("[mesh]\nflush_interval_ms = 20\n\n[dedup.topics.orders]\nwindow_s = 600\n"),
    );
    s.subscribe(
        "billing",
        &json!({ "topic": "orders", "ackTimeoutMs": 60000 }),
    );
    s.subscribe("audit", &json!({ "topic": "plain", "ackTimeoutMs": 60000 }));
    let order = event("o-1", "order.created", json!({ "n": 1 }));
    let first = results(&s.publish_structured("orders", &order));
    assert_eq!(first.len(), 1);
    assert!(
        first[0].get("duplicate").is_none(),
        "a first publish carries no duplicate flag: {}",
        first[0]
    );
    let plain = results(&s.publish_structured("plain", &order));

    s.kill9();
    s.restart();

    let again = results(&s.publish_structured("orders", &order));
    assert_eq!(again[0]["id"], "o-1");
    assert_eq!(again[0]["duplicate"], true, "{}", again[0]);
    assert_eq!(
        place(&again[0]),
        place(&first[0]),
        "the first publish's place"
    );
    let order2 = event("o-2", "order.created", json!({ "n": 2 }));
    let batch = results(&s.publish_batch("orders", &[order2.clone(), order.clone(), order2]));
    assert!(
        batch[0].get("duplicate").is_none(),
        "o-2 is new: {}",
        batch[0]
    );
    assert_eq!(batch[1]["duplicate"], true);
    assert_eq!(place(&batch[1]), place(&first[0]));
    assert_eq!(batch[2]["duplicate"], true, "a repeat inside the batch");
    assert_eq!(place(&batch[2]), place(&batch[0]));
    let plain_again = results(&s.publish_structured("plain", &order));
    assert!(plain_again[0].get("duplicate").is_none());
    assert_ne!(
        place(&plain_again[0]),
        place(&plain[0]),
        "no window: appended again"
    );

    let got = s.poll_n("billing", "c", 2, WAIT);
    let mut ids: Vec<String> = got.iter().map(|d| d.event_id().to_owned()).collect();
    ids.sort();
    assert_eq!(ids, ["o-1", "o-2"]);
    let delivery_ids: Vec<&str> = got.iter().map(|d| d.id.as_str()).collect();
    s.ack("billing", &delivery_ids).all_ok(2);
    let more = s.poll("billing", "c", 100, 500);
    assert!(more.is_empty(), "a duplicate was delivered: {more:?}");
    assert_eq!(s.poll_n("audit", "c", 2, WAIT).len(), 2);

    let text = s.metrics();
    assert_eq!(
        metric(
            &text,
            "unimesh_publish_duplicates_total",
            "topic=\"orders\""
        ),
        Some(3.0),
        "{text}"
    );
    assert_eq!(
        metric(&text, "unimesh_published_total", "topic=\"orders\""),
        Some(1.0),
        "only o-2 was appended since the restart"
    );
    assert_eq!(
        metric(&text, "unimesh_publish_duplicates_total", "topic=\"plain\""),
        None
    );
}

/// Goal: a window out of range stops `serve` before it serves, naming the key and the
/// range. Method: run the binary with such a file; it exits non-zero.
#[test]
fn a_bad_window_stops_serve_naming_the_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let conf = dir.path().join("unimesh.toml");
    std::fs::write(&conf, "[dedup.topics.orders]\nwindow_s = 9999999\n").expect("write");
    let mut cmd = Command::new(unimesh_tests::unimesh_bin());
    cmd.args([
        "serve",
        "--http",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--data",
    ])
    .arg(dir.path().join("data"))
    .arg("--config")
    .arg(&conf)
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    for (k, _) in std::env::vars() {
        if k.starts_with("UNIMESH_") {
            cmd.env_remove(k);
        }
    }
    let out = cmd.output().expect("the binary runs");
    assert!(!out.status.success(), "served with a bad window");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("dedup.topics.orders.window_s") && err.contains("604800"),
        "{err}"
    );
}

/// Goal: the documented limit on Kafka (DESIGN §8): the window works within one instance's
/// life, starts empty after a restart (a repeat is appended again), and `serve` says so at
/// start rather than silently. Method: `Broker::start()` (tansu, or librdkafka's mock
/// cluster with `UNIMESH_TEST_BROKER=mock`); publish, repeat, restart, repeat; a group
/// from the earliest offset gets the event twice.
#[test]
fn on_kafka_the_window_is_this_instances_and_starts_empty() {
    let broker = unimesh_tests::kafka::Broker::start();
    let mut s = Server::start(
        broker
            .server_options("dedup", 2)
            .toml("[dedup.topics.orders]\nwindow_s = 600\n"),
    );
    let order = event("k-1", "order.created", json!({ "n": 1 }));
    let first = results(&s.publish_structured("orders", &order));
    let again = results(&s.publish_structured("orders", &order));
    assert_eq!(again[0]["duplicate"], true, "{}", again[0]);
    assert_eq!(place(&again[0]), place(&first[0]));
    assert!(
        s.stderr()
            .contains("publish deduplication: this log cannot tell"),
        "serve did not say that the window starts empty"
    );

    s.terminate();
    s.restart();
    let after = results(&s.publish_structured("orders", &order));
    assert!(
        after[0].get("duplicate").is_none(),
        "a Kafka window refilled across a restart: update DESIGN §8 and the README: {}",
        after[0]
    );
    assert_ne!(place(&after[0]), place(&first[0]));

    s.subscribe(
        "billing",
        &json!({ "topic": "orders", "ackTimeoutMs": 60000, "startFrom": "earliest" }),
    );
    let got = s.poll_n("billing", "c", 2, Duration::from_secs(60));
    let ids: Vec<&str> = got.iter().map(|d| d.event_id()).collect();
    assert_eq!(
        ids,
        ["k-1", "k-1"],
        "appended once before and once after the restart"
    );
}
