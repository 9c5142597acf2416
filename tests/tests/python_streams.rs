//! Outside clients of the delivery streams, from PyPI, as a user would use them
//! (`tests/python/stream_clients.py`): sseclient-py drops a stream mid-way and reconnects
//! with `Last-Event-ID` (nothing lost), websocket-client NACKs and ACKs by frames, and
//! another sends garbage frames until the server closes with 1008.
//!
//! python3 with `requests`, `sseclient-py` and `websocket-client` is required (CI installs
//! them, pinned, in `.ci/run`); without them this test fails, saying so.

use std::process::Command;

use unimesh_tests::{json, Options, Server, Value};

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

#[test]
fn python_sse_and_websocket_clients() {
    let probe = Command::new(python())
        .args(["-c", "import requests, sseclient, websocket"])
        .output();
    match probe {
        Ok(o) if o.status.success() => {}
        other => panic!(
            "this test needs python3 with requests, sseclient-py and websocket-client \
             (`python3 -m pip install requests sseclient-py websocket-client`; CI does this \
             in .ci/run): {other:?}"
        ),
    }
    let s = Server::start(Options::new().toml("[mesh]\nflush_interval_ms = 20\n"));
    for (group, topic) in [("sse-g", "sse-t"), ("ws-g", "ws-t")] {
        s.subscribe(
            group,
            &json!({"topic": topic, "ackTimeoutMs": 3_600_000,
                    "backoff": {"initialMs": 0, "maxMs": 0, "multiplier": 1.0}}),
        );
    }
    let script = unimesh_tests::package_dir().join("python/stream_clients.py");
    let out = Command::new(python())
        .arg(&script)
        .arg(s.http_url(""))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} failed:\n{}\n--- server ---\n{}",
        script.display(),
        String::from_utf8_lossy(&out.stderr),
        s.stderr()
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("a JSON summary");

    // SSE: two read and the stream dropped; after the reconnect the un-ACKed one comes
    // again (attempt 2) with the two never read; all four ACKed, none lost.
    let sse = &v["sse"];
    let first: Vec<(String, u64)> = pairs(&sse["first"]);
    let after: Vec<(String, u64)> = pairs(&sse["after"]);
    assert_eq!(first.len(), 2, "{v}");
    assert!(first.iter().all(|(_, a)| *a == 1));
    assert!(
        after.contains(&(first[1].0.clone(), 2)),
        "the un-ACKed one again: {v}"
    );
    let mut all: Vec<String> = first
        .iter()
        .chain(&after)
        .map(|(id, _)| id.clone())
        .collect();
    all.sort();
    all.dedup();
    assert_eq!(all, ["s0", "s1", "s2", "s3"], "nothing lost: {v}");
    assert_eq!(sse["acked"], 4, "{v}");

    // WebSocket: a NACK brings the delivery again; ACK frames answer per id.
    let ws = &v["ws"];
    assert_eq!(ws["nack_answer"]["result"], "nack", "{v}");
    assert_eq!(ws["nack_answer"]["nacked"], 1);
    assert_eq!(ws["again"][1], 2, "{v}");
    assert_eq!(ws["again"][0], ws["delivered"][0][0]);
    assert_eq!(ws["ack_answer"]["acked"], 2, "{v}");
    assert_eq!(
        ws["errors"],
        json!(["invalid-frame", "invalid-frame", "invalid-frame"])
    );
    assert_eq!(ws["close_code"], 1008, "{v}");
    let info = s.get("/v1/subscriptions/ws-g").ok_json(200);
    assert_eq!(info["stats"]["acked"], 2, "{info}");
}

fn pairs(v: &Value) -> Vec<(String, u64)> {
    v.as_array()
        .map(|a| {
            a.iter()
                .map(|p| {
                    (
                        p[0].as_str().unwrap_or("").to_owned(),
                        p[1].as_u64().unwrap_or(0),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}
