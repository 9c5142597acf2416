//! A simple end-to-end load: starts a `unimesh serve` (release, on a temporary data
//! directory), runs publishers and consumers over HTTP for a fixed number of events and
//! prints events per second. A measurement, not a test: nothing here asserts on speed.
//!
//! ```text
//! cargo run --release -p unimesh-tests --example load -- \
//!     [--events 100000] [--publishers 4] [--consumers 4] [--batch 50] [--poll 200] \
//!     [--partitions 4] [--transport poll|sse|ws|webhook|webhook-batch] [--push-batch 50] \
//!     [--size 1024] [--tls off|on] [--token off|on]
//! ```
//!
//! Publishers send batch-mode requests of `--batch` events (1 = one binary-mode event per
//! request) of about `--size` bytes of data each; every publish is answered only once
//! durable. Consumers, by transport:
//! - `poll`: long-poll up to `--poll` deliveries and ACK each poll's deliveries in one request;
//! - `sse`: one SSE stream each; deliveries ACKed by HTTP in batches of up to `--poll`;
//! - `ws`: one WebSocket each; deliveries ACKed by `{"ack":[...]}` frames in batches;
//! - `webhook`: the group pushes to a receiver here (`--consumers` is ignored; the mesh's
//!   `push.max_concurrency` applies), which answers 200 (= ACK); `webhook-batch`: the same
//!   with `push.batch` = `--push-batch` events per request.
//!
//! The clock runs from the first publish until every event is ACKed (for `webhook`: until
//! the group's counters say every event is ACKed). The loops are `unimesh_tests::load`'s,
//! shared with `benches/src/bin/compare`.
//!
//! `--tls on`: the mesh serves HTTPS with a certificate of a throw-away CA (`openssl`, as
//! `tests/tls.rs`), and the load client speaks it (rustls on `ring`, like the mesh).
//! `--token on`: `[auth]` holds one identity with every right, and every request carries
//! its static bearer token (checked by SHA-256 and constant-time comparison). Both work
//! with the `poll` transport only (the SSE and WebSocket consumers here speak plain TCP).

use std::time::Duration;

use unimesh_tests::load::{self, Outcome, Spec, Transport};
use unimesh_tests::{Options, Server};

struct Args {
    events: u64,
    publishers: u64,
    consumers: u64,
    batch: u64,
    poll: u64,
    partitions: u64,
    size: u64,
    transport_name: String,
    transport: Transport,
    push_batch: u64,
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
        transport_name: "poll".to_owned(),
        transport: Transport::Poll,
        push_batch: 50,
        tls: false,
        token: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let text = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        if flag == "--transport" {
            a.transport_name = text;
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
            "--push-batch" => a.push_batch = value.min(1000),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    a.transport = Transport::parse(&a.transport_name, a.push_batch as u32)?;
    if (a.tls || a.token) && a.transport != Transport::Poll {
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
    let on = |b: bool| if b { "on" } else { "off" };
    println!(
        "load: {} events of {} bytes, {} publishers (batches of {}), {} consumers by {} (batches of up to {}), {} partitions, TLS {}, token {}, {}",
        a.events,
        a.size,
        a.publishers,
        a.batch,
        a.consumers,
        a.transport.name(),
        a.poll,
        a.partitions,
        on(a.tls),
        on(a.token),
        if unimesh_tests::built_as_release() { "release" } else { "debug" }
    );
    let mut spec = Spec::new(a.events, a.size);
    spec.transport = a.transport;
    spec.publishers = a.publishers;
    spec.consumers = a.consumers;
    spec.batch = a.batch;
    spec.poll = a.poll;
    let o: Outcome<()> = load::run(&s, &spec);
    let rate = |n: u64, d: Duration| n as f64 / d.as_secs_f64().max(1e-9);
    println!(
        "load: published {} events in {:.2} s: {:.0} events/s",
        a.events,
        o.publish_wall.as_secs_f64(),
        rate(a.events, o.publish_wall)
    );
    println!(
        "load: publish -> deliver -> ACK of {} events in {:.2} s: {:.0} events/s \
         ({} redeliveries)",
        o.acked,
        o.total_wall.as_secs_f64(),
        rate(o.acked, o.total_wall),
        o.redelivered
    );
    // On a small machine the load client competes with the server for the same cores.
    println!(
        "load: CPU over the run: server {:.2} s, load client {:.2} s, in {:.2} s",
        o.server_cpu_s,
        o.client_cpu_s,
        o.total_wall.as_secs_f64()
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
