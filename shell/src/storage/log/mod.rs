//! The embedded event log: unimesh's default storage backend.
//!
//! A durable, partitioned, append-only log on RocksDB. A topic has a fixed number of
//! partitions, chosen when it is created (on its first publish, `default_partitions` unless
//! told otherwise); a record is addressed by (topic, partition, offset), offsets dense from 0
//! per partition. Publishes append here; the core's `Effect::Fetch` reads here.
//!
//! Method categories:
//! - Writes: [`EmbeddedLog::append`] (async; returns once the WAL is fsynced, group-committed
//!   with every other append waiting at that moment), [`EmbeddedLog::ensure_topic`] /
//!   [`EmbeddedLog::create_topic`] (synchronous, one fsync, only for a new topic).
//! - Reads: [`EmbeddedLog::read`], [`EmbeddedLog::offsets`], [`EmbeddedLog::topic`],
//!   [`EmbeddedLog::topics`], [`EmbeddedLog::offset_for_time`] (by the time index). `read`
//!   is a blocking RocksDB read (usually served from the memtable or block cache); call it
//!   from `spawn_blocking` when latency matters.
//! - Waiting: [`EmbeddedLog::watch_end`] yields the end offset of a partition each time it
//!   moves, so a fetch parked at the end of a partition wakes on the next append.
//! - Housekeeping: [`EmbeddedLog::enforce_retention`], called periodically with the wall time.
//!
//! Time: append times come from [`LogConfig::clock`] (the wall clock, injectable for tests);
//! retention compares them with the `now_wall_ms` it is given.
//!
//! Failure: a storage error is a [`LogError`] (the HTTP layer answers 503), never a panic.
//! After a failed append write the writer refuses further appends until the log is reopened
//! (see `writer.rs` for why); reads keep being served.
//!
//! Disk space: retention deletes whole prefixes with RocksDB range deletions; once a
//! partition has lost [`LogConfig::reclaim_after_bytes`] that way, its deleted range is
//! compacted at once so the space comes back (smaller deletions wait for RocksDB's own
//! compactions).

// Without the `rocksdb` feature only the log's vocabulary is built (the types every log
// port shares, key partitioning, the wall clock): the record codec's RocksDB half is unused.
#[cfg_attr(not(feature = "rocksdb"), allow(dead_code))]
mod codec;
#[cfg(feature = "rocksdb")]
mod port;
#[cfg(all(test, feature = "rocksdb"))]
mod tests;
#[cfg(feature = "rocksdb")]
mod writer;

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use unimesh_core::{Offset, Partition, TopicName};

pub use codec::{murmur2, partition_for_key};

#[cfg(feature = "rocksdb")]
use embedded_imports::*;

/// What the RocksDB half of this file uses.
#[cfg(feature = "rocksdb")]
mod embedded_imports {
    pub(super) use std::collections::HashMap;
    pub(super) use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
    pub(super) use std::sync::{Mutex, MutexGuard, RwLock};
    pub(super) use std::thread::JoinHandle;

    pub(super) use rocksdb::{
        ColumnFamilyDescriptor, DBCompressionType, DBRecoveryMode, Options, ReadOptions,
        WriteBatch, WriteOptions, DB,
    };
    pub(super) use tokio::sync::{mpsc, oneshot, watch};

    pub(super) use super::codec::RecordHeader;
    pub(super) use super::writer::{AppendRequest, Tail};
}

#[cfg(feature = "rocksdb")]
const RECORDS_CF: &str = "records";
#[cfg(feature = "rocksdb")]
const META_CF: &str = "meta";

/// Above this a stored partition count is taken for corruption rather than a configuration.
#[cfg(feature = "rocksdb")]
const PARTITIONS_HARD_MAX: u32 = 1 << 16;
/// Longest `sync_interval_ms`: the loss window on a machine crash stays short.
pub const MAX_SYNC_INTERVAL_MS: u64 = 60_000;

/// Milliseconds since the Unix epoch. Injected so tests can age records without sleeping.
pub trait WallClock: Send + Sync + fmt::Debug {
    fn now_ms(&self) -> u64;
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl WallClock for SystemClock {
    fn now_ms(&self) -> u64 {
        // A clock before 1970 is a misconfigured host; 0 keeps records (age retention only
        // deletes what is older than `now - retention_ms`).
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0)
    }
}

/// Configuration of the embedded log. Every queue and map it holds is bounded by these.
#[derive(Clone, Debug)]
pub struct LogConfig {
    /// The RocksDB directory (created if missing).
    pub dir: PathBuf,
    /// Partitions of a topic created by its first publish.
    pub default_partitions: u32,
    /// Largest partition count a topic may be created with.
    pub max_partitions: u32,
    /// Topics the log accepts; creating one more is refused (topics found at open are kept).
    pub max_topics: usize,
    /// Largest payload of one record, in bytes.
    pub max_record_bytes: usize,
    /// Most records in one `append` call.
    pub max_records_per_append: usize,
    /// Payload bytes the writer gathers into one synced write (one `append` may not exceed it).
    pub max_batch_bytes: usize,
    /// Appends waiting for the writer; beyond it `append` waits (back-pressure).
    pub queue_capacity: usize,
    /// Records older than this are deleted by `enforce_retention`.
    pub retention_ms: Option<u64>,
    /// Oldest records of a partition are deleted while its payload bytes exceed this.
    pub retention_bytes_per_partition: Option<u64>,
    /// Once retention has deleted this many payload bytes of a partition (since open or the
    /// last reclaim), the deleted range is compacted at once so the disk space comes back;
    /// smaller deletions wait for RocksDB's own compactions.
    pub reclaim_after_bytes: u64,
    /// Source of the append time stored with each record.
    pub clock: Arc<dyn WallClock>,
    /// `None` (the default): an append is answered once the WAL write holding it is
    /// fsynced. `Some(ms)`: an append is answered once it is written to the operating
    /// system, and a syncer thread fsyncs the WAL every `ms` milliseconds while there is
    /// something to sync. A crash of the process then loses nothing answered; a crash of
    /// the machine (power, kernel) loses at most the appends answered in the last `ms` ms.
    pub sync_interval_ms: Option<u64>,
    /// Bytes of the newest records kept in memory, shared evenly by every partition: a
    /// fetch of a group that keeps up is answered from them without a RocksDB read. 0
    /// keeps none.
    pub read_cache_bytes: usize,
}

