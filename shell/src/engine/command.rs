//! The messages of the engine task: commands from the handle (each with its reply
//! channel) and completions of the I/O the task started.

use madsim_tokio as tokio;
use tokio::sync::oneshot;
use unimesh_core::{
    ClientId, Delivery, DeliveryId, FetchId, FetchResult, GroupName, Offset, Partition, Record,
    Settle, SubscriptionSpec, Ticket, TopicName,
};

use super::api::{ClientInfo, EngineError, MetricsSnapshot, OffsetRow, Settling, SubscriptionInfo};
use super::ports::{StorageError, TopicFacts};
use super::stream::Stream;

pub(crate) type Reply<T> = oneshot::Sender<Result<T, EngineError>>;

/// Requests from the HTTP front.
pub(crate) enum Command {
    Subscribe {
        spec: Box<SubscriptionSpec>,
        reply: Reply<bool>,
    },
    Unsubscribe {
        group: GroupName,
        reply: Reply<()>,
    },
    Subscription {
        group: GroupName,
        reply: Reply<SubscriptionInfo>,
    },
    Subscriptions {
        reply: Reply<Vec<SubscriptionInfo>>,
    },
    Poll {
        group: GroupName,
        client: ClientId,
        max: u32,
        wait_ms: u64,
        reply: Reply<Vec<Delivery>>,
    },
    Settle {
        group: GroupName,
        how: Settling,
        ids: Vec<DeliveryId>,
        reply: Reply<Vec<Settle>>,
    },
    Clients {
        reply: Reply<Vec<ClientInfo>>,
    },
    Evict {
        client: ClientId,
        reply: Reply<usize>,
    },
    Offsets {
        topic: TopicName,
        reply: Reply<Vec<OffsetRow>>,
    },
    /// A stream session (SSE, WebSocket): up to `window` deliveries queued at once.
    OpenStream {
        group: GroupName,
        client: ClientId,
        window: u32,
        reply: Reply<Stream>,
    },
    Replay {
        group: GroupName,
        records: Vec<(Partition, Record)>,
        reply: Reply<usize>,
    },
    /// Answers the offset the lane restarts at: `offset`, or with `clamp` the nearest
    /// offset the log holds (an offset resolved from a time, which retention may have
    /// passed meanwhile); without `clamp` an offset outside the log is refused.
    Seek {
        group: GroupName,
        partition: Partition,
        offset: Offset,
        clamp: bool,
        reply: Reply<Offset>,
    },
    Metrics {
        reply: Reply<MetricsSnapshot>,
    },
    /// The groups with `push.url`.
    PushTargets {
        reply: Reply<Vec<super::api::PushTarget>>,
    },
    Shutdown {
        reply: Reply<()>,
    },
}

/// An operator seek waiting for the range of its partition (`Command::Seek`).
pub(crate) struct Seek {
    pub group: GroupName,
    pub topic: TopicName,
    pub partition: Partition,
    pub offset: Offset,
    pub clamp: bool,
    pub reply: Reply<Offset>,
}

/// Completions of I/O the engine started.
pub(crate) enum Event {
    /// The log prepared the topic of a subscription (created it, read its offsets).
    TopicPrepared {
        spec: Box<SubscriptionSpec>,
        reply: Reply<bool>,
        facts: Result<TopicFacts, StorageError>,
    },
    /// The log answered the range of a partition an operator seek names.
    SeekRange {
        seek: Box<Seek>,
        range: Result<(Offset, Offset), StorageError>,
    },
    Fetched {
        group: GroupName,
        partition: Partition,
        fetch_id: FetchId,
        result: FetchResult,
    },
    Persisted {
        ticket: Ticket,
        result: Result<(), StorageError>,
    },
    /// A revocation's flush finished (or failed): drop the lanes, then answer the broker.
    RevokeFlushed {
        group: GroupName,
        partitions: Vec<Partition>,
        flushed: Result<(), String>,
        done: std::sync::mpsc::SyncSender<()>,
        /// Which flush of the revocation this was (1 for the first).
        round: u32,
    },
}
