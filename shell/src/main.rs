//! `unimesh`: the event mesh binary.
//!
//! `unimesh serve` (also plain `unimesh`) runs the mesh on the embedded default: data in
//! `./data`, traffic API on 127.0.0.1:8080, admin API on 127.0.0.1:8081. Configuration comes
//! from flags, `UNIMESH_*` environment variables and a TOML file (see `config.rs`).
//! The other subcommands (`publish`, `subscribe`, `groups`, `offsets`, `dlq`, `seek`) are a
//! client of a running server (`cli/`).
//! SIGINT or SIGTERM stops it gracefully: no new connections, open requests get the grace
//! period, the engine flushes its progress; a second signal exits at once.

use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

mod cli;

use clap::{Args, Parser, Subcommand};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};
use unimesh_shell::config::{self, Config, Overrides, StateBackend, ENV_PREFIX};
use unimesh_shell::engine::{self, LogPort, StatePort, StorageError};
use unimesh_shell::http::jwt::Verifier;
use unimesh_shell::http::tls::Tls;
use unimesh_shell::http::{App, Server};
use unimesh_shell::kafka::KafkaLog;
use unimesh_shell::storage::{Backend, WaitForBroker};
#[cfg(feature = "otlp")]
use unimesh_shell::trace;

#[derive(Parser, Debug)]
#[command(
    name = "unimesh",
    version,
    about = "An event mesh: CloudEvents in, at-least-once delivery out."
)]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// `unimesh` alone is `unimesh serve`, so its flags are accepted here too.
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the mesh (the default).
    Serve(ServeArgs),
    #[command(flatten)]
    Client(cli::Command),
}

