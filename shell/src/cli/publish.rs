//! `unimesh publish TOPIC`: one event from flags, or many from a file or stdin.
//!
//! Many: one JSON CloudEvent (structured form) per line, blank lines skipped, sent in batch
//! mode `--batch` at a time. A batch is all or nothing on the server, so a batch refused
//! for its content (a 4xx other than 429) is sent again event by event: every good event
//! is accepted and every bad one refused with its own reason. A 429 or 503 is retried after
//! its `Retry-After` (a few times). A line that is not a JSON object is refused here. The
//! closing count says how many were accepted (and how many of those the server's dedup
//! window answered as duplicates, not appended again) and refused, with the first reasons; an
//! unreachable server stops at once with the count so far.

use std::fs::File;
use std::io::{BufRead, BufReader, IsTerminal as _, Read};
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{json, Map, Value};

use super::client::{segment, Answer, Api, Client};
use super::{print_json, print_line, Common, Failure};

/// Refusal reasons kept for the closing report (the count goes on past them).
const MAX_REASONS: usize = 100;
/// Reasons printed in the text report.
const SHOWN_REASONS: usize = 20;
/// Bytes of one batch's events (below the server's default `limits.max_request_bytes`).
const MAX_BATCH_BYTES: usize = 4 << 20;
/// The longest line read; a longer one is refused without being held.
const MAX_LINE_BYTES: u64 = 8 << 20;
/// Tries of a request answered 429 or 503.
const TRIES: u32 = 5;
/// Longest wait between them.
const MAX_RETRY_WAIT: Duration = Duration::from_secs(30);

#[derive(Args, Debug)]
pub struct PublishArgs {
    /// The topic (created by its first publish).
    topic: String,
    /// One event: its `type` (with --source, --id, --data, --key).
    #[arg(long = "type", value_name = "TYPE")]
    event_type: Option<String>,
    /// One event: its `source`.
    #[arg(
        long,
        value_name = "URI",
        default_value = "/unimesh/cli",
        requires = "event_type"
    )]
    source: String,
    /// One event: its `id` (default: made from the time and the process id).
    #[arg(long, value_name = "ID", requires = "event_type")]
    id: Option<String>,
    /// One event: its data; JSON when it parses as JSON, text otherwise.
    #[arg(long, value_name = "DATA", requires = "event_type")]
    data: Option<String>,
    /// The `partitionkey` of the event (of every event from a file that has none).
    #[arg(long, value_name = "KEY")]
    key: Option<String>,
    /// Events from this file, one JSON CloudEvent per line (`-`: stdin, also the default
    /// when --type is not given and stdin is not a terminal).
    #[arg(long, value_name = "FILE", conflicts_with = "event_type")]
    file: Option<PathBuf>,
    /// Events per batch request.
    #[arg(long, value_name = "N", default_value_t = 100,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    batch: u32,
    #[command(flatten)]
    common: Common,
}

/// One event read, with where it came from.
struct Item {
    line: u64,
    id: String,
    json: String,
}

/// What happened so far.
#[derive(Default)]
struct Tally {
    accepted: u64,
    /// Of the accepted, those the server's dedup window answered without appending
    /// (`"duplicate": true`).
    duplicates: u64,
    refused: u64,
    reasons: Vec<Value>,
    /// The one event's place (single-event form).
    placed: Option<Value>,
}

impl Tally {
    fn refuse(&mut self, line: u64, id: Option<&str>, reason: String) {
        self.refused += 1;
        if self.reasons.len() < MAX_REASONS {
            let mut r = json!({"line": line, "reason": reason});
            if let Some(id) = id {
                r["id"] = json!(id);
            }
            self.reasons.push(r);
        }
    }

    /// Counts a 200 answer's events: accepted, and those it marks as duplicates.
    fn accept(&mut self, answer: &Answer, events: usize) {
        self.accepted += events as u64;
        self.duplicates += duplicates_in(answer);
    }

    fn summary(&self) -> String {
        let duplicates = match self.duplicates {
            0 => String::new(),
            n => format!(" ({n} duplicate(s), not appended again)"),
        };
        format!(
            "accepted {}{duplicates}, refused {}",
            self.accepted, self.refused
        )
    }
}

