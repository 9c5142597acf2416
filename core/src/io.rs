//! What goes into the core (inputs: facts and requests) and what comes out (effects:
//! commands for the shell, and direct answers to requests).

use bytes::Bytes;

use crate::checkpoint::Checkpoint;
use crate::config::{SpecError, SubscriptionSpec};
use crate::delivery_id::DeliveryId;
use crate::record::Record;
use crate::types::{ClientId, Epoch, GroupName, Millis, Offset, Partition, TopicName};

/// Identifies one `Fetch`; an answer carrying another id is ignored (it was overtaken by a
/// seek, a revocation or a retry).
pub type FetchId = u64;

/// Identifies one `Persist`; the shell answers `Persisted` or `PersistFailed` with it.
pub type Ticket = u64;

/// The partition number of a group's replay lane in delivery ids (never a real partition).
pub const REPLAY_PARTITION: Partition = u32::MAX;

/// Everything that can happen to the mesh. Variants in alphabetical order.
// `Subscribe` is large, but an input is moved into `handle` once and never stored in bulk,
// so boxing it would cost an allocation for nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Input {
    /// A client acknowledges deliveries: the records are done for the group.
    Ack {
        group: GroupName,
        ids: Vec<DeliveryId>,
    },
    /// A client disconnected or was evicted: what it holds is redelivered at once.
    ClientGone { group: GroupName, client: ClientId },
    /// A client wants up to `max` more deliveries now (0 withdraws its wish). Registers the
    /// client on first use. The number is absolute, not added to an earlier wish.
    ClientPoll {
        group: GroupName,
        client: ClientId,
        max: u32,
    },
    /// A client needs more time: the ACK deadline moves to now + `extend_ms` (or the
    /// group's ACK timeout).
    Extend {
        group: GroupName,
        ids: Vec<DeliveryId>,
        extend_ms: Option<Millis>,
    },
    /// The answer to a `Fetch`.
    Fetched {
        group: GroupName,
        partition: Partition,
        fetch_id: FetchId,
        result: FetchResult,
    },
    /// Persist whatever is pending now, without waiting for the flush interval.
    FlushNow,
    /// A client gives deliveries back: redelivered after `delay_ms` (or the backoff).
    Nack {
        group: GroupName,
        ids: Vec<DeliveryId>,
        delay_ms: Option<Millis>,
    },
    /// The group now owns these partitions of its topic.
    PartitionsAssigned {
        group: GroupName,
        partitions: Vec<Assignment>,
    },
    /// The group is about to give these partitions up (a rebalance asked for them): they
    /// hand out and fetch nothing more, while ACKs, NACKs and extends of the deliveries out
    /// of them still count. The shell flushes until [`crate::Mesh::revoke_pending`] says
    /// nothing of them waits to be durable, then sends `PartitionsRevoked`: an ACK answered
    /// while the revocation waited for a flush is durable before the partition leaves
    /// (issue 23).
    PartitionsRevoking {
        group: GroupName,
        partitions: Vec<Partition>,
    },
    /// The group no longer owns these partitions: every effect for them stops, and ACKs of
    /// their deliveries answer `revoked` (the seed kept committing: upstream #5360).
    PartitionsRevoked {
        group: GroupName,
        partitions: Vec<Partition>,
    },
    /// A `Persist` could not be made durable; nothing in it counts, it will be retried.
    PersistFailed { ticket: Ticket },
    /// A `Persist` is durable: what it carried now counts.
    Persisted { ticket: Ticket },
    /// Dead-lettered records of one group, delivered again to that group only, with fresh
    /// attempt counts. Each is (original partition, record).
    Replay {
        group: GroupName,
        records: Vec<(Partition, Record)>,
    },
    /// Operator rewind (or skip): the lane restarts at `offset` with nothing done above it.
    Seek {
        group: GroupName,
        partition: Partition,
        offset: Offset,
    },
    /// Create or update a durable subscription group.
    Subscribe(SubscriptionSpec),
    /// Time passed; due timers fire.
    Tick,
    /// Remove a group with everything it holds.
    Unsubscribe { group: GroupName },
}

