//! Webhook push and request/reply against the real binary: receivers in this test answer
//! as a subscriber would (deferring with 503 + Retry-After, failing, too slow), the server
//! is killed with SIGKILL while pushing, and request/reply round trips, times out and
//! counts a late reply.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use unimesh_tests::hook::{Hook, HookAnswer, HookRequest};
use unimesh_tests::{event, json, metric, published, wait_for, Options, Server, Value};

const WAIT: Duration = Duration::from_secs(90);

/// The receivers here listen on loopback, which `push.allowed_hosts` must list (the
/// default allows public addresses only).
fn fast() -> Options {
    Options::new().toml(
        "[mesh]\nflush_interval_ms = 20\n[push]\nscan_interval_ms = 50\nallowed_hosts = \"127.0.0.1\"\n",
    )
}

fn push_group(s: &Server, group: &str, topic: &str, url: &str, extra: Value) {
    let mut doc = json!({"topic": topic, "push": {"url": url}, "ackTimeoutMs": 60_000,
                         "backoff": {"initialMs": 0, "maxMs": 10_000, "multiplier": 1.0}});
    if let (Some(d), Some(e)) = (doc.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            d.insert(k.clone(), v.clone());
        }
    }
    s.subscribe(group, &doc);
}

fn attempt(r: &HookRequest) -> u64 {
    r.header("x-unimesh-attempt")
        .and_then(|a| a.parse().ok())
        .unwrap_or(0)
}

/// Goal: a push is a binary-mode CloudEvent with the delivery id in a header; 503 with
/// `Retry-After: 2` defers the next attempt (order and counts: another event is pushed in
/// the gap, and the deferred one comes once more, as attempt 2).
#[test]
fn a_deferred_push_waits_for_retry_after_then_is_acked() {
    let s = Server::start(fast());
    let hook = Hook::start(|r, _| {
        if r.event_id() == "first" && attempt(r) == 1 {
            HookAnswer::status(503).header("retry-after", "2")
        } else {
            HookAnswer::status(200)
        }
    });
    push_group(&s, "g", "t", &hook.url("/in"), json!({}));
    published(
        &s.publish_structured("t", &event("first", "t", json!({"n": 1}))),
        1,
    );
    wait_for("the first push", WAIT, || (hook.count() >= 1).then_some(()));
    published(
        &s.publish_structured("t", &event("second", "t", json!({"n": 2}))),
        1,
    );
    wait_for("both ACKed", WAIT, || {
        let info = s.get("/v1/subscriptions/g").ok_json(200);
        (info["stats"]["acked"] == 2).then_some(())
    });
    let log = hook.requests();
    let order: Vec<(String, u64)> = log
        .iter()
        .map(|r| (r.event_id().to_owned(), attempt(r)))
        .collect();
    assert_eq!(
        order,
        vec![
            ("first".into(), 1),
            ("second".into(), 1),
            ("first".into(), 2)
        ],
        "the deferred event waited while the other was pushed"
    );
    let r = &log[0];
    assert_eq!(r.method, "POST");
    assert_eq!(r.path, "/in");
    assert_eq!(r.header("ce-specversion"), Some("1.0"));
    assert_eq!(r.header("ce-type"), Some("t"));
    assert!(r.header("ce-emmqoffset").is_some() && r.header("ce-emmqpartition").is_some());
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(
        serde_json::from_slice::<Value>(&r.body).ok(),
        Some(json!({"n": 1}))
    );
    assert!(r
        .header("x-unimesh-delivery-id")
        .is_some_and(|id| id.split('.').count() == 5));
}

