//! A partitioned log: publishes are acknowledged with offsets, retention deletes a prefix,
//! fetches are answered honestly here (the harness distorts answers to inject faults).
//!
//! Offsets need not be dense, as on a Kafka-protocol broker: an offset may be a *hole*
//! (a transaction marker, a record of an aborted transaction: never shown to a
//! read-committed consumer), and compaction removes records a later record of the same key
//! supersedes. A fetch answers up to `max` records at or after the asked offset, skipping
//! what it does not show — it never answers empty while a record follows, so a consumer is
//! never left waiting for an offset that will not come. The broker may also lose its tail
//! (an unclean leader election): later records reuse the offsets, and each loss starts a
//! new leader epoch, so a reader that knows the epoch its position came from can tell it
//! diverged (Kafka's KIP-320 validation).

use bytes::Bytes;
use unimesh_core::{FetchResult, Offset, Partition, Record, RecordMeta, TopicName};

use crate::rng::Rng;

#[derive(Clone, Debug, Default)]
struct PartitionLog {
    /// By offset; None where no record is shown (a hole, or a record compacted away).
    slots: Vec<Option<Record>>,
    earliest: Offset,
    /// The new end of every loss of the tail, oldest first (the leader epoch is its count).
    truncations: Vec<Offset>,
}

#[derive(Clone, Debug)]
pub struct Broker {
    pub topic: TopicName,
    partitions: Vec<PartitionLog>,
}

/// A POP receipt handle naming (partition, offset), so broker ACKs can be checked.
pub fn encode_handle(p: Partition, o: Offset) -> Bytes {
    let mut v = Vec::with_capacity(12);
    v.extend_from_slice(&p.to_le_bytes());
    v.extend_from_slice(&o.to_le_bytes());
    Bytes::from(v)
}

pub fn decode_handle(b: &[u8]) -> Option<(Partition, Offset)> {
    let p = u32::from_le_bytes(b.get(0..4)?.try_into().ok()?);
    let o = u64::from_le_bytes(b.get(4..12)?.try_into().ok()?);
    (b.len() == 12).then_some((p, o))
}

impl Broker {
    pub fn new(topic: TopicName, partitions: u32) -> Self {
        Self {
            topic,
            partitions: vec![PartitionLog::default(); partitions as usize],
        }
    }

    pub fn partitions(&self) -> u32 {
        self.partitions.len() as u32
    }

    /// Appends a record and acknowledges it with its offset.
    pub fn publish(&mut self, p: Partition, meta: RecordMeta, body: Bytes, pop: bool) -> Record {
        let log = &mut self.partitions[p as usize];
        let offset = log.slots.len() as Offset;
        let record = Record {
            offset,
            meta,
            body,
            broker_handle: pop.then(|| encode_handle(p, offset)),
        };
        log.slots.push(Some(record.clone()));
        record
    }

    /// Appends `n` offsets no consumer will see (markers, aborted records); returns them.
    pub fn append_holes(&mut self, p: Partition, n: u64) -> (Offset, Offset) {
        let log = &mut self.partitions[p as usize];
        let from = log.slots.len() as Offset;
        log.slots.resize(log.slots.len() + n as usize, None);
        (from, from + n)
    }

    pub fn earliest(&self, p: Partition) -> Offset {
        self.partitions[p as usize].earliest
    }

    pub fn end(&self, p: Partition) -> Offset {
        self.partitions[p as usize].slots.len() as Offset
    }

    /// Where a consumer that took every record is done: one past the last record it can
    /// see (or the earliest offset, if retention deleted past it).
    pub fn target(&self, p: Partition) -> Offset {
        let log = &self.partitions[p as usize];
        let last = log
            .slots
            .iter()
            .rposition(Option::is_some)
            .map_or(0, |i| i as Offset + 1);
        last.max(log.earliest)
    }

    /// Retention: everything below `earliest` is deleted.
    pub fn delete_below(&mut self, p: Partition, earliest: Offset) {
        let log = &mut self.partitions[p as usize];
        log.earliest = log.earliest.max(earliest.min(log.slots.len() as Offset));
    }

    /// Compaction of `[earliest, upto)`: each record with a key that a later record of the
    /// partition also has is removed with probability `rate`. Returns the offsets removed.
    /// Records without a key (undecodable ones among them) are never removed.
    pub fn compact(&mut self, p: Partition, upto: Offset, rate: f64, rng: &mut Rng) -> Vec<Offset> {
        let log = &mut self.partitions[p as usize];
        let upto = (upto as usize).min(log.slots.len());
        let mut later_keys: std::collections::BTreeSet<String> = Default::default();
        for r in log.slots[upto..].iter().flatten() {
            if let Some(k) = r.partition_key() {
                later_keys.insert(k.to_owned());
            }
        }
        let mut removed = Vec::new();
        for i in (log.earliest as usize..upto).rev() {
            let Some(key) = log.slots[i]
                .as_ref()
                .and_then(|r| r.partition_key().map(str::to_owned))
            else {
                continue;
            };
            if later_keys.contains(&key) {
                if rng.chance(rate) {
                    log.slots[i] = None;
                    removed.push(i as Offset);
                }
            } else {
                later_keys.insert(key);
            }
        }
        removed.reverse();
        removed
    }

