//! What one run of one system measured, and how runs are summarised.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde_json::{json, Value};

/// Latencies in microseconds, 1 µs to 10 min, 3 significant digits.
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3)
        .expect("constant bounds: low >= 1, high >= 2 * low")
}

/// The publish time of the batch starting at event `first`: with an offered load of
/// `rate` events/s (0: as fast as answers come), the batch waits for its scheduled time and
/// its events are stamped with that time, not with when the client got round to sending
/// them (so a client that falls behind shows up in the latencies: no coordinated omission).
pub fn paced(started: std::time::Instant, first: u64, rate: u64) -> u64 {
    let now = started.elapsed().as_micros() as u64;
    if rate == 0 {
        return now;
    }
    let due = first.saturating_mul(1_000_000) / rate;
    if due > now {
        std::thread::sleep(std::time::Duration::from_micros(due - now));
    }
    due
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
}

impl Sample {
    pub fn publish_per_s(&self) -> f64 {
        self.events as f64 / self.publish_wall.as_secs_f64().max(1e-9)
    }

    pub fn end_to_end_per_s(&self) -> f64 {
        self.events as f64 / self.total_wall.as_secs_f64().max(1e-9)
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
            "server_cpu_s": self.server_cpu_s,
            "client_cpu_s": self.client_cpu_s,
            "wall_s": self.total_wall.as_secs_f64(),
        })
    }

    /// One line of the table.
    pub fn row(&self, system: &str, reference: Option<f64>) -> String {
        let ratio = reference
            .map(|r| format!("{:.2}x", self.end_to_end_per_s() / r.max(1e-9)))
            .unwrap_or_else(|| "1.00x".to_owned());
        format!(
            "{system:<28} {:>10.0} {:>10.0} {:>7} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>7.2} {:>7.2}",
            self.publish_per_s(),
            self.end_to_end_per_s(),
            ratio,
            Self::ms(&self.deliver_us, 0.5),
            Self::ms(&self.deliver_us, 0.99),
            Self::ms(&self.deliver_us, 0.999),
            Self::ms(&self.ack_us, 0.5),
            Self::ms(&self.ack_us, 0.99),
            Self::ms(&self.ack_us, 0.999),
            self.server_cpu_s,
            self.client_cpu_s,
        )
    }
}

pub const HEADER: &str = "system                       publish/s      e2e/s   ratio  dlv p50  dlv p99 dlv p999  ack p50  ack p99 ack p999  srv cpu cli cpu";