/// Goal: a subscription written through the API starts pushing at once, not at the next
/// scan of the subscriptions (which held a new group's first deliveries up to
/// `push.scan_interval_ms`, 500 ms by default). Method: the scan runs once an hour; the
/// first push must still come (before the change it came an hour later: the test's wait
/// ran out).
#[test]
fn a_new_push_subscription_pushes_without_waiting_for_the_scan() {
    let s = Server::start(Options::new().toml(
        "[mesh]\nflush_interval_ms = 20\n[push]\nscan_interval_ms = 3600000\nallowed_hosts = \"127.0.0.1\"\n",
    ));
    let hook = Hook::start(|_, _| HookAnswer::status(200));
    push_group(&s, "g", "t", &hook.url("/in"), json!({}));
    published(
        &s.publish_structured("t", &event("first", "t", json!({"n": 1}))),
        1,
    );
    wait_for("the first push", WAIT, || (hook.count() >= 1).then_some(()));
    assert_eq!(hook.requests()[0].event_id(), "first");
}

/// Goal: a subscriber that always fails gets `maxAttempts` pushes, then the event is
/// dead-lettered exactly once, browsable, and replayable (the replay is pushed and ACKed).
#[test]
fn an_always_failing_subscriber_dead_letters_once_and_replays() {
    let s = Server::start(fast());
    let healthy = Arc::new(AtomicBool::new(false));
    let h = healthy.clone();
    let hook = Hook::start(move |_, _| {
        HookAnswer::status(if h.load(Ordering::Relaxed) { 200 } else { 500 })
    });
    push_group(&s, "g", "t", &hook.url("/in"), json!({"maxAttempts": 3}));
    published(
        &s.publish_structured("t", &event("doomed", "t", json!(1))),
        1,
    );
    let entries = wait_for("the dead letter", WAIT, || {
        let v = s.admin_get("/admin/dlq/g").ok_json(200);
        let e = v["entries"].as_array().cloned().unwrap_or_default();
        (!e.is_empty()).then_some(e)
    });
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0]["attempts"], 3, "{}", entries[0]);
    assert_eq!(entries[0]["event"]["id"], "doomed");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(hook.count(), 3, "exactly maxAttempts pushes");
    let info = s.get("/v1/subscriptions/g").ok_json(200);
    assert_eq!(info["stats"]["deadLettered"], 1, "{info}");
    healthy.store(true, Ordering::Relaxed);
    let r = s.admin("POST", "/admin/dlq/g/replay").send().ok_json(200);
    assert_eq!(r["replayed"], 1);
    wait_for("the replay ACKed and resolved", WAIT, || {
        let v = s.admin_get("/admin/dlq/g").ok_json(200);
        v["entries"]
            .as_array()
            .is_some_and(Vec::is_empty)
            .then_some(())
    });
    assert_eq!(hook.count(), 4, "the replay was pushed once and ACKed");
}

/// Goal: a subscriber slower than `push.request_timeout_ms` gets a NACK (then a new
/// attempt), while another group's subscriber is not slowed by it.
#[test]
fn a_slow_subscriber_times_out_and_does_not_slow_another_group() {
    let s = Server::start(Options::new().toml(
        "[mesh]\nflush_interval_ms = 20\n[push]\nscan_interval_ms = 50\nrequest_timeout_ms = 300\nallowed_hosts = \"127.0.0.1\"\n",
    ));
    let slow = Hook::start(|r, _| {
        let a = HookAnswer::status(200);
        if attempt(r) == 1 {
            a.after(Duration::from_secs(2))
        } else {
            a
        }
    });
    let quick = Hook::ok();
    push_group(&s, "slow", "t", &slow.url("/s"), json!({}));
    push_group(&s, "quick", "t", &quick.url("/q"), json!({}));
    published(&s.publish_structured("t", &event("e", "t", json!(1))), 1);
    wait_for("the quick group ACKed", WAIT, || {
        let info = s.get("/v1/subscriptions/quick").ok_json(200);
        (info["stats"]["acked"] == 1).then_some(())
    });
    wait_for("the slow group ACKed on its second attempt", WAIT, || {
        let info = s.get("/v1/subscriptions/slow").ok_json(200);
        (info["stats"]["acked"] == 1).then_some(())
    });
    let attempts: Vec<u64> = slow.requests().iter().map(attempt).collect();
    assert_eq!(
        &attempts[..2],
        &[1, 2],
        "the timed-out attempt was followed by another"
    );
    assert_eq!(quick.count(), 1);
}

