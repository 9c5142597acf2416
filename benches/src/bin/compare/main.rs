//! unimesh side by side with NATS JetStream (and Kafka, when a broker is given), the same
//! workload in the same run on the same machine (issue 21). A measurement, not a test:
//! nothing here asserts on speed.
//!
//! ```text
//! cargo build --release -p unimesh-shell --bin unimesh -p unimesh-benches --features compare --bin compare
//! target/release/compare [--events 20000] [--size 1024] [--publishers 4] [--batch 50] \
//!     [--consumers 4] [--poll 200] [--partitions 4] [--runs 2] [--sync-interval-ms 100] \
//!     [--rate 0] [--transports poll,sse,ws,webhook,webhook-batch] [--push-batch 50] \
//!     [--single 5000] [--kafka HOST:PORT|tansu] [--jetstream 1] [--nats-server nats-server] \
//!     [--json compare.json]
//! target/release/compare --sweep all [--sweep-events 10000] [--plot docs/scaling.png] [--json scaling.json]
//! ```
//!
//! Rows, per run in alternating order (so neither side always runs on a warmer machine):
//! - JetStream (Debian's nats-server 2.9, its file store, which does not fsync each message;
//!   2.9 has no `sync_interval` setting to make it) with `--batch` publishes in flight per
//!   publisher, and the unimesh rows it is the peer of: unimesh with `storage.sync =
//!   "always"` (every publish fsynced before it is answered, the default) by each transport
//!   of `--transports` (long-poll, SSE, WebSocket, webhook one event per POST, webhook
//!   with `push.batch` = `--push-batch`), and long-poll with `storage.sync = "interval"`
//!   (`--sync-interval-ms`; 0 leaves that row out);
//! - with `--single N` > 0, the same for one event per request: N events, each publisher
//!   sending one binary-mode event per HTTP request beside JetStream publishers waiting
//!   for each message's ACK (long-poll consumers only);
//! - with `--kafka`, the broker used directly by rdkafka (librdkafka's defaults) and the peer
//!   of unimesh on that broker (`storage.backend = "kafka"`, long-poll); `tansu` starts one
//!   (`UNIMESH_TANSU`, in memory, as the black-box tests do);
//! - with `--rate R`, every row again at an offered load of R events/s, where the latencies
//!   mean most (a batch is stamped with its scheduled time: a client that falls behind
//!   shows).
//!
//! One table of each row's best run (highest end-to-end rate) with its ratio to its peer,
//! the server's CPU per event and the load client's CPU (on two cores it competes with the
//! servers), and with `--json` every sample as JSON. The unimesh binary is `UNIMESH_BIN`,
//! else the `unimesh` next to this one (build it with `--release` first).
//!
//! `--sweep` measures how unimesh scales instead (`sweep.rs`).

mod jetstream;
mod kafka;
mod plot;
mod sample;
mod sweep;
mod unimesh;

use sample::{header, Sample};
use unimesh::Storage;
use unimesh_tests::load::Transport;

pub struct Args {
    pub events: u64,
    pub size: u64,
    pub publishers: u64,
    pub batch: u64,
    pub consumers: u64,
    pub poll: u64,
    pub partitions: u64,
    pub runs: u64,
    pub sync_interval_ms: u64,
    /// An offered load in events/s for a second pass below saturation (0: none).
    pub rate: u64,
    pub nats_server: String,
    pub json: Option<String>,
    /// 0 leaves JetStream out (a profile of unimesh alone).
    pub jetstream: u64,
    pub transports: Vec<Transport>,
    pub push_batch: u64,
    /// Events of the one-event-per-request rows (0: none).
    pub single: u64,
    /// `HOST:PORT` of a Kafka broker, or `tansu` to start one.
    pub kafka: Option<String>,
    /// Dimensions to sweep (`all`, or a comma-separated list), instead of the comparison.
    pub sweep: Option<String>,
    pub sweep_events: u64,
    pub plot: Option<String>,
}