impl LogConfig {
    /// The defaults: 4 partitions per new topic, 1 MiB records, no retention.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            default_partitions: 4,
            max_partitions: 1024,
            max_topics: 10_000,
            max_record_bytes: 1 << 20,
            max_records_per_append: 10_000,
            max_batch_bytes: 8 << 20,
            queue_capacity: 1024,
            retention_ms: None,
            retention_bytes_per_partition: None,
            reclaim_after_bytes: 64 << 20,
            clock: Arc::new(SystemClock),
            sync_interval_ms: None,
            read_cache_bytes: DEFAULT_READ_CACHE_BYTES,
        }
    }

    #[cfg(feature = "rocksdb")]
    fn validate(&self) -> Result<(), LogError> {
        let bad = |what: &str| Err(LogError::InvalidConfig(what.to_owned()));
        if self.max_partitions == 0 || self.max_partitions > PARTITIONS_HARD_MAX {
            return bad("max_partitions must be between 1 and 65536");
        }
        if self.default_partitions == 0 || self.default_partitions > self.max_partitions {
            return bad("default_partitions must be between 1 and max_partitions");
        }
        if self.max_topics == 0 {
            return bad("max_topics must be at least 1");
        }
        if self.max_record_bytes == 0 || self.max_record_bytes > self.max_batch_bytes {
            return bad("max_record_bytes must be between 1 and max_batch_bytes");
        }
        // RocksDB values are capped at 4 GiB; stay well clear with the header added.
        if self.max_batch_bytes > (1 << 30) {
            return bad("max_batch_bytes must be at most 1 GiB");
        }
        if self.max_records_per_append == 0 {
            return bad("max_records_per_append must be at least 1");
        }
        if self.queue_capacity == 0 {
            return bad("queue_capacity must be at least 1");
        }
        if self
            .sync_interval_ms
            .is_some_and(|ms| ms == 0 || ms > MAX_SYNC_INTERVAL_MS)
        {
            return bad("sync_interval_ms must be between 1 and 60000");
        }
        Ok(())
    }
}

/// Why the log refused or failed. Variants in alphabetical order.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    #[error("append of {bytes} payload bytes exceeds the limit of {max}")]
    AppendTooLarge { bytes: usize, max: usize },
    /// Data read back from disk failed its checks (length, version, checksum, density).
    #[error("corrupt log data: {what}")]
    Corrupt { what: String },
    #[error("invalid log configuration: {0}")]
    InvalidConfig(String),
    #[error("invalid partition count {partitions}: must be between 1 and {max}")]
    InvalidPartitionCount { partitions: u32, max: u32 },
    #[error("record of {bytes} bytes exceeds the limit of {max}")]
    RecordTooLarge { bytes: usize, max: usize },
    /// RocksDB reported an error (I/O, disk full, ...).
    #[error("log storage error: {0}")]
    Storage(String),
    #[error("append of {count} records exceeds the limit of {max}")]
    TooManyRecords { count: usize, max: usize },
    #[error("topic limit of {max} reached")]
    TooManyTopics { max: usize },
    /// The writer is stopped (the log is closing, or a write failed earlier).
    #[error("log unavailable: {0}")]
    Unavailable(String),
    #[error("topic {topic} has {partitions} partitions, there is no partition {partition}")]
    UnknownPartition {
        topic: TopicName,
        partition: Partition,
        partitions: u32,
    },
    #[error("unknown topic {0}")]
    UnknownTopic(TopicName),
}

impl LogError {
    /// True when the caller asked for something refused (a 4xx); false for a fault of the log
    /// or its disk (a 5xx/503: the caller may retry later).
    pub fn is_caller_error(&self) -> bool {
        matches!(
            self,
            LogError::AppendTooLarge { .. }
                | LogError::InvalidPartitionCount { .. }
                | LogError::RecordTooLarge { .. }
                | LogError::TooManyRecords { .. }
                | LogError::TooManyTopics { .. }
                | LogError::UnknownPartition { .. }
                | LogError::UnknownTopic(_)
        )
    }

    #[cfg(feature = "rocksdb")]
    fn storage(err: rocksdb::Error) -> Self {
        LogError::Storage(err.into_string())
    }

    /// Names where corrupt data was found.
    #[cfg(feature = "rocksdb")]
    fn at(self, topic: &TopicName, partition: Partition, offset: Offset) -> Self {
        match self {
            LogError::Corrupt { what } => LogError::Corrupt {
                what: format!("{topic}/{partition}@{offset}: {what}"),
            },
            other => other,
        }
    }
}

/// A topic as the log knows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicInfo {
    pub name: TopicName,
    pub partitions: u32,
}

/// One record to append. With a `key`, the partition is `partition_for_key(key)`; without,
/// records are spread round-robin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendItem {
    pub key: Option<String>,
    pub value: Bytes,
}

/// The answer to a read.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReadResult {
    /// `from` is not in `earliest..=end` (deleted by retention, or beyond the end).
    OutOfRange { earliest: Offset, end: Offset },
    /// Records from `from` on, ascending and dense; empty when `from` is the end.
    Records {
        records: Vec<(Offset, Bytes)>,
        earliest: Offset,
        end: Offset,
    },
}

/// What one `enforce_retention` pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RetentionReport {
    pub truncated: Vec<Truncation>,
    /// Partitions that could not be examined or truncated; the others were still processed.
    pub failed: Vec<(TopicName, Partition, LogError)>,
}

/// One partition whose earliest offset moved up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Truncation {
    pub topic: TopicName,
    pub partition: Partition,
    pub earliest_before: Offset,
    pub earliest_after: Offset,
}

/// The default of [`LogConfig::read_cache_bytes`].
pub const DEFAULT_READ_CACHE_BYTES: usize = 64 << 20;
/// The most [`LogConfig::read_cache_bytes`] may be (64 GiB).
pub const MAX_READ_CACHE_BYTES: u64 = 64 << 30;

/// The newest records of one partition, in memory (a bounded window of the log's tail, as
/// the writer appended them): a fetch that starts inside it is answered from here, without
/// a RocksDB read or a trip to the blocking pool. Its records may run ahead of the
/// published end for a moment (the writer adds them before it publishes the end); a read
/// never goes past the end.
#[cfg(feature = "rocksdb")]
#[derive(Default)]
struct Recent {
    /// The offset of `records[0]`.
    first: Offset,
    records: std::collections::VecDeque<Bytes>,
    bytes: usize,
}

#[cfg(feature = "rocksdb")]
impl Recent {
    /// Adds the record at `offset`, then drops the oldest while over `cap` bytes. A record
    /// that does not follow the window's last one starts a new window.
    fn push(&mut self, offset: Offset, payload: &Bytes, cap: usize) {
        if self.first + self.records.len() as Offset != offset {
            self.records.clear();
            self.bytes = 0;
            self.first = offset;
        }
        self.records.push_back(payload.clone());
        self.bytes = self.bytes.saturating_add(payload.len());
        while self.bytes > cap {
            let Some(old) = self.records.pop_front() else {
                break;
            };
            self.bytes = self.bytes.saturating_sub(old.len());
            self.first += 1;
        }
        debug_assert!(self.bytes <= cap || self.records.is_empty());
    }

