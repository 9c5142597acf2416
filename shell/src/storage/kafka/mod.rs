//! The Kafka backend (`storage.backend = "kafka"`): several unimesh instances in front of one
//! Kafka cluster, Kafka storing the events and its group coordinator deciding which
//! instance serves which partition of which subscription group. No home-made coordinator.
//!
//! The rooms, split the quinn-proto way: `rules/` the decisions, free of librdkafka and
//! tokio; `io/` the librdkafka side. This file holds the settings; `io/log` the
//! [`KafkaLog`] port (publish, topics, offsets); `io/consumer` one consumer per (instance, group) whose rebalance callbacks become
//! the core's `PartitionsAssigned` / `PartitionsRevoked` and which carries out the core's
//! `Fetch` (seek, pause, resume) and `Commit`; `io/progress` the compacted progress topic that
//! holds each lane's ACK ranges and attempt counts above the committed offset, and the
//! state port that writes it; `rules/epochs` (with `io/probe`) the leader-epoch check of what a lane knows against
//! the log (a lost and refilled tail).
//!
//! Contracts (docs/DESIGN.md §3, §5, §7):
//! - publish: `acks=all` and idempotence; the answer waits for every delivery report; a
//!   broker error is `Unavailable` naming it (503).
//! - records are CloudEvents in the Kafka protocol binding (`crate::event::to_kafka` /
//!   `from_kafka`); a record that is not a CloudEvent reaches the core as `Undecodable` with
//!   its reason, which dead-letters it.
//! - exact resume: the committed offset is the durable watermark (the core's `Commit`
//!   effect); ranges and attempts above it are in the progress topic, written before the
//!   commit, read by whichever instance is assigned the partition next.
//! - on revoke, the callback returns only after the group's progress is durable in the
//!   progress topic and committed; from then on the core issues no effect for the
//!   partition (late ACKs answer `revoked`).
//!
//! The consumer's decisions are in `rules/`, free of librdkafka: `consumer` forwards its
//! rebalance callbacks there and carries out the answers.
//!
//! Under the madsim simulator (`--cfg madsim`) madsim-rdkafka's simulated broker has no
//! consumer groups and no committed offsets, so `consumer` (librdkafka's callbacks) and
//! the shared `subscriptions` watcher are not built there. In `consumer`'s place
//! `simulated`: the same `rules/` driven by the simulation's group coordinator (the
//! harness's, [`SimCoordinator`]), with commits and committed offsets kept there.

mod io;
pub mod rules;

use std::time::Duration;

#[cfg(not(madsim))]
pub use io::watch_subscriptions;
pub use io::{check_properties, ClientRole, PropertyTables, FIXED_PROPERTIES};
pub use io::{decode_message, dlq_topic, unframed, KafkaLog, KafkaState};
pub use io::{definition, definitions};
#[cfg(madsim)]
pub use io::{MemberId, SimCoordinator};
pub use rules::Rebalance;

/// Everything the Kafka backend needs from the configuration.
#[derive(Clone, Debug)]
pub struct KafkaSettings {
    pub brokers: String,
    /// This instance's name (shown as a partition's owner).
    pub instance: String,
    pub replication: i32,
    /// Partitions of a topic the mesh creates.
    pub default_partitions: u32,
    pub progress_topic: String,
    pub subscriptions_topic: String,
    pub group_prefix: String,
    pub max_progress_ranges: usize,
    pub request_timeout: Duration,
    /// Largest event read from a record (headers and value); larger ones are dead-lettered.
    pub max_event_bytes: usize,
    /// The group consumers' `group.instance.id` (static membership), when on.
    pub group_instance_id: Option<String>,
    pub properties: PropertyTables,
}

impl KafkaSettings {
    /// The consumer `group.id` of a subscription group.
    pub fn group_id(&self, group: &str) -> String {
        format!("{}{group}", self.group_prefix)
    }
}
