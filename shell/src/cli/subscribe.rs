//! `unimesh subscribe GROUP`: tails a group over Server-Sent Events
//! (`GET /v1/subscriptions/{group}/stream?client=ID`), prints each delivery and ACKs it once
//! printed (`--nack` NACKs it instead, so it comes again after the group's backoff;
//! `--no-ack` leaves it to time out). `--json` prints each delivery as the server sent it,
//! one per line; `--max N` stops after N. On a terminal a live line on stderr counts what
//! was received and settled, with the group's lag (read at most once a second).
//!
//! A thread reads the stream into a bounded queue; the printing loop ACKs what it printed
//! whenever the queue is empty (before it waits for more), or every [`MAX_ACK_BATCH`]
//! deliveries: one ACK request per burst instead of one per delivery, and never an ACK held
//! back while the stream is quiet.

use std::io::{BufRead, BufReader, IsTerminal as _, Read};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant};

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{json, Value};

use super::client::{segment, Api, Client};
use super::{print_line, Common, Failure};

/// The longest SSE line read (a delivery carries one event: the server's
/// `limits.max_event_bytes`, 1 MiB by default, grows in JSON).
const MAX_LINE_BYTES: u64 = 16 << 20;
/// Deliveries ACKed by one request at most.
const MAX_ACK_BATCH: usize = 100;
/// Events read ahead of the printing loop.
const READ_AHEAD: usize = 256;
/// How often the live line reads the group's lag.
const LAG_EVERY: Duration = Duration::from_secs(1);

#[derive(Args, Debug)]
pub struct SubscribeArgs {
    /// The subscription group (create it with `PUT /v1/subscriptions/{group}`).
    group: String,
    /// This client's id in the group (clients of a group compete for its events).
    #[arg(long, value_name = "ID")]
    client: Option<String>,
    /// Do not ACK: deliveries time out and are delivered again.
    #[arg(long, conflicts_with = "nack")]
    no_ack: bool,
    /// NACK each delivery once printed instead of ACKing it (it comes again after the
    /// group's backoff, and goes to the DLQ after its maxAttempts).
    #[arg(long)]
    nack: bool,
    /// Stop after this many deliveries.
    #[arg(long, value_name = "N")]
    max: Option<u64>,
    #[command(flatten)]
    common: Common,
}

/// One Server-Sent Event: its `id:` and its `data:` lines joined.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct SseEvent {
    pub id: Option<String>,
    pub data: String,
}

/// Reads events from an SSE body (comments and `retry:` skipped).
pub struct SseReader<R> {
    inner: R,
}

impl<R: BufRead> SseReader<R> {
    pub fn new(inner: R) -> Self {
        Self { inner }
    }

    /// The next event with data, or `None` at the end of the stream.
    pub fn next_event(&mut self) -> std::io::Result<Option<SseEvent>> {
        let mut event = SseEvent::default();
        let mut has_data = false;
        let mut line = Vec::new();
        loop {
            line.clear();
            let n = (&mut self.inner)
                .take(MAX_LINE_BYTES)
                .read_until(b'\n', &mut line)?;
            if n == 0 {
                return Ok(None);
            }
            if line.last() != Some(&b'\n') && n as u64 >= MAX_LINE_BYTES {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("an event line is longer than {MAX_LINE_BYTES} bytes"),
                ));
            }
            let text = String::from_utf8_lossy(&line);
            let text = text.trim_end_matches(['\n', '\r']);
            if text.is_empty() {
                if has_data {
                    return Ok(Some(event));
                }
                event = SseEvent::default();
                continue;
            }
            if text.starts_with(':') {
                continue;
            }
            let (field, value) = match text.split_once(':') {
                Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
                None => (text, ""),
            };
            match field {
                "data" => {
                    if has_data {
                        event.data.push('\n');
                    }
                    event.data.push_str(value);
                    has_data = true;
                }
                "id" => event.id = Some(value.to_owned()),
                _ => {}
            }
        }
    }
}

