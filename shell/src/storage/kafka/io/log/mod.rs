//! [`KafkaLog`]: the engine's `LogPort` on a Kafka cluster.
//!
//! `cfg(madsim)` chooses whole files: `real.rs` asks librdkafka's producer for metadata and
//! offsets, replaces a producer in a fatal state, watches the broker and seeks by time;
//! `sim.rs` asks a consumer of madsim-rdkafka's simulated broker, reads its topics once at
//! open, looks an unknown topic up in the background and holds the simulation's group
//! coordinator. Each offers the same names to this file.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use madsim_rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use madsim_rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use madsim_rdkafka::message::ToBytes;
use madsim_rdkafka::producer::FutureRecord;
use madsim_rdkafka::ClientConfig;
use madsim_tokio as tokio;
use tokio::sync::mpsc;
use unimesh_core::{GroupName, Offset, Partition, TopicName};

use super::client_log::{ClientLog, LoggedAdmin, LoggedProducer};
use super::properties::ClientRole;
use super::records::Outgoing;
use crate::storage::kafka::KafkaSettings;
use crate::storage::log::AppendItem;
use crate::storage::ports::{
    BoxFut, BrokerMetrics, GroupEvent, GroupLog, LogMetrics, LogPort, LogRead, StorageError,
    TopicFacts,
};

#[cfg(not(madsim))]
mod real;
#[cfg(madsim)]
mod sim;

#[cfg(not(madsim))]
use real as side;
#[cfg(madsim)]
use sim as side;

#[cfg(not(madsim))]
pub(super) use real::block_on;
pub(super) use side::Delivery;
use side::{GroupConsumer, Renewal, Side};

/// Counters of the Kafka backend for `/metrics`.
#[derive(Debug, Default)]
pub struct KafkaCounters {
    pub records_produced: AtomicU64,
    pub producer_errors: AtomicU64,
    pub rebalances: AtomicU64,
    pub out_of_range: AtomicU64,
    pub commit_failures: AtomicU64,
    pub progress_ranges_dropped: AtomicU64,
    pub log_divergences: AtomicU64,
    pub end_anomalies: AtomicU64,
    pub gaps_refuted: AtomicU64,
    pub progress_read_retries: AtomicU64,
    /// Producers built anew because the one in use was in a fatal state.
    pub client_rebuilds: AtomicU64,
    /// Group requests sent to a coordinator whose rebalance seemed stuck (`nudge.rs`).
    pub group_nudges: AtomicU64,
}

/// The shared producer, replaceable: librdkafka's idempotent producer can enter a fatal
/// state from which it never returns, so a fresh one takes its place ([`Renewal`] in
/// `real.rs`). Writers queue through [`ProducerSlot::send_result`], which holds the lock
/// only to queue, so the slot owns the only handle.
pub(super) struct ProducerSlot {
    current: Mutex<LoggedProducer>,
    /// What replaces a producer in a fatal state (nothing under madsim, whose simulated
    /// producer has none).
    renewal: Renewal,
}

impl ProducerSlot {
    /// Queues a record on the current producer (as `FutureProducer::send_result`, whose
    /// error hands the record back: hence its size).
    #[allow(clippy::result_large_err)]
    pub fn send_result<'a, K, P>(
        &self,
        record: FutureRecord<'a, K, P>,
    ) -> Result<Delivery, (KafkaError, FutureRecord<'a, K, P>)>
    where
        K: ToBytes + ?Sized,
        P: ToBytes + ?Sized,
    {
        let report = lock(&self.current).send_result(record)?;
        Ok(self.renewal.delivery(report))
    }
}

/// What the broker watch ([`KafkaLog::spawn_watch`]) found: why the broker is unreachable,
/// or why the producer is fatal, for health and readiness; both clear when it is over.
#[derive(Debug, Default)]
pub(super) struct BrokerHealth {
    unreachable: Mutex<Option<String>>,
    fatal: Mutex<Option<String>>,
}

