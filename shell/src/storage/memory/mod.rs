//! A log in memory, for tests and the simulation.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use madsim_tokio as tokio;
use unimesh_core::{GroupName, Offset, Partition, TopicName};

use crate::storage::log::AppendItem;
use crate::storage::ports::{BoxFut, LogPort, LogRead, StorageError, TopicFacts};

#[derive(Default)]
struct MemTopic {
    partitions: Vec<Vec<Bytes>>,
    /// Each record's append time (wall clock ms), kept non-decreasing per partition.
    times: Vec<Vec<u64>>,
    earliest: Vec<Offset>,
}

/// A log in memory: dense offsets, round-robin or keyed partitioning, no durability. A fetch
/// at the end waits up to its `wait_ms` for an append, so the engine does not spin.
pub struct MemoryLog {
    topics: Mutex<BTreeMap<TopicName, MemTopic>>,
    default_partitions: u32,
    notify: tokio::sync::Notify,
    round_robin: std::sync::atomic::AtomicU32,
    fault: Mutex<Option<String>>,
}

impl MemoryLog {
    pub fn new(default_partitions: u32) -> Self {
        Self {
            topics: Mutex::new(BTreeMap::new()),
            default_partitions: default_partitions.max(1),
            notify: tokio::sync::Notify::new(),
            round_robin: std::sync::atomic::AtomicU32::new(0),
            fault: Mutex::new(None),
        }
    }

    /// The partition count of a topic, created with the default count if needed.
    pub fn ensure_topic(&self, topic: &TopicName) -> u32 {
        let mut topics = self.topics.lock().unwrap_or_else(|p| p.into_inner());
        let n = self.default_partitions;
        let t = topics.entry(topic.clone()).or_insert_with(|| MemTopic {
            partitions: vec![Vec::new(); n as usize],
            times: vec![Vec::new(); n as usize],
            earliest: vec![0; n as usize],
        });
        t.partitions.len() as u32
    }

    /// The partition count of a topic it has.
    pub fn partitions(&self, topic: &TopicName) -> Option<u32> {
        let topics = self.topics.lock().unwrap_or_else(|p| p.into_inner());
        topics.get(topic).map(|t| t.partitions.len() as u32)
    }

    /// (earliest, end) of a partition.
    pub fn offsets(
        &self,
        topic: &TopicName,
        partition: Partition,
    ) -> Result<(Offset, Offset), StorageError> {
        let topics = self.topics.lock().unwrap_or_else(|p| p.into_inner());
        let t = topics
            .get(topic)
            .ok_or_else(|| StorageError::Invalid(format!("unknown topic {topic}")))?;
        let p = t
            .partitions
            .get(partition as usize)
            .ok_or_else(|| StorageError::Invalid(format!("unknown partition {partition}")))?;
        Ok((t.earliest[partition as usize], p.len() as Offset))
    }

    /// Refuses every append with this reason (as the embedded log does after a failed
    /// write), or takes appends again with `None`; for tests.
    pub fn set_fault(&self, fault: Option<String>) {
        *self.fault.lock().unwrap_or_else(|p| p.into_inner()) = fault;
    }

    fn read(&self, topic: &TopicName, partition: Partition, from: Offset, max: usize) -> LogRead {
        let topics = self.topics.lock().unwrap_or_else(|p| p.into_inner());
        let Some(t) = topics.get(topic) else {
            return LogRead::Failed(format!("unknown topic {topic}"));
        };
        let Some(p) = t.partitions.get(partition as usize) else {
            return LogRead::Failed(format!("unknown partition {partition}"));
        };
        let earliest = t.earliest[partition as usize];
        let end = p.len() as Offset;
        if from < earliest || from > end {
            return LogRead::OutOfRange { earliest, end };
        }
        let hi = (from as usize).saturating_add(max).min(p.len());
        LogRead::Records(
            (from as usize..hi)
                .map(|o| (o as Offset, p[o].clone()))
                .collect(),
        )
    }
}

