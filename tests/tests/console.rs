//! The web console (issue 22), in a real browser: Debian's headless Chromium, driven by
//! playwright-core (`tests/browser/console.mjs`), opens `/ui` on the admin listener of a
//! server with `[auth]`, is asked for the token, and then shows the mesh live from the
//! admin feed while this test acts as producer and consumer between the page's steps.
//!
//! Goal: what an operator does with the console works, and the page follows the mesh
//! without reloading or polling. Method: a group whose consumer NACKs until its three
//! events are dead-lettered; the page shows the DLQ count (3); a quiet spell makes no
//! request at all; clicking replay delivers them again, the consumer ACKs, and the page
//! shows the DLQ empty; five events published move the group's lag to 5 on the page and
//! their ACKs back to 0; a client evicted from the page is gone from the mesh and what it
//! held is no longer in flight; a rate rule set from the page is in force; "an hour ago"
//! seeks every partition back, and the lag shows all eight events again. The page was
//! loaded once (a marker set in it survives), its only request to the feed is the one it
//! opened, it logged no error but the refusal that made it ask for the token (a content
//! security policy violation would be one), and the token is not in the server's log.
//!
//! The screenshot the page makes along the way goes to the test's temporary directory;
//! with `UNIMESH_BLESS=1` also to `docs/console.png` (the README shows it).
//!
//! Needs `node`, `tests/browser/node_modules` and `/usr/bin/chromium` (or
//! `UNIMESH_CHROMIUM`), all installed by `tests/prepare.sh`.

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::Duration;

use unimesh_tests::{
    event, json, package_dir, parse_deliveries, published, wait_for, Call, Delivery, Options,
    Server, Settled, Value,
};

const OPS: &str = "tok-ops-console-7c21";
const WORKER: &str = "tok-worker-console-93ab";

const AUTH: &str = r#"
[auth.identities.ops]
token_sha256 = "0a002c3158ab69fa49d530dea2d00a50003f093a1c724b66cbfca98b3cc94f5f"
publish = ["*"]
define = ["*"]
admin = true
[auth.identities.worker]
token_sha256 = "db047e79db481a4fe53aeec609efe49221178d79a432da41a946588af7d8c12a"
consume = ["*"]
"#;

const WAIT: Duration = Duration::from_secs(60);

/// The console page in a browser, one command at a time.
struct Browser {
    child: Child,
    stdin: ChildStdin,
    answers: Receiver<String>,
}

impl Browser {
    fn open(url: &str) -> Self {
        let dir = package_dir().join("browser");
        assert!(
            dir.join("node_modules/playwright-core").is_dir(),
            "{} has no node_modules/playwright-core: run tests/prepare.sh",
            dir.display()
        );
        let mut child = Command::new("node")
            .arg(dir.join("console.mjs"))
            .arg(json!({ "url": url }).to_string())
            .current_dir(&dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run node (tests/prepare.sh installs what this test needs): {e}")
            });
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, answers) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Browser {
            child,
            stdin,
            answers,
        }
    }

    /// Sends one command; its answer, or a panic naming what the page did not do.
    fn send(&mut self, command: Value) -> Value {
        writeln!(self.stdin, "{command}").expect("the browser driver takes commands");
        let line = self
            .answers
            .recv_timeout(Duration::from_secs(120))
            .unwrap_or_else(|e| panic!("no answer to {command} from the browser driver: {e}"));
        let answer: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("the browser driver answered {line:?}: {e}"));
        assert_eq!(answer["ok"], true, "{command}: {answer}");
        answer
    }

    fn click(&mut self, selector: &str) {
        self.send(json!({"op": "click", "selector": selector}));
    }

    fn wait_text(&mut self, selector: &str, text: &str) {
        self.send(
            json!({"op": "waitText", "selector": selector, "text": text, "timeoutMs": 60000}),
        );
    }

    fn text(&mut self, selector: &str) -> String {
        self.send(json!({"op": "text", "selector": selector}))["text"]
            .as_str()
            .unwrap_or_default()
            .trim()
            .to_owned()
    }

    fn requests_since(&mut self, n: u64) -> (Vec<Value>, u64) {
        let a = self.send(json!({"op": "requests", "since": n}));
        let list = a["requests"].as_array().cloned().unwrap_or_default();
        (list, a["total"].as_u64().unwrap_or(0))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "{}", json!({"op": "close"}));
        let _ = self.child.wait();
    }
}

fn with(token: &str, call: Call) -> Call {
    call.header("authorization", &format!("Bearer {token}"))
}

fn poll(s: &Server, group: &str, client: &str, max: u32) -> Vec<Delivery> {
    let r = with(
        WORKER,
        s.call(
            "GET",
            &format!("/v1/subscriptions/{group}/events?client={client}&max={max}&waitMs=500"),
        ),
    )
    .send();
    r.expect(200);
    parse_deliveries(&r)
}

