//! An outside client: the Python `cloudevents` SDK publishes events in binary and structured
//! mode (`tests/python/publish_with_sdk.py`) and reads them back from one group, checking
//! them with the SDK; this test reads the same events from a second group and checks them
//! against what the script says went over the wire.
//!
//! python3 with the `cloudevents` and `requests` packages is required (CI installs them in
//! `.ci/run`); without them this test fails, saying so, rather than passing silently.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use unimesh_tests::{json, Server, Value};

const SCRIPT_TIMEOUT: Duration = Duration::from_secs(180);

fn python() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned())
}

/// Fails the test, with instructions, when python3 or the packages are missing.
fn require_python_packages() {
    let out = Command::new(python())
        .args([
            "-c",
            "import cloudevents, requests; print(getattr(cloudevents, '__version__', '?'))",
        ])
        .output();
    match out {
        Err(e) => panic!(
            "this test needs python3 ({e}); install it and then \
             `python3 -m pip install cloudevents requests` (CI does this in .ci/run)"
        ),
        Ok(o) if !o.status.success() => panic!(
            "this test needs the Python packages cloudevents and requests: \
             `python3 -m pip install cloudevents requests` (CI does this in .ci/run)\n{}",
            String::from_utf8_lossy(&o.stderr)
        ),
        Ok(o) => eprintln!(
            "python cloudevents SDK {}",
            String::from_utf8_lossy(&o.stdout).trim()
        ),
    }
}

/// Runs the script to completion (bounded), returning its stdout; panics with its stderr if
/// it fails.
fn run_script(base: &str, topic: &str, group: &str) -> String {
    let script = unimesh_tests::package_dir().join("python/publish_with_sdk.py");
    let mut child = Command::new(python())
        .arg(&script)
        .args([base, topic, group])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if started.elapsed() < SCRIPT_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{} did not finish within {SCRIPT_TIMEOUT:?}",
                    script.display()
                );
            }
            Err(e) => panic!("cannot wait for the script: {e}"),
        }
    }
    let out = child
        .wait_with_output()
        .unwrap_or_else(|e| panic!("cannot read the script's output: {e}"));
    assert!(
        out.status.success(),
        "{} failed ({}):\n{}",
        script.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn python_cloudevents_sdk_publishes_binary_and_structured_events_that_arrive_intact() {
    require_python_packages();
    let s = Server::start_default();
    // One group for the script to read with the SDK, one for this test to read.
    s.subscribe("py-sdk", &json!({ "topic": "py-t", "ackTimeoutMs": 60000 }));
    s.subscribe(
        "py-rust",
        &json!({ "topic": "py-t", "ackTimeoutMs": 60000 }),
    );
    let base = s.http_url("");
    let out = run_script(&base, "py-t", "py-sdk");
    let summary: Value = serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("the script's summary is not JSON ({e}): {out}"));
    let sent: BTreeMap<String, Value> = summary["sent"]
        .as_array()
        .unwrap_or_else(|| panic!("no sent array: {summary}"))
        .iter()
        .map(|e| (e["id"].as_str().unwrap_or_default().to_owned(), e.clone()))
        .collect();
    assert_eq!(sent.len(), 6, "{summary}");
    for mode in ["binary", "structured"] {
        assert!(
            sent.values().filter(|e| e["mode"] == mode).count() >= 3,
            "{mode} mode is covered: {summary}"
        );
    }

    let d = s.poll_n("py-rust", "rust", sent.len(), Duration::from_secs(60));
    let mut seen = BTreeMap::new();
    for x in &d {
        let id = x.event_id().to_owned();
        let want = sent
            .get(&id)
            .unwrap_or_else(|| panic!("delivered an event the script did not send: {}", x.event));
        assert!(
            seen.insert(id.clone(), ()).is_none(),
            "{id} delivered twice"
        );
        assert_eq!(
            Some(u64::from(x.partition)),
            want["partition"].as_u64(),
            "{id}"
        );
        assert_eq!(Some(x.offset), want["offset"].as_u64(), "{id}");
        let attrs = want["attributes"]
            .as_object()
            .unwrap_or_else(|| panic!("{id}: no attributes in the summary"));
        for (k, v) in attrs {
            if k == "time" {
                // Same instant, possibly written differently; the script compares instants.
                let got = x.event["time"].as_str().unwrap_or_default();
                assert!(
                    got.starts_with("2024-05-17T08:30:15.25"),
                    "{id}: time {got}"
                );
                continue;
            }
            assert_eq!(&x.event[k], v, "{id}: attribute {k} in {}", x.event);
        }
        for member in ["data", "data_base64"] {
            assert_eq!(
                x.event[member], want[member],
                "{id}: {member} in {}",
                x.event
            );
        }
    }
    assert_eq!(seen.len(), sent.len());
    let ids: Vec<&str> = d.iter().map(|x| x.id.as_str()).collect();
    s.ack("py-rust", &ids).all_ok(ids.len());

    // The script ACKed everything it read: its group is done.
    let sub = s.get("/v1/subscriptions/py-sdk").ok_json(200);
    assert_eq!(sub["stats"]["acked"], 6, "{sub}");
    assert_eq!(sub["lag"], 0, "{sub}");
}
