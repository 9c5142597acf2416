//! Fault-injecting wrappers around any log port and any state port, with rates drawn from
//! the seed (`FaultRates`) and only while faults last. They distort what the engine is
//! told, never what storage holds: a "failed, but written" append or persist really was
//! written (and reported as durable by the storage beneath); a rewound or duplicated fetch
//! answer holds the log's real records.

use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use madsim_tokio as tokio;
use unimesh_core::{
    DlqKey, GroupName, Offset, Partition, PersistBatch, RateRule, Record, TopicName,
};
use unimesh_shell::engine::{
    BoxFut, GroupLog, LogMetrics, LogPort, LogRead, StatePort, StorageError, TopicFacts,
};
use unimesh_shell::log::AppendItem;
use unimesh_shell::state::{DlqEntry, Loaded};
use unimesh_sim::rng::Rng;
use unimesh_sim::Clause;

use crate::world::{violation, World};

type SharedRng = Arc<Mutex<Rng>>;

fn draw<T>(rng: &SharedRng, f: impl FnOnce(&mut Rng) -> T) -> T {
    f(&mut rng.lock().unwrap_or_else(|p| p.into_inner()))
}

/// A log port that fails, delays, duplicates, rewinds and mislabels fetch answers, and
/// fails appends (before or after writing them).
pub struct FaultyLog {
    inner: Arc<dyn LogPort>,
    world: Arc<World>,
    rng: SharedRng,
}

impl FaultyLog {
    pub fn new(inner: Arc<dyn LogPort>, world: Arc<World>, rng: Rng) -> Self {
        Self {
            inner,
            world,
            rng: Arc::new(Mutex::new(rng)),
        }
    }
}

/// A fetch answer's records, in the log's stored form or decoded by the port (a broker
/// whose records are not in the stored form): the faults that reorder them work on both.
trait Fetched: Clone + Send + Sized + 'static {
    /// Whether "out of range although in range" is injected: it needs the log's exact
    /// offsets, and a broker's port answers `offsets` from a cache.
    const OUT_OF_RANGE: bool;
    fn offset(&self) -> Offset;
    fn of(read: LogRead) -> Option<Vec<Self>>;
    fn read(records: Vec<Self>) -> LogRead;
}

impl Fetched for (Offset, Bytes) {
    const OUT_OF_RANGE: bool = true;
    fn offset(&self) -> Offset {
        self.0
    }
    fn of(read: LogRead) -> Option<Vec<Self>> {
        match read {
            LogRead::Records(r) => Some(r),
            _ => None,
        }
    }
    fn read(records: Vec<Self>) -> LogRead {
        LogRead::Records(records)
    }
}

impl Fetched for Record {
    const OUT_OF_RANGE: bool = false;
    fn offset(&self) -> Offset {
        self.offset
    }
    fn of(read: LogRead) -> Option<Vec<Self>> {
        match read {
            LogRead::Decoded(r) => Some(r),
            _ => None,
        }
    }
    fn read(records: Vec<Self>) -> LogRead {
        LogRead::Decoded(records)
    }
}

/// The faults of one fetch answer: "out of range", a rewind, duplicates.
struct Distort {
    inner: Arc<dyn LogPort>,
    world: Arc<World>,
    rng: SharedRng,
    group: GroupName,
    topic: TopicName,
    partition: Partition,
    from: Offset,
    max_bytes: usize,
}

