//! Traces against the real binary: the CloudEvents distributed-tracing extension
//! (`traceparent`, `tracestate`) kept from publish to every delivery and push, a malformed
//! `traceparent` refused, and the OTLP exporter's spans received by a collector in this
//! test (an HTTP server on a loopback port) that decodes them with the protocol's own
//! definitions (`opentelemetry-proto`'s prost messages).

use std::collections::BTreeMap;
use std::net::TcpStream;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use tungstenite::{Message, WebSocket};
use unimesh_tests::hook::Hook;
use unimesh_tests::kafka::Broker;
use unimesh_tests::sse::SseStream;
use unimesh_tests::{event, json, published, wait_for, Options, Server, Value};

const WAIT: Duration = Duration::from_secs(60);

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT_ID: &str = "00f067aa0ba902b7";
const STATE: &str = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7";

fn traceparent() -> String {
    format!("00-{TRACE_ID}-{PARENT_ID}-01")
}

/// Loopback receivers for pushes, and quick flushes.
fn options() -> Options {
    Options::new().toml(
        "[mesh]\nflush_interval_ms = 20\n[push]\nscan_interval_ms = 50\nallowed_hosts = \"127.0.0.1\"\n",
    )
}

fn traced_event(id: &str) -> Value {
    let mut e = event(id, "t", json!({"n": 1}));
    e["traceparent"] = json!(traceparent());
    e["tracestate"] = json!(STATE);
    e
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// One exported span, as the test reads it.
#[derive(Clone, Debug)]
struct Got {
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    attributes: BTreeMap<String, String>,
    service: String,
}

/// Every span the collector has received so far (each request decoded as an OTLP
/// `ExportTraceServiceRequest`; one that does not decode fails the test).
fn spans(collector: &Hook) -> Vec<Got> {
    let mut out = Vec::new();
    for r in collector.requests() {
        assert_eq!(r.path, "/v1/traces", "OTLP/HTTP posts spans to /v1/traces");
        assert_eq!(
            r.header("content-type"),
            Some("application/x-protobuf"),
            "OTLP over HTTP/protobuf"
        );
        let req = ExportTraceServiceRequest::decode(r.body.as_slice())
            .unwrap_or_else(|e| panic!("not an OTLP trace export: {e}"));
        for rs in req.resource_spans {
            let service = rs
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| text(kv.value.as_ref()?.value.as_ref()?))
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for s in ss.spans {
                    out.push(got(s, &service));
                }
            }
        }
    }
    out
}

fn got(s: Span, service: &str) -> Got {
    Got {
        name: s.name,
        trace_id: hex(&s.trace_id),
        span_id: hex(&s.span_id),
        parent_span_id: hex(&s.parent_span_id),
        attributes: s
            .attributes
            .into_iter()
            .filter_map(|kv| Some((kv.key, text(kv.value?.value.as_ref()?)?)))
            .collect(),
        service: service.to_owned(),
    }
}

fn text(v: &Any) -> Option<String> {
    match v {
        Any::StringValue(s) => Some(s.clone()),
        Any::IntValue(i) => Some(i.to_string()),
        Any::BoolValue(b) => Some(b.to_string()),
        Any::DoubleValue(d) => Some(d.to_string()),
        _ => None,
    }
}

/// The span named `name` in the event's trace, once the collector has it.
fn span_named(collector: &Hook, name: &str, extra: &[(&str, &str)]) -> Got {
    wait_for(&format!("an exported {name} span {extra:?}"), WAIT, || {
        spans(collector).into_iter().find(|s| {
            s.name == name
                && s.trace_id == TRACE_ID
                && extra
                    .iter()
                    .all(|(k, v)| s.attributes.get(*k).map(String::as_str) == Some(*v))
        })
    })
}

fn assert_attrs(span: &Got, want: &[(&str, &str)]) {
    for (k, v) in want {
        assert_eq!(
            span.attributes.get(*k).map(String::as_str),
            Some(*v),
            "{} span attribute {k}: {:?}",
            span.name,
            span.attributes
        );
    }
}

