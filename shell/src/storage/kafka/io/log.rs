//! [`KafkaLog`]: the engine's `LogPort` on a Kafka cluster.

use std::collections::BTreeMap;
#[cfg(not(madsim))]
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use madsim_rdkafka::admin::{AdminOptions, NewTopic, TopicReplication};
use madsim_rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use madsim_rdkafka::message::ToBytes;
use madsim_rdkafka::metadata::{Metadata, MetadataTopic};
#[cfg(not(madsim))]
use madsim_rdkafka::producer::Producer as _;
use madsim_rdkafka::producer::{DeliveryFuture, FutureRecord};
use madsim_rdkafka::ClientConfig;
use madsim_tokio as tokio;
use tokio::sync::mpsc;
use unimesh_core::{GroupName, Offset, Partition, TopicName};

#[cfg(madsim)]
use super::client_log::LoggedConsumer;
use super::client_log::{ClientLog, LoggedAdmin, LoggedProducer};
#[cfg(not(madsim))]
use super::consumer::GroupConsumer;
use super::properties::ClientRole;
use super::records::Outgoing;
#[cfg(madsim)]
use super::simulated::GroupConsumer;
use crate::storage::kafka::KafkaSettings;
use crate::storage::log::AppendItem;
use crate::storage::ports::{
    BoxFut, BrokerMetrics, GroupEvent, GroupLog, LogMetrics, LogPort, LogRead, StorageError,
    TopicFacts,
};

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
/// state (after an outage: `ProducerFenced`, `OutOfOrderSequence`) from which it never
/// returns, so a fresh one is built from the same configuration and takes its place
/// ([`KafkaLog::rebuild_producer`]). Writers queue through [`ProducerSlot::send_result`],
/// which holds the lock only to queue, so the slot owns the only handle and the old
/// producer is closed on a thread of its own.
pub(super) struct ProducerSlot {
    current: Mutex<LoggedProducer>,
    /// What every write's [`Delivery`] reports to (progress and DLQ writes too).
    #[cfg_attr(madsim, allow(dead_code))]
    reports: Arc<Reports>,
    /// Counts the replacements (a failure names the producer it came from by it).
    #[cfg_attr(madsim, allow(dead_code))]
    generation: AtomicU64,
    #[cfg_attr(madsim, allow(dead_code))]
    config: ClientConfig,
    /// Held while a producer is being built, so two failures make one new producer.
    #[cfg(not(madsim))]
    rebuilding: tokio::sync::Mutex<()>,
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
        Ok(Delivery {
            report,
            #[cfg(not(madsim))]
            generation: self.generation(),
            #[cfg(not(madsim))]
            reports: self.reports.clone(),
        })
    }

    /// The current producer, for questions (metadata, offsets) rather than writes.
    #[cfg(not(madsim))]
    fn get(&self) -> LoggedProducer {
        lock(&self.current).clone()
    }

    #[cfg_attr(madsim, allow(dead_code))]
    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// Why the current producer cannot be used, if it cannot: librdkafka's fatal error,
    /// or a write's error that leaves it unusable.
    #[cfg(not(madsim))]
    fn fatal(&self) -> Option<String> {
        let fatal = lock(&self.current)
            .client()
            .fatal_error()
            .map(|(code, reason)| format!("{code:?}: {reason}"));
        fatal.or_else(|| {
            lock(&self.reports.broken)
                .as_ref()
                .filter(|(g, _)| *g == self.generation())
                .map(|(_, why)| why.clone())
        })
    }
}

/// What the writes of the producers tell about them, shared with every [`Delivery`].
#[derive(Debug)]
pub(super) struct Reports {
    /// A producer whose writes failed in a way that leaves it unusable although librdkafka
    /// does not flag it fatal: its generation and why. (Under madsim nothing reads it:
    /// the simulated producer has no fatal state to rebuild from.)
    #[cfg_attr(madsim, allow(dead_code))]
    broken: Mutex<Option<(u64, String)>>,
    /// Since when the broker has answered every probe of the watch (None while it does
    /// not, or before the first).
    #[cfg(not(madsim))]
    reachable_since: Mutex<Option<std::time::Instant>>,
    /// How long a write may wait for the broker (`message.timeout.ms`).
    #[cfg_attr(madsim, allow(dead_code))]
    message_timeout: Duration,
}

