//! Prometheus metrics (`GET /metrics` on the admin listener), OpenMetrics text format via
//! `prometheus-client`.
//!
//! Two kinds of numbers:
//! - what the HTTP layer sees itself, kept in the registry as it happens:
//!   `unimesh_published_total{topic}`, `unimesh_publish_duplicates_total{topic}`,
//!   `unimesh_publish_latency_seconds`,
//!   `unimesh_http_request_duration_seconds{route}`, `unimesh_auth_refused_total{reason}`;
//! - what the engine knows, read from [`EngineHandle::metrics_snapshot`] at scrape time (a
//!   collector encodes the snapshot taken for that scrape): `unimesh_delivered_total{group}`,
//!   `unimesh_acked_total`, `unimesh_nacked_total`, `unimesh_redelivered_total`,
//!   `unimesh_dead_lettered_total`, `unimesh_expired_total`, `unimesh_in_flight{group,partition}`,
//!   `unimesh_lag{group,partition}`, and a few engine-wide counters;
//! - what the log reports: `unimesh_log_records_appended_total`,
//!   `unimesh_log_synced_writes_total` (their ratio is the group-commit batch size),
//!   `unimesh_log_write_failures_total`, `unimesh_log_disk_bytes`; and on Kafka
//!   `unimesh_kafka_rebalances_total`, `unimesh_kafka_producer_errors_total`,
//!   `unimesh_kafka_out_of_range_total`, `unimesh_kafka_commit_failures_total`,
//!   `unimesh_kafka_progress_ranges_dropped_total`, `unimesh_kafka_log_divergences_total`,
//!   `unimesh_kafka_end_anomalies_total`, `unimesh_kafka_gaps_refuted_total`,
//!   `unimesh_kafka_progress_read_retries_total`, `unimesh_kafka_group_nudges_total`,
//!   `unimesh_kafka_client_rebuilds_total` and the gauge `unimesh_kafka_broker_up`
//!   (`unimesh_lag` is then the broker's end offset, read every second, minus the
//!   watermark).
//!
//! The group totals are sums over the groups that exist at scrape time plus the groups
//! deleted since the process started, so deleting a group never lowers them (they restart
//! from zero only with the process, which Prometheus reads as a counter reset).
//!
//! Label values are bounded: topics and groups by the engine's limits, routes by the route
//! table (unmatched requests share one label).
//!
//! [`EngineHandle::metrics_snapshot`]: crate::engine::EngineHandle::metrics_snapshot

use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use unimesh_core::TopicName;

use crate::engine::{MetricsSnapshot, OffsetRow};

/// The content type of the scrape answer.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

