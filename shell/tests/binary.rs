//! The `unimesh` binary as cargo builds it for the tests. Goal: `unimesh --help` names the
//! `serve` command and `unimesh --version` the package version. Method: run the binary cargo
//! built for this test (`CARGO_BIN_EXE_unimesh`).
//!
//! Being an integration test of this package, it also makes `cargo test --workspace` build
//! the binary with the workspace's test profile and features — the very build the black-box
//! suite in `tests/` asks for (see `unimesh_tests::unimesh_bin`), so a cold test run compiles
//! RocksDB once, not twice.

use std::process::Command;

#[test]
fn help_names_serve_and_version_names_the_package_version() {
    let bin = env!("CARGO_BIN_EXE_unimesh");
    let help = Command::new(bin)
        .arg("--help")
        .output()
        .expect("unimesh runs");
    assert!(help.status.success(), "{help:?}");
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(text.contains("serve"), "{text}");
    let version = Command::new(bin)
        .arg("--version")
        .output()
        .expect("unimesh runs");
    assert!(version.status.success(), "{version:?}");
    let text = String::from_utf8_lossy(&version.stdout);
    assert!(text.contains(env!("CARGO_PKG_VERSION")), "{text}");
}
