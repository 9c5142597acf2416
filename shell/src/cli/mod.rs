//! The client half of the `unimesh` binary: subcommands that talk HTTP to a running server.
//!
//! `publish`, `subscribe`, `groups`, `offsets`, `dlq browse|replay` and `seek`, each with
//! `--server URL` (traffic API, env `UNIMESH_SERVER`), `--admin URL` (admin API, env
//! `UNIMESH_ADMIN_URL`), `--token T` (sent as `Authorization: Bearer T`, env
//! `UNIMESH_TOKEN`), `--cacert FILE` (the CA certificates an `https://` server's certificate
//! must chain to, instead of the system's; env `UNIMESH_CACERT`), `--client-cert FILE` and
//! `--client-key FILE` (a client certificate for a listener with mTLS; env
//! `UNIMESH_CLIENT_CERT`, `UNIMESH_CLIENT_KEY`) and `--json` (machine-readable output).
//! Tables and counts go to stdout, errors to stderr as one line naming the request and the
//! server's answer.
//!
//! Exit codes ([`Failure::exit_code`]): 0 done, 1 something was refused (by the server, or
//! an input line that is not a CloudEvent), 2 usage (clap's own code for bad arguments), 3
//! the server could not be reached (or ended a stream).

mod client;
mod publish;
mod subscribe;
mod table;
mod views;

use std::process::ExitCode;

use clap::{Args, Subcommand};

/// Environment variables of the client subcommands (not settings of `serve`).
pub const ENV: [&str; 6] = [
    "UNIMESH_ADMIN_URL",
    "UNIMESH_CACERT",
    "UNIMESH_CLIENT_CERT",
    "UNIMESH_CLIENT_KEY",
    "UNIMESH_SERVER",
    "UNIMESH_TOKEN",
];

/// The client subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Browse or replay a group's dead letters (admin API).
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// List the subscription groups with their lag and in flight (admin API).
    Groups(GroupsArgs),
    /// A table of group x partition: watermark, in flight, end, lag, owner (admin API).
    Offsets(OffsetsArgs),
    /// Publish one event from flags, or many from a file or stdin (one JSON CloudEvent per
    /// line), in batches.
    Publish(publish::PublishArgs),
    /// Restart one partition of a group at an offset, or its partitions at a time (admin API).
    Seek(SeekArgs),
    /// Tail a group over Server-Sent Events, ACKing each delivery as it is printed.
    Subscribe(subscribe::SubscribeArgs),
}

#[derive(Subcommand, Debug)]
pub enum DlqCommand {
    /// The first dead letters of a group.
    Browse(DlqArgs),
    /// Deliver a group's dead letters again (to that group only).
    Replay(DlqArgs),
}

/// What every client subcommand takes.
#[derive(Args, Debug, Clone)]
pub struct Common {
    /// The server's traffic API.
    #[arg(
        long,
        value_name = "URL",
        env = "UNIMESH_SERVER",
        default_value = "http://127.0.0.1:8080"
    )]
    pub server: String,
    /// The server's admin API.
    #[arg(
        long,
        value_name = "URL",
        env = "UNIMESH_ADMIN_URL",
        default_value = "http://127.0.0.1:8081"
    )]
    pub admin: String,
    /// Sent as `Authorization: Bearer TOKEN` with every request.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "UNIMESH_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// PEM file of the CA certificates that an `https://` server's certificate must chain
    /// to (a private CA), instead of the system's.
    #[arg(long, value_name = "FILE", env = "UNIMESH_CACERT")]
    pub cacert: Option<std::path::PathBuf>,
    /// PEM file of a client certificate (and its chain) to present to a listener that asks
    /// for one (mTLS); with --client-key.
    #[arg(
        long,
        value_name = "FILE",
        env = "UNIMESH_CLIENT_CERT",
        requires = "client_key"
    )]
    pub client_cert: Option<std::path::PathBuf>,
    /// PEM file of the private key of --client-cert.
    #[arg(
        long,
        value_name = "FILE",
        env = "UNIMESH_CLIENT_KEY",
        requires = "client_cert"
    )]
    pub client_key: Option<std::path::PathBuf>,
    /// Print JSON for scripts instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct GroupsArgs {
    #[command(flatten)]
    common: Common,
}

#[derive(Args, Debug)]
pub struct OffsetsArgs {
    /// Only this topic's groups (default: every group's topic).
    #[arg(long, value_name = "TOPIC")]
    topic: Option<String>,
    #[command(flatten)]
    common: Common,
}

#[derive(Args, Debug)]
pub struct DlqArgs {
    /// The subscription group.
    group: String,
    /// Most entries (the server's `limits.default_dlq_page` when not given).
    #[arg(long, value_name = "N")]
    max: Option<u64>,
    #[command(flatten)]
    common: Common,
}

#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("where").required(true).args(["to", "time"])))]
pub struct SeekArgs {
    /// The subscription group.
    group: String,
    /// The partition to move (with `--time`, when not given: every partition of the group).
    #[arg(long, value_name = "P", required_unless_present = "time")]
    partition: Option<u32>,
    /// The offset it restarts at (nothing at or above it counts as done).
    #[arg(long = "to", value_name = "OFFSET")]
    to: Option<u64>,
    /// Restart at the first event appended at or after this RFC 3339 time
    /// (`2024-05-17T08:00:00Z`; the last hour: `"$(date -u -d '1 hour ago' +%FT%TZ)"`).
    #[arg(long, value_name = "RFC3339")]
    time: Option<String>,
    #[command(flatten)]
    common: Common,
}

/// Why a subcommand did not finish; each has its exit code.
#[derive(Debug, PartialEq, Eq)]
pub enum Failure {
    /// The server answered with an error, or input was refused (exit 1).
    Refused(String),
    /// The arguments or the input cannot be used (exit 2).
    Usage(String),
    /// The server could not be reached or stopped answering (exit 3).
    Unreachable(String),
}

impl Failure {
    pub fn exit_code(&self) -> u8 {
        match self {
            Failure::Refused(_) => 1,
            Failure::Usage(_) => 2,
            Failure::Unreachable(_) => 3,
        }
    }

    fn message(&self) -> &str {
        match self {
            Failure::Refused(m) | Failure::Usage(m) | Failure::Unreachable(m) => m,
        }
    }
}

/// Runs a client subcommand; its failure is printed as one line on stderr.
pub fn run(command: Command) -> ExitCode {
    let result = match command {
        Command::Dlq(DlqCommand::Browse(a)) => views::dlq_browse(&a),
        Command::Dlq(DlqCommand::Replay(a)) => views::dlq_replay(&a),
        Command::Groups(a) => views::groups(&a),
        Command::Offsets(a) => views::offsets(&a),
        Command::Publish(a) => publish::run(&a),
        Command::Seek(a) => views::seek(&a),
        Command::Subscribe(a) => subscribe::run(&a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("unimesh: {}", f.message());
            ExitCode::from(f.exit_code())
        }
    }
}

/// Writes one line to stdout. A reader that went away (`unimesh groups | head -1`) ends the
/// command quietly: `Ok(false)`.
fn print_line(line: &str) -> Result<bool, Failure> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{line}").and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(Failure::Usage(format!("cannot write to stdout: {e}"))),
    }
}

/// Pretty JSON on stdout.
fn print_json(value: &serde_json::Value) -> Result<(), Failure> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| Failure::Usage(format!("cannot encode the answer: {e}")))?;
    print_line(&text).map(|_| ())
}
