//! Seek by time on Kafka: librdkafka's offsets-for-times (Kafka's ListOffsets by
//! timestamp), through a consumer outside every group made at the first lookup. The broker
//! answers the first offset whose record timestamp is at or after the time (the record's
//! CreateTime unless the topic logs append time: the producer's clock), or none when every
//! record is older: then the partition's end.
//!
//! A broker's answer is a claim (docs/DESIGN.md §8): it is checked against the records on
//! both sides of it, read by a leader-epoch probe ([`EpochProbe::first_stamped_at`]), and
//! a claim the records refute is replaced by a binary search over the records' timestamps
//! ([`resolve`]). tansu 0.6.0 answers offset 0 for a time after every record; librdkafka's
//! mock cluster answers "none" for every time.

use std::sync::{Arc, Mutex};

use madsim_rdkafka::consumer::{BaseConsumer, Consumer};
use madsim_rdkafka::error::KafkaError;
use madsim_rdkafka::{Offset as KOffset, TopicPartitionList};
use madsim_tokio as tokio;
use unimesh_core::{Offset, Partition, TopicName};

use super::probe::EpochProbe;
use super::properties::ClientRole;
use crate::storage::kafka::rules::epochs::first_where;
use crate::storage::kafka::KafkaSettings;
use crate::storage::ports::StorageError;

/// The lookup consumer and the probe that checks its answers, made on first use.
#[derive(Default)]
pub(super) struct TimeLookup {
    consumer: tokio::sync::OnceCell<BaseConsumer>,
    probe: Arc<Mutex<Option<EpochProbe>>>,
}

/// What the broker answered for one partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Found {
    /// The first offset at or after the time.
    At(Offset),
    /// No record is that new: the partition's end.
    AfterEnd,
}

/// Why the broker gave no answer for one partition (the seek then searches the records).
#[derive(Clone, Debug, thiserror::Error)]
pub(super) enum NoClaim {
    #[error("offsets-for-times failed: {0}")]
    Failed(#[source] KafkaError),
    #[error("the answer names no such partition")]
    NoSuchPartition,
    #[error("offsets-for-times refused: {0}")]
    Refused(#[source] KafkaError),
    #[error("answered {0:?}")]
    NotAnOffset(KOffset),
}

/// Where a seek by time goes, and whether the broker's claim held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Resolved {
    pub offset: Offset,
    pub claim_held: bool,
}

impl TimeLookup {
    async fn consumer(&self, settings: &KafkaSettings) -> Result<&BaseConsumer, StorageError> {
        self.consumer
            .get_or_try_init(|| async {
                let mut c = settings.client_config(ClientRole::Consumer);
                c.set("group.id", format!("{}time-lookup", settings.group_prefix))
                    .set("enable.auto.commit", "false");
                c.create().await.map_err(|e| {
                    StorageError::failed("cannot create the Kafka time-lookup client", e)
                })
            })
            .await
    }

    /// What the broker claims for `time_ms` in `topic`/`partition`; [`NoClaim`] says why it
    /// gave no answer.
    pub(super) async fn claim(
        &self,
        settings: &KafkaSettings,
        topic: &TopicName,
        partition: Partition,
        time_ms: u64,
    ) -> Result<Result<Found, NoClaim>, StorageError> {
        let consumer = self.consumer(settings).await?;
        let at = i64::try_from(time_ms).unwrap_or(i64::MAX);
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic.as_str(), partition as i32, KOffset::Offset(at))
            .map_err(|e| StorageError::Invalid(format!("{topic}/{partition}: {e}")))?;
        let answer = match consumer
            .offsets_for_times(tpl, settings.request_timeout)
            .await
        {
            Ok(a) => a,
            Err(e) => return Ok(Err(NoClaim::Failed(e))),
        };
        let Some(elem) = answer.find_partition(topic.as_str(), partition as i32) else {
            return Ok(Err(NoClaim::NoSuchPartition));
        };
        if let Err(e) = elem.error() {
            return Ok(Err(NoClaim::Refused(e)));
        }
        Ok(found(elem.offset()).ok_or(NoClaim::NotAnOffset(elem.offset())))
    }

