//! Harness for black-box tests of the real `unimesh` binary over HTTP.
//!
//! - [`unimesh_bin`] finds the binary (`UNIMESH_BIN`) or builds it once per test process with
//!   the cargo that runs the tests, in the profile of the test binary itself (release when the
//!   test binary's path says so), into the same target directory.
//! - [`Server`] runs one `unimesh serve` on a temporary data directory and free ports, waits
//!   until `/admin/ready` answers, keeps its stderr in a file (printed when a test panics),
//!   and can be killed with SIGKILL ([`Server::kill9`]), stopped with SIGTERM
//!   ([`Server::terminate`]) and started again on the same data ([`Server::restart`]).
//! - [`Call`]/[`Resp`] are a small blocking HTTP client (ureq) that never turns a status into
//!   an error, so every test can assert on statuses and bodies; [`Server`] has helpers for
//!   the routes of docs/DESIGN.md §5.1 (publish in each mode, subscribe, poll, ACK/NACK/extend,
//!   admin).
//!
//! Nothing here asserts on time: waits are bounded loops whose bound only turns a hang into a
//! clear failure.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read as _;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub mod hook;
pub mod sse;

pub use serde_json::{json, Value};

pub mod kafka;
pub mod load;
pub mod pair;
pub mod pki;
pub mod proxy;
pub mod seek;

/// How long a server may take to answer `/admin/ready` after it was started. Generous: a
/// debug build opening RocksDB on a loaded two-core machine can take seconds.
pub const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// How long any one HTTP request may take before the test fails (long-polls included).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// How long SIGTERM may take to stop the server.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(60);

/// Largest response body read.
const MAX_RESPONSE_BYTES: u64 = 256 << 20;

// ----- the binary -----

/// This package's directory (`tests/`) in the checkout being tested: the one cargo names at
/// run time first. Cargo fingerprints workspace paths relative to the workspace root, so a
/// target directory shared by two clones (as `.ci/run` allows) can hand a test binary over
/// with the other clone's compile-time `CARGO_MANIFEST_DIR` baked in.
pub fn package_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// The path of the `unimesh` binary: `UNIMESH_BIN` if set, otherwise built (once per
/// process) by cargo, release when this test binary is a release build. Panics with cargo's
/// output when the build fails.
pub fn unimesh_bin() -> &'static Path {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match BIN.get_or_init(find_or_build) {
        Ok(p) => p,
        Err(e) => panic!("cannot get the unimesh binary: {e}"),
    }
}

/// The build of the binary that `cargo test --workspace` makes anyway: the binary as the
/// dependency of the shell's own integration test `binary`, with the whole workspace
/// selected. Same profile (`test`) and same unified features as the test build, so the
/// binary reuses its RocksDB instead of compiling a second one (`cargo build -p
/// unimesh-shell` resolves features for one package in the `dev` profile: a cold CI run
/// compiled RocksDB twice).
const BUILD_ARGS: [&str; 6] = [
    "test",
    "--workspace",
    "--no-run",
    "--test",
    "binary",
    "--message-format=json-render-diagnostics",
];

fn find_or_build() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("UNIMESH_BIN") {
        let p = PathBuf::from(p);
        if !p.is_file() {
            return Err(format!("UNIMESH_BIN={} is not a file", p.display()));
        }
        eprintln!("unimesh binary (UNIMESH_BIN): {}", p.display());
        return Ok(p);
    }
    let manifest = package_dir().join("../Cargo.toml");
    let release = built_as_release();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build.args(BUILD_ARGS).arg("--manifest-path").arg(&manifest);
    // Cargo runs a test with the test package's own variables (CARGO_PKG_NAME,
    // CARGO_MANIFEST_DIR, ...). Build scripts that watch those names (ring's does) would see
    // them change between this build and the outer `cargo test`, and each would rebuild
    // ring, rustls, jsonwebtoken and the shell for the other: the build runs without them.
    for (name, _) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        if is_test_package_variable(name) {
            build.env_remove(name);
        }
    }
    if release {
        build.arg("--release");
    }
    // Build into the target directory this test binary was built in, so an up-to-date
    // binary costs a no-op build — also when the test binary is run by hand without the
    // CARGO_TARGET_DIR it was built with (a fresh target directory means a long RocksDB build).
    if std::env::var_os("CARGO_TARGET_DIR").is_none() {
        if let Some(dir) = own_target_dir() {
            build.arg("--target-dir").arg(dir);
        }
    }
    let shown = format!(
        "cargo {} --manifest-path {}{}",
        BUILD_ARGS.join(" "),
        manifest.display(),
        if release { " --release" } else { "" }
    );
    eprintln!("building unimesh: {shown}");
    let out = build
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("`{shown}` did not start: {e}"))?;
    if !out.status.success() {
        return Err(format!("`{shown}` failed ({})", out.status));
    }
    let path = built_executable(&String::from_utf8_lossy(&out.stdout), "unimesh")
        .ok_or_else(|| format!("`{shown}` reported no `unimesh` executable"))?;
    eprintln!("unimesh binary: {}", path.display());
    Ok(path)
}

