//! The README's curl walkthrough, run as written against a real server, so the README
//! stays true. Only the two ports change (the test server listens on free ones).

use std::process::Command;

use unimesh_tests::Server;

/// The `sh` block that follows "subscribe, publish, poll, ACK" in the README.
fn walkthrough() -> String {
    let readme = include_str!("../../README.md");
    let (_, after) = readme
        .split_once("subscribe, publish, poll, ACK")
        .expect("the README has the walkthrough");
    let (_, block) = after.split_once("```sh\n").expect("a sh block follows");
    let (block, _) = block.split_once("```").expect("the block ends");
    block.to_owned()
}

#[test]
fn the_readme_walkthrough_works_as_written() {
    let script = walkthrough();
    assert!(script.contains("localhost:8080") && script.contains("localhost:8081"));
    let s = Server::start_default();
    let script = script
        .replace("localhost:8080", &s.http_addr().to_string())
        .replace("localhost:8081", &s.admin_addr().to_string());
    for tool in ["curl", "python3"] {
        let found = Command::new(tool).arg("--version").output();
        assert!(
            found.is_ok_and(|o| o.status.success()),
            "the walkthrough needs {tool} on PATH"
        );
    }
    let out = Command::new("bash")
        .arg("-c")
        .arg(format!("set -euo pipefail\n{script}"))
        .output()
        .expect("bash runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{script}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    // The ACK was accepted, and the group's progress shows the one event done.
    assert!(stdout.contains("\"acked\""), "{stdout}");
    let offsets = s.offsets("orders");
    let done: u64 = offsets
        .iter()
        .filter(|((g, _), _)| g == "billing")
        .filter_map(|(_, row)| row["watermark"].as_u64())
        .sum();
    assert_eq!(done, 1, "{offsets:?}\n{stdout}");
}
