//! What one run of one system measured, and how runs are summarised.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::{json, Value};
use unimesh_tests::load::Recorder;

/// Latencies in microseconds, 1 µs to 10 min, 3 significant digits.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3)
        .expect("constant bounds: low >= 1, high >= 2 * low")
}

/// What one consumer measured: publish → deliver and publish → ACK, in µs.
pub struct Hists {
    pub deliver: Histogram<u64>,
    pub ack: Histogram<u64>,
}

impl Default for Hists {
    fn default() -> Self {
        Self {
            deliver: histogram(),
            ack: histogram(),
        }
    }
}

impl Recorder for Hists {
    fn delivered(&mut self, latency_us: u64) {
        let _ = self.deliver.record(latency_us);
    }

    fn acked(&mut self, latency_us: u64) {
        let _ = self.ack.record(latency_us);
    }
}

impl Hists {
    /// Every consumer's, merged.
    pub fn merged(all: impl IntoIterator<Item = Hists>) -> Hists {
        let mut out = Hists::default();
        for h in all {
            let _ = out.deliver.add(&h.deliver);
            let _ = out.ack.add(&h.ack);
        }
        out
    }
}

/// One run of one system.
pub struct Sample {
    pub events: u64,
    /// From the first publish until every publish was answered.
    pub publish_wall: Duration,
    /// From the first publish until every event was delivered and its ACK answered.
    pub total_wall: Duration,
    /// Publish → the consumer holds it.
    pub deliver_us: Histogram<u64>,
    /// Publish → its ACK answered (unimesh) or sent (JetStream: `ack()` does not wait).
    pub ack_us: Histogram<u64>,
    /// Deliveries beyond the first of an event.
    pub redelivered: u64,
    pub server_cpu_s: f64,
    pub client_cpu_s: f64,
    /// CPU seconds of the Kafka broker (NaN where there is none or it was not started here).
    pub broker_cpu_s: f64,
}

impl Sample {
    pub fn publish_per_s(&self) -> f64 {
        self.events as f64 / self.publish_wall.as_secs_f64().max(1e-9)
    }

    pub fn end_to_end_per_s(&self) -> f64 {
        self.events as f64 / self.total_wall.as_secs_f64().max(1e-9)
    }

    /// The server's CPU per event, in µs (NaN for a broker used directly).
    pub fn server_us_per_event(&self) -> f64 {
        self.server_cpu_s * 1e6 / self.events.max(1) as f64
    }

    fn ms(h: &Histogram<u64>, q: f64) -> f64 {
        h.value_at_quantile(q) as f64 / 1000.0
    }

    pub fn to_json(&self, system: &str, run: usize) -> Value {
        let lat = |h: &Histogram<u64>| json!({"p50_ms": Self::ms(h, 0.5), "p99_ms": Self::ms(h, 0.99), "p999_ms": Self::ms(h, 0.999), "count": h.len()});
        json!({
            "system": system,
            "run": run,
            "events": self.events,
            "publish_per_s": self.publish_per_s(),
            "end_to_end_per_s": self.end_to_end_per_s(),
            "publish_to_deliver": lat(&self.deliver_us),
            "publish_to_ack": lat(&self.ack_us),
            "redelivered": self.redelivered,
            "server_cpu_s": if self.server_cpu_s.is_nan() { Value::Null } else { json!(self.server_cpu_s) },
            "server_cpu_us_per_event": if self.server_cpu_s.is_nan() { Value::Null } else { json!(self.server_us_per_event()) },
            "client_cpu_s": self.client_cpu_s,
            "broker_cpu_s": if self.broker_cpu_s.is_nan() { Value::Null } else { json!(self.broker_cpu_s) },
            "wall_s": self.total_wall.as_secs_f64(),
        })
    }

    /// One line of the table; `peer`: the end-to-end rate of the row it is compared with.
    pub fn row(&self, system: &str, peer: Option<f64>) -> String {
        let ratio = peer
            .map(|r| format!("{:.2}x", self.end_to_end_per_s() / r.max(1e-9)))
            .unwrap_or_else(|| "-".to_owned());
        let or_dash = |v: f64, digits: usize| {
            if v.is_nan() {
                "-".to_owned()
            } else {
                format!("{v:.digits$}")
            }
        };
        format!(
            "{system:<34} {:>9.0} {:>9.0} {:>6} {:>7.1} {:>7.1} {:>8.1} {:>7.1} {:>7.1} {:>8.1} {:>7} {:>9} {:>7.2} {:>7}",
            self.publish_per_s(),
            self.end_to_end_per_s(),
            ratio,
            Self::ms(&self.deliver_us, 0.5),
            Self::ms(&self.deliver_us, 0.99),
            Self::ms(&self.deliver_us, 0.999),
            Self::ms(&self.ack_us, 0.5),
            Self::ms(&self.ack_us, 0.99),
            Self::ms(&self.ack_us, 0.999),
            or_dash(self.server_cpu_s, 2),
            or_dash(self.server_us_per_event(), 0),
            self.client_cpu_s,
            or_dash(self.broker_cpu_s, 2),
        )
    }
}

/// The table's head, aligned with [`Sample::row`].
pub fn header() -> String {
    format!(
        "{:<34} {:>9} {:>9} {:>6} {:>7} {:>7} {:>8} {:>7} {:>7} {:>8} {:>7} {:>9} {:>7} {:>7}",
        "system",
        "publish/s",
        "e2e/s",
        "x peer",
        "dlv p50",
        "dlv p99",
        "dlv p999",
        "ack p50",
        "ack p99",
        "ack p999",
        "srv cpu",
        "srv us/ev",
        "cli cpu",
        "brk cpu"
    )
}
