//! The progress topic: each (group, topic, partition)'s ACK ranges and attempt counts above
//! its committed offset, where any instance can read them.
//!
//! A compacted topic keyed by `<group>\n<topic>\n<partition>`, each value a whole
//! [`Checkpoint`] in its own versioned, checksummed encoding, so the newest record of a key
//! is the lane's state. Commit metadata would be the obvious place, but some
//! Kafka-protocol brokers store it and never return it; a topic works on all of them.
//!
//! Order of writes (the core's): a lane's checkpoint is written here, acknowledged by every
//! in-sync replica, and only then does the core commit its watermark to the group. So the
//! newest progress record's watermark is never below the committed offset, and an instance
//! that takes the partition over resumes exactly: no record below the watermark or inside
//! a persisted range is delivered again.
//!
//! Rewound: an operator's seek back takes a lane's watermark below the committed offset,
//! and its record is durable before its commit, which the coordinator may refuse (the
//! owner's session just expired). So every record whose watermark is below the highest
//! position the lane's owners reached carries that position in its [`REWOUND_HEADER`],
//! and a reader keeps it while the committed offset is not above that mark
//! (`rules/fence.rs`, "Rewound").
//!
//! Bounded: a checkpoint with more than `kafka.max_progress_ranges` ranges (or attempt
//! counts) keeps its watermark exact and drops the excess above it: more duplicates after
//! a takeover, never loss; counted as `progress_ranges_dropped`.
//!
//! Fenced (docs/DESIGN.md §8, "the shell validates a lane against leader epochs"; the
//! simulation's store does the same at write time): every progress record carries the
//! *ownership generation* of its writer — the group coordinator's generation in which the
//! writer was given the lane, as librdkafka reports it in the assignment callback. Kafka
//! hands a partition to a new owner only in a later generation than the one its previous
//! owner got it in, so the contract is: **a record of a lower generation never replaces
//! one of a higher generation**, however late it is written. A zombie (an instance whose
//! session expired without it noticing) keeps writing with its old generation; the new
//! owner's records outrank them. Kafka itself fences the commits of a stale generation.
//!
//! The generation is part of the record's *key* (`<group>\n<topic>\n<partition>\n<gen>`),
//! not only of its value, because the topic is compacted: with one key per lane, the
//! zombie's late record would be the newest of the key and compaction would delete the
//! new owner's. So a lane has one key per ownership, and a reader given the lane in
//! generation `g` takes the record of the highest generation not above `g` (one above `g`
//! is from an earlier life of the group: a broker restarts generations when it deletes an
//! empty group; only when every record is above `g` is the highest taken), among the
//! records not below the group's committed offset (overtaken ones, whatever their
//! generation) — see [`choose`] (`rules/fence.rs`), which states the contract. After its first durable
//! write, the new owner deletes (tombstones) the keys of the lane it saw below its own
//! generation, and those above it that the committed offset already passed (a key above
//! may be a later owner's, the reader a zombie: `fence.rs`, "Deletion"), so keys stay
//! bounded. A record without a generation (the three-part key: a client that reports
//! none) ranks below every stamped one.
//!
//! Placed: every progress record (and every deletion) is written to partition
//! [`HOME_PARTITION`] of the progress topic, never where the producer's partitioner would
//! put its key. "The newest record of a key" is defined only within one partition (Kafka
//! orders a partition, not a topic; compaction keeps the newest of a key per partition),
//! and a key placed by hashing moves whenever the hash or the count changes: a broker may
//! create the topic with more partitions than asked (librdkafka's mock cluster
//! auto-creates it with four before unimesh's create request arrives), an operator may add
//! partitions, `kafka.properties.partitioner` is the user's to set, and another client's
//! partitioner is not ours (librdkafka's default hashes with CRC32, ours with murmur2).
//! With a key in two partitions the reader's choice between them followed the order in
//! which it happened to read the partitions, and an older record could win. So the
//! contract: **all of a lane's records are in the home partition, in the order written**.
//! The reader reads every partition; a lane with no record in the home partition (written
//! by a version that let the partitioner place them) resumes from its records elsewhere
//! (their relative order across partitions is not defined; generations still rank them),
//! and once the lane's next owner wrote its record home, those are ignored.
//!
//! Stamped: a progress record also carries, in its `unimesh-leader-epoch` header, the
//! leader epoch of the lane's position (the highest epoch of the records it read); the
//! lane's next owner checks what the record knows against the log with it before reading
//! on (`epochs.rs`). A record without the header is checked against the log's end only.
//!
//! Locally, a batch holding a checkpoint of a lane this instance does not own (revoked, or
//! lost to a session timeout) fails as a whole and writes nothing, as a fenced batch does
//! in the simulation; the core has dropped the lane and ignores the failure.
//! The owner is looked up when the persist writer reaches the batch, not when the core
//! issued it; a batch issued before a lost assignment never gets that far (the engine
//! fences it: `engine/persist.rs`), so it cannot go out under a later ownership's
//! generation. And a new owner claims each lane it resumes from a checkpoint ([`claim`]:
//! that checkpoint under its own generation, before the engine takes the lane), so no
//! record of an earlier owner that lands later ranks above what the new owner took.

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::client_log::{ClientLog, LoggedConsumer};
// librdkafka's consumer has `assign` and the metadata and offset requests as methods of
// its `Consumer` trait; the simulated consumer has them as its own.
#[cfg(not(madsim))]
use madsim_rdkafka::consumer::Consumer as _;
use madsim_rdkafka::producer::FutureRecord;
use madsim_rdkafka::{Message, Offset as KOffset, TopicPartitionList};
use madsim_tokio as tokio;
use unimesh_core::{
    Checkpoint, DlqKey, GroupName, LaneCheckpoint, Offset, Partition, PersistBatch, Progress,
    RateRule, SubscriptionSpec, TopicName,
};

