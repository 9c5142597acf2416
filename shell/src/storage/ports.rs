//! The ports through which the engine reaches storage: the event log (the broker) and the
//! state store. The engine sees only these traits, so a simulation can run it against
//! in-memory ports with simulated time, faults and crashes. Their implementations live
//! beside the storage they reach: `log/port.rs` (the embedded log), `state/port.rs` (any
//! state store), `memory/` (a log in memory), `kafka/`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use madsim_tokio as tokio;
use tokio::sync::mpsc;
use unimesh_core::{
    Assignment, DlqKey, GroupName, Offset, Partition, PersistBatch, RateRule, Record, TopicName,
};

use crate::storage::log::AppendItem;
use crate::storage::state::{DlqEntry, Loaded};

/// A record found by [`LogPort::recent_appends`]: (append wall ms, partition, offset, the
/// stored bytes).
pub type RecentAppend = (u64, Partition, Offset, Bytes);

/// What [`LogPort::recent_appends`] found: per topic, its records in the window; `None`
/// when the log cannot tell.
pub type RecentAppends = Option<Result<Vec<(TopicName, Vec<RecentAppend>)>, StorageError>>;

pub type BoxFut<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// What a fetch found, before decoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogRead {
    Records(Vec<(Offset, Bytes)>),
    /// Records the port already decoded (a broker whose records are not in the stored
    /// form, such as Kafka's CloudEvents binding): undecodable ones carry their reason.
    Decoded(Vec<Record>),
    OutOfRange {
        earliest: Offset,
        end: Offset,
    },
    Failed(String),
}

impl LogRead {
    /// No records and nothing wrong: the read was at the end of the partition.
    pub(crate) fn at_end(&self) -> bool {
        matches!(self, LogRead::Records(r) if r.is_empty())
    }
}

/// An error a storage port answers: the caller's fault (`Invalid`, `TooLarge`: a 4xx), or
/// the storage's (`Unavailable`, `Fenced`: a 503, worth a retry). Each message is whole
/// (it names what failed and why, its source's text included), so it is shown as is.
#[derive(Clone, Debug, thiserror::Error)]
pub enum StorageError {
    /// The caller asked for something the storage does not have or refuses (an unknown
    /// topic or partition, the topic limit, an item that is not a stored event).
    #[error("{0}")]
    Invalid(String),
    /// A record or batch over the storage's size limits.
    #[error("{0}")]
    TooLarge(String),
    /// The storage failed or cannot be reached. `what` is the whole message (what failed
    /// and why); `source` is the error of a layer below that said why, when one did.
    #[error("{what}")]
    Unavailable {
        what: String,
        #[source]
        source: Option<Arc<dyn std::error::Error + Send + Sync>>,
    },
    /// A write refused because this instance no longer owns what it writes (a partition
    /// revoked or lost to another instance): writing it would overwrite the new owner's.
    #[error("fenced: {0}")]
    Fenced(String),
}

impl StorageError {
    /// Unavailable, with the whole story in `what`.
    pub fn unavailable(what: impl Into<String>) -> Self {
        StorageError::Unavailable {
            what: what.into(),
            source: None,
        }
    }

    /// Unavailable: `what` failed because of `source` (shown as `what: source`).
    pub fn failed(what: &str, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        StorageError::Unavailable {
            what: format!("{what}: {source}"),
            source: Some(Arc::new(source)),
        }
    }

    /// Unavailable because of `source`, whose text says it all.
    pub fn from_source(source: impl std::error::Error + Send + Sync + 'static) -> Self {
        StorageError::Unavailable {
            what: source.to_string(),
            source: Some(Arc::new(source)),
        }
    }

    /// True when the caller asked for something refused (a 4xx); false for a fault of the
    /// storage (a 503: the caller may retry).
    pub fn is_caller_error(&self) -> bool {
        matches!(self, StorageError::Invalid(_) | StorageError::TooLarge(_))
    }
}

/// What a log reports about itself for `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogMetrics {
    /// Records durably appended since the log was opened.
    pub records_appended: u64,
    /// Synced writes that carried them (records per write shows how well appends group).
    pub synced_writes: u64,
    /// Appends refused because a write failed.
    pub write_failures: u64,
    /// Bytes of table files on disk, if the log can tell.
    pub disk_bytes: Option<u64>,
    /// What a broker with consumer groups counts (the Kafka backend).
    pub broker: Option<BrokerMetrics>,
}