/// One assigned partition and where its progress comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    pub partition: Partition,
    /// The broker's earliest available offset (where `earliest` groups start).
    pub earliest: Offset,
    /// The broker's end offset (where `latest` groups start when not told otherwise).
    pub end: Offset,
    /// Progress read by the shell (e.g. from Kafka's progress topic). When `None`, the
    /// checkpoint from `Recovered` is used, else the group's start position.
    pub checkpoint: Option<Checkpoint>,
}

#[derive(Clone, Debug)]
pub enum FetchResult {
    /// Records of the partition, ascending; may hold duplicates or start below the asked
    /// offset (a broker rewind). An empty answer means "nothing new yet": the shell should
    /// give it only after waiting at the broker a while, since the core asks again at once.
    Records(Vec<Record>),
    /// The asked offset is not in the log: `earliest..end` is.
    OutOfRange { earliest: Offset, end: Offset },
    /// The broker could not answer; retried after `fetch_retry_ms`.
    Failed { reason: String },
}

/// Commands for the shell, in the order they must be carried out. Variants alphabetical.
#[must_use]
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Effect {
    /// ACK a record to a POP broker: it is durably done for the group.
    BrokerAck {
        group: GroupName,
        topic: TopicName,
        partition: Partition,
        handle: Bytes,
    },
    /// Commit the group's durable watermark to a broker that keeps group offsets.
    Commit {
        group: GroupName,
        topic: TopicName,
        partition: Partition,
        offset: Offset,
    },
    /// Hand a delivery to a client that asked for one.
    Deliver {
        group: GroupName,
        client: ClientId,
        delivery: Delivery,
    },
    /// Read up to `max` records of one partition from `from`, for one group.
    Fetch {
        group: GroupName,
        topic: TopicName,
        partition: Partition,
        fetch_id: FetchId,
        from: Offset,
        max: usize,
    },
    /// Write this batch atomically and durably, in ticket order, then answer `Persisted`.
    Persist {
        ticket: Ticket,
        batch: Box<PersistBatch>,
    },
    /// Records the group will never see: the broker no longer had them (retention) or
    /// truncated its log. Never silent: the shell counts and logs it.
    Skipped {
        group: GroupName,
        topic: TopicName,
        partition: Partition,
        from: Offset,
        to: Offset,
        not_done: u64,
        reason: SkipReason,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// `[from, to)` was deleted by retention before the group fetched it.
    Retention,
    /// The broker's log ends at `from` although the group had fetched up to `to`: the
    /// broker lost its tail (e.g. an unclean leader election). The lane restarts at `from`.
    BrokerTruncated,
}

/// One attempt to hand a record to a client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery {
    pub id: DeliveryId,
    pub attempt: u32,
    pub topic: TopicName,
    /// The record's partition (for a replayed record: its original partition).
    pub partition: Partition,
    pub record: Record,
}

/// Everything a `Persist` writes, applied atomically in this order: removed groups,
/// subscriptions, checkpoints, dead letters, DLQ resolutions, epoch.
#[derive(Clone, Debug, Default)]
pub struct PersistBatch {
    pub epoch: Option<Epoch>,
    /// Groups to delete with all their state (checkpoints, DLQ entries, definition).
    pub removed_groups: Vec<GroupName>,
    /// Subscription definitions to create or replace.
    pub subscriptions: Vec<SubscriptionSpec>,
    /// Full lane states, each replacing the previous one for its (group, partition).
    pub checkpoints: Vec<LaneCheckpoint>,
    /// DLQ ledger entries, keyed by (group, partition, offset): one entry per (group,
    /// record); writing the key again (a replay that failed again) replaces it.
    pub dead_letters: Vec<DeadLetter>,
    /// DLQ entries whose replay was ACKed: delete them.
    pub dlq_resolved: Vec<DlqKey>,
}

