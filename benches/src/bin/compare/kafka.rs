//! The same workload on a Kafka broker used directly, as a Kafka user would (with
//! librdkafka's defaults: `acks=all`, `linger.ms=5`, no idempotence): P producer threads each
//! sending `--batch` records and then waiting for every delivery report (as a unimesh
//! batch request waits for its answer), and C members of one consumer group each polling up
//! to `--poll` records and committing them synchronously (the ACK; auto-commit off, and
//! `auto.offset.reset=earliest` so nothing written before a member's first fetch is
//! skipped). The clock starts once every partition is assigned. Payloads carry their
//! publish time in their first 8 bytes.
//!
//! On tansu (`--kafka tansu`: its in-memory storage engine, as the black-box tests start it)
//! the rows check that both paths work end to end and show the mesh's cost over the bare
//! protocol; they are not Kafka's figures: nothing is written to disk, and deliveries come
//! about 0.4 s (direct) and 0.7-1.2 s (through unimesh) after their publish at the median
//! while the log's own rows take 10 ms, which says tansu answers fetches late; the
//! end-to-end rates are then set by fetch round trips, not by CPU.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use madsim_rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use madsim_rdkafka::producer::{FutureProducer, FutureRecord};
use madsim_rdkafka::{ClientConfig, Message};
use unimesh_tests::load::{micros, paced, Counter, Recorder as _};
use unimesh_tests::{cpu_seconds, process_cpu_seconds};

use super::sample::{Hists, Sample};
use super::{Args, Workload};

/// How long a run may take before it is called stuck.
const RUN_TIMEOUT: Duration = Duration::from_secs(600);

pub fn run(a: &Args, w: &Workload, brokers: &str, pid: Option<u32>, topic: &str) -> Sample {
    let rt = madsim_tokio::runtime::Runtime::new()
        .unwrap_or_else(|e| panic!("a runtime for the Kafka clients: {e}"));
    create_topic(&rt, brokers, topic, a.partitions as i32);
    let producer: FutureProducer = rt
        .block_on(
            ClientConfig::new()
                .set("bootstrap.servers", brokers)
                .create(),
        )
        .unwrap_or_else(|e| panic!("a Kafka producer: {e}"));
    let consumed = Arc::new(Counter::default());
    let redelivered = Arc::new(AtomicU64::new(0));
    let assigned = Arc::new(AtomicU64::new(0));
    // Members holding a partition: the group is settled once every member that can hold
    // one does (else a late join rebalances inside the measurement).
    let holders = Arc::new(AtomicU64::new(0));
    let go = Arc::new(AtomicBool::new(false));
    let started = Arc::new(std::sync::OnceLock::<Instant>::new());
    let mut consumers = Vec::new();
    for c in 0..a.consumers {
        let consumer: BaseConsumer = rt
            .block_on(
                ClientConfig::new()
                    .set("bootstrap.servers", brokers)
                    .set("group.id", format!("{topic}-direct"))
                    .set("client.id", format!("direct-{c}"))
                    .set("enable.auto.commit", "false")
                    .set("auto.offset.reset", "earliest")
                    .create(),
            )
            .unwrap_or_else(|e| panic!("a Kafka consumer: {e}"));
        consumer
            .subscribe(&[topic])
            .unwrap_or_else(|e| panic!("subscribe to {topic}: {e}"));
        let member = Member {
            consumer,
            consumed: consumed.clone(),
            redelivered: redelivered.clone(),
            assigned: assigned.clone(),
            holders: holders.clone(),
            go: go.clone(),
            started: started.clone(),
            events: w.events,
            poll: a.poll as usize,
            handle: rt.handle().clone(),
        };
        consumers.push(std::thread::spawn(move || member.run()));
    }
    unimesh_tests::wait_for(
        "the direct group's partitions assigned",
        Duration::from_secs(120),
        || {
            let settled = assigned.load(Ordering::Relaxed) == a.partitions
                && holders.load(Ordering::Relaxed) == a.consumers.min(a.partitions);
            settled.then_some(())
        },
    );
    let cpu0 = cpu_seconds();
    let broker_cpu0 = process_cpu_seconds(pid);
    let t0 = Instant::now();
    let _ = started.set(t0);
    go.store(true, Ordering::Relaxed);
    let next = Arc::new(AtomicU64::new(0));
    let publishers: Vec<_> = (0..a.publishers)
        .map(|_| {
            let (producer, next, handle) = (producer.clone(), next.clone(), rt.handle().clone());
            let (events, batch, rate, size) = (w.events, w.batch, w.rate, a.size as usize);
            let topic = topic.to_owned();
            std::thread::spawn(move || loop {
                let first = next.fetch_add(batch, Ordering::Relaxed);
                if first >= events {
                    return;
                }
                let last = (first + batch).min(events);
                let t = paced(t0, first, rate);
                let payloads: Vec<(String, Vec<u8>)> = (first..last)
                    .map(|i| {
                        let mut p = vec![b'x'; size.max(8)];
                        p[..8].copy_from_slice(&t.to_le_bytes());
                        (format!("l{i}"), p)
                    })
                    .collect();
                handle.block_on(async {
                    let mut waits = Vec::with_capacity(payloads.len());
                    for (k, v) in &payloads {
                        let r = FutureRecord::to(&topic)
                            .key(k.as_str())
                            .payload(v.as_slice());
                        match producer.send_result(r) {
                            Ok(wait) => waits.push(wait),
                            Err((e, _)) => panic!("a record not queued: {e}"),
                        }
                    }
                    for wait in waits {
                        match wait.await {
                            Ok(Ok(_)) => {}
                            Ok(Err((e, _))) => panic!("a record not written: {e}"),
                            Err(e) => panic!("a delivery report lost: {e}"),
                        }
                    }
                });
            })
        })
        .collect();
    for p in publishers {
        if p.join().is_err() {
            panic!("a Kafka producer thread failed");
        }
    }
    let publish_wall = t0.elapsed();
    let mut hists = Vec::new();
    for c in consumers {
        match c.join() {
            Ok(h) => hists.push(h),
            Err(_) => panic!("a Kafka consumer thread failed"),
        }
    }
    let total_wall = consumed.done_at().unwrap_or_else(|| t0.elapsed());
    let h = Hists::merged(hists);
    Sample {
        events: w.events,
        publish_wall,
        total_wall,
        deliver_us: h.deliver,
        ack_us: h.ack,
        redelivered: redelivered.load(Ordering::Relaxed),
        server_cpu_s: f64::NAN,
        client_cpu_s: cpu_seconds() - cpu0,
        broker_cpu_s: process_cpu_seconds(pid) - broker_cpu0,
    }
}

