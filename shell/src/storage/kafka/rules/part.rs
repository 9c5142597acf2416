//! The partition buffer: what a group consumer knows of one assigned partition, and the
//! rule that keeps offset gaps safe.
//!
//! Fetches (the core's `Fetch(from, max)`) are answered from a per-partition buffer of what
//! the stream delivered. A partition's `base` is an offset from which every record of the
//! log either is in the buffer or is still to come from the stream, in order. A fetch from
//! `from >= base` is answered from the stream (the first record it gets is the first record
//! at or above `from` in the log, so the offsets skipped between are really absent:
//! compaction, transaction markers); a fetch from below `base` repositions the stream first
//! ([`Part::reposition`]). A partition with no fetch waiting and a full buffer is paused, so
//! the broker backlog never becomes memory (C8).
//!
//! The waiting fetch is the adaptor's (`F`: a reply channel and its deadline); the rule
//! only needs its bounds ([`Waiting`]) and hands it back with the records that answer it.

use std::collections::VecDeque;

use unimesh_core::{Offset, Record};

/// Records buffered per partition beyond which a partition without a waiting fetch pauses.
pub const PAUSE_AT_RECORDS: usize = 2_000;

/// A log's (earliest, end), or (earliest, divergence point).
pub type Span = (Offset, Offset);

/// A fetch waiting for records: how many it takes, and about how many bytes.
pub trait Waiting {
    fn max(&self) -> usize;
    fn max_bytes(&self) -> usize;
}

/// What a lane knows, to check against the log before it reads on (`epochs.rs`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Validate {
    /// The leader epoch of what it knows (`None`: unknown; only the log's end tells).
    pub stamp: Option<i32>,
    /// It knows offsets below this.
    pub known_end: Offset,
    /// The log's (earliest, end) to check against; `None`: read them first.
    pub range: Option<Span>,
}

/// What the consumer knows of one assigned partition.
pub struct Part<F> {
    /// Every record at or above `base` is in `buffer` or still to come from the stream.
    pub base: Offset,
    /// Records with the leader epoch of their batch.
    pub buffer: VecDeque<(Record, Option<i32>)>,
    pub buffered_bytes: usize,
    pub fetch: Option<F>,
    pub paused: bool,
    /// The consumer reported an offset out of range (it does not say for which partition):
    /// the next fetch checks this partition's offsets against the broker's first.
    pub check_range: bool,
    /// The consumer may have stopped fetching this partition (with `auto.offset.reset =
    /// error` librdkafka stops a partition at an out-of-range answer, and a seek no longer
    /// restarts it): the next repositioning assigns the partition again instead.
    pub stalled: bool,
    /// A check of what the lane knows against the log, due before its next fetch is
    /// answered: at assignment (the checkpoint it resumes from), and after librdkafka
    /// stopped the partition (it may have detected a truncation).
    pub validate: Option<Validate>,
    /// The stream was started at `base` without reading first whether the broker answers
    /// a read from there with `base`'s own batch (a broker may answer a read from inside
    /// a batch with the next one; tansu 0.6.0 does): the first fetch reads it, off the
    /// consumer thread, and moves the stream further back before any record is answered.
    /// Set for a lane that starts above the log's earliest ([`crate::storage::kafka::rules::assign::lane_start`]).
    pub start_unchecked: bool,
    /// The leader epoch of the lane's position: the checkpoint's stamp, raised by every
    /// record handed to the core (never by one only buffered: a record read from a log
    /// not yet checked must not vouch for it); progress records are stamped with it
    /// (`epochs.rs`).
    pub epoch: Option<i32>,
    /// The lane knows offsets below this (its checkpoint's, and every record handed to
    /// the core).
    pub known_end: Offset,
}

/// A waiting fetch answered ([`Part::answer_if_ready`]).
pub struct Answer<F> {
    pub fetch: F,
    pub records: Vec<Record>,
    /// The end of what was handed over: the log holds records up to here, whatever end the
    /// broker claims.
    pub end: Offset,
    /// The lane's leader epoch when the records handed over raised it.
    pub raised: Option<i32>,
}

impl<F: Waiting> Part<F> {
    pub fn new(base: Offset) -> Self {
        Self {
            check_range: false,
            stalled: false,
            validate: None,
            start_unchecked: false,
            epoch: None,
            known_end: 0,
            base,
            buffer: VecDeque::new(),
            buffered_bytes: 0,
            fetch: None,
            paused: false,
        }
    }

    /// Whether a record the stream delivered at `offset` belongs in the buffer (below
    /// `base` it was fetched before a reposition, or already answered).
    pub fn wants(&self, offset: Offset) -> bool {
        offset >= self.base
    }

    /// A record the stream delivered, at or above `base` ([`Part::wants`]), with the leader
    /// epoch of its batch.
    pub fn push(&mut self, record: Record, epoch: Option<i32>) {
        self.buffered_bytes += record.body.len();
        self.buffer.push_back((record, epoch));
    }

    /// Drops what lies below `from` (already answered, or skipped by the core).
    pub fn discard_below(&mut self, from: Offset) {
        while self.buffer.front().is_some_and(|(r, _)| r.offset < from) {
            if let Some((r, _)) = self.buffer.pop_front() {
                self.buffered_bytes -= r.body.len();
            }
        }
        self.base = self.base.max(from);
    }

