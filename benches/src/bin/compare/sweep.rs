//! `compare --sweep`: how unimesh (embedded log, `storage.sync = "always"`, long-poll)
//! scales as one thing grows and the rest stays at the comparison's settings: partitions
//! (1 → 16), groups on one topic (fan-out 1 → 100, one consumer each), consumers of one
//! group (1 → 16), `maxInFlightPerClient` (1 → 10 000) and event size (100 B → 64 KiB).
//! One line per point (deliveries/s over the run, p99 publish → deliver and publish → ACK,
//! the server's CPU per delivery), JSON with `--json`, a PNG with `--plot`; then the memory
//! of an idle subscription and of a delivery in flight, from the server's RSS.
//!
//! Each point is a fresh server, so no point inherits another's log or cache. Fan-out
//! points send fewer events as the groups grow (`--sweep-events` × 4 / groups, at least
//! 1 000) so each stays about as long; their rate counts deliveries, not events.

use std::time::Duration;

use serde_json::{json, Value};
use unimesh_tests::load::{self, Spec, Transport};
use unimesh_tests::{topic_path, Call, Server};

use super::unimesh::{self, Storage};
use super::{write_json, Args, Machine};

/// Largest publish request the sweep sends (the server's limit is 8 MiB).
const MAX_REQUEST_BYTES: u64 = 4 << 20;

/// One measured point.
#[derive(Clone, Debug)]
pub struct Point {
    pub dimension: &'static str,
    pub value: u64,
    pub events: u64,
    pub deliveries_per_s: f64,
    pub publish_per_s: f64,
    pub deliver_p99_ms: f64,
    pub ack_p99_ms: f64,
    pub server_us_per_delivery: f64,
    pub client_cpu_s: f64,
}

impl Point {
    fn to_json(&self) -> Value {
        json!({
            "dimension": self.dimension, "value": self.value, "events": self.events,
            "deliveries_per_s": self.deliveries_per_s, "publish_per_s": self.publish_per_s,
            "deliver_p99_ms": self.deliver_p99_ms, "ack_p99_ms": self.ack_p99_ms,
            "server_cpu_us_per_delivery": self.server_us_per_delivery,
            "client_cpu_s": self.client_cpu_s,
        })
    }
}

/// The dimensions and their values, in the order they are run and plotted.
pub const DIMENSIONS: [(&str, &[u64]); 5] = [
    ("partitions", &[1, 2, 4, 8, 16]),
    ("groups", &[1, 2, 5, 10, 20, 50, 100]),
    ("consumers", &[1, 2, 4, 8, 16]),
    ("in-flight", &[1, 10, 100, 1_000, 10_000]),
    ("size", &[100, 1_024, 4_096, 16_384, 65_536]),
];

pub fn run(a: &Args, dims: &str, machine: &Machine) {
    let wanted: Vec<&str> = dims.split(',').collect();
    for w in &wanted {
        if *w != "all" && *w != "memory" && !DIMENSIONS.iter().any(|(d, _)| d == w) {
            eprintln!(
                "compare: --sweep takes all, memory or a list of {}",
                DIMENSIONS.map(|(d, _)| d).join(", ")
            );
            std::process::exit(2);
        }
    }
    let all = wanted.contains(&"all");
    println!(
        "sweep: {} events per point of {} bytes unless the dimension is size, {} publishers (batches of {}), polls of {}; one fresh server per point",
        a.sweep_events, a.size, a.publishers, a.batch, a.poll
    );
    println!("sweep: dimension       value     events  deliveries/s   publish/s  dlv p99 ms  ack p99 ms  srv us/dlv  cli cpu s");
    let mut points = Vec::new();
    for (dim, values) in DIMENSIONS {
        if !all && !wanted.contains(&dim) {
            continue;
        }
        for &v in values {
            let p = point(a, dim, v);
            println!(
                "sweep: {:<12} {:>8} {:>10} {:>13.0} {:>11.0} {:>11.1} {:>11.1} {:>11.1} {:>10.2}",
                p.dimension,
                p.value,
                p.events,
                p.deliveries_per_s,
                p.publish_per_s,
                p.deliver_p99_ms,
                p.ack_p99_ms,
                p.server_us_per_delivery,
                p.client_cpu_s
            );
            points.push(p);
        }
    }
    let after = Machine::now();
    println!(
        "sweep: load average before {:.2}, after {:.2}",
        machine.load1, after.load1
    );
    if let Some(path) = &a.plot {
        match super::plot::draw(path, &points, machine) {
            Ok(()) => println!("sweep: plot written to {path}"),
            Err(e) => eprintln!("sweep: no plot: {e}"),
        }
    }
    let memory = (all || wanted.contains(&"memory")).then(|| memory(a));
    if let Some(path) = &a.json {
        let doc = json!({
            "machine": machine.to_json(), "load_average_after": after.load1,
            "events_per_point": a.sweep_events, "size": a.size, "publishers": a.publishers,
            "batch": a.batch, "poll": a.poll,
            "points": points.iter().map(Point::to_json).collect::<Vec<_>>(),
            "memory": memory,
        });
        write_json(path, &doc);
    }
}