/// The Kafka cluster as the engine's log: a shared idempotent producer, topic creation, end
/// offsets, and one consumer per subscription group.
#[derive(Clone)]
pub struct KafkaLog {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub settings: KafkaSettings,
    pub producer: ProducerSlot,
    admin: LoggedAdmin,
    /// What only this build's log has ([`Side`]: the runtime and the seek-by-time lookup
    /// in `real.rs`; the metadata client, the topic creation lock and the group
    /// coordinator in `sim.rs`).
    pub side: Side,
    /// Partition counts of the topics seen so far.
    topics: Mutex<BTreeMap<TopicName, u32>>,
    /// (earliest, end) per partition as last read from the broker (for lag and views).
    ends: Mutex<BTreeMap<(TopicName, Partition), (Offset, Offset)>>,
    /// Per partition, the end its log was shown to reach: past every record handed to the
    /// core, or found by a read that refuted a lower claim. A broker's end is a claim
    /// (tansu 0.6.0 claims the start of the last batch plus one): lag and the checks use
    /// the higher of the two, and only a read that confirms a lower end lowers this.
    shown: Mutex<BTreeMap<(TopicName, Partition), Offset>>,
    groups: Mutex<BTreeMap<GroupName, Arc<GroupConsumer>>>,
    events: Mutex<Option<mpsc::Sender<GroupEvent>>>,
    pub counters: KafkaCounters,
    health: BrokerHealth,
    pub progress: Arc<super::progress::ProgressReader>,
}

impl KafkaSettings {
    /// The client configuration a client of `role` starts from: the brokers, the
    /// timeouts, and the pass-through properties of its role ([`super::PropertyTables::for_role`]).
    pub(super) fn client_config(&self, role: ClientRole) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers);
        let ms = self.request_timeout.as_millis().to_string();
        c.set("socket.timeout.ms", &ms);
        for (k, v) in &self.properties.for_role(role) {
            c.set(k, v);
        }
        c
    }
}

impl KafkaLog {
    /// [`KafkaLog::connect`], then [`KafkaLog::ensure_own_topics`].
    pub async fn open(settings: KafkaSettings) -> Result<Self, StorageError> {
        let log = Self::connect(settings).await?;
        log.ensure_own_topics().await?;
        Ok(log)
    }

    /// Creates the producer, the admin client and the progress reader. Talks to no broker:
    /// an error is the configuration's (a librdkafka property it refuses).
    pub async fn connect(settings: KafkaSettings) -> Result<Self, StorageError> {
        let mut pc = settings.client_config(ClientRole::Producer);
        pc.set("acks", "all").set("enable.idempotence", "true").set(
            "message.timeout.ms",
            settings.request_timeout.as_millis().to_string(),
        );
        if !settings
            .properties
            .sets(ClientRole::Producer, "partitioner")
        {
            // What the Java client does, so keys land where other producers put them.
            pc.set("partitioner", "murmur2_random");
        }
        if !settings.properties.sets(ClientRole::Producer, "linger.ms") {
            pc.set("linger.ms", "2");
        }
        let producer: LoggedProducer = pc
            .create_with_context(ClientLog::new("producer"))
            .await
            .map_err(|e| StorageError::failed("cannot create the Kafka producer", e))?;
        let admin: LoggedAdmin = settings
            .client_config(ClientRole::Producer)
            .create_with_context(ClientLog::new("admin"))
            .await
            .map_err(|e| StorageError::failed("cannot create the Kafka admin client", e))?;
        let side = Side::new(&settings).await?;
        let progress = Arc::new(super::progress::ProgressReader::new(&settings).await?);
        let message_timeout = settings.request_timeout;
        let log = Self {
            inner: Arc::new(Inner {
                settings,
                producer: ProducerSlot {
                    current: Mutex::new(producer),
                    renewal: Renewal::new(pc, message_timeout),
                },
                admin,
                side,
                topics: Mutex::new(BTreeMap::new()),
                ends: Mutex::new(BTreeMap::new()),
                shown: Mutex::new(BTreeMap::new()),
                groups: Mutex::new(BTreeMap::new()),
                events: Mutex::new(None),
                counters: KafkaCounters::default(),
                health: BrokerHealth::default(),
                progress,
            }),
        };
        Ok(log)
    }