/// The topic with `partitions` partitions (a broker that refuses CreateTopics creates it on
/// first use, with its default count: said, so the figures can be read with it).
fn create_topic(rt: &madsim_tokio::runtime::Runtime, brokers: &str, topic: &str, partitions: i32) {
    use madsim_rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    rt.block_on(async {
        let admin: AdminClient<_> = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .create()
            .await
            .unwrap_or_else(|e| panic!("a Kafka admin client: {e}"));
        let t = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
        let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(10)));
        if let Err(e) = admin.create_topics([&t], &opts).await {
            eprintln!("compare: creating {topic} failed ({e}); relying on auto-creation");
        }
    });
}

/// One member of the direct consumer group.
struct Member {
    consumer: BaseConsumer,
    consumed: Arc<Counter>,
    redelivered: Arc<AtomicU64>,
    assigned: Arc<AtomicU64>,
    holders: Arc<AtomicU64>,
    go: Arc<AtomicBool>,
    started: Arc<std::sync::OnceLock<Instant>>,
    events: u64,
    poll: usize,
    handle: madsim_tokio::runtime::Handle,
}

impl Member {
    fn run(self) -> Hists {
        // Join the group first: the clock starts once every partition is assigned.
        let mut mine = 0;
        while !self.go.load(Ordering::Relaxed) {
            let _ = self.consumer.poll(Duration::from_millis(50));
            let now = self.consumer.assignment().map_or(0, |t| t.count() as u64);
            if now != mine {
                self.assigned.fetch_add(now, Ordering::Relaxed);
                self.assigned.fetch_sub(mine, Ordering::Relaxed);
                match (mine, now) {
                    (0, _) => self.holders.fetch_add(1, Ordering::Relaxed),
                    (_, 0) => self.holders.fetch_sub(1, Ordering::Relaxed),
                    _ => 0,
                };
                mine = now;
            }
        }
        let Some(&t0) = self.started.get() else {
            panic!("the clock is set before the go");
        };
        let mut h = Hists::default();
        let mut stamps = Vec::with_capacity(self.poll);
        // Offsets seen per partition: a record at or below one is a redelivery.
        let mut seen: std::collections::BTreeMap<i32, i64> = std::collections::BTreeMap::new();
        while self.consumed.get() < self.events {
            assert!(
                t0.elapsed() < RUN_TIMEOUT,
                "Kafka: not every record committed in {RUN_TIMEOUT:?}"
            );
            stamps.clear();
            while stamps.len() < self.poll {
                let wait = if stamps.is_empty() { 200 } else { 0 };
                match self.consumer.poll(Duration::from_millis(wait)) {
                    Some(Ok(m)) => {
                        let now = micros(t0);
                        let t = m
                            .payload()
                            .and_then(|p| p.get(..8))
                            .and_then(|b| <[u8; 8]>::try_from(b).ok())
                            .map(u64::from_le_bytes)
                            .unwrap_or(now);
                        h.delivered(now.saturating_sub(t).max(1));
                        let high = seen.entry(m.partition()).or_insert(-1);
                        if m.offset() <= *high {
                            self.redelivered.fetch_add(1, Ordering::Relaxed);
                        }
                        *high = (*high).max(m.offset());
                        stamps.push(t);
                    }
                    Some(Err(e)) => eprintln!("compare: direct consumer: {e}"),
                    None => break,
                }
            }
            if stamps.is_empty() {
                continue;
            }
            if let Err(e) = self
                .handle
                .block_on(self.consumer.commit_consumer_state(CommitMode::Sync))
            {
                panic!("a commit failed: {e}");
            }
            let now = micros(t0);
            for &t in &stamps {
                h.acked(now.saturating_sub(t).max(1));
            }
            self.consumed
                .add(stamps.len() as u64, false, self.events, t0);
        }
        h
    }
}
