//! The load loops of the load example (`tests/examples/load.rs`) and of the comparison with
//! other systems (`benches/src/bin/compare`): publishers, and consumers by long-poll, SSE,
//! WebSocket and webhook, against one running [`Server`]. A measurement, not a test:
//! nothing here asserts on speed.
//!
//! Each side is written as a lean client that knows its event shape would write it: a
//! publisher writes its batch as text (no JSON tree per event), a consumer reads the
//! delivery id, the attempt and the publish time from the answer with a borrowed typed
//! struct, and writes its ACKs as text. Every event's data is `{"t":T,"p":"x…"}`, `T` its
//! publish time in µs from the run's start (the scheduled time under an offered load), so
//! a consumer can measure publish → deliver when it reads an event and publish → ACK when
//! its ACK is answered (webhook: when its 2xx is about to be written). What is measured goes
//! to a [`Recorder`] per consumer, so this crate needs no histogram.
//!
//! ACKs, by transport, as a real client of it would send them:
//! - `poll`: each poll's deliveries in one `POST …/ack`;
//! - `sse`: by `POST …/ack`, what one read of the socket brought (as `poll` ACKs one
//!   answer), in batches of up to `--poll` (at most 128, half the stream's window);
//! - `ws`: `{"ack":[…]}` frames of up to 128, or of what it holds when nothing came for
//!   1 ms (tungstenite does not say what it has buffered); the answers come in order;
//! - `webhook`: the 2xx answer (one per event, or per batch with `push.batch`).

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::hook::{Hook, HookAnswer};
use crate::{cpu_seconds, json, process_cpu_seconds, topic_path, Call, Server, BATCH_MEDIA_TYPE};

/// How long a run may take before it is called stuck.
const RUN_TIMEOUT: Duration = Duration::from_secs(600);

/// How long an SSE or WebSocket consumer waits for more before it ACKs what it holds (an
/// SSE consumer ACKs at once when it has read everything received: see `Consumer::sse`).
const IDLE_FLUSH: Duration = Duration::from_millis(1);

/// What one consumer measured, in µs. `()` measures nothing.
pub trait Recorder: Send + 'static {
    /// One event read, published `latency_us` ago.
    fn delivered(&mut self, latency_us: u64);
    /// One event's ACK answered, published `latency_us` ago.
    fn acked(&mut self, latency_us: u64);
}

impl Recorder for () {
    fn delivered(&mut self, _: u64) {}
    fn acked(&mut self, _: u64) {}
}

/// How deliveries reach the consumers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Poll,
    Sse,
    /// The group pushes to a receiver here, `batch` events per request at most (1: one
    /// binary-mode event per request). Needs `[push] allowed_hosts = "127.0.0.1"`.
    Webhook {
        batch: u32,
    },
    Ws,
}

impl Transport {
    /// `poll`, `sse`, `ws`, `webhook` or `webhook-batch` (with `push_batch` events per
    /// request).
    pub fn parse(text: &str, push_batch: u32) -> Result<Self, String> {
        Ok(match text {
            "poll" => Self::Poll,
            "sse" => Self::Sse,
            "ws" => Self::Ws,
            "webhook" => Self::Webhook { batch: 1 },
            "webhook-batch" => Self::Webhook {
                batch: push_batch.max(2),
            },
            other => {
                return Err(format!(
                    "a transport is poll, sse, ws, webhook or webhook-batch, not {other}"
                ))
            }
        })
    }

    pub fn name(&self) -> String {
        match self {
            Self::Poll => "poll".to_owned(),
            Self::Sse => "sse".to_owned(),
            Self::Ws => "ws".to_owned(),
            Self::Webhook { batch: 1 } => "webhook".to_owned(),
            Self::Webhook { batch } => format!("webhook batch={batch}"),
        }
    }
}

