//! A simple end-to-end load: starts a `unimesh serve` (release, on a temporary data
//! directory), runs publishers and consumers over HTTP for a fixed number of events and
//! prints events per second. A measurement, not a test: nothing here asserts on speed.
//!
//! ```text
//! cargo run --release -p unimesh-tests --example load -- \
//!     [--events 100000] [--publishers 4] [--consumers 4] [--batch 50] [--poll 200] \
//!     [--partitions 4] [--transport poll|sse|ws|webhook] [--size 1024] \
//!     [--tls off|on] [--token off|on]
//! ```
//!
//! Publishers send batch-mode requests of `--batch` events (1 = one binary-mode event per
//! request) of about `--size` bytes of data each; every publish is answered only once
//! durable. Consumers, by transport:
//! - `poll`: long-poll up to `--poll` deliveries and ACK each poll's deliveries in one request;
//! - `sse`: one SSE stream each; deliveries ACKed by HTTP in batches of up to `--poll`;
//! - `ws`: one WebSocket each; deliveries ACKed by `{"ack":[...]}` frames in batches;
//! - `webhook`: the group pushes to a receiver here (`--consumers` is ignored; the mesh's
//!   `push.max_concurrency` applies), which answers 200 (= ACK).
//!
//! The clock runs from the first publish until every event is ACKed (for `webhook`: until
//! the group's counters say every event is ACKed).
//!
//! `--tls on`: the mesh serves HTTPS with a certificate of a throw-away CA (`openssl`, as
//! `tests/tls.rs`), and the load client speaks it (rustls on `ring`, like the mesh).
//! `--token on`: `[auth]` holds one identity with every right, and every request carries
//! its static bearer token (checked by SHA-256 and constant-time comparison). Both work
//! with the `poll` transport only (the SSE and WebSocket consumers here speak plain TCP).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use unimesh_tests::{
    binary_call, cpu_seconds, event, json, parse_deliveries, process_cpu_seconds, topic_path, Call,
    Options, Server, Value,
};

struct Args {
    events: u64,
    publishers: u64,
    consumers: u64,
    batch: u64,
    poll: u64,
    partitions: u64,
    size: u64,
    transport: String,
    tls: bool,
    token: bool,
}

/// The identity of `--token on`: its token and the token's SHA-256.
const TOKEN: &str = "tok-shop-3f9a";
const TOKEN_SHA256: &str = "982d1fa5fe370406f7d81a5f5f4e2a56a99e6b06772bc53ffea5d8da78162dbe";

