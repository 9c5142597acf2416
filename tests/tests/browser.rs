//! Browsers (issue 19), for real: a page served from its own origin runs in Debian's headless
//! Chromium, driven by playwright-core (`tests/browser/consume.mjs`), and consumes a group
//! by `EventSource` and by `WebSocket` with its token in the `access_token` query parameter,
//! ACKing what it gets (SSE through a CORS `fetch` with `Authorization`, WebSocket by ack
//! frames). From an origin in `server.cors_allowed_origins` every event is delivered and
//! ACKed; from another origin, or with a bad token, the page gets nothing and the mesh
//! leased it nothing (no client attached, nothing in flight), so a later page gets all.
//!
//! Needs `node`, `tests/browser/node_modules` and `/usr/bin/chromium` (or
//! `UNIMESH_CHROMIUM`), all installed by `tests/prepare.sh`.

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::Command;

use unimesh_tests::{event, json, package_dir, published, Call, Options, Server, Value};

const OPS: &str = "tok-ops-browser-41d7";
const PAGE: &str = "tok-page-5b1e";

const AUTH: &str = r#"
[auth.identities.ops]
token_sha256 = "3876b7890e43db11296f225d004a75fe3d55b4ad1d971e1f0ac87ba6a713c8ef"
publish = ["*"]
define = ["*"]
admin = true
[auth.identities.page]
token_sha256 = "7f32a5ca494e8a8e4ccf4f6fa04402669b0ce9a2d0be9da08f060375fe73790f"
consume = ["web.*"]
"#;

const EVENTS: usize = 20;

fn free_port() -> u16 {
    match TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()) {
        Ok(a) => a.port(),
        Err(e) => panic!("cannot find a free port: {e}"),
    }
}

fn browser_dir() -> PathBuf {
    package_dir().join("browser")
}

/// A server whose traffic listener answers CORS for `allowed` only.
fn server(allowed: &str) -> Server {
    Server::start(
        Options::new()
            .toml(&format!(
                "[server]\ncors_allowed_origins = \"{allowed}\"\n[mesh]\nflush_interval_ms = 20\n"
            ))
            .toml(AUTH)
            .ready_token(OPS),
    )
}

fn as_ops(call: Call) -> Call {
    call.header("authorization", &format!("Bearer {OPS}"))
}

/// Defines `group` on a topic of its own, named as the group (an ACK timeout far beyond the test, so a delivery leased
/// to a page that never saw it would not come back in time) and publishes `EVENTS` events;
/// their ids.
fn define_and_publish(s: &Server, group: &str) -> BTreeSet<String> {
    let doc = json!({"topic": group, "startFrom": "earliest", "ackTimeoutMs": 600000});
    let r = as_ops(s.call("PUT", &format!("/v1/subscriptions/{group}")))
        .json(&doc)
        .send();
    assert!(
        r.status == 200 || r.status == 201,
        "{} {}",
        r.status,
        r.text()
    );
    let events: Vec<Value> = (0..EVENTS)
        .map(|i| event(&format!("{group}-{i}"), "t", json!({"i": i})))
        .collect();
    let r = as_ops(s.call("POST", &format!("/v1/topics/{group}/events")))
        .header("content-type", "application/cloudevents-batch+json")
        .body(Value::Array(events.clone()).to_string())
        .send();
    published(&r, EVENTS);
    events
        .iter()
        .filter_map(|e| e["id"].as_str().map(str::to_owned))
        .collect()
}

/// What the page got.
struct PageRun {
    opened: bool,
    received: Vec<String>,
    acked: u64,
    errors: Vec<String>,
    raw: Value,
}