/// Reads the stream's events on a thread into a bounded queue (the thread ends with the
/// stream, or when the queue's reader is gone).
fn read_ahead(body: impl Read + Send + 'static) -> Receiver<std::io::Result<Option<SseEvent>>> {
    let (tx, rx) = sync_channel(READ_AHEAD);
    std::thread::spawn(move || {
        let mut events = SseReader::new(BufReader::new(body));
        loop {
            let next = events.next_event();
            let last = !matches!(next, Ok(Some(_)));
            if tx.send(next).is_err() || last {
                return;
            }
        }
    });
    rx
}

/// The group's lag for the live line, read over the traffic API at most once a second and
/// only while the line is shown.
struct Lag {
    /// `/v1/subscriptions/{group}`.
    path: String,
    /// `, lag N` once read.
    text: String,
    read_at: Instant,
}

impl Lag {
    /// Reads the lag again if it is time; whether it was read.
    fn refresh(&mut self, client: &Client, live: &ProgressBar) -> bool {
        if live.is_hidden() || self.read_at.elapsed() < LAG_EVERY {
            return false;
        }
        self.read_at = Instant::now();
        let lag = client
            .get(Api::Traffic, &self.path)
            .and_then(|a| a.ok())
            .ok()
            .and_then(|v| v["lag"].as_u64());
        if let Some(n) = lag {
            self.text = format!(", lag {n}");
        }
        lag.is_some()
    }
}

/// The delivery ids printed and not yet ACKed, and the count ACKed so far.
struct Acks<'a> {
    client: &'a Client,
    /// `…/ack` or `…/nack`.
    path: String,
    /// `ACK` or `NACK`, for messages.
    verb: &'static str,
    pending: Vec<String>,
    /// Ids the server took (`acked` in its answer, for a NACK too).
    acked: u64,
}

impl Acks<'_> {
    /// ACKs the pending ids in one request; refused ones are reported on stderr.
    fn flush(&mut self, live: &ProgressBar) -> Result<(), Failure> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let ids = std::mem::take(&mut self.pending);
        let answer = self
            .client
            .post_json(Api::Traffic, &self.path, &json!({ "deliveryIds": ids }))?
            .ok()?;
        self.acked += answer["acked"].as_u64().unwrap_or(0);
        for r in answer["rejected"].as_array().into_iter().flatten() {
            let id = r["deliveryId"].as_str().unwrap_or("?");
            let why = r["reason"].as_str().unwrap_or("refused");
            let verb = self.verb;
            live.suspend(|| eprintln!("unimesh: {verb} of {id} refused: {why}"));
        }
        Ok(())
    }
}

/// A delivery as one line of text: `partition/offset #attempt type id data`.
fn describe(d: &Value) -> String {
    let e = &d["event"];
    let s = |k: &str| e[k].as_str().unwrap_or("-").to_owned();
    let data = match (&e["data"], &e["data_base64"]) {
        (Value::Null, Value::String(b)) => format!("base64:{b}"),
        (Value::Null, _) => String::new(),
        (Value::String(t), _) => t.clone(),
        (v, _) => v.to_string(),
    };
    format!(
        "{}/{} #{} {} {} {data}",
        s("emmqpartition"),
        s("emmqoffset"),
        d["attempt"],
        s("type"),
        s("id"),
    )
    .trim_end()
    .to_owned()
}