/// A variable cargo sets for the test binary it runs, describing the test package (not one
/// that configures cargo, such as `CARGO_TARGET_DIR` or `CARGO_HOME`).
fn is_test_package_variable(name: &str) -> bool {
    [
        "CARGO_PKG_",
        "CARGO_MANIFEST_",
        "CARGO_CRATE_",
        "CARGO_BIN_",
    ]
    .iter()
    .any(|p| name.starts_with(p))
        || matches!(
            name,
            "CARGO_PRIMARY_PACKAGE" | "CARGO_TARGET_TMPDIR" | "OUT_DIR" | "CARGO_RUSTC_CURRENT_DIR"
        )
}

/// The executable of the binary target `name` among cargo's JSON messages.
fn built_executable(messages: &str, name: &str) -> Option<PathBuf> {
    messages
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .filter(|m| {
            m["target"]["name"] == name
                && m["target"]["kind"]
                    .as_array()
                    .is_some_and(|k| k.iter().any(|k| k == "bin"))
        })
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
}

/// The cargo target directory holding the running test binary: the nearest ancestor with
/// cargo's `CACHEDIR.TAG` (`<target>/<profile>/deps/<test>`, or `<target>/<triple>/...`).
fn own_target_dir() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    exe.ancestors()
        .skip(1)
        .take(4)
        .find(|d| d.join("CACHEDIR.TAG").is_file())
        .map(Path::to_path_buf)
}

/// Whether the running test (or example) binary was built in the release profile: its path
/// is `<target>/release/deps/<name>` (tests) or `<target>/release/examples/<name>`.
pub fn built_as_release() -> bool {
    // A test binary is `<profile>/deps/<name>`, a binary or example `<profile>/<name>` or
    // `<profile>/examples/<name>`.
    std::env::current_exe().ok().is_some_and(|exe| {
        exe.ancestors()
            .skip(1)
            .take(2)
            .any(|d| d.file_name().is_some_and(|n| n == "release"))
    })
}

// ----- HTTP -----

/// A blocking HTTP agent that reports every status as a response, with no proxy (a CI
/// proxy variable must not capture requests to 127.0.0.1).
pub fn agent() -> ureq::Agent {
    agent_with(None, None)
}

/// [`agent`], trusting the CA certificates of the PEM file `ca` for `https://` (rustls on
/// `ring`, as the mesh) and sending `Authorization: Bearer TOKEN` with every request.
pub fn agent_with(ca: Option<&Path>, bearer: Option<&str>) -> ureq::Agent {
    let mut config = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .proxy(None)
        .timeout_global(Some(REQUEST_TIMEOUT))
        .max_idle_connections(256)
        .max_idle_connections_per_host(256);
    if let Some(ca) = ca {
        use ureq::tls::{PemItem, RootCerts, TlsConfig};
        let pem = std::fs::read(ca).unwrap_or_else(|e| panic!("cannot read {}: {e}", ca.display()));
        let certs: Vec<_> = ureq::tls::parse_pem(&pem)
            .filter_map(|item| match item {
                Ok(PemItem::Certificate(c)) => Some(c),
                _ => None,
            })
            .collect();
        assert!(!certs.is_empty(), "no CERTIFICATE in {}", ca.display());
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        config = config.tls_config(
            TlsConfig::builder()
                .unversioned_rustls_crypto_provider(provider)
                .root_certs(RootCerts::from(certs))
                .build(),
        );
    }
    if let Some(token) = bearer {
        let value = ureq::http::HeaderValue::from_str(&format!("Bearer {token}"))
            .unwrap_or_else(|e| panic!("the token cannot be a header value: {e}"));
        config = config.middleware(
            move |mut req: ureq::http::Request<ureq::SendBody>,
                  next: ureq::middleware::MiddlewareNext| {
                req.headers_mut()
                    .insert(ureq::http::header::AUTHORIZATION, value.clone());
                next.handle(req)
            },
        );
    }
    built(config.build())
}

/// An agent of `config` that resolves IP literals without a thread ([`Literal`]).
fn built(config: ureq::config::Config) -> ureq::Agent {
    ureq::Agent::with_parts(
        config,
        ureq::unversioned::transport::DefaultConnector::new(),
        Literal(ureq::unversioned::resolver::DefaultResolver::default()),
    )
}

/// ureq's resolver, except that an address that is an IP literal (as every address of
/// these tests and of the load client is) is taken as it is. ureq resolves the host of
/// every request, a pooled connection's too, and with a timeout set it does so on a new
/// thread: a thread per request was most of the load client's CPU per one-event publish
/// (`perf record -a` beside `examples/load --batch 1`: clone3, copy_process, do_exit,
/// mprotect), CPU taken from the server on two cores.
#[derive(Debug)]
struct Literal(ureq::unversioned::resolver::DefaultResolver);

impl ureq::unversioned::resolver::Resolver for Literal {
    fn resolve(
        &self,
        uri: &ureq::http::Uri,
        config: &ureq::config::Config,
        timeout: ureq::unversioned::transport::NextTimeout,
    ) -> Result<ureq::unversioned::resolver::ResolvedSocketAddrs, ureq::Error> {
        let port = uri.port_u16().or(match uri.scheme_str() {
            Some("https") | Some("wss") => Some(443),
            Some("http") | Some("ws") => Some(80),
            _ => None,
        });
        let ip = uri
            .host()
            .map(|h| h.trim_start_matches('[').trim_end_matches(']'))
            .and_then(|h| h.parse::<std::net::IpAddr>().ok());
        match (ip, port) {
            (Some(ip), Some(port)) => {
                let mut addrs = self.empty();
                addrs.push(std::net::SocketAddr::new(ip, port));
                Ok(addrs)
            }
            _ => self.0.resolve(uri, config, timeout),
        }
    }
}