#[cfg(not(madsim))]
impl Reports {
    /// Why a write's error `e` leaves the producer unusable, if it does: an error that
    /// breaks the idempotent producer's state (tansu answers `ProducerFenced` to every
    /// write after an outage, without librdkafka flagging it fatal), or a write that timed
    /// out although the broker answered every probe for longer than a write may wait
    /// (tansu restarted empty answers `UnknownProducerId` to the old producer id forever,
    /// which librdkafka retries until the write times out).
    fn breaks(&self, e: &KafkaError) -> Option<String> {
        if fatal_code(e) {
            return Some(e.to_string());
        }
        let timed_out = e.rdkafka_error_code() == Some(RDKafkaErrorCode::MessageTimedOut);
        let answered =
            lock(&self.reachable_since).is_some_and(|since| since.elapsed() > self.message_timeout);
        (timed_out && answered)
            .then(|| format!("{e}, although the broker answered throughout: the producer is stuck"))
    }
}

/// The delivery report of one write ([`ProducerSlot::send_result`]), resolving to what
/// `DeliveryFuture` resolves to; an error that leaves the producer unusable marks it
/// broken on the way, whichever writer (publish, progress, DLQ) saw it.
pub(super) struct Delivery {
    report: DeliveryFuture,
    #[cfg(not(madsim))]
    generation: u64,
    #[cfg(not(madsim))]
    reports: Arc<Reports>,
}

impl std::future::Future for Delivery {
    type Output = <DeliveryFuture as std::future::Future>::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let out = std::pin::Pin::new(&mut self.report).poll(cx);
        #[cfg(not(madsim))]
        if let std::task::Poll::Ready(Ok(Err((e, _)))) = &out {
            if let Some(why) = self.reports.breaks(e) {
                let mut broken = lock(&self.reports.broken);
                if broken.as_ref().is_none_or(|(g, _)| *g < self.generation) {
                    *broken = Some((self.generation, why));
                }
            }
        }
        out
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
    /// Metadata and end offsets: the simulated producer has no client to ask them with.
    #[cfg(madsim)]
    meta: LoggedConsumer,
    /// Held while a topic is looked up and created: the simulated broker's "create"
    /// replaces a topic that exists, records and all, so two must never race.
    #[cfg(madsim)]
    creating: tokio::sync::Mutex<()>,
    /// The simulation's group coordinator (the simulated broker has none; `simulated.rs`).
    #[cfg(madsim)]
    pub coordinator: std::sync::OnceLock<Arc<dyn super::simulated::SimCoordinator>>,
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
    /// Seek by time (offsets-for-times); the simulated broker is not asked.
    #[cfg(not(madsim))]
    times: super::times::TimeLookup,
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
    /// [`KafkaLog::connect`], then [`KafkaLog::ensure_own_topics`].
    pub async fn open(settings: KafkaSettings) -> Result<Self, String> {
        let log = Self::connect(settings).await?;
        log.ensure_own_topics().await.map_err(|e| e.to_string())?;
        Ok(log)
    }

