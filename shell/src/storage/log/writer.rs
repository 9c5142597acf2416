//! The group-commit writer: one std thread writes appends, and with `sync_interval_ms` a
//! small append that finds the writer idle is written by its caller ([`try_inline`]).
//!
//! Publishers queue requests on a bounded channel (a full queue makes `append` wait: that is
//! the back-pressure). The writer takes one request, then everything else already queued up
//! to `max_batch_bytes`, assigns offsets, writes the lot as ONE RocksDB `WriteBatch` with
//! `sync = true`, and only then publishes the new end offsets and answers every request. One
//! WAL fsync is thus shared by all publishers waiting at that moment, which is what keeps
//! throughput up when many publish at once.
//!
//! With `sync_interval_ms` the write is not fsynced: it is answered once RocksDB has
//! written it to the operating system, and the [`Syncer`] thread fsyncs the WAL once per
//! interval in which something was written.
//!
//! Offsets are assigned here and nowhere else, under the one [`WriterState`] lock, so they
//! are dense per partition.
//! If a write fails, nothing of that batch is published (the tails roll back) and the writer
//! refuses every later append: RocksDB may hold part of a failed WAL write that a reopen will
//! replay, so reusing those offsets in this process could give two payloads one offset.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use rocksdb::{WriteBatch, WriteOptions};
use tokio::sync::{mpsc, oneshot};
use unimesh_core::{Offset, Partition, TopicName};

use super::codec::{self, RecordHeader};
use super::{lock, LogError, Shared, TopicState, META_CF, RECORDS_CF};

/// Where a partition's next record goes. Owned by the writer thread once it has seen the
/// partition; the topic carries the value recovered at open (or zero for a new topic).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tail {
    pub next: Offset,
    /// Append times are kept non-decreasing per partition (a wall clock stepping back must not
    /// make retention by age cut in the middle of a partition, nor a seek by time land in
    /// it).
    pub last_ms: u64,
    /// Payload bytes appended before `next` (see the record header's `position`).
    pub position: u64,
}

/// One caller's records, placed on partitions, not yet given offsets.
pub(crate) struct Append {
    pub topic: Arc<TopicState>,
    pub items: Vec<(Partition, Bytes)>,
    pub bytes: usize,
}

pub(crate) struct AppendRequest {
    pub append: Append,
    pub reply: oneshot::Sender<Result<Vec<(Partition, Offset)>, LogError>>,
}

/// What the writer keeps from one group to the next: each partition's tail, and scratch
/// buffers. It sits behind a mutex in `Shared`: the writer thread holds it for a group,
/// and with `sync_interval_ms` a small append that finds it free writes on its caller's
/// thread ([`try_inline`]). Offsets are assigned only while it is held.
#[derive(Default)]
pub(crate) struct WriterState {
    tails: HashMap<(TopicName, Partition), Tail>,
    key: Vec<u8>,
    value: Vec<u8>,
}

/// The most bytes an append may carry to be written on its caller's thread: one event or
/// a few. Larger batches go to the writer thread, which runs beside the async workers.
pub(crate) const INLINE_MAX_BYTES: usize = 16 << 10;

/// One group to write: appends in order, their payload bytes, and whether the caller's
/// thread writes it (inline: never waits out a write stall).
struct Group<'a> {
    appends: &'a [Append],
    bytes: usize,
    inline: bool,
}

/// Each append's (partition, offset) list, in order, or why none was written.
type Written = Result<Vec<Vec<(Partition, Offset)>>, Refused>;

/// Why a group was not written.
enum Refused {
    /// An inline write met a RocksDB write stall and did not wait (nothing was written).
    Stalled,
    Failed(LogError),
}

impl Refused {
    /// What the writer thread answers. It writes with `no_slowdown` off, so RocksDB waits
    /// out a stall there and `Stalled` never comes back to it.
    fn into_error(self) -> LogError {
        match self {
            Refused::Failed(err) => err,
            Refused::Stalled => {
                LogError::Unavailable("a log write refused to wait out a write stall".to_owned())
            }
        }
    }
}

pub(crate) fn run(shared: Arc<Shared>, mut rx: mpsc::Receiver<AppendRequest>) {
    let max_batch_bytes = shared.cfg.max_batch_bytes;
    while let Some(first) = rx.blocking_recv() {
        let mut bytes = first.append.bytes;
        let mut group = vec![first];
        while bytes < max_batch_bytes {
            match rx.try_recv() {
                Ok(next) => {
                    bytes += next.append.bytes;
                    group.push(next);
                }
                Err(_) => break,
            }
        }
        let (appends, replies): (Vec<Append>, Vec<_>) =
            group.into_iter().map(|r| (r.append, r.reply)).unzip();
        let written = {
            let mut state = lock(&shared.writer);
            let group = Group {
                appends: &appends,
                bytes,
                inline: false,
            };
            write_group(&shared, &mut state, group)
        };
        // A publisher that gave up waiting dropped its receiver: nothing to tell it.
        match written {
            Ok(results) => {
                for (reply, result) in replies.into_iter().zip(results) {
                    let _ = reply.send(Ok(result));
                }
            }
            Err(refused) => {
                let err = refused.into_error();
                for reply in replies {
                    let _ = reply.send(Err(err.clone()));
                }
            }
        }
    }
}