type Labels = Vec<(&'static str, String)>;

/// Reads one counter of a group's stats.
type StatOf = fn(&unimesh_core::GroupStats) -> u64;

/// Reads one gauge of a group's lane.
type LaneOf = fn(&OffsetRow) -> u64;

pub struct Metrics {
    registry: Registry,
    published: Family<Labels, Counter>,
    publish_duplicates: Family<Labels, Counter>,
    publish_latency: Histogram,
    request_duration: Family<Labels, Histogram>,
    late_replies: Counter,
    request_timeouts: Counter,
    auth_refused: Family<Labels, Counter>,
    snapshot: Arc<Mutex<Option<MetricsSnapshot>>>,
    /// One scrape at a time: a scrape installs its snapshot, then encodes it.
    scrape: Mutex<()>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

fn latency_buckets() -> impl Iterator<Item = f64> {
    // 0.5 ms .. ~65 s: a synced publish takes about a millisecond, a long-poll up to a minute.
    exponential_buckets(0.0005, 2.0, 18)
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let published = Family::<Labels, Counter>::default();
        registry.register(
            "unimesh_published",
            "Events appended by publish requests, per topic (repeats answered from a dedup window are counted apart)",
            published.clone(),
        );
        let publish_duplicates = Family::<Labels, Counter>::default();
        registry.register(
            "unimesh_publish_duplicates",
            "Events answered from the topic's dedup window (a (source, id) published before), not appended again, per topic",
            publish_duplicates.clone(),
        );
        let publish_latency = Histogram::new(latency_buckets());
        registry.register(
            "unimesh_publish_latency_seconds",
            "Time from a publish request's arrival to its durable answer",
            publish_latency.clone(),
        );
        let request_duration =
            Family::<Labels, Histogram>::new_with_constructor(|| Histogram::new(latency_buckets()));
        registry.register(
            "unimesh_http_request_duration_seconds",
            "HTTP request duration per route (long-polls include their wait)",
            request_duration.clone(),
        );
        let late_replies = Counter::default();
        registry.register(
            "unimesh_late_replies",
            "Replies published after their request/reply request had timed out (dropped)",
            late_replies.clone(),
        );
        let request_timeouts = Counter::default();
        registry.register(
            "unimesh_request_timeouts",
            "Request/reply requests answered 504: no reply within timeoutMs",
            request_timeouts.clone(),
        );
        let auth_refused = Family::<Labels, Counter>::default();
        registry.register(
            "unimesh_auth_refused",
            "Requests refused by the auth gate, per reason (missing, invalid, forbidden), and client certificates refused in the TLS handshake (certificate)",
            auth_refused.clone(),
        );
        let snapshot = Arc::new(Mutex::new(None));
        registry.register_collector(Box::new(SnapshotCollector {
            slot: snapshot.clone(),
        }));
        Self {
            registry,
            published,
            publish_duplicates,
            publish_latency,
            request_duration,
            late_replies,
            request_timeouts,
            auth_refused,
            snapshot,
            scrape: Mutex::new(()),
        }
    }

    pub fn published(&self, topic: &TopicName, events: u64) {
        self.published
            .get_or_create(&vec![("topic", topic.as_str().to_owned())])
            .inc_by(events);
    }

    pub fn publish_duplicates(&self, topic: &TopicName, events: u64) {
        self.publish_duplicates
            .get_or_create(&vec![("topic", topic.as_str().to_owned())])
            .inc_by(events);
    }

    pub fn late_replies(&self, n: u64) {
        self.late_replies.inc_by(n);
    }

    pub fn auth_refused(&self, reason: &'static str) {
        self.auth_refused
            .get_or_create(&vec![("reason", reason.to_owned())])
            .inc();
    }

    pub fn request_timed_out(&self) {
        self.request_timeouts.inc();
    }

    pub fn observe_publish(&self, seconds: f64) {
        self.publish_latency.observe(seconds);
    }

    pub fn observe_request(&self, route: &str, seconds: f64) {
        self.request_duration
            .get_or_create(&vec![("route", route.to_owned())])
            .observe(seconds);
    }

    /// The scrape answer. Without a snapshot (the engine did not answer) only the HTTP
    /// layer's own metrics are written.
    pub fn render(&self, snapshot: Option<MetricsSnapshot>) -> String {
        let _one_at_a_time = self.scrape.lock().unwrap_or_else(|p| p.into_inner());
        *self.snapshot.lock().unwrap_or_else(|p| p.into_inner()) = snapshot;
        let mut out = String::new();
        // Writing into a String cannot fail; an encoder error would be a bug in a collector,
        // and a partial scrape is still better than none.
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "metrics encoding failed");
        }
        *self.snapshot.lock().unwrap_or_else(|p| p.into_inner()) = None;
        out
    }
}

#[derive(Debug)]
struct SnapshotCollector {
    slot: Arc<Mutex<Option<MetricsSnapshot>>>,
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        let Some(snap) = slot.as_ref() else {
            return Ok(());
        };

        let mut family = encoder.encode_descriptor(
            "unimesh_delivered",
            "First attempts handed to clients, per group (later ones: unimesh_redelivered_total)",
            None,
            MetricType::Counter,
        )?;
        for g in &snap.groups {
            let labels = [("group", g.spec.group.as_str())];
            ConstCounter::new(g.stats.delivered).encode(family.encode_family(&labels)?)?;
        }

        let totals: [(&str, &str, StatOf); 5] = [
            ("unimesh_acked", "Deliveries ACKed", |s| s.acked),
            ("unimesh_nacked", "Deliveries NACKed", |s| s.nacked),
            (
                "unimesh_redelivered",
                "Redeliveries (attempt 2 and later)",
                |s| s.redelivered,
            ),
            ("unimesh_dead_lettered", "Records dead-lettered", |s| {
                s.dead_lettered
            }),
            (
                "unimesh_expired",
                "Deliveries whose ACK timeout passed",
                |s| s.expired,
            ),
        ];
        for (name, help, get) in totals {
            let sum = snap
                .groups
                .iter()
                .map(|g| get(&g.stats))
                .fold(get(&snap.mesh.removed_group_totals), u64::saturating_add);
            let m = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            ConstCounter::new(sum).encode(m)?;
        }

