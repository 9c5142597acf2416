//! Throughput of publish → deliver → ACK on the Kafka backend, against the same broker
//! used directly with rdkafka, in the same run on the same machine, with 1 KiB events.
//! A measurement, not a test: nothing here asserts on speed.
//!
//! ```text
//! cargo run --release -p unimesh-tests --example kafka_load -- \
//!     [--events 20000] [--publishers 4] [--consumers 4] [--batch 50] [--partitions 4]
//! ```
//!
//! Both sides start from an empty tansu broker (`unimesh_tests::kafka`) and do the same
//! work: `publishers` threads write batches of `batch` 1 KiB events and wait for each batch
//! to be acknowledged (`acks=all`, idempotent); `consumers` read them and acknowledge each
//! read batch (unimesh: an HTTP long-poll and one ACK request; direct: a consumer-group
//! member that commits each polled batch synchronously). The clock runs from the first
//! write until every event is acknowledged. The CPU time of this load client, of the
//! broker and of the unimesh server during each run is printed too, since on two cores
//! they compete with each other.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use madsim_rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use madsim_rdkafka::producer::{FutureProducer, FutureRecord};
use madsim_rdkafka::{ClientConfig, Message};
use unimesh_tests::kafka::Broker;
use unimesh_tests::{
    cpu_seconds, json, parse_deliveries, process_cpu_seconds, topic_path, Call, Options, Server,
    Value,
};

const EVENT_BYTES: usize = 1024;

struct Args {
    events: u64,
    publishers: u64,
    consumers: u64,
    batch: u64,
    partitions: u64,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        events: 20_000,
        publishers: 4,
        consumers: 4,
        batch: 50,
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
            "--partitions" => a.partitions = value,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(a)
}

/// A 1 KiB JSON payload.
fn payload(i: u64) -> String {
    let head = format!("{{\"n\":{i},\"pad\":\"");
    let pad = EVENT_BYTES.saturating_sub(head.len() + 2);
    format!("{head}{}\"}}", "x".repeat(pad))
}

struct Outcome {
    name: &'static str,
    seconds: f64,
    cpu: f64,
    /// CPU seconds of the broker during the run.
    broker_cpu: f64,
    /// CPU seconds of the unimesh server during the run (NaN on the direct side).
    server_cpu: f64,
}

fn through_unimesh(broker: &Broker, a: &Args) -> Outcome {
    let s = Server::start(
        Options::new()
            .toml("log = \"warn\"\n")
            .toml(&broker.server_toml("load", a.partitions as u32)),
    );
    s.subscribe(
        "load",
        &json!({ "topic": "load", "ackTimeoutMs": 60000, "maxInFlightPerClient": 10000, "startFrom": "earliest" }),
    );
    // The clock starts once Kafka assigned the group's partitions (as on the direct side).
    unimesh_tests::wait_for(
        "the group's partitions assigned",
        Duration::from_secs(60),
        || (s.offsets("load").len() == a.partitions as usize).then_some(()),
    );
    let next = Arc::new(AtomicU64::new(0));
    let acked = Arc::new(AtomicU64::new(0));
    let url = s.http_url(&topic_path("load"));
    let cpu0 = cpu_seconds();
    let broker_cpu0 = process_cpu_seconds(broker.pid());
    let server_cpu0 = process_cpu_seconds(s.pid());
    let started = Instant::now();
    let mut threads = Vec::new();
    for _ in 0..a.publishers {
        let (agent, url, next) = (s.agent(), url.clone(), next.clone());
        let (events, batch) = (a.events, a.batch);
        threads.push(std::thread::spawn(move || loop {
            let first = next.fetch_add(batch, Ordering::Relaxed);
            if first >= events {
                return;
            }
            let last = (first + batch).min(events);
            let batch: Vec<Value> = (first..last)
                .map(|i| {
                    json!({"specversion": "1.0", "id": format!("l{i}"), "source": "/load",
                           "type": "load", "datacontenttype": "text/plain", "data": payload(i)})
                })
                .collect();
            let r = Call::new(&agent, "POST", url.as_str())
                .header("content-type", "application/cloudevents-batch+json")
                .body(Value::Array(batch).to_string())
                .send();
            assert_eq!(r.status, 200, "publish: {}", r.text());
        }));
    }
    for c in 0..a.consumers {
        let agent = s.agent();
        let poll = s.http_url(&format!(
            "/v1/subscriptions/load/events?client=c{c}&max=500&waitMs=500"
        ));
        let ack = s.http_url("/v1/subscriptions/load/ack");
        let (acked, events) = (acked.clone(), a.events);
        threads.push(std::thread::spawn(move || {
            while acked.load(Ordering::Relaxed) < events {
                let r = Call::new(&agent, "GET", poll.as_str()).send();
                r.expect(200);
                let d = parse_deliveries(&r);
                if d.is_empty() {
                    continue;
                }
                let ids: Vec<&str> = d.iter().map(|x| x.id.as_str()).collect();
                let answer = Call::new(&agent, "POST", ack.as_str())
                    .json(&json!({ "deliveryIds": ids }))
                    .send()
                    .ok_json(200);
                acked.fetch_add(answer["acked"].as_u64().unwrap_or(0), Ordering::Relaxed);
            }
        }));
    }
    for t in threads {
        t.join().expect("a load thread failed");
    }
    Outcome {
        name: "unimesh on Kafka (HTTP publish, long-poll, ACK)",
        seconds: started.elapsed().as_secs_f64(),
        cpu: cpu_seconds() - cpu0,
        broker_cpu: process_cpu_seconds(broker.pid()) - broker_cpu0,
        server_cpu: process_cpu_seconds(s.pid()) - server_cpu0,
    }
}