/// Goal: with `[otel] endpoint` set, the publish → long-poll → ACK of one event carrying a
/// `traceparent` is one trace at the collector: `publish` and `deliver` are children of the
/// publisher's span (the `traceparent`'s parent id), the `ack` a child of the `deliver`, each
/// with its topic, group, partition and offset; the `fetch` (the long-poll) and the HTTP
/// `request` spans are exported too; a push of the same event carries the push span's own
/// context as its `traceparent` header. Method: a collector in this test decodes the
/// OTLP/HTTP protobuf requests with `opentelemetry-proto`. Without the exporter no span
/// arrives and every wait here times out.
#[test]
fn publish_poll_and_ack_of_one_event_are_one_exported_trace() {
    let collector = Hook::ok();
    let hook = Hook::ok();
    let s = Server::start(
        options()
            .toml(&format!(
                "[otel]\nendpoint = \"{}\"\nservice_name = \"mesh-under-test\"\n",
                collector.url("")
            ))
            // The batch processor's delay (the SDK's standard variable): spans within 100 ms.
            .env("OTEL_BSP_SCHEDULE_DELAY", "100"),
    );
    s.subscribe("g", &json!({"topic": "orders", "ackTimeoutMs": 60_000}));
    s.subscribe(
        "hooked",
        &json!({"topic": "orders", "push": {"url": hook.url("/in")}, "ackTimeoutMs": 60_000}),
    );
    let at = published(&s.publish_structured("orders", &traced_event("e-1")), 1)[0].clone();
    let (partition, offset) = (at.partition.to_string(), at.offset.to_string());
    let d = s.poll_n("g", "c", 1, WAIT).remove(0);
    assert_eq!(
        d.event["traceparent"],
        json!(traceparent()),
        "delivery keeps it"
    );
    s.ack("g", &[d.id.as_str()]).all_ok(1);

    let publish = span_named(&collector, "publish", &[]);
    assert_eq!(
        publish.parent_span_id, PARENT_ID,
        "publish: child of the publisher"
    );
    assert_eq!(publish.service, "mesh-under-test");
    assert_attrs(
        &publish,
        &[
            ("topic", "orders"),
            ("id", "e-1"),
            ("partition", &partition),
            ("offset", &offset),
        ],
    );
    let deliver = span_named(&collector, "deliver", &[("group", "g")]);
    assert_eq!(
        deliver.parent_span_id, PARENT_ID,
        "deliver: child of the publisher"
    );
    assert_attrs(
        &deliver,
        &[
            ("topic", "orders"),
            ("partition", &partition),
            ("offset", &offset),
            ("attempt", "1"),
            ("via", "poll"),
        ],
    );
    let ack = span_named(&collector, "ack", &[("group", "g")]);
    assert_eq!(
        ack.parent_span_id, deliver.span_id,
        "ack: child of its delivery"
    );
    assert_attrs(
        &ack,
        &[
            ("partition", &partition),
            ("offset", &offset),
            ("outcome", "accepted"),
        ],
    );

    // The push of the same event: its span in the event's trace, and its own context on
    // the wire.
    let push = span_named(&collector, "push", &[("group", "hooked")]);
    assert_eq!(
        push.parent_span_id, PARENT_ID,
        "push: child of the publisher"
    );
    assert_attrs(
        &push,
        &[
            ("partition", &partition),
            ("offset", &offset),
            ("outcome", "ack"),
        ],
    );
    let pushed = hook.requests().remove(0);
    assert_eq!(
        pushed.header("traceparent"),
        Some(format!("00-{TRACE_ID}-{}-01", push.span_id).as_str()),
        "the push's traceparent header names the push span"
    );
    assert_eq!(pushed.header("tracestate"), Some(STATE));
    assert_eq!(
        pushed.header("ce-traceparent"),
        Some(traceparent().as_str()),
        "the extension itself is as published"
    );

    // The long-poll and the HTTP requests have their spans too (their own traces).
    let all = wait_for("the fetch and request spans", WAIT, || {
        let all = spans(&collector);
        let fetch = all.iter().any(|s| {
            s.name == "fetch" && s.attributes.get("group").map(String::as_str) == Some("g")
        });
        let request = all.iter().any(|s| {
            s.name == "request"
                && s.attributes.get("route").map(String::as_str)
                    == Some("/v1/subscriptions/{group}/ack")
                && s.attributes.get("group").map(String::as_str) == Some("g")
                && s.attributes.get("status").map(String::as_str) == Some("200")
        });
        (fetch && request).then_some(all)
    });
    assert!(
        all.iter().all(|s| s.service == "mesh-under-test"),
        "every span names the service"
    );
}

