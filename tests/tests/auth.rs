//! Who may do what (issue 19), against the real binary with real clients: static bearer
//! tokens with rights by exact name and prefix on publish, poll, SSE, WebSocket, ACK,
//! subscription definition, DLQ replay and seek; 401 (with `WWW-Authenticate`) and 403 in
//! the API's error shape, each checked for "nothing changed", logged without the secret and
//! counted; the token as a query parameter on the stream routes only; one group's delivery
//! id never settles another group's delivery; and `serve` refusing a non-loopback address
//! without `[auth]` unless `--insecure`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use unimesh_tests::sse::SseStream;
use unimesh_tests::{
    event, json, metric, published, Call, Options, Resp, Server, Value, READY_TIMEOUT,
};

/// The tokens (the configuration holds only their SHA-256, computed with `sha256sum`).
const SHOP: &str = "tok-shop-3f9a";
const OPS: &str = "tok-ops-81c2";
const READER: &str = "tok-reader-77d0";

const AUTH: &str = r#"
[mesh]
flush_interval_ms = 20
[auth.identities.shop]
token_sha256 = "982d1fa5fe370406f7d81a5f5f4e2a56a99e6b06772bc53ffea5d8da78162dbe"
publish = ["orders.*"]
[auth.identities.ops]
token_sha256 = "7fc44aa971a6befb28f983c4b2b45afc7722a9920d5f78b1325b5acd6c99f19e"
define = ["*"]
admin = true
[auth.identities.reader]
token_sha256 = "86d7760619c8d534ec0358997707fc564ec1d10dfc5f6f3acbc520cd4b3cc8c4"
consume = ["billing"]
"#;

fn with_token(call: Call, token: &str) -> Call {
    call.header("authorization", &format!("Bearer {token}"))
}

fn publish(s: &Server, topic: &str, token: Option<&str>, id: &str) -> Resp {
    let call = s
        .call("POST", &format!("/v1/topics/{topic}/events"))
        .header("content-type", "application/cloudevents+json")
        .body(event(id, "t", json!({"id": id})).to_string());
    match token {
        Some(t) => with_token(call, t).send(),
        None => call.send(),
    }
}

/// A 401: status, `WWW-Authenticate: Bearer …`, error body.
fn unauthorized(r: &Resp) -> String {
    let challenge = r.header("www-authenticate").unwrap_or("");
    assert!(challenge.starts_with("Bearer"), "{}: {challenge:?}", r.what);
    r.expect_error(401, "unauthorized")
}

/// The offsets of a topic's partitions and groups, through the admin listener (as ops);
/// `null` when there is no such topic (nothing was ever published to it). Without
/// `durableWatermark`: the mesh's own flush moves it at any time (an ACK answered before
/// becoming durable), which is no change a refused request made.
fn ends(s: &Server, topic: &str) -> Value {
    let r = with_token(
        s.admin("GET", &format!("/admin/offsets?topic={topic}")),
        OPS,
    )
    .send();
    if r.status == 404 {
        r.expect_error(404, "unknown-topic");
        return Value::Null;
    }
    let mut offsets = r.ok_json(200)["offsets"].clone();
    if let Some(rows) = offsets.as_array_mut() {
        for row in rows.iter_mut().filter_map(Value::as_object_mut) {
            row.remove("durableWatermark");
        }
    }
    offsets
}