#[derive(Args, Debug, Default, Clone)]
struct ServeArgs {
    /// Traffic listener, IP:PORT (env UNIMESH_HTTP; default 127.0.0.1:8080).
    #[arg(long, value_name = "ADDR")]
    http: Option<String>,
    /// Admin listener, IP:PORT (env UNIMESH_ADMIN; default 127.0.0.1:8081).
    #[arg(long, value_name = "ADDR")]
    admin: Option<String>,
    /// Data directory (env UNIMESH_DATA; default ./data).
    #[arg(long, value_name = "DIR")]
    data: Option<PathBuf>,
    /// TOML configuration file (env UNIMESH_CONFIG).
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Where events are stored: `embedded` (default) or `kafka` (env UNIMESH_STORAGE_BACKEND).
    #[arg(long, value_name = "BACKEND")]
    storage: Option<String>,
    /// Kafka bootstrap brokers, HOST:PORT,... (env UNIMESH_KAFKA_BROKERS).
    #[arg(long, value_name = "HOST:PORT,...")]
    kafka_brokers: Option<String>,
    /// This instance's stable name on Kafka, shown as a partition's owner (env
    /// UNIMESH_KAFKA_INSTANCE).
    #[arg(long, value_name = "NAME")]
    kafka_instance: Option<String>,
    /// Serve non-loopback addresses without `[auth]` (anyone who reaches them may publish,
    /// consume and operate; env UNIMESH_SERVER_INSECURE, config server.insecure).
    #[arg(long)]
    insecure: bool,
    /// TLS on both listeners: the PEM certificate chain (env UNIMESH_SERVER_TLS_CERT,
    /// config server.tls.cert; with --tls-key).
    #[arg(long, value_name = "FILE")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert (env UNIMESH_SERVER_TLS_KEY, config server.tls.key).
    #[arg(long, value_name = "FILE")]
    tls_key: Option<PathBuf>,
    /// Print the effective configuration (defaults, file, UNIMESH_* variables and flags
    /// merged and checked) as TOML, and exit without serving.
    #[arg(long)]
    print_config: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let args = match cli.command {
        Some(Command::Serve(args)) => args,
        Some(Command::Client(command)) => return cli::run(command),
        None => cli.serve,
    };
    let env = match environment() {
        Ok(env) => env,
        Err(e) => {
            eprintln!("unimesh: {e}");
            return ExitCode::from(2);
        }
    };
    let overrides = Overrides {
        config: args.config,
        http: args.http,
        admin: args.admin,
        data: args.data,
        storage: args.storage,
        kafka_brokers: args.kafka_brokers,
        kafka_instance: args.kafka_instance,
        insecure: args.insecure,
        tls_cert: args.tls_cert,
        tls_key: args.tls_key,
    };
    let loaded = match config::load(&overrides, env) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("unimesh: configuration error: {e}");
            return ExitCode::from(2);
        }
    };
    if args.print_config {
        return match toml::to_string(&loaded.config) {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("unimesh: cannot print the configuration: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let exporter = match init_tracing(&loaded.config) {
        Ok(x) => x,
        Err(e) => {
            eprintln!("unimesh: {e}");
            return ExitCode::FAILURE;
        }
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let workers = loaded.config.server.workers(cores);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .thread_name("unimesh")
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    let code = match runtime.block_on(serve(loaded, workers)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    };
    // The spans still buffered go out before the process ends.
    #[cfg(feature = "otlp")]
    if let Some(x) = exporter {
        x.shutdown();
    }
    #[cfg(not(feature = "otlp"))]
    let () = exporter;
    code
}

/// The `UNIMESH_*` variables. One that is not UTF-8 is an error rather than silently unset.
fn environment() -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for (k, v) in std::env::vars_os() {
        let Some(k) = k.to_str() else { continue };
        // The client subcommands' variables are not settings of the server.
        if !k.starts_with(ENV_PREFIX) || cli::ENV.contains(&k) {
            continue;
        }
        let v = v
            .into_string()
            .map_err(|_| format!("environment variable {k} is not valid UTF-8"))?;
        out.push((k.to_owned(), v));
    }
    Ok(out)
}

/// "off", or what retention keeps, for the startup line (an operator's first question about
/// disk use).
fn retention_summary(s: &config::Storage) -> String {
    let mut kept = Vec::new();
    if s.retention_ms > 0 {
        kept.push(format!("records younger than {} ms", s.retention_ms));
    }
    if s.retention_bytes_per_partition > 0 {
        kept.push(format!(
            "the newest {} bytes per partition",
            s.retention_bytes_per_partition
        ));
    }
    if kept.is_empty() {
        "off (records are kept forever)".to_owned()
    } else {
        format!("keeps {}", kept.join(" and "))
    }
}

/// Logs to stderr through the `log` filter and, when configured, spans to an OTLP
/// collector (`[otel]`, DESIGN.md §5.4); answers the exporter to flush at exit.
#[cfg(feature = "otlp")]
fn init_tracing(cfg: &config::Config) -> Result<Option<trace::otlp::Exporter>, String> {
    let (otel, exporter) = match trace::otlp::layer(&cfg.otel)? {
        Some((layer, exporter)) => (Some(layer), Some(exporter)),
        None => (None, None),
    };
    tracing_subscriber::registry()
        .with(otel)
        .with(log_layer(&cfg.log))
        .init();
    if let Some(x) = &exporter {
        tracing::info!(endpoint = %x.endpoint, "exporting spans over OTLP");
    }
    Ok(exporter)
}

#[cfg(not(feature = "otlp"))]
fn init_tracing(cfg: &config::Config) -> Result<(), String> {
    tracing_subscriber::registry()
        .with(log_layer(&cfg.log))
        .init();
    if !cfg.otel.endpoint.is_empty() {
        tracing::warn!(
            "otel.endpoint is set but this build has no `otlp` feature: no spans are exported"
        );
    }
    Ok(())
}

/// The log lines on stderr, through the `log` filter.
fn log_layer<S>(filter: &str) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    // `Config::validate` already parsed the filter; fall back to `info` if it somehow fails.
    let filter = EnvFilter::builder()
        .parse(filter)
        .unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_filter(filter)
}

