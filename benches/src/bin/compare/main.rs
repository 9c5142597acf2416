//! unimesh side by side with NATS JetStream, the same workload in the same run on the same
//! machine (issue 21). A measurement, not a test: nothing here asserts on speed.
//!
//! ```text
//! cargo build --release -p unimesh-shell --bin unimesh
//! cargo run --release -p unimesh-benches --features compare --bin compare -- \
//!     [--events 20000] [--size 1024] [--publishers 4] [--batch 50] [--consumers 4] \
//!     [--poll 200] [--partitions 4] [--runs 2] [--sync-interval-ms 100] [--rate 0] \
//!     [--nats-server nats-server] [--json compare.json] [--jetstream 1]
//! ```
//!
//! Per run, in alternating order: unimesh with `storage.sync = "always"` (every publish
//! fsynced before it is answered, the default), unimesh with `storage.sync = "interval"`
//! (`--sync-interval-ms`; 0 leaves that row out), and JetStream (Debian's nats-server 2.9:
//! its file store does not fsync each message, and 2.9 has no `sync_interval` setting to
//! make it). One table and, with `--json`, the samples as JSON. The unimesh binary is
//! `UNIMESH_BIN`, else the `unimesh` next to this one (build it with `--release` first).
//! The load client's own CPU is a column: on two cores it competes with the servers.
//! Every system runs at saturation (publishers send as fast as they are answered); with
//! `--rate R` each also runs at an offered load of R events/s, where the latencies mean
//! most (a batch is stamped with its scheduled time: a client that falls behind shows).

mod jetstream;
mod sample;
mod unimesh;

use sample::{Sample, HEADER};

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
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let text = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--nats-server" => a.nats_server = text,
            "--json" => a.json = Some(text),
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
    println!(
        "compare: {} events of {} bytes, {} publishers (batches of {}), {} consumers (polls of {}), {} partitions, {} runs",
        a.events, a.size, a.publishers, a.batch, a.consumers, a.poll, a.partitions, a.runs
    );
    let mut systems: Vec<(String, Vec<Sample>)> = Vec::new();
    let rates: Vec<u64> = if a.rate > 0 { vec![0, a.rate] } else { vec![0] };
    for &rate in &rates {
        let load = if rate == 0 {
            String::new()
        } else {
            format!(" @{rate}/s")
        };
        systems.push((format!("unimesh sync=always{load}"), Vec::new()));
        if a.sync_interval_ms > 0 {
            systems.push((
                format!("unimesh sync={}ms{load}", a.sync_interval_ms),
                Vec::new(),
            ));
        }
        if a.jetstream > 0 {
            systems.push((format!("jetstream 2.9 default{load}"), Vec::new()));
        }
    }
    for run in 0..a.runs as usize {
        let n = systems.len();
        for k in 0..n {
            // Alternate the order, so neither side always runs on a warmer machine.
            let i = if run % 2 == 0 { k } else { n - 1 - k };
            let name = systems[i].0.clone();
            let rate = name
                .rsplit_once(" @")
                .and_then(|(_, r)| r.trim_end_matches("/s").parse::<u64>().ok())
                .unwrap_or(0);
            eprintln!("compare: run {} of {}: {name}", run + 1, a.runs);
            let sample = if name.starts_with("jetstream") {
                jetstream::run(&a, rate)
            } else if name.starts_with("unimesh sync=always") {
                unimesh::run(&a, "always", rate)
            } else {
                unimesh::run(&a, &a.sync_interval_ms.to_string(), rate)
            };
            println!("{HEADER}\n{}", sample.row(&name, None));
            systems[i].1.push(sample);
        }
    }
    report(&a, &systems);
}

/// The table of the best run of each system (highest end-to-end rate), ratios to unimesh
/// sync=always, and every sample as JSON.
fn report(a: &Args, systems: &[(String, Vec<Sample>)]) {
    let best = |samples: &[Sample]| -> Option<usize> {
        (0..samples.len()).max_by(|&x, &y| {
            samples[x]
                .end_to_end_per_s()
                .total_cmp(&samples[y].end_to_end_per_s())
        })
    };
    let reference = systems
        .first()
        .and_then(|(_, s)| best(s).map(|i| s[i].end_to_end_per_s()));
    println!("\ncompare: best of {} runs each; ratio = end-to-end events/s over unimesh sync=always; latencies in ms", a.runs);
    println!("{HEADER}");
    for (name, samples) in systems {
        if let Some(i) = best(samples) {
            println!("{}", samples[i].row(name, reference));
        }
    }
    if let Some(path) = &a.json {
        let all: Vec<serde_json::Value> = systems
            .iter()
            .flat_map(|(name, samples)| {
                samples
                    .iter()
                    .enumerate()
                    .map(move |(run, s)| s.to_json(name, run))
            })
            .collect();
        let doc = serde_json::json!({
            "events": a.events, "size": a.size, "publishers": a.publishers, "batch": a.batch,
            "consumers": a.consumers, "poll": a.poll, "partitions": a.partitions,
            "samples": all,
        });
        if let Err(e) = std::fs::write(path, format!("{doc:#}\n")) {
            eprintln!("compare: cannot write {path}: {e}");
            std::process::exit(1);
        }
        println!("compare: samples written to {path}");
    }
}
