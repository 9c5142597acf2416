//! Redelivery and dead letters (C5): a delivery not ACKed within `ackTimeoutMs` comes back
//! with the next attempt number and a new id; a NACK with a delay holds it back for that
//! delay; extend keeps it out; after `maxAttempts` it is dead-lettered once, shows in
//! `/admin/dlq/{group}`, and a replay delivers it to that group only, with fresh attempts;
//! once the replay is ACKed the DLQ entry is gone. Another group of the same topic sees each
//! event exactly once throughout.
//!
//! No timing assertions: where the test checks that something does *not* come back within
//! a while, the while is far shorter than the server's delay, and the passing direction holds
//! however slow the machine is.

use std::time::Duration;

use unimesh_tests::{event, json, metric, published, wait_for, Delivery, Published, Server};

const WAIT: Duration = Duration::from_secs(60);

fn publish_one(s: &Server, topic: &str, id: &str) -> Published {
    let r = s.publish_structured(topic, &event(id, "redelivery.test", json!({ "id": id })));
    published(&r, 1).remove(0)
}

fn only(d: Vec<Delivery>) -> Delivery {
    assert_eq!(d.len(), 1, "expected one delivery: {d:?}");
    d.into_iter().next().unwrap_or_else(|| unreachable!())
}

/// The other group of the topic got `n` events, each once with attempt 1, and nothing
/// more.
fn other_group_undisturbed(s: &Server, group: &str, n: usize) {
    let d = s.poll_n(group, "o", n, WAIT);
    for x in &d {
        assert_eq!(x.attempt, 1, "{group}: {x:?}");
    }
    let ids: Vec<&str> = d.iter().map(|x| x.id.as_str()).collect();
    s.ack(group, &ids).all_ok(ids.len());
    let more = s.poll(group, "o", 100, 300);
    assert!(
        more.is_empty(),
        "{group} got redeliveries of another group: {more:?}"
    );
    let dlq = s.admin_get(&format!("/admin/dlq/{group}")).ok_json(200);
    assert_eq!(dlq["entries"], json!([]), "{group} has no dead letters");
}

#[test]
fn unacked_delivery_comes_back_after_the_ack_timeout() {
    let s = Server::start_default();
    let backoff = json!({ "initialMs": 10, "maxMs": 10, "multiplier": 1.0 });
    s.subscribe(
        "rt",
        &json!({ "topic": "rt-t", "ackTimeoutMs": 300, "maxAttempts": 10, "backoff": backoff }),
    );
    s.subscribe(
        "rt-other",
        &json!({ "topic": "rt-t", "ackTimeoutMs": 60000 }),
    );
    let p = publish_one(&s, "rt-t", "r-1");

    let first = only(s.poll_n("rt", "c", 1, WAIT));
    assert_eq!(first.attempt, 1);
    assert_eq!((first.partition, first.offset), (p.partition, p.offset));
    // Not ACKed: it comes back after the timeout, to any client of the group.
    let second = only(s.poll_n("rt", "c", 1, WAIT));
    assert_eq!(second.attempt, 2, "the next attempt: {second:?}");
    assert_eq!((second.partition, second.offset), (p.partition, p.offset));
    assert_eq!(second.event_id(), "r-1");
    assert_ne!(second.id, first.id, "a redelivery has a new id");

    s.ack("rt", &[&second.id]).all_ok(1);
    let old = s.ack("rt", &[&first.id]);
    assert_eq!(old.accepted, 0);
    assert_eq!(
        old.rejected,
        vec![(first.id.clone(), "already-done".to_owned())]
    );
    let more = s.poll("rt", "c", 10, 700);
    assert!(more.is_empty(), "an ACKed event came back: {more:?}");

    let sub = s.get("/v1/subscriptions/rt").ok_json(200);
    assert!(
        sub["stats"]["expired"].as_u64().unwrap_or(0) >= 1,
        "the expiry is counted: {sub}"
    );
    assert!(
        sub["stats"]["redelivered"].as_u64().unwrap_or(0) >= 1,
        "{sub}"
    );
    other_group_undisturbed(&s, "rt-other", 1);
}

