//! Publish → long-poll → ACK round trips in each content mode (binary, structured, batch):
//! the delivered event is the published one, carries `emmqpartition`/`emmqoffset` equal to
//! the publish answer, and once ACKed it is not delivered again.

use std::collections::BTreeMap;
use std::time::Duration;

use unimesh_tests::{event, json, published, Server, Value};

const WAIT: Duration = Duration::from_secs(30);

fn subscribe(s: &Server, group: &str, topic: &str) {
    s.subscribe(group, &json!({ "topic": topic, "ackTimeoutMs": 60000 }));
}

/// ACKs everything delivered, checks nothing more arrives for the group (a short wait:
/// that "nothing arrives" is the point, not how fast).
fn ack_all_and_drain(s: &Server, group: &str, client: &str, ids: &[String]) {
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    s.ack(group, &refs).all_ok(ids.len());
    let again = s.poll(group, client, 100, 300);
    assert!(again.is_empty(), "ACKed events came back: {again:?}");
    // A second ACK of the same ids is refused per id, not as a request.
    let twice = s.ack(group, &refs);
    assert_eq!(twice.accepted, 0);
    assert_eq!(twice.rejected.len(), ids.len());
    for (_, reason) in &twice.rejected {
        assert_eq!(reason, "already-done");
    }
}

#[test]
fn binary_mode_round_trip() {
    let s = Server::start_default();
    subscribe(&s, "bin-g", "bin-t");
    let ev = json!({
        "specversion": "1.0", "id": "b-1", "source": "/shop", "type": "order.created",
        "subject": "eu/42", "datacontenttype": "application/octet-stream", "tier": "gold",
    });
    let payload: Vec<u8> = (0u8..=255).collect();
    let p = published(&s.publish_binary("bin-t", &ev, &payload), 1);
    assert_eq!(p[0].id, "b-1");

    let d = s.poll_n("bin-g", "c1", 1, WAIT);
    assert_eq!(d.len(), 1);
    let got = &d[0];
    assert_eq!((got.partition, got.offset), (p[0].partition, p[0].offset));
    assert_eq!(got.attempt, 1);
    let e = &got.event;
    assert_eq!(e["id"], "b-1");
    assert_eq!(e["source"], "/shop");
    assert_eq!(e["type"], "order.created");
    assert_eq!(e["subject"], "eu/42");
    assert_eq!(e["tier"], "gold", "extensions survive");
    assert_eq!(e["specversion"], "1.0");
    // Binary data comes back in structured form as data_base64.
    let b64 = e["data_base64"]
        .as_str()
        .unwrap_or_else(|| panic!("binary payload not delivered as data_base64: {e}"));
    assert_eq!(decode_base64(b64), payload);
    ack_all_and_drain(&s, "bin-g", "c1", std::slice::from_ref(&got.id));
}

#[test]
fn binary_mode_json_body_round_trip() {
    let s = Server::start_default();
    subscribe(&s, "binj-g", "binj-t");
    let ev = json!({
        "specversion": "1.0", "id": "bj-1", "source": "/shop", "type": "order.created",
        "datacontenttype": "application/json",
    });
    let p = published(
        &s.publish_binary("binj-t", &ev, br#"{"total":42,"items":["a"]}"#),
        1,
    );
    let d = s.poll_n("binj-g", "c1", 1, WAIT);
    assert_eq!((d[0].partition, d[0].offset), (p[0].partition, p[0].offset));
    assert_eq!(d[0].event["data"], json!({"total": 42, "items": ["a"]}));
    assert_eq!(d[0].event["datacontenttype"], "application/json");
    ack_all_and_drain(&s, "binj-g", "c1", &[d[0].id.clone()]);
}

#[test]
fn structured_mode_round_trip() {
    let s = Server::start_default();
    subscribe(&s, "st-g", "st-t");
    let mut ev = event(
        "s-1",
        "order.paid",
        json!({"total": 7, "note": "ünïcode ✓"}),
    );
    ev["time"] = json!("2024-05-01T12:00:00Z");
    ev["subject"] = json!("x/y");
    ev["region"] = json!("eu");
    let p = published(&s.publish_structured("st-t", &ev), 1);
    assert_eq!(p[0].id, "s-1");
    let d = s.poll_n("st-g", "c1", 1, WAIT);
    let got = &d[0];
    assert_eq!((got.partition, got.offset), (p[0].partition, p[0].offset));
    let mut expected = ev.clone();
    expected["emmqpartition"] = json!(p[0].partition.to_string());
    expected["emmqoffset"] = json!(p[0].offset.to_string());
    assert_eq!(
        without_time(&got.event),
        without_time(&expected),
        "the delivered event is the published one plus emmq*"
    );
    let t = got.event["time"].as_str().unwrap_or_default();
    assert!(t.starts_with("2024-05-01T12:00:00"), "time survives: {t}");
    ack_all_and_drain(&s, "st-g", "c1", std::slice::from_ref(&got.id));
}

#[test]
fn batch_mode_round_trip() {
    let s = Server::start_default();
    subscribe(&s, "ba-g", "ba-t");
    let events: Vec<Value> = (0..25)
        .map(|i| event(&format!("batch-{i}"), "order.created", json!({ "n": i })))
        .collect();
    let p = published(&s.publish_batch("ba-t", &events), events.len());
    let by_id: BTreeMap<String, (u32, u64)> = p
        .iter()
        .map(|r| (r.id.clone(), (r.partition, r.offset)))
        .collect();
    assert_eq!(by_id.len(), 25, "ids answered in order, one each: {p:?}");
    for (i, r) in p.iter().enumerate() {
        assert_eq!(r.id, format!("batch-{i}"), "results in request order");
    }
    // Positions are unique.
    let positions: std::collections::BTreeSet<_> = by_id.values().collect();
    assert_eq!(positions.len(), 25);

    let d = s.poll_n("ba-g", "c1", 25, WAIT);
    assert_eq!(d.len(), 25);
    let mut seen = BTreeMap::new();
    for x in &d {
        let id = x.event_id().to_owned();
        let want = by_id
            .get(&id)
            .unwrap_or_else(|| panic!("delivered an event never published: {}", x.event));
        assert_eq!((x.partition, x.offset), *want, "emmq* of {id}");
        let n: u64 = id.trim_start_matches("batch-").parse().unwrap_or(u64::MAX);
        assert_eq!(x.event["data"], json!({ "n": n }));
        assert!(seen.insert(id, ()).is_none(), "delivered twice");
    }
    // Within a partition, offsets are delivered in order.
    let mut last: BTreeMap<u32, u64> = BTreeMap::new();
    for x in &d {
        if let Some(prev) = last.insert(x.partition, x.offset) {
            assert!(prev < x.offset, "partition {} out of order", x.partition);
        }
    }
    let ids: Vec<String> = d.iter().map(|x| x.id.clone()).collect();
    ack_all_and_drain(&s, "ba-g", "c1", &ids);
}

fn without_time(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(o) = v.as_object_mut() {
        o.remove("time");
    }
    v
}

fn decode_base64(s: &str) -> Vec<u8> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .unwrap_or_else(|e| panic!("data_base64 is not base64: {e}"))
}
