//! Where a webhook may push (issue 19), against the real binary: a subscription pointing
//! at the cloud metadata address or at the mesh's own admin port is refused when it is
//! written (400 naming the URL and why, nothing stored); an IPv6 literal works when
//! listed, and a push is delivered to an IPv6 loopback receiver; a name that resolves to a
//! refused address passes the `PUT` but its pushes are refused after resolution (NACKed
//! like failed pushes, then dead-lettered, logged once); redirects are not followed.

use std::time::Duration;

use unimesh_tests::hook::{Hook, HookAnswer};
use unimesh_tests::{event, json, published, wait_for, Options, Server, Value};

const WAIT: Duration = Duration::from_secs(90);

fn options(allowed_hosts: &str) -> Options {
    Options::new().toml(&format!(
        "[mesh]\nflush_interval_ms = 20\n[push]\nscan_interval_ms = 50\nallowed_hosts = \"{allowed_hosts}\"\n"
    ))
}

/// `PUT` of a pushing group; the answer as it came.
fn put_push(s: &Server, group: &str, url: &str, extra: Value) -> unimesh_tests::Resp {
    let mut doc = json!({"topic": "t", "push": {"url": url}, "maxAttempts": 2,
                         "backoff": {"initialMs": 0, "maxMs": 0, "multiplier": 1.0}});
    if let (Some(d), Some(e)) = (doc.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            d.insert(k.clone(), v.clone());
        }
    }
    s.call("PUT", &format!("/v1/subscriptions/{group}"))
        .json(&doc)
        .send()
}

/// Goal: the two targets of the issue — the metadata service and the mesh's own admin port
/// (`/admin/dlq/x/replay`) — are refused at `PUT` with a 400 naming the URL and the
/// reason, and nothing is stored (the group does not exist afterwards). The mesh's own
/// ports are refused even when loopback is allowed. An IPv6 literal is refused by default (loopback),
/// not as "not a valid URL".
#[test]
fn metadata_and_admin_port_targets_are_refused_when_written() {
    let s = Server::start(options(""));
    let metadata = "http://169.254.169.254/latest/meta-data/";
    let r = put_push(&s, "meta", metadata, json!({}));
    r.expect_error_naming(400, "invalid-subscription", &[metadata, "link-local"]);
    s.get("/v1/subscriptions/meta").expect(404);
    let admin = format!("http://{}/admin/dlq/x/replay", s.admin_addr());
    let r = put_push(&s, "adm", &admin, json!({}));
    r.expect_error_naming(400, "invalid-subscription", &[&admin, "own listeners"]);
    s.get("/v1/subscriptions/adm").expect(404);
    let v6 = "http://[::1]:9000/";
    let r = put_push(&s, "v6", v6, json!({}));
    let msg = r.expect_error_naming(400, "invalid-subscription", &[v6, "loopback"]);
    assert!(!msg.contains("not a valid URL"), "{msg}");
    s.get("/v1/subscriptions/v6").expect(404);
    let r = s.admin_get("/admin/subscriptions").ok_json(200);
    assert_eq!(r["subscriptions"], json!([]), "nothing stored: {r}");

    // With loopback listed, the admin port is still refused (one of the mesh's listeners).
    let s = Server::start(options("127.0.0.1"));
    let admin = format!("http://{}/admin/dlq/x/replay", s.admin_addr());
    let r = put_push(&s, "adm", &admin, json!({}));
    r.expect_error_naming(400, "invalid-subscription", &[&admin, "own listeners"]);
    let traffic = format!("http://{}/v1/topics/t/events", s.http_addr());
    put_push(&s, "loop", &traffic, json!({})).expect_error_naming(
        400,
        "invalid-subscription",
        &["own listeners"],
    );
    s.get("/v1/subscriptions/adm").expect(404);
    // A list is exact: a public address it does not name is refused too.
    put_push(&s, "pub", "http://93.184.215.14/in", json!({})).expect_error_naming(
        400,
        "invalid-subscription",
        &["not in push.allowed_hosts"],
    );
}

