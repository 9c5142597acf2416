//! Delivery streams against the real binary over real sockets: Server-Sent Events and
//! WebSocket, their shared session rules (a reconnect gets what was not ACKed again, at
//! once), and the stream bound that keeps publishers served while streams are idle.

use std::net::TcpStream;
use std::time::Duration;

use tungstenite::{Message, WebSocket};
use unimesh_tests::sse::SseStream;
use unimesh_tests::{event, json, published, Options, Server, Value};

/// A group whose deliveries would wait an hour for their ACK timeout: anything delivered
/// again within a test came again because of a session rule.
fn patient(s: &Server, group: &str, topic: &str) {
    s.subscribe(
        group,
        &json!({"topic": topic, "ackTimeoutMs": 3_600_000,
                "backoff": {"initialMs": 0, "maxMs": 0, "multiplier": 1.0}}),
    );
}

fn publish(s: &Server, topic: &str, ids: &[&str]) {
    let events: Vec<Value> = ids
        .iter()
        .map(|id| event(id, "t", json!({"id": id})))
        .collect();
    published(&s.publish_batch(topic, &events), ids.len());
}

/// Reads `n` SSE events: (delivery id from `id:`, the delivery JSON).
fn read_sse(stream: &mut SseStream, n: usize) -> Vec<(String, Value)> {
    (0..n)
        .map(|_| {
            let e = stream
                .next_event()
                .expect("an event before the stream ends");
            let d: Value = serde_json::from_str(&e.data).expect("data is JSON");
            let id = e.id.expect("every delivery has an id");
            assert_eq!(d["deliveryId"], id, "id: is the delivery id");
            (id, d)
        })
        .collect()
}

/// Goal: SSE delivers with `id:` and `data:`; a client that drops and reconnects with
/// `Last-Event-ID` loses nothing: what it had not ACKed comes again at once (attempt 2).
#[test]
fn sse_delivers_and_a_reconnect_gets_everything_not_acked() {
    let s = Server::start(Options::new().toml("[mesh]\nflush_interval_ms = 20\n"));
    patient(&s, "g", "t");
    let path = "/v1/subscriptions/g/stream?client=reader";
    let mut first = SseStream::open(s.http_addr(), path, None);
    assert_eq!(first.status, 200, "{}{}", first.head, first.body);
    assert!(first.head.contains("text/event-stream"), "{}", first.head);
    publish(&s, "t", &["a", "b", "c"]);
    let got = read_sse(&mut first, 3);
    let mut events: Vec<String> = got
        .iter()
        .map(|(_, d)| d["event"]["id"].to_string())
        .collect();
    events.sort();
    assert_eq!(events, vec!["\"a\"", "\"b\"", "\"c\""]);
    // ACK one, then drop mid-stream.
    s.ack("g", &[got[0].0.as_str()]).all_ok(1);
    let last = got[2].0.clone();
    drop(first);
    let mut again = SseStream::open(s.http_addr(), path, Some(&last));
    assert_eq!(again.status, 200);
    let redelivered = read_sse(&mut again, 2);
    let mut ids: Vec<String> = redelivered
        .iter()
        .map(|(_, d)| d["event"]["id"].to_string())
        .collect();
    ids.sort();
    let mut expected: Vec<String> = got[1..]
        .iter()
        .map(|(_, d)| d["event"]["id"].to_string())
        .collect();
    expected.sort();
    assert_eq!(ids, expected, "nothing lost, the ACKed one not repeated");
    assert!(redelivered.iter().all(|(_, d)| d["attempt"] == 2));
    let ids: Vec<&str> = redelivered.iter().map(|(id, _)| id.as_str()).collect();
    s.ack("g", &ids).all_ok(2);
}

