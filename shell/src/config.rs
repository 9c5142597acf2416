//! Configuration of `unimesh serve`: defaults, a TOML file, `UNIMESH_*` environment variables
//! and command-line flags, in that order of increasing precedence (flag > env > file >
//! default).
//!
//! Every setting has a default, so `unimesh serve` runs with none. The file uses the same
//! names as [`Config`]'s fields:
//!
//! ```toml
//! data = "./data"
//! http = "127.0.0.1:8080"
//! admin = "127.0.0.1:8081"
//! log = "info"
//!
//! [limits]
//! max_poll_events = 1000
//!
//! [storage]
//! default_partitions = 4
//!
//! [state]
//! backend = "rocksdb"   # or "sled", "memory"
//!
//! [mesh]
//! max_groups = 10000
//! ```
//!
//! Every key also has an environment variable: `UNIMESH_` and its dotted path in upper case
//! with `_` for `.` (`UNIMESH_HTTP`, `UNIMESH_DATA`, `UNIMESH_LIMITS_MAX_POLL_EVENTS`,
//! `UNIMESH_STATE_BACKEND`). `UNIMESH_CONFIG` names the file when `--config` does not.
//!
//! How the layers are merged: the defaults are turned into a TOML table; the file's table is
//! laid over it key by key, refusing keys the defaults do not have (the error names the key)
//! and values of the wrong type; environment variables and flags are parsed with the type of
//! the default they replace; the result is deserialised into [`Config`] and checked by
//! [`Config::validate`]. So the file, the environment and the defaults can never disagree on
//! what keys exist.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use toml::{Table, Value};
use unimesh_core::{MeshConfig, SubscriptionLimits};

use crate::event::PublishLimits;

pub mod auth;
pub use auth::Auth;

/// Prefix of every environment variable read as configuration.
pub const ENV_PREFIX: &str = "UNIMESH_";

/// The environment variable naming the configuration file.
pub const ENV_CONFIG_FILE: &str = "UNIMESH_CONFIG";

/// `UNIMESH_*` variables that other parts of the project read (the simulation harness); they
/// are not configuration keys and are not reported as unknown.
const ENV_NOT_CONFIG: &[&str] = &[ENV_CONFIG_FILE, "UNIMESH_SEED", "UNIMESH_NO_CORE_CHECK"];

/// Hard ceiling on one poll: the delivery JSON of a poll is built in memory.
pub const POLL_EVENTS_HARD_MAX: u32 = 100_000;

/// Hard ceiling on a long-poll's wait, so a connection is never parked for hours.
pub const WAIT_MS_HARD_MAX: u64 = 3_600_000;

/// Bounds of `server.console_interval_ms`: a console's snapshots cost the engine a view of
/// every group, so not more often than this; and not so rarely that it looks dead.
pub const MIN_CONSOLE_INTERVAL_MS: u64 = 50;
pub const MAX_CONSOLE_INTERVAL_MS: u64 = 60_000;

/// The whole configuration of one `unimesh serve` process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Directory of every durable file (log, state store). Created if missing.
    pub data: PathBuf,
    /// Traffic listener (publish, subscribe, poll, ACK).
    pub http: SocketAddr,
    /// Admin listener (metrics, health, operator endpoints). Keep it off public interfaces.
    pub admin: SocketAddr,
    /// Log filter in `tracing-subscriber` `EnvFilter` syntax (`info`, `unimesh_shell=debug`).
    pub log: String,
    pub limits: Limits,
    pub server: Server,
    pub push: Push,
    pub storage: Storage,
    pub state: State,
    pub engine: Engine,
    pub mesh: Mesh,
    pub kafka: Kafka,
    /// Publish deduplication (off by default).
    pub dedup: Dedup,
    /// The OTLP span exporter (off unless an endpoint is set).
    pub otel: Otel,
    /// Bearer tokens and rights (see `config::auth`); none: auth is off.
    pub auth: Auth,
}

/// The free-name table of per-topic dedup windows, `[dedup.topics.NAME]`.
pub const DEDUP_TOPICS_KEY: &str = "dedup.topics";

/// `[dedup]`: a window per topic in which a repeated CloudEvents identity (`source`, `id`)
/// is answered as accepted (with the first publish's partition and offset, and
/// `"duplicate": true`) without being appended again. Off unless a window is set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dedup {
    /// The window of every topic not named in `topics`, in seconds; 0: off.
    pub window_s: u64,
    /// The most identities one topic's window keeps (the oldest go first).
    pub max_entries: usize,
    /// Per topic, `[dedup.topics.NAME]`: `window_s` (0 turns it off for that topic) and
    /// `max_entries`, each defaulting to the values above.
    pub topics: BTreeMap<String, TopicDedup>,
}

/// `[dedup.topics.NAME]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TopicDedup {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_s: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_entries: Option<usize>,
}

impl Default for Dedup {
    fn default() -> Self {
        Self {
            window_s: 0,
            max_entries: 100_000,
            topics: BTreeMap::new(),
        }
    }
}

/// `[otel]`: spans exported over OTLP (HTTP/protobuf) to a collector. Off while `endpoint`
/// is empty and neither `OTEL_EXPORTER_OTLP_ENDPOINT` nor
/// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set (the binary's `otlp` feature).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Otel {
    /// The collector's base URL (`http://HOST:4318`); spans go to `{endpoint}/v1/traces`.
    pub endpoint: String,
    /// The `service.name` of the exported resource.
    pub service_name: String,
}

impl Default for Otel {
    fn default() -> Self {
        Self {
            endpoint: String::new(),
            service_name: "unimesh".to_owned(),
        }
    }
}

/// Bounds on what one HTTP request may ask for. Every one is checked before work is done.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Body of a publish request (all its events), in bytes.
    pub max_request_bytes: usize,
    /// One event (its JSON, or body plus `ce-*` headers in binary mode), in bytes.
    pub max_event_bytes: usize,
    /// Events in one batch publish.
    pub max_batch_events: usize,
    /// Body of every other JSON request (subscription, ACK, admin), in bytes.
    pub max_json_bytes: usize,
    /// Delivery ids in one ACK, NACK or extend request.
    pub max_ids_per_request: usize,
    /// Largest `max` of a long-poll.
    pub max_poll_events: u32,
    /// `max` of a long-poll that does not give one.
    pub default_poll_events: u32,
    /// Largest `waitMs` of a long-poll.
    pub max_wait_ms: u64,
    /// `waitMs` of a long-poll that does not give one. Not zero by default: right after a
    /// publish the engine may still be fetching the record, and a zero wait would answer an
    /// empty array to a newcomer's first poll.
    pub default_wait_ms: u64,
    /// Largest `max` of a DLQ browse or replay.
    pub max_dlq_page: usize,
    /// `max` of a DLQ browse or replay that does not give one.
    pub default_dlq_page: usize,
    /// Bytes of an oversized body read and thrown away before answering 413, so a client
    /// still writing its body reads the answer instead of a connection reset. Never buffered.
    pub drain_bytes: u64,
    /// A request body must arrive within this time (408 otherwise).
    pub body_read_timeout_ms: u64,
    /// Request/reply requests waiting for their replies at once (and timed-out ones
    /// remembered, to count late replies).
    pub max_pending_requests: usize,
}

/// The HTTP servers themselves.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Server {
    /// Open connections per listener; accepting waits at the limit.
    pub max_connections: usize,
    /// After SIGINT/SIGTERM: how long open requests (long-polls included) may take to finish
    /// before their connections are closed and the engine is flushed and stopped.
    pub shutdown_grace_ms: u64,
    /// A client must send its request headers within this time.
    pub header_read_timeout_ms: u64,
    /// Open delivery streams (SSE, WebSocket) per traffic listener, counted apart from
    /// `max_connections`: an HTTP/1.1 connection that becomes a stream gives its
    /// connection slot back, so idle streams cannot starve publishers. Over it, 503.
    pub max_streams: usize,
    /// Deliveries queued for one stream at once (its credit); `maxInFlightPerClient` still
    /// bounds what it holds unACKed.
    pub stream_window: u32,
    /// A stream with nothing to send sends a heartbeat (an SSE comment, a WebSocket ping)
    /// this often.
    pub stream_heartbeat_ms: u64,
    /// The `retry:` an SSE stream tells its client to wait before reconnecting.
    pub stream_retry_ms: u64,
    /// The web console's feed (`/admin/events`, the page at `/ui` of the admin listener)
    /// sends a snapshot when something changed, at most this often (50 to 60000).
    pub console_interval_ms: u64,
    /// Web page origins allowed on the traffic listener, comma-separated
    /// (`https://app.example.com,http://localhost:3000`): CORS answers for them (preflight
    /// included; `content-type`, `authorization`, `last-event-id` and `ce-*` headers), and
    /// a WebSocket upgrade from a page must come from one of them (or its own origin).
    /// Empty: no CORS at all, and a page on another origin cannot open a WebSocket.
    pub cors_allowed_origins: String,
    /// Serve a non-loopback address without `[auth]` identities (anyone who reaches it may
    /// publish, consume and operate). Off: `serve` refuses to start so (flag --insecure).
    pub insecure: bool,
    /// TLS on both listeners (off while `cert` is empty).
    pub tls: Tls,
}

/// `[server.tls]`: TLS (and client certificates) on both listeners, by rustls. The files
/// are read at start and again on SIGHUP (a failed reload keeps the certificates in use).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tls {
    /// PEM file of the certificate chain, the server's own certificate first (flag
    /// --tls-cert). Empty: plain HTTP.
    pub cert: PathBuf,
    /// PEM file of the private key (PKCS#8, PKCS#1 or SEC1; flag --tls-key).
    pub key: PathBuf,
    /// PEM bundle of the CAs whose client certificates are accepted (mTLS). Empty: no
    /// client certificates are asked for. A verified certificate's subject CN (or, without
    /// one, its first DNS name) is the caller's identity, with the rights of
    /// `[auth.identities.NAME]`.
    pub client_ca: PathBuf,
    /// With `client_ca`: `require` (a handshake without a valid client certificate fails)
    /// or `optional` (without one, the caller may still send a bearer token).
    pub client_auth: ClientAuth,
}

