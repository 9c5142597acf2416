//! Configuration of the mesh and of subscription groups. Every bound on memory lives here
//! (TIGER_STYLE: put a limit on everything).

use std::collections::BTreeMap;

use crate::filter::{Filter, MAX_FILTER_EXTENSIONS};
use crate::types::{GroupName, Millis, Offset, Partition, TopicName};

/// Limits and timings of one mesh instance.
#[derive(Clone, Debug, PartialEq)]
pub struct MeshConfig {
    /// Most subscription groups at once.
    pub max_groups: usize,
    /// Most clients attached to one group at once.
    pub max_clients_per_group: usize,
    /// Most partitions one group may be assigned.
    pub max_partitions_per_group: usize,
    /// Most records one lane (group × partition) holds in memory that are not done:
    /// fetched-but-undelivered, in flight, waiting for redelivery. Fetching pauses at it.
    pub max_window_per_lane: usize,
    /// Most ACK ranges above the watermark of one lane; fetching pauses at it (never drops).
    pub max_ack_ranges_per_lane: usize,
    /// Most records asked for by one fetch.
    pub fetch_batch: usize,
    /// How long a failed fetch waits before it is retried.
    pub fetch_retry_ms: Millis,
    /// ACKs, attempt counts and dead letters are coalesced into one persist per interval.
    pub flush_interval_ms: Millis,
    /// Most persists handed to the shell and not yet reported `Persisted`.
    pub max_outstanding_persists: usize,
    /// A client with no credit, nothing in flight and no activity for this long is removed.
    pub client_idle_timeout_ms: Millis,
    /// Most records replayed from the DLQ into one group at once.
    pub max_replay_per_group: usize,
    /// Emit `Commit` effects (for brokers that keep group offsets, such as Kafka).
    pub commit_to_broker: bool,
    /// Limits on what a subscription may ask for.
    pub limits: SubscriptionLimits,
}

impl Default for MeshConfig {
    fn default() -> Self {
        Self {
            max_groups: 10_000,
            max_clients_per_group: 1_000,
            max_partitions_per_group: 1_024,
            max_window_per_lane: 4_096,
            max_ack_ranges_per_lane: 4_096,
            fetch_batch: 256,
            fetch_retry_ms: 200,
            flush_interval_ms: 20,
            max_outstanding_persists: 4,
            client_idle_timeout_ms: 60_000,
            max_replay_per_group: 10_000,
            commit_to_broker: false,
            limits: SubscriptionLimits::default(),
        }
    }
}

/// Bounds on the per-group settings a user may choose.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscriptionLimits {
    pub max_ack_timeout_ms: Millis,
    pub max_attempts: u32,
    pub max_in_flight_per_client: u32,
    pub max_backoff_ms: Millis,
}

impl Default for SubscriptionLimits {
    fn default() -> Self {
        Self {
            max_ack_timeout_ms: 12 * 3_600_000,
            max_attempts: 1_000,
            max_in_flight_per_client: 10_000,
            max_backoff_ms: 24 * 3_600_000,
        }
    }
}

/// The order in which a group's clients see records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Ordering {
    /// Any client, any order: maximum parallelism.
    #[default]
    None,
    /// Records with the same `partitionkey` go to one client at a time, in offset order;
    /// the next is delivered only when the previous is done (Pulsar's Key_Shared).
    Key,
}

/// Where a group with no stored progress starts on a partition.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum StartFrom {
    #[default]
    Earliest,
    /// The end offset of each partition when the group was created, as the shell read it.
    /// Partitions absent from the map start at the end offset given on assignment.
    Latest(BTreeMap<Partition, Offset>),
}

/// Redelivery backoff: `initial_ms * multiplier^(attempt-1)`, capped at `max_ms`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Backoff {
    pub initial_ms: Millis,
    pub max_ms: Millis,
    pub multiplier: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial_ms: 1_000,
            max_ms: 60_000,
            multiplier: 2.0,
        }
    }
}

impl Backoff {
    /// Delay before attempt `next_attempt` (>= 2). Exact and deterministic.
    pub fn delay_ms(&self, next_attempt: u32) -> Millis {
        let mut delay = self.initial_ms.min(self.max_ms);
        for _ in 2..next_attempt {
            let grown = (delay as f64 * self.multiplier).min(self.max_ms as f64);
            // `grown` is finite and within [0, max_ms]: multiplier was validated >= 1.
            delay = grown as Millis;
            if delay >= self.max_ms {
                return self.max_ms;
            }
        }
        delay
    }
}