pub fn run(a: &PublishArgs) -> Result<(), Failure> {
    let client = Client::new(&a.common)?;
    let mut sender = Sender {
        client: &client,
        path: format!("/v1/topics/{}/events", segment(&a.topic)),
        tally: Tally::default(),
        progress: ProgressBar::hidden(),
    };
    let outcome = match &a.event_type {
        Some(ty) => sender.one(a, ty),
        None => sender.many(a),
    };
    sender.progress.finish_and_clear();
    let tally = sender.tally;
    if let Err(f) = outcome {
        if matches!(f, Failure::Unreachable(_)) && tally.accepted + tally.refused > 0 {
            eprintln!("unimesh: stopped after {}", tally.summary());
        }
        return Err(f);
    }
    report(a, &tally)?;
    if tally.refused > 0 {
        return Err(Failure::Refused(format!(
            "{} of {} event(s) refused",
            tally.refused,
            tally.accepted + tally.refused
        )));
    }
    if tally.accepted == 0 {
        return Err(Failure::Usage(
            "no events to publish: give --type for one event, or --file (or stdin) with one JSON CloudEvent per line".into(),
        ));
    }
    Ok(())
}

fn report(a: &PublishArgs, tally: &Tally) -> Result<(), Failure> {
    if a.common.json {
        let mut v = json!({
            "accepted": tally.accepted,
            "duplicates": tally.duplicates,
            "refused": tally.refused,
            "reasons": tally.reasons,
        });
        if let Some(p) = &tally.placed {
            v["result"] = p.clone();
        }
        return print_json(&v);
    }
    if let Some(p) = &tally.placed {
        let duplicate = if p["duplicate"] == json!(true) {
            " (a duplicate: the first publish's place, not appended again)"
        } else {
            ""
        };
        print_line(&format!(
            "published {} to {}: partition {}, offset {}{duplicate}",
            p["id"].as_str().unwrap_or("?"),
            a.topic,
            p["partition"],
            p["offset"]
        ))?;
    } else if tally.accepted + tally.refused > 0 {
        print_line(&tally.summary())?;
    }
    for r in tally.reasons.iter().take(SHOWN_REASONS) {
        let id = r["id"]
            .as_str()
            .map(|id| format!(" (id {id})"))
            .unwrap_or_default();
        eprintln!(
            "  line {}{id}: {}",
            r["line"],
            r["reason"].as_str().unwrap_or("")
        );
    }
    if tally.refused > SHOWN_REASONS as u64 {
        eprintln!(
            "  ... and {} more refused",
            tally.refused - SHOWN_REASONS as u64
        );
    }
    Ok(())
}

/// How many of a 200 answer's `results` say `"duplicate": true` (none when the answer
/// cannot be read: the events were accepted either way).
fn duplicates_in(answer: &Answer) -> u64 {
    serde_json::from_slice::<Value>(&answer.body)
        .ok()
        .and_then(|v| {
            let results = v.get("results")?.as_array()?;
            Some(
                results
                    .iter()
                    .filter(|r| r["duplicate"] == json!(true))
                    .count() as u64,
            )
        })
        .unwrap_or(0)
}

/// The one event of the flags, structured.
fn event_from_flags(a: &PublishArgs, ty: &str) -> Value {
    let id = a.id.clone().unwrap_or_else(|| {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("cli-{nanos}-{}", std::process::id())
    });
    let mut e = json!({
        "specversion": "1.0",
        "id": id,
        "source": a.source,
        "type": ty,
    });
    if let Some(data) = &a.data {
        match serde_json::from_str::<Value>(data) {
            Ok(v) => {
                e["datacontenttype"] = json!("application/json");
                e["data"] = v;
            }
            Err(_) => {
                e["datacontenttype"] = json!("text/plain");
                e["data"] = json!(data);
            }
        }
    }
    if let Some(k) = &a.key {
        e["partitionkey"] = json!(k);
    }
    e
}

struct Sender<'a> {
    client: &'a Client,
    path: String,
    tally: Tally,
    progress: ProgressBar,
}