/// Goal: an IPv6 literal push URL works end to end: listed (`::1`), the `PUT` is
/// accepted, the `GET` shows the URL as given, and the event is POSTed to a receiver
/// listening on `[::1]` and ACKed by its 200.
#[test]
fn a_push_is_delivered_to_an_ipv6_loopback_receiver() {
    let s = Server::start(options("::1"));
    let hook = Hook::start_at("[::1]:0", |_, _| HookAnswer::status(200));
    let url = hook.url("/in");
    assert!(url.starts_with("http://[::1]:"), "{url}");
    put_push(&s, "v6", &url, json!({})).expect(201);
    let got = s.get("/v1/subscriptions/v6").ok_json(200);
    assert_eq!(got["push"]["url"], json!(url), "{got}");
    published(
        &s.publish_structured("t", &event("six", "t", json!({"n": 6}))),
        1,
    );
    wait_for("the push to [::1]", WAIT, || {
        hook.requests()
            .iter()
            .any(|r| r.event_id() == "six" && r.path == "/in")
            .then_some(())
    });
    wait_for("the ACK", WAIT, || {
        let v = s.get("/v1/subscriptions/v6").ok_json(200);
        (v["stats"]["acked"] == json!(1)).then_some(())
    });
}

/// The machine's host name, which resolves (through /etc/hosts or the resolver) to a
/// loopback or private address on every machine these tests run on.
fn own_host_name() -> String {
    let out = std::process::Command::new("hostname")
        .output()
        .expect("run hostname");
    let name = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(!name.is_empty(), "hostname printed nothing");
    name
}

/// Goal: the check after DNS resolution. A host name passes the `PUT` (it is not an IP
/// literal) but resolves to a non-public address: every push is refused before any
/// connection is made, NACKed like a failed push, and after `maxAttempts` the event is
/// dead-lettered; the refusal is logged once, the receiver (listening on every address)
/// gets nothing.
#[test]
fn a_name_resolving_to_a_refused_address_is_refused_at_push_time() {
    use std::net::ToSocketAddrs as _;
    let name = own_host_name();
    let addrs: Vec<std::net::SocketAddr> = (name.as_str(), 80)
        .to_socket_addrs()
        .unwrap_or_else(|e| panic!("the host name {name} does not resolve: {e}"))
        .collect();
    let public: Vec<_> = addrs
        .iter()
        .filter(|a| {
            let ip = a.ip();
            !(ip.is_loopback()
                || matches!(ip, std::net::IpAddr::V4(v4) if v4.is_private() || v4.is_link_local()))
        })
        .collect();
    assert!(
        public.is_empty(),
        "this test needs the host name {name} to resolve to loopback or private addresses only: {addrs:?}"
    );
    let s = Server::start(options(""));
    let hook = Hook::start_at("0.0.0.0:0", |_, _| HookAnswer::status(200));
    let port = hook.url("").rsplit(':').next().unwrap_or("").to_owned();
    let url = format!("http://{name}:{port}/in");
    put_push(&s, "dns", &url, json!({})).expect(201);
    published(&s.publish_structured("t", &event("e1", "t", json!({}))), 1);
    wait_for("the dead letter after two refused pushes", WAIT, || {
        let v = s.admin_get("/admin/dlq/dns").ok_json(200);
        (v["entries"].as_array().map(Vec::len) == Some(1)).then_some(())
    });
    assert_eq!(hook.count(), 0, "no connection to a refused address");
    let log = s.stderr();
    assert_eq!(
        log.matches("push target refused").count(),
        1,
        "logged once: {log}"
    );
}

/// Goal: a redirect is not followed: the receiver answers 302 to another receiver, which
/// gets nothing; the push counts as failed and is tried again (attempt 2), then
/// dead-lettered.
#[test]
fn redirects_are_not_followed() {
    let s = Server::start(options("127.0.0.1"));
    let elsewhere = Hook::ok();
    let to = elsewhere.url("/stolen");
    let hook = Hook::start(move |_, _| HookAnswer::status(302).header("location", &to));
    put_push(&s, "redir", &hook.url("/in"), json!({})).expect(201);
    published(&s.publish_structured("t", &event("r1", "t", json!({}))), 1);
    wait_for("the dead letter", WAIT, || {
        let v = s.admin_get("/admin/dlq/redir").ok_json(200);
        (v["entries"].as_array().map(Vec::len) == Some(1)).then_some(())
    });
    assert_eq!(hook.count(), 2, "two attempts, each answered 302");
    assert_eq!(elsewhere.count(), 0, "the redirect was not followed");
}