/// What one row sends: events, events per publish request, offered load (0: saturation).
#[derive(Clone, Copy, Debug)]
pub struct Workload {
    pub events: u64,
    pub batch: u64,
    pub rate: u64,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        events: 20_000,
        size: 1024,
        publishers: 4,
        batch: 50,
        consumers: 4,
        poll: 200,
        partitions: 4,
        runs: 2,
        sync_interval_ms: 100,
        rate: 0,
        nats_server: "nats-server".to_owned(),
        json: None,
        jetstream: 1,
        transports: Vec::new(),
        push_batch: 50,
        single: 5_000,
        kafka: None,
        sweep: None,
        sweep_events: 10_000,
        plot: None,
    };
    let mut transports = "poll,sse,ws,webhook,webhook-batch".to_owned();
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let text = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--nats-server" => a.nats_server = text,
            "--json" => a.json = Some(text),
            "--transports" => transports = text,
            "--kafka" => a.kafka = Some(text),
            "--sweep" => a.sweep = Some(text),
            "--plot" => a.plot = Some(text),
            _ => {
                let v = text
                    .parse::<u64>()
                    .map_err(|e| format!("{flag} {text}: {e}"))?;
                let slot = match flag.as_str() {
                    "--events" => &mut a.events,
                    "--size" => &mut a.size,
                    "--publishers" => &mut a.publishers,
                    "--batch" => &mut a.batch,
                    "--consumers" => &mut a.consumers,
                    "--poll" => &mut a.poll,
                    "--partitions" => &mut a.partitions,
                    "--runs" => &mut a.runs,
                    "--sync-interval-ms" => &mut a.sync_interval_ms,
                    "--rate" => &mut a.rate,
                    "--jetstream" => &mut a.jetstream,
                    "--push-batch" => &mut a.push_batch,
                    "--single" => &mut a.single,
                    "--sweep-events" => &mut a.sweep_events,
                    other => return Err(format!("unknown flag {other}")),
                };
                *slot = v;
            }
        }
    }
    for (name, v) in [
        ("--events", a.events),
        ("--publishers", a.publishers),
        ("--batch", a.batch),
        ("--consumers", a.consumers),
        ("--poll", a.poll),
        ("--partitions", a.partitions),
        ("--runs", a.runs),
        ("--push-batch", a.push_batch),
        ("--sweep-events", a.sweep_events),
    ] {
        if v == 0 {
            return Err(format!("{name} must be at least 1"));
        }
    }
    if a.size < 64 {
        return Err("--size must be at least 64 bytes".to_owned());
    }
    a.batch = a.batch.min(1000);
    a.poll = a.poll.min(1000);
    a.push_batch = a.push_batch.min(1000);
    a.transports = transports
        .split(',')
        .filter(|t| !t.is_empty())
        .map(|t| Transport::parse(t, a.push_batch as u32))
        .collect::<Result<_, _>>()?;
    Ok(a)
}

fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("compare: {e}");
            std::process::exit(2);
        }
    };
    if std::env::var_os("UNIMESH_BIN").is_none() {
        if let Some(bin) = std::env::current_exe()
            .ok()
            .and_then(|e| Some(e.parent()?.join("unimesh")))
            .filter(|b| b.is_file())
        {
            std::env::set_var("UNIMESH_BIN", bin);
        }
    }
    if !unimesh_tests::built_as_release() {
        eprintln!("compare: note: a debug build; use --release for figures that mean anything");
    }
    let machine = Machine::now();
    println!("compare: {}", machine.line());
    if let Some(dims) = &a.sweep {
        sweep::run(&a, dims, &machine);
        return;
    }
    compare(&a, &machine);
}

/// What a row runs.
#[derive(Clone, Debug)]
enum Kind {
    JetStream,
    /// The broker directly, by rdkafka.
    Kafka,
    Unimesh(Storage, Transport),
}

struct Row {
    name: String,
    kind: Kind,
    w: Workload,
    /// The row this one is compared with.
    peer: Option<usize>,
    samples: Vec<Sample>,
}

fn rows(a: &Args, kafka: Option<&(String, Option<u32>)>) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::new();
    let mut add = |name: String, kind: Kind, w: Workload, peer: Option<usize>| {
        rows.push(Row {
            name,
            kind,
            w,
            peer,
            samples: Vec::new(),
        });
        rows.len() - 1
    };
    let always = Storage::Embedded {
        sync_interval_ms: None,
    };
    let rates: Vec<u64> = if a.rate > 0 { vec![0, a.rate] } else { vec![0] };
    for &rate in &rates {
        let load = if rate == 0 {
            String::new()
        } else {
            format!(" @{rate}/s")
        };
        let mut modes = vec![(a.batch, a.events, format!("b{}", a.batch))];
        if a.single > 0 && a.batch > 1 {
            modes.push((1, a.single, "1/req".to_owned()));
        }
        for (batch, events, mode) in modes {
            let w = Workload {
                events,
                batch,
                rate,
            };
            let peer = (a.jetstream > 0).then(|| {
                add(
                    format!("jetstream default {mode}{load}"),
                    Kind::JetStream,
                    w,
                    None,
                )
            });
            let transports: &[Transport] = if batch == 1 {
                &[Transport::Poll]
            } else {
                &a.transports
            };
            for &t in transports {
                add(
                    format!("unimesh {} always {mode}{load}", t.name()),
                    Kind::Unimesh(always.clone(), t),
                    w,
                    peer,
                );
                if t == Transport::Poll && a.sync_interval_ms > 0 {
                    add(
                        format!("unimesh poll {}ms {mode}{load}", a.sync_interval_ms),
                        Kind::Unimesh(
                            Storage::Embedded {
                                sync_interval_ms: Some(a.sync_interval_ms),
                            },
                            Transport::Poll,
                        ),
                        w,
                        peer,
                    );
                }
            }
        }
        if let Some((brokers, pid)) = kafka {
            let w = Workload {
                events: a.events,
                batch: a.batch,
                rate,
            };
            let peer = add(
                format!("kafka direct b{}{load}", a.batch),
                Kind::Kafka,
                w,
                None,
            );
            add(
                format!("unimesh poll kafka b{}{load}", a.batch),
                Kind::Unimesh(
                    Storage::Kafka {
                        brokers: brokers.clone(),
                        pid: *pid,
                    },
                    Transport::Poll,
                ),
                w,
                Some(peer),
            );
        }
    }
    rows
}