impl Distort {
    async fn apply<T: Fetched>(self, records: Vec<T>) -> LogRead {
        let Self {
            inner,
            world,
            rng,
            group,
            topic,
            partition,
            from,
            max_bytes,
        } = self;
        let f = world.opts.faults.clone();
        if !world.faults_on() {
            return T::read(records);
        }
        if T::OUT_OF_RANGE && draw(&rng, |r| r.chance(f.fetch_out_of_range)) {
            if let Ok((earliest, end)) = inner.offsets(topic.clone(), partition).await {
                world.count(|c| &mut c.fetch_out_of_range);
                return LogRead::OutOfRange { earliest, end };
            }
        }
        let earliest = inner
            .offsets(topic.clone(), partition)
            .await
            .map_or(from, |(e, _)| e);
        if from > earliest && draw(&rng, |r| r.chance(f.fetch_rewind)) {
            let back = draw(&rng, |r| r.range(1, (from - earliest).min(8)));
            let earlier = inner
                .fetch(
                    group,
                    topic,
                    partition,
                    from - back,
                    back as usize,
                    max_bytes,
                    0,
                )
                .await;
            if let Some(mut earlier) = T::of(earlier) {
                world.count(|c| &mut c.fetch_rewinds);
                earlier.retain(|r| r.offset() < from);
                earlier.extend(records);
                return T::read(earlier);
            }
            return T::read(records);
        }
        if !records.is_empty() && draw(&rng, |r| r.chance(f.fetch_duplicates)) {
            world.count(|c| &mut c.fetch_duplicates);
            let mut out = Vec::with_capacity(records.len() * 2);
            for r in records {
                if draw(&rng, |g| g.chance(0.5)) {
                    out.push(r.clone());
                }
                out.push(r);
            }
            return T::read(out);
        }
        T::read(records)
    }
}

impl LogPort for FaultyLog {
    fn fetch(
        &self,
        group: GroupName,
        topic: TopicName,
        partition: Partition,
        from: Offset,
        max: usize,
        max_bytes: usize,
        wait_ms: u64,
    ) -> BoxFut<LogRead> {
        let (inner, world, rng) = (self.inner.clone(), self.world.clone(), self.rng.clone());
        Box::pin(async move {
            let f = world.opts.faults.clone();
            let faulty = world.faults_on();
            if faulty && draw(&rng, |r| r.chance(f.fetch_delay)) {
                world.count(|c| &mut c.fetch_delays);
                let ms = draw(&rng, |r| r.range(1, f.fetch_delay_ms));
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            if faulty && draw(&rng, |r| r.chance(f.fetch_fail)) {
                world.count(|c| &mut c.fetch_failures);
                return LogRead::Failed("injected: the broker did not answer".into());
            }
            let read = inner
                .fetch(
                    group.clone(),
                    topic.clone(),
                    partition,
                    from,
                    max,
                    max_bytes,
                    wait_ms,
                )
                .await;
            match read {
                LogRead::Records(records) => {
                    Distort {
                        inner,
                        world,
                        rng,
                        group,
                        topic,
                        partition,
                        from,
                        max_bytes,
                    }
                    .apply(records)
                    .await
                }
                LogRead::Decoded(records) => {
                    Distort {
                        inner,
                        world,
                        rng,
                        group,
                        topic,
                        partition,
                        from,
                        max_bytes,
                    }
                    .apply(records)
                    .await
                }
                other => other,
            }
        })
    }

    fn append(
        &self,
        topic: TopicName,
        items: Vec<AppendItem>,
    ) -> BoxFut<Result<Vec<(Partition, Offset)>, StorageError>> {
        let (inner, world, rng) = (self.inner.clone(), self.world.clone(), self.rng.clone());
        Box::pin(async move {
            let f = world.opts.faults.clone();
            if world.faults_on() && draw(&rng, |r| r.chance(f.append_fail)) {
                world.count(|c| &mut c.append_failures);
                return Err(StorageError::unavailable("injected: the write failed"));
            }
            let placed = inner.append(topic, items).await?;
            if world.faults_on() && draw(&rng, |r| r.chance(f.append_fail_written)) {
                world.count(|c| &mut c.appends_failed_but_written);
                return Err(StorageError::unavailable(
                    "injected: the sync reported a failure, but the data was written",
                ));
            }
            Ok(placed)
        })
    }

    fn prepare_topic(
        &self,
        topic: TopicName,
        with_offsets: bool,
    ) -> BoxFut<Result<TopicFacts, StorageError>> {
        self.inner.prepare_topic(topic, with_offsets)
    }

    fn partitions(&self, topic: TopicName) -> BoxFut<Option<u32>> {
        LogPort::partitions(&*self.inner, topic)
    }

    fn offsets(
        &self,
        topic: TopicName,
        partition: Partition,
    ) -> BoxFut<Result<(Offset, Offset), StorageError>> {
        LogPort::offsets(&*self.inner, topic, partition)
    }

    fn enforce_retention(&self) -> BoxFut<Result<usize, StorageError>> {
        LogPort::enforce_retention(&*self.inner)
    }

    fn fault(&self) -> Option<String> {
        self.inner.fault()
    }

    fn metrics(&self) -> Option<LogMetrics> {
        self.inner.metrics()
    }

    // A broker that assigns partitions (Kafka) is reached as it is: faults distort what
    // reads and writes answer, not who owns what.

    fn group(&self) -> Option<&dyn GroupLog> {
        self.inner.group()
    }

    fn close(&self) -> BoxFut<()> {
        self.inner.close()
    }
}

/// A state port that is slow, and fails writes (before or after making them durable).
/// It also holds the persist writer to its contract: one batch at a time.
pub struct FaultyState {
    inner: Arc<dyn StatePort>,
    world: Arc<World>,
    rng: SharedRng,
    applying: Arc<AtomicBool>,
}

impl FaultyState {
    pub fn new(inner: Arc<dyn StatePort>, world: Arc<World>, rng: Rng) -> Self {
        Self {
            inner,
            world,
            rng: Arc::new(Mutex::new(rng)),
            applying: Arc::new(AtomicBool::new(false)),
        }
    }
}

/// Clears the "a batch is being applied" flag when the apply ends, however it ends.
struct Applying(Arc<AtomicBool>);

impl Drop for Applying {
    fn drop(&mut self) {
        self.0.store(false, AtomicOrdering::Relaxed);
    }
}

impl StatePort for FaultyState {
    fn load(&self) -> BoxFut<Result<Loaded, StorageError>> {
        self.inner.load()
    }

