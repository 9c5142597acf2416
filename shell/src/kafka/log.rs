//! [`KafkaLog`]: the engine's `LogPort` on a Kafka cluster.

use std::collections::BTreeMap;
#[cfg(not(madsim))]
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use madsim_rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use madsim_rdkafka::client::DefaultClientContext;
#[cfg(madsim)]
use madsim_rdkafka::consumer::BaseConsumer;
use madsim_rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use madsim_rdkafka::metadata::{Metadata, MetadataTopic};
use madsim_rdkafka::producer::FutureProducer;
#[cfg(not(madsim))]
use madsim_rdkafka::producer::Producer as _;
use madsim_rdkafka::ClientConfig;
use madsim_tokio as tokio;
use tokio::sync::mpsc;
use unimesh_core::{GroupName, Offset, Partition, TopicName};

#[cfg(madsim)]
use super::assigned::AssignedConsumer as GroupConsumer;
#[cfg(not(madsim))]
use super::consumer::GroupConsumer;
use super::records::Outgoing;
use super::KafkaSettings;
use crate::engine::{AppendError, BoxFut, BrokerMetrics, GroupEvent, LogMetrics, LogPort, LogRead};
use crate::log::AppendItem;

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
}

/// The Kafka cluster as the engine's log: a shared idempotent producer, topic creation, end
/// offsets, and one consumer per subscription group.
#[derive(Clone)]
pub struct KafkaLog {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub settings: KafkaSettings,
    pub producer: FutureProducer,
    admin: AdminClient<DefaultClientContext>,
    /// Metadata and end offsets: the simulated producer has no client to ask them with.
    #[cfg(madsim)]
    meta: BaseConsumer,
    /// Held while a topic is looked up and created: the simulated broker's "create"
    /// replaces a topic that exists, records and all, so two must never race.
    #[cfg(madsim)]
    creating: tokio::sync::Mutex<()>,
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
    #[cfg(not(madsim))]
    pub runtime: tokio::runtime::Handle,
    pub counters: KafkaCounters,
    pub progress: Arc<super::progress::ProgressReader>,
}

impl KafkaSettings {
    /// The client configuration every client of the mesh starts from: the brokers, the
    /// pass-through properties, and the timeouts.
    pub(super) fn client_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers);
        let ms = self.request_timeout.as_millis().to_string();
        c.set("socket.timeout.ms", &ms);
        for (k, v) in &self.properties {
            c.set(k, v);
        }
        c
    }
}

