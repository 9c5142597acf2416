//! What the engine answers with: its errors and its views (offsets, subscriptions,
//! clients, metrics, dead letters, publish results), shared by the handle, the task and the
//! HTTP front. Nothing here does work.

use std::fmt;
use std::sync::atomic::AtomicBool;

use madsim_tokio as tokio;

use bytes::Bytes;
use unimesh_core::{
    ClientId, Epoch, GroupName, GroupStats, MeshStats, Offset, Partition, Refusal,
    SubscriptionSpec, TopicName,
};

use super::ports::{LogMetrics, StorageError};

/// Why a request could not be served. The HTTP layer maps each to a status and a JSON body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EngineError {
    UnknownGroup(GroupName),
    UnknownTopic(TopicName),
    Refused(Refusal),
    BadRequest(String),
    RateLimited { retry_after_ms: u64 },
    TooLarge(String),
    Unavailable(String),
}

impl fmt::Display for EngineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EngineError::UnknownGroup(g) => write!(f, "no subscription group named {g}"),
            EngineError::UnknownTopic(t) => write!(f, "no topic named {t}"),
            EngineError::Refused(r) => write!(f, "{r}"),
            EngineError::BadRequest(m) => write!(f, "{m}"),
            EngineError::RateLimited { retry_after_ms } => {
                write!(f, "rate limited; retry after {retry_after_ms} ms")
            }
            EngineError::TooLarge(m) => write!(f, "{m}"),
            EngineError::Unavailable(m) => write!(f, "unavailable: {m}"),
        }
    }
}

impl std::error::Error for EngineError {}

/// A storage port's answer as a request's: the caller's fault as a 4xx, a storage fault as
/// `Unavailable` (503).
impl From<StorageError> for EngineError {
    fn from(e: StorageError) -> Self {
        match e {
            StorageError::TooLarge(m) => EngineError::TooLarge(m),
            StorageError::Invalid(m) => EngineError::BadRequest(m),
            e => EngineError::Unavailable(e.to_string()),
        }
    }
}

/// How a settle request treats its delivery ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settling {
    Ack,
    Nack { delay_ms: Option<u64> },
    Extend { extend_ms: Option<u64> },
}

/// One partition of one group, as `/admin/offsets` and `GET /v1/subscriptions/{g}` show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OffsetRow {
    pub group: GroupName,
    pub topic: TopicName,
    pub partition: Partition,
    /// The log's end offset (the next offset it will assign).
    pub end: Offset,
    /// The next offset the group will fetch.
    pub cursor: Offset,
    /// One past the highest offset handed out.
    pub push: Offset,
    /// The lowest offset not yet done; everything below is ACKed or dead-lettered.
    pub watermark: Offset,
    /// The watermark as last made durable.
    pub durable_watermark: Option<Offset>,
    /// Done ranges above the watermark, [start, end).
    pub ack_ranges: Vec<(Offset, Offset)>,
    /// end - watermark.
    pub lag: u64,
    pub in_flight: u64,
    /// The instance serving the partition (this one), when several share the broker.
    pub owner: Option<String>,
}

/// A group that pushes to a webhook, as its pusher needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushTarget {
    pub group: GroupName,
    pub url: String,
    /// The signing secret (`whsec_…`), if pushes are signed.
    pub secret: Option<String>,
    /// The group's backoff maximum (caps a subscriber's `Retry-After`).
    pub backoff_max_ms: u64,
    /// Most events per request (1: binary mode; more: a CloudEvents batch).
    pub batch: u32,
}

#[derive(Clone, Debug)]
pub struct SubscriptionInfo {
    pub spec: SubscriptionSpec,
    pub lanes: Vec<OffsetRow>,
    pub clients: usize,
    /// Dead letters being replayed into the group now.
    pub replaying: usize,
    pub stats: GroupStats,
    /// How many durable writes changed the group's DLQ since the process started (a
    /// browse made before the last one may differ now).
    pub dlq_changes: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientInfo {
    pub group: GroupName,
    pub id: ClientId,
    pub credit: u32,
    pub in_flight: u32,
    pub last_active_ms: u64,
}

#[derive(Clone, Debug)]
pub struct MetricsSnapshot {
    pub groups: Vec<SubscriptionInfo>,
    pub mesh: MeshStats,
    pub epoch: Epoch,
    /// The log's own counters, read by the handle (not the engine task).
    pub log: Option<LogMetrics>,
}

/// One DLQ entry, with its event rendered as delivered (incl. emmqoffset/emmqpartition).
#[derive(Clone, Debug)]
pub struct DlqItem {
    pub topic: TopicName,
    pub partition: Partition,
    pub offset: Offset,
    pub attempts: u32,
    pub reason: String,
    pub dead_lettered_at_ms: u64,
    /// The stored event bytes.
    pub body: Bytes,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishResult {
    pub id: String,
    pub partition: Partition,
    pub offset: Offset,
    /// Answered from the topic's dedup window: not appended again; `partition` and
    /// `offset` are those of the first publish of its (`source`, `id`).
    pub duplicate: bool,
}

/// Engine-wide counters and flags shared with the handle (metrics, health).
#[derive(Debug, Default)]
pub struct Shared {
    pub ready: AtomicBool,
    pub healthy: AtomicBool,
    /// Notified when what the views show may have changed (an input of the core, a
    /// publish, a rate rule): the console's feed waits on it.
    pub changed: tokio::sync::Notify,
}

/// A topic the log would not create: over its limit (the caller's doing) or a storage fault.
pub(crate) fn topic_error(e: StorageError) -> EngineError {
    match e {
        StorageError::Invalid(m) | StorageError::TooLarge(m) => EngineError::BadRequest(m),
        e => EngineError::Unavailable(e.to_string()),
    }
}

/// A refusal of the core, as the engine reports it (an unknown group names the group).
pub(crate) fn refusal(r: Refusal, group: &GroupName) -> EngineError {
    match r {
        Refusal::UnknownGroup => EngineError::UnknownGroup(group.clone()),
        other => EngineError::Refused(other),
    }
}