use super::log::{lock, KafkaLog};
use super::properties::ClientRole;
use super::records::{stored_value, Outgoing};
use crate::storage::kafka::rules::epochs::{parse_epoch, LEADER_EPOCH_HEADER};
use crate::storage::kafka::rules::fence::{choose, mark, Record};
pub(super) use crate::storage::kafka::rules::fence::{Chosen, OwnerGen};
use crate::storage::kafka::rules::revoke::{Handover, Revocation};
use crate::storage::kafka::KafkaSettings;
use crate::storage::ports::{BoxFut, StatePort, StorageError};
use crate::storage::state::codec::encode_subscription;
use crate::storage::state::StoreAdapter;
use crate::storage::state::{DlqEntry, Loaded};

#[cfg(not(madsim))]
mod real;
#[cfg(madsim)]
mod sim;

#[cfg(not(madsim))]
use real::Position;
#[cfg(madsim)]
use sim::Position;

/// The partition of the progress topic every progress record is written to (see the
/// module documentation: a key must never be in two partitions).
pub(super) const HOME_PARTITION: i32 = 0;

/// The key prefix of a reader's sync marker: a record an instance writes to the home
/// partition before it reads the topic for an assignment, and reads up to. A broker's end
/// offset is a claim (tansu 0.6.0 claims the start of the partition's last batch plus one,
/// below records it holds): the marker's own offset, from its delivery report, is where
/// every record acknowledged before it is known to lie below. Readers skip these keys
/// (one per instance, so compaction keeps one each).
pub(super) const SYNC_KEY_PREFIX: &str = "\u{1}sync\n";

/// The header of a progress record whose watermark an operator's seek took below the
/// highest position its lane's owners had reached: that position, in decimal
/// (`rules/fence.rs`, "Rewound"; docs/DESIGN.md §8).
pub(super) const REWOUND_HEADER: &str = "unimesh-rewound";

/// The part of a progress key that names the lane.
fn lane_key(group: &str, topic: &str, partition: Partition) -> String {
    format!("{group}\n{topic}\n{partition}")
}

/// The key of a lane's progress record written under ownership generation `gen`.
pub(super) fn progress_key(
    group: &str,
    topic: &str,
    partition: Partition,
    gen: OwnerGen,
) -> String {
    let lane = lane_key(group, topic, partition);
    match gen {
        Some(g) => format!("{lane}\n{g}"),
        None => lane,
    }
}

/// A progress key split into its lane part and its generation; `None` for a key that is
/// neither form (names cannot hold a newline, so the split is unambiguous).
fn parse_progress_key(key: &str) -> Option<(&str, OwnerGen)> {
    match key.matches('\n').count() {
        2 => Some((key, None)),
        3 => {
            let (lane, gen) = key.rsplit_once('\n')?;
            Some((lane, Some(gen.parse().ok()?)))
        }
        _ => None,
    }
}

/// A progress record as read: the checkpoint and the leader epoch it was stamped with
/// (`None`: written by a client that reports none, or before stamps existed).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Stored {
    pub checkpoint: Checkpoint,
    pub leader_epoch: Option<i32>,
    /// Its [`REWOUND_HEADER`].
    pub rewound_from: Option<Offset>,
}

impl Borrow<Checkpoint> for Stored {
    fn borrow(&self) -> &Checkpoint {
        &self.checkpoint
    }
}

impl Record for Stored {
    fn rewound_from(&self) -> Option<Offset> {
        self.rewound_from
    }
}

/// This instance's ownership of a lane: the generation its writes carry, the leader
/// epoch of its position, the keys of older records still to delete, and the highest
/// position the lane reached (its records below it are marked rewound).
#[derive(Clone, Debug, Default)]
struct Ownership {
    gen: OwnerGen,
    leader_epoch: Option<i32>,
    stale: Vec<String>,
    reached: Offset,
}

/// What a progress record of a lane is written with.
#[derive(Clone, Debug, Default)]
pub(super) struct Stamp {
    /// The ownership generation (part of the key).
    pub gen: OwnerGen,
    /// The leader epoch of the lane's position (a header; `epochs.rs`). Always `None`
    /// under madsim, whose broker has neither.
    pub leader_epoch: Option<i32>,
    /// Keys of the lane's older records, to delete after this write.
    pub stale: Vec<String>,
    /// The rewound mark ([`REWOUND_HEADER`]).
    pub rewound_from: Option<Offset>,
}

/// The stamp of each lane checkpoint of a batch.
pub(super) type Stamps = Vec<Stamp>;

/// The key and value of the progress record written for `lane` under ownership
/// generation `gen` (with at most `max_ranges` ranges), and how many ranges and attempt
/// counts the bound dropped.
pub(super) fn progress_record(
    lane: &LaneCheckpoint,
    gen: OwnerGen,
    max_ranges: usize,
) -> (String, Vec<u8>, u64) {
    let (cp, dropped) = bounded(&lane.checkpoint, max_ranges);
    let key = progress_key(
        lane.group.as_str(),
        lane.topic.as_str(),
        lane.partition,
        gen,
    );
    (key, cp.encode(), dropped)
}

/// The headers of a progress record: its leader epoch and its rewound mark, as text.
fn stamp_headers(
    leader_epoch: Option<i32>,
    rewound_from: Option<Offset>,
) -> Vec<(&'static str, String)> {
    let epoch = leader_epoch.map(|e| (LEADER_EPOCH_HEADER, e.to_string()));
    let rewound = rewound_from.map(|b| (REWOUND_HEADER, b.to_string()));
    epoch.into_iter().chain(rewound).collect()
}