impl LogPort for Arc<MemoryLog> {
    fn fetch(
        &self,
        _group: GroupName,
        topic: TopicName,
        partition: Partition,
        from: Offset,
        max: usize,
        _max_bytes: usize,
        wait_ms: u64,
    ) -> BoxFut<LogRead> {
        let log = self.clone();
        Box::pin(async move {
            // Created before the read, the `Notified` catches an append that lands between
            // the read and the wait.
            let notified = log.notify.notified();
            let first = log.read(&topic, partition, from, max);
            if !first.at_end() {
                return first;
            }
            let _ = tokio::time::timeout(Duration::from_millis(wait_ms), notified).await;
            log.read(&topic, partition, from, max)
        })
    }

    fn append(
        &self,
        topic: TopicName,
        items: Vec<AppendItem>,
    ) -> BoxFut<Result<Vec<(Partition, Offset)>, StorageError>> {
        let log = self.clone();
        Box::pin(async move {
            if let Some(fault) = LogPort::fault(&log) {
                return Err(StorageError::unavailable(fault));
            }
            let n = log.ensure_topic(&topic);
            let mut out = Vec::with_capacity(items.len());
            {
                let mut topics = log.topics.lock().unwrap_or_else(|p| p.into_inner());
                let t = topics
                    .get_mut(&topic)
                    .ok_or_else(|| StorageError::unavailable("topic vanished"))?;
                for item in items {
                    let p = match &item.key {
                        Some(k) => crate::storage::log::partition_for_key(k.as_bytes(), n),
                        None => {
                            log.round_robin
                                .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                                % n
                        }
                    };
                    let part = &mut t.partitions[p as usize];
                    out.push((p, part.len() as Offset));
                    part.push(item.value);
                    let times = &mut t.times[p as usize];
                    let last = times.last().copied().unwrap_or(0);
                    times.push(
                        crate::storage::log::WallClock::now_ms(&crate::storage::log::SystemClock)
                            .max(last),
                    );
                }
            }
            log.notify.notify_waiters();
            Ok(out)
        })
    }

    fn prepare_topic(
        &self,
        topic: TopicName,
        with_offsets: bool,
    ) -> BoxFut<Result<TopicFacts, StorageError>> {
        let facts = TopicFacts::read(self.ensure_topic(&topic), with_offsets, |p| {
            MemoryLog::offsets(self, &topic, p)
        });
        Box::pin(async move { facts })
    }

    fn partitions(&self, topic: TopicName) -> BoxFut<Option<u32>> {
        let n = MemoryLog::partitions(self, &topic);
        Box::pin(async move { n })
    }

    fn offset_for_time(
        &self,
        topic: TopicName,
        partition: Partition,
        time_ms: u64,
    ) -> BoxFut<Result<Offset, StorageError>> {
        let found = {
            let topics = self.topics.lock().unwrap_or_else(|p| p.into_inner());
            match topics.get(&topic) {
                None => Err(StorageError::Invalid(format!("unknown topic {topic}"))),
                Some(t) => match t.times.get(partition as usize) {
                    None => Err(StorageError::Invalid(format!(
                        "topic {topic} has no partition {partition}"
                    ))),
                    Some(times) => {
                        let earliest = t.earliest[partition as usize];
                        let first = times.partition_point(|&ms| ms < time_ms) as Offset;
                        Ok(first.max(earliest))
                    }
                },
            }
        };
        Box::pin(async move { found })
    }

    fn offsets(
        &self,
        topic: TopicName,
        partition: Partition,
    ) -> BoxFut<Result<(Offset, Offset), StorageError>> {
        let range = MemoryLog::offsets(self, &topic, partition);
        Box::pin(async move { range })
    }

    fn enforce_retention(&self) -> BoxFut<Result<usize, StorageError>> {
        Box::pin(async { Ok(0) })
    }

    fn fault(&self) -> Option<String> {
        self.fault.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}