    /// Up to `max` records (at least one, then up to `max_bytes`) from `from`, below `end`;
    /// `None` when the window does not hold `from`.
    fn read(
        &self,
        from: Offset,
        end: Offset,
        max: usize,
        max_bytes: usize,
    ) -> Option<Vec<(Offset, Bytes)>> {
        let upto = end.min(self.first + self.records.len() as Offset);
        if from < self.first || from >= upto || max == 0 {
            return None;
        }
        let wanted = max.min((upto - from) as usize);
        let mut out = Vec::with_capacity(wanted);
        let mut bytes = 0usize;
        for payload in self
            .records
            .iter()
            .skip((from - self.first) as usize)
            .take(wanted)
        {
            if !out.is_empty() && bytes.saturating_add(payload.len()) > max_bytes {
                break;
            }
            bytes = bytes.saturating_add(payload.len());
            out.push((from + out.len() as Offset, payload.clone()));
        }
        Some(out)
    }
}

/// Counters since open, for metrics and for judging group commit (records per synced write).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LogStats {
    /// Records appended (durable, or with `sync_interval_ms` written to the system).
    pub records_appended: u64,
    /// WAL fsyncs: one per group-committed write by default, one per sync interval that
    /// had something to sync with `sync_interval_ms` (records per fsync either way).
    pub synced_writes: u64,
    /// Appends refused because a write failed.
    pub write_failures: u64,
    /// Appends written on their caller's thread (`sync_interval_ms`, see `writer.rs`).
    pub inline_appends: u64,
}

#[cfg(feature = "rocksdb")]
/// State shared by the handles and the writer thread.
pub(crate) struct Shared {
    db: DB,
    cfg: LogConfig,
    records_appended: AtomicU64,
    synced_writes: AtomicU64,
    write_failures: AtomicU64,
    /// Why appends are refused, once a write failed (see `writer.rs`); unset while healthy.
    fault: std::sync::OnceLock<String>,
    /// Set after a write that was not fsynced (`sync_interval_ms`), cleared by the syncer.
    unsynced: std::sync::atomic::AtomicBool,
    /// Partitions of every topic, which share `read_cache_bytes` evenly.
    partitions_total: AtomicU64,
    /// The partitions' tails: held by whoever writes (the writer thread, or an inline
    /// append; see `writer.rs`).
    writer: Mutex<writer::WriterState>,
    /// Appends written on their caller's thread (`writer::try_inline`).
    inline_appends: AtomicU64,
    /// Test hook: this many next synced writes fail as if the disk refused them.
    #[cfg(test)]
    fail_next_writes: AtomicU32,
    /// Test hook: the next inline write meets a write stall.
    #[cfg(test)]
    stall_next_inline: std::sync::atomic::AtomicBool,
}

#[cfg(feature = "rocksdb")]
pub(crate) struct TopicState {
    name: TopicName,
    partitions: Vec<PartitionState>,
    round_robin: AtomicU32,
}

#[cfg(feature = "rocksdb")]
struct PartitionState {
    earliest: AtomicU64,
    /// The end offset, published by the writer after each synced write.
    end: watch::Sender<Offset>,
    /// The tail found at open (or zero for a new topic); the writer continues from it.
    initial: Tail,
    /// Payload bytes retention deleted and no compaction has reclaimed yet (retention only).
    unreclaimed_bytes: AtomicU64,
    /// The newest records, for reads that keep up (written by the writer thread only).
    recent: Mutex<Recent>,
}

#[cfg(feature = "rocksdb")]
impl TopicState {
    fn new(name: TopicName, tails: Vec<(Offset, Tail)>) -> Self {
        let partitions = tails
            .into_iter()
            .map(|(earliest, tail)| PartitionState {
                earliest: AtomicU64::new(earliest),
                end: watch::channel(tail.next).0,
                initial: tail,
                unreclaimed_bytes: AtomicU64::new(0),
                recent: Mutex::new(Recent::default()),
            })
            .collect();
        Self {
            name,
            partitions,
            round_robin: AtomicU32::new(0),
        }
    }

    fn info(&self) -> TopicInfo {
        TopicInfo {
            name: self.name.clone(),
            partitions: self.partition_count(),
        }
    }

    fn partition_count(&self) -> u32 {
        // Bounded by PARTITIONS_HARD_MAX at creation and at open.
        u32::try_from(self.partitions.len()).unwrap_or(u32::MAX)
    }

    fn partition(&self, partition: Partition) -> Result<&PartitionState, LogError> {
        self.partitions
            .get(partition as usize)
            .ok_or_else(|| LogError::UnknownPartition {
                topic: self.name.clone(),
                partition,
                partitions: self.partition_count(),
            })
    }

    /// Called by the writer only with partitions it was given by `append`, which are valid.
    fn initial_tail(&self, partition: Partition) -> Tail {
        self.partitions
            .get(partition as usize)
            .map(|p| p.initial)
            .unwrap_or_default()
    }

    /// Keeps a record the writer just wrote in the partition's window of recent records.
    fn remember(&self, partition: Partition, offset: Offset, payload: &Bytes, cap: usize) {
        if let Some(p) = self.partitions.get(partition as usize) {
            lock(&p.recent).push(offset, payload, cap);
        }
    }

    fn publish_end(&self, partition: Partition, end: Offset) {
        if let Some(p) = self.partitions.get(partition as usize) {
            p.end.send_replace(end);
        }
    }
}

#[cfg(feature = "rocksdb")]
impl PartitionState {
    fn earliest(&self) -> Offset {
        self.earliest.load(Ordering::Acquire)
    }

    fn end(&self) -> Offset {
        *self.end.borrow()
    }
}

/// The embedded log. Cheap to clone; every clone is the same log. The database closes when
/// the last clone is dropped (or at [`EmbeddedLog::close`]), after the writer has written
/// what was already queued.
#[cfg(feature = "rocksdb")]
#[derive(Clone)]
pub struct EmbeddedLog {
    inner: Arc<Inner>,
}

#[cfg(feature = "rocksdb")]
impl fmt::Debug for EmbeddedLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EmbeddedLog")
            .field("dir", &self.inner.shared.cfg.dir)
            .finish_non_exhaustive()
    }
}