async fn serve(loaded: config::Loaded, workers: usize) -> Result<(), String> {
    let cfg = loaded.config;
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        worker_threads = workers,
        "unimesh starting"
    );
    match &loaded.file {
        Some(f) => tracing::info!(file = %f.display(), "configuration file read"),
        None => {
            tracing::info!("no configuration file; defaults, UNIMESH_* variables and flags apply")
        }
    }

    // Fail closed (before anything is created): an address beyond this machine is served
    // only with identities, or when the operator says so.
    if let Some(addr) = cfg.open_exposure().first() {
        return Err(format!(
            "refusing to serve {addr} without authentication: add [auth] identities, bind a \
             loopback address, or pass --insecure (server.insecure = true) to serve it open"
        ));
    }
    // The key files before anything is created: a bad path fails with one line naming it.
    let tls = if cfg.server.tls.enabled() {
        Some(Arc::new(Tls::load(&cfg.server.tls)?))
    } else {
        None
    };
    let jwt = Verifier::load(&cfg.auth.jwt)?.map(Arc::new);
    std::fs::create_dir_all(&cfg.data)
        .map_err(|e| format!("cannot create data directory {}: {e}", cfg.data.display()))?;
    let data = cfg.data.canonicalize().unwrap_or_else(|_| cfg.data.clone());

    // Bind before opening storage: a port in use fails fast and touches nothing.
    let mut server = Server::bind(cfg.http, cfg.admin, cfg.server.clone())
        .await
        .map_err(|e| e.to_string())?;
    if let Some(tls) = &tls {
        server = server.with_tls(tls.clone());
    }
    let security = Security { tls, jwt };
    let traffic = server.traffic_addr().map_err(|e| e.to_string())?;

    let local = cfg.local_store();
    let state = local.open()?;
    let backend = cfg.storage_backend(traffic.port());
    let wait: Option<WaitForBroker> = match &backend {
        Backend::Kafka(start) => {
            let s = &start.settings;
            tracing::info!(
                brokers = %s.brokers,
                instance = %s.instance,
                progress_topic = %s.progress_topic,
                state = %cfg.state.backend,
                "storage on Kafka; data directory {} holds the local state", data.display()
            );
            let (server, brokers) = (&server, s.brokers.clone());
            Some(Box::new(move |kafka: KafkaLog| {
                Box::pin(async move { wait_for_broker(server, &kafka, &brokers).await })
            }))
        }
        Backend::Embedded(log_cfg) => {
            tracing::info!(
                data = %data.display(),
                storage = %cfg.storage.backend,
                log = %display_under(&data, &log_cfg.dir),
                state = %cfg.state.backend,
                state_dir = %local.dir().map_or_else(|| "(in memory: nothing survives a restart)".to_owned(), |d| display_under(&data, d)),
                partitions_per_new_topic = cfg.storage.default_partitions,
                retention = %retention_summary(&cfg.storage),
                "data directory {}", data.display()
            );
            if cfg.state.backend == StateBackend::Memory {
                tracing::warn!(
                    "state backend is `memory`: subscriptions and progress are lost at exit"
                );
            }
            None
        }
        Backend::Given(_) => None,
    };
    let Some(opened) = backend.open(state, wait).await? else {
        tracing::info!("stopped");
        return Ok(());
    };
    let kafka = opened.kafka().cloned();
    let (log_port, state_port) = opened.ports();
    run(cfg, server, security, log_port, state_port, kafka).await
}

/// TLS and JWT keys, loaded before the listeners serve.
struct Security {
    tls: Option<Arc<Tls>>,
    jwt: Option<Arc<Verifier>>,
}