/// One request being built.
#[must_use]
pub struct Call {
    agent: ureq::Agent,
    method: String,
    url: String,
    headers: Vec<(String, String)>,
    body: Option<Vec<u8>>,
    /// Send the body with `transfer-encoding: chunked` (no `content-length`).
    chunked: bool,
}

impl Call {
    pub fn new(agent: &ureq::Agent, method: &str, url: impl Into<String>) -> Self {
        Self {
            agent: agent.clone(),
            method: method.to_owned(),
            url: url.into(),
            headers: Vec::new(),
            body: None,
            chunked: false,
        }
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = Some(body.into());
        self
    }

    /// A body sent in chunks without `content-length`, so the server cannot refuse it by its
    /// declared size and must count while reading.
    pub fn chunked_body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.body = Some(body.into());
        self.chunked = true;
        self
    }

    /// A JSON body with `content-type: application/json`.
    pub fn json(self, value: &Value) -> Self {
        self.header("content-type", "application/json")
            .body(value.to_string())
    }

    /// Sends the request; a transport failure is an `Err` naming the request.
    pub fn try_send(self) -> Result<Resp, String> {
        let what = format!("{} {}", self.method, self.url);
        let mut builder = ureq::http::Request::builder()
            .method(self.method.as_str())
            .uri(&self.url);
        for (k, v) in &self.headers {
            builder = builder.header(k.as_str(), v.as_str());
        }
        let result = match self.body {
            Some(b) if self.chunked => builder
                .body(ureq::SendBody::from_owned_reader(std::io::Cursor::new(b)))
                .map_err(|e| format!("{what}: cannot build the request: {e}"))
                .and_then(|r| self.agent.run(r).map_err(|e| format!("{what}: {e}"))),
            Some(b) => builder
                .body(b)
                .map_err(|e| format!("{what}: cannot build the request: {e}"))
                .and_then(|r| self.agent.run(r).map_err(|e| format!("{what}: {e}"))),
            None => builder
                .body(())
                .map_err(|e| format!("{what}: cannot build the request: {e}"))
                .and_then(|r| self.agent.run(r).map_err(|e| format!("{what}: {e}"))),
        };
        let mut response = result?;
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_ascii_lowercase(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        let body = response
            .body_mut()
            .with_config()
            .limit(MAX_RESPONSE_BYTES)
            .read_to_vec()
            .map_err(|e| format!("{what}: reading the answer: {e}"))?;
        Ok(Resp {
            what,
            status,
            headers,
            body,
        })
    }

    /// Sends the request; panics on a transport failure.
    pub fn send(self) -> Resp {
        match self.try_send() {
            Ok(r) => r,
            Err(e) => panic!("request failed: {e}"),
        }
    }
}

/// An answer: status, headers (names lower-case) and body.
#[derive(Clone, Debug)]
pub struct Resp {
    /// `METHOD url`, for messages.
    pub what: String,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON; panics (showing the body) if it is not.
    pub fn json(&self) -> Value {
        match serde_json::from_slice(&self.body) {
            Ok(v) => v,
            Err(e) => panic!(
                "{} answered {} with a body that is not JSON ({e}): {}",
                self.what,
                self.status,
                self.text()
            ),
        }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    /// Asserts the status, showing the body when it differs.
    pub fn expect(&self, status: u16) -> &Self {
        assert_eq!(
            self.status,
            status,
            "{} answered {} (expected {status}): {}",
            self.what,
            self.status,
            self.text()
        );
        self
    }

    /// Asserts the status and JSON body of an answer that must succeed.
    pub fn ok_json(&self, status: u16) -> Value {
        self.expect(status);
        self.json()
    }

    /// Asserts a docs/DESIGN.md §5.1 error: this status, a JSON object of exactly two strings
    /// `error` (this code) and `message` (not empty). Returns the message.
    pub fn expect_error(&self, status: u16, code: &str) -> String {
        self.expect(status);
        let v = self.json();
        let obj = v
            .as_object()
            .unwrap_or_else(|| panic!("{}: error body is not an object: {v}", self.what));
        assert_eq!(
            obj.len(),
            2,
            "{}: error body has other members than error and message: {v}",
            self.what
        );
        assert_eq!(
            obj.get("error").and_then(Value::as_str),
            Some(code),
            "{}: wrong error code: {v}",
            self.what
        );
        let message = obj
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or_else(|| panic!("{}: no message string: {v}", self.what));
        assert!(!message.trim().is_empty(), "{}: empty message", self.what);
        if let Some(ct) = self.header("content-type") {
            assert!(
                ct.starts_with("application/json"),
                "{}: error content type {ct}",
                self.what
            );
        }
        message.to_owned()
    }

    /// [`Resp::expect_error`], and the message must contain every one of `words`.
    pub fn expect_error_naming(&self, status: u16, code: &str, words: &[&str]) -> String {
        let message = self.expect_error(status, code);
        for w in words {
            assert!(
                message.contains(w),
                "{}: the message should name {w:?}: {message}",
                self.what
            );
        }
        message
    }
}

// ----- the server -----

/// How to start a server.
#[derive(Clone, Debug, Default)]
pub struct Options {
    toml: String,
    env: Vec<(String, String)>,
    /// A bearer token for the readiness probe (a server whose `/admin/ready` needs one).
    ready_token: Option<String>,
    /// The server speaks TLS: the readiness probe is curl with these arguments (`--cacert`,
    /// a client certificate), and the URLs are `https://`.
    tls_probe: Option<Vec<String>>,
    /// Start returns once the admin listener answers at all, ready or not.
    answering: bool,
    /// The CA (PEM) the server's agent trusts for `https://`.
    tls_ca: Option<PathBuf>,
    /// The bearer token the server's agent sends with every request.
    bearer: Option<String>,
}

impl Options {
    pub fn new() -> Self {
        Self::default()
    }

