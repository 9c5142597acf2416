//! The log port's half for a real broker: librdkafka's producer answers metadata and
//! offsets, a producer in a fatal state is replaced, a watch thread probes the broker, and
//! seek by time asks offsets-for-times.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use madsim_rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use madsim_rdkafka::metadata::{Metadata, MetadataTopic};
use madsim_rdkafka::producer::{DeliveryFuture, Producer as _};
use madsim_rdkafka::ClientConfig;
use madsim_tokio as tokio;
use unimesh_core::{Offset, Partition, TopicName};

use super::super::client_log::{ClientLog, LoggedProducer};
pub(super) use super::super::consumer::GroupConsumer;
use super::super::times::TimeLookup;
use super::{lock, KafkaLog, ProducerSlot};
use crate::storage::kafka::KafkaSettings;
use crate::storage::ports::{BoxFut, StorageError};

/// What only the real build's log has: the engine's runtime (to run futures from the
/// consumer threads) and the seek-by-time lookup.
pub struct Side {
    pub runtime: tokio::runtime::Handle,
    times: TimeLookup,
}

impl Side {
    pub async fn new(_settings: &KafkaSettings) -> Result<Self, StorageError> {
        Ok(Self {
            runtime: tokio::runtime::Handle::current(),
            times: TimeLookup::default(),
        })
    }
}

/// What replaces the producer when it is in a fatal state (librdkafka's idempotent
/// producer can enter one, after an outage: `ProducerFenced`, `OutOfOrderSequence`, and
/// never return): a fresh one built from the same configuration takes its place
/// ([`KafkaLog::rebuild_producer`]), and the old one is closed on a thread of its own.
pub struct Renewal {
    /// What every write's [`Delivery`] reports to (progress and DLQ writes too).
    reports: Arc<Reports>,
    /// Counts the replacements (a failure names the producer it came from by it).
    generation: AtomicU64,
    config: ClientConfig,
    /// Held while a producer is being built, so two failures make one new producer.
    rebuilding: tokio::sync::Mutex<()>,
}

impl Renewal {
    /// From the producer's configuration; a write may wait `message_timeout` for the broker.
    pub fn new(config: ClientConfig, message_timeout: Duration) -> Self {
        Self {
            reports: Arc::new(Reports {
                broken: Mutex::new(None),
                reachable_since: Mutex::new(None),
                message_timeout,
            }),
            generation: AtomicU64::new(0),
            config,
            rebuilding: tokio::sync::Mutex::new(()),
        }
    }

    /// The delivery report of a write just queued on the current producer, watched for
    /// an error that leaves the producer unusable.
    pub fn delivery(&self, report: DeliveryFuture) -> Delivery {
        Delivery {
            report,
            generation: self.generation.load(Ordering::Relaxed),
            reports: self.reports.clone(),
        }
    }
}

impl ProducerSlot {
    /// The current producer, for questions (metadata, offsets) rather than writes.
    fn get(&self) -> LoggedProducer {
        lock(&self.current).clone()
    }

    fn generation(&self) -> u64 {
        self.renewal.generation.load(Ordering::Relaxed)
    }

    /// Why the current producer cannot be used, if it cannot: librdkafka's fatal error,
    /// or a write's error that leaves it unusable.
    fn fatal(&self) -> Option<String> {
        let fatal = lock(&self.current)
            .client()
            .fatal_error()
            .map(|(code, reason)| format!("{code:?}: {reason}"));
        fatal.or_else(|| {
            lock(&self.renewal.reports.broken)
                .as_ref()
                .filter(|(g, _)| *g == self.generation())
                .map(|(_, why)| why.clone())
        })
    }
}

/// What the writes of the producers tell about them, shared with every [`Delivery`].
#[derive(Debug)]
struct Reports {
    /// A producer whose writes failed in a way that leaves it unusable although librdkafka
    /// does not flag it fatal: its generation and why.
    broken: Mutex<Option<(u64, String)>>,
    /// Since when the broker has answered every probe of the watch (None while it does
    /// not, or before the first).
    reachable_since: Mutex<Option<std::time::Instant>>,
    /// How long a write may wait for the broker (`message.timeout.ms`).
    message_timeout: Duration,
}

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
pub struct Delivery {
    report: DeliveryFuture,
    generation: u64,
    reports: Arc<Reports>,
}