#[test]
fn nack_with_delay_holds_the_event_back_then_redelivers_it() {
    let s = Server::start_default();
    s.subscribe("nk", &json!({ "topic": "nk-t", "ackTimeoutMs": 60000 }));
    s.subscribe(
        "nk-other",
        &json!({ "topic": "nk-t", "ackTimeoutMs": 60000 }),
    );
    let p = publish_one(&s, "nk-t", "n-1");

    let first = only(s.poll_n("nk", "c", 1, WAIT));
    let n = s.nack("nk", &[&first.id], Some(5_000));
    n.all_ok(1);
    // Well within the delay: not redelivered (the server may not come early).
    let early = s.poll("nk", "c", 10, 300);
    assert!(
        early.is_empty(),
        "redelivered before its NACK delay: {early:?}"
    );
    let second = only(s.poll_n("nk", "c", 1, WAIT));
    assert_eq!(second.attempt, 2);
    assert_eq!((second.partition, second.offset), (p.partition, p.offset));

    // A NACK with no delay (0) comes back at once, as attempt 3.
    s.nack("nk", &[&second.id], Some(0)).all_ok(1);
    let third = only(s.poll_n("nk", "c", 1, WAIT));
    assert_eq!(third.attempt, 3);
    // The NACKed id is finished: NACKing or ACKing it again is refused per id.
    let again = s.nack("nk", &[&second.id], None);
    assert_eq!(again.accepted, 0);
    assert_eq!(again.rejected.len(), 1, "{again:?}");
    s.ack("nk", &[&third.id]).all_ok(1);
    other_group_undisturbed(&s, "nk-other", 1);
}

#[test]
fn extend_keeps_a_delivery_from_timing_out() {
    let s = Server::start_default();
    s.subscribe("ex", &json!({ "topic": "ex-t", "ackTimeoutMs": 300 }));
    publish_one(&s, "ex-t", "x-1");
    let d = only(s.poll_n("ex", "c", 1, WAIT));
    let e = s.extend("ex", &[&d.id], Some(60_000));
    e.all_ok(1);
    // Without the extension it would be back after 300 ms.
    let back = s.poll("ex", "c", 10, 1_500);
    assert!(back.is_empty(), "an extended delivery timed out: {back:?}");
    s.ack("ex", &[&d.id]).all_ok(1);
}

#[test]
fn dead_letter_after_max_attempts_then_replay_to_that_group_only() {
    let s = Server::start_default();
    let backoff = json!({ "initialMs": 10, "maxMs": 10, "multiplier": 1.0 });
    s.subscribe(
        "dl",
        &json!({ "topic": "dl-t", "ackTimeoutMs": 300, "maxAttempts": 3, "backoff": backoff }),
    );
    s.subscribe(
        "dl-other",
        &json!({ "topic": "dl-t", "ackTimeoutMs": 60000 }),
    );
    let poison = publish_one(&s, "dl-t", "poison");
    publish_one(&s, "dl-t", "fine");

    // The fine event is ACKed; the poison one is NACKed, left to time out, NACKed again.
    let mut attempts = Vec::new();
    let started = std::time::Instant::now();
    while attempts.len() < 3 {
        assert!(started.elapsed() < WAIT, "attempts so far: {attempts:?}");
        for d in s.poll("dl", "c", 10, 500) {
            if d.event_id() == "fine" {
                s.ack("dl", &[&d.id]).all_ok(1);
                continue;
            }
            assert_eq!((d.partition, d.offset), (poison.partition, poison.offset));
            attempts.push(d.attempt);
            match d.attempt {
                2 => {} // left to its ACK timeout
                _ => s.nack("dl", &[&d.id], Some(0)).all_ok(1),
            }
        }
    }
    assert_eq!(attempts, vec![1, 2, 3], "one delivery per attempt");

    // Dead-lettered exactly once, and never delivered again.
    let dlq = wait_for("the poison event in the DLQ", WAIT, || {
        let v = s.admin_get("/admin/dlq/dl").ok_json(200);
        (v["entries"].as_array().map_or(0, Vec::len) == 1).then_some(v)
    });
    let entry = &dlq["entries"][0];
    assert_eq!(dlq["group"], "dl");
    assert_eq!(entry["topic"], "dl-t");
    assert_eq!(entry["partition"], poison.partition);
    assert_eq!(entry["offset"], poison.offset);
    assert_eq!(entry["attempts"], 3);
    assert_eq!(
        entry["reason"], "nacked",
        "the last attempt was NACKed: {entry}"
    );
    assert_eq!(entry["event"]["id"], "poison");
    assert_eq!(entry["event"]["data"], json!({ "id": "poison" }));
    let after = s.poll("dl", "c", 10, 700);
    assert!(after.is_empty(), "a dead letter was delivered: {after:?}");
    // Dead-lettered counts as done for the watermark.
    wait_for("dl's watermark past both events", WAIT, || {
        let rows = s.offsets("dl-t");
        rows.iter()
            .filter(|((g, _), _)| g == "dl")
            .all(|(_, r)| r["watermark"] == r["end"])
            .then_some(())
    });
    let m = s.metrics();
    assert!(
        metric(&m, "unimesh_dead_lettered_total", "").unwrap_or(0.0) >= 1.0,
        "dead letters are counted:\n{m}"
    );
    let first_page = s.admin_get("/admin/dlq/dl?max=1").ok_json(200);
    assert_eq!(first_page["entries"].as_array().map_or(0, Vec::len), 1);

    // Replay: back to this group, fresh attempts; the entry stays until the replay is ACKed.
    let r = s.admin("POST", "/admin/dlq/dl/replay").send().ok_json(200);
    assert_eq!(r["replayed"], 1, "{r}");
    let replayed = only(s.poll_n("dl", "c", 1, WAIT));
    assert_eq!(replayed.event_id(), "poison");
    assert_eq!(replayed.attempt, 1, "a replay starts its attempts afresh");
    assert_eq!(
        (replayed.partition, replayed.offset),
        (poison.partition, poison.offset),
        "a replayed event still names its position"
    );
    let still = s.admin_get("/admin/dlq/dl").ok_json(200);
    assert_eq!(
        still["entries"].as_array().map_or(0, Vec::len),
        1,
        "the entry stays while its replay is in flight: {still}"
    );
    s.ack("dl", &[&replayed.id]).all_ok(1);
    wait_for("the DLQ entry to go once the replay is ACKed", WAIT, || {
        let v = s.admin_get("/admin/dlq/dl").ok_json(200);
        (v["entries"] == json!([])).then_some(())
    });
    let again = s.admin("POST", "/admin/dlq/dl/replay").send().ok_json(200);
    assert_eq!(again["replayed"], 0, "nothing left to replay: {again}");
    let none = s.poll("dl", "c", 10, 500);
    assert!(none.is_empty(), "{none:?}");

    // The other group saw both events once and has no dead letters.
    other_group_undisturbed(&s, "dl-other", 2);
}