        let lane_gauges: [(&str, &str, LaneOf); 2] = [
            (
                "unimesh_in_flight",
                "Deliveries handed out and not yet done, per group and partition",
                |l| l.in_flight,
            ),
            (
                "unimesh_lag",
                "Log end offset minus the group's ACK watermark, per group and partition",
                |l| l.lag,
            ),
        ];
        for (name, help, get) in lane_gauges {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for g in &snap.groups {
                for lane in &g.lanes {
                    let labels = [
                        ("group", g.spec.group.as_str().to_owned()),
                        ("partition", lane.partition.to_string()),
                    ];
                    ConstGauge::new(get(lane)).encode(family.encode_family(&labels)?)?;
                }
            }
        }

        let m = encoder.encode_descriptor(
            "unimesh_epoch",
            "This incarnation's epoch (one more per restart)",
            None,
            MetricType::Gauge,
        )?;
        ConstGauge::new(snap.epoch).encode(m)?;
        let mesh = &snap.mesh;
        let engine: [(&str, &str, u64); 5] = [
            ("unimesh_fetches", "Fetches from the log", mesh.fetches),
            (
                "unimesh_fetch_failures",
                "Failed fetches from the log",
                mesh.fetch_failures,
            ),
            (
                "unimesh_persists",
                "Progress batches issued to the state store (failures counted apart)",
                mesh.persists,
            ),
            (
                "unimesh_persist_failures",
                "Progress batches that failed to persist (retried)",
                mesh.persist_failures,
            ),
            (
                "unimesh_skipped_retention",
                "Records deleted by retention before a group fetched them",
                mesh.skipped_retention,
            ),
        ];
        for (name, help, v) in engine {
            let m = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            ConstCounter::new(v).encode(m)?;
        }