impl Future for Delivery {
    type Output = <DeliveryFuture as Future>::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Self::Output> {
        let out = std::pin::Pin::new(&mut self.report).poll(cx);
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

/// Runs `f` to completion from synchronous code on the engine's runtime, on a thread of
/// its own (so it may be called from inside the runtime without blocking it re-entrantly).
/// Not under madsim: one simulator thread cannot wait for itself (see the `LogPort` impl).
pub fn block_on<F>(runtime: &tokio::runtime::Handle, f: F) -> F::Output
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

/// Whether the broker lists `t` as a usable topic.
pub fn topic_listed(t: &MetadataTopic) -> bool {
    t.error().is_none() && !t.partitions().is_empty()
}

/// Whether a metadata error says the broker has no such topic: never (a real broker
/// answers with metadata that does not list it, or lists it with an error).
pub fn metadata_lacks_topic(_e: &KafkaError) -> bool {
    false
}

/// How many partitions a topic is created with: the configured count.
pub fn partitions_to_create(configured: i32, _compacted: bool) -> i32 {
    configured
}

/// A question the port cannot answer from what it read last (`known`: it can): asked of
/// the broker, and waited for.
pub fn ask_broker<T: Send + 'static>(
    _known: bool,
    ask: BoxFut<T>,
    _meanwhile: impl FnOnce() -> T + Send + 'static,
) -> BoxFut<T> {
    ask
}

/// Closes the group consumers: closing revokes, and each consumer's callback waits for the
/// engine to flush (on a blocking thread: the consumers' threads are joined).
pub fn close(consumers: Vec<Arc<GroupConsumer>>) -> BoxFut<()> {
    Box::pin(async move {
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

impl KafkaLog {
    /// Nothing: the real build asks the broker each question when it is asked.
    pub(super) async fn preload(&self) -> Result<(), StorageError> {
        Ok(())
    }

    /// Metadata of one topic, or of all, through the producer.
    pub(super) async fn metadata(&self, topic: Option<&str>) -> KafkaResult<Metadata> {
        let timeout = self.inner.settings.request_timeout;
        self.inner
            .producer
            .get()
            .client()
            .fetch_metadata(topic, timeout)
            .await
    }

    /// (earliest, end) of a partition as the broker answers them, through the producer.
    pub(super) async fn fetch_watermarks(
        &self,
        topic: &str,
        partition: i32,
        timeout: Duration,
    ) -> KafkaResult<(i64, i64)> {
        let producer = self.inner.producer.get();
        let client = producer.client();
        client.fetch_watermarks(topic, partition, timeout).await
    }

    /// Nothing to hold while a topic is looked up and created: a real broker answers a
    /// second create with `TopicAlreadyExists`.
    pub(super) async fn creating(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        None
    }

    /// (earliest, end) of a partition as the broker last claimed them.
    pub(in crate::storage::kafka::io) fn claimed_offsets(
        &self,
        topic: &TopicName,
        partition: Partition,
    ) -> Option<(Offset, Offset)> {
        lock(&self.inner.ends)
            .get(&(topic.clone(), partition))
            .copied()
    }

    /// Watches the broker every `every` on a thread of its own: a metadata request through
    /// the producer is the probe (answered: the broker is reachable; failed within the
    /// probe timeout: it is not — librdkafka's error callbacks say when every broker went
    /// down but never that one came back, and a connection can be up while nothing is
    /// answered); a producer in a fatal state is replaced; topics the mesh knew and the
    /// broker no longer lists (a broker restarted empty) are forgotten, so their next use
    /// creates them again, and the mesh's own topics are created again at once.
    pub fn spawn_watch(&self, every: Duration) {
        let log = self.clone();
        let spawned = std::thread::Builder::new()
            .name("kafka-watch".into())
            .spawn(move || loop {
                std::thread::sleep(every);
                if Arc::strong_count(&log.inner) <= 1 {
                    break;
                }
                let runtime = log.inner.side.runtime.clone();
                runtime.block_on(log.watch_once());
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the Kafka broker watch; health will not report the broker");
        }
    }

    /// One round of [`KafkaLog::spawn_watch`].
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
        let mut since = lock(&self.inner.producer.renewal.reports.reachable_since);
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
    async fn rebuild_producer(&self, seen: u64, why: &str) {
        let slot = &self.inner.producer;
        let _building = slot.renewal.rebuilding.lock().await;
        if slot.generation() != seen {
            return;
        }
        *lock(&self.inner.health.fatal) = Some(why.to_owned());
        tracing::warn!(reason = %why, "the Kafka producer is in a fatal state; building a new one");
        let fresh: LoggedProducer = match slot
            .renewal
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
        slot.renewal.generation.fetch_add(1, Ordering::Relaxed);
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
    async fn after_failure(&self, seen: u64, e: &KafkaError) {
        let why = self
            .inner
            .producer
            .fatal()
            .or_else(|| self.inner.producer.renewal.reports.breaks(e));
        if let Some(why) = why {
            self.rebuild_producer(seen, &why).await;
        }
    }

    /// The producer's generation for a write, after replacing a fatal producer: a write
    /// is not queued on a producer that can only fail it.
    pub(super) async fn usable_producer(&self) -> Result<u64, StorageError> {
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
    pub(super) async fn after_write_failure(&self, seen: u64, topic: &TopicName, e: &KafkaError) {
        if unknown_topic(e) && lock(&self.inner.topics).remove(topic).is_some() {
            tracing::warn!(%topic, error = %e, "the Kafka broker does not know the topic; it is created again on its next use");
        }
        self.after_failure(seen, e).await;
    }

    /// Kafka's offsets-for-times, checked against the records (`kafka::times`); "no record
    /// that new" is the partition's end.
    pub(super) fn seek_by_time(
        &self,
        topic: TopicName,
        partition: Partition,
        time_ms: u64,
    ) -> BoxFut<Result<Offset, StorageError>> {
        let log = self.clone();
        Box::pin(async move {
            let partitions = log
                .listed_partitions(&topic)
                .await
                .map_err(|e| StorageError::failed("Kafka metadata request failed", e))?;
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
            let times = &log.inner.side.times;
            let claim = times.claim(s, &topic, partition, time_ms).await?;
            // The end as the rest of the mesh sees it: the broker's, raised to what the
            // log was shown to hold.
            log.watermarks(&topic, partition).await?;
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
}

/// How long the broker watch waits for a metadata answer (at most `request_timeout`).
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

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