/// Goal: SIGKILL while pushing loses nothing: after the restart every event published
/// before the kill reaches the webhook, and none below a watermark that was durable
/// before the kill is pushed again.
#[test]
fn sigkill_while_pushing_loses_nothing_and_repeats_nothing_durably_acked() {
    let mut s = Server::start(fast());
    let hook = Hook::start(|_, _| HookAnswer::status(200).after(Duration::from_millis(100)));
    push_group(&s, "g", "t", &hook.url("/in"), json!({}));
    let ids: Vec<String> = (0..60).map(|i| format!("k{i}")).collect();
    let events: Vec<Value> = ids.iter().map(|id| event(id, "t", json!(1))).collect();
    published(&s.publish_batch("t", &events), ids.len());
    wait_for("some pushes", WAIT, || (hook.count() >= 15).then_some(()));
    let durable: BTreeMap<u32, u64> = s
        .offsets("t")
        .into_iter()
        .filter(|((g, _), _)| g == "g")
        .map(|((_, p), row)| (p, row["durableWatermark"].as_u64().unwrap_or(0)))
        .collect();
    s.kill9();
    let before = hook.count();
    s.restart();
    wait_for("every event pushed", WAIT, || {
        let seen: BTreeSet<String> = hook
            .requests()
            .iter()
            .map(|r| r.event_id().to_owned())
            .collect();
        ids.iter().all(|id| seen.contains(id)).then_some(())
    });
    for r in &hook.requests()[before..] {
        let p: u32 = r
            .header("ce-emmqpartition")
            .and_then(|v| v.parse().ok())
            .expect("partition");
        let o: u64 = r
            .header("ce-emmqoffset")
            .and_then(|v| v.parse().ok())
            .expect("offset");
        assert!(
            o >= durable.get(&p).copied().unwrap_or(0),
            "offset {o} of partition {p} was durably ACKed ({durable:?}) and was pushed again"
        );
    }
}

/// A responder: polls the request topic and publishes each request's reply to its
/// `emreplyto` with its `emcorrelationid`.
fn respond_once(s: &Server, group: &str) {
    let d = s.poll_n(group, "responder", 1, WAIT);
    let req = &d[0].event;
    let reply = json!({
        "specversion": "1.0", "id": format!("re-{}", req["id"].as_str().unwrap_or("")),
        "source": "/responder", "type": "reply",
        "emcorrelationid": req["emcorrelationid"], "data": {"answer": 42},
    });
    let to = req["emreplyto"].as_str().expect("emreplyto").to_owned();
    published(&s.publish_structured(&to, &reply), 1);
    s.ack(group, &[d[0].id.as_str()]).all_ok(1);
}

/// Goal: request/reply round trip, timeout (504), and a late reply dropped and counted.
#[test]
fn request_reply_round_trip_timeout_and_late_reply() {
    let s = Server::start(fast());
    s.subscribe("responders", &json!({"topic": "rq"}));
    let request = event("q1", "question", json!({"q": "?"}));
    let answer = std::thread::scope(|scope| {
        let responder = scope.spawn(|| respond_once(&s, "responders"));
        let r = s
            .call("POST", "/v1/topics/rq/request?timeoutMs=60000")
            .header("content-type", "application/cloudevents+json")
            .body(request.to_string())
            .send();
        responder.join().expect("the responder ran");
        r
    });
    let reply = answer.ok_json(200);
    assert_eq!(reply["data"], json!({"answer": 42}), "{reply}");
    assert_eq!(reply["type"], "reply");
    assert!(reply["emcorrelationid"].is_string(), "generated: {reply}");

    // Nobody answers: 504 after timeoutMs.
    let mut late = event("q2", "question", json!(2));
    late["emcorrelationid"] = json!("late-1");
    s.call("POST", "/v1/topics/lonely/request?timeoutMs=200")
        .header("content-type", "application/cloudevents+json")
        .body(late.to_string())
        .send()
        .expect_error(504, "timeout");
    // The reply comes after all: stored like any event, dropped as a reply, counted.
    let reply = json!({"specversion": "1.0", "id": "late-reply", "source": "/r", "type": "reply",
                       "emcorrelationid": "late-1"});
    published(&s.publish_structured("lonely.reply", &reply), 1);
    let m = s.metrics();
    assert_eq!(
        metric(&m, "unimesh_late_replies_total", ""),
        Some(1.0),
        "{m}"
    );
    assert_eq!(metric(&m, "unimesh_request_timeouts_total", ""), Some(1.0));
}