fn settle(s: &Server, group: &str, verb: &str, got: &[Delivery]) -> Settled {
    let ids: Vec<&str> = got.iter().map(|d| d.id.as_str()).collect();
    let mut body = json!({ "deliveryIds": ids });
    if verb == "nack" {
        body["delayMs"] = json!(0);
    }
    let r = with(
        WORKER,
        s.call("POST", &format!("/v1/subscriptions/{group}/{verb}")),
    )
    .json(&body)
    .send();
    Settled::parse(&r, verb)
}

fn admin_get(s: &Server, path: &str) -> Value {
    with(OPS, s.admin("GET", path)).send().ok_json(200)
}

fn publish(s: &Server, topic: &str, ids: &[&str]) {
    let events: Vec<Value> = ids
        .iter()
        .map(|id| event(id, "console.test", json!({"id": id})))
        .collect();
    let r = with(OPS, s.call("POST", &format!("/v1/topics/{topic}/events")))
        .header("content-type", "application/cloudevents-batch+json")
        .body(Value::Array(events).to_string())
        .send();
    published(&r, ids.len());
}

/// Polls and ACKs `n` deliveries of `group` as `client`.
fn take_and_ack(s: &Server, group: &str, client: &str, n: usize) -> Vec<Delivery> {
    let mut got = Vec::new();
    wait_for(&format!("{n} deliveries of {group}"), WAIT, || {
        got.extend(poll(s, group, client, (n - got.len()) as u32));
        (got.len() >= n).then_some(())
    });
    settle(s, group, "ack", &got).all_ok(n);
    got
}

fn screenshot_paths() -> Vec<PathBuf> {
    let tmp =
        std::env::var_os("CARGO_TARGET_TMPDIR").map_or_else(std::env::temp_dir, PathBuf::from);
    let mut paths = vec![tmp.join("console.png")];
    if std::env::var_os("UNIMESH_BLESS").is_some() {
        paths.push(package_dir().join("../docs/console.png"));
    }
    paths
}