/// One run's workload.
#[derive(Clone, Debug)]
pub struct Spec {
    pub topic: String,
    /// Groups on the topic (fan-out), named `{topic}-{i}`; each gets every event.
    pub groups: u32,
    pub transport: Transport,
    pub publishers: u64,
    /// Consumers per group (ignored for webhook: the group's pusher is its consumer).
    pub consumers: u64,
    pub events: u64,
    /// Events per publish request; 1 sends each as one binary-mode request.
    pub batch: u64,
    /// Deliveries per long-poll, and the ACK batch of SSE and WebSocket consumers.
    pub poll: u64,
    /// Bytes of each event's data.
    pub size: u64,
    /// Offered load in events/s (0: publishers send as fast as they are answered).
    pub rate: u64,
    pub max_in_flight: u32,
    /// On Kafka: the groups start from `earliest` and the clock starts once the broker
    /// assigned this many partitions to each.
    pub kafka_partitions: Option<u32>,
    /// Processes whose CPU time is measured over the run as well (a broker).
    pub watch_pids: Vec<u32>,
}

impl Spec {
    /// A run of `events` events of `size` bytes on topic `load`, one group, long-polled.
    pub fn new(events: u64, size: u64) -> Self {
        Self {
            topic: "load".to_owned(),
            groups: 1,
            transport: Transport::Poll,
            publishers: 4,
            consumers: 4,
            events,
            batch: 50,
            poll: 200,
            size,
            rate: 0,
            max_in_flight: 10_000,
            kafka_partitions: None,
            watch_pids: Vec::new(),
        }
    }

    pub fn group(&self, i: u32) -> String {
        format!("{}-{i}", self.topic)
    }
}

/// What a run measured.
pub struct Outcome<R> {
    /// From the first publish until every publish was answered.
    pub publish_wall: Duration,
    /// From the first publish until every group ACKed every event.
    pub total_wall: Duration,
    /// One per consumer (per group for webhook).
    pub recorders: Vec<R>,
    /// ACKs accepted, over every group.
    pub acked: u64,
    /// Deliveries beyond the first of an event.
    pub redelivered: u64,
    pub client_cpu_s: f64,
    pub server_cpu_s: f64,
    /// CPU seconds of each of [`Spec::watch_pids`].
    pub watched_cpu_s: Vec<f64>,
}

/// A count of events done and when it reached its target: the end of a run as its
/// consumers saw it (joining them may take longer, a long-poll waiting out its `waitMs`).
#[derive(Default)]
pub struct Counter {
    n: AtomicU64,
    done: OnceLock<Duration>,
}

impl Counter {
    /// `n` more done (`total`: `n` is the whole count, from a server's counters).
    pub fn add(&self, n: u64, total: bool, target: u64, started: Instant) {
        let now = if total {
            self.n.store(n, Ordering::Relaxed);
            n
        } else {
            self.n.fetch_add(n, Ordering::Relaxed) + n
        };
        if now >= target {
            let _ = self.done.set(started.elapsed());
        }
    }

    pub fn get(&self) -> u64 {
        self.n.load(Ordering::Relaxed)
    }

    /// When the target was reached, from the run's start (`None`: not yet).
    pub fn done_at(&self) -> Option<Duration> {
        self.done.get().copied()
    }
}

/// What one group's consumers have done so far.
#[derive(Default)]
struct Tally {
    acked: Counter,
    redelivered: AtomicU64,
}

