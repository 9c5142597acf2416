//! The command line. Without a server: `--print-config` shows the merged configuration
//! (flag > environment > file > default), and a bad configuration stops the process with
//! exit code 2 and a message naming the key, before anything is created on disk. As a
//! client of a running server (`publish`, `subscribe`, `groups`, `offsets`, `dlq`, `seek`):
//! what it prints and its exit codes (0 done, 1 refused, 2 usage, 3 unreachable), against
//! the real server, or a stand-in that records what the client sent.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::net::TcpListener;
use std::process::{Command, Output, Stdio};

use unimesh_tests::hook::{Hook, HookAnswer};
use unimesh_tests::{event, json, unimesh_bin, Options, Server, Value};

/// Runs the binary with only the given `UNIMESH_*` variables (the caller's are removed).
fn run(args: &[&str], env: &[(&str, &str)], cwd: &std::path::Path) -> Output {
    let mut cmd = Command::new(unimesh_bin());
    cmd.args(args).current_dir(cwd);
    for (k, _) in std::env::vars() {
        if k.starts_with("UNIMESH_") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("the binary runs")
}

fn table(out: &Output) -> toml::Table {
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout.clone()).expect("utf-8");
    toml::from_str(&text).unwrap_or_else(|e| panic!("not TOML ({e}):\n{text}"))
}

#[test]
fn print_config_merges_flag_over_env_over_file_over_default() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("unimesh.toml");
    std::fs::write(
        &file,
        "http = \"127.0.0.1:9001\"\n[storage]\ndefault_partitions = 8\nretention_ms = 5000\n",
    )
    .expect("write config");
    let file = file.to_str().expect("utf-8 path");

    let out = run(
        &[
            "serve",
            "--config",
            file,
            "--http",
            "127.0.0.1:9003",
            "--print-config",
        ],
        &[
            ("UNIMESH_HTTP", "127.0.0.1:9002"),
            ("UNIMESH_STORAGE_DEFAULT_PARTITIONS", "16"),
        ],
        dir.path(),
    );
    let t = table(&out);
    assert_eq!(t["http"].as_str(), Some("127.0.0.1:9003"), "flag wins");
    let storage = t["storage"].as_table().expect("storage table");
    assert_eq!(
        storage["default_partitions"].as_integer(),
        Some(16),
        "env beats file"
    );
    assert_eq!(
        storage["retention_ms"].as_integer(),
        Some(5000),
        "file beats default"
    );
    assert_eq!(t["admin"].as_str(), Some("127.0.0.1:8081"), "default kept");
    // Printing serves nothing and creates nothing.
    assert!(!dir.path().join("data").exists());

    // With nothing set, the output is the documented example's table.
    let example: toml::Table =
        toml::from_str(include_str!("../../unimesh.example.toml")).expect("example is TOML");
    assert_eq!(table(&run(&["--print-config"], &[], dir.path())), example);
}

#[test]
fn a_bad_configuration_exits_2_naming_the_key_and_creates_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("bad.toml");
    std::fs::write(&file, "[storage]\ndefault_partitons = 8\n").expect("write config");
    let malformed = dir.path().join("malformed.toml");
    std::fs::write(&malformed, "http = \"127.0.0.1:1\"\nthis is = not toml [\n")
        .expect("write config");
    // (arguments, environment, what the error must name)
    type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Case> = vec![
        (
            vec!["--config", file.to_str().expect("utf-8 path")],
            vec![],
            "storage.default_partitons` in config file",
        ),
        (
            vec![],
            vec![("UNIMESH_STORAGE_DEFAULT_PARTITIONS", "many")],
            "UNIMESH_STORAGE_DEFAULT_PARTITIONS",
        ),
        (vec!["--http", "not-an-address"], vec![], "http"),
        (
            vec!["--config", "/nonexistent/unimesh.toml"],
            vec![],
            "/nonexistent/unimesh.toml",
        ),
        // A misspelt variable is refused (it was only a warning), with the likely key.
        (
            vec![],
            vec![("UNIMESH_STORAGE_DEFAULT_PARTITONS", "8")],
            "UNIMESH_STORAGE_DEFAULT_PARTITONS: UNIMESH_* variables are configuration keys",
        ),
        // A zero where at least 1 is needed, named with the variable it came from.
        (
            vec![],
            vec![("UNIMESH_MESH_MAX_GROUPS", "0")],
            "mesh.max_groups (environment variable UNIMESH_MESH_MAX_GROUPS): is 0",
        ),
        (
            vec!["--storage", "rocks"],
            vec![],
            "storage.backend (flag --storage)",
        ),
        // Not TOML: the file and the place, on one line.
        (
            vec!["--config", malformed.to_str().expect("utf-8 path")],
            vec![],
            "malformed.toml is not valid TOML: line 2, column 6",
        ),
    ];
    for (args, env, named) in cases {
        let out = run(&args, &env, dir.path());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?} {env:?}: {stderr}");
        assert!(
            stderr.contains("configuration error") && stderr.contains(named),
            "{args:?} {env:?} should name {named:?}: {stderr}"
        );
        assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
        assert!(!dir.path().join("data").exists(), "{args:?} created data");
    }
}

