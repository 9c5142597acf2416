//! Every bad input gets a 4xx with the JSON error body of docs/DESIGN.md §5.1 —
//! `{"error": "<code>", "message": "<text naming the problem>"}` — and changes nothing:
//! refused publishes store nothing (not even part of a batch), refused subscription requests
//! neither create nor alter a group, refused ACK/NACK/extend requests leave the delivery in
//! flight, and malformed delivery ids are answered per id while the good ids in the same
//! request still count.

use unimesh_tests::{event, json, published, Call, Options, Resp, Server, Value};

/// Limits small enough that oversized bodies are cheap to send.
fn small_limits() -> Options {
    Options::new().toml(
        "[limits]\nmax_request_bytes = 65536\nmax_event_bytes = 16384\nmax_batch_events = 10\n\
         max_json_bytes = 4096\nmax_ids_per_request = 20\n",
    )
}

/// A server with topic `bad-t` holding one event, and group `bad-g` on it.
fn with_one_event() -> Server {
    let s = Server::start(small_limits());
    s.subscribe("bad-g", &json!({ "topic": "bad-t", "ackTimeoutMs": 60000 }));
    published(
        &s.publish_structured("bad-t", &event("good-0", "t", json!(0))),
        1,
    );
    s
}

/// The total of the end offsets of `bad-t`: what the log holds.
fn stored(s: &Server) -> u64 {
    s.offsets("bad-t")
        .iter()
        .filter(|((g, _), _)| g == "bad-g")
        .filter_map(|(_, r)| r["end"].as_u64())
        .sum()
}

fn publish(s: &Server) -> Call {
    s.call("POST", "/v1/topics/bad-t/events")
}

fn binary(s: &Server, headers: &[(&str, &str)], body: &str) -> Resp {
    let mut c = publish(s);
    for (k, v) in headers {
        c = c.header(k, v);
    }
    c.body(body.as_bytes().to_vec()).send()
}

fn structured(s: &Server, body: &str) -> Resp {
    publish(s)
        .header("content-type", "application/cloudevents+json")
        .body(body.as_bytes().to_vec())
        .send()
}

fn batch(s: &Server, body: &str) -> Resp {
    publish(s)
        .header("content-type", "application/cloudevents-batch+json")
        .body(body.as_bytes().to_vec())
        .send()
}

/// `ce-*` headers of a binary-mode publish.
type Headers = Vec<(&'static str, &'static str)>;

const SPEC: (&str, &str) = ("ce-specversion", "1.0");
const ID: (&str, &str) = ("ce-id", "x1");
const SOURCE: (&str, &str) = ("ce-source", "/s");
const TYPE: (&str, &str) = ("ce-type", "t");