/// A durable subscription group as a user defines it.
#[derive(Clone, Debug, PartialEq)]
pub struct SubscriptionSpec {
    pub group: GroupName,
    pub topic: TopicName,
    pub filter: Filter,
    pub ordering: Ordering,
    pub ack_timeout_ms: Millis,
    pub max_attempts: u32,
    pub backoff: Backoff,
    pub max_in_flight_per_client: u32,
    pub start_from: StartFrom,
    /// Webhook target; carried for the shell, the core does not look at it.
    pub push_url: Option<String>,
    /// Webhook signing secret (`whsec_` and base64); carried for the shell like `push_url`.
    pub push_secret: Option<String>,
    /// Most events in one webhook request: 1, one binary-mode event per request; more, a
    /// CloudEvents batch of up to this many. Carried for the shell like `push_url`.
    pub push_batch: u32,
}

impl SubscriptionSpec {
    /// A spec with the defaults a user gets when they only name the topic.
    pub fn new(group: GroupName, topic: TopicName) -> Self {
        Self {
            group,
            topic,
            filter: Filter::default(),
            ordering: Ordering::None,
            ack_timeout_ms: 30_000,
            max_attempts: 16,
            backoff: Backoff::default(),
            max_in_flight_per_client: 100,
            start_from: StartFrom::Earliest,
            push_url: None,
            push_secret: None,
            push_batch: 1,
        }
    }

    /// Checks every setting against the limits; the error names the field.
    pub fn validate(&self, limits: &SubscriptionLimits) -> Result<(), SpecError> {
        let field = |name: &'static str, why: String| Err(SpecError { field: name, why });
        if self.ack_timeout_ms == 0 || self.ack_timeout_ms > limits.max_ack_timeout_ms {
            return field(
                "ackTimeoutMs",
                format!("must be between 1 and {}", limits.max_ack_timeout_ms),
            );
        }
        if self.max_attempts == 0 || self.max_attempts > limits.max_attempts {
            return field(
                "maxAttempts",
                format!("must be between 1 and {}", limits.max_attempts),
            );
        }
        if self.max_in_flight_per_client == 0
            || self.max_in_flight_per_client > limits.max_in_flight_per_client
        {
            return field(
                "maxInFlightPerClient",
                format!("must be between 1 and {}", limits.max_in_flight_per_client),
            );
        }
        let b = &self.backoff;
        if b.max_ms > limits.max_backoff_ms {
            return field(
                "backoff.maxMs",
                format!("must be at most {}", limits.max_backoff_ms),
            );
        }
        if b.initial_ms > b.max_ms {
            return field("backoff.initialMs", "must not exceed backoff.maxMs".into());
        }
        if !b.multiplier.is_finite() || b.multiplier < 1.0 || b.multiplier > 100.0 {
            return field("backoff.multiplier", "must be between 1 and 100".into());
        }
        if self.filter.extensions.len() > MAX_FILTER_EXTENSIONS {
            return field(
                "filter.extensions",
                format!("at most {MAX_FILTER_EXTENSIONS} conditions"),
            );
        }
        Ok(())
    }
}

/// A setting outside its bounds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecError {
    pub field: &'static str,
    pub why: String,
}

impl std::fmt::Display for SpecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.field, self.why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_caps() {
        let b = Backoff {
            initial_ms: 100,
            max_ms: 1_000,
            multiplier: 2.0,
        };
        let delays: Vec<_> = (2..8).map(|a| b.delay_ms(a)).collect();
        assert_eq!(delays, vec![100, 200, 400, 800, 1_000, 1_000]);
        assert_eq!(b.delay_ms(u32::MAX), 1_000);
    }

    #[test]
    fn validation_names_the_field() {
        let g = GroupName::new("g").unwrap();
        let t = TopicName::new("t").unwrap();
        let limits = SubscriptionLimits::default();
        assert!(SubscriptionSpec::new(g.clone(), t.clone())
            .validate(&limits)
            .is_ok());
        let mut s = SubscriptionSpec::new(g.clone(), t.clone());
        s.max_attempts = 0;
        assert_eq!(s.validate(&limits).unwrap_err().field, "maxAttempts");
        let mut s = SubscriptionSpec::new(g.clone(), t.clone());
        s.backoff.multiplier = f64::NAN;
        assert_eq!(s.validate(&limits).unwrap_err().field, "backoff.multiplier");
        let mut s = SubscriptionSpec::new(g, t);
        s.ack_timeout_ms = 0;
        assert_eq!(s.validate(&limits).unwrap_err().field, "ackTimeoutMs");
    }
}
