//! The simulated event log: a partitioned log on a "disk" that outlives the mesh node, and
//! its port on the node. Honest durability: an append takes a while to sync and becomes
//! durable — visible to fetches, reported to the world, answered — all at one instant; a
//! kill before that instant loses it whole (the append future dies with the node), a kill
//! after it loses nothing, answered or not.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use madsim_tokio as tokio;
use unimesh_core::{GroupName, Offset, Partition, TopicName};
use unimesh_shell::engine::{BoxFut, LogPort, LogRead, StorageError, TopicFacts};
use unimesh_shell::log::{partition_for_key, AppendItem};
use unimesh_sim::rng::Rng;

use crate::world::World;

#[derive(Default)]
struct PartitionDisk {
    /// Records below this were deleted by retention.
    earliest: Offset,
    /// Every record ever appended, by offset (deleted ones emptied).
    records: Vec<Bytes>,
}

/// The log's disk: shared by every incarnation of the node.
pub struct LogDisk {
    topics: Mutex<BTreeMap<TopicName, Vec<PartitionDisk>>>,
    default_partitions: u32,
    /// Woken at every append, for fetches parked at the end of a partition.
    appended: tokio::sync::Notify,
    round_robin: AtomicU32,
}

impl LogDisk {
    pub fn new(default_partitions: u32) -> Self {
        Self {
            topics: Mutex::new(BTreeMap::new()),
            default_partitions: default_partitions.max(1),
            appended: tokio::sync::Notify::new(),
            round_robin: AtomicU32::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<TopicName, Vec<PartitionDisk>>> {
        self.topics.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn ensure_topic(&self, topic: &TopicName) -> u32 {
        let n = self.default_partitions;
        let mut topics = self.lock();
        let t = topics
            .entry(topic.clone())
            .or_insert_with(|| (0..n).map(|_| PartitionDisk::default()).collect());
        t.len() as u32
    }

    pub fn partitions(&self, topic: &TopicName) -> Option<u32> {
        self.lock().get(topic).map(|t| t.len() as u32)
    }

    /// (earliest, end) of a partition.
    pub fn offsets(&self, topic: &TopicName, partition: Partition) -> Option<(Offset, Offset)> {
        let topics = self.lock();
        let p = topics.get(topic)?.get(partition as usize)?;
        Some((p.earliest, p.records.len() as Offset))
    }

    fn read(&self, topic: &TopicName, partition: Partition, from: Offset, max: usize) -> LogRead {
        let topics = self.lock();
        let Some(p) = topics.get(topic).and_then(|t| t.get(partition as usize)) else {
            return LogRead::Failed(format!("unknown partition {topic}/{partition}"));
        };
        let end = p.records.len() as Offset;
        if from < p.earliest || from > end {
            return LogRead::OutOfRange {
                earliest: p.earliest,
                end,
            };
        }
        let hi = from.saturating_add(max as Offset).min(end);
        LogRead::Records(
            (from..hi)
                .map(|o| (o, p.records[o as usize].clone()))
                .collect(),
        )
    }

    /// Makes `items` durable at once: each gets its partition (by key, else round robin)
    /// and the next offset there; the world hears of each, in offset order, before anyone
    /// can read it.
    fn commit(
        &self,
        world: &World,
        topic: &TopicName,
        items: Vec<AppendItem>,
    ) -> Vec<(Partition, Offset)> {
        let n = self.ensure_topic(topic);
        let mut placed = Vec::with_capacity(items.len());
        {
            let mut topics = self.lock();
            let Some(t) = topics.get_mut(topic) else {
                return placed;
            };
            for item in items {
                let p = match &item.key {
                    Some(k) => partition_for_key(k.as_bytes(), n),
                    None => self.round_robin.fetch_add(1, AtomicOrdering::Relaxed) % n,
                };
                let part = &mut t[p as usize];
                let o = part.records.len() as Offset;
                world.published(topic, p, o, &item.value);
                part.records.push(item.value);
                placed.push((p, o));
            }
        }
        self.appended.notify_waiters();
        placed
    }

    /// A record written by something other than the mesh (a foreign producer).
    pub fn write_foreign(&self, world: &World, topic: &TopicName, body: Bytes) {
        self.commit(
            world,
            topic,
            vec![AppendItem {
                key: None,
                value: body,
            }],
        );
    }

    /// Deletes a prefix of one partition drawn by `rng`, if any partition has records left
    /// to delete: (partition, new earliest).
    fn delete_prefix(&self, rng: &mut Rng) -> Option<(TopicName, Partition, Offset)> {
        let mut topics = self.lock();
        let candidates: Vec<(TopicName, Partition)> = topics
            .iter()
            .flat_map(|(t, ps)| {
                ps.iter()
                    .enumerate()
                    .filter(|(_, p)| (p.records.len() as Offset) > p.earliest)
                    .map(move |(i, _)| (t.clone(), i as Partition))
            })
            .collect();
        if candidates.is_empty() {
            return None;
        }
        let (topic, partition) = candidates[rng.index(candidates.len())].clone();
        let p = &mut topics.get_mut(&topic)?[partition as usize];
        let end = p.records.len() as Offset;
        let earliest = rng.range(p.earliest + 1, end);
        for r in &mut p.records[p.earliest as usize..earliest as usize] {
            *r = Bytes::new();
        }
        p.earliest = earliest;
        Some((topic, partition, earliest))
    }
}

/// The log port of one incarnation of the node.
pub struct SimLog {
    disk: Arc<LogDisk>,
    world: Arc<World>,
    rng: Mutex<Rng>,
}

impl SimLog {
    pub fn new(disk: Arc<LogDisk>, world: Arc<World>, rng: Rng) -> Self {
        Self {
            disk,
            world,
            rng: Mutex::new(rng),
        }
    }

    fn draw<T>(&self, f: impl FnOnce(&mut Rng) -> T) -> T {
        f(&mut self.rng.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// A retention pass: while faults last, now and then a prefix of one partition goes
    /// (once every group's start is durable: see [`World::retention_allowed`]); how many
    /// partitions moved their earliest offset.
    fn retention_pass(&self) -> usize {
        let rate = self.world.opts.faults.retention;
        if !self.world.faults_on() || !self.draw(|r| r.chance(rate)) {
            return 0;
        }
        if !self.world.retention_allowed() {
            return 0;
        }
        match self.draw(|r| self.disk.delete_prefix(r)) {
            Some((topic, partition, earliest)) => {
                self.world.retention(&topic, partition, earliest);
                1
            }
            None => 0,
        }
    }
}

impl LogPort for SimLog {
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
        let disk = self.disk.clone();
        Box::pin(async move {
            // Created before the read, the `Notified` catches an append that lands between
            // the read and the wait.
            let appended = disk.appended.notified();
            let first = disk.read(&topic, partition, from, max);
            if !matches!(&first, LogRead::Records(r) if r.is_empty()) {
                return first;
            }
            let _ = tokio::time::timeout(Duration::from_millis(wait_ms), appended).await;
            disk.read(&topic, partition, from, max)
        })
    }

    fn append(
        &self,
        topic: TopicName,
        items: Vec<AppendItem>,
    ) -> BoxFut<Result<Vec<(Partition, Offset)>, StorageError>> {
        let disk = self.disk.clone();
        let world = self.world.clone();
        let latency = self.draw(|r| r.range(0, world.opts.faults.append_latency_ms));
        Box::pin(async move {
            // The sync: a kill during it loses the whole append.
            if latency > 0 {
                tokio::time::sleep(Duration::from_millis(latency)).await;
            }
            Ok(disk.commit(&world, &topic, items))
        })
    }

    fn prepare_topic(
        &self,
        topic: TopicName,
        with_offsets: bool,
    ) -> BoxFut<Result<TopicFacts, StorageError>> {
        let partitions = self.disk.ensure_topic(&topic);
        let facts = TopicFacts::read(partitions, with_offsets, |p| {
            self.disk
                .offsets(&topic, p)
                .ok_or_else(|| StorageError::Invalid(format!("unknown partition {topic}/{p}")))
        });
        Box::pin(async move { facts })
    }

    fn partitions(&self, topic: TopicName) -> BoxFut<Option<u32>> {
        let n = self.disk.partitions(&topic);
        Box::pin(async move { n })
    }

    fn offsets(
        &self,
        topic: TopicName,
        partition: Partition,
    ) -> BoxFut<Result<(Offset, Offset), StorageError>> {
        let range = self
            .disk
            .offsets(&topic, partition)
            .ok_or_else(|| StorageError::Invalid(format!("unknown partition {topic}/{partition}")));
        Box::pin(async move { range })
    }

    fn enforce_retention(&self) -> BoxFut<Result<usize, StorageError>> {
        let moved = self.retention_pass();
        Box::pin(async move { Ok(moved) })
    }
}
