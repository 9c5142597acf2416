//! A real Kafka-protocol broker for the black-box tests: `tansu` (an Apache Kafka-compatible
//! broker in Rust, `cargo install tansu --features dynostore`), one process per test on a
//! free loopback port with in-memory storage, stopped when dropped.
//!
//! The binary is `UNIMESH_TANSU` if set, else `tansu` on `PATH`, else
//! `/var/tmp/tansu-install/bin/tansu` (where `.ci/run` installs it). Without it the Kafka
//! tests fail, saying how to install it — never a silent pass.

use std::fs::File;
use std::io::{BufRead as _, BufReader, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::Options;

/// How long tansu may take to accept connections.
const BROKER_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The tansu binary, or a panic saying how to get one.
pub fn tansu_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("UNIMESH_TANSU") {
        return PathBuf::from(p);
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join("tansu");
            if p.is_file() {
                return p;
            }
        }
    }
    let p = PathBuf::from("/var/tmp/tansu-install/bin/tansu");
    if p.is_file() {
        return p;
    }
    panic!(
        "the Kafka tests need the tansu broker: `cargo install tansu --locked --features \
         dynostore --root /var/tmp/tansu-install` (.ci/run does this), or set UNIMESH_TANSU"
    )
}

/// One tansu broker on 127.0.0.1, in memory (or the mock cluster).
pub struct Broker {
    child: Option<Child>,
    addr: SocketAddr,
    log: PathBuf,
    /// The mock cluster's command channel (its stdin, and its stdout for the answers).
    mock: Option<Mutex<(ChildStdin, BufReader<ChildStdout>)>>,
    _dir: tempfile::TempDir,
}

impl Broker {
    /// A tansu broker, or librdkafka's mock cluster when `UNIMESH_TEST_BROKER=mock` (a
    /// second implementation of the protocol; see `tests/python/mock_kafka.py`).
    pub fn start() -> Self {
        match std::env::var("UNIMESH_TEST_BROKER").as_deref() {
            Ok("mock") => Self::start_mock(),
            _ => Self::start_tansu(),
        }
    }

    /// librdkafka's mock cluster in a Python confluent-kafka process.
    pub fn start_mock() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("kafka-mock-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temporary directory: {e}"));
        let log = dir.path().join("mock.log");
        let err = File::create(&log).unwrap_or_else(|e| panic!("cannot create the log: {e}"));
        let script = crate::package_dir().join("python/mock_kafka.py");
        let mut child = Command::new(std::env::var("PYTHON").unwrap_or_else(|_| "python3".into()))
            .arg(&script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        let mut line = String::new();
        let (Some(input), Some(out)) = (child.stdin.take(), child.stdout.take()) else {
            panic!("the mock cluster's pipes were not opened");
        };
        let mut out = BufReader::new(out);
        let _ = out.read_line(&mut line);
        let addr: SocketAddr = line.trim().parse().unwrap_or_else(|_| {
            let _ = child.kill();
            panic!(
                "the mock cluster printed no address ({line:?}); needs python3 with confluent-kafka:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        });
        Broker {
            child: Some(child),
            addr,
            log,
            mock: Some(Mutex::new((input, out))),
            _dir: dir,
        }
    }

    /// Whether this is the mock cluster (which can do what tansu cannot: a new leader
    /// epoch on demand).
    pub fn is_mock(&self) -> bool {
        self.mock.is_some()
    }

    /// Elects the partition's leader again (the mock cluster only): records appended from
    /// now on carry a new leader epoch, as after a failover.
    pub fn new_leader_epoch(&self, topic: &str, partition: u32) {
        self.command(&format!("leader {topic} {partition}"));
    }

    /// The next `count` requests of Kafka API `api_key` (2: ListOffsets) that reach the
    /// mock cluster, from any client, are answered with error `code` (6: not leader for
    /// partition, which librdkafka's offset queries return as they are).
    pub fn fail_requests(&self, api_key: i16, code: i32, count: usize) {
        self.command(&format!("errors {api_key} {code} {count}"));
    }

    /// Drops the errors still queued for API `api_key` ([`Self::fail_requests`]).
    pub fn clear_request_errors(&self, api_key: i16) {
        self.command(&format!("clear {api_key}"));
    }

    /// One command to the mock cluster's process, answered "ok".
    fn command(&self, line: &str) {
        let Some(mock) = &self.mock else {
            panic!("only the mock cluster takes commands ({line})");
        };
        let mut guard = mock.lock().unwrap_or_else(|p| p.into_inner());
        let (input, out) = &mut *guard;
        writeln!(input, "{line}")
            .and_then(|()| input.flush())
            .unwrap_or_else(|e| panic!("cannot command the mock cluster: {e}"));
        let mut answer = String::new();
        let _ = out.read_line(&mut answer);
        assert_eq!(answer.trim(), "ok", "the mock cluster refused `{line}`");
    }

    fn start_tansu() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("tansu-test-")
            .tempdir()
            .unwrap_or_else(|e| panic!("cannot create a temporary directory: {e}"));
        let addr = match TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()) {
            Ok(a) => a,
            Err(e) => panic!("cannot find a free port: {e}"),
        };
        let log = dir.path().join("tansu.log");
        let out = File::create(&log).unwrap_or_else(|e| panic!("cannot create the log: {e}"));
        let err = out
            .try_clone()
            .unwrap_or_else(|e| panic!("cannot share the log: {e}"));
        let url = format!("tcp://{addr}");
        let bin = tansu_bin();
        let child = Command::new(&bin)
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
            ])
            .args(["--storage-engine", "memory://tansu/"])
            .current_dir(dir.path())
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
        let mut b = Broker {
            child: Some(child),
            addr,
            log,
            mock: None,
            _dir: dir,
        };
        let started = Instant::now();
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if let Some(Ok(Some(status))) = b.child.as_mut().map(Child::try_wait) {
                panic!("tansu exited at start ({status}):\n{}", b.log_text());
            }
            assert!(
                started.elapsed() < BROKER_READY_TIMEOUT,
                "tansu did not listen on {addr} within {BROKER_READY_TIMEOUT:?}:\n{}",
                b.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        b
    }

    /// The broker process's id (a measurement reads its CPU time from /proc).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `HOST:PORT` for `bootstrap.servers`.
    pub fn brokers(&self) -> String {
        self.addr.to_string()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Server options for a `unimesh serve --storage kafka` on this broker, named
    /// `instance`.
    pub fn server_options(&self, instance: &str, partitions: u32) -> Options {
        Options::new().toml(&self.server_toml(instance, partitions))
    }

    /// The TOML of [`Broker::server_options`] (top-level keys must come before it).
    pub fn server_toml(&self, instance: &str, partitions: u32) -> String {
        format!(
            "[storage]\nbackend = \"kafka\"\ndefault_partitions = {partitions}\n\
             [kafka]\nbrokers = \"{}\"\ninstance = \"{instance}\"\nrequest_timeout_ms = 10000\n",
            self.brokers()
        )
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            eprintln!("--- broker log ---\n{}", self.log_text());
        }
    }
}