/// With `sync_interval_ms`, writes `append` on the caller's thread when that costs no
/// waiting: it is small (at most [`INLINE_MAX_BYTES`]), nothing is queued for the writer
/// and the writer state is free. A small append then makes no trip to the writer thread
/// and back (two wake-ups, most of the cost of a one-event publish on a busy machine). The
/// write is made with RocksDB's `no_slowdown`, so a write stall never parks the caller (an
/// async worker): it answers `Err(append)`, as every other case does, and the caller
/// queues the append for the writer, which waits out the stall as before.
pub(crate) fn try_inline(
    shared: &Shared,
    queue_empty: bool,
    append: Append,
) -> Result<Result<Vec<(Partition, Offset)>, LogError>, Append> {
    if shared.cfg.sync_interval_ms.is_none() || !queue_empty || append.bytes > INLINE_MAX_BYTES {
        return Err(append);
    }
    let Ok(mut state) = shared.writer.try_lock() else {
        return Err(append);
    };
    let group = Group {
        appends: std::slice::from_ref(&append),
        bytes: append.bytes,
        inline: true,
    };
    match write_group(shared, &mut state, group) {
        Ok(mut results) => {
            shared.inline_appends.fetch_add(1, Ordering::Relaxed);
            Ok(Ok(results.pop().unwrap_or_default()))
        }
        Err(Refused::Failed(err)) => Ok(Err(err)),
        Err(Refused::Stalled) => Err(append),
    }
}

/// Writes one group, or refuses it whole: the log's fault once a write failed (every later
/// group too), or a stall met by an inline write.
fn write_group(shared: &Shared, state: &mut WriterState, group: Group<'_>) -> Written {
    let refused = group.appends.len() as u64;
    if let Some(reason) = shared.fault.get() {
        shared.write_failures.fetch_add(refused, Ordering::Relaxed);
        return Err(Refused::Failed(LogError::Unavailable(reason.clone())));
    }
    match commit(shared, state, group) {
        Ok(results) => Ok(results),
        Err(Refused::Stalled) => Err(Refused::Stalled),
        Err(Refused::Failed(err)) => {
            let reason = format!("a log write failed, appends are refused until restart: {err}");
            tracing::error!(error = %err, "embedded log write failed");
            // Set once, by whichever writer failed first; a reopen starts with a fresh
            // `Shared`.
            let _ = shared.fault.set(reason);
            shared.write_failures.fetch_add(refused, Ordering::Relaxed);
            Err(Refused::Failed(err))
        }
    }
}