pub fn run(a: &SubscribeArgs) -> Result<(), Failure> {
    let client = Client::new(&a.common)?;
    let me = a
        .client
        .clone()
        .unwrap_or_else(|| format!("cli-{}", std::process::id()));
    let path = format!(
        "/v1/subscriptions/{}/stream?client={}",
        segment(&a.group),
        segment(&me)
    );
    let verb = if a.nack { "nack" } else { "ack" };
    let ack_path = format!("/v1/subscriptions/{}/{verb}", segment(&a.group));
    let group_path = format!("/v1/subscriptions/{}", segment(&a.group));
    if a.max == Some(0) {
        return Ok(());
    }
    let body = client.stream(Api::Traffic, &path)?;
    let events = read_ahead(body);
    let live = if std::io::stderr().is_terminal() {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template("{spinner} {msg}") {
            bar.set_style(style);
        }
        bar.set_message(format!("tailing {} as {me}", a.group));
        bar
    } else {
        ProgressBar::hidden()
    };
    let mut acks = Acks {
        client: &client,
        path: ack_path,
        verb: if a.nack { "NACK" } else { "ACK" },
        pending: Vec::new(),
        acked: 0,
    };
    let mut received = 0u64;
    let settled = if a.nack { "NACKed" } else { "ACKed" };
    let mut lag = Lag {
        path: group_path,
        text: String::new(),
        read_at: Instant::now(),
    };
    let result = loop {
        let next = match events.try_recv() {
            Ok(next) => next,
            Err(TryRecvError::Empty) => {
                // Nothing more has arrived: ACK what was printed before waiting.
                if let Err(f) = acks.flush(&live) {
                    break Err(f);
                }
                loop {
                    match events.recv_timeout(LAG_EVERY) {
                        Ok(next) => break next,
                        Err(RecvTimeoutError::Timeout) => {
                            if lag.refresh(&client, &live) {
                                live.set_message(format!(
                                    "{}: received {received}, {settled} {}{}",
                                    a.group, acks.acked, lag.text
                                ));
                            }
                        }
                        Err(RecvTimeoutError::Disconnected) => break Ok(None),
                    }
                }
            }
            Err(TryRecvError::Disconnected) => Ok(None),
        };
        let event = match next {
            Ok(Some(e)) => e,
            Ok(None) => {
                break Err(Failure::Unreachable(format!(
                    "GET {}: the server ended the stream after {received} deliveries",
                    client.url(Api::Traffic, &path)
                )))
            }
            Err(e) => {
                break Err(Failure::Unreachable(format!(
                    "GET {}: the stream broke after {received} deliveries: {e}",
                    client.url(Api::Traffic, &path)
                )))
            }
        };
        let delivery: Value = match serde_json::from_str(&event.data) {
            Ok(v) => v,
            Err(e) => {
                live.suspend(|| eprintln!("unimesh: skipping an event that is not JSON: {e}"));
                continue;
            }
        };
        received += 1;
        let line = if a.common.json {
            delivery.to_string()
        } else {
            describe(&delivery)
        };
        match live.suspend(|| print_line(&line)) {
            Ok(true) => {}
            Ok(false) => break Ok(()),
            Err(f) => break Err(f),
        }
        if !a.no_ack {
            let id = delivery["deliveryId"]
                .as_str()
                .or(event.id.as_deref())
                .unwrap_or_default();
            acks.pending.push(id.to_owned());
            if acks.pending.len() >= MAX_ACK_BATCH {
                if let Err(f) = acks.flush(&live) {
                    break Err(f);
                }
            }
        }
        lag.refresh(&client, &live);
        live.set_message(format!(
            "{}: received {received}, {settled} {}{}",
            a.group, acks.acked, lag.text
        ));
        live.tick();
        if a.max.is_some_and(|m| received >= m) {
            break Ok(());
        }
    };
    // What was printed is ACKed, however the loop ended.
    let result = match (result, acks.flush(&live)) {
        (Ok(()), Err(f)) => Err(f),
        (r, _) => r,
    };
    let acked = acks.acked;
    // The live line stays as the closing count (stderr, a terminal only).
    live.finish_with_message(format!(
        "{}: received {received}, {settled} {acked}{}",
        a.group, lag.text
    ));
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_read_with_their_ids_and_comments_are_skipped() {
        let body = "retry: 1000\n\n: heartbeat\n\nid: 1.2\ndata: {\"a\":1}\n\nid: x\r\ndata: one\r\ndata: two\r\n\r\n";
        let mut r = SseReader::new(BufReader::new(body.as_bytes()));
        assert_eq!(
            r.next_event().expect("read"),
            Some(SseEvent {
                id: Some("1.2".into()),
                data: "{\"a\":1}".into()
            })
        );
        assert_eq!(
            r.next_event().expect("read"),
            Some(SseEvent {
                id: Some("x".into()),
                data: "one\ntwo".into()
            })
        );
        assert_eq!(r.next_event().expect("read"), None);
    }

    #[test]
    fn a_delivery_is_described_on_one_line() {
        let d = json!({"deliveryId": "1.0.0.4.1", "attempt": 1, "event": {
            "id": "e1", "type": "order.created", "emmqpartition": "0", "emmqoffset": "4",
            "data": {"total": 42}}});
        assert_eq!(describe(&d), r#"0/4 #1 order.created e1 {"total":42}"#);
    }
}