/// Whether a client certificate is required (`server.tls.client_auth`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    #[default]
    Require,
    Optional,
}

impl Tls {
    /// Whether TLS is on.
    pub fn enabled(&self) -> bool {
        !self.cert.as_os_str().is_empty()
    }

    /// Whether client certificates are asked for (mTLS).
    pub fn client_certs(&self) -> bool {
        self.enabled() && !self.client_ca.as_os_str().is_empty()
    }
}

/// Webhook push (groups with `push.url`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Push {
    /// Requests in flight at once per group.
    pub max_concurrency: u32,
    /// A push not answered within this is a NACK (the group's backoff applies).
    pub request_timeout_ms: u64,
    /// Where webhooks may push. Empty: public addresses only (loopback, link-local such as
    /// the cloud metadata service at 169.254.169.254, private, shared, unspecified and
    /// multicast addresses are refused). Otherwise exactly what it lists, comma-separated:
    /// host names, IP addresses or CIDR blocks (`hooks.internal,10.0.0.7,fd00::/8,::1`).
    /// The mesh's own listeners never. Checked at `PUT` (IP literals, listed names) and
    /// after DNS resolution at every push (the connection goes to the checked address).
    pub allowed_hosts: String,
    /// How often the pushers are matched to the subscriptions (a new or changed `push.url`
    /// starts pushing within this).
    pub scan_interval_ms: u64,
}

impl Default for Push {
    fn default() -> Self {
        Self {
            max_concurrency: 16,
            request_timeout_ms: 10_000,
            allowed_hosts: String::new(),
            scan_interval_ms: 500,
        }
    }
}

/// Storage of the events (the broker).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Storage {
    pub backend: StorageBackend,
    /// Partitions of a topic created by its first publish.
    pub default_partitions: u32,
    /// Largest partition count of a topic.
    pub max_partitions: u32,
    /// Most topics.
    pub max_topics: usize,
    /// Largest stored record, in bytes. The stored form of an event can be up to a third
    /// larger than what was published (binary data kept as base64), so this must leave that
    /// room above `limits.max_event_bytes`.
    pub max_record_bytes: usize,
    /// Payload bytes gathered into one synced write.
    pub max_batch_bytes: usize,
    /// Appends waiting for the log writer; publishers wait beyond it (back-pressure).
    pub queue_capacity: usize,
    /// Records older than this are deleted; 0 keeps them forever.
    pub retention_ms: u64,
    /// A partition's oldest records are deleted while it holds more; 0 means no size limit.
    pub retention_bytes_per_partition: u64,
    /// How often retention is enforced.
    pub retention_check_ms: u64,
    /// Once retention deleted this many bytes of a partition, the deleted range is compacted
    /// at once so the disk space comes back (smaller deletions wait for RocksDB's own
    /// compactions, which rewrite less).
    pub retention_reclaim_bytes: u64,
    /// When the embedded log's appends are durable: `always` (the default: a publish is
    /// answered once the write holding it is fsynced) or `interval` (answered once written
    /// to the operating system, fsynced every `sync_interval_ms`: a crash of the process
    /// loses nothing, a crash of the machine up to `sync_interval_ms` of answered
    /// publishes). The Kafka backend ignores it (`acks` and the brokers decide there).
    pub sync: SyncMode,
    /// The fsync interval of `sync = "interval"`, 1 to 60000 ms.
    pub sync_interval_ms: u64,
    /// Bytes of the newest records the embedded log keeps in memory, shared evenly by every
    /// partition, so a group that keeps up is served without reading the disk; 0 keeps
    /// none. Ignored on Kafka.
    pub read_cache_bytes: usize,
}

/// `storage.sync`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SyncMode {
    /// Every append fsynced before it is answered.
    Always,
    /// Fsynced every `storage.sync_interval_ms`.
    Interval,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StorageBackend {
    /// A partitioned durable log on RocksDB inside `data`.
    Embedded,
    /// A Kafka cluster (`[kafka]`): several instances share it, and Kafka's group
    /// coordinator decides which instance serves which partition.
    Kafka,
}

/// The Kafka backend (`storage.backend = "kafka"`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Kafka {
    /// Bootstrap brokers, `HOST:PORT,HOST:PORT` (flag `--kafka-brokers`).
    pub brokers: String,
    /// This instance's name in `/admin/offsets` (which instance owns which partition);
    /// empty: `unimesh-<traffic port>-<pid>`.
    pub instance: String,
    /// Replication factor of the topics the mesh creates (partitions:
    /// `storage.default_partitions`).
    pub replication: u32,
    /// The compacted topic holding each (group, topic, partition)'s ACK ranges and attempt
    /// counts above the committed offset.
    pub progress_topic: String,
    /// The compacted topic holding the subscription groups' definitions, shared by every
    /// instance (a group created on one is served by all).
    pub subscriptions_topic: String,
    /// Prefix of every consumer `group.id`: `<prefix><group>`.
    pub group_prefix: String,
    /// Most ACK ranges (and attempt counts) one progress record keeps; beyond it the
    /// watermark stays exact and the excess ranges are dropped (more duplicates after a
    /// takeover, never loss; counted in `/metrics`).
    pub max_progress_ranges: usize,
    /// How long a broker request (metadata, topic creation, commit, delivery report) may
    /// take before it fails.
    pub request_timeout_ms: u64,
    /// Static group membership (KIP-345): every consumer of this instance joins its group
    /// with `group.instance.id` = `<kafka.instance>-<group>`, so a restart within the
    /// session timeout gets its partitions back without a rebalance. Needs a stable, unique
    /// `kafka.instance`.
    pub static_membership: bool,
    /// librdkafka properties passed through to every client (`"linger.ms" = "5"`); env
    /// `UNIMESH_KAFKA_PROPERTIES="linger.ms=5,socket.timeout.ms=3000"` (laid over the file's,
    /// property by property). They cannot turn off
    /// what the contract needs (`acks`, idempotence, auto-commit).
    pub properties: BTreeMap<String, String>,
    /// librdkafka properties for the producer (and the admin client) only, laid over
    /// `properties` (env `UNIMESH_KAFKA_PRODUCER`).
    pub producer: BTreeMap<String, String>,
    /// librdkafka properties for the consumers only (`session.timeout.ms`, ...), laid over
    /// `properties` (env `UNIMESH_KAFKA_CONSUMER`).
    pub consumer: BTreeMap<String, String>,
}

impl Default for Kafka {
    fn default() -> Self {
        Self {
            brokers: "127.0.0.1:9092".to_owned(),
            instance: String::new(),
            replication: 1,
            progress_topic: "unimesh.progress".to_owned(),
            subscriptions_topic: "unimesh.subscriptions".to_owned(),
            group_prefix: "unimesh.".to_owned(),
            max_progress_ranges: 1_000,
            request_timeout_ms: 10_000,
            static_membership: false,
            properties: BTreeMap::new(),
            producer: BTreeMap::new(),
            consumer: BTreeMap::new(),
        }
    }
}

/// The keys of the pass-through tables: any property name is allowed in them.
const KAFKA_PROPERTY_TABLES: [&str; 3] = ["kafka.properties", "kafka.producer", "kafka.consumer"];

/// Whether `key` names one of the pass-through tables.
fn is_property_table(key: &str) -> bool {
    KAFKA_PROPERTY_TABLES.contains(&key)
}

/// `k=v,k=v` as a table of strings (the environment form of `kafka.properties`).
fn parse_properties(text: &str) -> Result<Table, String> {
    let mut out = Table::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let Some((k, v)) = pair.split_once('=') else {
            return Err(format!("{pair:?} is not NAME=VALUE"));
        };
        out.insert(k.trim().to_owned(), Value::String(v.trim().to_owned()));
    }
    Ok(out)
}

/// The state store (epoch, progress, attempt ledger, subscriptions, DLQ ledger).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct State {
    pub backend: StateBackend,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StateBackend {
    /// RocksDB in `data/state` (the default).
    Rocksdb,
    /// sled (pure Rust) in `data/state-sled`.
    Sled,
    /// In memory: everything is forgotten at exit. For tests and demos only.
    Memory,
}

/// The engine task around the core.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Engine {
    /// How long a fetch at the end of a partition waits at the log for new records.
    pub fetch_wait_ms: u64,
    /// About how many bytes one fetch reads.
    pub fetch_max_bytes: usize,
    /// Requests queued for the engine task before callers wait (back-pressure).
    pub command_capacity: usize,
    /// Most per-topic rate-limit rules.
    pub max_rate_rules: usize,
}