#[cfg(feature = "rocksdb")]
struct Inner {
    shared: Arc<Shared>,
    topics: RwLock<HashMap<TopicName, Arc<TopicState>>>,
    /// Serialises topic creation, so two first publishes agree on one partition count.
    create_lock: Mutex<()>,
    /// Serialises retention passes (each moves `earliest` and may roll it back).
    retention_lock: Mutex<()>,
    tx: Option<mpsc::Sender<AppendRequest>>,
    writer: Option<JoinHandle<()>>,
    /// The WAL syncer of `sync_interval_ms`; stopped after the writer (a last sync).
    syncer: Option<writer::Syncer>,
}

#[cfg(feature = "rocksdb")]
impl Drop for Inner {
    fn drop(&mut self) {
        // Closing the queue lets the writer finish what is queued and exit; joining it
        // releases its handle on the database before ours goes.
        self.tx.take();
        if let Some(writer) = self.writer.take() {
            if writer.join().is_err() {
                tracing::error!("embedded log writer thread panicked");
            }
        }
        if let Some(syncer) = self.syncer.take() {
            if let Err(e) = syncer.stop() {
                tracing::error!(error = %e, "the last WAL sync of the embedded log failed");
            }
        }
    }
}

/// Locks ignoring poison: the guarded data is either `()` or a map that a panicking holder
/// cannot leave half-updated (inserts are single calls).
#[cfg(feature = "rocksdb")]
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(feature = "rocksdb")]
impl EmbeddedLog {
    /// Opens (or creates) the log in `cfg.dir`, recovering every partition's earliest and end
    /// offsets, and starts the writer thread.
    pub fn open(cfg: LogConfig) -> Result<Self, LogError> {
        cfg.validate()?;
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        opts.set_max_background_jobs(2);
        opts.set_keep_log_file_num(4);
        // A torn tail of the WAL (a crash mid-write) is dropped; that write was never
        // acknowledged, since acknowledgement waits for the sync.
        opts.set_wal_recovery_mode(DBRecoveryMode::PointInTime);
        let mut record_opts = Options::default();
        record_opts.set_compression_type(DBCompressionType::Lz4);
        let cfs = vec![
            ColumnFamilyDescriptor::new(RECORDS_CF, record_opts),
            ColumnFamilyDescriptor::new(META_CF, Options::default()),
        ];
        let db = DB::open_cf_descriptors(&opts, &cfg.dir, cfs).map_err(LogError::storage)?;
        let topics = recover_topics(&db)?;
        let partitions_total: u64 = topics.values().map(|t| t.partitions.len() as u64).sum();
        let shared = Arc::new(Shared {
            db,
            cfg,
            records_appended: AtomicU64::new(0),
            synced_writes: AtomicU64::new(0),
            write_failures: AtomicU64::new(0),
            fault: std::sync::OnceLock::new(),
            unsynced: std::sync::atomic::AtomicBool::new(false),
            partitions_total: AtomicU64::new(partitions_total),
            writer: Mutex::new(writer::WriterState::default()),
            inline_appends: AtomicU64::new(0),
            #[cfg(test)]
            fail_next_writes: AtomicU32::new(0),
            #[cfg(test)]
            stall_next_inline: std::sync::atomic::AtomicBool::new(false),
        });

        let (tx, rx) = mpsc::channel(shared.cfg.queue_capacity);
        let writer_shared = shared.clone();
        let writer = std::thread::Builder::new()
            .name("unimesh-log-writer".to_owned())
            .spawn(move || writer::run(writer_shared, rx))
            .map_err(|e| LogError::Unavailable(format!("cannot start the log writer: {e}")))?;
        let syncer = match shared.cfg.sync_interval_ms {
            Some(ms) => Some(writer::Syncer::start(shared.clone(), ms)?),
            None => None,
        };

        Ok(Self {
            inner: Arc::new(Inner {
                shared,
                topics: RwLock::new(topics),
                create_lock: Mutex::new(()),
                retention_lock: Mutex::new(()),
                tx: Some(tx),
                writer: Some(writer),
                syncer,
            }),
        })
    }

    /// Drops this handle; when it is the last one, waits for queued appends, stops the
    /// writer and flushes the memtables, so the next open has no WAL to replay. Dropping
    /// without `close` loses nothing that was acknowledged (the WAL is synced), it only
    /// makes the next open replay the WAL.
    pub fn close(self) -> Result<(), LogError> {
        let Ok(mut inner) = Arc::try_unwrap(self.inner) else {
            return Ok(());
        };
        inner.tx.take();
        if let Some(writer) = inner.writer.take() {
            if writer.join().is_err() {
                return Err(LogError::Unavailable(
                    "the log writer thread panicked".to_owned(),
                ));
            }
        }
        if let Some(syncer) = inner.syncer.take() {
            syncer.stop()?;
        }
        let db = &inner.shared.db;
        for name in [RECORDS_CF, META_CF] {
            if let Some(cf) = db.cf_handle(name) {
                db.flush_cf(&cf).map_err(LogError::storage)?;
            }
        }
        Ok(())
    }

    /// Bytes of the log's table files on disk (not counting the WAL).
    pub fn disk_bytes(&self) -> Result<u64, LogError> {
        let db = &self.inner.shared.db;
        let mut total = 0u64;
        for cf in [records_cf(db)?, meta_cf(db)?] {
            let bytes = db
                .property_int_value_cf(cf, "rocksdb.total-sst-files-size")
                .map_err(LogError::storage)?
                .unwrap_or(0);
            total = total.saturating_add(bytes);
        }
        Ok(total)
    }

    /// The configuration the log was opened with.
    pub fn config(&self) -> &LogConfig {
        &self.inner.shared.cfg
    }

    pub fn stats(&self) -> LogStats {
        let shared = &self.inner.shared;
        LogStats {
            records_appended: shared.records_appended.load(Ordering::Relaxed),
            synced_writes: shared.synced_writes.load(Ordering::Relaxed),
            write_failures: shared.write_failures.load(Ordering::Relaxed),
            inline_appends: shared.inline_appends.load(Ordering::Relaxed),
        }
    }

    /// Why appends are refused until the log is reopened, if a write failed; `None` while
    /// appends work. Health checks report it so an operator (or orchestrator) restarts.
    pub fn fault(&self) -> Option<String> {
        self.inner.shared.fault.get().cloned()
    }

    /// Makes the next inline write meet a RocksDB write stall.
    #[cfg(test)]
    pub(crate) fn stall_next_inline(&self) {
        self.inner
            .shared
            .stall_next_inline
            .store(true, Ordering::Relaxed);
    }

    /// Makes the next `n` synced writes fail as a full or broken disk would.
    #[cfg(test)]
    pub(crate) fn fail_next_writes(&self, n: u32) {
        self.inner
            .shared
            .fail_next_writes
            .store(n, Ordering::Relaxed);
    }

