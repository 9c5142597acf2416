//! A simple end-to-end load: starts a `unimesh serve` (release, on a temporary data
//! directory), runs publishers and consumers over HTTP for a fixed number of events and
//! prints events per second. A measurement, not a test: nothing here asserts on speed.
//!
//! ```text
//! cargo run --release -p unimesh-tests --example load -- \
//!     [--events 100000] [--publishers 4] [--consumers 4] [--batch 50] [--poll 200] \
//!     [--partitions 4]
//! ```
//!
//! Publishers send batch-mode requests of `--batch` events (1 = one binary-mode event per
//! request); every publish is answered only once durable. Consumers long-poll up to `--poll`
//! deliveries and ACK each poll's deliveries in one request. The clock runs from the first
//! publish until every event is ACKed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use unimesh_tests::{
    binary_call, event, json, parse_deliveries, topic_path, Call, Options, Server, Value,
};

struct Args {
    events: u64,
    publishers: u64,
    consumers: u64,
    batch: u64,
    poll: u64,
    partitions: u64,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        events: 100_000,
        publishers: 4,
        consumers: 4,
        batch: 50,
        poll: 200,
        partitions: 4,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value"))?
            .parse::<u64>()
            .map_err(|e| format!("{flag}: {e}"))?;
        if value == 0 {
            return Err(format!("{flag} must be at least 1"));
        }
        match flag.as_str() {
            "--events" => a.events = value,
            "--publishers" => a.publishers = value,
            "--consumers" => a.consumers = value,
            "--batch" => a.batch = value.min(1000),
            "--poll" => a.poll = value.min(1000),
            "--partitions" => a.partitions = value,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("load: {e}");
            std::process::exit(2);
        }
    };
    if !unimesh_tests::built_as_release() {
        eprintln!("load: note: this is a debug build; use --release for meaningful numbers");
    }
    let opts = Options::new().toml(&format!(
        "log = \"warn\"\n[storage]\ndefault_partitions = {}\n",
        a.partitions
    ));
    let s = Server::start(opts);
    s.subscribe(
        "load",
        &json!({ "topic": "load", "ackTimeoutMs": 60000, "maxInFlightPerClient": 10000 }),
    );
    println!(
        "load: {} events, {} publishers (batches of {}), {} consumers (polls of up to {}), {} partitions, {}",
        a.events,
        a.publishers,
        a.batch,
        a.consumers,
        a.poll,
        a.partitions,
        if unimesh_tests::built_as_release() { "release" } else { "debug" }
    );

    let next = Arc::new(AtomicU64::new(0));
    let acked = Arc::new(AtomicU64::new(0));
    let redelivered = Arc::new(AtomicU64::new(0));
    let publish_url = s.http_url(&topic_path("load"));
    let started = Instant::now();
    let mut publishers = Vec::new();
    for _ in 0..a.publishers {
        let (agent, url, next) = (s.agent(), publish_url.clone(), next.clone());
        let (events, batch) = (a.events, a.batch);
        publishers.push(std::thread::spawn(move || loop {
            let first = next.fetch_add(batch, Ordering::Relaxed);
            if first >= events {
                return;
            }
            let last = (first + batch).min(events);
            let r = if batch == 1 {
                let attrs = json!({
                    "specversion": "1.0", "id": format!("l{first}"), "source": "/load",
                    "type": "load", "datacontenttype": "application/json",
                });
                binary_call(
                    &agent,
                    &url,
                    &attrs,
                    format!("{{\"n\":{first}}}").as_bytes(),
                )
                .send()
            } else {
                let batch: Vec<Value> = (first..last)
                    .map(|i| event(&format!("l{i}"), "load", json!({ "n": i })))
                    .collect();
                Call::new(&agent, "POST", url.as_str())
                    .header("content-type", "application/cloudevents-batch+json")
                    .body(Value::Array(batch).to_string())
                    .send()
            };
            if r.status != 200 {
                panic!("publish answered {}: {}", r.status, r.text());
            }
        }));
    }
    let mut consumers = Vec::new();
    for c in 0..a.consumers {
        let agent = s.agent();
        let poll_url = s.http_url(&format!(
            "/v1/subscriptions/load/events?client=c{c}&max={}&waitMs=500",
            a.poll
        ));
        let ack_url = s.http_url("/v1/subscriptions/load/ack");
        let (acked, redelivered, events) = (acked.clone(), redelivered.clone(), a.events);
        consumers.push(std::thread::spawn(move || {
            while acked.load(Ordering::Relaxed) < events {
                let r = Call::new(&agent, "GET", poll_url.as_str()).send();
                r.expect(200);
                let d = parse_deliveries(&r);
                if d.is_empty() {
                    continue;
                }
                let again = d.iter().filter(|x| x.attempt > 1).count() as u64;
                redelivered.fetch_add(again, Ordering::Relaxed);
                let ids: Vec<&str> = d.iter().map(|x| x.id.as_str()).collect();
                let answer = Call::new(&agent, "POST", ack_url.as_str())
                    .json(&json!({ "deliveryIds": ids }))
                    .send()
                    .ok_json(200);
                let n = answer["acked"].as_u64().unwrap_or(0);
                acked.fetch_add(n, Ordering::Relaxed);
            }
        }));
    }
    for p in publishers {
        if p.join().is_err() {
            panic!("a publisher failed");
        }
    }
    let published_in = started.elapsed();
    let mut last_report = Instant::now();
    while acked.load(Ordering::Relaxed) < a.events {
        std::thread::sleep(Duration::from_millis(20));
        if last_report.elapsed() > Duration::from_secs(10) {
            eprintln!(
                "load: {} of {} ACKed",
                acked.load(Ordering::Relaxed),
                a.events
            );
            last_report = Instant::now();
        }
        if consumers.iter().all(|c| c.is_finished()) {
            break;
        }
    }
    let total = started.elapsed();
    for c in consumers {
        if c.join().is_err() {
            panic!("a consumer failed");
        }
    }
    let acked = acked.load(Ordering::Relaxed);
    let rate = |n: u64, d: Duration| n as f64 / d.as_secs_f64().max(1e-9);
    println!(
        "load: published {} events in {:.2} s: {:.0} events/s",
        a.events,
        published_in.as_secs_f64(),
        rate(a.events, published_in)
    );
    println!(
        "load: publish -> deliver -> ACK of {acked} events in {:.2} s: {:.0} events/s \
         ({} redeliveries)",
        total.as_secs_f64(),
        rate(acked, total),
        redelivered.load(Ordering::Relaxed)
    );
    let m = s.metrics();
    let count = unimesh_tests::metric(&m, "unimesh_publish_latency_seconds_count", "");
    let sum = unimesh_tests::metric(&m, "unimesh_publish_latency_seconds_sum", "");
    if let (Some(c), Some(sum)) = (count, sum) {
        if c > 0.0 {
            println!(
                "load: mean publish request latency {:.2} ms over {c} requests",
                sum / c * 1000.0
            );
        }
    }
}