        if let Some(log) = &snap.log {
            let counters: [(&str, &str, u64); 3] = [
                (
                    "unimesh_log_records_appended",
                    "Records durably appended to the log since start",
                    log.records_appended,
                ),
                (
                    "unimesh_log_synced_writes",
                    "WAL fsyncs of the log (records appended per fsync = group-commit batch size)",
                    log.synced_writes,
                ),
                (
                    "unimesh_log_write_failures",
                    "Appends refused because a log write failed (restart to recover)",
                    log.write_failures,
                ),
            ];
            for (name, help, v) in counters {
                let m = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
                ConstCounter::new(v).encode(m)?;
            }
            if let Some(b) = &log.broker {
                let counters: [(&str, &str, u64); 10] = [
                    (
                        "unimesh_kafka_rebalances",
                        "Kafka rebalance callbacks run (assignments and revocations)",
                        b.rebalances,
                    ),
                    (
                        "unimesh_kafka_producer_errors",
                        "Writes the Kafka broker refused or did not acknowledge",
                        b.producer_errors,
                    ),
                    (
                        "unimesh_kafka_out_of_range",
                        "Fetches answered offset-out-of-range (repositioned and reported)",
                        b.out_of_range,
                    ),
                    (
                        "unimesh_kafka_commit_failures",
                        "Offset commits to Kafka that failed (the next one carries the watermark)",
                        b.commit_failures,
                    ),
                    (
                        "unimesh_kafka_progress_ranges_dropped",
                        "ACK ranges and attempt counts left out of progress records (bounded)",
                        b.progress_ranges_dropped,
                    ),
                    (
                        "unimesh_kafka_log_divergences",
                        "Lanes whose log diverged from what they knew (a lost tail; forgotten from there and reported)",
                        b.log_divergences,
                    ),
                    (
                        "unimesh_kafka_end_anomalies",
                        "Partition ends the broker claimed below records it still held (refuted by a read; nothing dropped)",
                        b.end_anomalies,
                    ),
                    (
                        "unimesh_kafka_gaps_refuted",
                        "Offsets answered as absent after a reposition that a read from further back showed to exist",
                        b.gaps_refuted,
                    ),
                    (
                        "unimesh_kafka_progress_read_retries",
                        "Reads of the progress topic at an assignment that failed and were tried again",
                        b.progress_read_retries,
                    ),
                    (
                        "unimesh_kafka_group_nudges",
                        "Group requests sent to a coordinator whose rebalance seemed stuck (DESIGN §8)",
                        b.group_nudges,
                    ),
                ];
                for (name, help, v) in counters {
                    let m = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
                    ConstCounter::new(v).encode(m)?;
                }
                let m = encoder.encode_descriptor(
                    "unimesh_kafka_client_rebuilds",
                    "Kafka clients built anew because the one in use was in a fatal state",
                    None,
                    MetricType::Counter,
                )?;
                ConstCounter::new(b.client_rebuilds).encode(m)?;
                let m = encoder.encode_descriptor(
                    "unimesh_kafka_broker_up",
                    "1 while the Kafka broker answers the watch's metadata probe, 0 while it does not",
                    None,
                    MetricType::Gauge,
                )?;
                ConstGauge::new(i64::from(b.broker_up)).encode(m)?;
            }
            if let Some(bytes) = log.disk_bytes {
                let m = encoder.encode_descriptor(
                    "unimesh_log_disk_bytes",
                    "Bytes of the log's table files on disk (the write-ahead log not counted)",
                    None,
                    MetricType::Gauge,
                )?;
                ConstGauge::new(bytes).encode(m)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_metrics_render_without_a_snapshot() {
        let m = Metrics::new();
        let t = TopicName::new("orders").expect("valid");
        m.published(&t, 3);
        m.published(&t, 2);
        m.observe_publish(0.002);
        m.observe_request("POST /v1/topics/{topic}/events", 0.002);
        let text = m.render(None);
        assert!(
            text.contains("unimesh_published_total{topic=\"orders\"} 5"),
            "{text}"
        );
        assert!(
            text.contains("unimesh_publish_latency_seconds_count 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "unimesh_http_request_duration_seconds_count{route=\"POST /v1/topics/{topic}/events\"} 1"
            ),
            "{text}"
        );
        assert!(
            !text.contains("unimesh_acked_total"),
            "no engine numbers without a snapshot"
        );
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn log_numbers_render_when_the_log_reports_them() {
        let m = Metrics::new();
        let mut snapshot = MetricsSnapshot {
            groups: Vec::new(),
            mesh: unimesh_core::MeshStats::default(),
            epoch: 3,
            log: Some(crate::engine::LogMetrics {
                records_appended: 120,
                synced_writes: 7,
                write_failures: 2,
                disk_bytes: Some(4096),
                broker: Some(crate::engine::BrokerMetrics {
                    rebalances: 4,
                    producer_errors: 1,
                    out_of_range: 0,
                    commit_failures: 0,
                    progress_ranges_dropped: 9,
                    log_divergences: 2,
                    end_anomalies: 5,
                    gaps_refuted: 6,
                    progress_read_retries: 8,
                    broker_up: false,
                    client_rebuilds: 3,
                    group_nudges: 11,
                }),
            }),
        };
        let text = m.render(Some(snapshot.clone()));
        for needle in [
            "unimesh_log_records_appended_total 120\n",
            "unimesh_log_synced_writes_total 7\n",
            "unimesh_log_write_failures_total 2\n",
            "unimesh_log_disk_bytes 4096\n",
            "unimesh_kafka_rebalances_total 4\n",
            "unimesh_kafka_producer_errors_total 1\n",
            "unimesh_kafka_progress_ranges_dropped_total 9\n",
            "unimesh_kafka_log_divergences_total 2\n",
            "unimesh_kafka_end_anomalies_total 5\n",
            "unimesh_kafka_gaps_refuted_total 6\n",
            "unimesh_kafka_progress_read_retries_total 8\n",
            "unimesh_kafka_client_rebuilds_total 3\n",
            "unimesh_kafka_group_nudges_total 11\n",
            "unimesh_kafka_broker_up 0\n",
            "unimesh_epoch 3\n",
        ] {
            assert!(text.contains(needle), "{needle} missing from\n{text}");
        }
        snapshot.log = None;
        let text = m.render(Some(snapshot));
        assert!(!text.contains("unimesh_log_"), "{text}");
    }
}