fn args() -> Result<Args, String> {
    let mut a = Args {
        events: 100_000,
        publishers: 4,
        consumers: 4,
        batch: 50,
        poll: 200,
        partitions: 4,
        size: 1024,
        transport: "poll".to_owned(),
        tls: false,
        token: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let text = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        if flag == "--transport" {
            if !["poll", "sse", "ws", "webhook"].contains(&text.as_str()) {
                return Err(format!(
                    "--transport is poll, sse, ws or webhook, not {text}"
                ));
            }
            a.transport = text;
            continue;
        }
        if flag == "--tls" || flag == "--token" {
            let on = match text.as_str() {
                "on" => true,
                "off" => false,
                other => return Err(format!("{flag} is on or off, not {other}")),
            };
            if flag == "--tls" {
                a.tls = on;
            } else {
                a.token = on;
            }
            continue;
        }
        let value = text.parse::<u64>().map_err(|e| format!("{flag}: {e}"))?;
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
            "--size" => a.size = value,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if (a.tls || a.token) && a.transport != "poll" {
        return Err("--tls on and --token on work with --transport poll only".into());
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
    let mut toml = format!(
        "log = \"warn\"\n[storage]\ndefault_partitions = {}\n[push]\nallowed_hosts = \"127.0.0.1\"\n",
        a.partitions
    );
    let mut opts = Options::new();
    // Kept until the end: the certificates' directory.
    let pki = a.tls.then(unimesh_tests::pki::Pki::new);
    if let Some(pki) = &pki {
        let ca = pki.ca("ca");
        let cert = pki.server(&ca, "server", 1);
        toml.push_str(&format!(
            "[server.tls]\ncert = \"{}\"\nkey = \"{}\"\n",
            cert.cert.display(),
            cert.key.display()
        ));
        let ca_path = ca.cert.display().to_string();
        opts = opts.tls_probe(&["--cacert", &ca_path]).tls_ca(&ca.cert);
    }
    if a.token {
        toml.push_str(&format!(
            "[auth.identities.load]\ntoken_sha256 = \"{TOKEN_SHA256}\"\npublish = [\"*\"]\n\
             consume = [\"*\"]\ndefine = [\"*\"]\nadmin = true\n"
        ));
        opts = opts.bearer(TOKEN);
    }
    let s = Server::start(opts.toml(&toml));
    let hook = (a.transport == "webhook").then(unimesh_tests::hook::Hook::ok);
    let mut doc = json!({ "topic": "load", "ackTimeoutMs": 60000, "maxInFlightPerClient": 10000 });
    if let Some(h) = &hook {
        doc["push"] = json!({ "url": h.url("/load") });
    }
    s.subscribe("load", &doc);
    let on = |b: bool| if b { "on" } else { "off" };
    println!(
        "load: {} events of {} bytes, {} publishers (batches of {}), {} consumers by {} (batches of up to {}), {} partitions, TLS {}, token {}, {}",
        a.events,
        a.size,
        a.publishers,
        a.batch,
        a.consumers,
        a.transport,
        a.poll,
        a.partitions,
        on(a.tls),
        on(a.token),
        if unimesh_tests::built_as_release() { "release" } else { "debug" }
    );
    let pad = "x".repeat(a.size.saturating_sub(16) as usize);

    let next = Arc::new(AtomicU64::new(0));
    let acked = Arc::new(AtomicU64::new(0));
    let redelivered = Arc::new(AtomicU64::new(0));
    let publish_url = s.http_url(&topic_path("load"));
    let cpu0 = cpu_seconds();
    let server_cpu0 = process_cpu_seconds(s.pid());
    let started = Instant::now();
    let mut publishers = Vec::new();
    for _ in 0..a.publishers {
        let (agent, url, next) = (s.agent(), publish_url.clone(), next.clone());
        let (events, batch, pad) = (a.events, a.batch, pad.clone());
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
                    format!("{{\"n\":{first},\"p\":\"{pad}\"}}").as_bytes(),
                )
                .send()
            } else {
                let batch: Vec<Value> = (first..last)
                    .map(|i| event(&format!("l{i}"), "load", json!({ "n": i, "p": pad })))
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
    let consumers_n = if hook.is_some() { 0 } else { a.consumers };
    for c in 0..consumers_n {
        let (acked, redelivered, events) = (acked.clone(), redelivered.clone(), a.events);
        let (agent, poll) = (s.agent(), a.poll);
        let ack_url = s.http_url("/v1/subscriptions/load/ack");
        let addr = s.http_addr();
        let poll_url = s.http_url(&format!(
            "/v1/subscriptions/load/events?client=c{c}&max={poll}&waitMs=500"
        ));
        let transport = a.transport.clone();
        consumers.push(std::thread::spawn(move || match transport.as_str() {
            "sse" => sse_consumer(
                addr,
                c,
                &agent,
                &ack_url,
                poll,
                &acked,
                &redelivered,
                events,
            ),
            "ws" => ws_consumer(addr, c, poll, &acked, &redelivered, events),
            _ => poll_consumer(&agent, &poll_url, &ack_url, &acked, &redelivered, events),
        }));
    }
    if hook.is_some() {
        let (agent, url, acked, events) = (
            s.agent(),
            s.http_url("/v1/subscriptions/load"),
            acked.clone(),
            a.events,
        );
        consumers.push(std::thread::spawn(move || {
            while acked.load(Ordering::Relaxed) < events {
                let info = Call::new(&agent, "GET", url.as_str()).send().ok_json(200);
                acked.store(
                    info["stats"]["acked"].as_u64().unwrap_or(0),
                    Ordering::Relaxed,
                );
                std::thread::sleep(Duration::from_millis(20));
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
    let (client_cpu, server_cpu) = (
        cpu_seconds() - cpu0,
        process_cpu_seconds(s.pid()) - server_cpu0,
    );
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
    // On a small machine the load client competes with the server for the same cores.
    println!(
        "load: CPU over the run: server {server_cpu:.2} s, load client {client_cpu:.2} s, in {:.2} s",
        total.as_secs_f64()
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

type Counter = Arc<AtomicU64>;

fn poll_consumer(
    agent: &ureq::Agent,
    poll_url: &str,
    ack_url: &str,
    acked: &Counter,
    redelivered: &Counter,
    events: u64,
) {
    while acked.load(Ordering::Relaxed) < events {
        let r = Call::new(agent, "GET", poll_url).send();
        r.expect(200);
        let d = parse_deliveries(&r);
        if d.is_empty() {
            continue;
        }
        let again = d.iter().filter(|x| x.attempt > 1).count() as u64;
        redelivered.fetch_add(again, Ordering::Relaxed);
        let ids: Vec<&str> = d.iter().map(|x| x.id.as_str()).collect();
        ack_ids(agent, ack_url, &ids, acked);
    }
}

fn ack_ids(agent: &ureq::Agent, ack_url: &str, ids: &[&str], acked: &Counter) {
    let answer = Call::new(agent, "POST", ack_url)
        .json(&json!({ "deliveryIds": ids }))
        .send()
        .ok_json(200);
    acked.fetch_add(answer["acked"].as_u64().unwrap_or(0), Ordering::Relaxed);
}

/// One SSE stream; ACKs by HTTP, a batch at a time (whatever arrived, up to `batch`).
#[allow(clippy::too_many_arguments)]
fn sse_consumer(
    addr: std::net::SocketAddr,
    c: u64,
    agent: &ureq::Agent,
    ack_url: &str,
    batch: u64,
    acked: &Counter,
    redelivered: &Counter,
    events: u64,
) {
    let path = format!("/v1/subscriptions/load/stream?client=s{c}");
    let mut stream = unimesh_tests::sse::SseStream::open(addr, &path, None);
    assert_eq!(stream.status, 200, "{}", stream.body);
    let mut ids: Vec<String> = Vec::new();
    let flush = |ids: &mut Vec<String>| {
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        ack_ids(agent, ack_url, &refs, acked);
        ids.clear();
    };
    while acked.load(Ordering::Relaxed) < events {
        let e = match stream.next_event_within(Duration::from_millis(20)) {
            unimesh_tests::sse::Next::Event(e) => e,
            unimesh_tests::sse::Next::End => return,
            // Idle: ACK what arrived (every consumer may hold a tail short of a batch).
            unimesh_tests::sse::Next::Idle => {
                if !ids.is_empty() {
                    flush(&mut ids);
                }
                continue;
            }
        };
        let d: Value = serde_json::from_str(&e.data).unwrap_or(Value::Null);
        if d["attempt"].as_u64().is_some_and(|a| a > 1) {
            redelivered.fetch_add(1, Ordering::Relaxed);
        }
        ids.push(e.id.unwrap_or_default());
        // The stream's window is 256: ACK before it could fill, or at the batch size.
        if ids.len() as u64 >= batch.min(128)
            || acked.load(Ordering::Relaxed) + ids.len() as u64 >= events
        {
            flush(&mut ids);
        }
    }
}

/// One WebSocket; ACKs by frames, a batch at a time.
fn ws_consumer(
    addr: std::net::SocketAddr,
    c: u64,
    batch: u64,
    acked: &Counter,
    redelivered: &Counter,
    events: u64,
) {
    use tungstenite::Message;
    let url = format!("ws://{addr}/v1/subscriptions/load/ws?client=w{c}");
    let (mut ws, _) = tungstenite::connect(url).expect("WebSocket");
    if let tungstenite::stream::MaybeTlsStream::Plain(tcp) = ws.get_mut() {
        let _ = tcp.set_read_timeout(Some(Duration::from_millis(20)));
    }
    let mut ids: Vec<Value> = Vec::new();
    let mut pending = 0u64;
    while acked.load(Ordering::Relaxed) < events {
        let msg = match ws.read() {
            Ok(m) => Some(m),
            Err(tungstenite::Error::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                None
            }
            Err(_) => return,
        };
        let Some(msg) = msg else {
            // Idle: ACK what arrived.
            if !ids.is_empty() {
                let frame = json!({ "ack": std::mem::take(&mut ids) }).to_string();
                if ws.send(Message::Text(frame.into())).is_err() {
                    return;
                }
                pending += 1;
            }
            continue;
        };
        let Message::Text(t) = msg else { continue };
        let v: Value = serde_json::from_str(&t).unwrap_or(Value::Null);
        if v.get("result").is_some() {
            acked.fetch_add(v["acked"].as_u64().unwrap_or(0), Ordering::Relaxed);
            pending = pending.saturating_sub(1);
            continue;
        }
        if v["attempt"].as_u64().is_some_and(|a| a > 1) {
            redelivered.fetch_add(1, Ordering::Relaxed);
        }
        ids.push(v["deliveryId"].clone());
        if ids.len() as u64 >= batch.min(128)
            || acked.load(Ordering::Relaxed) + ids.len() as u64 >= events
        {
            let frame = json!({ "ack": std::mem::take(&mut ids) }).to_string();
            if ws.send(Message::Text(frame.into())).is_err() {
                return;
            }
            pending += 1;
        }
    }
    let _ = pending;
}