/// Subscribes the groups, runs the publishers and consumers until every group ACKed every
/// event, and says what it took. Panics when a request fails or a run is stuck for 10
/// minutes.
pub fn run<R: Recorder + Default>(s: &Server, spec: &Spec) -> Outcome<R> {
    let tallies: Vec<Arc<Tally>> = (0..spec.groups).map(|_| Arc::default()).collect();
    let receivers: Vec<Option<Receiver<R>>> = tallies
        .iter()
        .map(|tally| match spec.transport {
            Transport::Webhook { batch } => Some(Receiver::start(batch, tally.clone())),
            _ => None,
        })
        .collect();
    for (g, receiver) in receivers.iter().enumerate() {
        let mut doc = json!({
            "topic": spec.topic, "ackTimeoutMs": 60000, "maxInFlightPerClient": spec.max_in_flight,
        });
        if spec.kafka_partitions.is_some() {
            doc["startFrom"] = json!("earliest");
        }
        if let (Some(r), Transport::Webhook { batch }) = (receiver, spec.transport) {
            doc["push"] = json!({ "url": r.hook.url("/in"), "batch": batch });
        }
        s.subscribe(&spec.group(g as u32), &doc);
    }
    if let Some(partitions) = spec.kafka_partitions {
        let want = partitions as usize * spec.groups as usize;
        crate::wait_for(
            "the groups' partitions assigned",
            Duration::from_secs(120),
            || (s.offsets(&spec.topic).len() >= want).then_some(()),
        );
    }
    let next = Arc::new(AtomicU64::new(0));
    let pad = "x".repeat(spec.size.saturating_sub(32) as usize);
    let cpu0 = cpu_seconds();
    let server_cpu0 = process_cpu_seconds(s.pid());
    let watched0: Vec<f64> = spec
        .watch_pids
        .iter()
        .map(|&p| process_cpu_seconds(Some(p)))
        .collect();
    let t0 = Instant::now();
    for r in receivers.iter().flatten() {
        let _ = r.clock.set(t0);
    }
    let url = s.http_url(&topic_path(&spec.topic));
    let publishers: Vec<_> = (0..spec.publishers)
        .map(|_| {
            let publisher = Publisher {
                agent: s.agent(),
                url: url.clone(),
                batch: spec.batch,
                rate: spec.rate,
                pad: pad.clone(),
            };
            let (next, events) = (next.clone(), spec.events);
            std::thread::spawn(move || publisher.run(&next, events, t0))
        })
        .collect();
    let mut consumers = Vec::new();
    for (g, tally) in tallies.iter().enumerate() {
        let group = spec.group(g as u32);
        let per_group = match spec.transport {
            Transport::Webhook { .. } => 0,
            _ => spec.consumers,
        };
        for c in 0..per_group {
            let consumer = Consumer {
                agent: s.agent(),
                addr: s.http_addr(),
                base: s.http_url(&format!("/v1/subscriptions/{group}")),
                path: format!("/v1/subscriptions/{group}"),
                client: format!("c{c}"),
                poll: spec.poll,
                events: spec.events,
                started: t0,
            };
            let (tally, transport) = (tally.clone(), spec.transport);
            consumers.push(std::thread::spawn(move || {
                let mut rec = R::default();
                match transport {
                    Transport::Poll => consumer.poll(&tally, &mut rec),
                    Transport::Sse => consumer.sse(&tally, &mut rec),
                    Transport::Ws => consumer.ws(&tally, &mut rec),
                    Transport::Webhook { .. } => {}
                }
                Some(rec)
            }));
        }
    }
    if matches!(spec.transport, Transport::Webhook { .. }) {
        // The receivers answer; the group's counters say when every event is ACKed.
        let (agent, tallies, events) = (s.agent(), tallies.clone(), spec.events);
        let urls: Vec<String> = (0..spec.groups)
            .map(|g| s.http_url(&format!("/v1/subscriptions/{}", spec.group(g))))
            .collect();
        consumers.push(std::thread::spawn(move || {
            watch_acked(&agent, &urls, &tallies, events, t0);
            None
        }));
    }
    for p in publishers {
        if p.join().is_err() {
            panic!("a publisher failed");
        }
    }
    let publish_wall = t0.elapsed();
    let mut recorders = Vec::new();
    for c in consumers {
        match c.join() {
            Ok(rec) => recorders.extend(rec),
            Err(_) => panic!("a consumer failed"),
        }
    }
    // The last group's end, as its consumers saw it.
    let total_wall = tallies
        .iter()
        .map(|t| t.acked.done_at().unwrap_or_else(|| t0.elapsed()))
        .max()
        .unwrap_or_else(|| t0.elapsed());
    let client_cpu_s = cpu_seconds() - cpu0;
    let server_cpu_s = process_cpu_seconds(s.pid()) - server_cpu0;
    let watched_cpu_s = spec
        .watch_pids
        .iter()
        .zip(watched0)
        .map(|(&p, before)| process_cpu_seconds(Some(p)) - before)
        .collect();
    recorders.extend(receivers.into_iter().flatten().map(Receiver::finish));
    Outcome {
        publish_wall,
        total_wall,
        recorders,
        acked: tallies.iter().map(|t| t.acked.get()).sum(),
        redelivered: tallies
            .iter()
            .map(|t| t.redelivered.load(Ordering::Relaxed))
            .sum(),
        client_cpu_s,
        server_cpu_s,
        watched_cpu_s,
    }
}