impl PersistBatch {
    pub fn is_empty(&self) -> bool {
        self.epoch.is_none()
            && self.removed_groups.is_empty()
            && self.subscriptions.is_empty()
            && self.checkpoints.is_empty()
            && self.dead_letters.is_empty()
            && self.dlq_resolved.is_empty()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaneCheckpoint {
    pub group: GroupName,
    pub topic: TopicName,
    pub partition: Partition,
    pub checkpoint: Checkpoint,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DlqKey {
    pub group: GroupName,
    pub partition: Partition,
    pub offset: Offset,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeadLetter {
    pub key: DlqKey,
    pub topic: TopicName,
    pub record: Record,
    pub attempts: u32,
    pub reason: DeadLetterReason,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeadLetterReason {
    /// The last allowed attempt was not ACKed in time.
    AckTimeout,
    /// The last allowed attempt was NACKed.
    Nacked,
    /// The last allowed attempt's client went away.
    ClientGone,
    /// The stored bytes could not be decoded.
    Undecodable(String),
}

impl DeadLetterReason {
    /// How the text of an `Undecodable` reason begins (its cause follows).
    pub const UNDECODABLE_PREFIX: &'static str = "undecodable: ";
}

impl std::fmt::Display for DeadLetterReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeadLetterReason::AckTimeout => f.write_str("ack-timeout"),
            DeadLetterReason::Nacked => f.write_str("nacked"),
            DeadLetterReason::ClientGone => f.write_str("client-gone"),
            DeadLetterReason::Undecodable(why) => {
                write!(f, "{}{why}", DeadLetterReason::UNDECODABLE_PREFIX)
            }
        }
    }
}

/// What survived the last incarnation, as the shell read it from its stores.
#[derive(Clone, Debug, Default)]
pub struct Recovered {
    /// The last durable epoch (0 on a fresh store). This incarnation uses `epoch + 1`.
    pub epoch: Epoch,
    pub subscriptions: Vec<SubscriptionSpec>,
    pub checkpoints: Vec<(GroupName, Partition, Checkpoint)>,
}

/// The direct answer to an input.
#[must_use]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response {
    Ok,
    /// One outcome per delivery id of an `Ack`, `Nack` or `Extend`, in order.
    Settled(Vec<Settle>),
    Refused(Refusal),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Settle {
    Accepted,
    Rejected(RejectReason),
}

/// Why an ACK, NACK or extend changed nothing (C4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RejectReason {
    /// The record is already done for the group, or this delivery already ended.
    AlreadyDone,
    /// The partition was revoked or re-seeked since this delivery.
    Revoked,
    /// The id is from a former incarnation of the mesh.
    Stale,
    /// No such delivery was ever issued.
    Unknown,
}

impl RejectReason {
    pub fn as_str(self) -> &'static str {
        match self {
            RejectReason::AlreadyDone => "already-done",
            RejectReason::Revoked => "revoked",
            RejectReason::Stale => "stale",
            RejectReason::Unknown => "unknown",
        }
    }
}

/// Why a request was refused as a whole. Nothing changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    InvalidPartition(Partition),
    InvalidSpec(SpecError),
    NotAssigned(Partition),
    OrderingCannotChange,
    ReplayFull { max: usize },
    TooManyClients { max: usize },
    TooManyGroups { max: usize },
    TooManyPartitions { max: usize },
    TopicCannotChange { topic: TopicName },
    UnknownGroup,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::InvalidPartition(p) => write!(f, "partition {p} is not a valid partition"),
            Refusal::InvalidSpec(e) => write!(f, "{e}"),
            Refusal::NotAssigned(p) => write!(f, "partition {p} is not assigned to this group"),
            Refusal::OrderingCannotChange => {
                write!(
                    f,
                    "ordering of an existing group cannot change; delete it first"
                )
            }
            Refusal::ReplayFull { max } => {
                write!(f, "at most {max} records may be in replay at once")
            }
            Refusal::TooManyClients { max } => write!(f, "at most {max} clients per group"),
            Refusal::TooManyGroups { max } => write!(f, "at most {max} groups"),
            Refusal::TooManyPartitions { max } => write!(f, "at most {max} partitions per group"),
            Refusal::TopicCannotChange { topic } => write!(
                f,
                "the group already subscribes to topic {topic}; delete it first to change topic"
            ),
            Refusal::UnknownGroup => write!(f, "no such subscription group"),
        }
    }
}
