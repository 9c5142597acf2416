//! Views shown by both listeners: a subscription with its progress (traffic's
//! `GET /v1/subscriptions/{group}`, admin's `GET /admin/subscriptions`, the console) and
//! one partition's offsets (admin's `GET /admin/offsets`, inside a subscription's view).
//! Here rather than in `traffic` or `admin`, so that neither listener imports the other.

use serde::Serialize;
use utoipa::ToSchema;

use super::schema::SubscriptionDefinition;
use crate::engine::{OffsetRow, SubscriptionInfo};

/// A subscription with its progress, as `GET /v1/subscriptions/{group}` and
/// `GET /admin/subscriptions` show it.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(super) struct SubscriptionView {
    #[serde(flatten)]
    definition: SubscriptionDefinition,
    /// Sum of the partitions' lags.
    lag: u64,
    in_flight: u64,
    clients: usize,
    replaying: usize,
    partitions: Vec<OffsetView>,
    stats: StatsView,
}

impl SubscriptionView {
    pub(super) fn new(info: &SubscriptionInfo) -> Self {
        let s = &info.stats;
        Self {
            definition: SubscriptionDefinition::new(&info.spec),
            lag: info.lanes.iter().map(|l| l.lag).sum(),
            in_flight: info.lanes.iter().map(|l| l.in_flight).sum(),
            clients: info.clients,
            replaying: info.replaying,
            partitions: info.lanes.iter().map(OffsetView::new).collect(),
            stats: StatsView {
                delivered: s.delivered,
                redelivered: s.redelivered,
                acked: s.acked,
                late_acked: s.late_acked,
                nacked: s.nacked,
                expired: s.expired,
                dead_lettered: s.dead_lettered,
                filtered: s.filtered,
                rejected: s.rejected,
                skipped_retention: s.skipped_retention,
            },
        }
    }
}

/// The group's delivery counters since the process started.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct StatsView {
    delivered: u64,
    redelivered: u64,
    acked: u64,
    late_acked: u64,
    nacked: u64,
    expired: u64,
    dead_lettered: u64,
    filtered: u64,
    rejected: u64,
    skipped_retention: u64,
}

/// One (group, partition) with its four offsets.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(super) struct OffsetView {
    group: String,
    topic: String,
    partition: u32,
    /// The log's end offset (the next offset it will assign).
    end: u64,
    /// The next offset the group will fetch.
    cursor: u64,
    /// One past the highest offset handed out.
    push: u64,
    /// The lowest offset not yet done; everything below is ACKed or dead-lettered.
    watermark: u64,
    /// The watermark as last made durable.
    durable_watermark: Option<u64>,
    /// Done ranges above the watermark, `[start, end)`.
    #[schema(value_type = Vec<Vec<u64>>)]
    ack_ranges: Vec<(u64, u64)>,
    /// `end - watermark`.
    lag: u64,
    in_flight: u64,
    /// Which instance serves the partition (Kafka backend: Kafka's group coordinator
    /// decided); absent when one instance owns the log whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    owner: Option<String>,
}

impl OffsetView {
    pub(super) fn new(r: &OffsetRow) -> Self {
        Self {
            group: r.group.as_str().to_owned(),
            topic: r.topic.as_str().to_owned(),
            partition: r.partition,
            end: r.end,
            cursor: r.cursor,
            push: r.push,
            watermark: r.watermark,
            durable_watermark: r.durable_watermark,
            ack_ranges: r.ack_ranges.clone(),
            lag: r.lag,
            in_flight: r.in_flight,
            owner: r.owner.clone(),
        }
    }
}