    /// Loses everything from `new_end` on: a new leader epoch begins.
    pub fn truncate(&mut self, p: Partition, new_end: Offset) {
        let log = &mut self.partitions[p as usize];
        log.slots.truncate(new_end as usize);
        log.truncations.push(new_end);
    }

    /// How many times the partition lost its tail (its leader epoch).
    pub fn leader_epoch(&self, p: Partition) -> usize {
        self.partitions[p as usize].truncations.len()
    }

    /// Where a position taken in leader epoch `known` diverged from the log, if the broker
    /// lost its tail since (the lowest new end of those losses).
    pub fn divergence(&self, p: Partition, known: usize) -> Option<Offset> {
        let log = &self.partitions[p as usize];
        log.truncations.get(known..)?.iter().copied().min()
    }

    /// Up to `max` records at or after `from` that still exist, or out of range.
    pub fn fetch(&self, p: Partition, from: Offset, max: usize) -> FetchResult {
        let log = &self.partitions[p as usize];
        let end = log.slots.len() as Offset;
        if from < log.earliest || from > end {
            return FetchResult::OutOfRange {
                earliest: log.earliest,
                end,
            };
        }
        FetchResult::Records(
            log.slots[from as usize..]
                .iter()
                .flatten()
                .take(max)
                .cloned()
                .collect(),
        )
    }

    /// The records in `[from, to)` that still exist.
    pub fn records(&self, p: Partition, from: Offset, to: Offset) -> Vec<Record> {
        let log = &self.partitions[p as usize];
        let len = log.slots.len() as Offset;
        let from = from.max(log.earliest).min(len);
        let to = to.clamp(from, len);
        log.slots[from as usize..to as usize]
            .iter()
            .flatten()
            .cloned()
            .collect()
    }

    /// Whether the offset holds no record a consumer sees (a hole or a compacted record).
    pub fn is_gap(&self, p: Partition, o: Offset) -> bool {
        self.partitions[p as usize]
            .slots
            .get(o as usize)
            .is_some_and(Option::is_none)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn offsets(r: FetchResult) -> Vec<Offset> {
        match r {
            FetchResult::Records(r) => r.iter().map(|r| r.offset).collect(),
            other => panic!("{other:?}"),
        }
    }

    fn keyed(b: &mut Broker, key: &str) {
        let meta = RecordMeta::Event(Arc::new(unimesh_core::EventMeta {
            id: format!("{}", b.end(0)),
            partition_key: Some(key.into()),
            ..Default::default()
        }));
        b.publish(0, meta, Bytes::new(), false);
    }

    #[test]
    fn fetch_respects_retention_and_end() {
        let mut b = Broker::new(TopicName::new("t").unwrap(), 1);
        for _ in 0..5 {
            b.publish(
                0,
                RecordMeta::Undecodable(Arc::from("x")),
                Bytes::new(),
                true,
            );
        }
        b.delete_below(0, 2);
        assert!(matches!(
            b.fetch(0, 1, 10),
            FetchResult::OutOfRange {
                earliest: 2,
                end: 5
            }
        ));
        assert_eq!(offsets(b.fetch(0, 3, 10)), vec![3, 4]);
        assert_eq!(decode_handle(&encode_handle(7, 9)), Some((7, 9)));
    }

    #[test]
    fn gaps_are_skipped_and_never_answered_empty_before_a_record() {
        let mut b = Broker::new(TopicName::new("t").unwrap(), 1);
        b.append_holes(0, 2);
        keyed(&mut b, "a"); // 2
        b.append_holes(0, 3); // 3..6
        keyed(&mut b, "b"); // 6
        keyed(&mut b, "a"); // 7
        b.append_holes(0, 1); // 8
        assert_eq!(offsets(b.fetch(0, 0, 2)), vec![2, 6]);
        assert_eq!(offsets(b.fetch(0, 3, 10)), vec![6, 7]);
        assert_eq!(offsets(b.fetch(0, 8, 10)), Vec::<Offset>::new());
        assert_eq!(b.target(0), 8);
        let mut rng = Rng::new(1);
        assert_eq!(b.compact(0, 9, 1.0, &mut rng), vec![2]);
        assert_eq!(offsets(b.fetch(0, 0, 10)), vec![6, 7]);
        assert!(b.is_gap(0, 2) && b.is_gap(0, 8) && !b.is_gap(0, 7));
    }

    #[test]
    fn a_lost_tail_is_a_new_leader_epoch() {
        let mut b = Broker::new(TopicName::new("t").unwrap(), 1);
        for k in ["a", "b", "c", "d"] {
            keyed(&mut b, k);
        }
        assert_eq!(b.divergence(0, 0), None);
        b.truncate(0, 2);
        keyed(&mut b, "e"); // 2 again
        b.truncate(0, 3);
        assert_eq!(b.leader_epoch(0), 2);
        assert_eq!(b.divergence(0, 0), Some(2));
        assert_eq!(b.divergence(0, 1), Some(3));
        assert_eq!(b.divergence(0, 2), None);
        assert_eq!(b.end(0), 3);
    }
}