/// When the batch starting at event `first` is due under an offered load of `rate`
/// events/s (0: now), in µs from `started`, after sleeping until then. Its events are
/// stamped with that time, not with when the client got round to sending them, so a client
/// that falls behind shows in the latencies (no coordinated omission).
pub fn paced(started: Instant, first: u64, rate: u64) -> u64 {
    let now = micros(started);
    if rate == 0 {
        return now;
    }
    let due = first.saturating_mul(1_000_000) / rate;
    if due > now {
        std::thread::sleep(Duration::from_micros(due - now));
    }
    due
}

pub fn micros(started: Instant) -> u64 {
    started.elapsed().as_micros() as u64
}

/// One publisher thread.
struct Publisher {
    agent: ureq::Agent,
    url: String,
    batch: u64,
    rate: u64,
    pad: String,
}

impl Publisher {
    /// Takes batches of event numbers from `next` until `events` are taken, and publishes
    /// each; panics on any answer but 200.
    fn run(&self, next: &AtomicU64, events: u64, started: Instant) {
        let mut body = String::new();
        loop {
            let first = next.fetch_add(self.batch, Ordering::Relaxed);
            if first >= events {
                return;
            }
            let last = (first + self.batch).min(events);
            let t = paced(started, first, self.rate);
            body.clear();
            let call = if self.batch == 1 {
                let _ = write!(body, r#"{{"t":{t},"p":"{}"}}"#, self.pad);
                Call::new(&self.agent, "POST", self.url.as_str())
                    .header("ce-specversion", "1.0")
                    .header("ce-id", &format!("l{first}"))
                    .header("ce-source", "/load")
                    .header("ce-type", "load")
                    .header("content-type", "application/json")
            } else {
                // The pad needs no escaping: written as text, no JSON tree per event.
                body.push('[');
                for i in first..last {
                    if i > first {
                        body.push(',');
                    }
                    let _ = write!(
                        body,
                        r#"{{"specversion":"1.0","id":"l{i}","source":"/load","type":"load","datacontenttype":"application/json","data":{{"t":{t},"p":"{}"}}}}"#,
                        self.pad
                    );
                }
                body.push(']');
                Call::new(&self.agent, "POST", self.url.as_str())
                    .header("content-type", BATCH_MEDIA_TYPE)
            };
            let r = call.body(body.as_bytes()).send();
            if r.status != 200 {
                panic!("a publish was answered {}: {}", r.status, r.text());
            }
        }
    }
}

/// One delivery as a consumer reads it: poll answers hold arrays of these, SSE events and
/// WebSocket frames one each.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Delivered<'a> {
    #[serde(borrow)]
    delivery_id: &'a str,
    attempt: u32,
    event: Carrying,
}

/// A structured event, as far as the load reads it: its data's publish time.
#[derive(Deserialize)]
struct Carrying {
    data: Stamp,
}

#[derive(Deserialize)]
struct Stamp {
    t: u64,
}

/// A WebSocket frame from the mesh: a delivery, or the answer to an ACK frame.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Frame<'a> {
    #[serde(borrow, default)]
    delivery_id: Option<&'a str>,
    #[serde(default)]
    attempt: u32,
    #[serde(default)]
    event: Option<Carrying>,
    #[serde(borrow, default)]
    result: Option<&'a str>,
    #[serde(default)]
    acked: u64,
}

