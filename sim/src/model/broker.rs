//! A partitioned log: publishes are acknowledged with offsets, retention deletes a prefix,
//! fetches are answered honestly here (the harness distorts answers to inject faults).

use bytes::Bytes;
use unimesh_core::{FetchResult, Offset, Partition, Record, RecordMeta, TopicName};

#[derive(Clone, Debug, Default)]
struct PartitionLog {
    records: Vec<Record>,
    earliest: Offset,
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
        let offset = log.records.len() as Offset;
        let record = Record {
            offset,
            meta,
            body,
            broker_handle: pop.then(|| encode_handle(p, offset)),
        };
        log.records.push(record.clone());
        record
    }

    pub fn earliest(&self, p: Partition) -> Offset {
        self.partitions[p as usize].earliest
    }

    pub fn end(&self, p: Partition) -> Offset {
        self.partitions[p as usize].records.len() as Offset
    }

    /// Retention: everything below `earliest` is deleted.
    pub fn delete_below(&mut self, p: Partition, earliest: Offset) {
        let log = &mut self.partitions[p as usize];
        log.earliest = log.earliest.max(earliest.min(log.records.len() as Offset));
    }

    /// Records `[from, from + max)` that still exist, or out of range.
    pub fn fetch(&self, p: Partition, from: Offset, max: usize) -> FetchResult {
        let log = &self.partitions[p as usize];
        let end = log.records.len() as Offset;
        if from < log.earliest || from > end {
            return FetchResult::OutOfRange {
                earliest: log.earliest,
                end,
            };
        }
        let to = end.min(from.saturating_add(max as Offset));
        FetchResult::Records(log.records[from as usize..to as usize].to_vec())
    }

    pub fn records(&self, p: Partition, from: Offset, to: Offset) -> &[Record] {
        let log = &self.partitions[p as usize];
        let from = from.max(log.earliest).min(log.records.len() as Offset);
        let to = to.clamp(from, log.records.len() as Offset);
        &log.records[from as usize..to as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

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
        match b.fetch(0, 3, 10) {
            FetchResult::Records(r) => {
                assert_eq!(r.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![3, 4])
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(decode_handle(&encode_handle(7, 9)), Some((7, 9)));
    }
}
