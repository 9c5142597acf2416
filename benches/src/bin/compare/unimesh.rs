//! The unimesh side: `unimesh serve` (embedded log, a temporary data directory), P publisher
//! threads sending batch-mode requests (or one binary-mode event per request with
//! `--batch 1`), C consumer threads long-polling and ACKing each poll's deliveries in one
//! request. Every event carries its publish time; a consumer records publish → delivery
//! when it parses it and publish → ACK when the ACK is answered.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Deserialize;
use serde_json::json;
use unimesh_tests::{
    binary_call, cpu_seconds, process_cpu_seconds, topic_path, Call, Options, Server,
};

use super::sample::{histogram, paced, Sample};
use super::Args;

pub fn run(a: &Args, sync: &str, rate: u64) -> Sample {
    let storage = match sync {
        "always" => String::new(),
        ms => format!("sync = \"interval\"\nsync_interval_ms = {ms}\n"),
    };
    let s = Server::start(Options::new().toml(&format!(
        "log = \"warn\"\n[storage]\ndefault_partitions = {}\n{storage}",
        a.partitions
    )));
    s.subscribe(
        "load",
        &json!({"topic": "load", "ackTimeoutMs": 60000, "maxInFlightPerClient": 10000}),
    );
    let pad = "x".repeat(a.size.saturating_sub(40) as usize);
    let next = Arc::new(AtomicU64::new(0));
    let acked = Arc::new(AtomicU64::new(0));
    let redelivered = Arc::new(AtomicU64::new(0));
    let hists = Arc::new(Mutex::new((histogram(), histogram())));
    let cpu0 = cpu_seconds();
    let server_cpu0 = process_cpu_seconds(s.pid());
    let started = Instant::now();
    let url = s.http_url(&topic_path("load"));
    let publishers: Vec<_> = (0..a.publishers)
        .map(|_| {
            let (agent, url, next, pad) = (s.agent(), url.clone(), next.clone(), pad.clone());
            let (events, batch) = (a.events, a.batch);
            std::thread::spawn(move || {
                publish(&agent, &url, &next, (events, batch, rate), &pad, started)
            })
        })
        .collect();
    let consumers: Vec<_> = (0..a.consumers)
        .map(|c| {
            let poll_url = s.http_url(&format!(
                "/v1/subscriptions/load/events?client=c{c}&max={}&waitMs=500",
                a.poll
            ));
            let ack_url = s.http_url("/v1/subscriptions/load/ack");
            let (agent, acked, redelivered, hists) =
                (s.agent(), acked.clone(), redelivered.clone(), hists.clone());
            let events = a.events;
            std::thread::spawn(move || {
                let (mut deliver, mut ack) = (histogram(), histogram());
                consume(
                    &agent,
                    &poll_url,
                    &ack_url,
                    &acked,
                    &redelivered,
                    events,
                    started,
                    (&mut deliver, &mut ack),
                );
                if let Ok(mut h) = hists.lock() {
                    let _ = h.0.add(&deliver);
                    let _ = h.1.add(&ack);
                }
            })
        })
        .collect();
    for p in publishers {
        if p.join().is_err() {
            panic!("a unimesh publisher failed");
        }
    }
    let publish_wall = started.elapsed();
    for c in consumers {
        if c.join().is_err() {
            panic!("a unimesh consumer failed");
        }
    }
    let total_wall = started.elapsed();
    let client_cpu_s = cpu_seconds() - cpu0;
    let server_cpu_s = process_cpu_seconds(s.pid()) - server_cpu0;
    // Every consumer thread has been joined: the lock is free and not poisoned.
    let (deliver_us, ack_us) = match hists.lock() {
        Ok(h) => (h.0.clone(), h.1.clone()),
        Err(_) => panic!("a consumer panicked holding the histograms"),
    };
    Sample {
        events: a.events,
        publish_wall,
        total_wall,
        deliver_us,
        ack_us,
        redelivered: redelivered.load(Ordering::Relaxed),
        server_cpu_s,
        client_cpu_s,
    }
}