/// Goal: every route of both listeners needs its right, exact names and prefixes match as
/// configured, and a refused request changes nothing. Method: three identities, each
/// trying what it may and what it may not, through ureq, the SSE reader and tungstenite;
/// after each refusal the state it would have changed is read back.
#[test]
fn tokens_and_rights_gate_every_route() {
    let s = Server::start(Options::new().toml(AUTH));

    // Publish: missing, malformed and unknown credentials are 401; a right by prefix.
    let msg = unauthorized(&publish(&s, "orders.eu", None, "e0"));
    assert!(msg.contains("Bearer"), "{msg}");
    let basic = s
        .call("POST", "/v1/topics/orders.eu/events")
        .header("authorization", "Basic c2hvcDpzaG9w")
        .header("content-type", "application/cloudevents+json")
        .body(event("e0", "t", json!({})).to_string())
        .send();
    unauthorized(&basic);
    let bad = publish(&s, "orders.eu", Some("tok-guessed"), "e0");
    unauthorized(&bad);
    assert!(bad
        .header("www-authenticate")
        .unwrap_or("")
        .contains("invalid_token"));
    assert_eq!(ends(&s, "orders.eu"), Value::Null, "nothing was published");
    published(&publish(&s, "orders.eu", Some(SHOP), "e1"), 1);
    published(&publish(&s, "orders.us.west", Some(SHOP), "e2"), 1);
    let r = publish(&s, "orders", Some(SHOP), "e3");
    r.expect_error_naming(403, "forbidden", &["shop", "publish", "orders"]);
    let r = publish(&s, "audit", Some(SHOP), "e4");
    r.expect_error_naming(403, "forbidden", &["shop", "publish", "audit"]);
    assert_eq!(
        r.header("www-authenticate"),
        Some(r#"Bearer realm="unimesh", error="insufficient_scope""#)
    );
    assert_eq!(ends(&s, "audit"), Value::Null, "nothing was published");
    // A consumer may not publish, even to its group's topic.
    publish(&s, "orders.eu", Some(READER), "e5").expect_error(403, "forbidden");

    // Define: only with the define right; nothing is created otherwise.
    let doc = json!({"topic": "orders.eu", "ackTimeoutMs": 600_000});
    for token in [SHOP, READER] {
        with_token(s.call("PUT", "/v1/subscriptions/billing"), token)
            .json(&doc)
            .send()
            .expect_error_naming(403, "forbidden", &["define", "billing"]);
    }
    with_token(s.call("GET", "/v1/subscriptions/billing"), OPS)
        .send()
        .expect_error(404, "unknown-group");
    with_token(s.call("PUT", "/v1/subscriptions/billing"), OPS)
        .json(&doc)
        .send()
        .expect(201);
    with_token(s.call("PUT", "/v1/subscriptions/other"), OPS)
        .json(&doc)
        .send()
        .expect(201);
    // GET of a subscription: consume or define.
    with_token(s.call("GET", "/v1/subscriptions/billing"), READER)
        .send()
        .expect(200);
    with_token(s.call("GET", "/v1/subscriptions/other"), READER)
        .send()
        .expect_error_naming(403, "forbidden", &["consume or define", "other"]);

    // Consume: poll, ACK; not another group; the token only in the header on a poll.
    let poll = "/v1/subscriptions/billing/events?client=r1&max=10&waitMs=5000";
    unauthorized(&s.call("GET", poll).send());
    unauthorized(
        &s.call(
            "GET",
            &format!("/v1/subscriptions/billing/events?client=r1&access_token={READER}"),
        )
        .send(),
    );
    let got = with_token(s.call("GET", poll), READER).send().ok_json(200);
    let ids: Vec<String> = got
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|d| d["deliveryId"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(ids.len(), 1, "{got}");
    with_token(
        s.call("GET", "/v1/subscriptions/other/events?client=r1&waitMs=0"),
        READER,
    )
    .send()
    .expect_error_naming(403, "forbidden", &["reader", "consume", "other"]);
    let ack = json!({"deliveryIds": ids});
    for token in [SHOP, OPS] {
        with_token(s.call("POST", "/v1/subscriptions/billing/ack"), token)
            .json(&ack)
            .send()
            .expect_error_naming(403, "forbidden", &["consume", "billing"]);
    }
    let billing = with_token(s.call("GET", "/v1/subscriptions/billing"), OPS)
        .send()
        .ok_json(200);
    assert_eq!(billing["stats"]["acked"], 0, "nothing was ACKed: {billing}");
    let answer = with_token(s.call("POST", "/v1/subscriptions/billing/ack"), READER)
        .json(&ack)
        .send()
        .ok_json(200);
    assert_eq!(answer["acked"], 1, "{answer}");

    // SSE and WebSocket take the token as access_token (EventSource and WebSocket in a
    // browser cannot send headers); without one they are refused before a session opens.
    unauthorized(
        &s.call("GET", "/v1/subscriptions/billing/stream?client=sse1")
            .send(),
    );
    let sse = SseStream::open(
        s.http_addr(),
        &format!("/v1/subscriptions/billing/stream?client=sse1&access_token={READER}"),
        None,
    );
    assert_eq!(sse.status, 200, "{}", sse.body);
    drop(sse);
    let other = SseStream::open(
        s.http_addr(),
        &format!("/v1/subscriptions/other/stream?client=sse1&access_token={READER}"),
        None,
    );
    assert_eq!(other.status, 403, "{}", other.body);
    assert!(other.body.contains("forbidden"), "{}", other.body);
    let ws = format!(
        "ws://{}/v1/subscriptions/billing/ws?client=ws1&access_token={READER}",
        s.http_addr()
    );
    let (mut socket, resp) = tungstenite::connect(ws).expect("a WebSocket with a query token");
    assert_eq!(resp.status().as_u16(), 101);
    let _ = socket.close(None);
    let ws = format!(
        "ws://{}/v1/subscriptions/other/ws?client=ws1&access_token={READER}",
        s.http_addr()
    );
    match tungstenite::connect(ws) {
        Err(tungstenite::Error::Http(r)) => assert_eq!(r.status().as_u16(), 403),
        other => panic!(
            "a WebSocket on another group: {:?}",
            other.map(|(_, r)| r.status())
        ),
    }

    // Admin: the admin right; health, readiness and metrics stay open by default.
    unauthorized(&s.admin("GET", "/admin/subscriptions").send());
    with_token(s.admin("GET", "/admin/subscriptions"), READER)
        .send()
        .expect_error_naming(403, "forbidden", &["reader", "admin"]);
    with_token(s.admin("POST", "/admin/dlq/billing/replay"), READER)
        .send()
        .expect_error_naming(403, "forbidden", &["admin"]);
    let before = ends(&s, "orders.eu");
    with_token(s.admin("POST", "/admin/subscriptions/billing/seek"), SHOP)
        .json(&json!({"partition": 0, "offset": 0}))
        .send()
        .expect_error(403, "forbidden");
    assert_eq!(
        ends(&s, "orders.eu"),
        before,
        "the refused seek changed nothing"
    );
    let after = with_token(s.call("GET", "/v1/subscriptions/billing"), OPS)
        .send()
        .ok_json(200);
    assert_eq!(after["stats"]["acked"], 1, "{after}");
    s.admin("GET", "/admin/health").send().expect(200);
    s.admin("GET", "/admin/ready").send().expect(200);
    let metrics = s.admin("GET", "/metrics").send().expect(200).text();
    for reason in ["missing", "invalid", "forbidden"] {
        let n = metric(
            &metrics,
            "unimesh_auth_refused_total",
            &format!("reason=\"{reason}\""),
        )
        .unwrap_or(0.0);
        assert!(n >= 1.0, "reason {reason}: {n}\n{metrics}");
    }
    // Every refusal is logged with the identity, never with a token.
    let log = s.stderr();
    assert!(log.contains("request refused"), "{log}");
    assert!(
        log.contains("identity=reader") || log.contains("identity=\"reader\""),
        "{log}"
    );
    for token in [SHOP, OPS, READER, "tok-guessed"] {
        assert!(!log.contains(token), "the log shows a token: {log}");
    }
}

/// Goal: with `auth.open_health = false`, health and metrics need the admin right too.
#[test]
fn closed_health_needs_the_admin_right() {
    let s = Server::start(
        Options::new()
            .toml(&format!(
                "[auth]\nopen_health = false\n{}",
                AUTH.replace("[mesh]\nflush_interval_ms = 20\n", "")
            ))
            .ready_token(OPS),
    );
    unauthorized(&s.admin("GET", "/admin/health").send());
    unauthorized(&s.admin("GET", "/metrics").send());
    with_token(s.admin("GET", "/metrics"), READER)
        .send()
        .expect_error(403, "forbidden");
    with_token(s.admin("GET", "/admin/health"), OPS)
        .send()
        .expect(200);
}

/// Goal: a delivery id of group A sent to group B's `/ack` settles nothing of B (the core
/// refuses it as `unknown`: leases are unique across groups), B's own delivery stays in
/// flight until B ACKs it, and A's id still settles in A. Without auth (the rule holds for
/// every caller), then with auth: an identity with rights on A only cannot reach B's
/// `/ack` at all.
#[test]
fn a_delivery_id_of_one_group_settles_nothing_of_another() {
    let s = Server::start(Options::new().toml("[mesh]\nflush_interval_ms = 20\n"));
    for g in ["ga", "gb"] {
        s.subscribe(g, &json!({"topic": "t", "ackTimeoutMs": 600_000}));
    }
    published(&s.publish_structured("t", &event("x", "t", json!({}))), 1);
    let a = s.poll_n("ga", "c", 1, Duration::from_secs(60));
    let b = s.poll_n("gb", "c", 1, Duration::from_secs(60));
    let (id_a, id_b) = (a[0].id.clone(), b[0].id.clone());
    let wrong = s.ack("gb", &[&id_a]);
    assert_eq!(wrong.accepted, 0, "{wrong:?}");
    assert_eq!(wrong.rejected.len(), 1, "{wrong:?}");
    assert_eq!(wrong.rejected[0].1, "unknown", "{wrong:?}");
    let gb = s.get("/v1/subscriptions/gb").ok_json(200);
    assert_eq!(
        (gb["stats"]["acked"].clone(), gb["inFlight"].clone()),
        (json!(0), json!(1)),
        "{gb}"
    );
    assert_eq!(s.ack("gb", &[&id_b]).accepted, 1);
    assert_eq!(s.ack("ga", &[&id_a]).accepted, 1);

    let s = Server::start(Options::new().toml(
        r#"
[auth.identities.a]
token_sha256 = "acb924f724ef6db29d0af40e4cbadbe4c4017452ee3682f2ce1c4a97eac150d2"
consume = ["ga"]
"#,
    ));
    with_token(
        s.call("POST", "/v1/subscriptions/gb/ack"),
        "tok-a-only-19be",
    )
    .json(&json!({"deliveryIds": ["1.1.0.0.1"]}))
    .send()
    .expect_error_naming(403, "forbidden", &["consume", "gb"]);
}

// ----- fail closed -----

/// Runs `unimesh serve` on the given traffic address and a loopback admin port; `Ok` once
/// it is ready (then it is killed), `Err(stderr)` if it exits first.
fn serve_on(http: &str, extra: &[&str], config: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().expect("tempdir");
    let conf = dir.path().join("unimesh.toml");
    std::fs::write(&conf, config).expect("write config");
    let admin = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let mut cmd = Command::new(unimesh_tests::unimesh_bin());
    cmd.args([
        "serve",
        "--http",
        http,
        "--admin",
        &admin.to_string(),
        "--data",
    ])
    .arg(dir.path().join("data"))
    .arg("--config")
    .arg(&conf)
    .args(extra)
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    for (k, _) in std::env::vars() {
        if k.starts_with("UNIMESH_") {
            cmd.env_remove(k);
        }
    }
    let mut child = cmd.spawn().expect("the binary runs");
    let agent = unimesh_tests::agent();
    let started = Instant::now();
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            let out = child.wait_with_output().expect("its output");
            assert!(
                !dir.path().join("data").exists(),
                "a refused start created the data directory"
            );
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        let url = format!("http://{admin}/admin/ready");
        if Call::new(&agent, "GET", url)
            .try_send()
            .is_ok_and(|r| r.status == 200)
        {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(());
        }
        assert!(started.elapsed() < READY_TIMEOUT, "not ready in time");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Goal: without `[auth]`, `serve` refuses a non-loopback address with one line naming
/// the address and the fix, and creates nothing; `--insecure` (or `server.insecure`)
/// serves it; with identities it is served.
#[test]
fn serve_refuses_a_non_loopback_address_without_auth() {
    let err = serve_on("0.0.0.0:0", &[], "").expect_err("refused");
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("refusing to serve"))
        .collect();
    assert_eq!(lines.len(), 1, "{err}");
    for word in ["0.0.0.0:0", "[auth]", "--insecure", "server.insecure"] {
        assert!(lines[0].contains(word), "{word}: {}", lines[0]);
    }
    serve_on("0.0.0.0:0", &["--insecure"], "").expect("served with --insecure");
    serve_on("0.0.0.0:0", &[], "[server]\ninsecure = true\n").expect("served with the key");
    let auth = AUTH.replace("[mesh]\nflush_interval_ms = 20\n", "");
    serve_on("0.0.0.0:0", &[], &auth).expect("served with identities");
    serve_on("127.0.0.1:0", &[], "").expect("loopback needs nothing");
}