/// The startup log answers an operator's first questions: where the data lives, what
/// listens where, and what retention keeps.
#[test]
fn the_startup_log_says_where_data_lives_what_listens_and_what_retention_keeps() {
    use unimesh_tests::{Options, Server};
    let s = Server::start_default();
    let log = s.stderr();
    for needle in [
        "data directory",
        "retention=off",
        &format!("traffic API listening on http://{}", s.http_addr()),
        &format!("admin API listening on http://{}", s.admin_addr()),
    ] {
        assert!(log.contains(needle), "{needle:?} missing from\n{log}");
    }
    let s = Server::start(
        Options::new()
            .toml("[storage]\nretention_ms = 3600000\nretention_bytes_per_partition = 1000000\n"),
    );
    let log = s.stderr();
    assert!(
        log.contains(
            "keeps records younger than 3600000 ms and the newest 1000000 bytes per partition"
        ),
        "{log}"
    );
}

// ----- the client subcommands -----

/// Runs a client subcommand against `s` (its two listeners as `--server` and `--admin`),
/// with `stdin` as its standard input (none: an empty one).
fn client(s: &Server, args: &[&str], stdin: Option<&str>) -> Output {
    let server = format!("http://{}", s.http_addr());
    let admin = format!("http://{}", s.admin_addr());
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--server", &server, "--admin", &admin]);
    run_with_stdin(&all, &[], stdin)
}

/// Runs the binary with these arguments and `UNIMESH_*` variables only, and `stdin`.
fn run_with_stdin(args: &[&str], env: &[(&str, &str)], stdin: Option<&str>) -> Output {
    let mut cmd = Command::new(unimesh_bin());
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, _) in std::env::vars() {
        if k.starts_with("UNIMESH_") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("the binary runs");
    let mut input = child.stdin.take().expect("stdin is piped");
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).expect("write stdin");
    }
    drop(input);
    child.wait_with_output().expect("the binary ends")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts the exit code, showing both streams when it differs.
fn exits(out: &Output, code: i32, what: &str) {
    assert_eq!(
        out.status.code(),
        Some(code),
        "{what}: exit {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        stdout(out),
        stderr(out)
    );
}

/// One JSON CloudEvent per line.
fn lines_of(events: &[Value]) -> String {
    events.iter().map(|e| format!("{e}\n")).collect()
}

