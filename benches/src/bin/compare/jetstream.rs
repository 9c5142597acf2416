//! The NATS JetStream side, the same workload: Debian's `nats-server -js` on a temporary
//! store; P publisher tasks each sending `--batch` publishes and then waiting for every
//! publish ACK (as a unimesh batch request waits for its answer); one durable pull consumer
//! with explicit ACK shared by C tasks, each fetching up to `--poll` messages at a time
//! and ACKing each (`ack()` sends the ACK without waiting for the server's confirmation,
//! as a NATS user would). Payloads carry their publish time in their first 8 bytes.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, consumer::pull, consumer::AckPolicy, stream};
use futures_util::StreamExt as _;
use hdrhistogram::Histogram;
use unimesh_tests::load::Counter;
use unimesh_tests::{cpu_seconds, process_cpu_seconds};

use super::sample::{histogram, Sample};
use super::{Args, Workload};

struct NatsServer {
    child: Child,
    _store: tempfile::TempDir,
    url: String,
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_server(bin: &str) -> NatsServer {
    let store = tempfile::tempdir().unwrap_or_else(|e| panic!("a temporary store: {e}"));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("a free port: {e}"));
    let child = Command::new(bin)
        .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
        .arg(store.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {bin} (Debian's nats-server package): {e}"));
    let url = format!("nats://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "{bin} did not listen within 30 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    NatsServer {
        child,
        _store: store,
        url,
    }
}

pub fn run(a: &Args, w: &Workload) -> Sample {
    let server = start_server(&a.nats_server);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("a tokio runtime: {e}"));
    let pid = Some(server.child.id());
    rt.block_on(workload(a, w, &server.url, pid))
}

async fn workload(a: &Args, w: &Workload, url: &str, pid: Option<u32>) -> Sample {
    let rate = w.rate;
    let client = async_nats::connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
    let js = jetstream::new(client);
    let stream = js
        .create_stream(stream::Config {
            name: "LOAD".to_owned(),
            subjects: vec!["load".to_owned()],
            storage: stream::StorageType::File,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("create the stream: {e}"));
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("load".to_owned()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: Duration::from_secs(60),
            max_ack_pending: 100_000,
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("create the consumer: {e}"));
    let size = (a.size as usize).max(8);
    let next = Arc::new(AtomicU64::new(0));
    let received = Arc::new(Counter::default());
    let redelivered = Arc::new(AtomicU64::new(0));
    let cpu0 = cpu_seconds();
    let server_cpu0 = process_cpu_seconds(pid);
    let started = Instant::now();
    let publishers: Vec<_> = (0..a.publishers)
        .map(|_| {
            let (js, next) = (js.clone(), next.clone());
            let (events, batch) = (w.events, w.batch);
            tokio::spawn(async move {
                loop {
                    let first = next.fetch_add(batch, Ordering::Relaxed);
                    if first >= events {
                        return;
                    }
                    let last = (first + batch).min(events);
                    let due = paced_async(started, first, rate).await;
                    let mut acks = Vec::with_capacity((last - first) as usize);
                    for _ in first..last {
                        let mut payload = vec![b'x'; size];
                        payload[..8].copy_from_slice(&due.to_le_bytes());
                        let ack = js
                            .publish("load", payload.into())
                            .await
                            .unwrap_or_else(|e| panic!("publish: {e}"));
                        acks.push(ack);
                    }
                    for ack in acks {
                        ack.await.unwrap_or_else(|e| panic!("publish ACK: {e}"));
                    }
                }
            })
        })
        .collect();
    let consumers: Vec<_> = (0..a.consumers)
        .map(|_| {
            let (consumer, received, redelivered) =
                (consumer.clone(), received.clone(), redelivered.clone());
            let (events, poll) = (w.events, a.poll as usize);
            tokio::spawn(async move {
                let (mut deliver, mut ack) = (histogram(), histogram());
                consume(
                    &consumer,
                    &received,
                    &redelivered,
                    events,
                    poll,
                    started,
                    (&mut deliver, &mut ack),
                )
                .await;
                (deliver, ack)
            })
        })
        .collect();
    for p in publishers {
        if p.await.is_err() {
            panic!("a JetStream publisher failed");
        }
    }
    let publish_wall = started.elapsed();
    let (mut deliver_us, mut ack_us) = (histogram(), histogram());
    for c in consumers {
        match c.await {
            Ok((d, k)) => {
                let _ = deliver_us.add(&d);
                let _ = ack_us.add(&k);
            }
            Err(_) => panic!("a JetStream consumer failed"),
        }
    }
    let total_wall = received.done_at().unwrap_or_else(|| started.elapsed());
    Sample {
        events: w.events,
        publish_wall,
        total_wall,
        deliver_us,
        ack_us,
        redelivered: redelivered.load(Ordering::Relaxed),
        server_cpu_s: process_cpu_seconds(pid) - server_cpu0,
        client_cpu_s: cpu_seconds() - cpu0,
        broker_cpu_s: f64::NAN,
    }
}

/// `unimesh_tests::load::paced` without blocking a runtime thread.
async fn paced_async(started: Instant, first: u64, rate: u64) -> u64 {
    let now = micros(started);
    if rate == 0 {
        return now;
    }
    let due = first.saturating_mul(1_000_000) / rate;
    if due > now {
        tokio::time::sleep(Duration::from_micros(due - now)).await;
    }
    due
}

fn micros(started: Instant) -> u64 {
    started.elapsed().as_micros() as u64
}

async fn consume(
    consumer: &jetstream::consumer::Consumer<pull::Config>,
    received: &Counter,
    redelivered: &AtomicU64,
    events: u64,
    poll: usize,
    started: Instant,
    (deliver, ack): (&mut Histogram<u64>, &mut Histogram<u64>),
) {
    let deadline = Instant::now() + Duration::from_secs(600);
    while received.get() < events {
        assert!(
            Instant::now() < deadline,
            "JetStream: not every event ACKed in 10 minutes"
        );
        let mut batch = consumer
            .batch()
            .max_messages(poll)
            .expires(Duration::from_millis(500))
            .messages()
            .await
            .unwrap_or_else(|e| panic!("fetch: {e}"));
        while let Some(m) = batch.next().await {
            let m = m.unwrap_or_else(|e| panic!("a message: {e}"));
            let now = micros(started);
            let t = m
                .payload
                .get(..8)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map(u64::from_le_bytes)
                .unwrap_or(now);
            let _ = deliver.record(now.saturating_sub(t).max(1));
            if m.info().is_ok_and(|i| i.delivered > 1) {
                redelivered.fetch_add(1, Ordering::Relaxed);
            }
            m.ack().await.unwrap_or_else(|e| panic!("ack: {e}"));
            let _ = ack.record(micros(started).saturating_sub(t).max(1));
            received.add(1, false, events, started);
        }
    }
}