/// The core's knobs ([`MeshConfig`]), with the per-subscription limits flattened in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mesh {
    /// Most subscription groups at once.
    pub max_groups: usize,
    /// Most clients attached to one group at once.
    pub max_clients_per_group: usize,
    /// Most partitions one group may be assigned.
    pub max_partitions_per_group: usize,
    /// Most records of one group × partition held in memory and not done (fetched, in
    /// flight, waiting for redelivery); fetching pauses at it.
    pub max_window_per_lane: usize,
    /// Most ACK ranges above the watermark of one group × partition; fetching pauses at it
    /// (nothing is dropped).
    pub max_ack_ranges_per_lane: usize,
    /// Most records asked for by one fetch from the log.
    pub fetch_batch: usize,
    /// How long a failed fetch waits before it is retried.
    pub fetch_retry_ms: u64,
    /// ACKs, attempt counts and dead letters are made durable together once per interval.
    pub flush_interval_ms: u64,
    /// Most progress writes in flight to the state store at once.
    pub max_outstanding_persists: usize,
    /// A client with no poll waiting, nothing in flight and no activity for this long is
    /// removed.
    pub client_idle_timeout_ms: u64,
    /// Most DLQ records replayed into one group at once.
    pub max_replay_per_group: usize,
    /// Largest `ackTimeoutMs` a subscription may ask for.
    pub max_ack_timeout_ms: u64,
    /// Largest `maxAttempts` a subscription may ask for.
    pub max_attempts: u32,
    /// Largest `maxInFlightPerClient` a subscription may ask for.
    pub max_in_flight_per_client: u32,
    /// Largest `backoff.maxMs` a subscription may ask for.
    pub max_backoff_ms: u64,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            data: PathBuf::from("./data"),
            http: SocketAddr::from(([127, 0, 0, 1], 8080)),
            admin: SocketAddr::from(([127, 0, 0, 1], 8081)),
            log: "info".to_owned(),
            limits: Limits::default(),
            server: Server::default(),
            push: Push::default(),
            storage: Storage::default(),
            state: State {
                backend: StateBackend::Rocksdb,
            },
            engine: Engine::from(&crate::engine::EngineConfig::default()),
            mesh: Mesh::from(&MeshConfig::default()),
            kafka: Kafka::default(),
            dedup: Dedup::default(),
            otel: Otel::default(),
            auth: Auth::default(),
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        let publish = PublishLimits::default();
        Self {
            max_request_bytes: publish.max_request_bytes,
            max_event_bytes: publish.max_event_bytes,
            max_batch_events: publish.max_batch_events,
            max_json_bytes: 1 << 20,
            max_ids_per_request: 1_000,
            max_poll_events: 1_000,
            default_poll_events: 10,
            max_wait_ms: 60_000,
            default_wait_ms: 1_000,
            max_dlq_page: 1_000,
            default_dlq_page: 100,
            drain_bytes: 64 << 20,
            body_read_timeout_ms: 60_000,
            max_pending_requests: 10_000,
        }
    }
}

impl Default for Server {
    fn default() -> Self {
        Self {
            max_connections: 10_000,
            shutdown_grace_ms: 10_000,
            header_read_timeout_ms: 30_000,
            max_streams: 1_000,
            stream_window: 256,
            stream_heartbeat_ms: 15_000,
            stream_retry_ms: 1_000,
            console_interval_ms: 500,
            cors_allowed_origins: String::new(),
            insecure: false,
            tls: Tls::default(),
        }
    }
}

impl Default for Storage {
    fn default() -> Self {
        Self {
            backend: StorageBackend::Embedded,
            default_partitions: 4,
            max_partitions: 1_024,
            max_topics: 10_000,
            max_record_bytes: 2 << 20,
            max_batch_bytes: 16 << 20,
            queue_capacity: 1_024,
            retention_ms: 0,
            retention_bytes_per_partition: 0,
            retention_check_ms: 60_000,
            retention_reclaim_bytes: 64 << 20,
            sync: SyncMode::Always,
            sync_interval_ms: 100,
            read_cache_bytes: crate::log::DEFAULT_READ_CACHE_BYTES,
        }
    }
}

impl From<&crate::engine::EngineConfig> for Engine {
    fn from(c: &crate::engine::EngineConfig) -> Self {
        Self {
            fetch_wait_ms: c.fetch_wait_ms,
            fetch_max_bytes: c.fetch_max_bytes,
            command_capacity: c.command_capacity,
            max_rate_rules: c.max_rate_rules,
        }
    }
}

impl From<&MeshConfig> for Mesh {
    fn from(c: &MeshConfig) -> Self {
        Self {
            max_groups: c.max_groups,
            max_clients_per_group: c.max_clients_per_group,
            max_partitions_per_group: c.max_partitions_per_group,
            max_window_per_lane: c.max_window_per_lane,
            max_ack_ranges_per_lane: c.max_ack_ranges_per_lane,
            fetch_batch: c.fetch_batch,
            fetch_retry_ms: c.fetch_retry_ms,
            flush_interval_ms: c.flush_interval_ms,
            max_outstanding_persists: c.max_outstanding_persists,
            client_idle_timeout_ms: c.client_idle_timeout_ms,
            max_replay_per_group: c.max_replay_per_group,
            max_ack_timeout_ms: c.limits.max_ack_timeout_ms,
            max_attempts: c.limits.max_attempts,
            max_in_flight_per_client: c.limits.max_in_flight_per_client,
            max_backoff_ms: c.limits.max_backoff_ms,
        }
    }
}

impl Config {
    /// The core's configuration. `commit_to_broker` is the storage backend's business
    /// (the embedded log keeps no group offsets), not a user setting.
    pub fn mesh_config(&self) -> MeshConfig {
        let m = &self.mesh;
        MeshConfig {
            max_groups: m.max_groups,
            max_clients_per_group: m.max_clients_per_group,
            max_partitions_per_group: m.max_partitions_per_group,
            max_window_per_lane: m.max_window_per_lane,
            max_ack_ranges_per_lane: m.max_ack_ranges_per_lane,
            fetch_batch: m.fetch_batch,
            fetch_retry_ms: m.fetch_retry_ms,
            flush_interval_ms: m.flush_interval_ms,
            max_outstanding_persists: m.max_outstanding_persists,
            client_idle_timeout_ms: m.client_idle_timeout_ms,
            max_replay_per_group: m.max_replay_per_group,
            // Kafka keeps group offsets: the committed offset is the group's watermark.
            commit_to_broker: self.storage.backend == StorageBackend::Kafka,
            limits: self.subscription_limits(),
        }
    }

    /// The engine's configuration. Retention runs every `storage.retention_check_ms` when
    /// some retention is set, never otherwise.
    pub fn engine_config(&self) -> crate::engine::EngineConfig {
        let s = &self.storage;
        let retains = s.retention_ms > 0 || s.retention_bytes_per_partition > 0;
        crate::engine::EngineConfig {
            mesh: self.mesh_config(),
            fetch_wait_ms: self.engine.fetch_wait_ms,
            fetch_max_bytes: self.engine.fetch_max_bytes,
            command_capacity: self.engine.command_capacity,
            max_rate_rules: self.engine.max_rate_rules,
            retention_interval_ms: if retains { s.retention_check_ms } else { 0 },
            dedup: self.dedup_config(),
        }
    }

    /// The publish dedup windows. Call after [`Config::validate`] (names and bounds are
    /// checked there; a topic name that is not one is left out here).
    pub fn dedup_config(&self) -> crate::engine::dedup::DedupConfig {
        use crate::engine::dedup::{DedupConfig, WindowRule};
        let d = &self.dedup;
        let rule = |window_s: u64, max_entries: usize| {
            (window_s > 0).then_some(WindowRule {
                window_ms: window_s.saturating_mul(1_000),
                max_entries,
            })
        };
        DedupConfig {
            default: rule(d.window_s, d.max_entries),
            topics: d
                .topics
                .iter()
                .filter_map(|(name, t)| {
                    let name = unimesh_core::TopicName::new(name).ok()?;
                    let r = rule(
                        t.window_s.unwrap_or(d.window_s),
                        t.max_entries.unwrap_or(d.max_entries),
                    );
                    Some((name, r))
                })
                .collect(),
        }
    }

    pub fn subscription_limits(&self) -> SubscriptionLimits {
        SubscriptionLimits {
            max_ack_timeout_ms: self.mesh.max_ack_timeout_ms,
            max_attempts: self.mesh.max_attempts,
            max_in_flight_per_client: self.mesh.max_in_flight_per_client,
            max_backoff_ms: self.mesh.max_backoff_ms,
        }
    }

    pub fn publish_limits(&self) -> PublishLimits {
        PublishLimits {
            max_event_bytes: self.limits.max_event_bytes,
            max_request_bytes: self.limits.max_request_bytes,
            max_batch_events: self.limits.max_batch_events,
        }
    }

    /// The embedded log's configuration, rooted at `data/log`.
    pub fn log_config(&self) -> crate::log::LogConfig {
        let s = &self.storage;
        let mut c = crate::log::LogConfig::new(self.log_dir());
        c.default_partitions = s.default_partitions;
        c.max_partitions = s.max_partitions;
        c.max_topics = s.max_topics;
        c.max_record_bytes = s.max_record_bytes;
        c.max_records_per_append = self.limits.max_batch_events;
        c.max_batch_bytes = s.max_batch_bytes;
        c.queue_capacity = s.queue_capacity;
        c.retention_ms = (s.retention_ms > 0).then_some(s.retention_ms);
        c.retention_bytes_per_partition =
            (s.retention_bytes_per_partition > 0).then_some(s.retention_bytes_per_partition);
        c.reclaim_after_bytes = s.retention_reclaim_bytes;
        c.sync_interval_ms = (s.sync == SyncMode::Interval).then_some(s.sync_interval_ms);
        c.read_cache_bytes = s.read_cache_bytes;
        c
    }

    /// Where the embedded log lives.
    pub fn log_dir(&self) -> PathBuf {
        self.data.join("log")
    }

    /// Where the state store lives (`None` for the in-memory store).
    pub fn state_dir(&self) -> Option<PathBuf> {
        match self.state.backend {
            StateBackend::Rocksdb => Some(self.data.join("state")),
            StateBackend::Sled => Some(self.data.join("state-sled")),
            StateBackend::Memory => None,
        }
    }

    /// Checks relations between settings that each type alone cannot express. The error
    /// names the key.
    /// Whether requests need credentials: identities, JWTs or client certificates are
    /// configured.
    pub fn auth_on(&self) -> bool {
        self.auth.enabled() || self.server.tls.client_certs()
    }

    /// The listener addresses that are not loopback, when no `[auth]` identity guards them
    /// and `server.insecure` does not allow that: `serve` refuses to start then.
    pub fn open_exposure(&self) -> Vec<SocketAddr> {
        if self.auth_on() || self.server.insecure {
            return Vec::new();
        }
        [self.http, self.admin]
            .into_iter()
            .filter(|a| !a.ip().is_loopback())
            .collect()
    }