/// Sends a progress record (`key`, `value`, `headers` from [`stamp_headers`]) to the
/// progress topic's home partition.
fn send_progress(
    log: &KafkaLog,
    key: &str,
    value: &[u8],
    headers: &[(&'static str, String)],
) -> Result<super::log::Delivery, StorageError> {
    let inner = &log.inner;
    let topic = inner.settings.progress_topic.as_str();
    let list: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
    let out = Outgoing::new(&list, value);
    let record = if list.is_empty() {
        FutureRecord::to(topic).payload(value)
    } else {
        out.record(topic)
    };
    inner
        .producer
        .send_result(record.partition(HOME_PARTITION).key(key))
        .map_err(|(e, _)| StorageError::failed("cannot write the progress topic", e))
}

/// Writes each lane's claim ([`crate::storage::kafka::rules::assign::claim`]: the checkpoint it resumes
/// from, under its new owner's generation `gen`, stamped with the checkpoint's leader
/// epoch) to the progress topic's home partition and waits until the broker acknowledged
/// every one. From then on no record of an earlier owner of these lanes, however late it
/// lands, ranks above what this owner took (docs/DESIGN.md §8, "a new owner claims its
/// lanes").
pub(super) async fn claim(
    log: &KafkaLog,
    claims: &[(LaneCheckpoint, Option<i32>)],
    gen: OwnerGen,
) -> Result<(), StorageError> {
    let inner = &log.inner;
    let s = &inner.settings;
    let mut pending = Vec::with_capacity(claims.len());
    for (lane, leader_epoch) in claims {
        let (key, value, _) = progress_record(lane, gen, s.max_progress_ranges);
        let rewound = inner.progress.rewound(lane);
        let headers = stamp_headers(*leader_epoch, rewound);
        pending.push(send_progress(log, &key, &value, &headers)?);
    }
    for f in pending {
        match f.await {
            Ok(Ok(_)) => {}
            Ok(Err((e, _))) => {
                return Err(StorageError::failed(
                    "the progress topic refused a claim",
                    e,
                ))
            }
            Err(_) => return Err(StorageError::unavailable("the producer dropped a claim")),
        }
    }
    Ok(())
}

/// `cp` with at most `max` ranges and `max` attempt counts, and how many were dropped.
pub(super) fn bounded(cp: &Checkpoint, max: usize) -> (Checkpoint, u64) {
    let ranges = cp.progress.range_count();
    if ranges <= max && cp.attempts.len() <= max {
        return (cp.clone(), 0);
    }
    let kept: Vec<(u64, u64)> = cp.progress.ranges().take(max).collect();
    // The ranges kept are a prefix of valid ranges, so they are valid too.
    let progress = Progress::from_parts(cp.progress.watermark(), kept)
        .unwrap_or_else(|_| Progress::new(cp.progress.watermark()));
    let attempts: Vec<(u64, u32)> = cp.attempts.iter().copied().take(max).collect();
    let dropped = (ranges.saturating_sub(max) + cp.attempts.len().saturating_sub(max)) as u64;
    (Checkpoint { progress, attempts }, dropped)
}

/// Reads the progress topic into memory, up to its end offsets on demand.
pub(super) struct ProgressReader {
    consumer: LoggedConsumer,
    topic: String,
    timeout: Duration,
    state: tokio::sync::Mutex<ReaderState>,
    /// The lanes this instance owns, per (group, partition).
    owners: Mutex<BTreeMap<(GroupName, Partition), Ownership>>,
}

#[derive(Default)]
struct ReaderState {
    assigned: Option<i32>,
    /// Per lane key, its records by ownership generation: those of the home partition.
    view: BTreeMap<String, BTreeMap<OwnerGen, Stored>>,
    /// The same, of the other partitions (records placed by a partitioner): a lane's
    /// are used only while it has none in `view`.
    strays: BTreeMap<String, BTreeMap<OwnerGen, Stored>>,
    /// How far the topic was read: the consumer's own `position` (`real.rs`), or under
    /// madsim, whose consumer has none, the next offset to read per partition (`sim.rs`).
    position: Position,
}

impl ReaderState {
    /// One record of the progress topic as read: decoded and absorbed; a corrupt one is
    /// logged and ignored.
    fn take<M: Message>(&mut self, m: &M) {
        let Some(key) = m.key().and_then(|k| std::str::from_utf8(k).ok()) else {
            return;
        };
        if key.starts_with(SYNC_KEY_PREFIX) {
            return;
        }
        let home = m.partition() == HOME_PARTITION;
        let (headers, payload) = super::records::incoming(m);
        let leader_epoch =
            super::records::header(&headers, LEADER_EPOCH_HEADER).and_then(parse_epoch);
        let rewound_from = super::records::header(&headers, REWOUND_HEADER)
            .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok());
        match payload.map(Checkpoint::decode) {
            None => self.absorb(home, key, None),
            Some(Ok(checkpoint)) => self.absorb(
                home,
                key,
                Some(Stored {
                    checkpoint,
                    leader_epoch,
                    rewound_from,
                }),
            ),
            Some(Err(e)) => tracing::error!(%key, error = %e, "corrupt progress record ignored"),
        }
    }

    /// One record of the progress topic, in its partition's order: a lane's record under
    /// an ownership generation, or its deletion (`None`); `home` when it was read from
    /// [`HOME_PARTITION`].
    fn absorb(&mut self, home: bool, key: &str, value: Option<Stored>) {
        if key.starts_with(SYNC_KEY_PREFIX) {
            return;
        }
        let Some((lane, gen)) = parse_progress_key(key) else {
            tracing::warn!(%key, "progress record with a foreign key ignored");
            return;
        };
        let view = if home {
            &mut self.view
        } else {
            &mut self.strays
        };
        match value {
            Some(cp) => {
                view.entry(lane.to_owned()).or_default().insert(gen, cp);
            }
            None => {
                if let Some(records) = view.get_mut(lane) {
                    records.remove(&gen);
                    if records.is_empty() {
                        view.remove(lane);
                    }
                }
            }
        }
    }

    /// What a reader given the lane in generation `reader` resumes from ([`choose`]), and
    /// the keys it deletes after its first write; `None` when the lane has no record.
    fn chosen(
        &self,
        group: &str,
        topic: &str,
        p: Partition,
        reader: OwnerGen,
        floor: Option<Offset>,
    ) -> Option<Chosen> {
        let lane = lane_key(group, topic, p);
        let records = self.view.get(&lane).or_else(|| self.strays.get(&lane))?;
        let (winner, stale) = choose(records, reader, floor);
        if let Some((gen, _)) = winner.filter(|&(g, _)| g != reader) {
            tracing::debug!(
                group,
                partition = p,
                ?gen,
                ?reader,
                "resuming from the progress of an earlier owner"
            );
        }
        Some(Chosen {
            checkpoint: winner.map(|(_, s)| s.checkpoint.clone()),
            leader_epoch: winner.and_then(|(_, s)| s.leader_epoch),
            rewound_from: winner.and_then(|(_, s)| s.rewound_from),
            stale: stale
                .into_iter()
                .map(|g| progress_key(group, topic, p, g))
                .collect(),
        })
    }
}

impl ProgressReader {
    pub async fn new(settings: &KafkaSettings) -> Result<Self, StorageError> {
        let mut c = settings.client_config(ClientRole::Consumer);
        c.set(
            "group.id",
            format!("{}progress-reader", settings.group_prefix),
        )
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("auto.offset.reset", "earliest");
        let consumer: LoggedConsumer = c
            .create_with_context(ClientLog::new("progress reader"))
            .await
            .map_err(|e| StorageError::failed("cannot create the progress reader", e))?;
        Ok(Self {
            consumer,
            topic: settings.progress_topic.clone(),
            timeout: settings.request_timeout,
            state: tokio::sync::Mutex::new(ReaderState::default()),
            owners: Mutex::new(BTreeMap::new()),
        })
    }

    /// Records that this instance now owns `partition` of `group` in generation `gen`,
    /// its position in leader epoch `leader_epoch`, with the keys of older records to
    /// delete after its first write.
    pub fn own(
        &self,
        group: &GroupName,
        partition: Partition,
        gen: OwnerGen,
        leader_epoch: Option<i32>,
        stale: Vec<String>,
        reached: Offset,
    ) {
        lock(&self.owners).insert(
            (group.clone(), partition),
            Ownership {
                gen,
                leader_epoch,
                stale,
                reached,
            },
        );
    }

    /// The rewound mark of `lane`'s checkpoint written now by its owner here
    /// ([`mark`]); `None` when the lane is not owned here.
    fn rewound(&self, lane: &LaneCheckpoint) -> Option<Offset> {
        let mut owners = lock(&self.owners);
        let o = owners.get_mut(&(lane.group.clone(), lane.partition))?;
        mark(&mut o.reached, lane.checkpoint.progress.watermark())
    }

    /// Ends a revocation the engine answered (or did not answer in time): from here a
    /// checkpoint of its partitions is not this instance's to write. What the consumer
    /// commits and drops is the [`Handover`] returned; a lost assignment commits nothing.
    pub fn hand_over(&self, group: &GroupName, revocation: Revocation) -> Handover {
        let lost = revocation.lost();
        let handover = revocation.finish();
        {
            let mut owners = lock(&self.owners);
            for &p in &handover.release {
                owners.remove(&(group.clone(), p));
            }
        }
        if lost {
            tracing::warn!(group = %group, partitions = ?handover.release, "assignment lost (session timeout): another instance may already own it, not committing");
        }
        handover
    }

    /// The stamp of each checkpoint of `batch`, or why the batch is fenced (a lane this
    /// instance does not own).
    fn stamps(&self, batch: &PersistBatch) -> Result<Stamps, StorageError> {
        let mut owners = lock(&self.owners);
        batch
            .checkpoints
            .iter()
            .map(|c| {
                owners
                    .get_mut(&(c.group.clone(), c.partition))
                    .map(|o| Stamp {
                        gen: o.gen,
                        leader_epoch: o.leader_epoch,
                        stale: o.stale.clone(),
                        rewound_from: mark(&mut o.reached, c.checkpoint.progress.watermark()),
                    })
                    .ok_or_else(|| {
                        StorageError::Fenced(format!(
                            "partition {} of group {} is not owned by this instance",
                            c.partition, c.group
                        ))
                    })
            })
            .collect()
    }

    /// Forgets the stale keys of a lane once they were deleted.
    fn stale_deleted(&self, group: &GroupName, partition: Partition, keys: &[String]) {
        if let Some(o) = lock(&self.owners).get_mut(&(group.clone(), partition)) {
            o.stale.retain(|k| !keys.contains(k));
        }
    }

    /// The progress each of `partitions` of (group, topic) that has any resumes from, for
    /// a reader given them in generation `reader` with the group's committed offsets
    /// `committed` ([`choose`]: the floor of each partition), read after catching up with
    /// the topic's end (so a write acknowledged before this call, by any instance, is
    /// seen; `home_past`: the home partition is read at least up to this offset, a sync
    /// marker's, [`SYNC_KEY_PREFIX`]). Blocks its thread while polling: call it from a
    /// thread of its own (the consumer thread).
    pub async fn latest(
        &self,
        group: &GroupName,
        topic: &TopicName,
        partitions: &[Partition],
        reader: OwnerGen,
        committed: &BTreeMap<Partition, Offset>,
        home_past: Option<i64>,
    ) -> Result<BTreeMap<Partition, Chosen>, StorageError> {
        let mut st = self.state.lock().await;
        self.catch_up(&mut st, home_past).await?;
        Ok(partitions
            .iter()
            .filter_map(|&p| {
                let floor = committed.get(&p).copied();
                let chosen = st.chosen(group.as_str(), topic.as_str(), p, reader, floor)?;
                Some((p, chosen))
            })
            .collect())
    }

    async fn catch_up(
        &self,
        st: &mut ReaderState,
        home_past: Option<i64>,
    ) -> Result<(), StorageError> {
        let count = match st.assigned {
            Some(n) => n,
            None => {
                let meta = self
                    .consumer
                    .fetch_metadata(Some(&self.topic), self.timeout)
                    .await
                    .map_err(|e| StorageError::failed("progress topic metadata", e))?;
                let n = meta
                    .topics()
                    .iter()
                    .find(|t| t.name() == self.topic)
                    .map_or(0, |t| t.partitions().len() as i32);
                if n == 0 {
                    return Err(StorageError::unavailable(format!(
                        "progress topic {} has no partitions",
                        self.topic
                    )));
                }
                let mut tpl = TopicPartitionList::new();
                for p in 0..n {
                    let _ = tpl.add_partition_offset(&self.topic, p, KOffset::Beginning);
                }
                self.consumer
                    .assign(&tpl)
                    .map_err(|e| StorageError::failed("cannot read the progress topic", e))?;
                st.assigned = Some(n);
                n
            }
        };
        let mut highs = BTreeMap::new();
        for p in 0..count {
            let (_, hi) = self
                .consumer
                .fetch_watermarks(&self.topic, p, self.timeout)
                .await
                .map_err(|e| StorageError::failed("progress topic offsets", e))?;
            let hi = match home_past {
                Some(past) if p == HOME_PARTITION => hi.max(past + 1),
                _ => hi,
            };
            highs.insert(p, hi);
        }
        self.read_up_to(st, &highs).await
    }
}

/// The state port of the Kafka backend. Shared by every instance, in Kafka: lane
/// checkpoints (the progress topic), subscription definitions (the subscriptions topic)
/// and the DLQ ledger (`<topic>.dlq.<group>`). Local: the epoch and the rate rules.
///
/// A batch goes to two stores, and no write spans both, so it is durable as one by order
/// (docs/DESIGN.md §8, "A state batch on Kafka is durable as one"): its local part, the
/// epoch alone, is made durable before anything is written to Kafka, and the batch counts
/// once its last progress record is acknowledged. A batch cut short between the two has
/// moved the epoch on and nothing else, which is harmless (an epoch must never repeat; one
/// may be skipped). Recovery reads nothing else locally: a restart takes the definitions
/// from the subscriptions topic, read to its end before the engine is built
/// (`definitions`), never from a local copy.
pub struct KafkaState {
    local: StoreAdapter,
    log: KafkaLog,
    /// The subscriptions topic's definitions as read at start: what [`StatePort::load`]
    /// recovers.
    definitions: Vec<SubscriptionSpec>,
    /// The topic of each group, for the DLQ topic's name.
    topics: Arc<Mutex<BTreeMap<GroupName, TopicName>>>,
    /// Per DLQ key, the record (its [`super::dlq::record_id`]) this instance handed the
    /// core to replay: what a resolution of the key deletes (docs/DESIGN.md §8).
    replayed: Arc<Mutex<BTreeMap<DlqKey, String>>>,
}

impl KafkaState {
    /// The port on `local` (the node's store) and `log`, recovering `definitions` (the
    /// subscriptions topic's, `super::definitions`).
    pub fn new(local: StoreAdapter, log: KafkaLog, definitions: Vec<SubscriptionSpec>) -> Self {
        Self {
            local,
            log,
            definitions,
            topics: Arc::new(Mutex::new(BTreeMap::new())),
            replayed: Arc::new(Mutex::new(BTreeMap::new())),
        }
    }

    /// The key and value (as the broker stores it: with its headers under madsim) of the
    /// progress record [`StatePort::apply`] would write for
    /// `lane` now (stamped with this instance's ownership generation, bounded), and how
    /// many ranges and attempt counts the bound dropped; why not when the lane is not owned
    /// here (the batch is fenced). Public so a simulation can recognise the record at the
    /// broker.
    pub fn progress_record(
        &self,
        lane: &LaneCheckpoint,
    ) -> Result<(String, Vec<u8>, u64), StorageError> {
        let one = PersistBatch {
            checkpoints: vec![lane.clone()],
            ..PersistBatch::default()
        };
        let stamp = self
            .log
            .inner
            .progress
            .stamps(&one)?
            .into_iter()
            .next()
            .unwrap_or_default();
        let max = self.log.settings().max_progress_ranges;
        let (key, value, dropped) = progress_record(lane, stamp.gen, max);
        let headers = stamp_headers(stamp.leader_epoch, stamp.rewound_from);
        let list: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
        Ok((key, stored_value(&list, &value), dropped))
    }

    /// The DLQ ledger of `group`, read to its end (off the async workers; under madsim by
    /// the simulated consumer's async polls).
    fn ledger(&self, group: GroupName) -> BoxFut<Result<super::dlq::Ledger, StorageError>> {
        let topic = lock(&self.topics).get(&group).cloned();
        let log = self.log.clone();
        Box::pin(async move {
            let Some(topic) = topic else {
                return Ok(super::dlq::Ledger::default());
            };
            super::dlq::ledger(log, group, topic).await
        })
    }
}

/// The DLQ tombstones a batch writes: per resolved key, the entry of the record this
/// instance handed over for that key's replay. A resolution of a key with no replay
/// remembered here deletes nothing (the entry is replayed again later: a duplicate, never
/// the loss of another record's dead letter at the key).
fn resolutions(
    replayed: &BTreeMap<DlqKey, String>,
    resolved: &[DlqKey],
) -> (Vec<(DlqKey, String)>, Vec<DlqKey>) {
    let mut out = Vec::new();
    let mut unknown = Vec::new();
    for k in resolved {
        match replayed.get(k) {
            Some(id) => out.push((k.clone(), id.clone())),
            None => unknown.push(k.clone()),
        }
    }
    (out, unknown)
}

/// What a durable batch ends of the replays remembered: a resolved key's replay, and a
/// replayed record dead-lettered again (its replay failed).
fn replays_done(replayed: &mut BTreeMap<DlqKey, String>, batch: &PersistBatch) {
    for k in &batch.dlq_resolved {
        replayed.remove(k);
    }
    for d in &batch.dead_letters {
        if replayed.get(&d.key) == Some(&super::dlq::record_id(&d.record)) {
            replayed.remove(&d.key);
        }
    }
    for g in &batch.removed_groups {
        replayed.retain(|k, _| k.group != *g);
    }
}

impl StatePort for KafkaState {
    fn load(&self) -> BoxFut<Result<Loaded, StorageError>> {
        let local = self.local.load();
        let definitions = self.definitions.clone();
        let topics = Arc::clone(&self.topics);
        Box::pin(async move {
            let mut loaded = local.await?;
            // Progress comes with each assignment, from the progress topic; definitions from
            // the subscriptions topic (a copy an earlier version kept locally is not read).
            loaded.recovered.checkpoints.clear();
            loaded.recovered.subscriptions = definitions;
            loaded.shared_definitions = true;
            let mut topics = lock(&topics);
            for s in &loaded.recovered.subscriptions {
                topics.insert(s.group.clone(), s.topic.clone());
            }
            Ok(loaded)
        })
    }

    fn apply(
        &self,
        batch: Arc<PersistBatch>,
        now_wall_ms: u64,
    ) -> BoxFut<Result<(), StorageError>> {
        let log = self.log.clone();
        // Looked up before anything is written: a batch of a lane not owned here writes
        // nothing (see the module documentation).
        let stamps = match self.log.inner.progress.stamps(&batch) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(reason = %e, "persist fenced");
                return Box::pin(async move { Err(e) });
            }
        };
        // The local part: the epoch alone, durable before anything goes to Kafka.
        let local = batch.epoch.map(|epoch| {
            self.local.apply(
                Arc::new(PersistBatch {
                    epoch: Some(epoch),
                    ..PersistBatch::default()
                }),
                now_wall_ms,
            )
        });
        let (tombstones, unknown) = resolutions(&lock(&self.replayed), &batch.dlq_resolved);
        for k in &unknown {
            tracing::warn!(group = %k.group, partition = k.partition, offset = k.offset, "a DLQ resolution of no replay of this instance deletes nothing");
        }
        let replayed = Arc::clone(&self.replayed);
        let resolved: Vec<(TopicName, DlqKey, String)> = {
            let mut topics = lock(&self.topics);
            for s in &batch.subscriptions {
                topics.insert(s.group.clone(), s.topic.clone());
            }
            let out = tombstones
                .into_iter()
                .filter_map(|(k, id)| topics.get(&k.group).map(|t| (t.clone(), k, id)))
                .collect();
            for g in &batch.removed_groups {
                topics.remove(g);
            }
            out
        };
        Box::pin(async move {
            if let Some(local) = local {
                local.await?;
            }
            let inner = &log.inner;
            let s = &inner.settings;
            let mut pending = Vec::with_capacity(batch.checkpoints.len());
            // Shared definitions first: a group's definition is in the topic before any of
            // its progress.
            let mut definitions = Vec::new();
            for spec in &batch.subscriptions {
                let value = encode_subscription(spec).map_err(StorageError::from_source)?;
                definitions.push((spec.group.as_str().to_owned(), Some(value)));
            }
            for g in &batch.removed_groups {
                definitions.push((g.as_str().to_owned(), None));
            }
            for (key, value) in &definitions {
                let mut record = FutureRecord::to(&s.subscriptions_topic).key(key.as_str());
                if let Some(v) = value {
                    record = record.payload(v.as_slice());
                }
                match inner.producer.send_result(record) {
                    Ok(f) => pending.push(f),
                    Err((e, _)) => {
                        return Err(StorageError::failed(
                            "cannot write the subscriptions topic",
                            e,
                        ))
                    }
                }
            }
            // Dead letters and resolutions before the progress that counts them done.
            for d in &batch.dead_letters {
                pending.push(super::dlq::write(&log, d, now_wall_ms).await?);
            }
            for (topic, key, id) in &resolved {
                pending.push(super::dlq::resolve(&log, topic, key, id)?);
            }
            for (lane, stamp) in batch.checkpoints.iter().zip(&stamps) {
                let (key, value, dropped) = progress_record(lane, stamp.gen, s.max_progress_ranges);
                tracing::debug!(group = %lane.group, partition = lane.partition, gen = ?stamp.gen, watermark = lane.checkpoint.progress.watermark(), ranges = lane.checkpoint.progress.range_count(), "progress record written");
                if dropped > 0 {
                    inner
                        .counters
                        .progress_ranges_dropped
                        .fetch_add(dropped, Ordering::Relaxed);
                }
                let headers = stamp_headers(stamp.leader_epoch, stamp.rewound_from);
                pending.push(send_progress(&log, &key, &value, &headers)?);
            }
            for f in pending {
                match f.await {
                    Ok(Ok(_)) => {}
                    Ok(Err((e, _))) => {
                        return Err(StorageError::failed(
                            "the progress topic refused a write",
                            e,
                        ))
                    }
                    Err(_) => {
                        return Err(StorageError::unavailable(
                            "the producer dropped a progress write",
                        ))
                    }
                }
            }
            replays_done(&mut lock(&replayed), &batch);
            delete_stale(&log, &batch, &stamps).await;
            Ok(())
        })
    }

    fn dlq_list(
        &self,
        group: GroupName,
        max: usize,
    ) -> BoxFut<Result<Vec<DlqEntry>, StorageError>> {
        let ledger = self.ledger(group);
        Box::pin(async move {
            let all = ledger.await?.all(max);
            Ok(all.into_iter().map(|(_, e)| e).collect())
        })
    }

    fn dlq_list_for_replay(
        &self,
        group: GroupName,
        max: usize,
    ) -> BoxFut<Result<Vec<DlqEntry>, StorageError>> {
        let ledger = self.ledger(group);
        let replayed = Arc::clone(&self.replayed);
        Box::pin(async move {
            let ledger = ledger.await?;
            let mut replayed = lock(&replayed);
            let picked = ledger.for_replay(max, |k| replayed.contains_key(k));
            let mut out = Vec::with_capacity(picked.len());
            for (id, e) in picked {
                replayed.insert(e.key.clone(), id);
                out.push(e);
            }
            Ok(out)
        })
    }

    fn dlq_replay_refused(&self, _group: &GroupName, keys: &[DlqKey]) {
        let mut replayed = lock(&self.replayed);
        for k in keys {
            replayed.remove(k);
        }
    }

    fn put_rate_rule(
        &self,
        topic: TopicName,
        rule: Option<RateRule>,
    ) -> BoxFut<Result<(), StorageError>> {
        self.local.put_rate_rule(topic, rule)
    }
}