/// Goal: the round trip a user makes with the CLI alone. Method: publish five events from a
/// file (a blank line among them), tail the group with `subscribe --json --max 5`, which
/// prints each delivery as one JSON line and ACKs it; then `offsets` shows the group's lag
/// at 0 and nothing in flight, as JSON and as a table.
#[test]
fn publish_from_a_file_subscribe_json_max_n_acks_them_and_offsets_show_lag_0() {
    let s = Server::start_default();
    s.subscribe("cli-g", &json!({"topic": "cli-t", "ackTimeoutMs": 60000}));
    let events: Vec<Value> = (0..5)
        .map(|i| event(&format!("f{i}"), "cli.test", json!({ "n": i })))
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("events.jsonl");
    let text = lines_of(&events).replacen('\n', "\n\n", 1);
    std::fs::write(&file, text).expect("write events");
    let file = file.to_str().expect("utf-8 path");

    let out = client(
        &s,
        &["publish", "cli-t", "--file", file, "--batch", "2"],
        None,
    );
    exits(&out, 0, "publish --file");
    assert_eq!(stdout(&out).trim(), "accepted 5, refused 0");
    assert_eq!(
        stderr(&out),
        "",
        "no progress bar when stderr is not a terminal"
    );

    let out = client(&s, &["subscribe", "cli-g", "--json", "--max", "5"], None);
    exits(&out, 0, "subscribe --json --max 5");
    let got: Vec<Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert_eq!(got.len(), 5, "one line per delivery: {got:?}");
    let ids: BTreeSet<&str> = got
        .iter()
        .filter_map(|d| d["event"]["id"].as_str())
        .collect();
    let sent: BTreeSet<String> = (0..5).map(|i| format!("f{i}")).collect();
    assert_eq!(ids, sent.iter().map(String::as_str).collect());
    assert!(got
        .iter()
        .all(|d| d["deliveryId"].is_string() && d["attempt"] == 1));

    let out = client(&s, &["offsets", "--topic", "cli-t", "--json"], None);
    exits(&out, 0, "offsets --json");
    let rows: Value = serde_json::from_str(&stdout(&out)).expect("offsets --json is JSON");
    let rows = rows.as_array().expect("an array of rows");
    let mine: Vec<&Value> = rows.iter().filter(|r| r["group"] == "cli-g").collect();
    assert!(!mine.is_empty(), "{rows:?}");
    assert_eq!(
        mine.iter()
            .map(|r| r["end"].as_u64().unwrap_or(0))
            .sum::<u64>(),
        5
    );
    for r in &mine {
        assert_eq!(r["lag"], 0, "everything ACKed: {r}");
        assert_eq!(r["inFlight"], 0, "{r}");
    }
    assert_eq!(
        s.offsets("cli-t")
            .values()
            .map(|r| r["lag"].as_u64().unwrap_or(9))
            .sum::<u64>(),
        0
    );

    let out = client(&s, &["offsets"], None);
    exits(&out, 0, "offsets");
    let table = stdout(&out);
    let mut lines = table.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "GROUP",
            "TOPIC",
            "PARTITION",
            "WATERMARK",
            "IN_FLIGHT",
            "END",
            "LAG",
            "OWNER"
        ]
    );
    let row: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(row[0], "cli-g", "{table}");
    assert_eq!(row[6], "0", "lag 0: {table}");
}

/// Goal: a publish the server refuses exits 1 and says why, per event, while the good
/// events of the same input are accepted. Method: three lines on stdin (a good event, one
/// without `type`, one that is not JSON) sent as one batch; then a single event to a topic
/// name the server refuses.
#[test]
fn a_refused_publish_exits_1_naming_each_refusal_and_keeps_the_good_events() {
    let s = Server::start_default();
    s.subscribe("r-g", &json!({"topic": "r-t", "startFrom": "earliest"}));
    let good = event("good-1", "cli.test", json!(1));
    let mut bad = event("bad-1", "cli.test", json!(2));
    bad.as_object_mut().expect("object").remove("type");
    let input = format!("{good}\n{bad}\n{{not json\n");
    let out = client(&s, &["publish", "r-t"], Some(&input));
    exits(&out, 1, "publish with refusals");
    assert_eq!(stdout(&out).trim(), "accepted 1, refused 2");
    let err = stderr(&out);
    assert!(
        err.contains("line 2 (id bad-1): 400 invalid-cloudevent"),
        "{err}"
    );
    assert!(
        err.contains("type"),
        "the missing attribute is named: {err}"
    );
    assert!(err.contains("line 3: not JSON"), "{err}");
    assert!(err.contains("2 of 3 event(s) refused"), "{err}");
    let got = s.poll_n("r-g", "c", 1, std::time::Duration::from_secs(60));
    assert_eq!(got[0].event_id(), "good-1", "the good event was published");

    let out = client(&s, &["publish", "no such topic", "--type", "t"], None);
    exits(&out, 1, "publish to a bad topic name");
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.contains("400 invalid-name"), "{err}");
    assert!(err.contains("/v1/topics/no%20such%20topic/events"), "{err}");

    // One event from flags: JSON data, a key; the answer says where it went.
    let out = client(
        &s,
        &[
            "publish",
            "r-t",
            "--type",
            "cli.one",
            "--id",
            "one-1",
            "--data",
            r#"{"a":1}"#,
            "--key",
            "k",
        ],
        None,
    );
    exits(&out, 0, "publish one");
    assert!(
        stdout(&out).starts_with("published one-1 to r-t: partition "),
        "{}",
        stdout(&out)
    );
    let got = s.poll_n("r-g", "c", 1, std::time::Duration::from_secs(60));
    assert_eq!(got[0].event["data"], json!({"a": 1}));
    assert_eq!(got[0].event["partitionkey"], "k");
    assert_eq!(got[0].event["source"], "/unimesh/cli");
}