    /// `[otel]`: an `http://` or `https://` URL when set, and a service name.
    fn validate_otel(&self) -> Result<(), ConfigError> {
        let o = &self.otel;
        let bad = |key: &str, why: String| {
            Err(ConfigError::Invalid {
                key: key.to_owned(),
                why,
            })
        };
        if !o.endpoint.is_empty() {
            match url::Url::parse(&o.endpoint) {
                Ok(u) if matches!(u.scheme(), "http" | "https") => {}
                Ok(u) => {
                    return bad(
                        "otel.endpoint",
                        format!("scheme {} is not http or https", u.scheme()),
                    )
                }
                Err(e) => return bad("otel.endpoint", format!("is not a URL: {e}")),
            }
        }
        if o.service_name.trim().is_empty() {
            return bad("otel.service_name", "must not be empty".into());
        }
        Ok(())
    }

    /// `[dedup]`: every window and entry bound in range, every topic a topic name.
    fn validate_dedup(&self) -> Result<(), ConfigError> {
        use crate::engine::dedup::{MAX_ENTRIES, MAX_WINDOW_MS};
        let bad = |key: String, why: String| Err(ConfigError::Invalid { key, why });
        let max_window_s = MAX_WINDOW_MS / 1_000;
        let window = |key: String, v: u64| {
            if v > max_window_s {
                return bad(
                    key,
                    format!("is {v}: must be between 0 (off) and {max_window_s} seconds (a week)"),
                );
            }
            Ok(())
        };
        let entries = |key: String, v: usize| {
            if v == 0 || v > MAX_ENTRIES {
                return bad(key, format!("is {v}: must be between 1 and {MAX_ENTRIES}"));
            }
            Ok(())
        };
        let d = &self.dedup;
        window("dedup.window_s".into(), d.window_s)?;
        entries("dedup.max_entries".into(), d.max_entries)?;
        for (name, t) in &d.topics {
            let key = |k: &str| format!("{DEDUP_TOPICS_KEY}.{name}{k}");
            if let Err(e) = unimesh_core::TopicName::new(name) {
                return bad(key(""), format!("is not a topic name: {e}"));
            }
            if let Some(v) = t.window_s {
                window(key(".window_s"), v)?;
            }
            if let Some(v) = t.max_entries {
                entries(key(".max_entries"), v)?;
            }
        }
        Ok(())
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key: &str, why: String| {
            Err(ConfigError::Invalid {
                key: key.to_owned(),
                why,
            })
        };
        if self.http == self.admin && self.http.port() != 0 {
            return bad(
                "admin",
                format!("{} is also the traffic address (http)", self.admin),
            );
        }
        if self.data.as_os_str().is_empty() {
            return bad("data", "must not be empty".into());
        }
        if let Err(e) = tracing_subscriber::EnvFilter::builder().parse(&self.log) {
            return bad("log", format!("is not a log filter: {e}"));
        }
        let l = &self.limits;
        let positive: [(&str, u64); 10] = [
            ("limits.max_request_bytes", l.max_request_bytes as u64),
            ("limits.max_event_bytes", l.max_event_bytes as u64),
            ("limits.max_batch_events", l.max_batch_events as u64),
            ("limits.max_json_bytes", l.max_json_bytes as u64),
            ("limits.max_ids_per_request", l.max_ids_per_request as u64),
            ("limits.max_poll_events", u64::from(l.max_poll_events)),
            (
                "limits.default_poll_events",
                u64::from(l.default_poll_events),
            ),
            ("limits.max_dlq_page", l.max_dlq_page as u64),
            ("limits.max_pending_requests", l.max_pending_requests as u64),
            ("limits.default_dlq_page", l.default_dlq_page as u64),
        ];
        for (key, v) in positive {
            if v == 0 {
                return bad(key, "must be at least 1".into());
            }
        }
        if l.body_read_timeout_ms == 0 {
            return bad("limits.body_read_timeout_ms", "must be at least 1".into());
        }
        if l.max_event_bytes > l.max_request_bytes {
            return bad(
                "limits.max_event_bytes",
                "must not exceed limits.max_request_bytes".into(),
            );
        }
        if l.max_poll_events > POLL_EVENTS_HARD_MAX {
            return bad(
                "limits.max_poll_events",
                format!("must be at most {POLL_EVENTS_HARD_MAX}"),
            );
        }
        if l.default_poll_events > l.max_poll_events {
            return bad(
                "limits.default_poll_events",
                "must not exceed limits.max_poll_events".into(),
            );
        }
        if l.max_wait_ms > WAIT_MS_HARD_MAX {
            return bad(
                "limits.max_wait_ms",
                format!("must be at most {WAIT_MS_HARD_MAX}"),
            );
        }
        if l.default_wait_ms > l.max_wait_ms {
            return bad(
                "limits.default_wait_ms",
                "must not exceed limits.max_wait_ms".into(),
            );
        }
        if l.default_dlq_page > l.max_dlq_page {
            return bad(
                "limits.default_dlq_page",
                "must not exceed limits.max_dlq_page".into(),
            );
        }
        if self.server.max_connections == 0 {
            return bad("server.max_connections", "must be at least 1".into());
        }
        if self.server.header_read_timeout_ms == 0 {
            return bad("server.header_read_timeout_ms", "must be at least 1".into());
        }
        for (key, v) in [
            ("push.max_concurrency", u64::from(self.push.max_concurrency)),
            ("push.request_timeout_ms", self.push.request_timeout_ms),
            ("push.scan_interval_ms", self.push.scan_interval_ms),
            ("server.max_streams", self.server.max_streams as u64),
            ("server.stream_window", u64::from(self.server.stream_window)),
            (
                "server.stream_heartbeat_ms",
                self.server.stream_heartbeat_ms,
            ),
        ] {
            if v == 0 {
                return bad(key, "must be at least 1".into());
            }
        }
        if !(MIN_CONSOLE_INTERVAL_MS..=MAX_CONSOLE_INTERVAL_MS)
            .contains(&self.server.console_interval_ms)
        {
            return bad(
                "server.console_interval_ms",
                format!("must be between {MIN_CONSOLE_INTERVAL_MS} and {MAX_CONSOLE_INTERVAL_MS}"),
            );
        }
        if let Err(why) = crate::http::target::TargetPolicy::parse(&self.push.allowed_hosts) {
            return bad("push.allowed_hosts", why);
        }
        if let Err(why) = crate::http::cors::Origins::parse(&self.server.cors_allowed_origins) {
            return bad("server.cors_allowed_origins", why);
        }
        if let Err((key, why)) = self.auth.validate() {
            return bad(&key, why);
        }
        let tls = &self.server.tls;
        let set = |p: &PathBuf| !p.as_os_str().is_empty();
        if set(&tls.cert) != set(&tls.key) {
            let (key, other) = if set(&tls.cert) {
                ("server.tls.key", "server.tls.cert")
            } else {
                ("server.tls.cert", "server.tls.key")
            };
            return bad(key, format!("must be set together with {other}"));
        }
        if set(&tls.client_ca) && !tls.enabled() {
            return bad(
                "server.tls.client_ca",
                "needs server.tls.cert and server.tls.key (client certificates come with TLS)"
                    .into(),
            );
        }
        let s = &self.storage;
        if s.max_partitions == 0 {
            return bad("storage.max_partitions", "must be at least 1".into());
        }
        if s.default_partitions == 0 || s.default_partitions > s.max_partitions {
            return bad(
                "storage.default_partitions",
                format!(
                    "must be between 1 and storage.max_partitions ({})",
                    s.max_partitions
                ),
            );
        }
        // Base64 grows binary data by 4/3; the rest of the stored JSON (attributes) is
        // bounded by the event size already, plus a little for the stored framing.
        let room = l
            .max_event_bytes
            .saturating_add(l.max_event_bytes / 3)
            .saturating_add(4096);
        if s.max_record_bytes < room {
            return bad(
                "storage.max_record_bytes",
                format!(
                    "must be at least {room} to hold the stored form of an event of \
                     limits.max_event_bytes ({})",
                    l.max_event_bytes
                ),
            );
        }
        if s.max_batch_bytes < s.max_record_bytes {
            return bad(
                "storage.max_batch_bytes",
                "must be at least storage.max_record_bytes".into(),
            );
        }
        for (key, v) in [
            ("storage.max_topics", s.max_topics),
            ("storage.queue_capacity", s.queue_capacity),
        ] {
            if v == 0 {
                return bad(key, "must be at least 1".into());
            }
        }
        if s.retention_check_ms == 0 {
            return bad("storage.retention_check_ms", "must be at least 1".into());
        }
        if s.sync_interval_ms == 0 || s.sync_interval_ms > crate::log::MAX_SYNC_INTERVAL_MS {
            return bad(
                "storage.sync_interval_ms",
                format!(
                    "must be between 1 and {} (the loss window on a machine crash)",
                    crate::log::MAX_SYNC_INTERVAL_MS
                ),
            );
        }
        if s.read_cache_bytes as u64 > crate::log::MAX_READ_CACHE_BYTES {
            return bad(
                "storage.read_cache_bytes",
                format!("must be at most {}", crate::log::MAX_READ_CACHE_BYTES),
            );
        }
        self.validate_dedup()?;
        self.validate_otel()?;
        let k = &self.kafka;
        if s.backend == StorageBackend::Kafka {
            if k.brokers.split(',').all(|b| b.trim().is_empty()) {
                return bad("kafka.brokers", "must name at least one HOST:PORT".into());
            }
            if k.replication == 0 {
                return bad("kafka.replication", "must be at least 1".into());
            }
            for (key, topic) in [
                ("kafka.progress_topic", &k.progress_topic),
                ("kafka.subscriptions_topic", &k.subscriptions_topic),
            ] {
                if let Err(e) = unimesh_core::TopicName::new(topic) {
                    return bad(key, format!("is not a topic name: {e}"));
                }
            }
            if k.progress_topic == k.subscriptions_topic {
                return bad(
                    "kafka.subscriptions_topic",
                    "must differ from kafka.progress_topic".into(),
                );
            }
            if k.request_timeout_ms == 0 {
                return bad("kafka.request_timeout_ms", "must be at least 1".into());
            }
            if let Err((key, why)) = crate::kafka::check_properties(k) {
                return bad(&key, why);
            }
        }
        let e = &self.engine;
        for (key, v) in [
            ("engine.fetch_max_bytes", e.fetch_max_bytes),
            ("engine.command_capacity", e.command_capacity),
            ("engine.max_rate_rules", e.max_rate_rules),
        ] {
            if v == 0 {
                return bad(key, "must be at least 1".into());
            }
        }
        let m = &self.mesh;
        for (key, v) in [
            ("mesh.max_groups", m.max_groups),
            ("mesh.max_clients_per_group", m.max_clients_per_group),
            ("mesh.max_partitions_per_group", m.max_partitions_per_group),
            ("mesh.max_window_per_lane", m.max_window_per_lane),
            ("mesh.max_ack_ranges_per_lane", m.max_ack_ranges_per_lane),
            ("mesh.fetch_batch", m.fetch_batch),
            ("mesh.max_outstanding_persists", m.max_outstanding_persists),
            ("mesh.max_replay_per_group", m.max_replay_per_group),
        ] {
            if v == 0 {
                return bad(key, "must be at least 1".into());
            }
        }
        for (key, v) in [
            ("mesh.flush_interval_ms", m.flush_interval_ms),
            ("mesh.max_ack_timeout_ms", m.max_ack_timeout_ms),
            ("mesh.max_attempts", u64::from(m.max_attempts)),
            (
                "mesh.max_in_flight_per_client",
                u64::from(m.max_in_flight_per_client),
            ),
        ] {
            if v == 0 {
                return bad(key, "must be at least 1".into());
            }
        }
        Ok(())
    }
}