    /// Creates the producer, the admin client and the progress reader. Talks to no broker:
    /// an error is the configuration's (a librdkafka property it refuses).
    pub async fn connect(settings: KafkaSettings) -> Result<Self, String> {
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
            .map_err(|e| format!("cannot create the Kafka producer: {e}"))?;
        let admin: LoggedAdmin = settings
            .client_config(ClientRole::Producer)
            .create_with_context(ClientLog::new("admin"))
            .await
            .map_err(|e| format!("cannot create the Kafka admin client: {e}"))?;
        #[cfg(madsim)]
        let meta: LoggedConsumer = settings
            .client_config(ClientRole::Consumer)
            .create_with_context(ClientLog::new("metadata"))
            .await
            .map_err(|e| format!("cannot create the Kafka metadata client: {e}"))?;
        let progress = Arc::new(super::progress::ProgressReader::new(&settings).await?);
        let message_timeout = settings.request_timeout;
        let log = Self {
            inner: Arc::new(Inner {
                settings,
                producer: ProducerSlot {
                    current: Mutex::new(producer),
                    reports: Arc::new(Reports {
                        broken: Mutex::new(None),
                        #[cfg(not(madsim))]
                        reachable_since: Mutex::new(None),
                        message_timeout,
                    }),
                    generation: AtomicU64::new(0),
                    config: pc,
                    #[cfg(not(madsim))]
                    rebuilding: tokio::sync::Mutex::new(()),
                },
                admin,
                #[cfg(madsim)]
                meta,
                #[cfg(madsim)]
                creating: tokio::sync::Mutex::new(()),
                #[cfg(madsim)]
                coordinator: std::sync::OnceLock::new(),
                topics: Mutex::new(BTreeMap::new()),
                ends: Mutex::new(BTreeMap::new()),
                shown: Mutex::new(BTreeMap::new()),
                groups: Mutex::new(BTreeMap::new()),
                events: Mutex::new(None),
                #[cfg(not(madsim))]
                runtime: tokio::runtime::Handle::current(),
                #[cfg(not(madsim))]
                times: super::times::TimeLookup::default(),
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
            let named = |m: String| format!("cannot create the {what} topic {topic}: {m}");
            self.topic_partitions(&topic, true)
                .await
                .map_err(|e| match e {
                    StorageError::TooLarge(m) => StorageError::TooLarge(named(m)),
                    StorageError::Invalid(m) => StorageError::Invalid(named(m)),
                    StorageError::Unavailable { what, source } => StorageError::Unavailable {
                        what: named(what),
                        source,
                    },
                    e @ StorageError::Fenced(_) => e,
                })?;
        }
        #[cfg(madsim)]
        self.preload().await.map_err(StorageError::unavailable)?;
        Ok(())
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
            .get()
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
    ) -> Result<u32, StorageError> {
        if let Some(&n) = lock(&self.inner.topics).get(topic) {
            return Ok(n);
        }
        #[cfg(madsim)]
        let _creating = self.inner.creating.lock().await;
        let mut created = false;
        for _ in 0..20 {
            let found = self.listed_partitions(topic).await.map_err(|e| {
                StorageError::unavailable(format!("Kafka metadata request failed: {e}"))
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
        Err(StorageError::unavailable(format!(
            "topic {topic} was created but the broker does not show its partitions"
        )))
    }

    async fn create_topic(&self, topic: &TopicName, compacted: bool) -> Result<(), StorageError> {
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
            .map_err(|e| StorageError::unavailable(format!("cannot create topic {topic}: {e}")))?;
        for r in results {
            match r {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, code)) => {
                    return Err(StorageError::unavailable(format!(
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
        let producer = self.inner.producer.get();
        #[cfg(not(madsim))]
        let client = producer.client();
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

    /// Watches the broker every `every` on a thread of its own: a metadata request through
    /// the producer is the probe (answered: the broker is reachable; failed within the
    /// probe timeout: it is not — librdkafka's error callbacks say when every broker went
    /// down but never that one came back, and a connection can be up while nothing is
    /// answered); a producer in a fatal state is replaced; topics the mesh knew and the
    /// broker no longer lists (a broker restarted empty) are forgotten, so their next use
    /// creates them again, and the mesh's own topics are created again at once.
    #[cfg(not(madsim))]
    pub fn spawn_watch(&self, every: Duration) {
        let log = self.clone();
        let spawned = std::thread::Builder::new()
            .name("kafka-watch".into())
            .spawn(move || loop {
                std::thread::sleep(every);
                if Arc::strong_count(&log.inner) <= 1 {
                    break;
                }
                let runtime = log.inner.runtime.clone();
                runtime.block_on(log.watch_once());
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the Kafka broker watch; health will not report the broker");
        }
    }

    /// One round of [`KafkaLog::spawn_watch`].
    #[cfg(not(madsim))]
    async fn watch_once(&self) {
        if let Some(why) = self.inner.producer.fatal() {
            let seen = self.inner.producer.generation();
            self.rebuild_producer(seen, &why).await;
        }
        let timeout = self.inner.settings.request_timeout.min(PROBE_TIMEOUT);
        let probe = self
            .inner
            .producer
            .get()
            .client()
            .fetch_metadata(None, timeout)
            .await;
        let brokers = &self.inner.settings.brokers;
        let meta = match probe {
            Ok(m) if !m.brokers().is_empty() => m,
            Ok(_) => {
                self.set_unreachable(Some("its metadata lists no broker".into()));
                return;
            }
            Err(e) => {
                self.set_unreachable(Some(format!("a metadata request failed: {e}")));
                return;
            }
        };
        self.set_unreachable(None);
        let listed: std::collections::BTreeSet<&str> = meta
            .topics()
            .iter()
            .filter(|t| topic_listed(t))
            .map(MetadataTopic::name)
            .collect();
        let gone: Vec<TopicName> = lock(&self.inner.topics)
            .keys()
            .filter(|t| !listed.contains(t.as_str()))
            .cloned()
            .collect();
        if gone.is_empty() {
            return;
        }
        for t in &gone {
            lock(&self.inner.topics).remove(t);
        }
        tracing::warn!(
            %brokers,
            topics = ?gone.iter().map(TopicName::as_str).collect::<Vec<_>>(),
            "the Kafka broker no longer has topics the mesh used (restarted empty?); \
             each is created again on its next use"
        );
        let s = &self.inner.settings;
        for own in [&s.progress_topic, &s.subscriptions_topic] {
            if let Some(t) = gone.iter().find(|t| t.as_str() == own.as_str()) {
                if let Err(e) = self.topic_partitions(t, true).await {
                    tracing::warn!(topic = %t, error = ?e, "cannot create the topic again yet");
                }
            }
        }
    }

    /// Records whether the broker answered the last probe, logging each change once.
    #[cfg(not(madsim))]
    fn set_unreachable(&self, why: Option<String>) {
        let brokers = &self.inner.settings.brokers;
        let mut cur = lock(&self.inner.health.unreachable);
        match (&*cur, &why) {
            (None, Some(w)) => {
                tracing::warn!(%brokers, reason = %w, "the Kafka broker is unreachable")
            }
            (Some(_), None) => tracing::info!(%brokers, "the Kafka broker is reachable again"),
            _ => {}
        }
        let mut since = lock(&self.inner.producer.reports.reachable_since);
        match (&why, *since) {
            (Some(_), _) => *since = None,
            (None, None) => *since = Some(std::time::Instant::now()),
            (None, Some(_)) => {}
        }
        *cur = why;
    }

    /// Replaces the producer of generation `seen` (found in a fatal state: `why`) with a
    /// fresh one built from the same configuration; nothing when it was replaced already.
    /// Until a new one is in place, health and publishes name `why`.
    #[cfg(not(madsim))]
    pub(super) async fn rebuild_producer(&self, seen: u64, why: &str) {
        let slot = &self.inner.producer;
        let _building = slot.rebuilding.lock().await;
        if slot.generation() != seen {
            return;
        }
        *lock(&self.inner.health.fatal) = Some(why.to_owned());
        tracing::warn!(reason = %why, "the Kafka producer is in a fatal state; building a new one");
        let fresh: LoggedProducer = match slot
            .config
            .create_with_context(ClientLog::new("producer"))
            .await
        {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(error = %e, "cannot build a new Kafka producer; trying again soon");
                return;
            }
        };
        let old = std::mem::replace(&mut *lock(&slot.current), fresh);
        slot.generation.fetch_add(1, Ordering::Relaxed);
        self.inner
            .counters
            .client_rebuilds
            .fetch_add(1, Ordering::Relaxed);
        *lock(&self.inner.health.fatal) = None;
        tracing::info!("a new Kafka producer replaced the fatal one");
        // Closing purges what the old one still held (each write gets its error) and waits
        // for librdkafka's threads: not on the runtime.
        let closing = std::thread::Builder::new()
            .name("kafka-producer-close".into())
            .spawn(move || drop(old));
        if let Err(e) = closing {
            tracing::warn!(error = %e, "the old Kafka producer is closed in place");
        }
    }

    /// After a failed write: replaces the producer when the failure means it is fatal
    /// (librdkafka says so, or the idempotence state is broken), so the next write goes
    /// through a fresh one.
    #[cfg(not(madsim))]
    async fn after_failure(&self, seen: u64, e: &KafkaError) {
        let why = self
            .inner
            .producer
            .fatal()
            .or_else(|| self.inner.producer.reports.breaks(e));
        if let Some(why) = why {
            self.rebuild_producer(seen, &why).await;
        }
    }
}

/// How long the broker watch waits for a metadata answer (at most `request_timeout`).
#[cfg(not(madsim))]
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

#[cfg(not(madsim))]
/// Whether a write error means the idempotent producer cannot go on (librdkafka makes
/// these fatal for an idempotent producer; a fresh one starts a new producer id).
fn fatal_code(e: &KafkaError) -> bool {
    use RDKafkaErrorCode as C;
    e.rdkafka_error_code().is_some_and(|c| {
        matches!(
            c,
            C::Fatal
                | C::ProducerFenced
                | C::InvalidProducerEpoch
                | C::OutOfOrderSequenceNumber
                | C::UnknownProducerId
                | C::InvalidProducerIdMapping
        )
    })
}

#[cfg(not(madsim))]
/// Whether a write error says the topic is not at the broker (deleted, or a broker
/// restarted empty): the topic is forgotten, and its next use creates it again.
fn unknown_topic(e: &KafkaError) -> bool {
    e.rdkafka_error_code().is_some_and(|c| {
        matches!(
            c,
            RDKafkaErrorCode::UnknownTopic | RDKafkaErrorCode::UnknownTopicOrPartition
        )
    })
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

impl KafkaLog {
    /// A broker error as the publisher sees it (503), with what health knows of the
    /// broker.
    fn produce_error(&self, e: &KafkaError) -> StorageError {
        match self.fault() {
            Some(fault) => StorageError::unavailable(format!(
                "the Kafka broker did not take the write: {e} ({fault})"
            )),
            None => {
                StorageError::unavailable(format!("the Kafka broker did not take the write: {e}"))
            }
        }
    }

    /// The producer's generation for a write, after replacing a fatal producer: a write
    /// is not queued on a producer that can only fail it.
    #[cfg(not(madsim))]
    async fn usable_producer(&self) -> Result<u64, StorageError> {
        let slot = &self.inner.producer;
        if let Some(why) = slot.fatal() {
            self.rebuild_producer(slot.generation(), &why).await;
            if let Some(why) = slot.fatal() {
                return Err(StorageError::unavailable(format!(
                    "the Kafka producer is in a fatal state ({why}); a new one could not be built yet"
                )));
            }
        }
        Ok(slot.generation())
    }

    /// After a write of `topic` failed with `e` on the producer of generation `seen`: an
    /// unknown topic is forgotten (its next use creates it again), and a fatal producer is
    /// replaced.
    #[cfg(not(madsim))]
    async fn after_write_failure(&self, seen: u64, topic: &TopicName, e: &KafkaError) {
        if unknown_topic(e) && lock(&self.inner.topics).remove(topic).is_some() {
            tracing::warn!(%topic, error = %e, "the Kafka broker does not know the topic; it is created again on its next use");
        }
        self.after_failure(seen, e).await;
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
            #[cfg(not(madsim))]
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
                            #[cfg(not(madsim))]
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
            #[cfg(not(madsim))]
            if let Some(e) = &first_error {
                log.after_write_failure(seen, &topic, e).await;
            }
            #[cfg(madsim)]
            let _ = first_error;
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
                        None => log
                            .watermarks(&topic, p)
                            .await
                            .map_err(StorageError::unavailable)?,
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
        // Under the simulator, as before: an unknown topic is looked up in the background.
        #[cfg(madsim)]
        if known.is_none() {
            tokio::spawn(async move {
                if let Ok(Some(n)) = log.listed_partitions(&topic).await {
                    lock(&log.inner.topics).insert(topic, n);
                }
            });
            return Box::pin(async { None });
        }
        Box::pin(async move {
            if known.is_some() {
                return known;
            }
            // A topic another instance (or another producer) created.
            let n = log.listed_partitions(&topic).await.ok()??;
            lock(&log.inner.topics).insert(topic, n);
            Some(n)
        })
    }

    /// Kafka's offsets-for-times, checked against the records (`kafka::times`); "no record
    /// that new" is the partition's end. Not under madsim (its simulated broker is not
    /// asked): the trait's refusal.
    #[cfg(not(madsim))]
    fn offset_for_time(
        &self,
        topic: TopicName,
        partition: Partition,
        time_ms: u64,
    ) -> BoxFut<Result<Offset, StorageError>> {
        let log = self.clone();
        Box::pin(async move {
            let partitions = log.listed_partitions(&topic).await.map_err(|e| {
                StorageError::unavailable(format!("Kafka metadata request failed: {e}"))
            })?;
            match partitions {
                None => return Err(StorageError::Invalid(format!("unknown topic {topic}"))),
                Some(n) if partition >= n => {
                    return Err(StorageError::Invalid(format!(
                        "topic {topic} has {n} partitions, there is no partition {partition}"
                    )))
                }
                Some(_) => {}
            }
            let s = &log.inner.settings;
            let times = &log.inner.times;
            let claim = times.claim(s, &topic, partition, time_ms).await?;
            // The end as the rest of the mesh sees it: the broker's, raised to what the
            // log was shown to hold.
            log.watermarks(&topic, partition)
                .await
                .map_err(StorageError::unavailable)?;
            let range = log.cached_offsets(&topic, partition).ok_or_else(|| {
                StorageError::unavailable(format!("no offsets of {topic}/{partition}"))
            })?;
            let resolved = times
                .resolve(s, &topic, partition, time_ms, claim.clone().ok(), range)
                .await?;
            if !resolved.claim_held {
                tracing::info!(
                    %topic,
                    partition,
                    time_ms,
                    claim = ?claim,
                    offset = resolved.offset,
                    "the broker's offsets-for-times answer did not match the records; searched them"
                );
            }
            Ok(resolved.offset)
        })
    }

    fn offsets(
        &self,
        topic: TopicName,
        partition: Partition,
    ) -> BoxFut<Result<(Offset, Offset), StorageError>> {
        let cached = self.cached_offsets(&topic, partition);
        let log = self.clone();
        // Under the simulator, as before: the ends are read in the background and the
        // caller asks again (the harness's schedules and fault draws depend on it).
        #[cfg(madsim)]
        if cached.is_none() {
            let why = format!(
                "the offsets of {topic}/{partition} are being read from the broker; try again"
            );
            tokio::spawn(async move { log.watermarks(&topic, partition).await });
            return Box::pin(async move { Err(StorageError::unavailable(why)) });
        }
        Box::pin(async move {
            match cached {
                Some(pair) => Ok(pair),
                None => log
                    .watermarks(&topic, partition)
                    .await
                    .map_err(StorageError::unavailable),
            }
        })
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
        #[cfg(madsim)]
        return Box::pin(async move {
            // Leaving revokes: each consumer waits for the engine to flush, then commits.
            for c in &consumers {
                c.stop();
            }
            for c in &consumers {
                c.stopped().await;
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
        let consumer = GroupConsumer::start(self.clone(), group.clone(), topic.clone(), events)
            .map_err(StorageError::unavailable)?;
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