    /// Makes sure the progress and subscriptions topics exist (creating them), which needs
    /// the broker. `Unavailable` names the broker's answer (a later call may succeed); the
    /// others are refusals that stay.
    pub async fn ensure_own_topics(&self) -> Result<(), StorageError> {
        for (what, name) in [
            ("progress", &self.inner.settings.progress_topic),
            ("subscriptions", &self.inner.settings.subscriptions_topic),
        ] {
            let topic = TopicName::new(name)
                .map_err(|e| StorageError::Invalid(format!("the {what} topic: {e}")))?;
            self.topic_partitions(&topic, true)
                .await
                .map_err(|e| in_context(&format!("cannot create the {what} topic {topic}"), e))?;
        }
        self.preload().await?;
        Ok(())
    }

    /// The partition count of `topic` as the broker lists it, None when it has none.
    async fn listed_partitions(&self, topic: &TopicName) -> KafkaResult<Option<u32>> {
        let meta = match self.metadata(Some(topic.as_str())).await {
            Ok(m) => m,
            Err(e) if side::metadata_lacks_topic(&e) => return Ok(None),
            Err(e) => return Err(e),
        };
        Ok(meta
            .topics()
            .iter()
            .find(|t| t.name() == topic.as_str())
            .filter(|t| side::topic_listed(t))
            .map(|t| t.partitions().len() as u32))
    }

    pub fn counters(&self) -> &KafkaCounters {
        &self.inner.counters
    }

    pub fn settings(&self) -> &KafkaSettings {
        &self.inner.settings
    }

    /// The partition count of `topic`, creating it (with the configured partitions and
    /// replication; `compacted` for the mesh's own topics) when the broker has none.
    pub(super) async fn topic_partitions(
        &self,
        topic: &TopicName,
        compacted: bool,
    ) -> Result<u32, StorageError> {
        if let Some(&n) = lock(&self.inner.topics).get(topic) {
            return Ok(n);
        }
        let _creating = self.creating().await;
        let mut created = false;
        for _ in 0..20 {
            let found = self
                .listed_partitions(topic)
                .await
                .map_err(|e| StorageError::failed("Kafka metadata request failed", e))?;
            if let Some(n) = found {
                lock(&self.inner.topics).insert(topic.clone(), n);
                return Ok(n);
            }
            if !created {
                self.create_topic(topic, compacted).await?;
                created = true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(StorageError::unavailable(format!(
            "topic {topic} was created but the broker does not show its partitions"
        )))
    }

    async fn create_topic(&self, topic: &TopicName, compacted: bool) -> Result<(), StorageError> {
        let s = &self.inner.settings;
        let partitions = side::partitions_to_create(s.default_partitions as i32, compacted);
        let mut new = NewTopic::new(
            topic.as_str(),
            partitions,
            TopicReplication::Fixed(s.replication),
        );
        if compacted {
            new = new.set("cleanup.policy", "compact");
        }
        let opts = AdminOptions::new().operation_timeout(Some(s.request_timeout));
        let results = self
            .inner
            .admin
            .create_topics([&new], &opts)
            .await
            .map_err(|e| StorageError::failed(&format!("cannot create topic {topic}"), e))?;
        for r in results {
            match r {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, code)) => {
                    return Err(StorageError::failed(
                        &format!("the broker refused to create topic {name}"),
                        code,
                    ))
                }
            }
        }
        tracing::info!(%topic, partitions, replication = s.replication, compacted, "topic created");
        Ok(())
    }

    /// (earliest, end) of a partition, from the broker.
    pub(super) async fn watermarks(
        &self,
        topic: &TopicName,
        partition: Partition,
    ) -> Result<(Offset, Offset), StorageError> {
        let timeout = self.inner.settings.request_timeout;
        let (lo, hi) = self
            .fetch_watermarks(topic.as_str(), partition as i32, timeout)
            .await
            .map_err(|e| {
                StorageError::failed(
                    &format!("cannot read the offsets of {topic}/{partition}"),
                    e,
                )
            })?;
        let pair = (lo.max(0) as Offset, hi.max(0) as Offset);
        lock(&self.inner.ends).insert((topic.clone(), partition), pair);
        Ok(pair)
    }