/// One delivery of a poll answer, as far as the load reads it.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Polled<'a> {
    delivery_id: &'a str,
    attempt: u32,
    event: PolledEvent,
}

#[derive(Deserialize)]
struct PolledEvent {
    data: Stamp,
}

#[derive(Deserialize)]
struct Stamp {
    t: u64,
}

fn micros(started: Instant) -> u64 {
    started.elapsed().as_micros() as u64
}

fn publish(
    agent: &ureq::Agent,
    url: &str,
    next: &AtomicU64,
    (events, batch, rate): (u64, u64, u64),
    pad: &str,
    started: Instant,
) {
    loop {
        let first = next.fetch_add(batch, Ordering::Relaxed);
        if first >= events {
            return;
        }
        let last = (first + batch).min(events);
        let t = paced(started, first, rate);
        let r = if batch == 1 {
            let attrs = json!({
                "specversion": "1.0", "id": format!("l{first}"), "source": "/load",
                "type": "load", "datacontenttype": "application/json",
            });
            let body = format!("{{\"t\":{t},\"p\":\"{pad}\"}}");
            binary_call(agent, url, &attrs, body.as_bytes()).send()
        } else {
            // Written as a producer that knows its event shape writes it (the pad needs no
            // escaping): no JSON tree per event on the client.
            let mut body = String::with_capacity((last - first) as usize * (pad.len() + 160));
            body.push('[');
            for i in first..last {
                if i > first {
                    body.push(',');
                }
                let _ = write!(
                    body,
                    r#"{{"specversion":"1.0","id":"l{i}","source":"/unimesh/tests","type":"load","datacontenttype":"application/json","data":{{"t":{t},"p":"{pad}"}}}}"#
                );
            }
            body.push(']');
            Call::new(agent, "POST", url)
                .header("content-type", "application/cloudevents-batch+json")
                .body(body)
                .send()
        };
        if r.status != 200 {
            panic!("unimesh answered a publish {}: {}", r.status, r.text());
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn consume(
    agent: &ureq::Agent,
    poll_url: &str,
    ack_url: &str,
    acked: &AtomicU64,
    redelivered: &AtomicU64,
    events: u64,
    started: Instant,
    (deliver, ack): (&mut Histogram<u64>, &mut Histogram<u64>),
) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while acked.load(Ordering::Relaxed) < events {
        assert!(
            Instant::now() < deadline,
            "unimesh: not every event ACKed in 10 minutes"
        );
        let r = Call::new(agent, "GET", poll_url).send();
        r.expect(200);
        // What a consumer that knows its event shape reads: the id, the attempt and the
        // publish time, borrowed from the answer (no JSON tree, no copy of the events).
        let d: Vec<Polled<'_>> = serde_json::from_slice(&r.body)
            .unwrap_or_else(|e| panic!("a poll answer that is not deliveries: {e}"));
        if d.is_empty() {
            continue;
        }
        let now = micros(started);
        let mut sent = Vec::with_capacity(d.len());
        for x in &d {
            if x.attempt > 1 {
                redelivered.fetch_add(1, Ordering::Relaxed);
            }
            let t = x.event.data.t;
            let _ = deliver.record(now.saturating_sub(t).max(1));
            sent.push(t);
        }
        let ids: Vec<&str> = d.iter().map(|x| x.delivery_id).collect();
        let answer = Call::new(agent, "POST", ack_url)
            .json(&json!({"deliveryIds": ids}))
            .send()
            .ok_json(200);
        let now = micros(started);
        for t in sent {
            let _ = ack.record(now.saturating_sub(t).max(1));
        }
        acked.fetch_add(answer["acked"].as_u64().unwrap_or(0), Ordering::Relaxed);
    }
}
