//! Signed webhooks (issue 19), against the real binary: a group with `push.secret` has
//! every push signed in the style of Standard Webhooks, and the receiver verifies the
//! signature independently — Python's `hmac`, as a receiver would — while a wrong secret
//! fails verification. The secret is never shown again (`GET` says `signed: true`).

use std::process::Command;
use std::time::Duration;

use unimesh_tests::hook::{Hook, HookRequest};
use unimesh_tests::{event, json, published, wait_for, Options, Server, Value};

const WAIT: Duration = Duration::from_secs(90);

/// `whsec_` and the base64 of 32 bytes.
const SECRET: &str = "whsec_c2lnbmluZy1rZXktb2YtdGhlLXRlc3Qtb2YtdW5pbWVzaA==";
const WRONG: &str = "whsec_YW5vdGhlci1rZXktbm90LXRoZS1vbmUtdGhhdC1zaWduZWQ=";

/// A receiver's check, written as a receiver would write it (Standard Webhooks): for each
/// request, the HMAC-SHA256 of `id.timestamp.body` under the secret's decoded key, in
/// base64, must be one of the `v1,` signatures, compared in constant time, and the
/// timestamp within five minutes. Prints one line per request; exits 1 if any fails.
const VERIFY: &str = r#"
import base64, hashlib, hmac, json, sys, time
secret, path = sys.argv[1], sys.argv[2]
key = base64.b64decode(secret.removeprefix("whsec_"))
bad = 0
for r in json.load(open(path)):
    body = base64.b64decode(r["body"])
    signed = f'{r["id"]}.{r["timestamp"]}.'.encode() + body
    want = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    given = [s.split(",", 1)[1] for s in r["signature"].split(" ") if s.startswith("v1,")]
    fresh = abs(time.time() - int(r["timestamp"])) < 300
    ok = fresh and any(hmac.compare_digest(want, g) for g in given)
    print("verified" if ok else "REFUSED", r["id"])
    bad += not ok
sys.exit(1 if bad else 0)
"#;

fn verify(secret: &str, requests: &[HookRequest], dir: &std::path::Path) -> (bool, String) {
    use base64::Engine as _;
    let rows: Vec<Value> = requests
        .iter()
        .map(|r| {
            json!({
                "id": r.header("webhook-id").unwrap_or(""),
                "timestamp": r.header("webhook-timestamp").unwrap_or("0"),
                "signature": r.header("webhook-signature").unwrap_or(""),
                "body": base64::engine::general_purpose::STANDARD.encode(&r.body),
            })
        })
        .collect();
    let path = dir.join("pushes.json");
    std::fs::write(&path, Value::Array(rows).to_string()).expect("write the pushes");
    let out = Command::new("python3")
        .arg("-c")
        .arg(VERIFY)
        .arg(secret)
        .arg(&path)
        .output()
        .expect("run python3");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Goal: the signature a receiver computes with the right secret matches every push (the
/// webhook id is the delivery id), a wrong secret matches none, an unsigned group's pushes
/// carry no signature, and no answer shows the secret.
#[test]
fn a_receiver_verifies_signed_pushes_and_a_wrong_secret_fails() {
    let s = Server::start(Options::new().toml(
        "[mesh]\nflush_interval_ms = 20\n[push]\nscan_interval_ms = 50\nallowed_hosts = \"127.0.0.1\"\n",
    ));
    let hook = Hook::ok();
    let doc = json!({"topic": "t", "push": {"url": hook.url("/signed"), "secret": SECRET}});
    let created = s.subscribe("signed", &doc);
    assert_eq!(
        created["push"],
        json!({"url": hook.url("/signed"), "signed": true, "batch": 1})
    );
    let plain = json!({"topic": "t", "push": {"url": hook.url("/plain")}});
    let created = s.subscribe("plain", &plain);
    assert_eq!(created["push"]["signed"], json!(false));
    for (i, id) in ["a", "b", "c"].iter().enumerate() {
        published(
            &s.publish_structured("t", &event(id, "t", json!({"n": i}))),
            1,
        );
    }
    wait_for("three pushes to each group", WAIT, || {
        let r = hook.requests();
        let n = |p: &str| r.iter().filter(|r| r.path == p).count();
        (n("/signed") >= 3 && n("/plain") >= 3).then_some(())
    });
    let all = hook.requests();
    let signed: Vec<HookRequest> = all
        .iter()
        .filter(|r| r.path == "/signed")
        .cloned()
        .collect();
    for r in &signed {
        assert_eq!(
            r.header("webhook-id"),
            r.header("x-unimesh-delivery-id"),
            "the webhook id is the delivery id"
        );
    }
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (ok, out) = verify(SECRET, &signed, dir.path());
    assert!(ok, "the right secret verifies every push: {out}");
    assert_eq!(out.matches("verified").count(), signed.len(), "{out}");
    let (ok, out) = verify(WRONG, &signed, dir.path());
    assert!(!ok, "a wrong secret must fail: {out}");
    assert_eq!(out.matches("REFUSED").count(), signed.len(), "{out}");
    assert!(all
        .iter()
        .filter(|r| r.path == "/plain")
        .all(|r| r.header("webhook-signature").is_none()));
    // The secret is never shown again.
    for text in [
        s.get("/v1/subscriptions/signed").expect(200).text(),
        s.admin_get("/admin/subscriptions").expect(200).text(),
    ] {
        assert!(!text.contains(&SECRET[6..]), "secret shown: {text}");
        assert!(text.contains("\"signed\":true"), "{text}");
    }
    // A secret that is no Standard Webhooks key is refused, naming the field; nothing changes.
    let bad = json!({"topic": "t", "push": {"url": hook.url("/x"), "secret": "hunter2"}});
    s.call("PUT", "/v1/subscriptions/signed")
        .json(&bad)
        .send()
        .expect_error_naming(400, "invalid-subscription", &["push.secret", "whsec_"]);
    let still = s.get("/v1/subscriptions/signed").ok_json(200);
    assert_eq!(still["push"]["url"], json!(hook.url("/signed")));
}