fn compare(a: &Args, machine: &Machine) {
    // Kept until the end: a broker started here.
    let tansu =
        (a.kafka.as_deref() == Some("tansu")).then(unimesh_tests::kafka::Broker::start_tansu);
    let kafka = match (&tansu, &a.kafka) {
        (Some(b), _) => Some((b.brokers(), b.pid())),
        (None, Some(addr)) => Some((addr.clone(), None)),
        (None, None) => None,
    };
    println!(
        "compare: {} events of {} bytes, {} publishers (batches of {}), {} consumers (polls of {}), {} partitions, {} runs{}",
        a.events,
        a.size,
        a.publishers,
        a.batch,
        a.consumers,
        a.poll,
        a.partitions,
        a.runs,
        kafka
            .as_ref()
            .map(|(b, _)| format!(", Kafka at {b}"))
            .unwrap_or_default()
    );
    let mut rows = rows(a, kafka.as_ref());
    let nonce = std::process::id();
    for run in 0..a.runs as usize {
        let n = rows.len();
        for k in 0..n {
            let i = if run % 2 == 0 { k } else { n - 1 - k };
            let row = &rows[i];
            eprintln!("compare: run {} of {}: {}", run + 1, a.runs, row.name);
            // A topic of its own per row and run: a Kafka broker keeps them.
            let topic = format!("cmp{nonce}r{run}x{i}");
            let sample = match &row.kind {
                Kind::JetStream => jetstream::run(a, &row.w),
                Kind::Kafka => {
                    let Some((brokers, pid)) = &kafka else {
                        unreachable!("a Kafka row exists only with a broker");
                    };
                    kafka::run(a, &row.w, brokers, *pid, &topic)
                }
                Kind::Unimesh(storage, t) => unimesh::run(a, &row.w, storage, *t, &topic),
            };
            println!("{}\n{}", header(), sample.row(&row.name, None));
            rows[i].samples.push(sample);
        }
    }
    report(a, &rows, machine);
}

/// The best sample of a row: its highest end-to-end rate.
fn best(row: &Row) -> Option<&Sample> {
    row.samples
        .iter()
        .max_by(|x, y| x.end_to_end_per_s().total_cmp(&y.end_to_end_per_s()))
}

/// The table of the best run of each row (highest end-to-end rate) with its ratio to its
/// peer's best, and every sample as JSON.
fn report(a: &Args, rows: &[Row], machine: &Machine) {
    let after = Machine::now();
    println!(
        "\ncompare: best of {} runs each; x peer = end-to-end events/s over the peer's (JetStream, or Kafka used directly); latencies in ms; CPU in s",
        a.runs
    );
    println!(
        "compare: load average before {:.2}, after {:.2}",
        machine.load1, after.load1
    );
    println!("{}", header());
    for row in rows {
        if let Some(s) = best(row) {
            let peer = row
                .peer
                .and_then(|p| best(&rows[p]))
                .map(Sample::end_to_end_per_s);
            println!("{}", s.row(&row.name, peer));
        }
    }
    if let Some(path) = &a.json {
        let all: Vec<serde_json::Value> = rows
            .iter()
            .flat_map(|row| {
                row.samples
                    .iter()
                    .enumerate()
                    .map(move |(run, s)| s.to_json(&row.name, run))
            })
            .collect();
        let doc = serde_json::json!({
            "machine": machine.to_json(), "load_average_after": after.load1,
            "events": a.events, "size": a.size, "publishers": a.publishers, "batch": a.batch,
            "consumers": a.consumers, "poll": a.poll, "partitions": a.partitions,
            "push_batch": a.push_batch, "single": a.single,
            "samples": all,
        });
        write_json(path, &doc);
    }
}

pub fn write_json(path: &str, doc: &serde_json::Value) {
    if let Err(e) = std::fs::write(path, format!("{doc:#}\n")) {
        eprintln!("compare: cannot write {path}: {e}");
        std::process::exit(1);
    }
    println!("compare: written to {path}");
}

/// The machine a run is on, and how busy it was.
pub struct Machine {
    pub cores: usize,
    pub model: String,
    /// The 1-minute load average.
    pub load1: f64,
    /// Seconds since the Unix epoch.
    pub at: u64,
}

impl Machine {
    pub fn now() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, m)| m.trim().to_owned())
            .unwrap_or_else(|| "unknown".to_owned());
        let load1 = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|l| l.split_whitespace().next()?.parse().ok())
            .unwrap_or(f64::NAN);
        Self {
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            model,
            load1,
            at: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }

    pub fn line(&self) -> String {
        format!(
            "{} cores, {}, load average {:.2}, at {} s since the epoch",
            self.cores, self.model, self.load1, self.at
        )
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"cores": self.cores, "model": self.model, "load_average": self.load1, "unix_time": self.at})
    }
}