/// One point: `dim` at `v`, everything else at the comparison's settings.
fn point(a: &Args, dim: &'static str, v: u64) -> Point {
    let mut partitions = a.partitions;
    let mut spec = Spec::new(a.sweep_events, a.size);
    spec.transport = Transport::Poll;
    spec.publishers = a.publishers;
    spec.consumers = a.consumers;
    spec.batch = a.batch;
    spec.poll = a.poll;
    match dim {
        "partitions" => partitions = v,
        "groups" => {
            spec.groups = v as u32;
            spec.consumers = 1;
            spec.events = (a.sweep_events * 4 / v).clamp(1_000, a.sweep_events);
        }
        "consumers" => spec.consumers = v,
        "in-flight" => {
            spec.max_in_flight = v as u32;
            // One delivery per poll is slow: fewer events, so the point stays short.
            spec.events = a.sweep_events.min(2_000 * v);
        }
        "size" => {
            spec.size = v;
            spec.batch = a.batch.min((MAX_REQUEST_BYTES / (v + 200)).max(1));
        }
        other => unreachable!("not a dimension: {other}"),
    }
    let s = unimesh::start(
        partitions,
        &Storage::Embedded {
            sync_interval_ms: None,
        },
        "sweep",
    );
    let sample = unimesh::sample(spec.events, load::run(&s, &spec));
    let deliveries = spec.events * u64::from(spec.groups);
    let wall = sample.total_wall.as_secs_f64().max(1e-9);
    Point {
        dimension: dim,
        value: v,
        events: spec.events,
        deliveries_per_s: deliveries as f64 / wall,
        publish_per_s: sample.publish_per_s(),
        deliver_p99_ms: sample.deliver_us.value_at_quantile(0.99) as f64 / 1000.0,
        ack_p99_ms: sample.ack_us.value_at_quantile(0.99) as f64 / 1000.0,
        server_us_per_delivery: sample.server_cpu_s * 1e6 / deliveries.max(1) as f64,
        client_cpu_s: sample.client_cpu_s,
    }
}

/// The server's resident memory, in bytes (from /proc; 0 if unreadable).
fn rss(s: &Server) -> u64 {
    let Some(pid) = s.pid() else { return 0 };
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// RSS once it has stopped moving (the allocator returns and takes pages lazily): the
/// last of readings 200 ms apart that agree within 1 %, or the fifth.
fn settled_rss(s: &Server) -> u64 {
    let mut last = rss(s);
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(200));
        let now = rss(s);
        if now.abs_diff(last) * 100 <= last {
            return now;
        }
        last = now;
    }
    last
}

/// Memory per idle subscription (RSS with 0, 1 000 and 4 000 groups on one topic, no
/// client) and per delivery in flight (RSS after publishing 40 000 events on 16
/// partitions, and again once four clients hold all of them un-ACKed).
fn memory(a: &Args) -> Value {
    let storage = Storage::Embedded {
        sync_interval_ms: None,
    };
    let s = unimesh::start(a.partitions, &storage, "memory");
    let mut idle = Vec::new();
    let base = settled_rss(&s);
    let mut made = 0u64;
    for n in [1_000u64, 4_000] {
        while made < n {
            s.subscribe(&format!("idle-{made}"), &json!({ "topic": "idle" }));
            made += 1;
        }
        let now = settled_rss(&s);
        let per = now.saturating_sub(base) as f64 / n as f64;
        println!(
            "sweep: memory: {n} idle groups: RSS {:.1} MiB ({:.1} MiB without any), {per:.0} bytes per group",
            now as f64 / 1048576.0,
            base as f64 / 1048576.0
        );
        idle.push(json!({ "groups": n, "rss_bytes": now, "base_rss_bytes": base, "bytes_per_group": per }));
    }
    drop(s);

    // Four clients holding the most one may (`maxInFlightPerClient` is at most 10 000), on
    // 16 partitions: a lane holds at most `max_window_per_lane` (4 096) records not done,
    // so 40 000 in flight need more than the comparison's 4 partitions.
    let (clients, per_client, partitions) = (4u64, 10_000u64, 16u64);
    let n = clients * per_client;
    let s = unimesh::start(partitions, &storage, "memory");
    s.subscribe(
        "held",
        &json!({ "topic": "held", "ackTimeoutMs": 600000, "maxInFlightPerClient": per_client }),
    );
    let pad = "x".repeat(a.size.saturating_sub(32) as usize);
    let url = s.http_url(&topic_path("held"));
    let agent = s.agent();
    let batch = a.batch.min((MAX_REQUEST_BYTES / (a.size + 200)).max(1));
    let mut first = 0;
    while first < n {
        let last = (first + batch).min(n);
        let body: Vec<String> = (first..last)
            .map(|i| format!(r#"{{"specversion":"1.0","id":"h{i}","source":"/load","type":"load","datacontenttype":"application/json","data":{{"t":0,"p":"{pad}"}}}}"#))
            .collect();
        Call::new(&agent, "POST", url.as_str())
            .header("content-type", unimesh_tests::BATCH_MEDIA_TYPE)
            .body(format!("[{}]", body.join(",")))
            .send()
            .expect(200);
        first = last;
    }
    let before = settled_rss(&s);
    let mut held = 0u64;
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    for c in 0..clients {
        let mut mine = 0;
        while mine < per_client {
            assert!(
                std::time::Instant::now() < deadline,
                "memory: {} of {n} deliveries in flight after 5 minutes",
                held + mine
            );
            let r = s.poll_raw("held", &format!("holder{c}"), 1000, 500);
            r.expect(200);
            let got: Vec<serde_json::Value> = serde_json::from_slice(&r.body)
                .unwrap_or_else(|e| panic!("a poll answer that is not deliveries: {e}"));
            mine += got.len() as u64;
        }
        held += mine;
    }
    let after = settled_rss(&s);
    let per = after.saturating_sub(before) as f64 / n as f64;
    println!(
        "sweep: memory: {n} deliveries of {} B events in flight: RSS {:.1} MiB, {:.1} MiB before the polls, {per:.0} bytes per delivery",
        a.size,
        after as f64 / 1048576.0,
        before as f64 / 1048576.0
    );
    json!({
        "idle_groups": idle,
        "in_flight": { "deliveries": n, "partitions": partitions, "size": a.size, "rss_before_bytes": before, "rss_after_bytes": after, "bytes_per_delivery": per },
    })
}
