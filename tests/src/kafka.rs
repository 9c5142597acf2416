//! A real Kafka-protocol broker for the black-box tests: `tansu` (an Apache Kafka-compatible
//! broker in Rust, `cargo install tansu --features dynostore`), one process per test on a
//! free loopback port with in-memory storage, stopped when dropped.
//!
//! [`Broker::start_behind_proxy`] puts a fault-injecting proxy ([`crate::proxy::Proxy`])
//! in front of it: the broker advertises the proxy's address (tansu through
//! `--advertised-listener-url`, the mock cluster through
//! `rd_kafka_mock_broker_set_host_port`), so every connection a client makes, bootstrap
//! and after, goes through the proxy; [`Broker::restart_empty`] restarts it with nothing.
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

use crate::proxy::Proxy;
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
    /// Where the broker listens.
    addr: SocketAddr,
    /// The proxy in front of it, when started behind one (then what clients are given).
    proxy: Option<Proxy>,
    log: PathBuf,
    /// The mock cluster's command channel (its stdin, and its stdout for the answers).
    mock: Option<MockPipes>,
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
        let dir = temp_dir("kafka-mock-");
        let (child, addr, log, mock) = spawn_mock(dir.path());
        Broker {
            child: Some(child),
            addr,
            proxy: None,
            log,
            mock: Some(mock),
            _dir: dir,
        }
    }

    /// A broker ([`Broker::start`]'s choice) behind a fault-injecting proxy that it
    /// advertises: [`Broker::proxy`] cuts, delays, drops and resets what clients send it,
    /// and [`Broker::brokers`] names the proxy.
    pub fn start_behind_proxy() -> Self {
        if std::env::var("UNIMESH_TEST_BROKER").as_deref() == Ok("mock") {
            Self::start_mock_behind_proxy()
        } else {
            // The proxy first (it connects upstream only when a client comes), so tansu
            // can be told to advertise it.
            Self::start_tansu_behind(Proxy::start(free_port()))
        }
    }

    /// librdkafka's mock cluster behind a fault-injecting proxy that it advertises.
    pub fn start_mock_behind_proxy() -> Self {
        let mut b = Self::start_mock();
        b.proxy = Some(Proxy::start(b.addr));
        b.advertise_proxy();
        b
    }

    /// The proxy in front of the broker (panics when it was started without one).
    pub fn proxy(&self) -> &Proxy {
        self.proxy
            .as_ref()
            .unwrap_or_else(|| panic!("this broker was not started behind a proxy"))
    }

    /// Stops the broker and starts a fresh one with nothing in it (no topics, no groups,
    /// no offsets) behind the same proxy, which the new one advertises again. Only for a
    /// broker behind a proxy: the proxy's address is all clients know.
    pub fn restart_empty(&mut self) {
        let advertised = self.proxy().addr();
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.proxy().reset();
        if self.mock.is_some() {
            let (child, addr, log, mock) = spawn_mock(self._dir.path());
            self.child = Some(child);
            self.addr = addr;
            self.log = log;
            self.mock = Some(mock);
            self.proxy().set_upstream(addr);
            self.advertise_proxy();
        } else {
            // A new port: the old one may linger in TIME_WAIT.
            let addr = free_port();
            self.proxy().set_upstream(addr);
            let (child, log) = spawn_tansu(self._dir.path(), addr, advertised);
            self.child = Some(child);
            self.addr = addr;
            self.log = log;
        }
    }

    /// Tells the mock cluster to advertise the proxy.
    fn advertise_proxy(&self) {
        let proxy = self.proxy().addr();
        self.mock_command(&format!("advertise {} {}", proxy.ip(), proxy.port()));
    }

    /// One command to the mock cluster, which must answer `ok`.
    fn mock_command(&self, command: &str) {
        let Some(mock) = &self.mock else {
            panic!("only the mock cluster takes commands ({command})");
        };
        let mut guard = mock.lock().unwrap_or_else(|p| p.into_inner());
        let (input, out) = &mut *guard;
        writeln!(input, "{command}")
            .and_then(|()| input.flush())
            .unwrap_or_else(|e| panic!("cannot command the mock cluster: {e}"));
        let mut answer = String::new();
        let _ = out.read_line(&mut answer);
        assert_eq!(answer.trim(), "ok", "the mock cluster refused {command:?}");
    }

    /// Whether this is the mock cluster (which can do what tansu cannot: a new leader
    /// epoch on demand).
    pub fn is_mock(&self) -> bool {
        self.mock.is_some()
    }

    /// Elects the partition's leader again (the mock cluster only): records appended from
    /// now on carry a new leader epoch, as after a failover.
    pub fn new_leader_epoch(&self, topic: &str, partition: u32) {
        assert!(
            self.mock.is_some(),
            "only the mock cluster starts a new leader epoch on demand"
        );
        self.mock_command(&format!("leader {topic} {partition}"));
    }

    /// The next `count` requests of Kafka API `api_key` (2: ListOffsets) that reach the
    /// mock cluster, from any client, are answered with error `code` (6: not leader for
    /// partition, which librdkafka's offset queries return as they are).
    pub fn fail_requests(&self, api_key: i16, code: i32, count: usize) {
        assert!(
            self.mock.is_some(),
            "only the mock cluster fails requests on demand"
        );
        self.mock_command(&format!("errors {api_key} {code} {count}"));
    }

    /// Drops the errors still queued for API `api_key` ([`Self::fail_requests`]).
    pub fn clear_request_errors(&self, api_key: i16) {
        assert!(
            self.mock.is_some(),
            "only the mock cluster fails requests on demand"
        );
        self.mock_command(&format!("clear {api_key}"));
    }

    /// A tansu broker, whatever `UNIMESH_TEST_BROKER` says.
    pub fn start_tansu() -> Self {
        Self::start_tansu_on(free_port())
    }

    /// A tansu broker listening on `addr` (a mesh may have been told it before it listens).
    pub fn start_tansu_on(addr: SocketAddr) -> Self {
        let dir = temp_dir("tansu-test-");
        let (child, log) = spawn_tansu(dir.path(), addr, addr);
        Broker {
            child: Some(child),
            addr,
            proxy: None,
            log,
            mock: None,
            _dir: dir,
        }
    }

    /// tansu listening on a port of its own and advertising the proxy in front of it.
    fn start_tansu_behind(proxy: Proxy) -> Self {
        let dir = temp_dir("tansu-test-");
        let (child, log) = spawn_tansu(dir.path(), proxy.upstream(), proxy.addr());
        Broker {
            child: Some(child),
            addr: proxy.upstream(),
            proxy: Some(proxy),
            log,
            mock: None,
            _dir: dir,
        }
    }

    /// The broker process's id (a measurement reads its CPU time from /proc).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `HOST:PORT` for `bootstrap.servers` (the proxy's, behind one).
    pub fn brokers(&self) -> String {
        self.proxy
            .as_ref()
            .map_or(self.addr, Proxy::addr)
            .to_string()
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

fn temp_dir(prefix: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .unwrap_or_else(|e| panic!("cannot create a temporary directory: {e}"))
}

/// A loopback address nothing listens on (the port was free a moment ago).
pub fn free_port() -> SocketAddr {
    match TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()) {
        Ok(a) => a,
        Err(e) => panic!("cannot find a free port: {e}"),
    }
}