/// Runs `f` to completion from synchronous code on the engine's runtime, on a thread of
/// its own (so it may be called from inside the runtime without blocking it re-entrantly).
/// Not under madsim: one simulator thread cannot wait for itself (see the `LogPort` impl).
#[cfg(not(madsim))]
pub(super) fn block_on<F>(runtime: &tokio::runtime::Handle, f: F) -> F::Output
where
    F: Future + Send,
    F::Output: Send,
{
    std::thread::scope(|s| {
        s.spawn(|| runtime.block_on(f))
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

impl KafkaLog {
    /// Connects the producer and the admin client and makes sure the progress topic exists.
    pub async fn open(settings: KafkaSettings) -> Result<Self, String> {
        let mut pc = settings.client_config();
        pc.set("acks", "all").set("enable.idempotence", "true").set(
            "message.timeout.ms",
            settings.request_timeout.as_millis().to_string(),
        );
        if !settings.properties.contains_key("partitioner") {
            // What the Java client does, so keys land where other producers put them.
            pc.set("partitioner", "murmur2_random");
        }
        if !settings.properties.contains_key("linger.ms") {
            pc.set("linger.ms", "2");
        }
        let producer: FutureProducer = pc
            .create()
            .await
            .map_err(|e| format!("cannot create the Kafka producer: {e}"))?;
        let admin: AdminClient<DefaultClientContext> = settings
            .client_config()
            .create()
            .await
            .map_err(|e| format!("cannot create the Kafka admin client: {e}"))?;
        #[cfg(madsim)]
        let meta: BaseConsumer = settings
            .client_config()
            .create()
            .await
            .map_err(|e| format!("cannot create the Kafka metadata client: {e}"))?;
        let progress = Arc::new(super::progress::ProgressReader::new(&settings).await?);
        let log = Self {
            inner: Arc::new(Inner {
                settings,
                producer,
                admin,
                #[cfg(madsim)]
                meta,
                #[cfg(madsim)]
                creating: tokio::sync::Mutex::new(()),
                topics: Mutex::new(BTreeMap::new()),
                ends: Mutex::new(BTreeMap::new()),
                shown: Mutex::new(BTreeMap::new()),
                groups: Mutex::new(BTreeMap::new()),
                events: Mutex::new(None),
                #[cfg(not(madsim))]
                runtime: tokio::runtime::Handle::current(),
                counters: KafkaCounters::default(),
                progress,
            }),
        };
        for (what, name) in [
            ("progress", &log.inner.settings.progress_topic),
            ("subscriptions", &log.inner.settings.subscriptions_topic),
        ] {
            let topic = TopicName::new(name).map_err(|e| format!("the {what} topic: {e}"))?;
            log.topic_partitions(&topic, true)
                .await
                .map_err(|e| format!("cannot create the {what} topic {topic}: {e:?}"))?;
        }
        #[cfg(madsim)]
        log.preload().await?;
        Ok(log)
    }

    /// Under madsim the synchronous questions of the `LogPort` are answered from what was
    /// read last: every topic the broker has, and their offsets, are read once at open.
    #[cfg(madsim)]
    async fn preload(&self) -> Result<(), String> {
        let meta = self
            .metadata(None)
            .await
            .map_err(|e| format!("Kafka metadata request failed: {e}"))?;
        let mut listed = Vec::new();
        for t in meta.topics() {
            let Ok(name) = TopicName::new(t.name()) else {
                continue;
            };
            if topic_listed(t) {
                let n = t.partitions().len() as u32;
                lock(&self.inner.topics).insert(name.clone(), n);
                listed.push((name, n));
            }
        }
        for (t, n) in listed {
            for p in 0..n {
                self.watermarks(&t, p).await?;
            }
        }
        Ok(())
    }

    /// Metadata of one topic, or of all.
    async fn metadata(&self, topic: Option<&str>) -> KafkaResult<Metadata> {
        let timeout = self.inner.settings.request_timeout;
        #[cfg(not(madsim))]
        let meta = self
            .inner
            .producer
            .client()
            .fetch_metadata(topic, timeout)
            .await;
        #[cfg(madsim)]
        let meta = self.inner.meta.fetch_metadata(topic, timeout).await;
        meta
    }

    /// The partition count of `topic` as the broker lists it, None when it has none.
    async fn listed_partitions(&self, topic: &TopicName) -> KafkaResult<Option<u32>> {
        let meta = match self.metadata(Some(topic.as_str())).await {
            Ok(m) => m,
            // The simulated broker answers a topic it does not have with an error.
            #[cfg(madsim)]
            Err(KafkaError::MetadataFetch(RDKafkaErrorCode::UnknownTopic)) => return Ok(None),
            Err(e) => return Err(e),
        };
        Ok(meta
            .topics()
            .iter()
            .find(|t| t.name() == topic.as_str())
            .filter(|t| topic_listed(t))
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
    ) -> Result<u32, AppendError> {
        if let Some(&n) = lock(&self.inner.topics).get(topic) {
            return Ok(n);
        }
        #[cfg(madsim)]
        let _creating = self.inner.creating.lock().await;
        let mut created = false;
        for _ in 0..20 {
            let found = self.listed_partitions(topic).await.map_err(|e| {
                AppendError::Unavailable(format!("Kafka metadata request failed: {e}"))
            })?;
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
        Err(AppendError::Unavailable(format!(
            "topic {topic} was created but the broker does not show its partitions"
        )))
    }

    async fn create_topic(&self, topic: &TopicName, compacted: bool) -> Result<(), AppendError> {
        let s = &self.inner.settings;
        let partitions = s.default_partitions as i32;
        // The simulated broker ignores keys (it places records round robin), so a
        // compacted topic whose newest record of a key must win has one partition there.
        #[cfg(madsim)]
        let partitions = if compacted { 1 } else { partitions };
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
            .map_err(|e| AppendError::Unavailable(format!("cannot create topic {topic}: {e}")))?;
        for r in results {
            match r {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, code)) => {
                    return Err(AppendError::Unavailable(format!(
                        "the broker refused to create topic {name}: {code}"
                    )))
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
    ) -> Result<(Offset, Offset), String> {
        let timeout = self.inner.settings.request_timeout;
        #[cfg(not(madsim))]
        let client = self.inner.producer.client();
        #[cfg(madsim)]
        let client = &self.inner.meta;
        let (lo, hi) = client
            .fetch_watermarks(topic.as_str(), partition as i32, timeout)
            .await
            .map_err(|e| format!("cannot read the offsets of {topic}/{partition}: {e}"))?;
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

    /// (earliest, end) of a partition as the broker last claimed them.
    #[cfg(not(madsim))]
    pub(super) fn claimed_offsets(
        &self,
        topic: &TopicName,
        partition: Partition,
    ) -> Option<(Offset, Offset)> {
        lock(&self.inner.ends)
            .get(&(topic.clone(), partition))
            .copied()
    }

    /// The log of `partition` was shown to reach `end` (records read up to it, or a read
    /// past a claim); `confirmed`: a read confirmed that it ends there (a lost tail), so
    /// what was shown before no longer holds.
    #[cfg_attr(madsim, allow(dead_code))]
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

/// Whether the broker lists `t` as a usable topic.
fn topic_listed(t: &MetadataTopic) -> bool {
    #[cfg(not(madsim))]
    let ok = t.error().is_none();
    // The simulated broker lists only topics it has, without errors.
    #[cfg(madsim)]
    let ok = true;
    ok && !t.partitions().is_empty()
}

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock means a holder panicked between consistent states of these plain
    // maps; the data is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A broker error as the publisher sees it (503).
fn produce_error(e: &KafkaError) -> AppendError {
    AppendError::Unavailable(format!("the Kafka broker did not take the write: {e}"))
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
    ) -> BoxFut<Result<Vec<(Partition, Offset)>, AppendError>> {
        let log = self.clone();
        Box::pin(async move {
            log.topic_partitions(&topic, false).await?;
            let inner = &log.inner;
            let mut pending = Vec::with_capacity(items.len());
            for item in &items {
                let record = crate::event::to_kafka(&item.value)
                    .map_err(|e| AppendError::Invalid(e.to_string()))?;
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
                            return Err(produce_error(&e));
                        }
                    }
                };
                pending.push(fut);
            }
            let mut out = Vec::with_capacity(pending.len());
            let mut failed = None;
            for f in pending {
                match f.await {
                    Ok(Ok((p, o))) => out.push((p.max(0) as Partition, o.max(0) as Offset)),
                    Ok(Err((e, _))) => {
                        inner
                            .counters
                            .producer_errors
                            .fetch_add(1, Ordering::Relaxed);
                        failed.get_or_insert(produce_error(&e));
                    }
                    Err(_) => {
                        inner
                            .counters
                            .producer_errors
                            .fetch_add(1, Ordering::Relaxed);
                        failed.get_or_insert(AppendError::Unavailable(
                            "the Kafka producer dropped the write".into(),
                        ));
                    }
                }
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

    fn ensure_topic(&self, topic: &TopicName) -> Result<u32, AppendError> {
        if let Some(&n) = lock(&self.inner.topics).get(topic) {
            return Ok(n);
        }
        #[cfg(not(madsim))]
        return block_on(&self.inner.runtime, self.topic_partitions(topic, false));
        // Under madsim the answer comes later: the topic is looked up (and created) in the
        // background, and the caller is told to try again.
        #[cfg(madsim)]
        {
            let (log, t) = (self.clone(), topic.clone());
            tokio::spawn(async move { log.topic_partitions(&t, false).await });
            Err(AppendError::Unavailable(format!(
                "topic {topic} is being looked up at the broker; try again"
            )))
        }
    }

    fn partitions(&self, topic: &TopicName) -> Option<u32> {
        if let Some(&n) = lock(&self.inner.topics).get(topic) {
            return Some(n);
        }
        // A topic another instance (or another producer) created.
        #[cfg(not(madsim))]
        return block_on(&self.inner.runtime, async {
            let n = self.listed_partitions(topic).await.ok()??;
            lock(&self.inner.topics).insert(topic.clone(), n);
            Some(n)
        });
        #[cfg(madsim)]
        {
            let (log, t) = (self.clone(), topic.clone());
            tokio::spawn(async move {
                if let Ok(Some(n)) = log.listed_partitions(&t).await {
                    lock(&log.inner.topics).insert(t, n);
                }
            });
            None
        }
    }

    fn offsets(&self, topic: &TopicName, partition: Partition) -> Result<(Offset, Offset), String> {
        if let Some(pair) = self.cached_offsets(topic, partition) {
            return Ok(pair);
        }
        #[cfg(not(madsim))]
        return block_on(&self.inner.runtime, self.watermarks(topic, partition));
        #[cfg(madsim)]
        {
            let (log, t) = (self.clone(), topic.clone());
            tokio::spawn(async move { log.watermarks(&t, partition).await });
            Err(format!(
                "the offsets of {topic}/{partition} are being read from the broker; try again"
            ))
        }
    }

    fn enforce_retention(&self) -> Result<usize, String> {
        // Retention is the broker's (retention.ms of the topic).
        Ok(0)
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
            }),
        })
    }

    fn assigns_partitions(&self) -> bool {
        true
    }

    fn attach(&self, events: mpsc::Sender<GroupEvent>) {
        *lock(&self.inner.events) = Some(events);
    }

    fn join(&self, group: &GroupName, topic: &TopicName) -> Result<(), String> {
        if lock(&self.inner.groups).contains_key(group) {
            return Ok(());
        }
        let events = self
            .events()
            .ok_or_else(|| "the Kafka log is not attached to an engine".to_owned())?;
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

    fn close(&self) -> BoxFut<()> {
        let consumers: Vec<Arc<GroupConsumer>> = std::mem::take(&mut *lock(&self.inner.groups))
            .into_values()
            .collect();
        #[cfg(madsim)]
        return Box::pin(async move {
            // Explicit assignment revokes nothing: the progress is in the progress topic.
            for c in &consumers {
                c.stop();
            }
        });
        #[cfg(not(madsim))]
        Box::pin(async move {
            // Closing revokes: each consumer's callback waits for the engine to flush.
            let _ = tokio::task::spawn_blocking(move || {
                for c in &consumers {
                    c.stop();
                }
                for c in consumers {
                    c.join();
                }
            })
            .await;
        })
    }
}
