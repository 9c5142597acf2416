//! What the storage backends are given, built from the configuration here (as
//! `Config::log_config` builds the embedded log's): storage reads no configuration type, so
//! the two do not import each other.

use std::time::Duration;

use super::{Config, Kafka, StateBackend, StorageBackend};
use crate::storage::kafka::{KafkaSettings, PropertyTables};
use crate::storage::{Backend, KafkaStart, LocalStore};

/// How often `serve` probes the broker (health) and refreshes partition ends.
const KAFKA_WATCH: Duration = Duration::from_secs(1);

impl Config {
    /// The storage `serve` opens (`storage.backend`); `traffic_port` names the instance on
    /// Kafka when `kafka.instance` is empty.
    pub fn storage_backend(&self, traffic_port: u16) -> Backend {
        match self.storage.backend {
            StorageBackend::Embedded => Backend::Embedded(self.log_config()),
            StorageBackend::Kafka => Backend::Kafka(KafkaStart {
                settings: self.kafka_settings(traffic_port),
                watch_every: Some(KAFKA_WATCH),
                offsets_refresh: KAFKA_WATCH,
            }),
        }
    }

    /// This node's own state store (`state.backend`, in the data directory).
    pub fn local_store(&self) -> LocalStore {
        match self.state.backend {
            StateBackend::Rocksdb => LocalStore::Rocksdb(self.data.join("state")),
            StateBackend::Sled => LocalStore::Sled(self.data.join("state-sled")),
            StateBackend::Memory => LocalStore::Memory,
        }
    }

    /// The Kafka backend's settings; `traffic_port` names the instance when
    /// `kafka.instance` is empty.
    pub fn kafka_settings(&self, traffic_port: u16) -> KafkaSettings {
        let k = &self.kafka;
        let instance = if k.instance.is_empty() {
            format!("unimesh-{traffic_port}-{}", std::process::id())
        } else {
            k.instance.clone()
        };
        let group_instance_id = k.static_membership.then(|| instance.clone());
        KafkaSettings {
            brokers: k.brokers.clone(),
            instance,
            replication: i32::try_from(k.replication.get()).unwrap_or(i32::MAX),
            default_partitions: self.storage.default_partitions,
            progress_topic: k.progress_topic.clone(),
            subscriptions_topic: k.subscriptions_topic.clone(),
            group_prefix: k.group_prefix.clone(),
            max_progress_ranges: k.max_progress_ranges,
            request_timeout: Duration::from_millis(k.request_timeout_ms.get()),
            max_event_bytes: self.limits.max_event_bytes.get(),
            group_instance_id,
            properties: property_tables(k),
        }
    }
}

/// The tables of `[kafka.properties]`, `[kafka.producer]` and `[kafka.consumer]`.
pub(super) fn property_tables(k: &Kafka) -> PropertyTables {
    PropertyTables {
        common: k.properties.clone(),
        producer: k.producer.clone(),
        consumer: k.consumer.clone(),
    }
}