/// Why the configuration could not be built. Each variant names the file, variable, flag or
/// key at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    ReadFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path} is not valid TOML: {message}")]
    ParseFile { path: PathBuf, message: String },
    #[error("unknown key `{key}` in config file {path}{hint}")]
    UnknownKey {
        path: PathBuf,
        key: String,
        hint: String,
    },
    #[error("`{key}` in {origin} must be {expected}, not {found}")]
    WrongType {
        origin: String,
        key: String,
        expected: &'static str,
        found: String,
    },
    #[error("{key}: {why}")]
    Invalid { key: String, why: String },
}

/// Flags given on the command line: each overrides every other source.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overrides {
    pub config: Option<PathBuf>,
    pub http: Option<String>,
    pub admin: Option<String>,
    pub data: Option<PathBuf>,
    /// `--storage`: `storage.backend`.
    pub storage: Option<String>,
    /// `--kafka-brokers`: `kafka.brokers`.
    pub kafka_brokers: Option<String>,
    /// `--kafka-instance`: `kafka.instance`.
    pub kafka_instance: Option<String>,
    /// `--insecure`: `server.insecure = true`.
    pub insecure: bool,
    /// `--tls-cert`: `server.tls.cert`.
    pub tls_cert: Option<PathBuf>,
    /// `--tls-key`: `server.tls.key`.
    pub tls_key: Option<PathBuf>,
}

/// The result of [`load`]: the configuration and what it was made of, for the startup log.
#[derive(Clone, Debug)]
pub struct Loaded {
    pub config: Config,
    /// The file read, if any.
    pub file: Option<PathBuf>,
    /// `UNIMESH_*` variables that are neither configuration keys nor known to the project
    /// (a typo, most likely): reported as warnings once logging is up.
    pub unknown_env: Vec<String>,
}

/// Builds the configuration from the defaults, the file (`overrides.config`, else
/// `UNIMESH_CONFIG`), the given environment and the flags.
pub fn load<I>(overrides: &Overrides, env: I) -> Result<Loaded, ConfigError>
where
    I: IntoIterator<Item = (String, String)>,
{
    let env: BTreeMap<String, String> = env
        .into_iter()
        .filter(|(k, _)| k.starts_with(ENV_PREFIX))
        .collect();
    let mut table = default_table();
    let file = overrides
        .config
        .clone()
        .or_else(|| env.get(ENV_CONFIG_FILE).map(PathBuf::from));
    if let Some(path) = &file {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::ReadFile {
            path: path.clone(),
            source,
        })?;
        let parsed: Table = text
            .parse()
            .map_err(|e: toml::de::Error| ConfigError::ParseFile {
                path: path.clone(),
                message: e.to_string(),
            })?;
        merge_file(&mut table, parsed, path, "")?;
    }
    let unknown_env = apply_env(&mut table, &env)?;
    let flags = [
        ("http", "http", overrides.http.clone()),
        ("admin", "admin", overrides.admin.clone()),
        (
            "data",
            "data",
            overrides.data.as_ref().map(|p| p.display().to_string()),
        ),
        ("storage.backend", "storage", overrides.storage.clone()),
        (
            "kafka.brokers",
            "kafka-brokers",
            overrides.kafka_brokers.clone(),
        ),
        (
            "kafka.instance",
            "kafka-instance",
            overrides.kafka_instance.clone(),
        ),
        (
            "server.insecure",
            "insecure",
            overrides.insecure.then(|| "true".to_owned()),
        ),
        (
            "server.tls.cert",
            "tls-cert",
            overrides.tls_cert.as_ref().map(|p| p.display().to_string()),
        ),
        (
            "server.tls.key",
            "tls-key",
            overrides.tls_key.as_ref().map(|p| p.display().to_string()),
        ),
    ];
    for (key, flag, value) in flags {
        if let Some(value) = value {
            set_from_text(&mut table, key, &value, &format!("flag --{flag}"))?;
        }
    }
    for key in ["http", "admin"] {
        if let Some(Value::String(addr)) = table.get(key) {
            if addr.parse::<SocketAddr>().is_err() {
                return Err(ConfigError::Invalid {
                    key: key.to_owned(),
                    why: format!(
                        "{addr:?} is not an IP:PORT address (e.g. 127.0.0.1:8080, 0.0.0.0:8080 \
                         or [::1]:8080; host names are not resolved)"
                    ),
                });
            }
        }
    }
    let config = from_table(table)?;
    config.validate()?;
    Ok(Loaded {
        config,
        file,
        unknown_env,
    })
}

fn default_table() -> Table {
    // Serialising plain structs of numbers, strings and paths into TOML cannot fail; the
    // unit test `defaults_round_trip` proves it for the current fields.
    Table::try_from(Config::default()).unwrap_or_default()
}

/// Lays `file` over `base`: every key must exist in `base` with a value of the same type.
fn merge_file(base: &mut Table, file: Table, path: &Path, prefix: &str) -> Result<(), ConfigError> {
    for (key, value) in file {
        let full = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        let Some(slot) = base.get_mut(&key) else {
            let known: Vec<&str> = base.keys().map(String::as_str).collect();
            return Err(ConfigError::UnknownKey {
                path: path.to_owned(),
                key: full,
                hint: format!(
                    " (known keys{}: {})",
                    if prefix.is_empty() {
                        String::new()
                    } else {
                        format!(" in [{prefix}]")
                    },
                    known.join(", ")
                ),
            });
        };
        let origin = || format!("config file {}", path.display());
        match (slot, value) {
            // Free names, each a table checked when the whole is deserialised.
            (Value::Table(sub), Value::Table(v))
                if full == auth::IDENTITIES_KEY || full == DEDUP_TOPICS_KEY =>
            {
                *sub = v
            }
            (Value::Table(sub), Value::Table(v)) if is_property_table(&full) => {
                for (name, v) in v {
                    let text = match v {
                        Value::String(s) => s,
                        Value::Integer(i) => i.to_string(),
                        Value::Boolean(b) => b.to_string(),
                        other => {
                            return Err(ConfigError::WrongType {
                                origin: origin(),
                                key: format!("{full}.{name}"),
                                expected: "a string, an integer or a boolean",
                                found: format!("{} {other}", type_name(&other)),
                            })
                        }
                    };
                    sub.insert(name, Value::String(text));
                }
            }
            (Value::Table(sub), Value::Table(v)) => merge_file(sub, v, path, &full)?,
            (slot, value) => {
                let value = conform(slot, value).map_err(|found| ConfigError::WrongType {
                    origin: origin(),
                    key: full.clone(),
                    expected: type_name(slot),
                    found,
                })?;
                *slot = value;
            }
        }
    }
    Ok(())
}

/// `value` converted to the type of `like`, or the description of what it is instead.
fn conform(like: &Value, value: Value) -> Result<Value, String> {
    match (like, value) {
        (Value::Integer(_), Value::Integer(i)) if i >= 0 => Ok(Value::Integer(i)),
        (Value::Integer(_), Value::Integer(i)) => Err(format!("the negative number {i}")),
        (Value::Float(_), Value::Float(f)) => Ok(Value::Float(f)),
        (Value::Float(_), Value::Integer(i)) => Ok(Value::Float(i as f64)),
        (Value::String(_), Value::String(s)) => Ok(Value::String(s)),
        (Value::Boolean(_), Value::Boolean(b)) => Ok(Value::Boolean(b)),
        (_, other) => Err(format!("{} {}", type_name(&other), other)),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::String(_) => "a string",
        Value::Integer(_) => "a non-negative integer",
        Value::Float(_) => "a number",
        Value::Boolean(_) => "a boolean (true or false)",
        Value::Datetime(_) => "a datetime",
        Value::Array(_) => "an array",
        Value::Table(_) => "a table",
    }
}