/// Goal: `push.batch` POSTs several events per request as a CloudEvents batch, the answer
/// settling all of them: a 500 NACKs every event of its batch (each comes again as attempt
/// 2), a 2xx ACKs them; every event arrives, none beyond `batch` in one request, and the
/// delivery ids header lists one id per event. Method: 60 events published at once to a
/// group with batch 10; the receiver fails its first request.
#[test]
fn a_batched_push_carries_up_to_batch_events_and_its_answer_settles_them_all() {
    let s = Server::start(fast());
    let hook = Hook::start(|_, n| HookAnswer::status(if n == 0 { 500 } else { 200 }));
    s.subscribe(
        "b",
        &json!({"topic": "tb", "push": {"url": hook.url("/in"), "batch": 10}, "ackTimeoutMs": 60_000,
                "backoff": {"initialMs": 0, "maxMs": 10_000, "multiplier": 1.0}}),
    );
    let got = s.get("/v1/subscriptions/b").ok_json(200);
    assert_eq!(got["push"]["batch"], 10, "{got}");
    let events: Vec<Value> = (0..60)
        .map(|i| event(&format!("e{i}"), "t", json!({"i": i})))
        .collect();
    published(&s.publish_batch("tb", &events), 60);
    wait_for("all 60 ACKed", WAIT, || {
        let info = s.get("/v1/subscriptions/b").ok_json(200);
        (info["stats"]["acked"] == 60).then_some(())
    });
    let log = hook.requests();
    let mut seen: BTreeMap<String, u64> = BTreeMap::new();
    let mut failed_batch = BTreeSet::new();
    for (n, r) in log.iter().enumerate() {
        assert_eq!(
            r.header("content-type"),
            Some("application/cloudevents-batch+json"),
            "request {n}"
        );
        let batch: Vec<Value> = serde_json::from_slice(&r.body).expect("a JSON array");
        assert!(
            !batch.is_empty() && batch.len() <= 10,
            "request {n}: {} events",
            batch.len()
        );
        let ids = r.header("x-unimesh-delivery-id").unwrap_or("");
        assert_eq!(
            ids.split(',').count(),
            batch.len(),
            "request {n}: ids {ids}"
        );
        for e in &batch {
            let id = e["id"].as_str().expect("an event id").to_owned();
            assert!(e["emmqoffset"].is_string(), "{e}");
            if n == 0 {
                failed_batch.insert(id.clone());
            }
            *seen.entry(id).or_default() += 1;
        }
    }
    let all: BTreeSet<String> = (0..60).map(|i| format!("e{i}")).collect();
    assert_eq!(seen.keys().cloned().collect::<BTreeSet<_>>(), all);
    assert!(!failed_batch.is_empty());
    for (id, times) in &seen {
        let want = if failed_batch.contains(id) { 2 } else { 1 };
        assert_eq!(*times, want, "{id}: pushed {times} times");
    }
    assert!(
        log.len() < 60,
        "{} requests for 60 events: not batched",
        log.len()
    );
}