/// Goal: without an exporter the extension still travels: a long-poll, an SSE stream and a
/// WebSocket deliver `traceparent` and `tracestate` as published (structured), and a push
/// in binary mode carries them as `ce-traceparent`/`ce-tracestate` and as the W3C
/// `traceparent`/`tracestate` headers; a batch push keeps them in each event. Method: one
/// event published in binary mode, read back on every path.
#[test]
fn every_delivery_and_push_keeps_the_trace_context() {
    let hook = Hook::ok();
    let batch_hook = Hook::ok();
    let s = Server::start(options());
    let patient = json!({"topic": "t", "ackTimeoutMs": 60_000});
    for g in ["polled", "sse", "ws"] {
        s.subscribe(g, &patient);
    }
    s.subscribe(
        "pushed",
        &json!({"topic": "t", "push": {"url": hook.url("/in")}, "ackTimeoutMs": 60_000}),
    );
    s.subscribe(
        "batched",
        &json!({"topic": "t", "push": {"url": batch_hook.url("/in"), "batch": 10},
                "ackTimeoutMs": 60_000}),
    );
    let mut sse = SseStream::open(s.http_addr(), "/v1/subscriptions/sse/stream?client=r", None);
    assert_eq!(sse.status, 200, "{}{}", sse.head, sse.body);
    let (mut ws, _) = tungstenite::connect(format!(
        "ws://{}/v1/subscriptions/ws/ws?client=w",
        s.http_addr()
    ))
    .expect("WebSocket handshake");
    let binary = json!({"specversion": "1.0", "id": "b-1", "source": "/tests", "type": "t",
                        "datacontenttype": "application/json",
                        "traceparent": traceparent(), "tracestate": STATE});
    published(&s.publish_binary("t", &binary, b"{\"n\":1}"), 1);

    let keeps = |what: &str, e: &Value| {
        assert_eq!(e["traceparent"], json!(traceparent()), "{what}: {e}");
        assert_eq!(e["tracestate"], json!(STATE), "{what}: {e}");
    };
    keeps("long-poll", &s.poll_n("polled", "c", 1, WAIT)[0].event);
    let sse_event = sse.next_event().expect("an SSE delivery");
    let sse_delivery: Value = serde_json::from_str(&sse_event.data).expect("SSE data is JSON");
    keeps("SSE", &sse_delivery["event"]);
    keeps("WebSocket", &ws_delivery(&mut ws)["event"]);

    let pushed = wait_for("the push", WAIT, || hook.requests().into_iter().next());
    for (header, want) in [
        ("traceparent", traceparent()),
        ("ce-traceparent", traceparent()),
        ("tracestate", STATE.to_owned()),
        ("ce-tracestate", STATE.to_owned()),
    ] {
        assert_eq!(
            pushed.header(header),
            Some(want.as_str()),
            "push header {header}"
        );
    }
    let batch = wait_for("the batch push", WAIT, || {
        batch_hook.requests().into_iter().next()
    });
    let events: Value = serde_json::from_slice(&batch.body).expect("a JSON batch");
    keeps("batch push", &events[0]);
}

fn ws_delivery(ws: &mut WebSocket<tungstenite::stream::MaybeTlsStream<TcpStream>>) -> Value {
    loop {
        match ws.read().expect("a WebSocket frame") {
            Message::Text(t) => return serde_json::from_str(&t).expect("JSON frame"),
            Message::Close(f) => panic!("the WebSocket closed: {f:?}"),
            _ => continue,
        }
    }
}