#[test]
fn attempts_and_dead_letters_survive_restarts() {
    let mut s = Server::start_default();
    let backoff = json!({ "initialMs": 10, "maxMs": 10, "multiplier": 1.0 });
    let doc =
        json!({ "topic": "dr-t", "ackTimeoutMs": 60000, "maxAttempts": 3, "backoff": backoff });
    s.subscribe("dr", &doc);
    let p = publish_one(&s, "dr-t", "d-1");
    publish_one(&s, "dr-t", "d-2");
    // d-2 is ACKed; d-1's first attempt is NACKed.
    for d in s.poll_n("dr", "c", 2, WAIT) {
        if d.event_id() == "d-1" {
            assert_eq!(d.attempt, 1);
            s.nack("dr", &[&d.id], Some(0)).all_ok(1);
        } else {
            s.ack("dr", &[&d.id]).all_ok(1);
        }
    }
    // d-1's second attempt is in flight when the process is killed. (A first attempt is
    // not recorded by design — after a crash it may repeat once, like any in-flight record
    // — but every later attempt is durable before it is handed out.)
    let second = only(s.poll_n("dr", "c", 1, WAIT));
    assert_eq!((second.event_id(), second.attempt), ("d-1", 2));
    // A PUT of the unchanged subscription is answered once everything before it is
    // durable.
    s.call("PUT", "/v1/subscriptions/dr")
        .json(&doc)
        .send()
        .expect(200);
    s.kill9();
    s.restart();

    let third = only(s.poll_n("dr", "c", 1, WAIT));
    assert_eq!(third.event_id(), "d-1");
    assert_eq!(
        third.attempt, 3,
        "attempts survive a crash, so retries stay bounded (C5)"
    );
    s.nack("dr", &[&third.id], Some(0)).all_ok(1);
    wait_for("d-1 dead-lettered", WAIT, || {
        let v = s.admin_get("/admin/dlq/dr").ok_json(200);
        (v["entries"].as_array().map_or(0, Vec::len) == 1).then_some(())
    });
    let status = s.terminate();
    assert!(status.success(), "SIGTERM exit: {status}");
    s.restart();
    let v = s.admin_get("/admin/dlq/dr").ok_json(200);
    let entries = v["entries"].as_array().cloned().unwrap_or_default();
    assert_eq!(
        entries.len(),
        1,
        "the dead letter survived the restart: {v}"
    );
    assert_eq!(entries[0]["offset"], p.offset);
    assert_eq!(entries[0]["partition"], p.partition);
    assert_eq!(entries[0]["attempts"], 3);
    let none = s.poll("dr", "c", 10, 700);
    assert!(
        none.is_empty(),
        "neither the dead letter nor the ACKed event came back: {none:?}"
    );
}
