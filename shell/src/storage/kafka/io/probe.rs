//! The leader-epoch probe: reads a partition's records to learn their leader epochs, for the
//! rules of `rules/epochs.rs` (librdkafka's side).

use std::time::{Duration, Instant};

use madsim_rdkafka::consumer::Consumer;

use super::client_log::{ClientLog, LoggedConsumer};
use madsim_rdkafka::error::{KafkaError, RDKafkaErrorCode};
use madsim_rdkafka::message::BorrowedMessage;
use madsim_rdkafka::{Message, Offset as KOffset, TopicPartitionList};
use unimesh_core::{Offset, Partition};

use crate::storage::kafka::rules::epochs::{read_looking_back, FirstRecord, Read};
use crate::storage::kafka::{ClientRole, KafkaSettings};
use crate::storage::ports::StorageError;

/// The leader epoch of a record's batch, `None` when the broker reports none.
pub fn leader_epoch(m: &BorrowedMessage<'_>) -> Option<i32> {
    // SAFETY: `m.ptr()` is the live message `m` borrows; the call only reads it.
    let e = unsafe { madsim_rdkafka::bindings::rd_kafka_message_leader_epoch(m.ptr()) };
    (e >= 0).then_some(e)
}

/// How long a probe's read may stay silent before the probe's own fetch answers judge
/// it. Long enough that a loaded broker's first answer after an assignment comes
/// within it: judged too early, a read looks back needlessly, each look-back waits as
/// long again, and the lane's check holds up its group's consumer thread (0.5 s made
/// a loaded mock cluster's checks take 4 s and more).
const QUIET: Duration = Duration::from_millis(3_000);

/// At most this many leftovers of an earlier probe are drained before a probe.
const MAX_STALE_POLLS: usize = 10_000;

/// What a probe learns of the record it was after.
struct Hit {
    offset: Offset,
    epoch: Option<i32>,
    timestamp_ms: Option<i64>,
}

/// A consumer outside any group that reads single records, to learn their epochs (and,
/// for a seek by time, their timestamps).
pub struct EpochProbe {
    consumer: LoggedConsumer,
    timeout: Duration,
}

impl EpochProbe {
    pub async fn new(settings: &KafkaSettings) -> Result<Self, StorageError> {
        let mut c = settings.client_config(ClientRole::Consumer);
        c.set("group.id", format!("{}epoch-probe", settings.group_prefix))
            // Named apart from the instance's other clients (in the broker's logs and
            // request headers).
            .set("client.id", format!("{}-epoch-probe", settings.instance))
            .set("enable.auto.commit", "false")
            .set("enable.partition.eof", "true")
            .set("isolation.level", "read_committed")
            .set("auto.offset.reset", "error")
            // One record is all a probe wants.
            .set("queued.min.messages", "1")
            .set("fetch.wait.max.ms", "10");
        let consumer: LoggedConsumer = c
            .create_with_context(ClientLog::new("leader-epoch probe"))
            .await
            .map_err(|e| StorageError::failed("cannot create the leader-epoch probe", e))?;
        Ok(Self {
            consumer,
            timeout: settings.request_timeout,
        })
    }

    /// The first record at or after `from` in `topic`/`partition`, read before `end`
    /// (the log's end: nothing is read from there), looking back where the broker's
    /// answer may have skipped records ([`read_looking_back`]; never below
    /// `earliest`). With no `end` (a claimed end is being checked,
    /// `evident_end`) the read is unbounded, and a broker that answers "offset
    /// out of range" says no record is there.
    pub fn first_at(
        &self,
        topic: &str,
        partition: Partition,
        from: Offset,
        earliest: Offset,
        end: Option<Offset>,
    ) -> Result<FirstRecord, StorageError> {
        if end.is_some_and(|end| from >= end) {
            return Ok(None);
        }
        Ok(self.read(topic, partition, from, earliest, end)?.hit)
    }

    /// The first record at or after `from` before `end`, with its timestamp in ms
    /// (`None` when the record carries none), read as [`Self::first_at`] reads.
    pub fn first_stamped_at(
        &self,
        topic: &str,
        partition: Partition,
        from: Offset,
        earliest: Offset,
        end: Offset,
    ) -> Result<Option<(Offset, Option<i64>)>, StorageError> {
        if from >= end {
            return Ok(None);
        }
        let read = read_looking_back(from, earliest, |at, target| {
            self.scan(topic, partition, at, target, earliest, false)
                .map(|(first, hit)| (first, hit.map(|h| (h.offset, h.timestamp_ms))))
        })?;
        Ok(read.hit)
    }