/// The log file of a broker process in `dir`, its n-th: a restarted broker gets a new one,
/// so a failure shows what the last one said.
fn next_log(dir: &std::path::Path, name: &str) -> PathBuf {
    (0..)
        .map(|n| dir.join(format!("{name}.{n}.log")))
        .find(|p| !p.exists())
        .unwrap_or_else(|| dir.join(format!("{name}.log")))
}

/// A tansu process in memory listening on `listen` and advertising `advertise`, once it
/// accepts connections.
fn spawn_tansu(
    dir: &std::path::Path,
    listen: SocketAddr,
    advertise: SocketAddr,
) -> (Child, PathBuf) {
    let log = next_log(dir, "tansu");
    let out = File::create(&log).unwrap_or_else(|e| panic!("cannot create the log: {e}"));
    let err = out
        .try_clone()
        .unwrap_or_else(|e| panic!("cannot share the log: {e}"));
    let bin = tansu_bin();
    let mut child = Command::new(&bin)
        .args(["broker", "--listener-url", &format!("tcp://{listen}")])
        .args(["--advertised-listener-url", &format!("tcp://{advertise}")])
        .args(["--storage-engine", "memory://tansu/"])
        .current_dir(dir)
        // `UNIMESH_TEST_TANSU_LOG=FILTER`: tansu's log filter (its group coordinator logs
        // evictions at info, its requests at debug).
        .env(
            "RUST_LOG",
            std::env::var("UNIMESH_TEST_TANSU_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    let started = Instant::now();
    while TcpStream::connect_timeout(&listen, Duration::from_millis(200)).is_err() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("tansu exited at start ({status}):\n{}", text());
        }
        if started.elapsed() > BROKER_READY_TIMEOUT {
            let _ = child.kill();
            panic!(
                "tansu did not listen on {listen} within {BROKER_READY_TIMEOUT:?}:\n{}",
                text()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    (child, log)
}

type MockPipes = Mutex<(ChildStdin, BufReader<ChildStdout>)>;

/// librdkafka's mock cluster (`tests/python/mock_kafka.py`) and the address it printed.
fn spawn_mock(dir: &std::path::Path) -> (Child, SocketAddr, PathBuf, MockPipes) {
    let log = next_log(dir, "mock");
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
    (child, addr, log, Mutex::new((input, out)))
}