    fn apply(
        &self,
        batch: Arc<PersistBatch>,
        now_wall_ms: u64,
    ) -> BoxFut<Result<(), StorageError>> {
        let (inner, world, rng) = (self.inner.clone(), self.world.clone(), self.rng.clone());
        let applying = self.applying.clone();
        Box::pin(async move {
            if applying.swap(true, AtomicOrdering::Relaxed) {
                world.fail(violation(
                    Clause::C3,
                    "the state store was handed a batch while another was being written".into(),
                ));
            }
            let _applying = Applying(applying);
            let f = world.opts.faults.clone();
            let latency = draw(&rng, |r| r.range(0, f.persist_latency_ms));
            if latency > 0 {
                tokio::time::sleep(Duration::from_millis(latency)).await;
            }
            if world.faults_on() && draw(&rng, |r| r.chance(f.persist_fail)) {
                world.count(|c| &mut c.persist_failures);
                return Err(StorageError::unavailable(
                    "injected: the state write failed",
                ));
            }
            inner.apply(batch, now_wall_ms).await?;
            if world.faults_on() && draw(&rng, |r| r.chance(f.persist_fail_written)) {
                world.count(|c| &mut c.persists_failed_but_written);
                return Err(StorageError::unavailable(
                    "injected: the sync reported a failure, but the batch was written",
                ));
            }
            Ok(())
        })
    }

    fn dlq_list(
        &self,
        group: GroupName,
        max: usize,
    ) -> BoxFut<Result<Vec<DlqEntry>, StorageError>> {
        self.inner.dlq_list(group, max)
    }

    fn dlq_list_for_replay(
        &self,
        group: GroupName,
        max: usize,
    ) -> BoxFut<Result<Vec<DlqEntry>, StorageError>> {
        self.inner.dlq_list_for_replay(group, max)
    }

    fn dlq_replay_refused(&self, group: &GroupName, keys: &[DlqKey]) {
        self.inner.dlq_replay_refused(group, keys)
    }

    fn put_rate_rule(
        &self,
        topic: TopicName,
        rule: Option<RateRule>,
    ) -> BoxFut<Result<(), StorageError>> {
        self.inner.put_rate_rule(topic, rule)
    }
}
