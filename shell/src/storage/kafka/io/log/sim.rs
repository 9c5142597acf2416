//! The log port's half for madsim-rdkafka's simulated broker: a consumer answers metadata
//! and offsets (the simulated producer has no client to ask them with), the broker's
//! topics and offsets are read once at open, a topic unknown here is looked up in the
//! background, and the simulation's group coordinator stands in for the broker's.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use madsim_rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use madsim_rdkafka::metadata::{Metadata, MetadataTopic};
use madsim_rdkafka::producer::DeliveryFuture;
use madsim_rdkafka::ClientConfig;
use madsim_tokio as tokio;
use unimesh_core::{Offset, Partition, TopicName};

use super::super::client_log::{ClientLog, LoggedConsumer};
pub(super) use super::super::simulated::GroupConsumer;
use super::super::simulated::SimCoordinator;
use super::{lock, KafkaLog};
use crate::storage::kafka::io::ClientRole;
use crate::storage::kafka::KafkaSettings;
use crate::storage::ports::{BoxFut, StorageError};

/// What only the simulated build's log has.
pub struct Side {
    /// Metadata and end offsets: the simulated producer has no client to ask them with.
    meta: LoggedConsumer,
    /// Held while a topic is looked up and created: the simulated broker's "create"
    /// replaces a topic that exists, records and all, so two must never race.
    creating: tokio::sync::Mutex<()>,
    /// The simulation's group coordinator (the simulated broker has none; `simulated.rs`).
    pub coordinator: OnceLock<Arc<dyn SimCoordinator>>,
}

impl Side {
    /// Creates the metadata client.
    pub async fn new(settings: &KafkaSettings) -> Result<Self, StorageError> {
        let meta: LoggedConsumer = settings
            .client_config(ClientRole::Consumer)
            .create_with_context(ClientLog::new("metadata"))
            .await
            .map_err(|e| StorageError::failed("cannot create the Kafka metadata client", e))?;
        Ok(Self {
            meta,
            creating: tokio::sync::Mutex::new(()),
            coordinator: OnceLock::new(),
        })
    }
}

/// Nothing renews the producer: the simulated producer has no fatal state.
pub struct Renewal;

impl Renewal {
    pub fn new(_config: ClientConfig, _message_timeout: Duration) -> Self {
        Self
    }

    /// The delivery report of a write just queued on the producer: its own.
    pub fn delivery(&self, report: DeliveryFuture) -> Delivery {
        report
    }
}

/// The delivery report of one write ([`super::ProducerSlot::send_result`]): the simulated
/// producer's own.
pub type Delivery = DeliveryFuture;

/// Whether the broker lists `t` as a usable topic (the simulated broker lists only topics
/// it has, without errors).
pub fn topic_listed(t: &MetadataTopic) -> bool {
    !t.partitions().is_empty()
}

/// Whether a metadata error says the broker has no such topic: the simulated broker
/// answers a topic it does not have with an error.
pub fn metadata_lacks_topic(e: &KafkaError) -> bool {
    matches!(e, KafkaError::MetadataFetch(RDKafkaErrorCode::UnknownTopic))
}

/// How many partitions a topic is created with: the simulated broker ignores keys (it
/// places records round robin), so a compacted topic whose newest record of a key must win
/// has one partition here.
pub fn partitions_to_create(configured: i32, compacted: bool) -> i32 {
    if compacted {
        1
    } else {
        configured
    }
}

/// A question the port cannot answer from what it read last (`known`: it can): asked of
/// the broker in the background, while the caller gets `meanwhile` and asks again (as
/// before: the harness's schedules and fault draws depend on it).
pub fn ask_broker<T: Send + 'static>(
    known: bool,
    ask: BoxFut<T>,
    meanwhile: impl FnOnce() -> T + Send + 'static,
) -> BoxFut<T> {
    if known {
        return ask;
    }
    tokio::spawn(ask);
    Box::pin(async move { meanwhile() })
}

/// Closes the group consumers: leaving revokes, and each consumer waits for the engine to
/// flush, then commits.
pub fn close(consumers: Vec<Arc<GroupConsumer>>) -> BoxFut<()> {
    Box::pin(async move {
        for c in &consumers {
            c.stop();
        }
        for c in &consumers {
            c.stopped().await;
        }
    })
}

impl KafkaLog {
    /// The synchronous questions of the `LogPort` are answered from what was read last:
    /// every topic the broker has, and their offsets, are read once at open.
    pub(super) async fn preload(&self) -> Result<(), StorageError> {
        let meta = self
            .metadata(None)
            .await
            .map_err(|e| StorageError::failed("Kafka metadata request failed", e))?;
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

    /// Metadata of one topic, or of all, through the metadata client.
    pub(super) async fn metadata(&self, topic: Option<&str>) -> KafkaResult<Metadata> {
        let timeout = self.inner.settings.request_timeout;
        self.inner.side.meta.fetch_metadata(topic, timeout).await
    }

    /// (earliest, end) of a partition as the broker answers them, through the metadata
    /// client.
    pub(super) async fn fetch_watermarks(
        &self,
        topic: &str,
        partition: i32,
        timeout: Duration,
    ) -> KafkaResult<(i64, i64)> {
        self.inner
            .side
            .meta
            .fetch_watermarks(topic, partition, timeout)
            .await
    }

    /// The lock held while a topic is looked up and created ([`Side`]).
    pub(super) async fn creating(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        Some(self.inner.side.creating.lock().await)
    }

    /// The producer's generation for a write: the simulated producer is never replaced.
    pub(super) async fn usable_producer(&self) -> Result<u64, StorageError> {
        Ok(0)
    }

    /// After a failed write: nothing (the simulated producer has no fatal state to
    /// replace).
    pub(super) async fn after_write_failure(
        &self,
        _seen: u64,
        _topic: &TopicName,
        _e: &KafkaError,
    ) {
    }

    /// Seek by time: the simulated broker is not asked, so the trait's refusal.
    pub(super) fn seek_by_time(
        &self,
        topic: TopicName,
        _partition: Partition,
        _time_ms: u64,
    ) -> BoxFut<Result<Offset, StorageError>> {
        crate::storage::ports::no_append_times(topic)
    }
}
