//! librdkafka's own log lines and global errors, through `tracing`, with the client's role,
//! and repeats collapsed.
//!
//! librdkafka repeats itself: with the broker unreachable every client logs each failed
//! connect and reports "all brokers are down" at every reconnect (about 200 ERROR lines in
//! ten seconds at start, issue 18). Every client of the backend is created with a
//! [`ClientLog`] context naming its role; a line whose facility and shape (the message with
//! its counts and durations blanked, [`shape`]) was logged within the last [`WINDOW`] is
//! counted instead, and the next one after the window says how many were left out. The
//! table of shapes is bounded ([`MAX_SHAPES`]; the least recently seen goes first, its count
//! with it). librdkafka's debug lines (`debug` set by the user) are never collapsed.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use madsim_rdkafka::admin::AdminClient;
use madsim_rdkafka::client::ClientContext;
use madsim_rdkafka::config::RDKafkaLogLevel;
use madsim_rdkafka::consumer::{BaseConsumer, ConsumerContext};
use madsim_rdkafka::error::KafkaError;
use madsim_rdkafka::producer::FutureProducer;

/// How long a logged shape silences its repeats.
pub(super) const WINDOW: Duration = Duration::from_secs(60);
/// Shapes remembered at once.
pub(super) const MAX_SHAPES: usize = 64;

/// A consumer, the producer and the admin client, each with its role for the log lines.
pub type LoggedConsumer = BaseConsumer<ClientLog>;
pub type LoggedProducer = FutureProducer<ClientLog>;
pub type LoggedAdmin = AdminClient<ClientLog>;

/// The context every librdkafka client of the backend is created with: its role (`producer`,
/// `admin`, `group <name>`, `progress reader` …) for the log lines.
#[derive(Clone, Debug)]
pub struct ClientLog {
    role: String,
}

impl ClientLog {
    pub fn new(role: impl Into<String>) -> Self {
        Self { role: role.into() }
    }
}

impl ClientContext for ClientLog {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        emit(&self.role, level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        emit(
            &self.role,
            RDKafkaLogLevel::Error,
            "ERROR",
            &format!("{error}: {reason}"),
        );
    }
}

impl ConsumerContext for ClientLog {}

/// Logs one librdkafka line of a client in `role`, unless its shape was logged within the
/// window (then it is counted).
pub(super) fn emit(role: &str, level: RDKafkaLogLevel, fac: &str, message: &str) {
    let say = if matches!(level, RDKafkaLogLevel::Debug) {
        Say::Line { left_out: 0 }
    } else {
        static REPEATS: OnceLock<Mutex<Repeats>> = OnceLock::new();
        let repeats = REPEATS.get_or_init(|| Mutex::new(Repeats::new(WINDOW, MAX_SHAPES)));
        let mut r = repeats.lock().unwrap_or_else(|p| p.into_inner());
        r.note(format!("{fac} {}", shape(message)), Instant::now())
    };
    let Say::Line { left_out } = say else {
        return;
    };
    let message = if left_out > 0 {
        format!(
            "{message} ({left_out} more like it in the {} s before, left out)",
            WINDOW.as_secs()
        )
    } else {
        message.to_owned()
    };
    match level {
        RDKafkaLogLevel::Emerg
        | RDKafkaLogLevel::Alert
        | RDKafkaLogLevel::Critical
        | RDKafkaLogLevel::Error => {
            tracing::error!(target: "librdkafka", client = role, facility = fac, "{message}")
        }
        RDKafkaLogLevel::Warning => {
            tracing::warn!(target: "librdkafka", client = role, facility = fac, "{message}")
        }
        RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
            tracing::info!(target: "librdkafka", client = role, facility = fac, "{message}")
        }
        RDKafkaLogLevel::Debug => {
            tracing::debug!(target: "librdkafka", client = role, facility = fac, "{message}")
        }
    }
}

/// What to do with one line.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Say {
    /// Log it, saying how many like it were left out in the window before.
    Line { left_out: u64 },
    /// Count it.
    Quiet,
}

/// The shapes logged within the window and the repeats left out since (pure: every call
/// brings `now`).
#[derive(Debug)]
pub(super) struct Repeats {
    window: Duration,
    max: usize,
    /// Shape → (when it was last logged, repeats left out since, last seen).
    seen: BTreeMap<String, Seen>,
}

#[derive(Debug)]
struct Seen {
    logged: Instant,
    left_out: u64,
    last: Instant,
}

impl Repeats {
    pub fn new(window: Duration, max: usize) -> Self {
        Self {
            window,
            max: max.max(1),
            seen: BTreeMap::new(),
        }
    }