impl Sender<'_> {
    fn one(&mut self, a: &PublishArgs, ty: &str) -> Result<(), Failure> {
        let e = event_from_flags(a, ty);
        let id = e["id"].as_str().unwrap_or_default().to_owned();
        let item = Item {
            line: 0,
            id,
            json: e.to_string(),
        };
        let answer = self.post(
            "application/cloudevents+json",
            item.json.clone().into_bytes(),
        )?;
        if answer.status == 200 {
            self.tally.accept(&answer, 1);
            if let Ok(v) = answer.ok() {
                self.tally.placed = v["results"].get(0).cloned();
            }
            Ok(())
        } else {
            // The single form has no lines: its failure is the answer itself.
            Err(Failure::Refused(answer.error_line()))
        }
    }

    fn many(&mut self, a: &PublishArgs) -> Result<(), Failure> {
        let (reader, length): (Box<dyn Read>, Option<u64>) = match &a.file {
            Some(p) if p.as_os_str() != "-" => {
                let f = File::open(p)
                    .map_err(|e| Failure::Usage(format!("cannot open {}: {e}", p.display())))?;
                let len = f.metadata().ok().map(|m| m.len());
                (Box::new(f), len)
            }
            _ => {
                if a.file.is_none() && std::io::stdin().is_terminal() {
                    return Err(Failure::Usage(
                        "give --type for one event, or --file FILE (or pipe events to stdin), one JSON CloudEvent per line".into(),
                    ));
                }
                (Box::new(std::io::stdin()), None)
            }
        };
        if std::io::stderr().is_terminal() {
            self.progress = progress_bar(length);
        }
        let mut reader = BufReader::new(reader);
        let mut batch: Vec<Item> = Vec::new();
        let mut batch_bytes = 0;
        let mut line_no = 0;
        let mut buf = Vec::new();
        loop {
            buf.clear();
            let read = (&mut reader)
                .take(MAX_LINE_BYTES + 1)
                .read_until(b'\n', &mut buf)
                .map_err(|e| Failure::Usage(format!("reading the events: {e}")))?;
            if read == 0 {
                break;
            }
            line_no += 1;
            self.progress.inc(read as u64);
            if buf.len() as u64 > MAX_LINE_BYTES && buf.last() != Some(&b'\n') {
                let skipped = skip_line(&mut reader)?;
                self.progress.inc(skipped);
                self.tally
                    .refuse(line_no, None, format!("longer than {MAX_LINE_BYTES} bytes"));
                continue;
            }
            let text = String::from_utf8_lossy(&buf);
            let text = text.trim();
            if text.is_empty() {
                continue;
            }
            match parse_line(text, a.key.as_deref()) {
                Ok((id, json)) => {
                    batch_bytes += json.len() + 1;
                    batch.push(Item {
                        line: line_no,
                        id,
                        json,
                    });
                }
                Err(reason) => self.tally.refuse(line_no, None, reason),
            }
            if batch.len() >= a.batch as usize || batch_bytes >= MAX_BATCH_BYTES {
                self.send_batch(std::mem::take(&mut batch))?;
                batch_bytes = 0;
            }
            self.progress.set_message(self.tally.summary());
        }
        if !batch.is_empty() {
            self.send_batch(batch)?;
        }
        Ok(())
    }

    /// Sends one batch; a batch refused for its content is sent again event by event.
    fn send_batch(&mut self, batch: Vec<Item>) -> Result<(), Failure> {
        let mut body = String::from("[");
        for (i, item) in batch.iter().enumerate() {
            if i > 0 {
                body.push(',');
            }
            body.push_str(&item.json);
        }
        body.push(']');
        let answer = self.post("application/cloudevents-batch+json", body.into_bytes())?;
        match answer.status {
            200 => self.tally.accept(&answer, batch.len()),
            400..=499 if batch.len() > 1 && answer.status != 429 => {
                for item in batch {
                    let answer =
                        self.post("application/cloudevents+json", item.json.into_bytes())?;
                    self.settle_one(item.line, &item.id, &answer);
                }
            }
            _ => {
                let reason = answer.reason();
                for item in &batch {
                    self.tally.refuse(item.line, Some(&item.id), reason.clone());
                }
            }
        }
        self.progress.set_message(self.tally.summary());
        Ok(())
    }

    fn settle_one(&mut self, line: u64, id: &str, answer: &Answer) {
        if answer.status == 200 {
            self.tally.accept(answer, 1);
        } else {
            self.tally.refuse(line, Some(id), answer.reason());
        }
    }

    /// One POST, retried after `Retry-After` while the server answers 429 or 503.
    fn post(&self, content_type: &str, body: Vec<u8>) -> Result<Answer, Failure> {
        let mut tries = 0;
        loop {
            tries += 1;
            let answer = self.client.call(
                Api::Traffic,
                "POST",
                &self.path,
                Some((content_type, body.clone())),
            )?;
            if !matches!(answer.status, 429 | 503) || tries >= TRIES {
                return Ok(answer);
            }
            let wait = Duration::from_secs(answer.retry_after.unwrap_or(1)).min(MAX_RETRY_WAIT);
            self.progress.set_message(format!(
                "{}; server answered {}, retrying in {}s",
                self.tally.summary(),
                answer.status,
                wait.as_secs()
            ));
            std::thread::sleep(wait);
        }
    }
}