/// Every leaf key of the defaults as a dotted path.
fn leaf_keys(table: &Table, prefix: &str, out: &mut Vec<String>) {
    for (key, value) in table {
        let full = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        match value {
            Value::Table(_)
                if is_property_table(&full)
                    || full == auth::IDENTITIES_KEY
                    || full == DEDUP_TOPICS_KEY =>
            {
                out.push(full)
            }
            Value::Table(sub) => leaf_keys(sub, &full, out),
            _ => out.push(full),
        }
    }
}

/// The environment variable of a dotted key: `limits.max_wait_ms` → `UNIMESH_LIMITS_MAX_WAIT_MS`.
pub fn env_name(key: &str) -> String {
    format!("{ENV_PREFIX}{}", key.replace('.', "_").to_ascii_uppercase())
}

/// Every configuration key, dotted, in file order (for documentation and tests).
pub fn keys() -> Vec<String> {
    let mut out = Vec::new();
    leaf_keys(&default_table(), "", &mut out);
    out
}

fn apply_env(
    table: &mut Table,
    env: &BTreeMap<String, String>,
) -> Result<Vec<String>, ConfigError> {
    let by_env: BTreeMap<String, String> = keys().into_iter().map(|k| (env_name(&k), k)).collect();
    let mut unknown = Vec::new();
    for (name, value) in env {
        match by_env.get(name) {
            Some(key) => set_from_text(table, key, value, &format!("environment variable {name}"))?,
            None if ENV_NOT_CONFIG.contains(&name.as_str()) => {}
            None => unknown.push(name.clone()),
        }
    }
    Ok(unknown)
}

/// Sets the leaf `key` from text, parsed with the type of its current value.
fn set_from_text(
    table: &mut Table,
    key: &str,
    text: &str,
    origin: &str,
) -> Result<(), ConfigError> {
    let mut parts = key.split('.').peekable();
    let mut cur = table;
    while let Some(part) = parts.next() {
        let Some(slot) = cur.get_mut(part) else {
            break;
        };
        if parts.peek().is_none() {
            let wrong = |expected: &'static str| ConfigError::WrongType {
                origin: origin.to_owned(),
                key: key.to_owned(),
                expected,
                found: format!("{text:?}"),
            };
            *slot = match slot {
                Value::Integer(_) => {
                    let n: u64 = text
                        .trim()
                        .parse()
                        .map_err(|_| wrong("a non-negative integer"))?;
                    Value::Integer(i64::try_from(n).map_err(|_| wrong("an integer below 2^63"))?)
                }
                Value::Float(_) => {
                    Value::Float(text.trim().parse().map_err(|_| wrong("a number"))?)
                }
                Value::Boolean(_) => match text.trim() {
                    "true" | "1" => Value::Boolean(true),
                    "false" | "0" => Value::Boolean(false),
                    _ => return Err(wrong("true or false")),
                },
                Value::Table(_) if key == auth::IDENTITIES_KEY => {
                    return Err(wrong(
                        "nothing: identities are set in the file ([auth.identities.NAME])",
                    ))
                }
                Value::Table(_) if key == DEDUP_TOPICS_KEY => {
                    return Err(wrong(
                        "nothing: per-topic windows are set in the file ([dedup.topics.NAME])",
                    ))
                }
                // Laid over the file's table property by property.
                Value::Table(t) if is_property_table(key) => {
                    let mut merged = t.clone();
                    merged.extend(
                        parse_properties(text).map_err(|_| wrong("NAME=VALUE,NAME=VALUE"))?,
                    );
                    Value::Table(merged)
                }
                _ => Value::String(text.to_owned()),
            };
            return Ok(());
        }
        match slot {
            Value::Table(sub) => cur = sub,
            _ => break,
        }
    }
    // Only keys taken from the defaults reach here, so this is a bug, reported as one.
    Err(ConfigError::Invalid {
        key: key.to_owned(),
        why: "is not a configuration key".into(),
    })
}

/// Deserialises the merged table. Types were checked while merging, so what can still fail
/// is a value's range or an unknown variant; the message is made to name the key.
fn from_table(table: Table) -> Result<Config, ConfigError> {
    // Through text, because toml's document deserializer reports the key path of an error
    // (a `Value` deserializer does not).
    let text = toml::to_string(&table).map_err(|e| ConfigError::Invalid {
        key: String::new(),
        why: e.to_string(),
    })?;
    toml::from_str::<Config>(&text).map_err(|e| ConfigError::Invalid {
        key: located_key(&text, &e).unwrap_or_default(),
        why: e.message().to_owned(),
    })
}

/// The dotted key at the error's position in `text` (which `toml::to_string` wrote: one key
/// per line, tables as `[name]` headers).
fn located_key(text: &str, e: &toml::de::Error) -> Option<String> {
    let span = e.span()?;
    let mut section = String::new();
    let mut pos = 0;
    for line in text.lines() {
        let end = pos + line.len();
        let trimmed = line.trim();
        if let Some(name) = trimmed.strip_prefix('[').and_then(|s| s.strip_suffix(']')) {
            section = name.to_owned();
        } else if span.start <= end {
            let key = trimmed.split('=').next()?.trim();
            return Some(if section.is_empty() {
                key.to_owned()
            } else {
                format!("{section}.{key}")
            });
        }
        pos = end + 1;
    }
    None
}

impl fmt::Display for StateBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StateBackend::Rocksdb => "rocksdb",
            StateBackend::Sled => "sled",
            StateBackend::Memory => "memory",
        })
    }
}

