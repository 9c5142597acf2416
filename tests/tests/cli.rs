//! The command line without a server: `--print-config` shows the merged configuration
//! (flag > environment > file > default), and a bad configuration stops the process with
//! exit code 2 and a message naming the key, before anything is created on disk.

use std::process::{Command, Output};

use unimesh_tests::unimesh_bin;

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
    // (arguments, environment, what the error must name)
    type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Case> = vec![
        (
            vec!["--config", file.to_str().expect("utf-8 path")],
            vec![],
            "storage.default_partitons",
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
    ];
    for (args, env, named) in cases {
        let out = run(&args, &env, dir.path());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?} {env:?}: {stderr}");
        assert!(
            stderr.contains("configuration error") && stderr.contains(named),
            "{args:?} {env:?} should name {named:?}: {stderr}"
        );
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