    /// TOML appended to the configuration file (see `shell/src/config.rs`), e.g.
    /// `"[mesh]\nflush_interval_ms = 20\n"`.
    pub fn toml(mut self, text: &str) -> Self {
        self.toml.push_str(text);
        if !self.toml.ends_with('\n') {
            self.toml.push('\n');
        }
        self
    }

    /// The bearer token the readiness probe sends (`auth.open_health = false`).
    pub fn ready_token(mut self, token: &str) -> Self {
        self.ready_token = Some(token.to_owned());
        self
    }

    /// The server speaks TLS (its `[server.tls]` is in the TOML): URLs are `https://` and
    /// the readiness probe is curl with these arguments (`--cacert FILE`, and `--cert FILE
    /// --key FILE` when client certificates are required).
    pub fn tls_probe(mut self, curl_args: &[&str]) -> Self {
        self.tls_probe = Some(curl_args.iter().map(|a| (*a).to_owned()).collect());
        self
    }

    /// [`Server::start`] returns once the admin listener answers, whatever it answers (a
    /// server that is to report itself unready, e.g. its broker unreachable), instead of
    /// waiting for `/admin/ready` to be 200.
    pub fn answering(mut self) -> Self {
        self.answering = true;
        self
    }

    /// The server's agent ([`Server::agent`], [`Server::call`], ...) speaks HTTPS trusting
    /// this CA certificate (PEM); with [`Options::tls_probe`].
    pub fn tls_ca(mut self, ca: &Path) -> Self {
        self.tls_ca = Some(ca.to_owned());
        self
    }

    /// The server's agent sends `Authorization: Bearer TOKEN` with every request.
    pub fn bearer(mut self, token: &str) -> Self {
        self.bearer = Some(token.to_owned());
        self
    }

    /// An environment variable of the server process.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }
}

/// One `unimesh serve` process on its own temporary data directory, restartable on it.
pub struct Server {
    root: tempfile::TempDir,
    opts: Options,
    child: Option<Child>,
    http: SocketAddr,
    admin: SocketAddr,
    /// Starts so far (1 after `start`).
    incarnation: u32,
    agent: ureq::Agent,
}

impl Server {
    /// The running process's id (a measurement reads its CPU time from /proc).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Starts a server with the default configuration.
    pub fn start_default() -> Self {
        Self::start(Options::new())
    }

    /// Starts a server and waits until it is ready. Panics (with its stderr) if it is not.
    pub fn start(opts: Options) -> Self {
        let root = match tempfile::Builder::new().prefix("unimesh-test-").tempdir() {
            Ok(d) => d,
            Err(e) => panic!("cannot create a temporary directory: {e}"),
        };
        let config = root.path().join("unimesh.toml");
        if let Err(e) = std::fs::write(&config, &opts.toml) {
            panic!("cannot write {}: {e}", config.display());
        }
        let unspecified = SocketAddr::from(([127, 0, 0, 1], 0));
        let agent = agent_with(opts.tls_ca.as_deref(), opts.bearer.as_deref());
        let mut s = Server {
            root,
            opts,
            child: None,
            http: unspecified,
            admin: unspecified,
            incarnation: 0,
            agent,
        };
        s.launch();
        s
    }

    pub fn data_dir(&self) -> PathBuf {
        self.root.path().join("data")
    }

    fn config_path(&self) -> PathBuf {
        self.root.path().join("unimesh.toml")
    }

    fn stderr_path(&self, incarnation: u32) -> PathBuf {
        self.root.path().join(format!("stderr-{incarnation}.log"))
    }

