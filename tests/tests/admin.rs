//! The admin listener: health and readiness, the OpenAPI document, Prometheus metrics whose
//! `unimesh_*` counters and gauges move with the traffic, the subscription, client and
//! offset views (the four offsets, ACK ranges above the watermark, lag), client eviction,
//! seek (operator replay of one group's partition), and per-topic rate limits.

use std::collections::BTreeSet;
use std::time::Duration;

use unimesh_tests::{event, json, metric, published, wait_for, Delivery, Server, Value};

const WAIT: Duration = Duration::from_secs(60);

#[test]
fn health_ready_and_the_openapi_document() {
    let s = Server::start_default();
    let h = s.admin_get("/admin/health").ok_json(200);
    assert_eq!(h, json!({ "status": "ok" }));
    let r = s.admin_get("/admin/ready").ok_json(200);
    assert_eq!(r, json!({ "status": "ready" }));

    // Each listener serves its own document, the one in the repository (the traffic API
    // and the admin API are apart: a traffic client never sees an admin route).
    for (served, file, title) in [
        (
            s.get("/openapi.json"),
            "openapi-traffic.json",
            "unimesh traffic API",
        ),
        (
            s.admin_get("/openapi.json"),
            "openapi-admin.json",
            "unimesh admin API",
        ),
    ] {
        let path = unimesh_tests::package_dir().join("../shell").join(file);
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let in_repo: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()));
        assert_eq!(
            served.ok_json(200),
            in_repo,
            "{}: the served document is the one in the repository",
            served.what
        );
        assert!(
            in_repo["openapi"]
                .as_str()
                .is_some_and(|v| v.starts_with("3.")),
            "OpenAPI 3"
        );
        assert_eq!(in_repo["info"]["title"], title);
        let paths = in_repo["paths"].as_object().expect("paths");
        assert!(
            paths.len() >= 8,
            "the document describes the routes: {paths:?}"
        );
        let admin_paths = paths.keys().filter(|p| p.starts_with("/admin")).count();
        if file == "openapi-traffic.json" {
            assert_eq!(admin_paths, 0, "no admin route in the traffic document");
        } else {
            assert!(
                paths.keys().all(|p| !p.starts_with("/v1/")),
                "no traffic route"
            );
        }
    }
}