/// Opens a page at `page_url` that consumes `group` of `s` by `mode` ("sse" or "ws") until
/// it has ACKed `EVENTS` or `timeout_ms` passed.
fn run_page(
    s: &Server,
    page_url: &str,
    group: &str,
    token: &str,
    mode: &str,
    timeout_ms: u64,
) -> PageRun {
    let dir = browser_dir();
    assert!(
        dir.join("node_modules/playwright-core").is_dir(),
        "{} has no node_modules/playwright-core: run tests/prepare.sh",
        dir.display()
    );
    let args = json!({
        "pageUrl": page_url,
        "base": s.http_url(""),
        "group": group,
        "token": token,
        "count": EVENTS,
        "mode": mode,
        "timeoutMs": timeout_ms,
    });
    let out = match Command::new("node")
        .arg(dir.join("consume.mjs"))
        .arg(args.to_string())
        .current_dir(&dir)
        .output()
    {
        Ok(o) => o,
        Err(e) => panic!("cannot run node (tests/prepare.sh installs what this test needs): {e}"),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "consume.mjs failed ({}): {stdout}\n{stderr}",
        out.status
    );
    let raw: Value = match serde_json::from_str(stdout.trim()) {
        Ok(v) => v,
        Err(e) => panic!("consume.mjs printed no JSON ({e}): {stdout}\n{stderr}"),
    };
    let strings = |key: &str| -> Vec<String> {
        raw[key]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|v| v.as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    PageRun {
        opened: raw["opened"].as_bool().unwrap_or(false),
        received: strings("received"),
        acked: raw["acked"].as_u64().unwrap_or(0),
        errors: strings("errors"),
        raw: raw.clone(),
    }
}

/// The group's rows in `/admin/offsets` (its topic is named as it): (lag, in flight)
/// summed over partitions.
fn lag_and_in_flight(s: &Server, group: &str) -> (u64, u64) {
    let r = as_ops(s.admin("GET", &format!("/admin/offsets?topic={group}"))).send();
    let offsets = r.ok_json(200)["offsets"].clone();
    let rows: Vec<&Value> = offsets
        .as_array()
        .map(|a| a.iter().filter(|o| o["group"] == group).collect())
        .unwrap_or_default();
    assert!(!rows.is_empty(), "no offsets of {group}: {offsets}");
    rows.iter().fold((0, 0), |(lag, fl), o| {
        (
            lag + o["lag"].as_u64().unwrap_or(0),
            fl + o["inFlight"].as_u64().unwrap_or(0),
        )
    })
}

fn assert_all_delivered(run: &PageRun, ids: &BTreeSet<String>, what: &str) {
    let got: BTreeSet<String> = run.received.iter().cloned().collect();
    assert_eq!(
        &got, ids,
        "{what}: the page did not get every event: {}",
        run.raw
    );
    assert_eq!(run.acked, EVENTS as u64, "{what}: ACKs: {}", run.raw);
    assert!(run.opened, "{what}: {}", run.raw);
}

fn assert_leased_nothing(s: &Server, run: &PageRun, group: &str, what: &str) {
    assert!(!run.opened, "{what}: the page opened a stream: {}", run.raw);
    assert!(
        run.received.is_empty(),
        "{what}: the page got events: {}",
        run.raw
    );
    assert!(
        !run.errors.is_empty(),
        "{what}: the page saw no error: {}",
        run.raw
    );
    let clients = as_ops(s.admin("GET", "/admin/clients")).send().ok_json(200);
    let attached = clients["clients"]
        .as_array()
        .is_some_and(|a| a.iter().any(|c| c["group"] == group));
    assert!(
        !attached,
        "{what}: the refused page left a client: {clients}"
    );
    assert_eq!(
        lag_and_in_flight(s, group),
        (EVENTS as u64, 0),
        "{what}: the refused page was leased deliveries"
    );
}

/// Goal: a page on an allowed origin consumes a group by EventSource and by WebSocket with
/// its token in the query, and every event is delivered and ACKed (lag 0, nothing in
/// flight after). Method: 20 events per group, one group per transport, a page from
/// `http://localhost:P` against the mesh at `127.0.0.1` (another origin, listed).
#[test]
fn a_page_on_an_allowed_origin_consumes_by_event_source_and_websocket() {
    let port = free_port();
    let origin = format!("http://localhost:{port}");
    let s = server(&origin);
    for mode in ["sse", "ws"] {
        let group = format!("web.{mode}");
        let ids = define_and_publish(&s, &group);
        let run = run_page(&s, &format!("{origin}/"), &group, PAGE, mode, 60_000);
        assert_all_delivered(&run, &ids, mode);
        assert_eq!(lag_and_in_flight(&s, &group), (0, 0), "{mode}: {}", run.raw);
    }
}

/// Goal: a page on an origin not in the list, and a page on the allowed origin with a bad
/// token, get nothing by either transport, and the mesh leases them nothing: no client
/// attached, every event still pending and none in flight, so a page on the allowed origin
/// afterwards gets all of them at once (an event leased to a refused page would wait out
/// the 10-minute ACK timeout). Method: the refused page from `http://127.0.0.1:Q` (not
/// listed, not the listener's own origin), the allowed one from `http://localhost:P`.
#[test]
fn a_page_on_another_origin_or_with_a_bad_token_is_refused_and_leased_nothing() {
    let allowed_port = free_port();
    let allowed = format!("http://localhost:{allowed_port}");
    let other = format!("http://127.0.0.1:{}/", free_port());
    let s = server(&allowed);
    for mode in ["sse", "ws"] {
        let group = format!("web.{mode}");
        let ids = define_and_publish(&s, &group);
        let run = run_page(&s, &other, &group, PAGE, mode, 5_000);
        assert_leased_nothing(&s, &run, &group, &format!("{mode} from {other}"));
        let run = run_page(&s, &format!("{allowed}/"), &group, "tok-wrong", mode, 5_000);
        assert_leased_nothing(&s, &run, &group, &format!("{mode} with a bad token"));
        let run = run_page(&s, &format!("{allowed}/"), &group, PAGE, mode, 60_000);
        assert_all_delivered(&run, &ids, &format!("{mode} after the refusals"));
    }
    let refused = s.metrics();
    assert!(
        refused.contains("unimesh_auth_refused_total"),
        "the bad tokens were not counted"
    );
}