/// Deletes the other records of the lanes just written under their owner's generation
/// (the owner's own record is durable now, and outranks them). Best effort: a key left
/// behind is outranked anyway and deleted by the lane's next owner.
async fn delete_stale(log: &KafkaLog, batch: &PersistBatch, stamps: &Stamps) {
    let inner = &log.inner;
    for (lane, Stamp { stale, .. }) in batch.checkpoints.iter().zip(stamps) {
        if stale.is_empty() {
            continue;
        }
        let mut pending = Vec::with_capacity(stale.len());
        for key in stale {
            let record: FutureRecord<'_, str, [u8]> =
                FutureRecord::to(&inner.settings.progress_topic)
                    .partition(HOME_PARTITION)
                    .key(key.as_str());
            match inner.producer.send_result(record) {
                Ok(f) => pending.push(f),
                Err((e, _)) => {
                    tracing::warn!(%key, error = %e, "cannot delete a stale progress record")
                }
            }
        }
        let mut all = pending.len() == stale.len();
        for f in pending {
            all &= matches!(f.await, Ok(Ok(_)));
        }
        if all {
            inner
                .progress
                .stale_deleted(&lane.group, lane.partition, stale);
        }
    }
}

#[cfg(test)]
impl ReaderState {
    /// `absorb` of an unstamped record.
    fn put(&mut self, home: bool, key: &str, value: Option<Checkpoint>) {
        self.absorb(
            home,
            key,
            value.map(|checkpoint| Stored {
                checkpoint,
                leader_epoch: None,
                rewound_from: None,
            }),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn checkpoint(
        watermark: u64,
        ranges: &[(u64, u64)],
        attempts: &[(u64, u32)],
    ) -> Checkpoint {
        Checkpoint {
            progress: Progress::from_parts(watermark, ranges.iter().copied()).expect("valid"),
            attempts: attempts.to_vec(),
        }
    }

    /// Goal: a progress record stays bounded without ever losing a record. Method: a
    /// checkpoint over the bound keeps its watermark exactly and a prefix of its ranges;
    /// what it no longer marks done is only redelivered (not skipped), and the drop is
    /// counted.
    #[test]
    fn bounded_keeps_the_watermark_and_drops_excess_ranges() {
        let cp = checkpoint(10, &[(12, 13), (15, 17), (20, 21)], &[(11, 2), (14, 3)]);
        let (same, dropped) = bounded(&cp, 3);
        assert_eq!((same, dropped), (cp.clone(), 0));

        let (b, dropped) = bounded(&cp, 1);
        assert_eq!(b.progress.watermark(), 10);
        assert_eq!(b.progress.ranges().collect::<Vec<_>>(), vec![(12, 13)]);
        assert_eq!(b.attempts, vec![(11, 2)]);
        assert_eq!(dropped, 2 + 1);
        // Everything done in the bounded record was done in the original: no loss.
        for o in 0..25 {
            if b.progress.is_done(o) {
                assert!(
                    cp.progress.is_done(o),
                    "offset {o} marked done by the bound"
                );
            }
        }
        let decoded = Checkpoint::decode(&b.encode()).expect("round trip");
        assert_eq!(decoded, b);
    }

    #[test]
    fn progress_keys_are_unambiguous() {
        // Names cannot hold a newline, so the key splits back into its parts.
        assert_eq!(progress_key("g", "t.x", 3, None), "g\nt.x\n3");
        assert_eq!(progress_key("g", "t.x", 3, Some(7)), "g\nt.x\n3\n7");
        assert_ne!(
            progress_key("g", "t", 12, None),
            progress_key("g", "t1", 2, None)
        );
        for gen in [None, Some(0), Some(41)] {
            let key = progress_key("g", "t", 12, gen);
            assert_eq!(parse_progress_key(&key), Some(("g\nt\n12", gen)));
        }
        assert_eq!(parse_progress_key("g\nt"), None);
        assert_eq!(parse_progress_key("g\nt\n1\nx"), None);
    }

    fn dead_letter(offset: u64, id: &str) -> unimesh_core::DeadLetter {
        use unimesh_core::{EventMeta, Record, RecordMeta};
        unimesh_core::DeadLetter {
            key: DlqKey {
                group: GroupName::new("g").expect("valid"),
                partition: 0,
                offset,
            },
            topic: TopicName::new("t").expect("valid"),
            record: Record {
                offset,
                meta: RecordMeta::Event(Arc::new(EventMeta {
                    id: id.into(),
                    source: "/s".into(),
                    ty: "x".into(),
                    subject: None,
                    partition_key: None,
                    extensions: Vec::new(),
                })),
                body: bytes::Bytes::new(),
                broker_handle: None,
            },
            reason: unimesh_core::DeadLetterReason::Nacked,
            attempts: 1,
        }
    }

    /// Goal: a resolution deletes the entry of the record that was replayed, never the
    /// newer one at the same coordinates. Method: the record handed over for replay at
    /// offset 7 is the lost one; the resolution's tombstone names it; a key with no replay
    /// remembered deletes nothing; a durable batch ends the replays it resolved or
    /// dead-lettered again, and only those.
    #[test]
    fn a_resolution_deletes_the_replayed_record_only() {
        let lost = dead_letter(7, "lost");
        let lost_id = super::super::dlq::record_id(&lost.record);
        let other = dead_letter(9, "other");
        let mut replayed = BTreeMap::new();
        replayed.insert(lost.key.clone(), lost_id.clone());
        replayed.insert(
            other.key.clone(),
            super::super::dlq::record_id(&other.record),
        );
        let unknown_key = dead_letter(8, "x").key;
        let (out, unknown) = resolutions(&replayed, &[lost.key.clone(), unknown_key.clone()]);
        assert_eq!(out, vec![(lost.key.clone(), lost_id)]);
        assert_eq!(unknown, vec![unknown_key]);
        // The new record at offset 7 dead-lettered: not the replayed one, which goes on.
        let batch = PersistBatch {
            dead_letters: vec![dead_letter(7, "new"), other.clone()],
            ..PersistBatch::default()
        };
        replays_done(&mut replayed, &batch);
        assert_eq!(replayed.keys().collect::<Vec<_>>(), vec![&lost.key]);
        let batch = PersistBatch {
            dlq_resolved: vec![lost.key.clone()],
            ..PersistBatch::default()
        };
        replays_done(&mut replayed, &batch);
        assert!(replayed.is_empty());
    }

    /// Goal: the fence holds on the topic as written, whatever the order of writes.
    /// Method: the lane's records as the progress topic holds them — the new owner
    /// (generation 5) writes, then the zombie it replaced (generation 3) writes late, then
    /// the new owner deletes the zombie's key and the zombie writes once more — are read
    /// in that order; the next owner (generation 8) resumes from generation 5's record
    /// each time, and deletes both keys after its first write. With one key per lane (no
    /// fence), the zombie's late record would be the newest and would win.
    #[test]
    fn the_topic_as_written_keeps_a_zombies_late_record_out() {
        let mut st = ReaderState::default();
        let key = |gen| progress_key("g", "t", 0, gen);
        let resumed = |st: &ReaderState| {
            st.chosen("g", "t", 0, Some(8), None)
                .and_then(|c| c.checkpoint)
                .map(|cp| cp.progress.watermark())
        };
        st.put(true, &key(Some(3)), Some(checkpoint(10, &[], &[])));
        st.put(true, &key(Some(5)), Some(checkpoint(12, &[(14, 15)], &[])));
        st.put(true, &key(Some(3)), Some(checkpoint(40, &[], &[])));
        assert_eq!(resumed(&st), Some(12));
        st.put(true, &key(Some(3)), None);
        assert_eq!(resumed(&st), Some(12));
        st.put(true, &key(Some(3)), Some(checkpoint(41, &[], &[])));
        assert_eq!(resumed(&st), Some(12));
        let chosen = st
            .chosen("g", "t", 0, Some(8), None)
            .expect("the lane has records");
        assert_eq!(chosen.stale, vec![key(Some(3)), key(Some(5))]);
        // The new owner's own write then deletes the rest; what is left is its own.
        st.put(true, &key(Some(8)), Some(checkpoint(13, &[], &[])));
        st.put(true, &key(Some(3)), None);
        st.put(true, &key(Some(5)), None);
        assert_eq!(resumed(&st), Some(13));
        assert_eq!(st.view.get("g\nt\n0").map(BTreeMap::len), Some(1));
        // A foreign key changes nothing.
        st.put(true, "g\nt", Some(checkpoint(99, &[], &[])));
        assert_eq!(resumed(&st), Some(13));
        assert_eq!(st.chosen("g", "t", 1, Some(8), None), None);
    }

    /// Goal: a lane with a record in the home partition resumes from the home records,
    /// whatever else holds its keys and in whatever order the partitions are read (the
    /// regression on librdkafka's mock cluster, whose progress topic has four partitions:
    /// the newest record of a key, written home, lost to an older one of the same key that
    /// another partitioner had put in another partition, because that partition was read
    /// last). Method: the same key home (watermark 20) and elsewhere (3), in both read
    /// orders; a lane whose records are all elsewhere (an earlier placement) resumes from
    /// them, ranked by generation, until its next owner's record is home.
    #[test]
    fn a_record_outside_the_home_partition_never_outranks_the_home_ones() {
        let resumed = |st: &ReaderState| {
            st.chosen("g", "t", 0, Some(8), None)
                .and_then(|c| c.checkpoint)
                .map(|cp| cp.progress.watermark())
        };
        let key = |gen| progress_key("g", "t", 0, gen);
        for stray_read_last in [false, true] {
            let mut st = ReaderState::default();
            if !stray_read_last {
                st.put(false, &key(Some(2)), Some(checkpoint(3, &[], &[])));
            }
            st.put(true, &key(Some(2)), Some(checkpoint(3, &[], &[])));
            st.put(true, &key(Some(2)), Some(checkpoint(20, &[], &[])));
            if stray_read_last {
                st.put(false, &key(Some(2)), Some(checkpoint(3, &[], &[])));
                // Even a stray of a higher generation: the lane has records home.
                st.put(false, &key(Some(7)), Some(checkpoint(1, &[], &[])));
            }
            assert_eq!(resumed(&st), Some(20), "stray read last: {stray_read_last}");
        }
        let mut st = ReaderState::default();
        st.put(false, &key(Some(4)), Some(checkpoint(7, &[], &[])));
        st.put(false, &key(Some(1)), Some(checkpoint(9, &[], &[])));
        assert_eq!(resumed(&st), Some(7));
        st.put(true, &key(Some(8)), Some(checkpoint(8, &[], &[])));
        assert_eq!(resumed(&st), Some(8));
        let chosen = st
            .chosen("g", "t", 0, Some(8), None)
            .expect("the lane has records");
        assert!(chosen.stale.is_empty(), "{:?}", chosen.stale);
    }
}