    /// (earliest, end) of a partition as last read, without asking the broker, the end
    /// raised to what the log was shown to hold ([`Self::show_end`]).
    pub(super) fn cached_offsets(
        &self,
        topic: &TopicName,
        partition: Partition,
    ) -> Option<(Offset, Offset)> {
        let key = (topic.clone(), partition);
        let (earliest, end) = lock(&self.inner.ends).get(&key).copied()?;
        let shown = lock(&self.inner.shown).get(&key).copied().unwrap_or(0);
        Some((earliest, end.max(shown)))
    }

    /// The log of `partition` was shown to reach `end` (records read up to it, or a read
    /// past a claim); `confirmed`: a read confirmed that it ends there (a lost tail), so
    /// what was shown before no longer holds.
    pub(super) fn show_end(
        &self,
        topic: &TopicName,
        partition: Partition,
        end: Offset,
        confirmed: bool,
    ) {
        let mut shown = lock(&self.inner.shown);
        let e = shown.entry((topic.clone(), partition)).or_insert(end);
        *e = if confirmed { end } else { (*e).max(end) };
    }

    /// Reads every known partition's end offsets every `every` (lag in views and metrics).
    pub fn spawn_offsets_refresh(&self, every: Duration) {
        let log = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                if Arc::strong_count(&log.inner) <= 1 {
                    break;
                }
                // Each read blocks its thread up to the request timeout while the broker
                // is away; the watch says when it is back.
                if lock(&log.inner.health.unreachable).is_some() {
                    continue;
                }
                let topics: Vec<(TopicName, u32)> = lock(&log.inner.topics)
                    .iter()
                    .map(|(t, n)| (t.clone(), *n))
                    .collect();
                for (t, n) in topics {
                    for p in 0..n {
                        let _ = log.watermarks(&t, p).await;
                    }
                }
            }
        });
    }

    fn events(&self) -> Option<mpsc::Sender<GroupEvent>> {
        lock(&self.inner.events).clone()
    }
}