    /// Checks `claim` against the records of `[earliest, end)` and searches them when it
    /// does not hold (or there is none). Blocking reads, off the async workers.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn resolve(
        &self,
        settings: &KafkaSettings,
        topic: &TopicName,
        partition: Partition,
        time_ms: u64,
        claim: Option<Found>,
        (earliest, end): (Offset, Offset),
    ) -> Result<Resolved, StorageError> {
        let made = self
            .probe
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some();
        if !made {
            let probe = EpochProbe::new(settings).await?;
            self.probe
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert(probe);
        }
        let probe = self.probe.clone();
        let topic = topic.clone();
        crate::storage::spawn_blocking(move || {
            let guard = probe.lock().unwrap_or_else(|p| p.into_inner());
            let Some(probe) = guard.as_ref() else {
                return Err(StorageError::unavailable("the time-lookup probe is gone"));
            };
            resolve(claim, earliest, end, time_ms, |o| {
                probe.first_stamped_at(topic.as_str(), partition, o, earliest, end)
            })
        })
        .await
        .map_err(|e| StorageError::failed("the time-lookup task failed", e))?
    }
}

/// The broker's answer for one partition: an offset, or "none that new" (`-1`, librdkafka's
/// `End`); anything else is not an answer.
pub(super) fn found(offset: KOffset) -> Option<Found> {
    match offset {
        KOffset::Offset(o) if o >= 0 => Some(Found::At(o as Offset)),
        KOffset::End | KOffset::Offset(-1) => Some(Found::AfterEnd),
        _ => None,
    }
}

/// Where a seek to `time_ms` goes in a partition holding `[earliest, end)`: the broker's
/// `claim` if the records agree, else the first offset from which the first record at or
/// after it is at least that new (a binary search; timestamps taken as non-decreasing,
/// as Kafka's own time index takes them). `stamped_at(o)` reads the first record at or
/// after `o` with its timestamp (`None`: none before `end`). A record without a timestamp
/// counts as older than any time.
///
/// A claim holds when the record it names (or, for "none", the end) is at least that new
/// and the record just before it is older: two reads. On Kafka this only costs them; a
/// claim that does not hold, or that a gap just before it leaves unconfirmed, costs about
/// `log2(end - earliest)` reads more.
pub(super) fn resolve<E>(
    claim: Option<Found>,
    earliest: Offset,
    end: Offset,
    time_ms: u64,
    mut stamped_at: impl FnMut(Offset) -> Result<Option<(Offset, Option<i64>)>, E>,
) -> Result<Resolved, E> {
    let at = i64::try_from(time_ms).unwrap_or(i64::MAX);
    if end <= earliest {
        return Ok(Resolved {
            offset: end,
            claim_held: claim.is_some(),
        });
    }
    if let Some(claim) = claim {
        let c = match claim {
            Found::At(o) => o.clamp(earliest, end),
            Found::AfterEnd => end,
        };
        // The record before `c` is older: the first record at or after `c - 1` is at
        // `c - 1` and older (one at `c` or later means a gap there: not confirmed, search).
        let before_older = c <= earliest
            || matches!(stamped_at(c - 1)?, Some((r, ts)) if r + 1 == c && ts.is_none_or(|ts| ts < at));
        if before_older {
            // The record the claim names (the next one, if it names a gap) is that new.
            let named = if c < end { stamped_at(c)? } else { None };
            let newer = match named {
                None => Some(end),
                Some((r, ts)) => ts.is_some_and(|ts| ts >= at).then_some(r.min(end)),
            };
            if let Some(offset) = newer {
                return Ok(Resolved {
                    offset,
                    claim_held: true,
                });
            }
        }
    }
    // The first offset from which everything is that new; if it is a gap, the record
    // after it (as Kafka names one).
    let from = first_where(earliest, end, |o| newer(o, end, at, &mut stamped_at))?;
    let offset = if from < end {
        stamped_at(from)?.map_or(end, |(r, _)| r.min(end))
    } else {
        end
    };
    Ok(Resolved {
        offset,
        claim_held: false,
    })
}