/// Goal: what the server's dedup window answered without appending is counted apart, so
/// a user re-sending a file sees how much was new. Method: dedup on for topic dd-t;
/// publish three events from a file, then the file again with a fourth line: the closing
/// line, then `--json`, count three duplicates; one event from flags sent twice with the
/// same id is said to be a duplicate the second time. The group gets four events.
#[test]
fn publish_counts_the_repeats_the_dedup_window_answered() {
    let s = Server::start(Options::new().toml("[dedup.topics.dd-t]\nwindow_s = 600\n"));
    s.subscribe("dd-g", &json!({"topic": "dd-t", "ackTimeoutMs": 60000}));
    let mut events: Vec<Value> = (0..3)
        .map(|i| event(&format!("d{i}"), "cli.test", json!(i)))
        .collect();
    let out = client(&s, &["publish", "dd-t"], Some(&lines_of(&events)));
    exits(&out, 0, "first publish");
    assert_eq!(stdout(&out).trim(), "accepted 3, refused 0");

    events.push(event("d3", "cli.test", json!(3)));
    let out = client(&s, &["publish", "dd-t"], Some(&lines_of(&events)));
    exits(&out, 0, "the file again, one line more");
    assert_eq!(
        stdout(&out).trim(),
        "accepted 4 (3 duplicate(s), not appended again), refused 0"
    );
    let out = client(&s, &["publish", "dd-t", "--json"], Some(&lines_of(&events)));
    exits(&out, 0, "the file a third time, --json");
    let v: Value = serde_json::from_str(stdout(&out).trim()).expect("one JSON object");
    assert_eq!(
        (v["accepted"].clone(), v["duplicates"].clone()),
        (json!(4), json!(4))
    );

    let one = ["publish", "dd-t", "--type", "cli.one", "--id", "once"];
    let out = client(&s, &one, None);
    exits(&out, 0, "one event");
    assert!(!stdout(&out).contains("duplicate"), "{}", stdout(&out));
    let out = client(&s, &one, None);
    exits(&out, 0, "the same event again");
    assert!(
        stdout(&out).contains("(a duplicate: the first publish's place, not appended again)"),
        "{}",
        stdout(&out)
    );
    let got = s.poll_n("dd-g", "c", 5, std::time::Duration::from_secs(30));
    let ids: BTreeSet<&str> = got.iter().map(|d| d.event_id()).collect();
    assert_eq!(ids, BTreeSet::from(["d0", "d1", "d2", "d3", "once"]));
    let more = s.poll("dd-g", "c", 10, 500);
    assert!(
        more.is_empty(),
        "appended again: {:?}",
        more.iter().map(|d| d.event_id()).collect::<Vec<_>>()
    );
}

/// Goal: exit 3 when the server cannot be reached, 2 on usage errors, each with one line.
#[test]
fn an_unreachable_server_exits_3_and_usage_errors_exit_2() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr").port()
    };
    let nowhere = format!("http://127.0.0.1:{port}");
    for args in [
        vec!["groups", "--admin", &nowhere],
        vec!["publish", "t", "--type", "x", "--server", &nowhere],
        vec!["subscribe", "g", "--server", &nowhere],
    ] {
        let out = run_with_stdin(&args, &[], None);
        exits(&out, 3, &format!("{args:?}"));
        let err = stderr(&out);
        assert!(
            err.contains("cannot reach the server") && err.contains(&nowhere),
            "{err}"
        );
    }
    // The environment names the server too.
    let out = run_with_stdin(&["offsets"], &[("UNIMESH_ADMIN_URL", &nowhere)], None);
    exits(&out, 3, "UNIMESH_ADMIN_URL");

    for (args, named) in [
        (
            vec!["seek", "g", "--partition", "zero", "--to", "1"],
            "zero",
        ),
        (
            vec!["groups", "--admin", "localhost:8081"],
            "localhost:8081",
        ),
        (
            vec!["publish", "t", "--server", &nowhere],
            "no events to publish",
        ),
        (
            vec!["publish", "t", "--file", "/nonexistent/events"],
            "/nonexistent/events",
        ),
    ] {
        let out = run_with_stdin(&args, &[], None);
        exits(&out, 2, &format!("{args:?}"));
        assert!(stderr(&out).contains(named), "{args:?}: {}", stderr(&out));
    }
}