/// `e` with `context` (what was being done) before its message: its kind and its source
/// kept, so a caller's decisions on the kind (a 4xx or a 503, fenced) stay as they were.
pub(super) fn in_context(context: &str, e: StorageError) -> StorageError {
    match e {
        StorageError::Invalid(m) => StorageError::Invalid(format!("{context}: {m}")),
        StorageError::TooLarge(m) => StorageError::TooLarge(format!("{context}: {m}")),
        StorageError::Unavailable { what, source } => StorageError::Unavailable {
            what: format!("{context}: {what}"),
            source,
        },
        StorageError::Fenced(m) => StorageError::Fenced(format!("{context}: {m}")),
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock means a holder panicked between consistent states of these plain
    // maps; the data is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl KafkaLog {
    /// A broker error as the publisher sees it (503), with what health knows of the
    /// broker; `e` is kept as its source.
    fn produce_error(&self, e: &KafkaError) -> StorageError {
        let what = match self.fault() {
            Some(fault) => format!("the Kafka broker did not take the write: {e} ({fault})"),
            None => format!("the Kafka broker did not take the write: {e}"),
        };
        StorageError::Unavailable {
            what,
            source: Some(Arc::new(e.clone())),
        }
    }
}

impl LogPort for KafkaLog {
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
        let consumer = lock(&self.inner.groups).get(&group).cloned();
        Box::pin(async move {
            match consumer {
                Some(c) => c.fetch(partition, from, max, max_bytes, wait_ms).await,
                None => LogRead::Failed(format!(
                    "group {group} has no Kafka consumer here (topic {topic})"
                )),
            }
        })
    }

    fn append(
        &self,
        topic: TopicName,
        items: Vec<AppendItem>,
    ) -> BoxFut<Result<Vec<(Partition, Offset)>, StorageError>> {
        let log = self.clone();
        Box::pin(async move {
            let seen = log.usable_producer().await?;
            log.topic_partitions(&topic, false).await?;
            let inner = &log.inner;
            let mut pending = Vec::with_capacity(items.len());
            for item in &items {
                let record = crate::event::to_kafka(&item.value)
                    .map_err(|e| StorageError::Invalid(e.to_string()))?;
                let headers: Vec<(&str, &[u8])> = record
                    .headers
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_ref()))
                    .collect();
                let out = Outgoing::new(&headers, record.value.as_ref());
                let mut fr = out.record(topic.as_str());
                if let Some(k) = &item.key {
                    fr = fr.key(k.as_str());
                }
                // Queue full: wait for earlier reports to drain, then queue again.
                let fut = loop {
                    match inner.producer.send_result(fr) {
                        Ok(f) => break f,
                        Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                            fr = back;
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        Err((e, _)) => {
                            inner
                                .counters
                                .producer_errors
                                .fetch_add(1, Ordering::Relaxed);
                            log.after_write_failure(seen, &topic, &e).await;
                            return Err(log.produce_error(&e));
                        }
                    }
                };
                pending.push(fut);
            }
            let mut out = Vec::with_capacity(pending.len());
            let mut failed = None;
            let mut first_error = None;
            for f in pending {
                match f.await {
                    Ok(Ok((p, o))) => out.push((p.max(0) as Partition, o.max(0) as Offset)),
                    Ok(Err((e, _))) => {
                        inner
                            .counters
                            .producer_errors
                            .fetch_add(1, Ordering::Relaxed);
                        failed.get_or_insert(log.produce_error(&e));
                        first_error.get_or_insert(e);
                    }
                    Err(_) => {
                        inner
                            .counters
                            .producer_errors
                            .fetch_add(1, Ordering::Relaxed);
                        failed.get_or_insert(StorageError::unavailable(
                            "the Kafka producer dropped the write",
                        ));
                    }
                }
            }
            if let Some(e) = &first_error {
                log.after_write_failure(seen, &topic, e).await;
            }
            if let Some(e) = failed {
                return Err(e);
            }
            inner
                .counters
                .records_produced
                .fetch_add(out.len() as u64, Ordering::Relaxed);
            Ok(out)
        })
    }

    fn prepare_topic(
        &self,
        topic: TopicName,
        with_offsets: bool,
    ) -> BoxFut<Result<TopicFacts, StorageError>> {
        let log = self.clone();
        Box::pin(async move {
            let partitions = log.topic_partitions(&topic, false).await?;
            let mut offsets = Vec::new();
            if with_offsets {
                for p in 0..partitions {
                    let pair = match log.cached_offsets(&topic, p) {
                        Some(pair) => pair,
                        None => log.watermarks(&topic, p).await?,
                    };
                    offsets.push(pair);
                }
            }
            Ok(TopicFacts {
                partitions,
                offsets,
            })
        })
    }

    fn partitions(&self, topic: TopicName) -> BoxFut<Option<u32>> {
        let known = lock(&self.inner.topics).get(&topic).copied();
        let log = self.clone();
        let ask = Box::pin(async move {
            if known.is_some() {
                return known;
            }
            // A topic another instance (or another producer) created.
            let n = log.listed_partitions(&topic).await.ok()??;
            lock(&log.inner.topics).insert(topic, n);
            Some(n)
        });
        side::ask_broker(known.is_some(), ask, || None)
    }

    /// Kafka's offsets-for-times, checked against the records (`kafka::times`); "no record
    /// that new" is the partition's end. Not under madsim (its simulated broker is not
    /// asked): the trait's refusal.
    fn offset_for_time(
        &self,
        topic: TopicName,
        partition: Partition,
        time_ms: u64,
    ) -> BoxFut<Result<Offset, StorageError>> {
        self.seek_by_time(topic, partition, time_ms)
    }

    fn offsets(
        &self,
        topic: TopicName,
        partition: Partition,
    ) -> BoxFut<Result<(Offset, Offset), StorageError>> {
        let cached = self.cached_offsets(&topic, partition);
        let log = self.clone();
        let meanwhile = {
            let topic = topic.clone();
            move || {
                Err(StorageError::unavailable(format!(
                    "the offsets of {topic}/{partition} are being read from the broker; try again"
                )))
            }
        };
        let ask = Box::pin(async move {
            match cached {
                Some(pair) => Ok(pair),
                None => log.watermarks(&topic, partition).await,
            }
        });
        side::ask_broker(cached.is_some(), ask, meanwhile)
    }

    fn enforce_retention(&self) -> BoxFut<Result<usize, StorageError>> {
        // Retention is the broker's (retention.ms of the topic).
        Box::pin(async { Ok(0) })
    }

    fn fault(&self) -> Option<String> {
        let h = &self.inner.health;
        if let Some(why) = lock(&h.fatal).as_ref() {
            return Some(format!(
                "the Kafka producer is in a fatal state ({why}); a new one is being built"
            ));
        }
        lock(&h.unreachable).as_ref().map(|why| {
            format!(
                "the Kafka broker {} is unreachable: {why}",
                self.inner.settings.brokers
            )
        })
    }

    fn metrics(&self) -> Option<LogMetrics> {
        let c = &self.inner.counters;
        Some(LogMetrics {
            records_appended: c.records_produced.load(Ordering::Relaxed),
            synced_writes: 0,
            write_failures: c.producer_errors.load(Ordering::Relaxed),
            disk_bytes: None,
            broker: Some(BrokerMetrics {
                rebalances: c.rebalances.load(Ordering::Relaxed),
                producer_errors: c.producer_errors.load(Ordering::Relaxed),
                out_of_range: c.out_of_range.load(Ordering::Relaxed),
                commit_failures: c.commit_failures.load(Ordering::Relaxed),
                progress_ranges_dropped: c.progress_ranges_dropped.load(Ordering::Relaxed),
                log_divergences: c.log_divergences.load(Ordering::Relaxed),
                end_anomalies: c.end_anomalies.load(Ordering::Relaxed),
                gaps_refuted: c.gaps_refuted.load(Ordering::Relaxed),
                progress_read_retries: c.progress_read_retries.load(Ordering::Relaxed),
                broker_up: lock(&self.inner.health.unreachable).is_none(),
                client_rebuilds: c.client_rebuilds.load(Ordering::Relaxed),
                group_nudges: c.group_nudges.load(Ordering::Relaxed),
            }),
        })
    }

    fn group(&self) -> Option<&dyn GroupLog> {
        Some(self)
    }

    fn close(&self) -> BoxFut<()> {
        let consumers: Vec<Arc<GroupConsumer>> = std::mem::take(&mut *lock(&self.inner.groups))
            .into_values()
            .collect();
        side::close(consumers)
    }
}

/// Kafka's consumer groups: one consumer per subscription group.
impl GroupLog for KafkaLog {
    fn attach(&self, events: mpsc::Sender<GroupEvent>) {
        *lock(&self.inner.events) = Some(events);
    }

    fn join(&self, group: &GroupName, topic: &TopicName) -> Result<(), StorageError> {
        if lock(&self.inner.groups).contains_key(group) {
            return Ok(());
        }
        let events = self.events().ok_or_else(|| {
            StorageError::unavailable("the Kafka log is not attached to an engine")
        })?;
        let consumer = GroupConsumer::start(self.clone(), group.clone(), topic.clone(), events)?;
        lock(&self.inner.groups).insert(group.clone(), Arc::new(consumer));
        Ok(())
    }

    fn leave(&self, group: &GroupName) {
        let consumer = lock(&self.inner.groups).remove(group);
        if let Some(c) = consumer {
            c.stop();
        }
    }

    fn commit(&self, group: &GroupName, _topic: &TopicName, partition: Partition, offset: Offset) {
        if let Some(c) = lock(&self.inner.groups).get(group) {
            c.commit(partition, offset);
        }
    }

    fn instance(&self) -> Option<String> {
        Some(self.inner.settings.instance.clone())
    }
}