/// Whether everything from `o` on is at least `at` new, as far as `stamped_at` shows: the
/// first record at or after `o` is, or there is none before `end`.
fn newer<E>(
    o: Offset,
    end: Offset,
    at: i64,
    stamped_at: &mut impl FnMut(Offset) -> Result<Option<(Offset, Option<i64>)>, E>,
) -> Result<bool, E> {
    if o >= end {
        return Ok(true);
    }
    Ok(match stamped_at(o)? {
        None => true,
        Some((_, ts)) => ts.is_some_and(|ts| ts >= at),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offset_or_end_is_an_answer_and_nothing_else_is() {
        assert_eq!(found(KOffset::Offset(0)), Some(Found::At(0)));
        assert_eq!(found(KOffset::Offset(42)), Some(Found::At(42)));
        assert_eq!(found(KOffset::End), Some(Found::AfterEnd));
        assert_eq!(found(KOffset::Offset(-1)), Some(Found::AfterEnd));
        assert_eq!(found(KOffset::Beginning), None);
        assert_eq!(found(KOffset::Invalid), None);
        assert_eq!(found(KOffset::Offset(-7)), None);
    }

    /// A partition of records by offset with their timestamps (missing offsets are gaps),
    /// and the reads made of it.
    struct Log {
        stamps: Vec<(Offset, Option<i64>)>,
        reads: usize,
    }

    impl Log {
        fn stamped_at(&mut self, o: Offset) -> Result<Option<(Offset, Option<i64>)>, ()> {
            self.reads += 1;
            Ok(self.stamps.iter().copied().find(|(r, _)| *r >= o))
        }

        /// The right answer: the first record at least `t` new, else the end.
        fn truth(&self, t: i64, end: Offset) -> Offset {
            self.stamps
                .iter()
                .find(|(_, ts)| ts.is_some_and(|ts| ts >= t))
                .map_or(end, |(o, _)| *o)
        }
    }

    /// Goal: whatever the broker claims — right, wrong either way, "none" for everything
    /// (the mock cluster), 0 past the end (tansu), or no answer — the answer is the first
    /// record at or after the time, and a right claim costs two reads. Method: a partition
    /// with gaps and equal timestamps, every time from before the first record to after
    /// the last, every claim.
    #[test]
    fn a_claim_is_kept_when_the_records_agree_and_searched_when_they_do_not() {
        let stamps = vec![
            (3, Some(100)),
            (4, Some(100)),
            (5, Some(150)),
            (6, Some(200)),
            (9, Some(250)),
            (10, Some(300)),
            (11, Some(300)),
        ];
        let (earliest, end) = (3, 12);
        for t in [0, 99, 100, 101, 200, 249, 250, 251, 300, 301, i64::MAX] {
            let mut log = Log {
                stamps: stamps.clone(),
                reads: 0,
            };
            let truth = log.truth(t, end);
            let time = u64::try_from(t).unwrap();
            let right = if truth == end {
                Found::AfterEnd
            } else {
                Found::At(truth)
            };
            let r = resolve(Some(right), earliest, end, time, |o| log.stamped_at(o)).unwrap();
            assert_eq!(r.offset, truth, "right claim at {t}");
            // Confirmed in two reads, unless a gap is just before it (offsets 7 and 8).
            let after_gap = truth == 9;
            assert_eq!(r.claim_held, !after_gap, "right claim at {t}");
            if !after_gap {
                assert!(log.reads <= 2, "{} reads for a right claim", log.reads);
            }
            for wrong in [
                Some(Found::At(0)),
                Some(Found::At(earliest)),
                Some(Found::At(7)),
                Some(Found::At(end)),
                Some(Found::At(99)),
                Some(Found::AfterEnd),
                None,
            ] {
                log.reads = 0;
                let r = resolve(wrong, earliest, end, time, |o| log.stamped_at(o)).unwrap();
                assert_eq!(r.offset, truth, "claim {wrong:?} at {t}");
                // Two to check the claim, four to search nine offsets, one to name.
                assert!(
                    log.reads <= 7,
                    "{} reads for claim {wrong:?} at {t}",
                    log.reads
                );
            }
        }
        let mut empty = Log {
            stamps: Vec::new(),
            reads: 0,
        };
        let r = resolve(Some(Found::At(0)), 7, 7, 5, |o| empty.stamped_at(o)).unwrap();
        assert_eq!(r.offset, 7, "an empty partition: its end");
        assert_eq!(empty.reads, 0);
    }
}