#[derive(Deserialize)]
struct AckAnswer {
    acked: u64,
}

/// Delivery ids waiting to be ACKed in one request or frame, written as JSON text as they
/// arrive (ids are dotted decimals: nothing to escape), with their events' publish times.
struct Pending {
    /// `{"deliveryIds":[` or `{"ack":[`.
    head: &'static str,
    text: String,
    stamps: Vec<u64>,
}

impl Pending {
    fn new(head: &'static str) -> Self {
        Self {
            head,
            text: String::from(head),
            stamps: Vec::new(),
        }
    }

    fn push(&mut self, id: &str, t: u64) {
        if !self.stamps.is_empty() {
            self.text.push(',');
        }
        self.text.push('"');
        self.text.push_str(id);
        self.text.push('"');
        self.stamps.push(t);
    }

    fn len(&self) -> u64 {
        self.stamps.len() as u64
    }

    /// The request body, and the stamps it ACKs; empties this.
    fn take(&mut self) -> (String, Vec<u64>) {
        self.text.push_str("]}");
        let text = std::mem::replace(&mut self.text, String::from(self.head));
        (text, std::mem::take(&mut self.stamps))
    }
}

/// One consumer of one group.
struct Consumer {
    agent: ureq::Agent,
    addr: SocketAddr,
    /// The group's URL and path (`/v1/subscriptions/{group}`).
    base: String,
    path: String,
    client: String,
    poll: u64,
    events: u64,
    started: Instant,
}

impl Consumer {
    fn check_deadline(&self) {
        assert!(
            self.started.elapsed() < RUN_TIMEOUT,
            "{}: not every event ACKed in {RUN_TIMEOUT:?}",
            self.path
        );
    }

    /// Reads one delivery: counts a redelivery, records publish → deliver, adds its id.
    fn read(&self, d: &Delivered<'_>, tally: &Tally, rec: &mut impl Recorder, acks: &mut Pending) {
        if d.attempt > 1 {
            tally.redelivered.fetch_add(1, Ordering::Relaxed);
        }
        let t = d.event.data.t;
        rec.delivered(micros(self.started).saturating_sub(t).max(1));
        acks.push(d.delivery_id, t);
    }

    /// ACKs by HTTP what `acks` holds.
    fn ack(&self, acks: &mut Pending, tally: &Tally, rec: &mut impl Recorder) {
        let (body, stamps) = acks.take();
        let r = Call::new(&self.agent, "POST", format!("{}/ack", self.base))
            .header("content-type", "application/json")
            .body(body)
            .send();
        r.expect(200);
        let answer: AckAnswer = serde_json::from_slice(&r.body)
            .unwrap_or_else(|e| panic!("an ACK answer without a count ({e}): {}", r.text()));
        let now = micros(self.started);
        for t in stamps {
            rec.acked(now.saturating_sub(t).max(1));
        }
        tally
            .acked
            .add(answer.acked, false, self.events, self.started);
    }