    /// Starts the process (on fresh free ports) and waits for readiness. A port taken between
    /// choosing it and the server binding it is retried with other ports.
    fn launch(&mut self) {
        assert!(self.child.is_none(), "the server is already running");
        let bin = unimesh_bin();
        let mut last_error = String::new();
        for _ in 0..5 {
            self.incarnation += 1;
            let (http, admin) = free_ports();
            self.http = http;
            self.admin = admin;
            self.agent = agent_with(self.opts.tls_ca.as_deref(), self.opts.bearer.as_deref());
            let log = self.stderr_path(self.incarnation);
            let (out, err) = match File::create(&log).and_then(|f| Ok((f.try_clone()?, f))) {
                Ok(pair) => pair,
                Err(e) => panic!("cannot create {}: {e}", log.display()),
            };
            let mut cmd = Command::new(bin);
            cmd.arg("serve")
                .arg("--http")
                .arg(http.to_string())
                .arg("--admin")
                .arg(admin.to_string())
                .arg("--data")
                .arg(self.data_dir())
                .arg("--config")
                .arg(self.config_path())
                .current_dir(self.root.path())
                .stdin(Stdio::null())
                .stdout(Stdio::from(out))
                .stderr(Stdio::from(err));
            // Hermetic: only the variables this test chose reach the server.
            for (k, _) in std::env::vars_os() {
                if k.to_string_lossy().starts_with("UNIMESH_") {
                    cmd.env_remove(k);
                }
            }
            for (k, v) in &self.opts.env {
                cmd.env(k, v);
            }
            // `UNIMESH_TEST_SERVER_LOG=FILTER`: the servers' log filter (a loop hunting a
            // rare failure wants the Kafka backend's debug lines).
            if let Some(filter) = std::env::var_os("UNIMESH_TEST_SERVER_LOG") {
                cmd.env("UNIMESH_LOG", filter);
            }
            let child = match cmd.spawn() {
                Ok(c) => c,
                Err(e) => panic!("cannot run {}: {e}", bin.display()),
            };
            self.child = Some(child);
            match self.wait_ready() {
                Ok(()) => return,
                Err(e) => {
                    let log = self.stderr();
                    self.kill9();
                    if log.contains("cannot listen") {
                        last_error = e;
                        continue;
                    }
                    panic!("{e}\n--- server stderr ---\n{log}");
                }
            }
        }
        panic!("the server could not bind free ports: {last_error}");
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let started = Instant::now();
        let url = self.admin_url("/admin/ready");
        let quick = quick_agent();
        loop {
            if let Some(child) = self.child.as_mut() {
                match child.try_wait() {
                    Ok(Some(status)) => {
                        return Err(format!("unimesh exited before it was ready: {status}"))
                    }
                    Ok(None) => {}
                    Err(e) => return Err(format!("cannot watch the unimesh process: {e}")),
                }
            }
            if let Some(args) = &self.opts.tls_probe {
                let out = Command::new("curl")
                    .args([
                        "-sS",
                        "-o",
                        "/dev/null",
                        "-w",
                        "%{http_code}",
                        "--max-time",
                        "5",
                    ])
                    .args(args)
                    .arg(&url)
                    .stdin(Stdio::null())
                    .output();
                if out.is_ok_and(|o| o.stdout == b"200") {
                    return Ok(());
                }
            } else {
                let mut probe = Call::new(&quick, "GET", &url);
                if let Some(token) = &self.opts.ready_token {
                    probe = probe.header("authorization", &format!("Bearer {token}"));
                }
                if let Ok(r) = probe.try_send() {
                    if r.status == 200 || self.opts.answering {
                        return Ok(());
                    }
                }
            }
            if started.elapsed() > READY_TIMEOUT {
                return Err(format!(
                    "unimesh was not ready within {READY_TIMEOUT:?} (GET {url})"
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts the server again on the same data directory (after [`Server::kill9`] or
    /// [`Server::terminate`]) and waits for readiness. Ports change.
    pub fn restart(&mut self) {
        self.launch();
    }

    /// [`Server::restart`] with other options (the same data directory).
    pub fn restart_with(&mut self, opts: Options) {
        if let Err(e) = std::fs::write(self.config_path(), &opts.toml) {
            panic!("cannot write {}: {e}", self.config_path().display());
        }
        self.opts = opts;
        self.launch();
    }

    /// Kills the process with SIGKILL (no chance to flush anything) and reaps it.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            // std's `kill` is SIGKILL on Unix.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Sends SIGTERM and waits for the process to exit; returns its exit status. Panics if
    /// it does not exit within [`STOP_TIMEOUT`].
    pub fn terminate(&mut self) -> ExitStatus {
        self.stop_with(libc::SIGTERM)
    }

    /// Sends SIGINT (Ctrl-C) and waits like [`Server::terminate`].
    pub fn interrupt(&mut self) -> ExitStatus {
        self.stop_with(libc::SIGINT)
    }

    fn stop_with(&mut self, sig: libc::c_int) -> ExitStatus {
        let Some(mut child) = self.child.take() else {
            panic!("stop: the server is not running");
        };
        signal(&child, sig);
        let started = Instant::now();
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return status,
                Ok(None) if started.elapsed() < STOP_TIMEOUT => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Ok(None) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "unimesh did not stop within {STOP_TIMEOUT:?} of signal {sig}\n--- stderr ---\n{}",
                        self.stderr()
                    );
                }
                Err(e) => panic!("cannot wait for unimesh: {e}"),
            }
        }
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// The stderr (and stdout) of the current (or last) incarnation.
    pub fn stderr(&self) -> String {
        self.stderr_of(self.incarnation)
    }

    pub fn stderr_of(&self, incarnation: u32) -> String {
        let mut s = String::new();
        if let Ok(mut f) = File::open(self.stderr_path(incarnation)) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    pub fn incarnation(&self) -> u32 {
        self.incarnation
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.http
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin
    }

    /// `http`, or `https` for a server started with [`Options::tls_probe`].
    pub fn scheme(&self) -> &'static str {
        if self.opts.tls_probe.is_some() {
            "https"
        } else {
            "http"
        }
    }

    pub fn http_url(&self, path: &str) -> String {
        format!("{}://{}{path}", self.scheme(), self.http)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("{}://{}{path}", self.scheme(), self.admin)
    }

    /// Sends `sig` (SIGHUP: reload the TLS certificates) to the running process.
    pub fn send_signal(&self, sig: libc::c_int) {
        match &self.child {
            Some(child) => signal(child, sig),
            None => panic!("signal: the server is not running"),
        }
    }

    /// The agent of the current incarnation (for threads).
    pub fn agent(&self) -> ureq::Agent {
        self.agent.clone()
    }

    /// A request to the traffic listener.
    pub fn call(&self, method: &str, path: &str) -> Call {
        Call::new(&self.agent, method, self.http_url(path))
    }

    /// A request to the admin listener.
    pub fn admin(&self, method: &str, path: &str) -> Call {
        Call::new(&self.agent, method, self.admin_url(path))
    }

    pub fn get(&self, path: &str) -> Resp {
        self.call("GET", path).send()
    }

    pub fn admin_get(&self, path: &str) -> Resp {
        self.admin("GET", path).send()
    }

    // ----- publish -----

    /// Publishes one event in binary mode: `ce-*` headers from the event's attributes
    /// (everything but `data`/`datacontenttype`), `content-type` from `datacontenttype`,
    /// the body as given.
    pub fn publish_binary(&self, topic: &str, event: &Value, body: &[u8]) -> Resp {
        binary_call(&self.agent, &self.http_url(&topic_path(topic)), event, body).send()
    }

    /// Publishes one event in structured mode.
    pub fn publish_structured(&self, topic: &str, event: &Value) -> Resp {
        self.call("POST", &topic_path(topic))
            .header("content-type", "application/cloudevents+json")
            .body(event.to_string())
            .send()
    }

    /// Publishes events in batch mode.
    pub fn publish_batch(&self, topic: &str, events: &[Value]) -> Resp {
        self.call("POST", &topic_path(topic))
            .header("content-type", BATCH_MEDIA_TYPE)
            .body(Value::Array(events.to_vec()).to_string())
            .send()
    }

    // ----- subscriptions -----

    /// `PUT /v1/subscriptions/{group}` with this document; asserts 200 or 201.
    pub fn subscribe(&self, group: &str, doc: &Value) -> Value {
        let r = self
            .call("PUT", &format!("/v1/subscriptions/{group}"))
            .json(doc)
            .send();
        assert!(
            r.status == 200 || r.status == 201,
            "subscribe {group}: {} {}",
            r.status,
            r.text()
        );
        r.json()
    }

    /// One long-poll; asserts 200 and parses the deliveries.
    pub fn poll(&self, group: &str, client: &str, max: u32, wait_ms: u64) -> Vec<Delivery> {
        let r = self.poll_raw(group, client, max, wait_ms);
        r.expect(200);
        parse_deliveries(&r)
    }

    pub fn poll_raw(&self, group: &str, client: &str, max: u32, wait_ms: u64) -> Resp {
        self.get(&format!(
            "/v1/subscriptions/{group}/events?client={client}&max={max}&waitMs={wait_ms}"
        ))
    }

    /// Polls until `n` deliveries have arrived for this client, or panics after `timeout`.
    pub fn poll_n(&self, group: &str, client: &str, n: usize, timeout: Duration) -> Vec<Delivery> {
        let mut got = Vec::new();
        let started = Instant::now();
        while got.len() < n {
            assert!(
                started.elapsed() < timeout,
                "{group}/{client}: got {} of {n} deliveries within {timeout:?}",
                got.len()
            );
            let want = u32::try_from(n - got.len()).unwrap_or(u32::MAX).min(1000);
            got.extend(self.poll(group, client, want, 500));
        }
        got
    }

    pub fn ack(&self, group: &str, ids: &[&str]) -> Settled {
        self.settle(group, "ack", &json!({ "deliveryIds": ids }))
    }

    pub fn nack(&self, group: &str, ids: &[&str], delay_ms: Option<u64>) -> Settled {
        let mut body = json!({ "deliveryIds": ids });
        if let Some(d) = delay_ms {
            body["delayMs"] = json!(d);
        }
        self.settle(group, "nack", &body)
    }

    pub fn extend(&self, group: &str, ids: &[&str], extend_ms: Option<u64>) -> Settled {
        let mut body = json!({ "deliveryIds": ids });
        if let Some(e) = extend_ms {
            body["extendMs"] = json!(e);
        }
        self.settle(group, "extend", &body)
    }

    /// `POST /v1/subscriptions/{group}/{verb}` with this body; asserts 200 and parses the
    /// per-id answer.
    pub fn settle(&self, group: &str, verb: &str, body: &Value) -> Settled {
        let r = self
            .call("POST", &format!("/v1/subscriptions/{group}/{verb}"))
            .json(body)
            .send();
        Settled::parse(&r, verb)
    }

    // ----- admin -----

    /// `GET /admin/offsets?topic=T`: rows keyed by (group, partition).
    pub fn offsets(&self, topic: &str) -> BTreeMap<(String, u32), Value> {
        let v = self
            .admin_get(&format!("/admin/offsets?topic={topic}"))
            .ok_json(200);
        let rows = v["offsets"]
            .as_array()
            .unwrap_or_else(|| panic!("offsets answer has no array: {v}"));
        rows.iter()
            .map(|r| {
                let group = r["group"].as_str().unwrap_or_default().to_owned();
                let partition = r["partition"]
                    .as_u64()
                    .and_then(|p| u32::try_from(p).ok())
                    .unwrap_or_else(|| panic!("offset row without partition: {r}"));
                ((group, partition), r.clone())
            })
            .collect()
    }

    /// `GET /metrics` as text.
    pub fn metrics(&self) -> String {
        self.admin_get("/metrics").expect(200).text()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = self.stderr();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            eprintln!(
                "--- last lines of unimesh stderr (incarnation {}, data {}) ---",
                self.incarnation,
                self.data_dir().display()
            );
            for line in tail.iter().rev() {
                eprintln!("{line}");
            }
            // `UNIMESH_TEST_LOGS=DIR` keeps every incarnation's whole stderr of a failed
            // test there (a loop hunting a rare failure needs more than the last lines).
            if let Some(dir) = std::env::var_os("UNIMESH_TEST_LOGS") {
                let dir = PathBuf::from(dir).join(format!(
                    "{}-{}",
                    std::process::id(),
                    self.http_addr().port()
                ));
                if std::fs::create_dir_all(&dir).is_ok() {
                    for i in 1..=self.incarnation {
                        let _ =
                            std::fs::copy(self.stderr_path(i), dir.join(format!("stderr-{i}.log")));
                    }
                    eprintln!("--- whole stderr kept in {} ---", dir.display());
                }
            }
        }
        self.kill9();
    }
}

/// Sends a signal to a child process.
fn signal(child: &Child, sig: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(child.id()) else {
        panic!("process id {} does not fit pid_t", child.id());
    };
    // SAFETY: kill(2) has no memory-safety preconditions; `pid` is our own child, which
    // has not been reaped (we hold its `Child` and have not waited on it), so the id cannot
    // have been reused by another process.
    let rc = unsafe { libc::kill(pid, sig) };
    assert_eq!(
        rc,
        0,
        "kill({pid}, {sig}) failed: {}",
        std::io::Error::last_os_error()
    );
}

/// Two distinct free ports on 127.0.0.1 (both held while the second is chosen).
fn free_ports() -> (SocketAddr, SocketAddr) {
    let bind = || match TcpListener::bind("127.0.0.1:0").and_then(|l| Ok((l.local_addr()?, l))) {
        Ok(pair) => pair,
        Err(e) => panic!("cannot find a free port: {e}"),
    };
    let (a, la) = bind();
    let (b, lb) = bind();
    drop((la, lb));
    (a, b)
}

/// An agent with a short timeout, for readiness probes.
fn quick_agent() -> ureq::Agent {
    built(
        ureq::Agent::config_builder()
            .http_status_as_error(false)
            .proxy(None)
            .timeout_global(Some(Duration::from_secs(2)))
            .build(),
    )
}

/// The media type of a batch-mode publish (and of a batched webhook push).
pub const BATCH_MEDIA_TYPE: &str = "application/cloudevents-batch+json";

pub fn topic_path(topic: &str) -> String {
    format!("/v1/topics/{topic}/events")
}

/// A binary-mode publish request for `event` (see [`Server::publish_binary`]).
pub fn binary_call(agent: &ureq::Agent, url: &str, event: &Value, body: &[u8]) -> Call {
    let mut call = Call::new(agent, "POST", url);
    if let Some(obj) = event.as_object() {
        for (k, v) in obj {
            match k.as_str() {
                "data" | "data_base64" => {}
                "datacontenttype" => {
                    call = call.header("content-type", v.as_str().unwrap_or_default());
                }
                _ => {
                    let text = match v {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    call = call.header(&format!("ce-{k}"), &text);
                }
            }
        }
    }
    call.body(body.to_vec())
}

/// A minimal valid CloudEvent (structured form) with JSON data.
pub fn event(id: &str, ty: &str, data: Value) -> Value {
    json!({
        "specversion": "1.0",
        "id": id,
        "source": "/unimesh/tests",
        "type": ty,
        "datacontenttype": "application/json",
        "data": data,
    })
}

/// One publish result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Published {
    pub id: String,
    pub partition: u32,
    pub offset: u64,
}

/// The results of a publish answer; asserts 200 and one result per event.
pub fn published(r: &Resp, expected: usize) -> Vec<Published> {
    let v = r.ok_json(200);
    let results = v["results"]
        .as_array()
        .unwrap_or_else(|| panic!("{}: no results array: {v}", r.what));
    assert_eq!(
        results.len(),
        expected,
        "{}: one result per event: {v}",
        r.what
    );
    results
        .iter()
        .map(|x| Published {
            id: x["id"]
                .as_str()
                .unwrap_or_else(|| panic!("result without id: {x}"))
                .to_owned(),
            partition: x["partition"]
                .as_u64()
                .and_then(|p| u32::try_from(p).ok())
                .unwrap_or_else(|| panic!("result without partition: {x}")),
            offset: x["offset"]
                .as_u64()
                .unwrap_or_else(|| panic!("result without offset: {x}")),
        })
        .collect()
}

/// One delivery of a long-poll answer.
#[derive(Clone, Debug)]
pub struct Delivery {
    pub id: String,
    pub attempt: u32,
    /// The structured CloudEvent as delivered.
    pub event: Value,
    /// `emmqpartition`, parsed.
    pub partition: u32,
    /// `emmqoffset`, parsed.
    pub offset: u64,
}

impl Delivery {
    pub fn event_id(&self) -> &str {
        self.event["id"].as_str().unwrap_or_default()
    }
}

/// Parses a long-poll answer; every delivery must have a delivery id, an attempt and an
/// event carrying `emmqpartition` and `emmqoffset` as decimal strings.
pub fn parse_deliveries(r: &Resp) -> Vec<Delivery> {
    let v = r.json();
    let items = v
        .as_array()
        .unwrap_or_else(|| panic!("{}: a poll answers an array: {v}", r.what));
    items
        .iter()
        .map(|d| {
            let id = d["deliveryId"]
                .as_str()
                .unwrap_or_else(|| panic!("delivery without deliveryId: {d}"))
                .to_owned();
            let attempt = d["attempt"]
                .as_u64()
                .and_then(|a| u32::try_from(a).ok())
                .unwrap_or_else(|| panic!("delivery without attempt: {d}"));
            let event = d["event"].clone();
            assert!(event.is_object(), "delivery without event object: {d}");
            let partition = event["emmqpartition"]
                .as_str()
                .and_then(|s| s.parse::<u32>().ok())
                .unwrap_or_else(|| panic!("event without a decimal emmqpartition: {d}"));
            let offset = event["emmqoffset"]
                .as_str()
                .and_then(|s| s.parse::<u64>().ok())
                .unwrap_or_else(|| panic!("event without a decimal emmqoffset: {d}"));
            Delivery {
                id,
                attempt,
                event,
                partition,
                offset,
            }
        })
        .collect()
}

/// The answer of ACK, NACK or extend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settled {
    /// `acked`, `nacked` or `extended`.
    pub accepted: u64,
    /// `(deliveryId, reason)` of every refused id, in request order.
    pub rejected: Vec<(String, String)>,
}

impl Settled {
    pub fn parse(r: &Resp, verb: &str) -> Self {
        let v = r.ok_json(200);
        let counted = match verb {
            "ack" => "acked",
            "nack" => "nacked",
            "extend" => "extended",
            other => panic!("unknown settle verb {other}"),
        };
        let accepted = v[counted]
            .as_u64()
            .unwrap_or_else(|| panic!("{}: no {counted} count: {v}", r.what));
        let rejected = v["rejected"]
            .as_array()
            .unwrap_or_else(|| panic!("{}: no rejected array: {v}", r.what))
            .iter()
            .map(|x| {
                (
                    x["deliveryId"].as_str().unwrap_or_default().to_owned(),
                    x["reason"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect();
        Settled { accepted, rejected }
    }

    /// Asserts that every id was accepted.
    pub fn all_ok(&self, n: usize) {
        assert!(
            self.rejected.is_empty(),
            "ids were refused: {:?}",
            self.rejected
        );
        assert_eq!(self.accepted, n as u64, "accepted count");
    }
}

/// Calls `f` until it returns `Some`, sleeping `every` between tries; panics naming `what`
/// after `timeout`.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let started = Instant::now();
    loop {
        if let Some(t) = f() {
            return t;
        }
        assert!(
            started.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// CPU seconds (user + system) this process used so far.
pub fn cpu_seconds() -> f64 {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a valid, writable rusage; RUSAGE_SELF needs nothing else.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return f64::NAN;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// CPU seconds (user + system) process `pid` used so far, from /proc (NaN if unreadable).
pub fn process_cpu_seconds(pid: Option<u32>) -> f64 {
    let Some(stat) = pid.and_then(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).ok())
    else {
        return f64::NAN;
    };
    // Fields after the command name (which may hold spaces, so split after its ')'):
    // state is field 3, utime 14, stime 15 (proc(5)).
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return f64::NAN;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
    // SAFETY: sysconf only reads a system constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    match (ticks(11), ticks(12)) {
        (Some(u), Some(s)) if hz > 0.0 => (u + s) / hz,
        _ => f64::NAN,
    }
}

/// A value of a Prometheus text exposition: the sample `name{labels}` (or `name` without
/// labels when `labels` is empty), matched exactly.
pub fn metric(text: &str, name: &str, labels: &str) -> Option<f64> {
    let key = if labels.is_empty() {
        name.to_owned()
    } else {
        format!("{name}{{{labels}}}")
    };
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (k, v) = l.rsplit_once(' ')?;
        (k == key).then(|| v.parse().ok()).flatten()
    })
}

/// A random-ish seed for tests that take one: `UNIMESH_TEST_SEED` if set, else the clock.
/// Printed so a failure can be replayed.
pub fn test_seed(test: &str) -> u64 {
    let seed = match std::env::var("UNIMESH_TEST_SEED") {
        Ok(s) => match s.parse() {
            Ok(n) => n,
            Err(_) => panic!("UNIMESH_TEST_SEED={s:?} is not a u64"),
        },
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0),
    };
    eprintln!("{test}: UNIMESH_TEST_SEED={seed}");
    seed
}