impl fmt::Display for StorageBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StorageBackend::Embedded => "embedded",
            StorageBackend::Kafka => "kafka",
        })
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        f.write_all(text.as_bytes()).expect("write temp file");
        f
    }

    fn with_file(f: &tempfile::NamedTempFile) -> Overrides {
        Overrides {
            config: Some(f.path().to_owned()),
            ..Overrides::default()
        }
    }

    /// Goal: the documented example configuration never drifts from the code. Method: its
    /// table (keys and values) equals the serialised defaults, and it loads as a file.
    #[test]
    fn the_example_file_lists_every_key_with_its_default() {
        const EXAMPLE: &str = include_str!("../../unimesh.example.toml");
        let example: Table = toml::from_str(EXAMPLE).expect("the example is TOML");
        let defaults = Table::try_from(Config::default()).expect("defaults serialise");
        assert_eq!(example, defaults);
        let f = file(EXAMPLE);
        let loaded = load(&with_file(&f), env(&[])).expect("the example loads");
        assert_eq!(loaded.config, Config::default());
    }

    #[test]
    fn defaults_round_trip_and_match_the_design() {
        let table = Table::try_from(Config::default()).expect("defaults serialise");
        assert_eq!(
            from_table(table).expect("defaults deserialise"),
            Config::default()
        );
        let c = load(&Overrides::default(), env(&[]))
            .expect("defaults load")
            .config;
        assert_eq!(c.data, PathBuf::from("./data"));
        assert_eq!(c.http.to_string(), "127.0.0.1:8080");
        assert_eq!(c.admin.to_string(), "127.0.0.1:8081");
        assert_eq!(c.storage.backend, StorageBackend::Embedded);
        assert_eq!(c.state.backend, StateBackend::Rocksdb);
        assert_eq!(c.storage.default_partitions, 4);
        assert_eq!(c.limits.max_poll_events, 1000);
        assert_eq!(c.limits.max_wait_ms, 60_000);
        assert_eq!(c.mesh_config(), MeshConfig::default());
    }

    #[test]
    fn file_sets_nested_keys() {
        let f = file(
            "data = \"/var/lib/unimesh\"\nhttp = \"0.0.0.0:9000\"\n\
             [state]\nbackend = \"sled\"\n[storage]\ndefault_partitions = 8\n\
             retention_ms = 3600000\nretention_reclaim_bytes = 1024\n[mesh]\nmax_groups = 7\n",
        );
        let c = load(&with_file(&f), env(&[])).expect("loads").config;
        assert_eq!(c.data, PathBuf::from("/var/lib/unimesh"));
        assert_eq!(c.http.to_string(), "0.0.0.0:9000");
        assert_eq!(c.state.backend, StateBackend::Sled);
        assert_eq!(c.storage.default_partitions, 8);
        assert_eq!(c.log_config().retention_ms, Some(3_600_000));
        assert_eq!(c.log_config().retention_bytes_per_partition, None);
        assert_eq!(c.log_config().reclaim_after_bytes, 1024);
        assert_eq!(c.mesh_config().max_groups, 7);
        assert_eq!(
            c.admin.to_string(),
            "127.0.0.1:8081",
            "untouched keys keep defaults"
        );
    }

    #[test]
    fn unknown_file_keys_are_named() {
        let f = file("[limits]\nmax_wait = 5\n");
        let err = load(&with_file(&f), env(&[])).unwrap_err().to_string();
        assert!(err.contains("unknown key `limits.max_wait`"), "{err}");
        assert!(
            err.contains("max_wait_ms"),
            "hint lists the known keys: {err}"
        );
        let f = file("colour = \"blue\"\n");
        let err = load(&with_file(&f), env(&[])).unwrap_err().to_string();
        assert!(err.contains("unknown key `colour`"), "{err}");
        let f = file("[nosuch]\nx = 1\n");
        let err = load(&with_file(&f), env(&[])).unwrap_err().to_string();
        assert!(err.contains("unknown key `nosuch`"), "{err}");
    }

    #[test]
    fn wrong_types_and_values_are_named() {
        let f = file("[limits]\nmax_wait_ms = \"soon\"\n");
        let err = load(&with_file(&f), env(&[])).unwrap_err().to_string();
        assert!(err.contains("`limits.max_wait_ms`"), "{err}");
        assert!(err.contains("integer"), "{err}");
        let f = file("[limits]\nmax_wait_ms = -1\n");
        let err = load(&with_file(&f), env(&[])).unwrap_err().to_string();
        assert!(
            err.contains("`limits.max_wait_ms`") && err.contains("negative"),
            "{err}"
        );
        let f = file("[state]\nbackend = \"postgres\"\n");
        let err = load(&with_file(&f), env(&[])).unwrap_err().to_string();
        assert!(
            err.contains("state.backend") && err.contains("postgres"),
            "{err}"
        );
        let f = file("[mesh]\nmax_attempts = 99999999999\n");
        let err = load(&with_file(&f), env(&[])).unwrap_err().to_string();
        assert!(err.contains("mesh.max_attempts"), "{err}");
        let f = file("http = \"localhost:80\"\n");
        let err = load(&with_file(&f), env(&[])).unwrap_err().to_string();
        assert!(
            err.starts_with("http") && err.contains("\"localhost:80\""),
            "{err}"
        );
        let f = file("this is = not toml [");
        let err = load(&with_file(&f), env(&[])).unwrap_err();
        assert!(matches!(err, ConfigError::ParseFile { .. }), "{err}");
    }

    #[test]
    fn missing_file_is_an_error_naming_it() {
        let o = Overrides {
            config: Some(PathBuf::from("/nonexistent/unimesh.toml")),
            ..Overrides::default()
        };
        let err = load(&o, env(&[])).unwrap_err().to_string();
        assert!(err.contains("/nonexistent/unimesh.toml"), "{err}");
    }

    #[test]
    fn precedence_is_flag_then_env_then_file_then_default() {
        let f = file(
            "http = \"127.0.0.1:1001\"\nadmin = \"127.0.0.1:1002\"\ndata = \"file\"\n\
                      [storage]\ndefault_partitions = 2\n",
        );
        let e = env(&[
            ("UNIMESH_HTTP", "127.0.0.1:2001"),
            ("UNIMESH_DATA", "env"),
            ("UNIMESH_STORAGE_DEFAULT_PARTITIONS", "3"),
        ]);
        let mut o = with_file(&f);
        o.data = Some(PathBuf::from("flag"));
        let c = load(&o, e).expect("loads").config;
        assert_eq!(c.data, PathBuf::from("flag"), "flag beats env and file");
        assert_eq!(c.http.to_string(), "127.0.0.1:2001", "env beats file");
        assert_eq!(c.admin.to_string(), "127.0.0.1:1002", "file beats default");
        assert_eq!(c.storage.default_partitions, 3);
        assert_eq!(c.limits.max_wait_ms, 60_000, "default when nobody sets it");
    }

    #[test]
    fn config_file_from_env_and_flag_wins() {
        let a = file("data = \"from-a\"\n");
        let b = file("data = \"from-b\"\n");
        let e = env(&[(
            "UNIMESH_CONFIG",
            a.path().to_str().expect("utf-8 temp path"),
        )]);
        let loaded = load(&Overrides::default(), e.clone()).expect("loads");
        assert_eq!(loaded.config.data, PathBuf::from("from-a"));
        assert_eq!(loaded.file.as_deref(), Some(a.path()));
        let c = load(&with_file(&b), e).expect("loads").config;
        assert_eq!(c.data, PathBuf::from("from-b"));
    }

    #[test]
    fn env_values_are_typed_and_errors_name_the_variable() {
        let c = load(
            &Overrides::default(),
            env(&[
                ("UNIMESH_STATE_BACKEND", "memory"),
                ("UNIMESH_LIMITS_MAX_POLL_EVENTS", "50"),
                ("UNIMESH_MESH_MAX_ATTEMPTS", "3"),
            ]),
        )
        .expect("loads")
        .config;
        assert_eq!(c.state.backend, StateBackend::Memory);
        assert_eq!(c.state_dir(), None);
        assert_eq!(c.limits.max_poll_events, 50);
        assert_eq!(c.subscription_limits().max_attempts, 3);
        let err = load(
            &Overrides::default(),
            env(&[("UNIMESH_LIMITS_MAX_WAIT_MS", "-5")]),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("UNIMESH_LIMITS_MAX_WAIT_MS"), "{err}");
        let err = load(&Overrides::default(), env(&[("UNIMESH_ADMIN", "nope")]))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("admin"), "{err}");
    }

    #[test]
    fn unknown_env_is_reported_not_fatal() {
        let loaded = load(
            &Overrides::default(),
            env(&[
                ("UNIMESH_HTPP", "x"),
                ("UNIMESH_SEED", "7"),
                ("PATH", "/bin"),
            ]),
        )
        .expect("loads");
        assert_eq!(loaded.unknown_env, vec!["UNIMESH_HTPP".to_owned()]);
    }

    #[test]
    fn relations_between_keys_are_checked() {
        let cases = [
            ("admin = \"127.0.0.1:8080\"\n", "admin"),
            (
                "[limits]\ndefault_poll_events = 2000\n",
                "limits.default_poll_events",
            ),
            ("[limits]\nmax_poll_events = 0\n", "limits.max_poll_events"),
            (
                "[limits]\ndefault_wait_ms = 70000\n",
                "limits.default_wait_ms",
            ),
            (
                "[storage]\ndefault_partitions = 0\n",
                "storage.default_partitions",
            ),
            (
                "[storage]\nmax_record_bytes = 1048576\n",
                "storage.max_record_bytes",
            ),
            (
                "[storage]\nsync_interval_ms = 0\n",
                "storage.sync_interval_ms",
            ),
            (
                "[storage]\nsync_interval_ms = 60001\n",
                "storage.sync_interval_ms",
            ),
            ("log = \"[[[\"\n", "log"),
            ("[server.tls]\ncert = \"a.pem\"\n", "server.tls.key"),
            ("[server.tls]\nkey = \"a.key\"\n", "server.tls.cert"),
            (
                "[server.tls]\nclient_ca = \"ca.pem\"\n",
                "server.tls.client_ca",
            ),
            (
                "[server.tls]\ncert = \"a\"\nkey = \"b\"\nclient_auth = \"maybe\"\n",
                "server.tls.client_auth",
            ),
            ("[auth.jwt]\nkey_file = \"k.pub\"\n", "auth.jwt.algorithm"),
            (
                "[auth.jwt]\nalgorithm = \"HS512\"\nkey_file = \"k\"\n",
                "auth.jwt.algorithm",
            ),
            (
                "[auth.jwt]\nalgorithm = \"RS256\"\nkey_file = \"k\"\njwks_file = \"j\"\n",
                "auth.jwt.jwks_file",
            ),
        ];
        for (text, key) in cases {
            let f = file(text);
            match load(&with_file(&f), env(&[])) {
                Err(ConfigError::Invalid { key: k, .. }) => assert_eq!(k, key, "{text}"),
                other => panic!("{text}: expected an error on {key}, got {other:?}"),
            }
        }
    }

    /// Goal: publish dedup is off by default, set for every topic or per topic (a topic's
    /// table inheriting what it leaves out, `window_s = 0` turning it off), and every bad
    /// window, bound or name refused naming its key. Method: load files and read the
    /// engine's dedup configuration.
    #[test]
    fn dedup_windows_load_per_topic_and_bad_ones_are_named() {
        use crate::engine::dedup::WindowRule;
        let t = |s: &str| unimesh_core::TopicName::new(s).unwrap();
        assert!(!Config::default().dedup_config().enabled());
        let f = file(
            "[dedup]\nmax_entries = 500\n\n[dedup.topics.orders]\nwindow_s = 600\n\n\
             [dedup.topics.\"audit.log\"]\nwindow_s = 60\nmax_entries = 7\n",
        );
        let c = load(&with_file(&f), env(&[])).expect("loads").config;
        let d = c.dedup_config();
        assert_eq!(d.default, None, "window_s = 0 leaves the other topics off");
        let rule = |window_ms, max_entries| {
            Some(WindowRule {
                window_ms,
                max_entries,
            })
        };
        assert_eq!(d.rule(&t("orders")), rule(600_000, 500));
        assert_eq!(d.rule(&t("audit.log")), rule(60_000, 7));
        assert_eq!(d.rule(&t("other")), None);
        assert_eq!(c.engine_config().dedup, d);

        let f = file("[dedup]\nwindow_s = 30\n[dedup.topics.noisy]\nwindow_s = 0\n");
        let d = load(&with_file(&f), env(&[]))
            .expect("loads")
            .config
            .dedup_config();
        assert_eq!(d.rule(&t("other")), rule(30_000, 100_000));
        assert_eq!(d.rule(&t("noisy")), None);
        let c = load(
            &Overrides::default(),
            env(&[("UNIMESH_DEDUP_WINDOW_S", "5")]),
        )
        .expect("loads")
        .config;
        assert_eq!(c.dedup_config().rule(&t("x")), rule(5_000, 100_000));

        for (text, key) in [
            ("[dedup]\nwindow_s = 604801\n", "dedup.window_s"),
            ("[dedup]\nmax_entries = 0\n", "dedup.max_entries"),
            ("[dedup]\nmax_entries = 1000001\n", "dedup.max_entries"),
            (
                "[dedup.topics.orders]\nwindow_s = 999999999\n",
                "dedup.topics.orders.window_s",
            ),
            (
                "[dedup.topics.orders]\nmax_entries = 0\n",
                "dedup.topics.orders.max_entries",
            ),
            ("[dedup.topics.\"a b\"]\nwindow_s = 1\n", "dedup.topics.a b"),
        ] {
            let f = file(text);
            match load(&with_file(&f), env(&[])) {
                Err(ConfigError::Invalid { key: k, why }) => {
                    assert_eq!(k, key, "{text}");
                    assert!(why.contains("must") || why.contains("not a topic"), "{why}");
                }
                other => panic!("{text}: expected an error on {key}, got {other:?}"),
            }
        }
        // A misspelt key inside a topic's table is named, not ignored.
        let f = file("[dedup.topics.orders]\nwindow_secs = 5\n");
        let err = load(&with_file(&f), env(&[]))
            .expect_err("refused")
            .to_string();
        assert!(err.contains("window_secs"), "{err}");
        let err = load(
            &Overrides::default(),
            env(&[("UNIMESH_DEDUP_TOPICS", "orders=5")]),
        )
        .expect_err("refused")
        .to_string();
        assert!(err.contains("dedup.topics.NAME"), "{err}");
    }

    /// Goal: `[otel]` is off by default, set from the file or `UNIMESH_OTEL_ENDPOINT`, and an
    /// endpoint that is not an http(s) URL, or an empty service name, is refused by name.
    #[test]
    fn otel_loads_from_file_and_environment_and_bad_values_are_named() {
        assert!(Config::default().otel.endpoint.is_empty());
        let c = load(
            &Overrides::default(),
            env(&[("UNIMESH_OTEL_ENDPOINT", "http://127.0.0.1:4318")]),
        )
        .expect("loads")
        .config;
        assert_eq!(c.otel.endpoint, "http://127.0.0.1:4318");
        assert_eq!(c.otel.service_name, "unimesh");
        let f = file("[otel]\nendpoint = \"https://collector:4318/\"\nservice_name = \"m\"\n");
        let c = load(&with_file(&f), env(&[])).expect("loads").config;
        assert_eq!(c.otel.service_name, "m");
        for (text, key, why) in [
            (
                "[otel]\nendpoint = \"grpc://x:4317\"\n",
                "otel.endpoint",
                "scheme grpc",
            ),
            (
                "[otel]\nendpoint = \"x:4318\"\n",
                "otel.endpoint",
                "not http or https",
            ),
            (
                "[otel]\nendpoint = \"no url\"\n",
                "otel.endpoint",
                "not a URL",
            ),
            (
                "[otel]\nservice_name = \" \"\n",
                "otel.service_name",
                "empty",
            ),
        ] {
            let f = file(text);
            match load(&with_file(&f), env(&[])) {
                Err(ConfigError::Invalid { key: k, why: w }) => {
                    assert_eq!(k, key, "{text}");
                    assert!(w.contains(why), "{text}: {w}");
                }
                other => panic!("{text}: expected an error on {key}, got {other:?}"),
            }
        }
    }

    /// Goal: TLS and JWT settings come from the file, the environment and the flags like
    /// every other key, and turn authentication (and so the loopback rule) on.
    #[test]
    fn tls_and_jwt_settings_load_and_turn_auth_on() {
        let o = Overrides {
            tls_cert: Some(PathBuf::from("/etc/mesh/chain.pem")),
            tls_key: Some(PathBuf::from("/etc/mesh/key.pem")),
            ..Overrides::default()
        };
        let c = load(
            &o,
            env(&[
                ("UNIMESH_SERVER_TLS_CLIENT_CA", "/etc/mesh/ca.pem"),
                ("UNIMESH_SERVER_TLS_CLIENT_AUTH", "optional"),
                ("UNIMESH_HTTP", "0.0.0.0:8443"),
            ]),
        )
        .expect("loads")
        .config;
        assert_eq!(c.server.tls.cert, PathBuf::from("/etc/mesh/chain.pem"));
        assert_eq!(c.server.tls.client_auth, ClientAuth::Optional);
        assert!(c.server.tls.client_certs() && c.auth_on());
        assert!(
            c.open_exposure().is_empty(),
            "client certificates guard 0.0.0.0"
        );
        let f = file("[auth.jwt]\nalgorithm = \"EdDSA\"\nkey_file = \"/k.pub\"\n");
        let c = load(&with_file(&f), env(&[])).expect("loads").config;
        assert!(c.auth.jwt.enabled() && c.auth_on());
        assert_eq!(c.auth.jwt.identity_claim, "sub");
        assert!(!Config::default().auth_on());
    }

    #[test]
    fn storage_sync_reaches_the_log_and_a_wrong_mode_is_named() {
        let c = load(&Overrides::default(), env(&[])).expect("loads").config;
        assert_eq!(c.log_config().sync_interval_ms, None, "always by default");
        let f = file("[storage]\nsync = \"interval\"\nsync_interval_ms = 250\n");
        let c = load(&with_file(&f), env(&[])).expect("loads").config;
        assert_eq!(c.log_config().sync_interval_ms, Some(250));
        let e = env(&[("UNIMESH_STORAGE_SYNC", "interval")]);
        let c = load(&Overrides::default(), e).expect("loads").config;
        assert_eq!(c.log_config().sync_interval_ms, Some(100));
        let f = file("[storage]\nsync = \"sometimes\"\n");
        let e = load(&with_file(&f), env(&[])).expect_err("an unknown mode");
        let text = e.to_string();
        assert!(
            text.contains("sometimes") || text.contains("sync"),
            "{text}"
        );
    }

    #[test]
    fn port_zero_may_repeat() {
        let c = load(
            &Overrides {
                http: Some("127.0.0.1:0".into()),
                admin: Some("127.0.0.1:0".into()),
                ..Overrides::default()
            },
            env(&[]),
        )
        .expect("loads")
        .config;
        assert_eq!(c.http.port(), 0);
    }

    #[test]
    fn every_key_has_an_env_name() {
        let keys = keys();
        assert!(keys.contains(&"http".to_owned()));
        assert!(keys.contains(&"mesh.max_groups".to_owned()));
        assert_eq!(env_name("http"), "UNIMESH_HTTP");
        assert_eq!(env_name("limits.max_wait_ms"), "UNIMESH_LIMITS_MAX_WAIT_MS");
        let names: std::collections::BTreeSet<_> = keys.iter().map(|k| env_name(k)).collect();
        assert_eq!(names.len(), keys.len(), "env names are unambiguous");
    }

    /// Goal: the Kafka backend is chosen and configured through every layer. Method: flags
    /// pick it and its brokers; the pass-through table takes any property from the file
    /// and from `UNIMESH_KAFKA_PROPERTIES`; a property the contract depends on is refused
    /// with the key named.
    #[test]
    fn kafka_backend_from_flags_file_and_env() {
        let overrides = Overrides {
            storage: Some("kafka".into()),
            kafka_brokers: Some("127.0.0.1:19092".into()),
            kafka_instance: Some("edge-1".into()),
            ..Overrides::default()
        };
        let c = load(&overrides, env(&[])).expect("loads").config;
        assert_eq!(c.storage.backend, StorageBackend::Kafka);
        assert_eq!(c.kafka.brokers, "127.0.0.1:19092");
        assert_eq!(c.kafka.instance, "edge-1", "the flag names the instance");
        assert!(
            c.mesh_config().commit_to_broker,
            "Kafka keeps group offsets"
        );

        let f = file("[storage]\nbackend = \"kafka\"\n[kafka.properties]\n\"linger.ms\" = 5\n\"client.rack\" = \"r1\"\n");
        let c = load(
            &with_file(&f),
            env(&[(
                "UNIMESH_KAFKA_PROPERTIES",
                "socket.keepalive.enable=true, linger.ms=7",
            )]),
        )
        .expect("loads")
        .config;
        assert_eq!(
            c.kafka.properties.get("client.rack").map(String::as_str),
            Some("r1")
        );
        assert_eq!(
            c.kafka.properties.get("linger.ms").map(String::as_str),
            Some("7")
        );
        assert_eq!(
            c.kafka
                .properties
                .get("socket.keepalive.enable")
                .map(String::as_str),
            Some("true")
        );

        let f = file("[storage]\nbackend = \"kafka\"\n[kafka.properties]\n\"enable.auto.commit\" = \"true\"\n");
        let err = load(&with_file(&f), env(&[])).unwrap_err().to_string();
        assert!(err.contains("kafka.properties.enable.auto.commit"), "{err}");

        // The producer's and the consumers' tables, from the file and the environment.
        let f = file(
            "[storage]\nbackend = \"kafka\"\n[kafka]\ninstance = \"edge-1\"\nstatic_membership = true\n\
             [kafka.producer]\n\"linger.ms\" = 5\n[kafka.consumer]\n\"session.timeout.ms\" = 10000\n",
        );
        let c = load(
            &with_file(&f),
            env(&[("UNIMESH_KAFKA_CONSUMER", "heartbeat.interval.ms=1000")]),
        )
        .expect("loads")
        .config;
        assert!(c.kafka.static_membership);
        assert_eq!(
            c.kafka.producer.get("linger.ms").map(String::as_str),
            Some("5")
        );
        assert_eq!(
            c.kafka
                .consumer
                .get("session.timeout.ms")
                .map(String::as_str),
            Some("10000")
        );
        assert_eq!(
            c.kafka
                .consumer
                .get("heartbeat.interval.ms")
                .map(String::as_str),
            Some("1000")
        );
        assert!(
            c.kafka.properties.is_empty() && !c.kafka.producer.contains_key("session.timeout.ms")
        );
        let f = file("[storage]\nbackend = \"kafka\"\n[kafka.consumer]\n\"group.id\" = \"mine\"\n");
        let err = load(&with_file(&f), env(&[])).unwrap_err().to_string();
        assert!(err.contains("kafka.consumer.group.id"), "{err}");
        let f = file("[storage]\nbackend = \"kafka\"\n[kafka]\nstatic_membership = true\n");
        let err = load(&with_file(&f), env(&[])).unwrap_err().to_string();
        assert!(
            err.contains("kafka.static_membership") && err.contains("kafka.instance"),
            "{err}"
        );
        let f = file("[storage]\nbackend = \"kafka\"\n[kafka.producer]\n\"linger.ms\" = [1]\n");
        let err = load(&with_file(&f), env(&[])).unwrap_err().to_string();
        assert!(err.contains("kafka.producer.linger.ms"), "{err}");

        let err = load(
            &Overrides::default(),
            env(&[
                ("UNIMESH_STORAGE_BACKEND", "kafka"),
                ("UNIMESH_KAFKA_BROKERS", " "),
            ]),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("kafka.brokers"), "{err}");
        let err = load(
            &Overrides::default(),
            env(&[("UNIMESH_KAFKA_PROPERTIES", "nonsense")]),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("UNIMESH_KAFKA_PROPERTIES"), "{err}");
    }
}