fn direct(broker: &Broker, a: &Args) -> Outcome {
    let rt = madsim_tokio::runtime::Runtime::new().expect("a runtime");
    let brokers = broker.brokers();
    let topic = "direct";
    // Created with the same partitions, through a first write's auto-creation or admin.
    rt.block_on(async {
        use madsim_rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        let admin: AdminClient<_> = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .create()
            .await
            .expect("admin client");
        let t = NewTopic::new(topic, a.partitions as i32, TopicReplication::Fixed(1));
        let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(5)));
        if let Err(e) = admin.create_topics([&t], &opts).await {
            // librdkafka's mock cluster creates topics on a metadata request instead.
            println!("kafka_load: CreateTopics failed ({e}); relying on auto-creation");
        }
    });
    let producer: FutureProducer = rt
        .block_on(
            ClientConfig::new()
                .set("bootstrap.servers", &brokers)
                .set("acks", "all")
                .set("enable.idempotence", "true")
                .set("linger.ms", "2")
                .create(),
        )
        .expect("producer");
    {
        use madsim_rdkafka::producer::Producer as _;
        let meta = rt
            .block_on(
                producer
                    .client()
                    .fetch_metadata(Some(topic), Duration::from_secs(10)),
            )
            .expect("metadata");
        let n = meta.topics().first().map_or(0, |t| t.partitions().len());
        println!("kafka_load: direct topic has {n} partitions");
    }
    let consumed = Arc::new(AtomicU64::new(0));
    let assigned = Arc::new(AtomicU64::new(0));
    // Members holding at least one partition: the group is settled only once every member
    // joined (else a late join rebalances mid-run, and a broker's initial rebalance delay,
    // 3 s on Kafka, lands inside the measurement).
    let holders = Arc::new(AtomicU64::new(0));
    let go = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut consumers = Vec::new();
    for c in 0..a.consumers {
        let consumer: BaseConsumer = rt
            .block_on(
                ClientConfig::new()
                    .set("bootstrap.servers", &brokers)
                    .set("group.id", "direct-load")
                    .set("client.id", format!("direct-{c}"))
                    .set("enable.auto.commit", "false")
                    .set("auto.offset.reset", "earliest")
                    .set("topic.metadata.refresh.interval.ms", "1000")
                    .create(),
            )
            .expect("consumer");
        consumer.subscribe(&[topic]).expect("subscribe");
        let (consumed, events) = (consumed.clone(), a.events);
        let (assigned, holders, go) = (assigned.clone(), holders.clone(), go.clone());
        let handle = rt.handle().clone();
        consumers.push(std::thread::spawn(move || {
            // Join the group first: the clock starts once every partition is assigned.
            let mut mine = 0;
            while !go.load(Ordering::Relaxed) {
                let _ = consumer.poll(Duration::from_millis(50));
                let now = consumer.assignment().map_or(0, |t| t.count() as u64);
                if now != mine {
                    assigned.fetch_add(now, Ordering::Relaxed);
                    assigned.fetch_sub(mine, Ordering::Relaxed);
                    match (mine, now) {
                        (0, _) => holders.fetch_add(1, Ordering::Relaxed),
                        (_, 0) => holders.fetch_sub(1, Ordering::Relaxed),
                        _ => 0,
                    };
                    mine = now;
                }
            }
            while consumed.load(Ordering::Relaxed) < events {
                let mut n = 0;
                while n < 500 {
                    match consumer.poll(Duration::from_millis(if n == 0 { 200 } else { 0 })) {
                        Some(Ok(m)) => {
                            assert!(m.payload().is_some_and(|p| p.len() >= EVENT_BYTES - 64));
                            n += 1;
                        }
                        Some(Err(e)) => eprintln!("direct consumer: {e}"),
                        None => break,
                    }
                }
                if n > 0 {
                    let _ = handle.block_on(consumer.commit_consumer_state(CommitMode::Sync));
                    consumed.fetch_add(n, Ordering::Relaxed);
                }
            }
        }));
    }
    unimesh_tests::wait_for(
        "the direct group's partitions assigned",
        Duration::from_secs(60),
        || {
            let settled = assigned.load(Ordering::Relaxed) == a.partitions
                && holders.load(Ordering::Relaxed) == a.consumers.min(a.partitions);
            settled.then_some(())
        },
    );
    go.store(true, Ordering::Relaxed);
    let cpu0 = cpu_seconds();
    let broker_cpu0 = process_cpu_seconds(broker.pid());
    let started = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let mut publishers = Vec::new();
    for _ in 0..a.publishers {
        let (producer, next, handle) = (producer.clone(), next.clone(), rt.handle().clone());
        let (events, batch) = (a.events, a.batch);
        publishers.push(std::thread::spawn(move || loop {
            let first = next.fetch_add(batch, Ordering::Relaxed);
            if first >= events {
                return;
            }
            let last = (first + batch).min(events);
            let values: Vec<(String, String)> = (first..last)
                .map(|i| (format!("l{i}"), payload(i)))
                .collect();
            handle.block_on(async {
                let mut waits = Vec::new();
                for (k, v) in &values {
                    let r = FutureRecord::to(topic).key(k.as_str()).payload(v.as_str());
                    waits.push(producer.send_result(r).map_err(|(e, _)| e).expect("queued"));
                }
                for w in waits {
                    w.await
                        .expect("report")
                        .map_err(|(e, _)| e)
                        .expect("written");
                }
            });
        }));
    }
    for t in publishers.into_iter().chain(consumers) {
        t.join().expect("a direct load thread failed");
    }
    Outcome {
        name: "the same broker directly with rdkafka (produce, poll, commit)",
        seconds: started.elapsed().as_secs_f64(),
        cpu: cpu_seconds() - cpu0,
        broker_cpu: process_cpu_seconds(broker.pid()) - broker_cpu0,
        server_cpu: f64::NAN,
    }
}

fn main() {
    let a = match args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("kafka_load: {e}");
            std::process::exit(2);
        }
    };
    if !unimesh_tests::built_as_release() {
        eprintln!("kafka_load: note: this is a debug build; use --release for meaningful numbers");
    }
    println!(
        "kafka_load: {} events of {EVENT_BYTES} B, {} publishers (batches of {}), {} consumers, {} partitions",
        a.events, a.publishers, a.batch, a.consumers, a.partitions
    );
    let broker = Broker::start();
    let direct = direct(&broker, &a);
    let unimesh = through_unimesh(&broker, &a);
    for o in [&direct, &unimesh] {
        println!(
            "kafka_load: {}: {:.2} s, {:.0} events/s; CPU: load client {:.2} s, broker {:.2} s, unimesh {:.2} s",
            o.name,
            o.seconds,
            a.events as f64 / o.seconds,
            o.cpu,
            o.broker_cpu,
            o.server_cpu
        );
    }
    println!(
        "kafka_load: ratio unimesh / direct = {:.2}",
        direct.seconds / unimesh.seconds
    );
}