    /// Forgets the buffer: the stream will deliver everything at or above `base` again.
    pub fn clear(&mut self) {
        self.buffer.clear();
        self.buffered_bytes = 0;
    }

    /// The stream now starts at `from` (a seek, a fetcher restarted there): what was
    /// buffered is dropped, and `from` is the new `base`.
    pub fn reposition(&mut self, from: Offset) {
        self.stalled = false;
        self.start_unchecked = false;
        self.clear();
        self.base = from;
    }

    /// Whether the stream must be paused: no fetch waits and the buffer is full.
    pub fn should_pause(&self) -> bool {
        self.fetch.is_none() && !self.paused && self.buffer.len() >= PAUSE_AT_RECORDS
    }

    /// Whether a paused stream may run again: the buffer has room.
    pub fn should_resume(&self) -> bool {
        self.paused && self.buffer.len() < PAUSE_AT_RECORDS
    }

    /// Answers the waiting fetch with what the buffer holds, if it holds anything: the
    /// records (at most the fetch's count, and its bytes unless the first record alone is
    /// larger), the end of what was handed over, and the lane's leader epoch when those
    /// records raised it.
    pub fn answer_if_ready(&mut self) -> Option<Answer<F>> {
        if self.buffer.is_empty() {
            return None;
        }
        let fetch = self.fetch.take()?;
        let before = self.epoch;
        let (max, max_bytes) = (fetch.max(), fetch.max_bytes());
        let mut records = Vec::new();
        let mut bytes = 0usize;
        while records.len() < max {
            let Some((front, _)) = self.buffer.front() else {
                break;
            };
            if !records.is_empty() && bytes + front.body.len() > max_bytes {
                break;
            }
            let Some((r, epoch)) = self.buffer.pop_front() else {
                break;
            };
            bytes += r.body.len();
            self.buffered_bytes -= r.body.len();
            self.base = r.offset + 1;
            self.known_end = self.known_end.max(r.offset + 1);
            self.epoch = self.epoch.max(epoch);
            records.push(r);
        }
        Some(Answer {
            fetch,
            records,
            end: self.base,
            raised: self.epoch.filter(|_| self.epoch != before),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;
    use unimesh_core::RecordMeta;

    use super::*;

    struct Want(usize, usize);

    impl Waiting for Want {
        fn max(&self) -> usize {
            self.0
        }
        fn max_bytes(&self) -> usize {
            self.1
        }
    }

    fn record(offset: Offset, len: usize) -> Record {
        Record {
            offset,
            meta: RecordMeta::Undecodable(Arc::from("test")),
            body: Bytes::from(vec![0u8; len]),
            broker_handle: None,
        }
    }

    /// Goal: the buffer answers a fetch with what lies at or above its position, in order,
    /// within the fetch's bounds, and moves `base` past what it handed over. Method: records
    /// 3, 4, 5 and 7 (6 absent: compacted) are buffered; a fetch of at most 3 records gets
    /// 3, 4, 5; a fetch from 7 drops nothing it has not answered and gets 7; a byte bound
    /// stops an answer after its first record, never before it.
    #[test]
    fn a_fetch_is_answered_in_order_within_its_bounds() {
        let mut part: Part<Want> = Part::new(3);
        assert!(!part.wants(2));
        for (o, len) in [(3, 10), (4, 10), (5, 10), (7, 50)] {
            assert!(part.wants(o));
            part.push(record(o, len), Some(1));
        }
        assert_eq!(part.buffered_bytes, 80);
        assert!(part.answer_if_ready().is_none(), "no fetch waits");
        part.fetch = Some(Want(3, 1_000));
        let a = part.answer_if_ready().expect("records are there");
        let offsets: Vec<Offset> = a.records.iter().map(|r| r.offset).collect();
        assert_eq!((offsets, a.end, a.raised), (vec![3, 4, 5], 6, Some(1)));
        assert_eq!((part.base, part.known_end), (6, 6));
        part.discard_below(7);
        part.fetch = Some(Want(10, 5));
        let a = part.answer_if_ready().expect("record 7");
        assert_eq!(
            a.records.len(),
            1,
            "the first record goes whatever its size"
        );
        assert_eq!((a.end, a.raised, part.buffered_bytes), (8, None, 0));
        assert!(part.answer_if_ready().is_none());
    }

    /// Goal: a reposition never lets a record buffered before it answer a fetch after it,
    /// and a full buffer with no fetch waiting pauses the stream (C8). Method: records 10
    /// and 11 are buffered, the stream is repositioned to 4: the buffer is empty, `base` is
    /// 4, a record at 3 is not wanted; a buffer at the pause mark pauses, and resumes below
    /// it.
    #[test]
    fn a_reposition_drops_the_buffer_and_a_full_buffer_pauses() {
        let mut part: Part<Want> = Part::new(10);
        part.push(record(10, 1), None);
        part.push(record(11, 1), None);
        part.stalled = true;
        part.reposition(4);
        assert!(part.buffer.is_empty() && part.buffered_bytes == 0 && !part.stalled);
        assert_eq!(part.base, 4);
        assert!(!part.wants(3) && part.wants(4));
        for o in 0..PAUSE_AT_RECORDS as Offset {
            part.push(record(4 + o, 1), None);
        }
        assert!(part.should_pause());
        part.paused = true;
        assert!(!part.should_pause() && !part.should_resume());
        part.fetch = Some(Want(1, 1));
        assert!(part.answer_if_ready().is_some());
        assert!(part.should_resume());
    }
}