    /// [`read_looking_back`] through this probe: where to read from so that
    /// the stream holds every record at or after `from`, and the first of them.
    pub fn read(
        &self,
        topic: &str,
        partition: Partition,
        from: Offset,
        earliest: Offset,
        end: Option<Offset>,
    ) -> Result<Read, StorageError> {
        read_looking_back(from, earliest, |at, target| {
            self.scan(topic, partition, at, target, earliest, end.is_none())
                .map(|(first, hit)| (first, hit.map(|h| (h.offset, h.epoch))))
        })
    }

    /// The partition's high watermark as the last fetch answer of this probe gave it
    /// (librdkafka's cache; `None` before any answer).
    fn fetched_high(&self, topic: &str, partition: Partition) -> Option<i64> {
        let topic = std::ffi::CString::new(topic).ok()?;
        let (mut low, mut high) = (-1i64, -1i64);
        // SAFETY: the handle is this probe's live consumer; `topic` is a valid C
        // string for the call; the call only writes the two integers.
        let err = unsafe {
            madsim_rdkafka::bindings::rd_kafka_get_watermark_offsets(
                self.consumer.client().native_client().ptr(),
                topic.as_ptr(),
                partition as i32,
                &mut low,
                &mut high,
            )
        };
        (err == madsim_rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR && high >= 0)
            .then_some(high)
    }

    /// Reads `topic`/`partition` from `from`: the first record read, and the first
    /// record at or after `target` with its leader epoch. `unbounded`: an "offset out
    /// of range" answer reads as no record.
    ///
    /// A read that stays silent for [`QUIET`] is judged by the high watermark of the
    /// probe's own fetch answers: at or past it, no record follows (tansu answers a
    /// fetch past its end with nothing, not "out of range"); below it, the broker
    /// skipped what lies there (tansu answers a read from inside the last batch with
    /// nothing), which reads as nothing read, so the caller looks back — except from
    /// the log's earliest, where there is no further back: an error, never a verdict.
    fn scan(
        &self,
        topic: &str,
        partition: Partition,
        from: Offset,
        target: Offset,
        earliest: Offset,
        unbounded: bool,
    ) -> Result<(Option<Offset>, Option<Hit>), StorageError> {
        // Whatever an earlier probe left queued is not an answer to this one
        // (librdkafka drops what an unassign outdated; this makes sure, bounded).
        for _ in 0..MAX_STALE_POLLS {
            if self.consumer.poll(Duration::ZERO).is_none() {
                break;
            }
        }
        let probing = || format!("leader-epoch probe of {topic}/{partition}");
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition as i32, KOffset::Offset(from as i64))
            .map_err(|e| StorageError::failed(&probing(), e))?;
        self.consumer
            .assign(&tpl)
            .map_err(|e| StorageError::failed(&probing(), e))?;
        let deadline = Instant::now() + self.timeout;
        let mut first = None;
        let mut quiet_since = Instant::now();
        let answer = loop {
            if Instant::now() > deadline {
                break Err(StorageError::unavailable(format!(
                    "leader-epoch probe of {topic}/{partition} at {from}: no answer within {:?}",
                    self.timeout
                )));
            }
            match self.consumer.poll(Duration::from_millis(20)) {
                None if quiet_since.elapsed() >= QUIET => {
                    match self.fetched_high(topic, partition) {
                        Some(high) if from as i64 >= high => break Ok((first, None)),
                        Some(_) if first.is_none() && from > earliest => {
                            break Ok((None, None))
                        }
                        Some(high) if first.is_none() => {
                            break Err(StorageError::unavailable(format!(
                                "leader-epoch probe of {topic}/{partition} at {from}: the broker returns nothing below its high watermark {high}"
                            )))
                        }
                        _ => {}
                    }
                }
                None => {}
                Some(Err(KafkaError::PartitionEOF(p))) if p == partition as i32 => {
                    break Ok((first, None))
                }
                Some(Err(e))
                    if unbounded
                        && matches!(
                            e.rdkafka_error_code(),
                            Some(
                                RDKafkaErrorCode::AutoOffsetReset
                                    | RDKafkaErrorCode::OffsetOutOfRange
                            )
                        ) =>
                {
                    break Ok((first, None))
                }
                Some(Err(e)) => {
                    break Err(StorageError::failed(
                        &format!("leader-epoch probe of {topic}/{partition} at {from}"),
                        e,
                    ))
                }
                // Anything else is left over from an earlier probe.
                Some(Ok(m))
                    if m.topic() == topic
                        && m.partition() == partition as i32
                        && m.offset() >= from as i64 =>
                {
                    let o = m.offset() as Offset;
                    first.get_or_insert(o);
                    quiet_since = Instant::now();
                    if o >= target {
                        let hit = Hit {
                            offset: o,
                            epoch: leader_epoch(&m),
                            timestamp_ms: m.timestamp().to_millis(),
                        };
                        break Ok((first, Some(hit)));
                    }
                }
                Some(Ok(_)) => {}
            }
        };
        let _ = self.consumer.unassign();
        answer
    }
}