    /// One line of `shape` at `now`.
    pub fn note(&mut self, shape: String, now: Instant) -> Say {
        if let Some(s) = self.seen.get_mut(&shape) {
            s.last = now;
            if now.saturating_duration_since(s.logged) < self.window {
                s.left_out += 1;
                return Say::Quiet;
            }
            s.logged = now;
            return Say::Line {
                left_out: std::mem::take(&mut s.left_out),
            };
        }
        if self.seen.len() >= self.max {
            let oldest = self
                .seen
                .iter()
                .min_by_key(|(_, s)| s.last)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                self.seen.remove(&k);
            }
        }
        self.seen.insert(
            shape,
            Seen {
                logged: now,
                left_out: 0,
                last: now,
            },
        );
        Say::Line { left_out: 0 }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.seen.len()
    }
}

/// A message with its asides left out and its counts blanked to `#`, so repeats that differ
/// only in them share a shape: a parenthesised aside ("(after 0ms in state CONNECT, 1
/// identical error(s) suppressed)", librdkafka's own count of what it left out) goes, and a
/// digit run is blanked when it starts a word and is not part of an address or a version
/// (no `.` or `:` on either side: "0/1 brokers are down", "1/1 brokers are down"), so two
/// brokers' addresses stay apart.
pub(super) fn shape(message: &str) -> String {
    let b = message.as_bytes();
    let mut out = String::with_capacity(message.len());
    let mut depth = 0usize;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'(' || (depth > 0 && c == b')') {
            if c == b'(' {
                depth += 1;
            } else {
                depth -= 1;
            }
            i += 1;
            continue;
        }
        if depth > 0 {
            i += 1;
            continue;
        }
        let starts_word =
            i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'.' || b[i - 1] == b':');
        if c.is_ascii_digit() && starts_word {
            let mut j = i;
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
            let in_address = j < b.len() && (b[j] == b'.' || b[j] == b':');
            if in_address {
                out.push_str(&message[i..j]);
            } else {
                out.push('#');
            }
            i = j;
            continue;
        }
        // Copy one character (the message may hold any UTF-8).
        let ch_len = message[i..].chars().next().map_or(1, char::len_utf8);
        out.push_str(&message[i..i + ch_len]);
        i += ch_len;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: librdkafka's repeated lines while a broker is unreachable share a shape (their
    /// asides and counts left out), and different brokers do not. Method: lines as
    /// librdkafka 2.12 writes them.
    #[test]
    fn counts_and_durations_are_blanked_and_addresses_kept() {
        assert_eq!(shape("1/1 brokers are down"), shape("0/1 brokers are down"));
        let a = "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused (after 0ms in state CONNECT)";
        let b = "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused (after 12ms in state CONNECT, 1 identical error(s) suppressed)";
        assert_eq!(
            shape(a),
            "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused "
        );
        assert_eq!(shape(a), shape(b));
        assert_eq!(
            shape("Global error: AllBrokersDown (Local: All broker connections are down): 1/1 brokers are down"),
            "Global error: AllBrokersDown : #/# brokers are down"
        );
        assert_ne!(
            shape("10.0.0.1:9092/1: Disconnected"),
            shape("10.0.0.2:9092/2: Disconnected")
        );
        assert_eq!(shape("naïve 3 ünïcode"), "naïve # ünïcode");
    }

    /// Goal: a shape is logged once per window, the next line after the window says how many
    /// were left out, other shapes are independent. Method: scripted times.
    #[test]
    fn a_repeat_within_the_window_is_counted_and_reported_with_the_next_line() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut r = Repeats::new(Duration::from_secs(60), 8);
        assert_eq!(r.note("down".into(), at(0)), Say::Line { left_out: 0 });
        for s in 1..60 {
            assert_eq!(r.note("down".into(), at(s)), Say::Quiet);
        }
        assert_eq!(r.note("other".into(), at(30)), Say::Line { left_out: 0 });
        assert_eq!(r.note("down".into(), at(60)), Say::Line { left_out: 59 });
        assert_eq!(r.note("down".into(), at(61)), Say::Quiet);
        assert_eq!(r.note("down".into(), at(200)), Say::Line { left_out: 1 });
        assert_eq!(r.note("down".into(), at(400)), Say::Line { left_out: 0 });
    }

    /// Goal: the table never holds more than its bound; the least recently seen shape goes
    /// first. Method: more shapes than the bound.
    #[test]
    fn the_table_is_bounded_and_forgets_the_least_recently_seen() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut r = Repeats::new(Duration::from_secs(60), 3);
        for (i, s) in ["a", "b", "c"].into_iter().enumerate() {
            r.note(s.into(), at(i as u64));
        }
        assert_eq!(r.note("a".into(), at(3)), Say::Quiet);
        // "b" is the least recently seen: it goes for "d", and is logged again after.
        assert_eq!(r.note("d".into(), at(4)), Say::Line { left_out: 0 });
        assert_eq!(r.len(), 3);
        assert_eq!(r.note("a".into(), at(5)), Say::Quiet);
        assert_eq!(r.note("b".into(), at(6)), Say::Line { left_out: 0 });
        assert_eq!(r.len(), 3);
    }
}