/// Goal: a `traceparent` that is not W3C trace context is refused at publish with a 400
/// naming it (in structured and binary mode) and nothing is appended; a non-string one too.
#[test]
fn a_malformed_traceparent_is_refused_naming_it() {
    let s = Server::start(options());
    s.subscribe("g", &json!({"topic": "t"}));
    let mut e = event("bad-1", "t", json!({}));
    e["traceparent"] = json!("00-abc-01");
    let why = s.publish_structured("t", &e).expect_error_naming(
        400,
        "invalid-cloudevent",
        &["traceparent", "W3C"],
    );
    assert!(why.contains("55 characters"), "{why}");
    e["traceparent"] = json!(7);
    s.publish_structured("t", &e).expect_error_naming(
        400,
        "invalid-cloudevent",
        &["traceparent", "string"],
    );
    let binary = json!({"specversion": "1.0", "id": "bad-2", "source": "/tests", "type": "t",
        "datacontenttype": "application/json",
        "traceparent": format!("00-{}-{PARENT_ID}-01", "0".repeat(32))});
    s.publish_binary("t", &binary, b"{}").expect_error_naming(
        400,
        "invalid-cloudevent",
        &["ce-traceparent", "all zeros"],
    );
    assert!(
        s.poll("g", "c", 10, 300).is_empty(),
        "nothing refused was appended"
    );
}

/// Goal: on Kafka, each rebalance's span carries the group, the topic and the partitions
/// it moved, so every line logged inside it says which consumer and which partitions it is
/// about. Method: a mesh on Kafka (tansu, or librdkafka's mock cluster with
/// `UNIMESH_TEST_BROKER=mock`) exporting over OTLP to the collector of this test; a
/// subscription starts a consumer, whose first assignment is a `rebalance` span, exported
/// when the callback returns, as a child of the consumer thread's `kafka_consumer` span
/// (group, topic), which holds every line the thread logs and is exported when the server
/// stops.
#[test]
fn kafka_rebalance_spans_carry_group_topic_and_partitions() {
    let broker = Broker::start();
    let collector = Hook::ok();
    let mut s = Server::start(
        broker
            .server_options("traced", 2)
            .toml(&format!(
                "[otel]\nendpoint = \"{}\"\nservice_name = \"mesh-under-test\"\n",
                collector.url("")
            ))
            .env("OTEL_BSP_SCHEDULE_DELAY", "100"),
    );
    let at = published(
        &s.publish_structured("orders", &event("k-1", "t", json!({"n": 1}))),
        1,
    )
    .remove(0);
    s.subscribe("g", &json!({"topic": "orders", "ackTimeoutMs": 60_000}));
    let d = s.poll_n("g", "c", 1, WAIT).remove(0);
    s.ack("g", &[d.id.as_str()]).all_ok(1);

    let rebalance = wait_for("an exported rebalance span of group g", WAIT, || {
        spans(&collector).into_iter().find(|s| {
            s.name == "rebalance" && s.attributes.get("group").map(String::as_str) == Some("g")
        })
    });
    assert_attrs(&rebalance, &[("topic", "orders")]);
    assert_eq!(rebalance.service, "mesh-under-test");
    let moved = rebalance.attributes.get("partitions").unwrap_or_else(|| {
        panic!(
            "rebalance span without partitions: {:?}",
            rebalance.attributes
        )
    });
    let partitions: Vec<u32> = moved
        .trim_matches(['[', ']'])
        .split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| p.trim().parse().unwrap_or_else(|e| panic!("{moved}: {e}")))
        .collect();
    // The only member is assigned every partition of the topic (two on tansu; the mock
    // cluster gives it more), the event's among them.
    assert!(
        partitions.len() >= 2 && partitions.contains(&at.partition),
        "assigned {partitions:?}, the event is on {}",
        at.partition
    );
    // The consumer thread's span holds every line it logs: the rebalance is its child, and
    // the span is exported when the thread ends (the server's shutdown leaves the group).
    s.terminate();
    let consumer = wait_for("the exported kafka_consumer span of group g", WAIT, || {
        spans(&collector).into_iter().find(|s| {
            s.name == "kafka_consumer" && s.attributes.get("group").map(String::as_str) == Some("g")
        })
    });
    assert_attrs(&consumer, &[("topic", "orders")]);
    assert_eq!(
        rebalance.parent_span_id, consumer.span_id,
        "the rebalance is a child of the consumer thread's span"
    );
    let log = s.stderr();
    assert!(
        log.contains("kafka_consumer{group=g topic=orders}:rebalance{"),
        "the consumer thread's lines carry its span:\n{log}"
    );
}