/// A line's event: its id and its JSON (with `partitionkey` set when `key` is given and the
/// event has none), or why it is refused.
fn parse_line(text: &str, key: Option<&str>) -> Result<(String, String), String> {
    let mut obj: Map<String, Value> = match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(o)) => o,
        Ok(_) => return Err("not a JSON object (a CloudEvent in structured form)".into()),
        Err(e) => return Err(format!("not JSON: {e}")),
    };
    let id = obj
        .get("id")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    if let Some(k) = key {
        obj.entry("partitionkey").or_insert_with(|| json!(k));
    }
    Ok((id, Value::Object(obj).to_string()))
}

/// Reads past the rest of an over-long line; the bytes skipped.
fn skip_line(reader: &mut impl BufRead) -> Result<u64, Failure> {
    let mut skipped = 0;
    loop {
        let buf = reader
            .fill_buf()
            .map_err(|e| Failure::Usage(format!("reading the events: {e}")))?;
        if buf.is_empty() {
            return Ok(skipped);
        }
        match buf.iter().position(|&b| b == b'\n') {
            Some(i) => {
                reader.consume(i + 1);
                return Ok(skipped + i as u64 + 1);
            }
            None => {
                let n = buf.len();
                reader.consume(n);
                skipped += n as u64;
            }
        }
    }
}

fn progress_bar(length: Option<u64>) -> ProgressBar {
    let target = ProgressDrawTarget::stderr();
    match length {
        Some(len) => {
            let bar = ProgressBar::with_draw_target(Some(len), target);
            if let Ok(style) =
                ProgressStyle::with_template("{bar:30} {bytes}/{total_bytes} {elapsed} {msg}")
            {
                bar.set_style(style);
            }
            bar
        }
        None => {
            let bar = ProgressBar::with_draw_target(None, target);
            if let Ok(style) =
                ProgressStyle::with_template("{spinner} {bytes} read {elapsed} {msg}")
            {
                bar.set_style(style);
            }
            bar
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_an_object_and_gets_the_key_it_lacks() {
        let (id, json) = parse_line(r#"{"id":"a","type":"t"}"#, Some("k")).expect("object");
        assert_eq!(id, "a");
        let v: Value = serde_json::from_str(&json).expect("json");
        assert_eq!(v["partitionkey"], "k");
        let (_, json) =
            parse_line(r#"{"id":"b","partitionkey":"own"}"#, Some("k")).expect("object");
        assert!(json.contains(r#""partitionkey":"own""#), "{json}");
        assert!(parse_line("[1,2]", None).is_err());
        assert!(parse_line("{nope", None)
            .err()
            .is_some_and(|e| e.starts_with("not JSON")));
    }

    #[test]
    fn an_over_long_line_is_skipped_to_its_end() {
        let mut r = BufReader::with_capacity(4, "abcdefghij\nnext\n".as_bytes());
        assert_eq!(skip_line(&mut r).ok(), Some(11));
        let mut rest = String::new();
        r.read_line(&mut rest).expect("read");
        assert_eq!(rest, "next\n");
    }
}