/// Goal: the operator's commands over the admin API. Method: a group with one attempt
/// dead-letters the event `subscribe --nack` NACKs; `groups` lists it, `dlq browse` shows
/// the dead letter, `dlq replay` delivers it again, `seek` moves the partition back to 0
/// (everything is delivered again), and a group that does not exist is the server's 404 in
/// one line.
#[test]
fn groups_dlq_browse_and_replay_and_seek_drive_the_admin_api() {
    let s = Server::start_default();
    s.subscribe(
        "ops-g",
        &json!({"topic": "ops-t", "maxAttempts": 1, "ackTimeoutMs": 60000}),
    );
    unimesh_tests::published(
        &s.publish_structured("ops-t", &event("o1", "cli.test", json!(1))),
        1,
    );
    // `subscribe --nack` NACKs what it prints: with one attempt, a dead letter.
    let out = client(&s, &["subscribe", "ops-g", "--nack", "--max", "1"], None);
    exits(&out, 0, "subscribe --nack");
    assert!(stdout(&out).contains("cli.test o1"), "{}", stdout(&out));
    unimesh_tests::wait_for(
        "the dead letter",
        std::time::Duration::from_secs(60),
        || {
            let v = s.admin_get("/admin/dlq/ops-g").ok_json(200);
            (v["entries"].as_array().map_or(0, Vec::len) == 1).then_some(())
        },
    );

    let out = client(&s, &["groups"], None);
    exits(&out, 0, "groups");
    let table = stdout(&out);
    assert!(table.starts_with("GROUP"), "{table}");
    let row: Vec<&str> = table
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(&row[..2], ["ops-g", "ops-t"], "{table}");
    let out = client(&s, &["groups", "--json"], None);
    exits(&out, 0, "groups --json");
    let v: Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert_eq!(v[0]["group"], "ops-g");

    let out = client(&s, &["dlq", "browse", "ops-g", "--json"], None);
    exits(&out, 0, "dlq browse --json");
    let v: Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert_eq!(v[0]["event"]["id"], "o1", "{v}");
    assert_eq!(v[0]["reason"], "nacked", "{v}");
    let out = client(&s, &["dlq", "browse", "ops-g"], None);
    exits(&out, 0, "dlq browse");
    assert!(
        stdout(&out)
            .lines()
            .nth(1)
            .is_some_and(|l| l.contains("nacked") && l.contains("o1")),
        "{}",
        stdout(&out)
    );

    let out = client(&s, &["dlq", "replay", "ops-g"], None);
    exits(&out, 0, "dlq replay");
    assert!(
        stdout(&out).contains("replay of 1 dead letter"),
        "{}",
        stdout(&out)
    );
    let again = s.poll_n("ops-g", "c", 1, std::time::Duration::from_secs(60));
    assert_eq!(again[0].event_id(), "o1");
    s.ack("ops-g", &[&again[0].id]).all_ok(1);

    let partition = again[0].partition.to_string();
    let out = client(
        &s,
        &["seek", "ops-g", "--partition", &partition, "--to", "0"],
        None,
    );
    exits(&out, 0, "seek");
    assert_eq!(
        stdout(&out).trim(),
        format!("ops-g: partition {partition} restarts at offset 0")
    );
    let after = s.poll_n("ops-g", "c", 1, std::time::Duration::from_secs(60));
    assert_eq!(after[0].event_id(), "o1", "delivered again after the seek");
    s.ack("ops-g", &[&after[0].id]).all_ok(1);

    // "Replay the last hour": by time, every partition of the group (no --partition).
    let hour_ago = unimesh_tests::seek::rfc3339(unimesh_tests::seek::now_ms() - 3_600_000);
    let out = client(&s, &["seek", "ops-g", "--time", &hour_ago, "--json"], None);
    exits(&out, 0, "seek --time");
    let v: Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    let answers = v.as_array().cloned().unwrap_or_default();
    assert_eq!(
        answers.len(),
        4,
        "one answer per partition of the group: {v}"
    );
    assert!(
        answers
            .iter()
            .all(|a| a["offset"] == 0 && a["time"] == hour_ago.as_str()),
        "{v}"
    );
    let after = s.poll_n("ops-g", "c", 1, std::time::Duration::from_secs(60));
    assert_eq!(
        after[0].event_id(),
        "o1",
        "delivered again after the seek by time"
    );
    let out = client(
        &s,
        &[
            "seek",
            "ops-g",
            "--partition",
            &partition,
            "--time",
            &hour_ago,
        ],
        None,
    );
    exits(&out, 0, "seek --partition --time");
    assert_eq!(
        stdout(&out).trim(),
        format!(
            "ops-g: partition {partition} restarts at offset 0 (the first event at or after {hour_ago})"
        )
    );
    for args in [
        vec!["seek", "ops-g", "--partition", "0"],
        vec!["seek", "ops-g", "--to", "0"],
        vec![
            "seek",
            "ops-g",
            "--partition",
            "0",
            "--to",
            "0",
            "--time",
            &hour_ago,
        ],
    ] {
        exits(&client(&s, &args, None), 2, &format!("{args:?}"));
    }
    let out = client(&s, &["seek", "ops-g", "--time", "an hour ago"], None);
    exits(&out, 1, "a time the server refuses");
    assert!(stderr(&out).contains("RFC 3339"), "{}", stderr(&out));

    let out = client(&s, &["dlq", "browse", "nope"], None);
    exits(&out, 1, "dlq browse of a group that does not exist");
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("404") && err.contains("nope"), "{err}");
}