/// Sum of every sample of `name` whose labels contain `label`.
fn metric_sum(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            let (n, labels) = k.split_once('{').unwrap_or((k, ""));
            (n == name && labels.contains(label))
                .then(|| v.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

#[test]
fn metrics_counters_and_gauges_move_with_the_traffic() {
    let s = Server::start_default();
    s.subscribe("m-g", &json!({ "topic": "m-t", "ackTimeoutMs": 60000 }));
    let before = s.admin_get("/metrics");
    before.expect(200);
    let ct = before.header("content-type").unwrap_or_default().to_owned();
    assert!(ct.starts_with("application/openmetrics-text"), "{ct}");
    let m0 = before.text();
    assert!(m0.ends_with("# EOF\n"), "OpenMetrics text ends with # EOF");
    assert_eq!(metric(&m0, "unimesh_acked_total", ""), Some(0.0), "{m0}");
    assert_eq!(metric(&m0, "unimesh_epoch", ""), Some(1.0), "{m0}");

    let events: Vec<Value> = (0..4)
        .map(|i| event(&format!("m{i}"), "t", json!(i)))
        .collect();
    published(&s.publish_batch("m-t", &events), 4);
    published(&s.publish_structured("m-t", &event("m4", "t", json!(4))), 1);
    let m1 = s.metrics();
    assert_eq!(
        metric(&m1, "unimesh_published_total", "topic=\"m-t\""),
        Some(5.0),
        "{m1}"
    );
    assert_eq!(metric_sum(&m1, "unimesh_lag", "group=\"m-g\""), 5.0, "{m1}");
    assert!(metric(&m1, "unimesh_publish_latency_seconds_count", "").unwrap_or(0.0) >= 2.0);
    assert!(
        metric(
            &m1,
            "unimesh_http_request_duration_seconds_count",
            "route=\"POST /v1/topics/{topic}/events\""
        )
        .unwrap_or(0.0)
            >= 2.0,
        "{m1}"
    );

    let d = s.poll_n("m-g", "c", 5, WAIT);
    let m2 = s.metrics();
    assert_eq!(
        metric(&m2, "unimesh_delivered_total", "group=\"m-g\""),
        Some(5.0)
    );
    assert_eq!(
        metric_sum(&m2, "unimesh_in_flight", "group=\"m-g\""),
        5.0,
        "{m2}"
    );

    let (nacked, acked) = d.split_at(1);
    s.nack("m-g", &[&nacked[0].id], Some(0)).all_ok(1);
    let ids: Vec<&str> = acked.iter().map(|x| x.id.as_str()).collect();
    s.ack("m-g", &ids).all_ok(4);
    let again = s.poll_n("m-g", "c", 1, WAIT);
    assert_eq!(again[0].attempt, 2);
    s.ack("m-g", &[&again[0].id]).all_ok(1);

    let m3 = s.metrics();
    assert_eq!(metric(&m3, "unimesh_acked_total", ""), Some(5.0), "{m3}");
    assert_eq!(metric(&m3, "unimesh_nacked_total", ""), Some(1.0), "{m3}");
    assert!(metric(&m3, "unimesh_redelivered_total", "").unwrap_or(0.0) >= 1.0);
    // `delivered` counts first attempts; the NACKed record's second try is a redelivery.
    assert_eq!(
        metric(&m3, "unimesh_delivered_total", "group=\"m-g\""),
        Some(5.0)
    );
    assert_eq!(metric(&m3, "unimesh_dead_lettered_total", ""), Some(0.0));
    assert_eq!(
        metric_sum(&m3, "unimesh_in_flight", "group=\"m-g\""),
        0.0,
        "{m3}"
    );
    assert_eq!(metric_sum(&m3, "unimesh_lag", "group=\"m-g\""), 0.0, "{m3}");
    wait_for("a progress persist to be counted", WAIT, || {
        let m = s.metrics();
        (metric(&m, "unimesh_persists_total", "").unwrap_or(0.0) >= 1.0).then_some(())
    });
    assert!(
        metric(&m3, "unimesh_fetches_total", "").unwrap_or(0.0) >= 1.0,
        "{m3}"
    );
    // The embedded log's own numbers: the four + one records, in at most two synced writes
    // here (a batch publish is one write), nothing failed.
    assert_eq!(
        metric(&m3, "unimesh_log_records_appended_total", ""),
        Some(5.0),
        "{m3}"
    );
    let writes = metric(&m3, "unimesh_log_synced_writes_total", "").unwrap_or(0.0);
    assert!((1.0..=2.0).contains(&writes), "{m3}");
    assert_eq!(
        metric(&m3, "unimesh_log_write_failures_total", ""),
        Some(0.0),
        "{m3}"
    );
    assert!(metric(&m3, "unimesh_log_disk_bytes", "").is_some(), "{m3}");
}

fn ids(d: &[Delivery]) -> Vec<&str> {
    d.iter().map(|x| x.id.as_str()).collect()
}

fn row(s: &Server, group: &str, partition: u32) -> Value {
    let rows = s.offsets("ad-t");
    rows.get(&(group.to_owned(), partition))
        .cloned()
        .unwrap_or_else(|| panic!("no offsets row for {group}/{partition}: {rows:?}"))
}

fn client_rows(s: &Server, group: &str) -> Vec<Value> {
    let v = s.admin_get("/admin/clients").ok_json(200);
    v["clients"]
        .as_array()
        .map(|a| a.iter().filter(|c| c["group"] == group).cloned().collect())
        .unwrap_or_default()
}

#[test]
fn subscriptions_clients_offsets_evict_and_seek() {
    let s = Server::start_default();
    s.subscribe(
        "ad-a",
        &json!({ "topic": "ad-t", "ackTimeoutMs": 60000, "maxInFlightPerClient": 3 }),
    );
    s.subscribe("ad-b", &json!({ "topic": "ad-t", "ackTimeoutMs": 60000 }));
    // One partition key: all six events in one partition, offsets 0..6.
    let events: Vec<Value> = (0..6)
        .map(|i| {
            let mut e = event(&format!("a{i}"), "t", json!(i));
            e["partitionkey"] = json!("same");
            e
        })
        .collect();
    let p = published(&s.publish_batch("ad-t", &events), 6);
    let part = p[0].partition;
    assert!(
        p.iter().all(|r| r.partition == part),
        "one key, one partition: {p:?}"
    );
    let offsets: Vec<u64> = p.iter().map(|r| r.offset).collect();
    assert_eq!(offsets, vec![0, 1, 2, 3, 4, 5]);

    // Two clients, three each (the per-client in-flight limit).
    let c1 = s.poll_n("ad-a", "c1", 3, WAIT);
    assert!(
        s.poll("ad-a", "c1", 10, 200).is_empty(),
        "c1 is at its limit of 3"
    );
    let c2 = s.poll_n("ad-a", "c2", 3, WAIT);
    let at = |d: &[Delivery], o: u64| -> String {
        d.iter()
            .find(|x| x.offset == o)
            .map(|x| x.id.clone())
            .unwrap_or_else(|| panic!("offset {o} not in {d:?}"))
    };
    let mut all = c1.clone();
    all.extend(c2.iter().cloned());
    let delivered: BTreeSet<u64> = all.iter().map(|x| x.offset).collect();
    assert_eq!(delivered, (0..6).collect());

    // Out-of-order ACKs: 1 and 4 first — the watermark stays at 0, ranges above it.
    s.ack("ad-a", &[&at(&all, 1), &at(&all, 4)]).all_ok(2);
    let r = row(&s, "ad-a", part);
    assert_eq!(r["watermark"], 0, "{r}");
    assert_eq!(r["ackRanges"], json!([[1, 2], [4, 5]]), "{r}");
    assert_eq!(r["end"], 6, "{r}");
    assert_eq!(r["cursor"], 6, "{r}");
    assert_eq!(r["push"], 6, "{r}");
    assert_eq!(r["lag"], 6, "{r}");
    assert_eq!(r["inFlight"], 4, "{r}");
    // Then 0: the watermark moves to the first gap.
    s.ack("ad-a", &[&at(&all, 0)]).all_ok(1);
    let r = row(&s, "ad-a", part);
    assert_eq!(r["watermark"], 2, "{r}");
    assert_eq!(r["ackRanges"], json!([[4, 5]]), "{r}");
    assert_eq!(r["lag"], 4, "{r}");
    assert_eq!(r["inFlight"], 3, "{r}");
    let durable = wait_for("the watermark to be durable", WAIT, || {
        let r = row(&s, "ad-a", part);
        (r["durableWatermark"] == 2).then_some(r)
    });
    assert_eq!(durable["watermark"], 2);
    // The other group moved not at all.
    let b = row(&s, "ad-b", part);
    assert_eq!(
        (b["watermark"].clone(), b["lag"].clone()),
        (json!(0), json!(6)),
        "{b}"
    );

    // Subscriptions and clients.
    let subs = s.admin_get("/admin/subscriptions").ok_json(200);
    let list = subs["subscriptions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let a = list
        .iter()
        .find(|x| x["group"] == "ad-a")
        .unwrap_or_else(|| panic!("ad-a not listed: {subs}"));
    assert_eq!(a["topic"], "ad-t");
    assert_eq!(a["maxInFlightPerClient"], 3);
    assert_eq!(a["clients"], 2, "{a}");
    assert_eq!(a["inFlight"], 3, "{a}");
    assert_eq!(a["lag"], 4, "{a}");
    assert_eq!(a["stats"]["acked"], 3, "{a}");
    assert!(list.iter().any(|x| x["group"] == "ad-b"), "{subs}");
    let one = s.get("/v1/subscriptions/ad-a").ok_json(200);
    assert_eq!(one["lag"], 4, "{one}");
    assert_eq!(one["partitions"].as_array().map_or(0, Vec::len), 4, "{one}");

    let clients = client_rows(&s, "ad-a");
    let in_flight = |name: &str| {
        clients
            .iter()
            .find(|c| c["client"] == name)
            .map(|c| c["inFlight"].clone())
            .unwrap_or_else(|| panic!("{name} not listed: {clients:?}"))
    };
    let held_by = |d: &[Delivery]| d.iter().filter(|x| x.offset >= 2 && x.offset != 4).count();
    assert_eq!(in_flight("c1"), json!(held_by(&c1)));
    assert_eq!(in_flight("c2"), json!(held_by(&c2)));

    // Evicting c2 hands its deliveries back; c1 gets them.
    let ev = s
        .admin("POST", "/admin/clients/c2/evict")
        .send()
        .ok_json(200);
    assert_eq!(ev, json!({ "client": "c2", "groups": 1 }));
    let listed: Vec<Value> = client_rows(&s, "ad-a")
        .iter()
        .map(|c| c["client"].clone())
        .collect();
    assert_eq!(listed, vec![json!("c1")], "c2 is gone");
    let c2_held: BTreeSet<u64> = c2
        .iter()
        .map(|x| x.offset)
        .filter(|o| *o >= 2 && *o != 4)
        .collect();
    // c1 still holds what it holds, so drain its share first to make room.
    let c1_held: Vec<String> = c1
        .iter()
        .filter(|x| x.offset >= 2 && x.offset != 4)
        .map(|x| x.id.clone())
        .collect();
    let c1_refs: Vec<&str> = c1_held.iter().map(String::as_str).collect();
    s.ack("ad-a", &c1_refs).all_ok(c1_refs.len());
    let back = s.poll_n("ad-a", "c1", c2_held.len(), WAIT);
    let back_offsets: BTreeSet<u64> = back.iter().map(|x| x.offset).collect();
    assert_eq!(
        back_offsets, c2_held,
        "the evicted client's deliveries came back"
    );
    assert!(back.iter().all(|x| x.attempt == 2), "{back:?}");
    s.ack("ad-a", &ids(&back)).all_ok(back.len());
    let r = row(&s, "ad-a", part);
    assert_eq!(
        (r["watermark"].clone(), r["lag"].clone()),
        (json!(6), json!(0)),
        "{r}"
    );

    // Seek: an operator replay of ad-a's partition from offset 3. Nothing else moves.
    let seek = s
        .admin("POST", "/admin/subscriptions/ad-a/seek")
        .json(&json!({ "partition": part, "offset": 3 }))
        .send()
        .ok_json(200);
    assert_eq!(
        seek,
        json!({ "group": "ad-a", "partition": part, "offset": 3 })
    );
    let r = row(&s, "ad-a", part);
    assert_eq!(r["watermark"], 3, "{r}");
    let replay = s.poll_n("ad-a", "c1", 3, WAIT);
    let replayed: Vec<u64> = replay.iter().map(|x| x.offset).collect();
    assert_eq!(
        replayed,
        vec![3, 4, 5],
        "the seek redelivers from offset 3 on"
    );
    assert!(s.poll("ad-a", "c1", 10, 300).is_empty());
    let b = row(&s, "ad-b", part);
    assert_eq!(
        b["watermark"], 0,
        "the seek of ad-a did not touch ad-b: {b}"
    );
    // A delivery from before a second seek is refused as revoked.
    s.admin("POST", "/admin/subscriptions/ad-a/seek")
        .json(&json!({ "partition": part, "offset": 5 }))
        .send()
        .expect(200);
    let old = s.ack("ad-a", &[&replay[0].id]);
    assert_eq!(old.accepted, 0);
    assert_eq!(
        old.rejected,
        vec![(replay[0].id.clone(), "revoked".to_owned())]
    );
    let five = s.poll_n("ad-a", "c1", 1, WAIT);
    assert_eq!(five[0].offset, 5);
    s.ack("ad-a", &ids(&five)).all_ok(1);
    let r = row(&s, "ad-a", part);
    assert_eq!(
        (r["watermark"].clone(), r["lag"].clone()),
        (json!(6), json!(0)),
        "{r}"
    );
}

#[test]
fn rate_limit_answers_429_with_retry_after() {
    let s = Server::start_default();
    let rule = s
        .admin("PUT", "/admin/ratelimit")
        .json(&json!({ "topic": "rl-t", "eventsPerSecond": 1, "burst": 2 }))
        .send()
        .ok_json(200);
    assert_eq!(
        rule,
        json!({ "topic": "rl-t", "eventsPerSecond": 1, "burst": 2 })
    );
    // A burst of 2 at one event a second: a quick run of publishes meets a 429 (unless
    // every publish took over a second, which is when the loop ends without one).
    let mut accepted = 0;
    let mut limited = None;
    for i in 0..10 {
        let r = s.publish_structured("rl-t", &event(&format!("rl{i}"), "t", json!(i)));
        match r.status {
            200 => accepted += 1,
            429 => {
                limited = Some(r);
                break;
            }
            other => panic!("publish answered {other}: {}", r.text()),
        }
    }
    let r = limited.unwrap_or_else(|| panic!("no 429 after {accepted} quick publishes"));
    r.expect_error(429, "rate-limited");
    let retry: u64 = r
        .header("retry-after")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("429 without a Retry-After in seconds: {:?}", r.headers));
    assert!(retry >= 1, "Retry-After {retry}");
    // A batch larger than the burst can never pass.
    let three: Vec<Value> = (0..3)
        .map(|i| event(&format!("b{i}"), "t", json!(i)))
        .collect();
    s.publish_batch("rl-t", &three)
        .expect_error_naming(413, "too-large", &["burst"]);
    // Other topics are not limited.
    for i in 0..5 {
        published(
            &s.publish_structured("free-t", &event(&format!("f{i}"), "t", json!(i))),
            1,
        );
    }
    s.admin("PUT", "/admin/ratelimit")
        .json(&json!({ "topic": "rl-t", "eventsPerSecond": 0, "burst": 0 }))
        .send()
        .expect_error_naming(400, "invalid-request", &["eventsPerSecond"]);
}

/// Goal: seek by time on the embedded log (its time index): see
/// `unimesh_tests::seek::replay_by_time`. Then the index survives a SIGKILL: after a
/// restart, "the last hour" still starts every partition at 0.
#[test]
fn seek_by_time_replays_what_came_after_a_time_and_the_last_hour() {
    let mut s = Server::start_default();
    unimesh_tests::seek::replay_by_time(&s, "by-time", "timed");
    s.kill9();
    s.restart();
    let hour_ago = unimesh_tests::seek::rfc3339(unimesh_tests::seek::now_ms() - 3_600_000);
    for partition in 0..4 {
        assert_eq!(
            unimesh_tests::seek::seek_to_time(&s, "by-time", partition, &hour_ago),
            0,
            "after the restart, partition {partition}"
        );
    }
    let back = s.poll_n("by-time", "c", 12, WAIT);
    assert_eq!(back.len(), 12, "every event again after the restart's seek");
}
