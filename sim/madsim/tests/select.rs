//! Every `tokio::select!` in code the madsim harness runs is `biased`.
//!
//! An unbiased `select!` polls its branches in an order drawn from tokio's thread-local
//! generator, whose seed hashes a process-wide counter: madsim does not seed it, so the
//! second run of a seed in one process (a determinism check, a sweep's replay) polls in
//! another order than the first and can take another path. That is how the stream clients
//! first replayed differently on Kafka (seeds 1-4 of `kafka_same_seed_same_trace`).
//!
//! A source check, not a run: it holds for every seed, and runs in a plain build too.

use std::path::{Path, PathBuf};

/// Files with a `select!` that the harness never runs, and why. Everything else under the
/// scanned folders is taken to run under madsim.
const NOT_SIMULATED: &[(&str, &str)] = &[
    ("shell/src/main.rs", "the binary: signals and listeners"),
    ("shell/src/http/server.rs", "hyper's accept loop"),
    ("shell/src/http/console.rs", "the console's SSE route"),
    (
        "shell/src/http/streams.rs",
        "the SSE and WebSocket routes (axum runs on tokio itself); the harness drives their session API",
    ),
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            // Unit tests run on tokio, not under the harness.
            if p.file_name().is_some_and(|n| n == "tests") {
                continue;
            }
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs")
            && p.file_name().is_some_and(|n| n != "tests.rs")
        {
            out.push(p);
        }
    }
}

/// `select!` sites not followed by `biased;` before their first branch, as `path:line`.
fn unbiased(root: &Path, file: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(file) else {
        return vec![format!("{}: unreadable", file.display())];
    };
    let rel = file
        .strip_prefix(root)
        .unwrap_or(file)
        .display()
        .to_string();
    let lines: Vec<&str> = text.lines().collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        if !code.contains("select!") {
            continue;
        }
        let next = lines
            .iter()
            .skip(i + 1)
            .map(|l| l.trim())
            .find(|l| !l.is_empty() && !l.starts_with("//"));
        if next != Some("biased;") {
            found.push(format!("{rel}:{}", i + 1));
        }
    }
    found
}

#[test]
fn every_select_the_harness_runs_is_biased() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    for dir in ["shell/src", "sim/madsim/src"] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(
        files.len() > 20,
        "the scan found only {} files under {}",
        files.len(),
        root.display()
    );
    let mut sites = Vec::new();
    let mut exempt_seen = Vec::new();
    for f in &files {
        let found = unbiased(&root, f);
        let rel = f.strip_prefix(&root).unwrap_or(f).display().to_string();
        if NOT_SIMULATED.iter().any(|(p, _)| *p == rel) {
            exempt_seen.push(rel);
            continue;
        }
        sites.extend(found);
    }
    assert!(
        sites.is_empty(),
        "unbiased `select!` in code the madsim harness runs (add `biased;` and order the \
         branches on purpose): {sites:?}"
    );
    // An exemption for a file that is gone would hide a new one of the same name.
    for (p, why) in NOT_SIMULATED {
        assert!(
            exempt_seen.iter().any(|s| s == p),
            "{p} is exempt ({why}) but was not found"
        );
    }
}

#[test]
fn the_check_sees_an_unbiased_select() {
    let dir = std::env::temp_dir().join(format!("select-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let f = dir.join("a.rs");
    std::fs::write(
        &f,
        "async fn a() {\n    tokio::select! {\n        _ = x() => {}\n    }\n    tokio::select! {\n        // first\n        biased;\n        _ = y() => {}\n    }\n}\n",
    )
    .expect("write");
    let found = unbiased(&dir, &f);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(found, vec!["a.rs:2".to_owned()]);
}