#[test]
fn malformed_cloudevents_are_refused_naming_the_attribute_and_store_nothing() {
    let s = with_one_event();
    let before = stored(&s);
    assert_eq!(before, 1);

    // Binary mode: each required attribute missing, then bad values.
    let cases: Vec<(Headers, &[&str])> = vec![
        (vec![SOURCE, TYPE, SPEC], &["ce-id", "missing"]),
        (vec![ID, TYPE, SPEC], &["ce-source", "missing"]),
        (vec![ID, SOURCE, SPEC], &["ce-type", "missing"]),
        (vec![ID, SOURCE, TYPE], &["ce-specversion", "missing"]),
        (
            vec![ID, SOURCE, TYPE, ("ce-specversion", "0.3")],
            &["ce-specversion", "1.0", "0.3"],
        ),
        (
            vec![SPEC, ID, SOURCE, TYPE, ("ce-time", "yesterday")],
            &["ce-time", "RFC 3339"],
        ),
        (
            vec![SPEC, ID, SOURCE, TYPE, ("ce-dataschema", "not a uri")],
            &["ce-dataschema", "URI"],
        ),
        (
            vec![SPEC, ID, SOURCE, TYPE, ("ce-bad_ext", "1")],
            &["ce-bad_ext", "extension name"],
        ),
        (
            vec![SPEC, ID, SOURCE, TYPE, ("ce-emmqoffset", "5")],
            &["ce-emmqoffset", "reserved"],
        ),
        (vec![SPEC, ("ce-id", ""), SOURCE, TYPE], &["ce-id"]),
    ];
    for (headers, words) in &cases {
        binary(&s, headers, "payload").expect_error_naming(400, "invalid-cloudevent", words);
    }
    // JSON data that is not JSON.
    binary(
        &s,
        &[SPEC, ID, SOURCE, TYPE, ("content-type", "application/json")],
        "{bad",
    )
    .expect_error_naming(400, "invalid-cloudevent", &["JSON"]);

    // Structured mode.
    let full = json!({ "specversion": "1.0", "id": "x1", "source": "/s", "type": "t" });
    for attr in ["specversion", "id", "source", "type"] {
        let mut e = full.clone();
        if let Some(o) = e.as_object_mut() {
            o.remove(attr);
        }
        structured(&s, &e.to_string()).expect_error_naming(
            400,
            "invalid-cloudevent",
            &[&format!("'{attr}'"), "missing"],
        );
    }
    let bad_values: Vec<(Value, &[&str])> = vec![
        (json!({"id": ""}), &["'id'", "empty"]),
        (json!({"source": ""}), &["'source'", "empty"]),
        (json!({"type": 5}), &["'type'", "string"]),
        (json!({"specversion": "0.3"}), &["specversion"]),
        (json!({"time": "yesterday"}), &["'time'"]),
        (json!({"Bad_Name": 1}), &["'Bad_Name'", "extension name"]),
        (
            json!({"emmqpartition": "1"}),
            &["'emmqpartition'", "reserved"],
        ),
        (
            json!({"data": 1, "data_base64": "AA=="}),
            &["'data'", "'data_base64'"],
        ),
        (json!({"data_base64": "!!!"}), &["'data_base64'", "base64"]),
    ];
    for (patch, words) in &bad_values {
        let mut e = full.clone();
        if let (Some(o), Some(p)) = (e.as_object_mut(), patch.as_object()) {
            for (k, v) in p {
                o.insert(k.clone(), v.clone());
            }
        }
        structured(&s, &e.to_string()).expect_error_naming(400, "invalid-cloudevent", words);
    }
    // Not JSON, not an object, trailing garbage, duplicate members, not UTF-8.
    for (body, words) in [
        (
            r#"{"specversion":"1.0","id":"1","source":"/s","type":"#,
            &["JSON"][..],
        ),
        ("[1]", &["object"][..]),
        (
            r#"{"specversion":"1.0","id":"1","source":"/s","type":"t"} trailing"#,
            &["trailing"][..],
        ),
        (
            r#"{"specversion":"1.0","id":"1","source":"/s","type":"t","id":"2"}"#,
            &["\"id\"", "more than once"][..],
        ),
        ("", &["JSON"][..]),
    ] {
        structured(&s, body).expect_error_naming(400, "invalid-cloudevent", words);
    }
    publish(&s)
        .header("content-type", "application/cloudevents+json")
        .body(vec![0xff, 0xfe, b'{'])
        .send()
        .expect_error(400, "invalid-cloudevent");

    // Batch mode: all or nothing, and the bad event is named by its index.
    let good = |i: u32| event(&format!("b{i}"), "t", json!(i));
    let mut no_source = good(1);
    if let Some(o) = no_source.as_object_mut() {
        o.remove("source");
    }
    let mixed = Value::Array(vec![good(0), no_source, good(2)]);
    batch(&s, &mixed.to_string()).expect_error_naming(
        400,
        "invalid-cloudevent",
        &["event 1", "'source'", "missing"],
    );
    batch(&s, &Value::Array(vec![good(0), json!(5)]).to_string()).expect_error_naming(
        400,
        "invalid-cloudevent",
        &["event 1"],
    );
    batch(&s, "{}").expect_error_naming(400, "invalid-cloudevent", &["array"]);
    batch(&s, r#"[{"specversion":"1.0""#).expect_error(400, "invalid-cloudevent");

    // Nothing of any of that was stored, and the group sees only the good event.
    assert_eq!(stored(&s), before, "a refused publish stored something");
    let d = s.poll("bad-g", "c", 100, 500);
    assert_eq!(
        d.iter()
            .map(|x| x.event_id().to_owned())
            .collect::<Vec<_>>(),
        vec!["good-0".to_owned()]
    );
}

#[test]
fn wrong_content_types_are_415() {
    let s = with_one_event();
    let before = stored(&s);
    for ct in [
        "application/cloudevents+xml",
        "application/cloudevents+json; charset=latin1",
        "application/cloudevents-batch+json; charset=iso-8859-1",
    ] {
        publish(&s)
            .header("content-type", ct)
            .body(b"{}".to_vec())
            .send()
            .expect_error(415, "unsupported-media-type");
    }
    assert_eq!(stored(&s), before);

    let group_doc = json!({ "topic": "bad-t" }).to_string();
    for (method, path, admin) in [
        ("PUT", "/v1/subscriptions/ct-g", false),
        ("POST", "/v1/subscriptions/bad-g/ack", false),
        ("POST", "/v1/subscriptions/bad-g/nack", false),
        ("POST", "/v1/subscriptions/bad-g/extend", false),
        ("POST", "/admin/subscriptions/bad-g/seek", true),
        ("PUT", "/admin/ratelimit", true),
    ] {
        for ct in ["text/plain", "application/x-www-form-urlencoded"] {
            let call = if admin {
                s.admin(method, path)
            } else {
                s.call(method, path)
            };
            call.header("content-type", ct)
                .body(group_doc.clone())
                .send()
                .expect_error_naming(415, "unsupported-media-type", &[ct]);
        }
    }
    s.call("PUT", "/v1/subscriptions/ct-g")
        .header("content-type", "application/json; charset=latin1")
        .body(group_doc)
        .send()
        .expect_error_naming(415, "unsupported-media-type", &["latin1"]);
    s.get("/v1/subscriptions/ct-g")
        .expect_error(404, "unknown-group");
}

#[test]
fn oversized_bodies_are_413_and_store_nothing() {
    let s = with_one_event();
    let before = stored(&s);
    let big_event = event("big", "t", json!("x".repeat(20_000)));
    structured(&s, &big_event.to_string()).expect_error_naming(413, "too-large", &["16384"]);
    binary(&s, &[SPEC, ID, SOURCE, TYPE], &"y".repeat(20_000)).expect_error_naming(
        413,
        "too-large",
        &["16384"],
    );
    let eleven: Vec<Value> = (0..11)
        .map(|i| event(&format!("m{i}"), "t", json!(i)))
        .collect();
    batch(&s, &Value::Array(eleven).to_string()).expect_error_naming(413, "too-large", &["10"]);
    // Over the request limit: refused by its declared length, or counted while read.
    let huge = "z".repeat(100_000);
    binary(&s, &[SPEC, ID, SOURCE, TYPE], &huge).expect_error_naming(413, "too-large", &["65536"]);
    let mut chunked = publish(&s);
    for (k, v) in [SPEC, ID, SOURCE, TYPE] {
        chunked = chunked.header(k, v);
    }
    chunked
        .chunked_body(huge.clone().into_bytes())
        .send()
        .expect_error_naming(413, "too-large", &["65536"]);
    assert_eq!(stored(&s), before, "an oversized publish stored something");

    // JSON bodies of the other routes.
    let doc = json!({ "topic": "bad-t", "filter": { "type": "x".repeat(5_000) } });
    s.call("PUT", "/v1/subscriptions/huge-g")
        .json(&doc)
        .send()
        .expect_error_naming(413, "too-large", &["4096"]);
    s.get("/v1/subscriptions/huge-g")
        .expect_error(404, "unknown-group");
    let d = s.poll_n("bad-g", "c", 1, std::time::Duration::from_secs(30));
    let too_many = vec![d[0].id.as_str(); 21];
    s.call("POST", "/v1/subscriptions/bad-g/ack")
        .json(&json!({ "deliveryIds": too_many }))
        .send()
        .expect_error_naming(413, "too-large", &["deliveryIds", "21", "20"]);
    // The refused ACK changed nothing: the delivery is still in flight.
    assert_eq!(group_stat(&s, "bad-g", "acked"), 0);
    s.ack("bad-g", &[&d[0].id]).all_ok(1);
}

#[test]
fn bad_subscription_documents_name_the_field_and_change_nothing() {
    let s = with_one_event();
    let put = |group: &str, body: &str| {
        s.call("PUT", &format!("/v1/subscriptions/{group}"))
            .header("content-type", "application/json")
            .body(body.as_bytes().to_vec())
            .send()
    };
    let cases: Vec<(&str, &str, &str, &[&str])> = vec![
        (
            r#"{"topic":"t","colour":"red"}"#,
            "invalid-subscription",
            "unknown field",
            &["colour"],
        ),
        (
            r#"{"topic":"t","filter":{"tpye":"x"}}"#,
            "invalid-subscription",
            "",
            &["filter.tpye"],
        ),
        (
            r#"{"topic":"t","backoff":{"initialMs":1,"maxMs":2,"mult":2}}"#,
            "invalid-subscription",
            "",
            &["backoff.mult"],
        ),
        (
            r#"{"push":{"url":"http://x","secret":1},"topic":"t"}"#,
            "invalid-subscription",
            "",
            &["push.secret"],
        ),
        (
            r#"{"topc":"t"}"#,
            "invalid-subscription",
            "",
            &["topic", "required"],
        ),
        (
            r#"{"topic":"t","ackTimeoutMs":0}"#,
            "invalid-subscription",
            "",
            &["ackTimeoutMs"],
        ),
        (
            r#"{"topic":"t","ackTimeoutMs":"soon"}"#,
            "invalid-subscription",
            "",
            &["ackTimeoutMs"],
        ),
        (
            r#"{"topic":"t","maxAttempts":0}"#,
            "invalid-subscription",
            "",
            &["maxAttempts"],
        ),
        (
            r#"{"topic":"t","maxInFlightPerClient":0}"#,
            "invalid-subscription",
            "",
            &["maxInFlightPerClient"],
        ),
        (
            r#"{"topic":"t","backoff":{"initialMs":10,"maxMs":5}}"#,
            "invalid-subscription",
            "",
            &["backoff.initialMs"],
        ),
        (
            r#"{"topic":"t","backoff":{"multiplier":0.5}}"#,
            "invalid-subscription",
            "",
            &["backoff.multiplier"],
        ),
        (
            r#"{"topic":"t","ordering":"random"}"#,
            "invalid-subscription",
            "",
            &["ordering", "random"],
        ),
        (
            r#"{"topic":"t","startFrom":"middle"}"#,
            "invalid-subscription",
            "",
            &["startFrom"],
        ),
        (
            r#"{"topic":"bad topic"}"#,
            "invalid-subscription",
            "",
            &["topic"],
        ),
        (r#"[]"#, "invalid-subscription", "", &["object"]),
        (r#"{"topic":"t""#, "invalid-json", "", &["JSON"]),
        ("", "invalid-json", "", &["JSON"]),
    ];
    for (body, code, extra, words) in &cases {
        let m = put("new-g", body).expect_error_naming(400, code, words);
        assert!(m.contains(extra), "{body}: {m}");
    }
    s.get("/v1/subscriptions/new-g")
        .expect_error(404, "unknown-group");

    // An existing group: topic and ordering cannot change (409), a bad field changes nothing.
    put("bad-g", r#"{"topic":"other-t","ackTimeoutMs":1234}"#).expect_error_naming(
        409,
        "conflict",
        &["bad-t"],
    );
    s.admin_get("/admin/offsets?topic=other-t")
        .expect_error(404, "unknown-topic");
    put("bad-g", r#"{"topic":"bad-t","ordering":"key"}"#).expect_error_naming(
        409,
        "conflict",
        &["ordering"],
    );
    put(
        "bad-g",
        r#"{"topic":"bad-t","ackTimeoutMs":1234,"maxAttempts":0}"#,
    )
    .expect_error(400, "invalid-subscription");
    let g = s.get("/v1/subscriptions/bad-g").ok_json(200);
    assert_eq!(g["topic"], "bad-t", "{g}");
    assert_eq!(
        g["ackTimeoutMs"], 60000,
        "a refused PUT changed the group: {g}"
    );
    assert_eq!(g["ordering"], "none", "{g}");

    // Bad group names.
    put("bad%20name", r#"{"topic":"t"}"#).expect_error_naming(400, "invalid-name", &["group"]);
    put("g%3Ax", r#"{"topic":"t"}"#).expect_error_naming(400, "invalid-name", &["group"]);
    put(&"a".repeat(201), r#"{"topic":"t"}"#).expect_error_naming(400, "invalid-name", &["200"]);
    let subs = s.admin_get("/admin/subscriptions").ok_json(200);
    let names: Vec<&str> = subs["subscriptions"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x["group"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        names,
        vec!["bad-g"],
        "only the one good group exists: {subs}"
    );
}

#[test]
fn the_topic_limit_refuses_subscriptions_and_publishes_with_400_and_creates_nothing() {
    let s = Server::start(Options::new().toml("[storage]\nmax_topics = 1\n"));
    s.subscribe("one-g", &json!({ "topic": "one-t" }));
    s.call("PUT", "/v1/subscriptions/two-g")
        .json(&json!({ "topic": "two-t" }))
        .send()
        .expect_error_naming(400, "invalid-request", &["topic limit"]);
    s.publish_structured("two-t", &event("e", "t", json!(1)))
        .expect_error_naming(400, "invalid-request", &["topic limit"]);
    s.get("/v1/subscriptions/two-g")
        .expect_error(404, "unknown-group");
    s.admin_get("/admin/offsets?topic=two-t")
        .expect_error(404, "unknown-topic");
    // The existing topic still works.
    published(
        &s.publish_structured("one-t", &event("e", "t", json!(1))),
        1,
    );
}

#[test]
fn unknown_groups_and_topics_are_404() {
    let s = with_one_event();
    let id = "1.1.0.0.1";
    let cases: Vec<(Resp, &str)> = vec![
        (s.get("/v1/subscriptions/nosuch"), "unknown-group"),
        (
            s.call("DELETE", "/v1/subscriptions/nosuch").send(),
            "unknown-group",
        ),
        (s.poll_raw("nosuch", "c", 1, 0), "unknown-group"),
        (
            s.call("POST", "/v1/subscriptions/nosuch/ack")
                .json(&json!({ "deliveryIds": [id] }))
                .send(),
            "unknown-group",
        ),
        (
            s.call("POST", "/v1/subscriptions/nosuch/nack")
                .json(&json!({ "deliveryIds": [id] }))
                .send(),
            "unknown-group",
        ),
        (
            s.call("POST", "/v1/subscriptions/nosuch/extend")
                .json(&json!({ "deliveryIds": [id] }))
                .send(),
            "unknown-group",
        ),
        (s.admin_get("/admin/dlq/nosuch"), "unknown-group"),
        (
            s.admin("POST", "/admin/dlq/nosuch/replay").send(),
            "unknown-group",
        ),
        (
            s.admin("POST", "/admin/subscriptions/nosuch/seek")
                .json(&json!({ "partition": 0, "offset": 0 }))
                .send(),
            "unknown-group",
        ),
        (s.admin_get("/admin/offsets?topic=nosuch"), "unknown-topic"),
    ];
    for (r, code) in cases {
        r.expect_error_naming(404, code, &["nosuch"]);
    }
    // A deleted group is gone for good.
    s.subscribe("gone-g", &json!({ "topic": "bad-t" }));
    let del = s
        .call("DELETE", "/v1/subscriptions/gone-g")
        .send()
        .ok_json(200);
    assert_eq!(del["deleted"], true, "{del}");
    s.get("/v1/subscriptions/gone-g")
        .expect_error(404, "unknown-group");
    s.poll_raw("gone-g", "c", 1, 0)
        .expect_error(404, "unknown-group");
}

/// `GET /v1/subscriptions/{group}` → `stats.{name}`.
fn group_stat(s: &Server, group: &str, name: &str) -> u64 {
    let v = s.get(&format!("/v1/subscriptions/{group}")).ok_json(200);
    v["stats"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("no stats.{name}: {v}"))
}

#[test]
fn bad_delivery_ids_are_refused_per_id_and_good_ones_still_count() {
    let s = with_one_event();
    let d = s.poll_n("bad-g", "c", 1, std::time::Duration::from_secs(30));
    let good = d[0].id.clone();
    let long = "9".repeat(300);
    let body = json!({ "deliveryIds": [
        "nope", "1.2.3", "01.2.3.4.5", "-1.2.3.4.5", "1.2.3.4.5.6", "", " 1.2.3.4.5",
        long, 42, null, {"id": 1}, "99.1.0.0.1", good,
    ]});
    let r = s
        .call("POST", "/v1/subscriptions/bad-g/ack")
        .json(&body)
        .send();
    let v = r.ok_json(200);
    assert_eq!(v["acked"], 1, "the good id counts: {v}");
    let rejected = v["rejected"].as_array().cloned().unwrap_or_default();
    let reasons: Vec<(String, String)> = rejected
        .iter()
        .map(|x| {
            (
                x["deliveryId"].as_str().unwrap_or("?").to_owned(),
                x["reason"].as_str().unwrap_or("?").to_owned(),
            )
        })
        .collect();
    let malformed = |id: &str| (id.to_owned(), "malformed".to_owned());
    let expected = vec![
        malformed("nope"),
        malformed("1.2.3"),
        malformed("01.2.3.4.5"),
        malformed("-1.2.3.4.5"),
        malformed("1.2.3.4.5.6"),
        malformed(""),
        malformed(" 1.2.3.4.5"),
        // Echoes are bounded: a long id comes back cut short.
        (
            reasons.get(7).map(|r| r.0.clone()).unwrap_or_default(),
            "malformed".to_owned(),
        ),
        malformed("42"),
        malformed("null"),
        malformed(r#"{"id":1}"#),
        // Well formed, but from an epoch that has not happened.
        ("99.1.0.0.1".to_owned(), "unknown".to_owned()),
    ];
    assert_eq!(reasons, expected, "per-id answers in request order: {v}");
    assert!(
        reasons[7].0.len() < 300 && "9".repeat(300).starts_with(&reasons[7].0),
        "long id echo: {}",
        reasons[7].0
    );
    // The good id was ACKed; the same id again is already done.
    assert_eq!(group_stat(&s, "bad-g", "acked"), 1);
    let again = s.ack("bad-g", &[&good]);
    assert_eq!(
        again.rejected,
        vec![(good.clone(), "already-done".to_owned())]
    );
}

#[test]
fn bad_settle_requests_are_refused_whole_and_leave_the_delivery_in_flight() {
    let s = with_one_event();
    let d = s.poll_n("bad-g", "c", 1, std::time::Duration::from_secs(30));
    let id = d[0].id.as_str();
    let post = |verb: &str, body: &str| {
        s.call("POST", &format!("/v1/subscriptions/bad-g/{verb}"))
            .header("content-type", "application/json")
            .body(body.as_bytes().to_vec())
            .send()
    };
    let cases: Vec<(&str, String, u16, &str, Vec<&str>)> = vec![
        (
            "ack",
            format!(r#"{{"ids":["{id}"]}}"#),
            400,
            "invalid-json",
            vec!["ids"],
        ),
        (
            "ack",
            format!(r#"{{"deliveryIds":"{id}"}}"#),
            400,
            "invalid-json",
            vec!["sequence"],
        ),
        (
            "ack",
            format!(r#"{{"deliveryIds":["{id}"],"x":1}}"#),
            400,
            "invalid-json",
            vec!["`x`"],
        ),
        (
            "ack",
            format!(r#"{{"deliveryIds":["{id}"]"#),
            400,
            "invalid-json",
            vec![],
        ),
        ("ack", String::new(), 400, "invalid-json", vec!["empty"]),
        (
            "ack",
            "{}".to_owned(),
            400,
            "invalid-json",
            vec!["deliveryIds"],
        ),
        (
            "nack",
            format!(r#"{{"deliveryIds":["{id}"],"delayMs":-5}}"#),
            400,
            "invalid-json",
            vec!["-5"],
        ),
        (
            "nack",
            format!(r#"{{"deliveryIds":["{id}"],"delayMs":999999999999}}"#),
            400,
            "invalid-request",
            vec!["delayMs"],
        ),
        (
            "extend",
            format!(r#"{{"deliveryIds":["{id}"],"extendMs":0}}"#),
            400,
            "invalid-request",
            vec!["extendMs"],
        ),
        (
            "extend",
            format!(r#"{{"deliveryIds":["{id}"],"extendMs":"long"}}"#),
            400,
            "invalid-json",
            vec![],
        ),
    ];
    for (verb, body, status, code, words) in &cases {
        post(verb, body).expect_error_naming(*status, code, words);
    }
    for stat in ["acked", "nacked"] {
        assert_eq!(
            group_stat(&s, "bad-g", stat),
            0,
            "a refused request counted as {stat}"
        );
    }
    // Still in flight: not redelivered, and the real ACK works.
    let none = s.poll("bad-g", "c2", 10, 300);
    assert!(none.is_empty(), "{none:?}");
    s.ack("bad-g", &[id]).all_ok(1);
}

#[test]
fn bad_query_parameters_and_names_are_400() {
    let s = with_one_event();
    let q: Vec<(&str, &str, &[&str])> = vec![
        (
            "/v1/subscriptions/bad-g/events",
            "invalid-query",
            &["client", "required"],
        ),
        (
            "/v1/subscriptions/bad-g/events?client=c&max=0",
            "invalid-query",
            &["max", "1000"],
        ),
        (
            "/v1/subscriptions/bad-g/events?client=c&max=abc",
            "invalid-query",
            &["max", "abc"],
        ),
        (
            "/v1/subscriptions/bad-g/events?client=c&max=100000",
            "invalid-query",
            &["max"],
        ),
        (
            "/v1/subscriptions/bad-g/events?client=c&waitMs=-1",
            "invalid-query",
            &["waitMs"],
        ),
        (
            "/v1/subscriptions/bad-g/events?client=c&waitMs=999999999",
            "invalid-query",
            &["waitMs"],
        ),
        (
            "/v1/subscriptions/bad-g/events?client=c&client=d",
            "invalid-query",
            &["client", "more than once"],
        ),
        (
            "/v1/subscriptions/bad-g/events?client=c&foo=1",
            "invalid-query",
            &["foo"],
        ),
        (
            "/v1/subscriptions/bad-g/events?client=bad%20c",
            "invalid-name",
            &["client"],
        ),
        (
            "/v1/subscriptions/bad-g/events?client=",
            "invalid-name",
            &["client"],
        ),
        ("/v1/subscriptions/bad-g?x=1", "invalid-query", &["x"]),
        ("/v1/subscriptions/bad%20g", "invalid-name", &["group"]),
    ];
    for (path, code, words) in &q {
        s.get(path).expect_error_naming(400, code, words);
    }
    let admin: Vec<(&str, &str, &[&str])> = vec![
        ("/admin/offsets", "invalid-query", &["topic", "required"]),
        ("/admin/offsets?topic=bad%20t", "invalid-name", &["topic"]),
        ("/admin/dlq/bad-g?max=0", "invalid-query", &["max"]),
        ("/admin/dlq/bad-g?max=x", "invalid-query", &["max"]),
        ("/admin/dlq/bad-g?page=2", "invalid-query", &["page"]),
        ("/admin/dlq/bad%20g", "invalid-name", &["group"]),
        ("/admin/health?verbose=1", "invalid-query", &["verbose"]),
    ];
    for (path, code, words) in &admin {
        s.admin_get(path).expect_error_naming(400, code, words);
    }
    s.call("POST", "/v1/topics/bad%20t/events")
        .header("content-type", "application/cloudevents+json")
        .body(event("1", "t", json!(1)).to_string())
        .send()
        .expect_error_naming(400, "invalid-name", &["topic"]);
    s.call("POST", "/v1/topics/bad-t/events?x=1")
        .header("content-type", "application/cloudevents+json")
        .body(event("1", "t", json!(1)).to_string())
        .send()
        .expect_error_naming(400, "invalid-query", &["x"]);
    // Seek: bad bodies and a partition the group does not have.
    let seek = |body: &str| {
        s.admin("POST", "/admin/subscriptions/bad-g/seek")
            .header("content-type", "application/json")
            .body(body.as_bytes().to_vec())
            .send()
    };
    seek(r#"{"partition":0}"#).expect_error_naming(400, "invalid-json", &["offset"]);
    seek(r#"{"partition":0,"offset":-1}"#).expect_error(400, "invalid-json");
    seek(r#"{"partition":0,"offset":0,"x":1}"#).expect_error_naming(400, "invalid-json", &["x"]);
    seek(r#"{"partition":99,"offset":0}"#).expect_error_naming(400, "invalid-request", &["99"]);
    // Seek by time: exactly one of offset and time, an RFC 3339 string.
    seek(r#"{"partition":0,"offset":0,"time":"2024-01-01T00:00:00Z"}"#).expect_error_naming(
        400,
        "invalid-json",
        &["offset", "time"],
    );
    seek(r#"{"partition":0,"time":"2024-01-01 00:00"}"#).expect_error_naming(
        400,
        "invalid-request",
        &["time", "RFC 3339"],
    );
    seek(r#"{"partition":0,"time":1704067200}"#).expect_error_naming(
        400,
        "invalid-json",
        &["time"],
    );
    seek(r#"{"partition":99,"time":"2024-01-01T00:00:00Z"}"#).expect_error_naming(
        400,
        "invalid-request",
        &["99"],
    );
    assert_eq!(stored(&s), 1);
}

#[test]
fn unknown_routes_and_methods() {
    let s = with_one_event();
    for path in [
        "/",
        "/nope",
        "/v1",
        "/v1/subscriptions/bad-g/",
        "/v1//subscriptions/bad-g",
        "/v2/topics/t/events",
    ] {
        s.get(path).expect_error_naming(404, "not-found", &[path]);
    }
    // Admin routes are not on the traffic listener, nor traffic routes on the admin one.
    s.get("/metrics").expect_error(404, "not-found");
    s.get("/admin/health").expect_error(404, "not-found");
    s.admin_get("/v1/subscriptions/bad-g")
        .expect_error(404, "not-found");
    let cases: Vec<(Resp, &str)> = vec![
        (s.get("/v1/topics/bad-t/events"), "POST"),
        (
            s.call("POST", "/v1/subscriptions/bad-g").send(),
            "PUT, GET, DELETE",
        ),
        (
            s.call("PATCH", "/v1/subscriptions/bad-g").send(),
            "PUT, GET, DELETE",
        ),
        (
            s.call("DELETE", "/v1/subscriptions/bad-g/events").send(),
            "GET",
        ),
        (s.get("/v1/subscriptions/bad-g/ack"), "POST"),
        (s.admin("DELETE", "/admin/health").send(), "GET"),
        (s.admin("GET", "/admin/dlq/bad-g/replay").send(), "POST"),
        (s.admin("DELETE", "/admin/ratelimit").send(), "GET, PUT"),
    ];
    for (r, allow) in cases {
        r.expect_error(405, "method-not-allowed");
        assert_eq!(r.header("allow"), Some(allow), "{}", r.what);
    }
    // The group survived the POST/PATCH/DELETE attempts.
    s.get("/v1/subscriptions/bad-g").expect(200);
}