    fn poll(&self, tally: &Tally, rec: &mut impl Recorder) {
        let url = format!(
            "{}/events?client={}&max={}&waitMs=500",
            self.base, self.client, self.poll
        );
        let mut acks = Pending::new(r#"{"deliveryIds":["#);
        while tally.acked.get() < self.events {
            self.check_deadline();
            let r = Call::new(&self.agent, "GET", url.as_str()).send();
            r.expect(200);
            let d: Vec<Delivered<'_>> = serde_json::from_slice(&r.body)
                .unwrap_or_else(|e| panic!("a poll answer that is not deliveries: {e}"));
            if d.is_empty() {
                continue;
            }
            for x in &d {
                self.read(x, tally, rec, &mut acks);
            }
            self.ack(&mut acks, tally, rec);
        }
    }

    /// One SSE stream; ACKs by HTTP.
    fn sse(&self, tally: &Tally, rec: &mut impl Recorder) {
        use crate::sse::{Next, SseStream};
        let path = format!("{}/stream?client={}", self.path, self.client);
        let mut stream = SseStream::open(self.addr, &path, None);
        assert_eq!(stream.status, 200, "{}", stream.body);
        let mut acks = Pending::new(r#"{"deliveryIds":["#);
        // The stream's window is 256: ACK before it could fill.
        let batch = self.poll.min(128);
        while tally.acked.get() < self.events {
            self.check_deadline();
            match stream.next_event_within(IDLE_FLUSH) {
                Next::Event(e) => {
                    let d: Delivered<'_> = serde_json::from_str(&e.data)
                        .unwrap_or_else(|err| panic!("an SSE event that is not a delivery: {err}"));
                    self.read(&d, tally, rec, &mut acks);
                    // What one read brought is ACKed together, as a long-poll consumer ACKs
                    // one answer: a batch of at most `batch` at saturation, without waiting
                    // for more at a lower rate.
                    if acks.len() >= batch
                        || stream.drained()
                        || tally.acked.get() + acks.len() >= self.events
                    {
                        self.ack(&mut acks, tally, rec);
                    }
                }
                Next::Idle if acks.len() > 0 => self.ack(&mut acks, tally, rec),
                Next::Idle => {}
                Next::End => panic!("{path}: the stream ended"),
            }
        }
    }

    /// One WebSocket; ACKs by frames, answered in order.
    fn ws(&self, tally: &Tally, rec: &mut impl Recorder) {
        use tungstenite::Message;
        let url = format!("ws://{}{}/ws?client={}", self.addr, self.path, self.client);
        let (mut ws, _) =
            tungstenite::connect(url.as_str()).unwrap_or_else(|e| panic!("{url}: {e}"));
        if let tungstenite::stream::MaybeTlsStream::Plain(tcp) = ws.get_mut() {
            let _ = tcp.set_read_timeout(Some(IDLE_FLUSH));
            let _ = tcp.set_nodelay(true);
        }
        let mut acks = Pending::new(r#"{"ack":["#);
        let mut answers: VecDeque<Vec<u64>> = VecDeque::new();
        let batch = self.poll.min(128);
        let send = |ws: &mut tungstenite::WebSocket<_>,
                    acks: &mut Pending,
                    answers: &mut VecDeque<Vec<u64>>| {
            let (frame, stamps) = acks.take();
            answers.push_back(stamps);
            if let Err(e) = ws.send(Message::Text(frame.into())) {
                panic!("{url}: sending an ACK frame: {e}");
            }
        };
        while tally.acked.get() < self.events {
            self.check_deadline();
            let msg = match ws.read() {
                Ok(m) => m,
                Err(tungstenite::Error::Io(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    if acks.len() > 0 {
                        send(&mut ws, &mut acks, &mut answers);
                    }
                    continue;
                }
                Err(e) => panic!("{}: the WebSocket failed: {e}", self.path),
            };
            let Message::Text(text) = msg else { continue };
            let f: Frame<'_> = serde_json::from_str(text.as_str())
                .unwrap_or_else(|e| panic!("a WebSocket frame that is not JSON: {e}: {text}"));
            if let Some(verb) = f.result {
                assert_eq!(verb, "ack", "an answer to a frame not sent: {text}");
                let now = micros(self.started);
                for t in answers.pop_front().unwrap_or_default() {
                    rec.acked(now.saturating_sub(t).max(1));
                }
                tally.acked.add(f.acked, false, self.events, self.started);
                continue;
            }
            let (Some(id), Some(event)) = (f.delivery_id, f.event) else {
                panic!("a WebSocket frame that is neither a delivery nor an answer: {text}");
            };
            let d = Delivered {
                delivery_id: id,
                attempt: f.attempt,
                event,
            };
            self.read(&d, tally, rec, &mut acks);
            if acks.len() >= batch || tally.acked.get() + acks.len() >= self.events {
                send(&mut ws, &mut acks, &mut answers);
            }
        }
    }
}

/// A webhook receiver of one group: answers 200 to everything, recording publish →
/// deliver when it has read a request and publish → ACK as it answers (the 2xx is the
/// ACK). Its clock is set when the run starts; before, it only answers.
struct Receiver<R> {
    hook: Hook,
    rec: Arc<Mutex<R>>,
    clock: Arc<OnceLock<Instant>>,
}

impl<R: Recorder + Default> Receiver<R> {
    fn start(batch: u32, tally: Arc<Tally>) -> Self {
        let rec = Arc::new(Mutex::new(R::default()));
        let clock: Arc<OnceLock<Instant>> = Arc::default();
        let (r, c) = (rec.clone(), clock.clone());
        let hook = Hook::start_unlogged(move |req, _| {
            if let Some(&started) = c.get() {
                Self::record(req, batch, started, &tally, &r);
            }
            HookAnswer::status(200)
        });
        Self { hook, rec, clock }
    }

    fn record(
        req: &crate::hook::HookRequest,
        batch: u32,
        started: Instant,
        tally: &Tally,
        rec: &Mutex<R>,
    ) {
        let stamps: Vec<u64> = if batch > 1 && req.header("content-type") == Some(BATCH_MEDIA_TYPE)
        {
            let events: Vec<Carrying> = serde_json::from_slice(&req.body)
                .unwrap_or_else(|e| panic!("a pushed batch that is not events: {e}"));
            events.into_iter().map(|e| e.data.t).collect()
        } else {
            let s: Stamp = serde_json::from_slice(&req.body)
                .unwrap_or_else(|e| panic!("a pushed event without its stamp: {e}"));
            vec![s.t]
        };
        // The attempt is the last part of a delivery id (`epoch.lease.partition.offset.attempt`).
        let again = req
            .header("x-unimesh-delivery-id")
            .unwrap_or_default()
            .split(',')
            .filter(|id| {
                id.rsplit('.')
                    .next()
                    .and_then(|a| a.trim().parse::<u32>().ok())
                    > Some(1)
            })
            .count();
        tally.redelivered.fetch_add(again as u64, Ordering::Relaxed);
        let mut r = rec.lock().unwrap_or_else(|p| p.into_inner());
        let now = micros(started);
        for &t in &stamps {
            r.delivered(now.saturating_sub(t).max(1));
        }
        let now = micros(started);
        for &t in &stamps {
            r.acked(now.saturating_sub(t).max(1));
        }
    }

    /// What it recorded (its threads may still hold a clone of the recorder).
    fn finish(self) -> R {
        drop(self.hook);
        let mut r = self.rec.lock().unwrap_or_else(|p| p.into_inner());
        std::mem::take(&mut *r)
    }
}

/// Until every group's counters say every event is ACKed: for webhook groups, whose
/// consumer is the mesh's pusher.
fn watch_acked(
    agent: &ureq::Agent,
    urls: &[String],
    tallies: &[Arc<Tally>],
    events: u64,
    started: Instant,
) {
    #[derive(Deserialize)]
    struct Group {
        stats: Stats,
    }
    #[derive(Deserialize)]
    struct Stats {
        acked: u64,
    }
    loop {
        let mut done = true;
        for (url, tally) in urls.iter().zip(tallies) {
            if tally.acked.get() >= events {
                continue;
            }
            let r = Call::new(agent, "GET", url.as_str()).send();
            r.expect(200);
            let g: Group = serde_json::from_slice(&r.body)
                .unwrap_or_else(|e| panic!("{url}: a group without stats ({e}): {}", r.text()));
            tally.acked.add(g.stats.acked, true, events, started);
            done &= g.stats.acked >= events;
        }
        if done {
            return;
        }
        assert!(
            started.elapsed() < RUN_TIMEOUT,
            "webhook: not every event ACKed in {RUN_TIMEOUT:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}