/// Counters of a broker with consumer groups, for `/metrics`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BrokerMetrics {
    /// Rebalance callbacks (assignments and revocations) run.
    pub rebalances: u64,
    /// Writes the broker refused or did not acknowledge (each publish answered 503).
    pub producer_errors: u64,
    /// Fetches answered "offset out of range" (the core repositions and reports it).
    pub out_of_range: u64,
    /// Offset commits that failed (the next commit carries the watermark).
    pub commit_failures: u64,
    /// ACK ranges and attempt counts left out of progress records to keep them bounded.
    pub progress_ranges_dropped: u64,
    /// Lanes whose log diverged from what they knew (a lost tail, found by leader epochs
    /// or a log shorter than the checkpoint): the core forgot from there and reported it.
    pub log_divergences: u64,
    /// Partition ends the broker claimed below records it still held (a claim the log
    /// refuted; nothing was dropped for it).
    pub end_anomalies: u64,
    /// Offsets a broker answered as absent right after a reposition that a read from
    /// further back showed to exist (tansu answers a fetch from inside a batch with the
    /// next batch).
    pub gaps_refuted: u64,
    /// Reads of the progress topic at an assignment that failed and were tried again.
    pub progress_read_retries: u64,
    /// Whether the broker answered the last probe (a gauge).
    pub broker_up: bool,
    /// Clients built anew because the one in use was in a fatal state.
    pub client_rebuilds: u64,
    /// Group requests sent to a coordinator whose rebalance seemed stuck (a broker that
    /// keeps a dead member as the group's leader; DESIGN §8).
    pub group_nudges: u64,
}

/// What the engine learns of a topic before a group reads it ([`LogPort::prepare_topic`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopicFacts {
    pub partitions: u32,
    /// (earliest, end) of each partition, in partition order, when they were asked for;
    /// else empty.
    pub offsets: Vec<(Offset, Offset)>,
}

impl TopicFacts {
    /// The facts of a topic whose offsets can be read at once (a log in memory, or one
    /// whose reads do not block): `offsets` is asked for each partition when `with_offsets`.
    pub fn read(
        partitions: u32,
        with_offsets: bool,
        offsets: impl Fn(Partition) -> Result<(Offset, Offset), StorageError>,
    ) -> Result<TopicFacts, StorageError> {
        let offsets = if with_offsets {
            (0..partitions)
                .map(&offsets)
                .collect::<Result<Vec<_>, _>>()?
        } else {
            Vec::new()
        };
        Ok(TopicFacts {
            partitions,
            offsets,
        })
    }
}

/// What a broker that assigns partitions itself (Kafka's group coordinator) tells the
/// engine about a group it joined through [`GroupLog::join`].
#[derive(Debug)]
pub enum GroupEvent {
    /// The group now owns these partitions here, each with the progress read for it.
    Assigned {
        group: GroupName,
        partitions: Vec<Assignment>,
    },
    /// The group is losing these partitions. The engine makes the group's progress durable
    /// (which commits it), stops every effect for them, then answers `done`; the broker
    /// hands them on only after that answer. When `lost` (the broker already gave them to
    /// another instance: a session timeout), nothing is written for them any more — a
    /// late write of this zombie would overwrite the new owner's progress.
    Revoking {
        group: GroupName,
        partitions: Vec<Partition>,
        lost: bool,
        done: std::sync::mpsc::SyncSender<()>,
    },
}

/// The broker as the engine uses it.
pub trait LogPort: Send + Sync + 'static {
    /// Up to `max` records (about `max_bytes`) from `from`, read for `group` (a broker with
    /// consumer groups reads through the group's consumer). When `from` is the end, waits up
    /// to `wait_ms` for new records before answering empty, so the engine can ask again at
    /// once without spinning.
    #[allow(clippy::too_many_arguments)]
    fn fetch(
        &self,
        group: GroupName,
        topic: TopicName,
        partition: Partition,
        from: Offset,
        max: usize,
        max_bytes: usize,
        wait_ms: u64,
    ) -> BoxFut<LogRead>;

    /// Durably appends; answers (partition, offset) per item, in order.
    fn append(
        &self,
        topic: TopicName,
        items: Vec<AppendItem>,
    ) -> BoxFut<Result<Vec<(Partition, Offset)>, StorageError>>;

    /// The partition count of a topic, creating it with the default count if needed, and
    /// with `with_offsets` the (earliest, end) of each partition. `Invalid` when the caller
    /// asked for too much (the topic limit), `Unavailable` when storage failed. Answered off
    /// the engine task: a creation is a synced write, a broker answers over the network, and
    /// the engine serves everyone else meanwhile.
    fn prepare_topic(
        &self,
        topic: TopicName,
        with_offsets: bool,
    ) -> BoxFut<Result<TopicFacts, StorageError>>;

    /// The partition count of an existing topic; `None` for a topic the log does not have
    /// (or cannot find). Answered off the engine task: a broker may have to be asked.
    fn partitions(&self, topic: TopicName) -> BoxFut<Option<u32>>;

    /// (earliest, end) of a partition: `Invalid` for a topic or partition the log does not
    /// have, `Unavailable` when it could not be read. Answered off the engine task (a broker
    /// round trip when the ends are not cached): the engine hands the answer back to itself
    /// as an event.
    fn offsets(
        &self,
        topic: TopicName,
        partition: Partition,
    ) -> BoxFut<Result<(Offset, Offset), StorageError>>;

    /// The first offset of a partition whose record was appended at or after `time_ms` (ms
    /// since the Unix epoch; on Kafka the record's timestamp, as offsets-for-times reads
    /// it): the earliest offset for a time before every record, the end for one after them
    /// all. `Invalid` for a topic or partition the log does not have, `Unavailable` when
    /// storage failed. Answered off the engine task (a few reads, or a broker round trip).
    /// A log that keeps no append times (the simulation's) refuses it.
    fn offset_for_time(
        &self,
        topic: TopicName,
        _partition: Partition,
        _time_ms: u64,
    ) -> BoxFut<Result<Offset, StorageError>> {
        Box::pin(async move {
            Err(StorageError::Invalid(format!(
                "the log of topic {topic} keeps no append times: seek by offset"
            )))
        })
    }

    /// Applies retention as of the log's own clock (the one that stamped its records);
    /// answers how many partitions moved their earliest offset.
    fn enforce_retention(&self) -> BoxFut<Result<usize, StorageError>>;

    /// A fault that keeps the log from taking appends until the process restarts, if any.
    /// The health check reports it.
    fn fault(&self) -> Option<String> {
        None
    }

    /// Counters for `/metrics`, when the log keeps them. Cheap: called at every scrape.
    fn metrics(&self) -> Option<LogMetrics> {
        None
    }

    /// What a broker that assigns partitions to groups adds ([`GroupLog`]: Kafka's group
    /// coordinator); `None` when this instance owns every partition (the engine assigns
    /// them all at subscribe).
    fn group(&self) -> Option<&dyn GroupLog> {
        None
    }

    /// For the publish dedup windows, refilled at start (DESIGN §8): each topic this log
    /// holds for which `window_of` answers (appended since ms, most records per partition),
    /// with those of its records, newest first per partition. `None`: this log cannot tell
    /// when its records were appended, and the windows start empty. Blocking: called once,
    /// off the async workers.
    fn recent_appends(
        &self,
        _window_of: &dyn Fn(&TopicName) -> Option<(u64, usize)>,
    ) -> RecentAppends {
        None
    }

    /// Stops every consumer (revoking what they hold, so the progress is committed); called
    /// once at shutdown, after the engine flushed.
    fn close(&self) -> BoxFut<()> {
        Box::pin(async {})
    }
}