/// Goal: the stream bound is apart from the connection slots: with both connection slots
/// of the listener taken by idle streams, a publisher is still served; one stream more is
/// refused with 503.
#[test]
fn a_publisher_is_served_while_the_stream_bound_is_full() {
    let s = Server::start(Options::new().toml("[server]\nmax_connections = 2\nmax_streams = 2\n"));
    patient(&s, "g", "t");
    let a = SseStream::open(s.http_addr(), "/v1/subscriptions/g/stream?client=a", None);
    let b = SseStream::open(s.http_addr(), "/v1/subscriptions/g/stream?client=b", None);
    assert_eq!((a.status, b.status), (200, 200));
    // Both connections are streams now; publishing still gets a connection slot.
    publish(&s, "t", &["x"]);
    let c = SseStream::open(s.http_addr(), "/v1/subscriptions/g/stream?client=c", None);
    assert_eq!(c.status, 503, "{}{}", c.head, c.body);
    let body: Value = serde_json::from_str(&c.body).expect("JSON error");
    assert_eq!(body["error"], "unavailable");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains("max_streams")),
        "{body}"
    );
    drop(c);
    drop(a);
    // A freed stream slot is taken again (bounded retries: the server notices the close).
    let mut ok = false;
    for _ in 0..100 {
        let d = SseStream::open(s.http_addr(), "/v1/subscriptions/g/stream?client=d", None);
        if d.status == 200 {
            ok = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(ok, "a stream slot came back when a stream closed");
    drop(b);
}

fn ws_connect(
    s: &Server,
    client: &str,
) -> WebSocket<tungstenite::stream::MaybeTlsStream<TcpStream>> {
    let url = format!(
        "ws://{}/v1/subscriptions/g/ws?client={client}",
        s.http_addr()
    );
    let (ws, _) = tungstenite::connect(url).expect("WebSocket handshake");
    ws
}

/// The next text frame as JSON (pings are skipped).
fn ws_next(ws: &mut WebSocket<tungstenite::stream::MaybeTlsStream<TcpStream>>) -> Option<Value> {
    loop {
        match ws.read() {
            Ok(Message::Text(t)) => return Some(serde_json::from_str(&t).expect("JSON frame")),
            Ok(Message::Close(frame)) => {
                return Some(json!({"closed": frame.map(|f| u16::from(f.code))}))
            }
            Ok(_) => continue,
            Err(_) => return None,
        }
    }
}

/// Goal: WebSocket delivers frames and settles by frames, answering per id like the HTTP
/// routes; a NACKed delivery comes again; garbage frames get error frames and then 1008.
#[test]
fn websocket_delivers_nacks_acks_and_refuses_garbage() {
    let s = Server::start(Options::new().toml("[mesh]\nflush_interval_ms = 20\n"));
    patient(&s, "g", "t");
    let mut ws = ws_connect(&s, "w");
    publish(&s, "t", &["a", "b"]);
    let d1 = ws_next(&mut ws).expect("a delivery");
    let d2 = ws_next(&mut ws).expect("a delivery");
    let (id1, id2) = (d1["deliveryId"].clone(), d2["deliveryId"].clone());
    ws.send(Message::Text(
        json!({"nack": [id1], "delayMs": 0}).to_string().into(),
    ))
    .expect("send");
    let answer = ws_next(&mut ws).expect("an answer");
    assert_eq!(answer["result"], "nack", "{answer}");
    assert_eq!(
        (answer["nacked"].clone(), answer["rejected"].clone()),
        (json!(1), json!([]))
    );
    let again = ws_next(&mut ws).expect("the NACKed delivery again");
    assert_eq!(again["event"]["id"], d1["event"]["id"]);
    assert_eq!(again["attempt"], 2);
    ws.send(Message::Text(
        json!({"ack": [again["deliveryId"], id2, "nope"]})
            .to_string()
            .into(),
    ))
    .expect("send");
    let answer = ws_next(&mut ws).expect("an answer");
    assert_eq!(answer["result"], "ack");
    assert_eq!(answer["acked"], 2, "{answer}");
    assert_eq!(
        answer["rejected"],
        json!([{"deliveryId": "nope", "reason": "malformed"}])
    );
    for garbage in ["{", "[1,2]", "{\"ack\": [], \"nack\": []}"] {
        ws.send(Message::Text(garbage.into())).expect("send");
        let e = ws_next(&mut ws).expect("an error frame");
        assert_eq!(e["error"], "invalid-frame", "{garbage}: {e}");
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    let closed = ws_next(&mut ws).expect("a close frame");
    assert_eq!(closed, json!({"closed": 1008}));
    let info = s.get("/v1/subscriptions/g").ok_json(200);
    assert_eq!(info["stats"]["acked"], 2, "{info}");
}

/// Goal: a WebSocket is closed with 1001 when the mesh stops.
#[test]
fn websocket_closes_1001_on_shutdown() {
    let mut s = Server::start_default();
    patient(&s, "g", "t");
    let mut ws = ws_connect(&s, "w");
    let status = s.terminate();
    assert!(status.success(), "{status}");
    let mut code = None;
    while let Some(frame) = ws_next(&mut ws) {
        if let Some(c) = frame.get("closed") {
            code = c.as_u64();
            break;
        }
    }
    assert_eq!(code, Some(1001));
}