    /// The time index of a partition: (second, first offset appended in it), ascending.
    #[cfg(test)]
    pub(crate) fn time_index_entries(
        &self,
        topic: &TopicName,
        partition: Partition,
    ) -> Vec<(u64, Offset)> {
        let db = &self.inner.shared.db;
        let meta = meta_cf(db).unwrap();
        let prefix = codec::time_index_prefix(topic, partition);
        let mut opts = ReadOptions::default();
        opts.set_iterate_lower_bound(codec::time_index_key(topic, partition, 0));
        opts.set_iterate_upper_bound(codec::time_index_key(topic, partition, u64::MAX));
        let mut it = db.raw_iterator_cf_opt(&meta, opts);
        it.seek_to_first();
        let mut out = Vec::new();
        while let Some((key, value)) = it.item() {
            let bucket = codec::time_index_bucket(key, prefix.len()).unwrap();
            out.push((bucket, codec::decode_time_index(value).unwrap()));
            it.next();
        }
        out
    }

    /// Deletes a partition's time index (as a log written before the index existed has none).
    #[cfg(test)]
    pub(crate) fn drop_time_index(&self, topic: &TopicName, partition: Partition) {
        let db = &self.inner.shared.db;
        let meta = meta_cf(db).unwrap();
        db.delete_range_cf(
            &meta,
            codec::time_index_key(topic, partition, 0),
            codec::time_index_key(topic, partition, u64::MAX),
        )
        .unwrap();
    }

    /// The topic, created with `default_partitions` if it does not exist.
    pub fn ensure_topic(&self, topic: &TopicName) -> Result<TopicInfo, LogError> {
        self.create_topic(topic, self.inner.shared.cfg.default_partitions)
    }

    /// The topic, created with `partitions` if it does not exist. An existing topic keeps its
    /// partition count (partitions are never added: that would move keys).
    pub fn create_topic(&self, topic: &TopicName, partitions: u32) -> Result<TopicInfo, LogError> {
        self.ensure_topic_state(topic, partitions)
            .map(|state| state.info())
    }

    pub fn topic(&self, topic: &TopicName) -> Option<TopicInfo> {
        self.topic_state(topic).map(|state| state.info())
    }