/// Runs the engine and the servers until a stop signal, then stops gracefully.
async fn run(
    cfg: Config,
    server: Server,
    security: Security,
    log_port: Arc<dyn LogPort>,
    state_port: Arc<dyn StatePort>,
    kafka: Option<KafkaLog>,
) -> Result<(), String> {
    let traffic = server.traffic_addr().map_err(|e| e.to_string())?;
    let admin = server.admin_addr().map_err(|e| e.to_string())?;
    let (engine, engine_task) = engine::start(cfg.engine_config(), log_port.clone(), state_port)
        .await
        .map_err(|e| format!("cannot start the engine: {e}"))?;
    let subscriptions_watcher = match &kafka {
        Some(k) => Some(
            unimesh_shell::kafka::watch_subscriptions(k, engine.clone())
                .map_err(|e| e.to_string())?,
        ),
        None => None,
    };

    let scheme = if security.tls.is_some() {
        "https"
    } else {
        "http"
    };
    tracing::info!(addr = %traffic, "traffic API listening on {scheme}://{traffic}");
    tracing::info!(
        addr = %admin,
        "admin API listening on {scheme}://{admin} (metrics at /metrics)"
    );
    if let Some(tls) = &security.tls {
        tracing::info!(
            certificate_sha256 = %tls.fingerprint(),
            client_certificates = tls.client_certs(),
            "TLS on both listeners (reloaded on SIGHUP)"
        );
        tokio::spawn(reload_on_hangup(tls.clone()));
    }

    let app = Arc::new(
        App::new(engine.clone(), &cfg)
            .with_jwt(security.jwt)
            .listening_on([traffic, admin]),
    );
    let pushers = tokio::spawn(unimesh_shell::http::push::supervise(
        engine.clone(),
        cfg.push.clone(),
        app.push_targets.clone(),
        app.push_wake.clone(),
    ));
    let mut engine_task = engine_task;
    let mut engine_ended = false;
    let stop = async {
        tokio::select! {
            signal = stop_signal() => tracing::info!("{signal} received: shutting down"),
            r = &mut engine_task => {
                engine_ended = true;
                tracing::error!(result = ?r.err(), "the engine task ended unexpectedly: shutting down");
            }
        }
    };
    let draining = server.run(app.clone(), stop).await;
    tokio::spawn(async {
        let signal = stop_signal().await;
        tracing::warn!("{signal} received again: exiting without waiting");
        std::process::exit(130);
    });

    tracing::info!(
        open_connections = draining.open(),
        grace_ms = cfg.server.shutdown_grace_ms,
        "no longer accepting connections; finishing open requests"
    );
    let connections = tokio::spawn(draining.finish());
    // A broker with consumer groups: leave them now, while the engine still runs, so each
    // revocation flushes and commits the group's progress (the next owner resumes exactly).
    log_port.close().await;
    match engine.shutdown().await {
        Ok(()) => tracing::info!("engine flushed its progress"),
        Err(e) => tracing::warn!(error = %e, "engine shutdown"),
    }
    // The engine ended every delivery stream; give them the grace period to say so to
    // their clients (a WebSocket's close 1001) before the process exits.
    let streams = u32::try_from(cfg.server.max_streams.get()).unwrap_or(u32::MAX);
    let grace = Duration::from_millis(cfg.server.shutdown_grace_ms);
    if tokio::time::timeout(grace, app.streams.acquire_many(streams))
        .await
        .is_err()
    {
        tracing::warn!("delivery streams still open after the grace period");
    }
    match connections.await {
        Ok(0) | Err(_) => {}
        Ok(cut) => tracing::warn!(
            connections = cut,
            "connections still open after the grace period were closed"
        ),
    }
    if !engine_ended {
        let grace = Duration::from_millis(cfg.server.shutdown_grace_ms);
        if tokio::time::timeout(grace, engine_task).await.is_err() {
            tracing::warn!("the engine task did not stop within the grace period");
        }
    }
    pushers.abort();
    // The watcher sees the engine stopped within a poll; what it holds is dropped before
    // the process exits (not while C++ static destructors run).
    if let Some(watcher) = subscriptions_watcher {
        let joined = tokio::task::spawn_blocking(move || watcher.join());
        let grace = Duration::from_millis(cfg.server.shutdown_grace_ms);
        if tokio::time::timeout(grace, joined).await.is_err() {
            tracing::warn!("the subscriptions watcher did not stop within the grace period");
        }
    }
    tracing::info!("stopped");
    if engine_ended {
        return Err("stopped because the engine task ended".into());
    }
    Ok(())
}