#[test]
fn the_console_follows_the_mesh_live_and_its_levers_work() {
    let s = Server::start(
        Options::new()
            .toml("[server]\nconsole_interval_ms = 100\n[mesh]\nflush_interval_ms = 20\n")
            .toml(AUTH)
            .ready_token(OPS),
    );
    // billing: two attempts, then the DLQ; audit: reads the same topic, holds what it gets.
    for (group, doc) in [
        (
            "billing",
            json!({"topic": "orders", "startFrom": "earliest", "maxAttempts": 2, "ackTimeoutMs": 60000}),
        ),
        (
            "audit",
            json!({"topic": "orders", "startFrom": "earliest", "ackTimeoutMs": 600000}),
        ),
    ] {
        let r = with(OPS, s.call("PUT", &format!("/v1/subscriptions/{group}")))
            .json(&doc)
            .send();
        assert!(r.status == 200 || r.status == 201, "{}", r.text());
    }
    with(OPS, s.admin("PUT", "/admin/ratelimit"))
        .json(&json!({"topic": "orders", "eventsPerSecond": 500, "burst": 1000}))
        .send()
        .expect(200);
    publish(&s, "orders", &["order-1", "order-2", "order-3"]);
    // The worker NACKs every delivery of billing until all three are dead letters.
    wait_for("three dead letters of billing", WAIT, || {
        let got = poll(&s, "billing", "worker-1", 3);
        if !got.is_empty() {
            settle(&s, "billing", "nack", &got);
        }
        let dlq = admin_get(&s, "/admin/dlq/billing");
        (dlq["entries"].as_array().map_or(0, Vec::len) == 3).then_some(())
    });
    // auditor-7 holds one delivery of audit.
    let held = wait_for("a delivery of audit", WAIT, || {
        let got = poll(&s, "audit", "auditor-7", 1);
        (!got.is_empty()).then_some(got)
    });
    assert_eq!(held.len(), 1);

    let mut page = Browser::open(&s.admin_url("/ui"));
    page.send(json!({"op": "goto"}));
    // With [auth] the page asks for the admin token first.
    page.send(json!({"op": "waitVisible", "selector": "#login-form"}));
    let why = page.text("#login-why");
    assert!(why.starts_with("The admin API needs a token (401"), "{why}");
    // The refused probe is the one error the page may log (Chromium logs a 401 load).
    let refused = page.send(json!({"op": "problems"}))["problems"].clone();
    assert!(
        refused.as_array().is_some_and(
            |p| p.len() == 1 && p[0].as_str().is_some_and(|t| t.contains("status of 401"))
        ),
        "{refused}"
    );
    page.send(json!({"op": "fill", "selector": "#token", "value": OPS}));
    page.click("#login-form button[type=submit]");
    page.wait_text("#groups tr[data-group=billing] td.lag", "0");
    page.wait_text("#groups tr[data-group=audit] td.in-flight", "1");
    page.send(json!({"op": "eval", "expr": "window.__loadedOnce = 42"}));
    page.click("#groups tr[data-group=billing]");
    page.wait_text("#dlq-count", "3");
    page.wait_text("#clients tr[data-client=auditor-7] td.name", "auditor-7");
    page.wait_text("#ratelimits tr[data-topic=orders] td.num", "500");
    for path in screenshot_paths() {
        page.send(json!({"op": "screenshot", "path": path}));
        let png = std::fs::read(&path).unwrap_or_default();
        assert!(
            png.starts_with(b"\x89PNG") && png.len() > 10_000,
            "{}",
            path.display()
        );
    }

    // Nothing changes: the page asks nothing (no polling loop).
    let (_, before) = page.requests_since(0);
    std::thread::sleep(Duration::from_millis(1500));
    let (quiet, _) = page.requests_since(before);
    assert!(
        quiet.is_empty(),
        "requests while nothing changed: {quiet:?}"
    );

    // Replay from the page; the worker ACKs the three; the page shows the DLQ empty.
    page.click("#dlq-replay");
    page.wait_text("#status", "billing: replay of 3 dead letter(s) started");
    let replayed = take_and_ack(&s, "billing", "worker-1", 3);
    let mut ids: Vec<&str> = replayed.iter().map(Delivery::event_id).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["order-1", "order-2", "order-3"]);
    page.wait_text("#dlq-count", "0");

    // The lag moves on the page as events come and go.
    publish(
        &s,
        "orders",
        &["order-4", "order-5", "order-6", "order-7", "order-8"],
    );
    page.wait_text("#groups tr[data-group=billing] td.lag", "5");
    take_and_ack(&s, "billing", "worker-1", 5);
    page.wait_text("#groups tr[data-group=billing] td.lag", "0");

    // Evict auditor-7 from the page: gone from the mesh, what it held back in the lane.
    page.click("#clients tr[data-client=auditor-7] button.evict");
    page.wait_text(
        "#status",
        "evicted auditor-7 from 1 group(s): what it held is delivered again",
    );
    page.send(json!({"op": "waitGone", "selector": "#clients tr[data-client=auditor-7]", "timeoutMs": 60000}));
    let clients = admin_get(&s, "/admin/clients");
    let left: Vec<&str> = clients["clients"]
        .as_array()
        .map(|cs| cs.iter().filter_map(|c| c["client"].as_str()).collect())
        .unwrap_or_default();
    assert!(!left.contains(&"auditor-7"), "{clients}");
    wait_for("nothing of audit in flight", WAIT, || {
        let rows = admin_get(&s, "/admin/offsets?topic=orders");
        let in_flight: u64 = rows["offsets"]
            .as_array()
            .map(|rs| {
                rs.iter()
                    .filter(|r| r["group"] == "audit")
                    .filter_map(|r| r["inFlight"].as_u64())
                    .sum()
            })
            .unwrap_or(u64::MAX);
        (in_flight == 0).then_some(())
    });

    // A rate rule set from the page is in force and shown.
    page.send(json!({"op": "fill", "selector": "#rl-topic", "value": "orders"}));
    page.send(json!({"op": "fill", "selector": "#rl-eps", "value": "50"}));
    page.send(json!({"op": "fill", "selector": "#rl-burst", "value": "100"}));
    page.click("#ratelimit-form button[type=submit]");
    page.wait_text("#status", "orders: 50 events per second, burst 100");
    page.wait_text("#ratelimits tr[data-topic=orders] td.num", "50");
    let rules = admin_get(&s, "/admin/ratelimit");
    assert_eq!(
        rules["rules"],
        json!([{"topic": "orders", "eventsPerSecond": 50, "burst": 100}])
    );

    // "Replay the last hour" from the page: every partition of billing restarts at its
    // first event, so all eight are pending again.
    page.click("#seek-hour");
    page.click("#seek-form button[type=submit]");
    page.wait_text("#groups tr[data-group=billing] td.lag", "8");
    let status = page.text("#status");
    assert!(
        status.starts_with("billing: partition 0 at 0, 1 at 0"),
        "{status}"
    );
    let again = take_and_ack(&s, "billing", "worker-1", 8);
    assert_eq!(again.len(), 8);
    page.wait_text("#groups tr[data-group=billing] td.lag", "0");

    // One load, one feed, no errors, no token in the log.
    let marker = page.send(json!({"op": "eval", "expr": "window.__loadedOnce"}));
    assert_eq!(marker["value"], 42, "the page was reloaded");
    let (all, _) = page.requests_since(0);
    let count = |f: &dyn Fn(&str) -> bool| {
        all.iter()
            .filter(|r| r["url"].as_str().is_some_and(f))
            .count()
    };
    assert_eq!(count(&|u| u.ends_with("/ui")), 1, "{all:?}");
    assert_eq!(count(&|u| u.contains("/admin/events")), 1, "{all:?}");
    assert!(
        all.iter().all(|r| r["url"]
            .as_str()
            .is_some_and(|u| u.starts_with(&s.admin_url("")))),
        "the page reached beyond its origin: {all:?}"
    );
    let problems = page.send(json!({"op": "problems"}));
    assert_eq!(
        problems["problems"], refused,
        "errors after the login: {problems}"
    );
    drop(page);
    assert!(
        !s.stderr().contains(OPS),
        "the admin token is in the server's log"
    );
}