/// Writes one group durably; returns each append's (partition, offset) list, in order.
fn commit(shared: &Shared, state: &mut WriterState, group: Group<'_>) -> Written {
    let Group {
        appends,
        bytes,
        inline,
    } = group;
    let failed = |e: String| Refused::Failed(LogError::Storage(e));
    let cf = shared
        .db
        .cf_handle(RECORDS_CF)
        .ok_or_else(|| failed(format!("column family {RECORDS_CF} is missing")))?;
    let meta = shared
        .db
        .cf_handle(META_CF)
        .ok_or_else(|| failed(format!("column family {META_CF} is missing")))?;
    let now_ms = shared.cfg.clock.now_ms();
    let WriterState { tails, key, value } = state;
    // Tails advance in this scratch map and are stored back only after the write succeeded.
    let mut touched: HashMap<(TopicName, Partition), (Arc<TopicState>, Tail)> = HashMap::new();
    let items: usize = appends.iter().map(|r| r.items.len()).sum();
    // Keys are at most a topic name plus 13 bytes; RocksDB adds a few bytes per entry.
    let per_record = codec::RECORD_HEADER_LEN + unimesh_core::types::MAX_NAME_BYTES + 32;
    let mut batch = WriteBatch::with_capacity_bytes(bytes + items * per_record);
    let mut results = Vec::with_capacity(appends.len());
    for request in appends {
        let mut assigned = Vec::with_capacity(request.items.len());
        for (partition, payload) in &request.items {
            let id = (request.topic.name.clone(), *partition);
            let (_, tail) = touched.entry(id.clone()).or_insert_with(|| {
                let tail = tails
                    .get(&id)
                    .copied()
                    .unwrap_or_else(|| request.topic.initial_tail(*partition));
                (request.topic.clone(), tail)
            });
            let header = RecordHeader {
                append_ms: now_ms.max(tail.last_ms),
                position: tail.position,
            };
            codec::record_key_into(key, &request.topic.name, *partition, tail.next);
            codec::encode_record_into(value, header, payload);
            batch.put_cf(&cf, &*key, &*value);
            // The first record of a new second gets a time-index entry, in the same batch:
            // the index never names a record that is not there.
            let bucket = codec::time_bucket(header.append_ms);
            if bucket > codec::time_bucket(tail.last_ms) {
                batch.put_cf(
                    &meta,
                    codec::time_index_key(&request.topic.name, *partition, bucket),
                    codec::encode_time_index(tail.next),
                );
            }
            assigned.push((*partition, tail.next));
            tail.next += 1;
            tail.last_ms = header.append_ms;
            tail.position = tail.position.saturating_add(payload.len() as u64);
        }
        results.push(assigned);
    }

    #[cfg(test)]
    if inline && shared.stall_next_inline.swap(false, Ordering::Relaxed) {
        return Err(Refused::Stalled);
    }
    #[cfg(test)]
    if shared
        .fail_next_writes
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
        .is_ok()
    {
        return Err(failed("injected write failure (test)".to_owned()));
    }
    let sync_each = shared.cfg.sync_interval_ms.is_none();
    let mut opts = WriteOptions::default();
    opts.set_sync(sync_each);
    opts.set_no_slowdown(inline);
    match shared.db.write_opt(batch, &opts) {
        Ok(()) => {}
        Err(e) if inline && e.kind() == rocksdb::ErrorKind::Incomplete => {
            return Err(Refused::Stalled)
        }
        Err(e) => return Err(failed(e.into_string())),
    }

    if sync_each {
        shared.synced_writes.fetch_add(1, Ordering::Relaxed);
    } else {
        // In the operating system's hands now: the syncer fsyncs it within its interval.
        shared.unsynced.store(true, Ordering::Release);
    }
    shared
        .records_appended
        .fetch_add(items as u64, Ordering::Relaxed);
    // The new records join the windows of recent records before their end is published,
    // so a reader that sees the new end finds them there.
    let partitions = shared.partitions_total.load(Ordering::Relaxed).max(1);
    let cap = usize::try_from(shared.cfg.read_cache_bytes as u64 / partitions).unwrap_or(0);
    if cap > 0 {
        for (request, assigned) in appends.iter().zip(&results) {
            for ((partition, payload), &(_, offset)) in request.items.iter().zip(assigned) {
                request.topic.remember(*partition, offset, payload, cap);
            }
        }
    }
    for (id, (topic, tail)) in touched {
        topic.publish_end(id.1, tail.next);
        tails.insert(id, tail);
    }
    Ok(results)
}

/// The WAL syncer of `sync_interval_ms`: one thread that fsyncs the WAL every interval in
/// which a write left it unsynced, and once more when stopped (after the writer stopped).
/// A failed fsync is a failed write: appends are refused from then on (see [`run`]).
pub(crate) struct Syncer {
    stop: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<Result<(), LogError>>,
}

impl Syncer {
    pub(crate) fn start(shared: Arc<Shared>, interval_ms: u64) -> Result<Self, LogError> {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let interval = std::time::Duration::from_millis(interval_ms);
        let thread = std::thread::Builder::new()
            .name("unimesh-log-syncer".to_owned())
            .spawn(move || loop {
                let last = match stopped.recv_timeout(interval) {
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => false,
                    // Stopped (or the handle is gone): one last sync, then out.
                    Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => true,
                };
                let synced = sync_wal(&shared);
                if last || synced.is_err() {
                    return synced;
                }
            })
            .map_err(|e| LogError::Unavailable(format!("cannot start the WAL syncer: {e}")))?;
        Ok(Self { stop, thread })
    }

    /// Stops the thread after a last sync; that sync's failure, if any.
    pub(crate) fn stop(self) -> Result<(), LogError> {
        let _ = self.stop.send(());
        match self.thread.join() {
            Ok(result) => result,
            Err(_) => Err(LogError::Unavailable(
                "the WAL syncer thread panicked".to_owned(),
            )),
        }
    }
}

/// Fsyncs the WAL if a write left it unsynced. A failure sets the log's fault.
fn sync_wal(shared: &Shared) -> Result<(), LogError> {
    if !shared.unsynced.swap(false, Ordering::AcqRel) {
        return Ok(());
    }
    match shared.db.flush_wal(true) {
        Ok(()) => {
            shared.synced_writes.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
        Err(e) => {
            let err = LogError::Storage(e.into_string());
            tracing::error!(error = %err, "embedded log WAL sync failed");
            let _ = shared.fault.set(format!(
                "a log WAL sync failed, appends are refused until restart: {err}"
            ));
            Err(err)
        }
    }
}