    /// Every topic, sorted by name.
    pub fn topics(&self) -> Vec<TopicInfo> {
        let mut all: Vec<TopicInfo> = self
            .inner
            .topics
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(|state| state.info())
            .collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// Appends `items` to `topic` (created on first use), durably: the answer comes only
    /// after the WAL holding them is fsynced. All the items are written or none. Concurrent
    /// callers share one synced write (group commit).
    ///
    /// Returns the (partition, offset) of each item, in order. If this future is dropped
    /// after the request was queued, the records may still be written.
    pub async fn append(
        &self,
        topic: &TopicName,
        items: Vec<AppendItem>,
    ) -> Result<Vec<(Partition, Offset)>, LogError> {
        let cfg = &self.inner.shared.cfg;
        if items.is_empty() {
            return Ok(Vec::new());
        }
        if items.len() > cfg.max_records_per_append {
            return Err(LogError::TooManyRecords {
                count: items.len(),
                max: cfg.max_records_per_append,
            });
        }
        let mut bytes = 0usize;
        for item in &items {
            if item.value.len() > cfg.max_record_bytes {
                return Err(LogError::RecordTooLarge {
                    bytes: item.value.len(),
                    max: cfg.max_record_bytes,
                });
            }
            bytes += item.value.len();
        }
        if bytes > cfg.max_batch_bytes {
            return Err(LogError::AppendTooLarge {
                bytes,
                max: cfg.max_batch_bytes,
            });
        }
        let state = self.ensure_topic_state(topic, cfg.default_partitions)?;
        let partitions = state.partition_count();
        let items = items
            .into_iter()
            .map(|item| {
                let partition = match &item.key {
                    Some(key) => partition_for_key(key.as_bytes(), partitions),
                    None => state.round_robin.fetch_add(1, Ordering::Relaxed) % partitions,
                };
                (partition, item.value)
            })
            .collect();

        let tx = self
            .inner
            .tx
            .as_ref()
            .ok_or_else(|| LogError::Unavailable("the log is closing".to_owned()))?;
        let append = writer::Append {
            topic: state,
            items,
            bytes,
        };
        let queue_empty = tx.capacity() == tx.max_capacity();
        let append = match writer::try_inline(&self.inner.shared, queue_empty, append) {
            Ok(written) => return written,
            Err(append) => append,
        };
        let (reply, answer) = oneshot::channel();
        tx.send(AppendRequest { append, reply })
            .await
            .map_err(|_| LogError::Unavailable("the log writer has stopped".to_owned()))?;
        answer
            .await
            .map_err(|_| LogError::Unavailable("the log writer has stopped".to_owned()))?
    }

    /// Reads up to `max` records of one partition from `from`, stopping before the payload
    /// total would pass `max_bytes` (but always returning at least one record when there is
    /// one, however large).
    /// [`Self::read`] answered from memory, when it can be without RocksDB: out of range,
    /// at the end, or from the partition's window of recent records (see `Recent`).
    /// `None` when only a read of the database can answer. Never blocks on I/O.
    pub fn read_recent(
        &self,
        topic: &TopicName,
        partition: Partition,
        from: Offset,
        max: usize,
        max_bytes: usize,
    ) -> Option<ReadResult> {
        let state = self.topic_state(topic)?;
        let part = state.partition(partition).ok()?;
        let end = part.end();
        let earliest = part.earliest();
        if from < earliest || from > end {
            return Some(ReadResult::OutOfRange { earliest, end });
        }
        if from == end || max == 0 {
            return Some(ReadResult::Records {
                records: Vec::new(),
                earliest,
                end,
            });
        }
        let records = lock(&part.recent).read(from, end, max, max_bytes)?;
        // Retention may have moved `earliest` past `from` since it was read above.
        let earliest_now = part.earliest();
        if from < earliest_now {
            return Some(ReadResult::OutOfRange {
                earliest: earliest_now,
                end,
            });
        }
        Some(ReadResult::Records {
            records,
            earliest: earliest_now,
            end,
        })
    }

    pub fn read(
        &self,
        topic: &TopicName,
        partition: Partition,
        from: Offset,
        max: usize,
        max_bytes: usize,
    ) -> Result<ReadResult, LogError> {
        let state = self
            .topic_state(topic)
            .ok_or_else(|| LogError::UnknownTopic(topic.clone()))?;
        let part = state.partition(partition)?;
        // `end` first: every record below it is synced, so the iterator's snapshot, taken
        // after, holds all of them (or fewer at the bottom if retention deleted some).
        let end = part.end();
        let earliest = part.earliest();
        if from < earliest || from > end {
            return Ok(ReadResult::OutOfRange { earliest, end });
        }
        if from == end || max == 0 {
            return Ok(ReadResult::Records {
                records: Vec::new(),
                earliest,
                end,
            });
        }

        let db = &self.inner.shared.db;
        let cf = records_cf(db)?;
        let prefix_len = codec::partition_prefix(topic, partition).len();
        let mut opts = ReadOptions::default();
        opts.set_iterate_upper_bound(codec::record_key(topic, partition, end));
        let mut it = db.raw_iterator_cf_opt(&cf, opts);
        it.seek(codec::record_key(topic, partition, from));

        let mut records: Vec<(Offset, Bytes)> = Vec::new();
        let mut bytes = 0usize;
        let mut expected = from;
        let mut limited = false;
        while let Some((key, value)) = it.item() {
            if records.len() >= max {
                limited = true;
                break;
            }
            let offset = codec::record_key_offset(key, prefix_len)
                .map_err(|e| e.at(topic, partition, expected))?;
            if offset != expected {
                if records.is_empty() {
                    // Retention deleted `from` after we checked it: answered below.
                    break;
                }
                return Err(LogError::Corrupt {
                    what: format!("{topic}/{partition}: record {expected} is missing"),
                });
            }
            let (_, payload) =
                codec::decode_record(value).map_err(|e| e.at(topic, partition, offset))?;
            if !records.is_empty() && bytes.saturating_add(payload.len()) > max_bytes {
                limited = true;
                break;
            }
            bytes = bytes.saturating_add(payload.len());
            records.push((offset, Bytes::copy_from_slice(payload)));
            expected += 1;
            it.next();
        }
        it.status().map_err(LogError::storage)?;

        if records.is_empty() {
            let earliest_now = part.earliest();
            if from < earliest_now {
                return Ok(ReadResult::OutOfRange {
                    earliest: earliest_now,
                    end: part.end(),
                });
            }
            return Err(LogError::Corrupt {
                what: format!("{topic}/{partition}: record {from} is missing"),
            });
        }
        if !limited && expected < end {
            return Err(LogError::Corrupt {
                what: format!("{topic}/{partition}: records {expected}..{end} are missing"),
            });
        }
        Ok(ReadResult::Records {
            records,
            earliest,
            end,
        })
    }

    /// The newest records of a partition appended at or after `since_ms` (the log's wall
    /// clock), at most `max`, newest first, as (append ms, offset, payload): read backwards
    /// from the end, stopping at the first older record (append times are non-decreasing
    /// per partition). For the publish dedup window, refilled at start (DESIGN §8).
    pub fn appended_since(
        &self,
        topic: &TopicName,
        partition: Partition,
        since_ms: u64,
        max: usize,
    ) -> Result<Vec<(u64, Offset, Bytes)>, LogError> {
        let state = self
            .topic_state(topic)
            .ok_or_else(|| LogError::UnknownTopic(topic.clone()))?;
        let part = state.partition(partition)?;
        let (earliest, end) = (part.earliest(), part.end());
        let mut out = Vec::new();
        if end == earliest || max == 0 {
            return Ok(out);
        }
        let db = &self.inner.shared.db;
        let cf = records_cf(db)?;
        let prefix_len = codec::partition_prefix(topic, partition).len();
        let mut opts = ReadOptions::default();
        opts.set_iterate_lower_bound(codec::record_key(topic, partition, earliest));
        opts.set_iterate_upper_bound(codec::record_key(topic, partition, end));
        let mut it = db.raw_iterator_cf_opt(&cf, opts);
        it.seek_to_last();
        while let Some((key, value)) = it.item() {
            if out.len() >= max {
                break;
            }
            let offset = codec::record_key_offset(key, prefix_len)
                .map_err(|e| e.at(topic, partition, end))?;
            let (header, payload) =
                codec::decode_record(value).map_err(|e| e.at(topic, partition, offset))?;
            if header.append_ms < since_ms {
                break;
            }
            out.push((header.append_ms, offset, Bytes::copy_from_slice(payload)));
            it.prev();
        }
        it.status().map_err(LogError::storage)?;
        Ok(out)
    }

    /// (earliest, end) of a partition: the records present are `earliest..end`.
    pub fn offsets(
        &self,
        topic: &TopicName,
        partition: Partition,
    ) -> Result<(Offset, Offset), LogError> {
        let state = self
            .topic_state(topic)
            .ok_or_else(|| LogError::UnknownTopic(topic.clone()))?;
        let part = state.partition(partition)?;
        Ok((part.earliest(), part.end()))
    }

    /// The first offset of a partition whose append time is at or after `time_ms` (ms since
    /// the Unix epoch): the earliest offset for a time before every record, the end for a
    /// time after them all (and for an empty partition).
    ///
    /// The time index narrows the search to the second of `time_ms` (its entry and the next
    /// one), then a binary search over the records' stored append times finds the offset;
    /// append times are non-decreasing along a partition (the writer keeps them so), so the
    /// answer is exact to the millisecond. A missing index entry (a log written before the
    /// index existed, a second retention emptied) only widens the search. Blocking: a few
    /// point reads.
    pub fn offset_for_time(
        &self,
        topic: &TopicName,
        partition: Partition,
        time_ms: u64,
    ) -> Result<Offset, LogError> {
        let state = self
            .topic_state(topic)
            .ok_or_else(|| LogError::UnknownTopic(topic.clone()))?;
        let part = state.partition(partition)?;
        let end = part.end();
        let earliest = part.earliest();
        if earliest >= end {
            return Ok(end);
        }
        let db = &self.inner.shared.db;
        let (lo, hi) = self.time_index_span(topic, partition, time_ms)?;
        let (mut lo, mut hi) = (
            lo.unwrap_or(earliest).max(earliest),
            hi.unwrap_or(end).min(end),
        );
        if lo > hi {
            (lo, hi) = (earliest, end);
        }
        let cf = records_cf(db)?;
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let value = db
                .get_pinned_cf(&cf, codec::record_key(topic, partition, mid))
                .map_err(LogError::storage)?;
            let Some(value) = value else {
                // Retention deleted it meanwhile: the answer is at or after the new earliest.
                let now = part.earliest();
                if mid < now {
                    lo = now.min(hi);
                    continue;
                }
                return Err(LogError::Corrupt {
                    what: format!("{topic}/{partition}: record {mid} is missing"),
                });
            };
            let (header, _) =
                codec::decode_record(&value).map_err(|e| e.at(topic, partition, mid))?;
            if header.append_ms < time_ms {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        Ok(lo)
    }

    /// What the time index says of `time_ms` in a partition: the first offset of the latest
    /// indexed second at or before it (every record before it is older than `time_ms`) and
    /// the first offset of the next indexed second (every record from it on is newer).
    fn time_index_span(
        &self,
        topic: &TopicName,
        partition: Partition,
        time_ms: u64,
    ) -> Result<(Option<Offset>, Option<Offset>), LogError> {
        let db = &self.inner.shared.db;
        let meta = meta_cf(db)?;
        let bucket = codec::time_bucket(time_ms);
        let mut opts = ReadOptions::default();
        opts.set_iterate_lower_bound(codec::time_index_key(topic, partition, 0));
        opts.set_iterate_upper_bound(codec::time_index_key(topic, partition, u64::MAX));
        let mut it = db.raw_iterator_cf_opt(&meta, opts);
        it.seek_for_prev(codec::time_index_key(topic, partition, bucket));
        let before = it.value().map(codec::decode_time_index).transpose()?;
        it.status().map_err(LogError::storage)?;
        it.seek(codec::time_index_key(
            topic,
            partition,
            bucket.saturating_add(1),
        ));
        let after = it.value().map(codec::decode_time_index).transpose()?;
        it.status().map_err(LogError::storage)?;
        Ok((before, after))
    }

    /// The end offset of a partition, updated after every synced append to it. A fetch parked
    /// at the end waits on `changed()`.
    pub fn watch_end(
        &self,
        topic: &TopicName,
        partition: Partition,
    ) -> Result<watch::Receiver<Offset>, LogError> {
        let state = self
            .topic_state(topic)
            .ok_or_else(|| LogError::UnknownTopic(topic.clone()))?;
        Ok(state.partition(partition)?.end.subscribe())
    }

    /// Deletes, in every partition, the oldest records that are older than `retention_ms`
    /// (at `now_wall_ms`) or beyond `retention_bytes_per_partition` of newer payload. Only
    /// prefixes are deleted: `earliest` moves up, nothing in the middle goes. A partition
    /// that fails is reported and the others are still processed.
    ///
    /// Blocking (a few point reads and one synced write per truncated partition).
    pub fn enforce_retention(&self, now_wall_ms: u64) -> Result<RetentionReport, LogError> {
        let cfg = &self.inner.shared.cfg;
        let mut report = RetentionReport::default();
        if cfg.retention_ms.is_none() && cfg.retention_bytes_per_partition.is_none() {
            return Ok(report);
        }
        let _serial = lock(&self.inner.retention_lock);
        let mut topics: Vec<Arc<TopicState>> = self
            .inner
            .topics
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        topics.sort_by(|a, b| a.name.cmp(&b.name));
        for state in topics {
            for partition in 0..state.partition_count() {
                match self.retain_partition(&state, partition, now_wall_ms) {
                    Ok(Some(truncation)) => report.truncated.push(truncation),
                    Ok(None) => {}
                    Err(err) => {
                        tracing::warn!(topic = %state.name, partition, error = %err, "retention failed");
                        report.failed.push((state.name.clone(), partition, err));
                    }
                }
            }
        }
        Ok(report)
    }

    fn retain_partition(
        &self,
        state: &TopicState,
        partition: Partition,
        now_wall_ms: u64,
    ) -> Result<Option<Truncation>, LogError> {
        let cfg = &self.inner.shared.cfg;
        let db = &self.inner.shared.db;
        let topic = &state.name;
        let part = state.partition(partition)?;
        let end = part.end();
        let earliest = part.earliest();
        if earliest >= end {
            return Ok(None);
        }
        let cf = records_cf(db)?;
        let header_at = |offset: Offset| -> Result<(RecordHeader, u64), LogError> {
            let value = db
                .get_pinned_cf(&cf, codec::record_key(topic, partition, offset))
                .map_err(LogError::storage)?
                .ok_or_else(|| LogError::Corrupt {
                    what: format!("{topic}/{partition}: record {offset} is missing"),
                })?;
            let (header, payload) =
                codec::decode_record(&value).map_err(|e| e.at(topic, partition, offset))?;
            Ok((header, payload.len() as u64))
        };

        // Both searches rely on append times and positions being non-decreasing along the
        // partition (the writer guarantees it), so each predicate splits `earliest..end`
        // into a deletable prefix and a kept suffix.
        // Where the partition's payload ends: what the size rule and the reclaim count need.
        let position_end = || -> Result<u64, LogError> {
            let (last, last_len) = header_at(end - 1)?;
            Ok(last.position.saturating_add(last_len))
        };
        let mut cut = earliest;
        if let Some(retention_ms) = cfg.retention_ms {
            let cutoff = now_wall_ms.saturating_sub(retention_ms);
            let (mut lo, mut hi) = (earliest, end);
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if header_at(mid)?.0.append_ms < cutoff {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            cut = cut.max(lo);
        }
        if let Some(max_bytes) = cfg.retention_bytes_per_partition {
            let position_end = position_end()?;
            let (mut lo, mut hi) = (earliest, end);
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if position_end.saturating_sub(header_at(mid)?.0.position) <= max_bytes {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            cut = cut.max(lo);
        }
        if cut <= earliest {
            return Ok(None);
        }
        let position_at = |offset: Offset| -> Result<u64, LogError> {
            if offset >= end {
                position_end()
            } else {
                Ok(header_at(offset)?.0.position)
            }
        };
        let deleted_bytes = position_at(cut)?.saturating_sub(position_at(earliest)?);
        // Time-index entries of the seconds wholly deleted go with them: every second before
        // the first kept record's (or, when none is kept, up to the last deleted record's).
        // Entries the writer adds meanwhile are of later seconds and stay.
        let kept_from_bucket = if cut < end {
            codec::time_bucket(header_at(cut)?.0.append_ms)
        } else {
            codec::time_bucket(header_at(end - 1)?.0.append_ms).saturating_add(1)
        };

        // Readers see the new earliest before the records go, so none of them can find a
        // hole; if the write fails the old value comes back (only this pass moves it).
        part.earliest.store(cut, Ordering::Release);
        let meta = meta_cf(db)?;
        let mut batch = WriteBatch::default();
        batch.delete_range_cf(
            &cf,
            codec::record_key(topic, partition, 0),
            codec::record_key(topic, partition, cut),
        );
        batch.delete_range_cf(
            &meta,
            codec::time_index_key(topic, partition, 0),
            codec::time_index_key(topic, partition, kept_from_bucket),
        );
        batch.put_cf(
            &meta,
            codec::earliest_meta_key(topic, partition),
            codec::encode_earliest(cut),
        );
        let mut opts = WriteOptions::default();
        opts.set_sync(true);
        if let Err(err) = db.write_opt(batch, &opts) {
            part.earliest.store(earliest, Ordering::Release);
            return Err(LogError::storage(err));
        }

        // A range tombstone frees nothing until a compaction rewrites the files under it,
        // which for a quiet partition may be never; past the threshold, compact it now.
        // Not exclusive, so RocksDB's own compactions (and thus appends) go on meanwhile.
        let unreclaimed = part
            .unreclaimed_bytes
            .fetch_add(deleted_bytes, Ordering::Relaxed)
            .saturating_add(deleted_bytes);
        if unreclaimed >= cfg.reclaim_after_bytes {
            part.unreclaimed_bytes.store(0, Ordering::Relaxed);
            let mut compact = rocksdb::CompactOptions::default();
            compact.set_exclusive_manual_compaction(false);
            db.compact_range_cf_opt(
                &cf,
                Some(codec::record_key(topic, partition, 0)),
                Some(codec::record_key(topic, partition, cut)),
                &compact,
            );
            tracing::debug!(%topic, partition, bytes = unreclaimed, "reclaimed retained-away space");
        }
        Ok(Some(Truncation {
            topic: topic.clone(),
            partition,
            earliest_before: earliest,
            earliest_after: cut,
        }))
    }

    fn topic_state(&self, topic: &TopicName) -> Option<Arc<TopicState>> {
        self.inner
            .topics
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(topic)
            .cloned()
    }

    fn ensure_topic_state(
        &self,
        topic: &TopicName,
        partitions: u32,
    ) -> Result<Arc<TopicState>, LogError> {
        if let Some(state) = self.topic_state(topic) {
            return Ok(state);
        }
        let cfg = &self.inner.shared.cfg;
        if partitions == 0 || partitions > cfg.max_partitions {
            return Err(LogError::InvalidPartitionCount {
                partitions,
                max: cfg.max_partitions,
            });
        }
        let _serial = lock(&self.inner.create_lock);
        if let Some(state) = self.topic_state(topic) {
            return Ok(state);
        }
        let count = self
            .inner
            .topics
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .len();
        if count >= cfg.max_topics {
            return Err(LogError::TooManyTopics {
                max: cfg.max_topics,
            });
        }
        let db = &self.inner.shared.db;
        let meta = codec::TopicMeta {
            partitions,
            created_ms: cfg.clock.now_ms(),
        };
        let mut opts = WriteOptions::default();
        opts.set_sync(true);
        db.put_cf_opt(
            &meta_cf(db)?,
            codec::topic_meta_key(topic),
            codec::encode_topic_meta(meta),
            &opts,
        )
        .map_err(LogError::storage)?;
        let tails = (0..partitions).map(|_| (0, Tail::default())).collect();
        let state = Arc::new(TopicState::new(topic.clone(), tails));
        self.inner
            .shared
            .partitions_total
            .fetch_add(u64::from(partitions), Ordering::Relaxed);
        self.inner
            .topics
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(topic.clone(), state.clone());
        tracing::info!(%topic, partitions, "created topic");
        Ok(state)
    }
}

#[cfg(feature = "rocksdb")]
fn records_cf(db: &DB) -> Result<&rocksdb::ColumnFamily, LogError> {
    db.cf_handle(RECORDS_CF)
        .ok_or_else(|| LogError::Storage(format!("column family {RECORDS_CF} is missing")))
}

#[cfg(feature = "rocksdb")]
fn meta_cf(db: &DB) -> Result<&rocksdb::ColumnFamily, LogError> {
    db.cf_handle(META_CF)
        .ok_or_else(|| LogError::Storage(format!("column family {META_CF} is missing")))
}

/// Rebuilds every topic from the meta column family and the last record of each partition.
#[cfg(feature = "rocksdb")]
fn recover_topics(db: &DB) -> Result<HashMap<TopicName, Arc<TopicState>>, LogError> {
    let meta = meta_cf(db)?;
    let records = records_cf(db)?;
    let mut topics = HashMap::new();

    let prefix = codec::topic_meta_prefix();
    let mut opts = ReadOptions::default();
    opts.set_iterate_lower_bound(prefix.to_vec());
    opts.set_iterate_upper_bound(vec![prefix[0] + 1]);
    let mut it = db.raw_iterator_cf_opt(&meta, opts);
    it.seek_to_first();
    let mut found = Vec::new();
    while let Some((key, value)) = it.item() {
        let name = codec::topic_from_meta_key(key)?;
        let topic_meta = codec::decode_topic_meta(value).map_err(|e| match e {
            LogError::Corrupt { what } => LogError::Corrupt {
                what: format!("topic {name}: {what}"),
            },
            other => other,
        })?;
        found.push((name, topic_meta));
        it.next();
    }
    it.status().map_err(LogError::storage)?;
    drop(it);

    for (name, topic_meta) in found {
        if topic_meta.partitions == 0 || topic_meta.partitions > PARTITIONS_HARD_MAX {
            return Err(LogError::Corrupt {
                what: format!(
                    "topic {name}: stored partition count {}",
                    topic_meta.partitions
                ),
            });
        }
        let mut tails = Vec::with_capacity(topic_meta.partitions as usize);
        for partition in 0..topic_meta.partitions {
            let earliest = match db
                .get_pinned_cf(&meta, codec::earliest_meta_key(&name, partition))
                .map_err(LogError::storage)?
            {
                Some(value) => {
                    codec::decode_earliest(&value).map_err(|e| e.at(&name, partition, 0))?
                }
                None => 0,
            };
            let mut opts = ReadOptions::default();
            opts.set_iterate_lower_bound(codec::record_key(&name, partition, 0));
            opts.set_iterate_upper_bound(codec::record_key(&name, partition, u64::MAX));
            let mut it = db.raw_iterator_cf_opt(&records, opts);
            it.seek_to_last();
            let mut tail = Tail {
                next: earliest,
                ..Tail::default()
            };
            if let Some((key, value)) = it.item() {
                let prefix_len = codec::partition_prefix(&name, partition).len();
                let offset = codec::record_key_offset(key, prefix_len)
                    .map_err(|e| e.at(&name, partition, 0))?;
                let (header, payload) =
                    codec::decode_record(value).map_err(|e| e.at(&name, partition, offset))?;
                // Deletions move `earliest` in the same write, so a last record below it
                // cannot exist; if it did, `earliest` is the safer end.
                if offset >= earliest {
                    tail = Tail {
                        next: offset + 1,
                        last_ms: header.append_ms,
                        position: header.position.saturating_add(payload.len() as u64),
                    };
                }
            }
            it.status().map_err(LogError::storage)?;
            tails.push((earliest, tail));
        }
        tracing::debug!(topic = %name, partitions = topic_meta.partitions, "recovered topic");
        topics.insert(name.clone(), Arc::new(TopicState::new(name, tails)));
    }
    Ok(topics)
}