/// Goal: `--token` reaches the server as a bearer token on every request, and a publish
/// answered 429 is sent again after its `Retry-After`. Method: a stand-in server that
/// records requests answers the first publish 429 (`Retry-After: 0`) and the next 200.
#[test]
fn the_token_is_sent_as_bearer_and_a_rate_limited_publish_is_retried() {
    let hook = Hook::start(|_, n| {
        if n == 0 {
            HookAnswer::status(429).header("retry-after", "0")
        } else {
            HookAnswer::status(200)
        }
    });
    let server = hook.url("");
    let out = run_with_stdin(
        &[
            "publish",
            "t",
            "--type",
            "x",
            "--server",
            server.trim_end_matches('/'),
        ],
        &[("UNIMESH_TOKEN", "s3cret")],
        None,
    );
    exits(&out, 0, "publish through a 429");
    let requests = hook.requests();
    assert_eq!(requests.len(), 2, "{requests:?}");
    for r in &requests {
        assert_eq!(r.path, "/v1/topics/t/events");
        assert_eq!(r.header("authorization"), Some("Bearer s3cret"));
    }
    assert!(
        !stderr(&out).contains("s3cret"),
        "the token is never printed"
    );
}

/// Runs `command` (a shell command line) on a pseudo-terminal through util-linux `script`,
/// so the binary's stdout and stderr are a terminal; what the terminal showed.
fn on_a_terminal(command: &str) -> (Option<i32>, String) {
    let out = Command::new("script")
        .args(["-q", "-e", "-c", command, "/dev/null"])
        .env_remove("UNIMESH_SERVER")
        .env_remove("UNIMESH_ADMIN_URL")
        .env_remove("UNIMESH_TOKEN")
        .env("TERM", "xterm")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("util-linux `script` runs (it is in Debian's bsdutils): {e}"));
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// Goal: on a terminal, `publish` draws a progress bar and `subscribe` a live line that ends
/// as the closing count. Method: both run on a pseudo-terminal (`script`); the terminal's
/// output holds the bar (bytes of the file read) and the count, and the events arrive.
#[test]
fn on_a_terminal_publish_draws_a_progress_bar_and_subscribe_a_live_count() {
    let s = Server::start_default();
    s.subscribe("tty-g", &json!({"topic": "tty-t", "ackTimeoutMs": 60000}));
    let events: Vec<Value> = (0..50)
        .map(|i| {
            event(
                &format!("t{i}"),
                "cli.test",
                json!({ "n": i, "pad": "x".repeat(100) }),
            )
        })
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("events.jsonl");
    std::fs::write(&file, lines_of(&events)).expect("write events");
    let bin = unimesh_bin().display().to_string();
    let server = format!("http://{}", s.http_addr());

    let (code, screen) = on_a_terminal(&format!(
        "'{bin}' publish tty-t --file '{}' --batch 10 --server {server}",
        file.display()
    ));
    assert_eq!(code, Some(0), "{screen}");
    assert!(screen.contains("accepted 50, refused 0"), "{screen}");
    assert!(
        screen.contains("KiB/") && screen.contains('\u{2588}'),
        "a bar of the bytes read: {screen:?}"
    );

    let (code, screen) = on_a_terminal(&format!(
        "'{bin}' subscribe tty-g --max 3 --server {server}"
    ));
    assert_eq!(code, Some(0), "{screen}");
    assert!(screen.contains("tty-g: received 3, ACKed 3"), "{screen:?}");
    assert_eq!(
        screen.matches("cli.test t").count(),
        3,
        "three deliveries printed: {screen:?}"
    );
}