/// The part of a log whose broker assigns partitions to groups (Kafka's consumer groups):
/// the engine joins a group there and learns its partitions as [`GroupEvent`]s.
pub trait GroupLog: Send + Sync {
    /// Where [`GroupEvent`]s go; called once, before any `join`.
    fn attach(&self, events: mpsc::Sender<GroupEvent>);

    /// Joins `group` (reading `topic`) at the broker; its partitions arrive as
    /// [`GroupEvent::Assigned`].
    fn join(&self, group: &GroupName, topic: &TopicName) -> Result<(), StorageError>;

    /// Leaves `group` at the broker (the group was deleted).
    fn leave(&self, group: &GroupName);

    /// Commits `group`'s durable watermark of a partition to the broker.
    fn commit(&self, group: &GroupName, topic: &TopicName, partition: Partition, offset: Offset);

    /// This instance's name among those sharing the broker (shown as the owner of the
    /// partitions it holds), if it has one.
    fn instance(&self) -> Option<String> {
        None
    }
}

/// The state store as the engine uses it.
pub trait StatePort: Send + Sync + 'static {
    /// What the store holds, read once at start.
    fn load(&self) -> BoxFut<Result<Loaded, StorageError>>;
    /// Applies a batch atomically and durably. Batches are handed over in ticket order and
    /// one at a time, so the store sees them in order.
    fn apply(&self, batch: Arc<PersistBatch>, now_wall_ms: u64)
        -> BoxFut<Result<(), StorageError>>;
    fn dlq_list(&self, group: GroupName, max: usize)
        -> BoxFut<Result<Vec<DlqEntry>, StorageError>>;
    /// The dead letters to hand the core for a replay. A store that can hold two records
    /// at one key (the Kafka backend, after a lost tail) hands at most one record of a key
    /// at a time and remembers which, because a resolution names only the key.
    fn dlq_list_for_replay(
        &self,
        group: GroupName,
        max: usize,
    ) -> BoxFut<Result<Vec<DlqEntry>, StorageError>> {
        self.dlq_list(group, max)
    }
    /// The core did not take the replay of these entries (of [`Self::dlq_list_for_replay`]).
    fn dlq_replay_refused(&self, _group: &GroupName, _keys: &[DlqKey]) {}
    fn put_rate_rule(
        &self,
        topic: TopicName,
        rule: Option<RateRule>,
    ) -> BoxFut<Result<(), StorageError>>;
}

/// Where a backend that shares group definitions between instances (Kafka's subscriptions
/// topic) applies what another instance wrote: the engine (`engine::shared`).
pub trait SubscriptionSink: Send + Sync + 'static {
    /// False once the engine stopped (the watcher then ends).
    fn is_running(&self) -> bool;
    /// Applies one record of the shared definitions — a group's stored definition, or its
    /// deletion (`None`) — unless the local definition already equals it.
    fn apply_shared(&self, group: GroupName, value: Option<Vec<u8>>) -> BoxFut<()>;
}