/// How long the start waits between two tries of the Kafka broker.
const BROKER_RETRY: Duration = Duration::from_secs(1);

/// The Kafka broker must answer before the engine starts (it reads the progress and
/// subscriptions topics, created here). Until it does, every route — `/admin/health` and
/// `/admin/ready` included — answers 503 naming the broker and why, and the topics are
/// tried again every [`BROKER_RETRY`] (each try waits up to `kafka.request_timeout_ms`).
/// True once they exist; false when a stop signal came first; an error for a refusal that
/// stays (a topic name the configuration got wrong).
async fn wait_for_broker(
    server: &Server,
    kafka: &KafkaLog,
    brokers: &str,
) -> Result<bool, StorageError> {
    let last = Arc::new(std::sync::Mutex::new(String::from("no answer yet")));
    let why: Arc<dyn Fn() -> String + Send + Sync> = {
        let (kafka, last, brokers) = (kafka.clone(), last.clone(), brokers.to_owned());
        Arc::new(move || {
            kafka.fault().unwrap_or_else(|| {
                let last = last.lock().unwrap_or_else(|p| p.into_inner());
                format!("waiting for the Kafka broker {brokers}: {last}")
            })
        })
    };
    let mut outcome = Ok(false);
    let tries = async {
        for attempt in 0u64.. {
            match kafka.ensure_own_topics().await {
                Ok(()) => {
                    if attempt > 0 {
                        tracing::info!(%brokers, "the Kafka broker answered; starting");
                    }
                    return Ok(true);
                }
                Err(e) if !e.is_caller_error() => {
                    let why = e.to_string();
                    if attempt == 0 {
                        tracing::warn!(
                            %brokers,
                            reason = %why,
                            "waiting for the Kafka broker; meanwhile every route, \
                             /admin/health and /admin/ready included, answers 503 naming it"
                        );
                    }
                    *last.lock().unwrap_or_else(|p| p.into_inner()) = why;
                }
                // Named with the broker by `Backend::open`.
                Err(e) => return Err(e),
            }
            tokio::time::sleep(BROKER_RETRY).await;
        }
        Ok(false)
    };
    let stop = async {
        tokio::select! {
            r = tries => outcome = r,
            signal = stop_signal() => {
                tracing::info!("{signal} received while waiting for the Kafka broker: stopping");
            }
        }
    };
    let draining = server.run_unavailable(why, stop).await;
    draining.finish().await;
    outcome
}

fn display_under(root: &Path, path: &Path) -> String {
    let absolute = path.canonicalize().unwrap_or_else(|_| path.to_owned());
    match absolute.strip_prefix(root) {
        Ok(rel) => format!("<data>/{}", rel.display()),
        Err(_) => absolute.display().to_string(),
    }
}

/// Reads the TLS files again at every SIGHUP; new connections get the new certificates,
/// open ones keep theirs. A reload that fails keeps the old ones and says why.
async fn reload_on_hangup(tls: Arc<Tls>) {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hup = match signal(SignalKind::hangup()) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch SIGHUP; TLS certificates are not reloaded");
                return;
            }
        };
        while hup.recv().await.is_some() {
            match tls.reload() {
                Ok(()) => tracing::info!(
                    certificate_sha256 = %tls.fingerprint(),
                    "SIGHUP: TLS certificates reloaded"
                ),
                Err(e) => {
                    tracing::error!("SIGHUP: TLS certificates not reloaded, the old ones stay: {e}")
                }
            }
        }
    }
    #[cfg(not(unix))]
    let _ = tls;
}

/// Resolves on SIGINT or SIGTERM, naming it.
async fn stop_signal() -> &'static str {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => tokio::select! {
                _ = tokio::signal::ctrl_c() => "SIGINT",
                _ = term.recv() => "SIGTERM",
            },
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch SIGTERM; only SIGINT stops the mesh");
                let _ = tokio::signal::ctrl_c().await;
                "SIGINT"
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
        "SIGINT"
    }
}
