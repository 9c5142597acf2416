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
//! How the layers are merged, and how every error names its key and the layer it came from,
//! is `config::load` (on `figment`). Each section checks its own values (`validate` on
//! its type), the bounds "at least 1" by `NonZero` types (`[limits]`, `[server]`, `[push]`,
//! `[storage]`, `[kafka]`, `[mesh]`, `[engine]`, `[dedup]`), refused as the value is read;
//! [`Config::validate`] runs the rest, plus the relations between sections.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroU64, NonZeroUsize};
use std::path::PathBuf;

use serde::{Deserialize, Deserializer, Serialize};
use unimesh_core::{MeshConfig, SubscriptionLimits};

use crate::event::PublishLimits;

pub mod auth;
mod load;
mod storage;
pub use auth::Auth;
pub use load::{env_name, keys, load, Loaded, Overrides, ENV_CONFIG_FILE, ENV_PREFIX};

/// Hard ceiling on one poll: the delivery JSON of a poll is built in memory.
pub const POLL_EVENTS_HARD_MAX: u32 = 100_000;

/// Hard ceiling on a long-poll's wait, so a connection is never parked for hours.
pub const WAIT_MS_HARD_MAX: u64 = 3_600_000;

/// Most threads of the async runtime (`server.worker_threads`).
pub const MAX_WORKER_THREADS: usize = 1_024;

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
    pub max_entries: NonZeroUsize,
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
    pub max_entries: Option<NonZeroUsize>,
}

impl Default for Dedup {
    fn default() -> Self {
        Self {
            window_s: 0,
            max_entries: NonZeroUsize::new(100_000).unwrap_or(NonZeroUsize::MIN),
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
    pub max_request_bytes: NonZeroUsize,
    /// One event (its JSON, or body plus `ce-*` headers in binary mode), in bytes.
    pub max_event_bytes: NonZeroUsize,
    /// Events in one batch publish.
    pub max_batch_events: NonZeroUsize,
    /// Body of every other JSON request (subscription, ACK, admin), in bytes.
    pub max_json_bytes: NonZeroUsize,
    /// Delivery ids in one ACK, NACK or extend request.
    pub max_ids_per_request: NonZeroUsize,
    /// Largest `max` of a long-poll.
    pub max_poll_events: NonZeroU32,
    /// `max` of a long-poll that does not give one.
    pub default_poll_events: NonZeroU32,
    /// Largest `waitMs` of a long-poll.
    pub max_wait_ms: u64,
    /// `waitMs` of a long-poll that does not give one. Not zero by default: right after a
    /// publish the engine may still be fetching the record, and a zero wait would answer an
    /// empty array to a newcomer's first poll.
    pub default_wait_ms: u64,
    /// Largest `max` of a DLQ browse or replay.
    pub max_dlq_page: NonZeroUsize,
    /// `max` of a DLQ browse or replay that does not give one.
    pub default_dlq_page: NonZeroUsize,
    /// Bytes of an oversized body read and thrown away before answering 413, so a client
    /// still writing its body reads the answer instead of a connection reset. Never buffered.
    pub drain_bytes: u64,
    /// A request body must arrive within this time (408 otherwise).
    pub body_read_timeout_ms: NonZeroU64,
    /// Request/reply requests waiting for their replies at once (and timed-out ones
    /// remembered, to count late replies).
    pub max_pending_requests: NonZeroUsize,
}

/// The HTTP servers themselves.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Server {
    /// Open connections per listener; accepting waits at the limit.
    pub max_connections: NonZeroUsize,
    /// After SIGINT/SIGTERM: how long open requests (long-polls included) may take to finish
    /// before their connections are closed and the engine is flushed and stopped.
    pub shutdown_grace_ms: u64,
    /// A client must send its request headers within this time.
    pub header_read_timeout_ms: NonZeroU64,
    /// Open delivery streams (SSE, WebSocket) per traffic listener, counted apart from
    /// `max_connections`: an HTTP/1.1 connection that becomes a stream gives its
    /// connection slot back, so idle streams cannot starve publishers. Over it, 503.
    pub max_streams: NonZeroUsize,
    /// Deliveries queued for one stream at once (its credit); `maxInFlightPerClient` still
    /// bounds what it holds unACKed.
    pub stream_window: NonZeroU32,
    /// A stream with nothing to send sends a heartbeat (an SSE comment, a WebSocket ping)
    /// this often.
    pub stream_heartbeat_ms: NonZeroU64,
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
    /// Threads of the async runtime (HTTP, streams, the engine, webhooks). 0: one less than
    /// the cores the process may use, at least one — the log writer, its WAL syncer and
    /// RocksDB's own threads run beside them, and on two cores a second async worker
    /// costs more in wake-ups between the workers than it adds (README, "How fast").
    pub worker_threads: usize,
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
    pub max_concurrency: NonZeroU32,
    /// A push not answered within this is a NACK (the group's backoff applies).
    pub request_timeout_ms: NonZeroU64,
    /// Where webhooks may push. Empty: public addresses only (loopback, link-local such as
    /// the cloud metadata service at 169.254.169.254, private, shared, unspecified and
    /// multicast addresses are refused). Otherwise exactly what it lists, comma-separated:
    /// host names, IP addresses or CIDR blocks (`hooks.internal,10.0.0.7,fd00::/8,::1`).
    /// The mesh's own listeners never. Checked at `PUT` (IP literals, listed names) and
    /// after DNS resolution at every push (the connection goes to the checked address).
    pub allowed_hosts: String,
    /// How often the pushers are matched to the subscriptions: a `push.url` written through
    /// this mesh's API starts pushing at once, one another instance wrote within this.
    pub scan_interval_ms: NonZeroU64,
}

impl Default for Push {
    fn default() -> Self {
        Self {
            max_concurrency: nonzero(16u32),
            request_timeout_ms: nonzero(10_000u64),
            allowed_hosts: String::new(),
            scan_interval_ms: nonzero(500u64),
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
    pub max_partitions: NonZeroU32,
    /// Most topics.
    pub max_topics: NonZeroUsize,
    /// Largest stored record, in bytes. The stored form of an event can be up to a third
    /// larger than what was published (binary data kept as base64), so this must leave that
    /// room above `limits.max_event_bytes`.
    pub max_record_bytes: usize,
    /// Payload bytes gathered into one synced write.
    pub max_batch_bytes: usize,
    /// Appends waiting for the log writer; publishers wait beyond it (back-pressure).
    pub queue_capacity: NonZeroUsize,
    /// Records older than this are deleted; 0 keeps them forever.
    pub retention_ms: u64,
    /// A partition's oldest records are deleted while it holds more; 0 means no size limit.
    pub retention_bytes_per_partition: u64,
    /// How often retention is enforced.
    pub retention_check_ms: NonZeroU64,
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
    pub replication: NonZeroU32,
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
    /// take before it fails; at most 300000 (librdkafka's `socket.timeout.ms`, set from it).
    pub request_timeout_ms: NonZeroU64,
    /// Static group membership (KIP-345): every consumer of this instance joins its group
    /// with `group.instance.id` = `<kafka.instance>-<group>`, so a restart within the
    /// session timeout gets its partitions back without a rebalance. Needs a stable, unique
    /// `kafka.instance`.
    pub static_membership: bool,
    /// librdkafka properties passed through to every client (`"linger.ms" = "5"`); env
    /// `UNIMESH_KAFKA_PROPERTIES="linger.ms=5,socket.timeout.ms=3000"` (laid over the file's,
    /// property by property). They cannot turn off
    /// what the contract needs (`acks`, idempotence, auto-commit).
    #[serde(deserialize_with = "property_table")]
    pub properties: BTreeMap<String, String>,
    /// librdkafka properties for the producer (and the admin client) only, laid over
    /// `properties` (env `UNIMESH_KAFKA_PRODUCER`).
    #[serde(deserialize_with = "property_table")]
    pub producer: BTreeMap<String, String>,
    /// librdkafka properties for the consumers only (`session.timeout.ms`, ...), laid over
    /// `properties` (env `UNIMESH_KAFKA_CONSUMER`).
    #[serde(deserialize_with = "property_table")]
    pub consumer: BTreeMap<String, String>,
}

impl Default for Kafka {
    fn default() -> Self {
        Self {
            brokers: "127.0.0.1:9092".to_owned(),
            instance: String::new(),
            replication: NonZeroU32::MIN,
            progress_topic: "unimesh.progress".to_owned(),
            subscriptions_topic: "unimesh.subscriptions".to_owned(),
            group_prefix: "unimesh.".to_owned(),
            max_progress_ranges: 1_000,
            request_timeout_ms: nonzero(10_000u64),
            static_membership: false,
            properties: BTreeMap::new(),
            producer: BTreeMap::new(),
            consumer: BTreeMap::new(),
        }
    }
}

/// A librdkafka properties table: every value a string, an integer or a boolean (the file
/// may write `"linger.ms" = 5`), kept as its text.
fn property_table<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    struct Text(String);
    impl<'de> Deserialize<'de> for Text {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct Visit;
            impl serde::de::Visitor<'_> for Visit {
                type Value = Text;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("a string, an integer or a boolean")
                }
                fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Text, E> {
                    Ok(Text(v.to_owned()))
                }
                fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Text, E> {
                    Ok(Text(v.to_string()))
                }
                fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Text, E> {
                    Ok(Text(v.to_string()))
                }
                fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<Text, E> {
                    Ok(Text(v.to_string()))
                }
            }
            d.deserialize_any(Visit)
        }
    }
    let table = BTreeMap::<String, Text>::deserialize(d)?;
    Ok(table.into_iter().map(|(k, Text(v))| (k, v)).collect())
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
    pub fetch_max_bytes: NonZeroUsize,
    /// Requests queued for the engine task before callers wait (back-pressure).
    pub command_capacity: NonZeroUsize,
    /// Most per-topic rate-limit rules.
    pub max_rate_rules: NonZeroUsize,
}

/// The core's knobs ([`MeshConfig`]), with the per-subscription limits flattened in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mesh {
    /// Most subscription groups at once.
    pub max_groups: NonZeroUsize,
    /// Most clients attached to one group at once.
    pub max_clients_per_group: NonZeroUsize,
    /// Most partitions one group may be assigned.
    pub max_partitions_per_group: NonZeroUsize,
    /// Most records of one group × partition held in memory and not done (fetched, in
    /// flight, waiting for redelivery); fetching pauses at it.
    pub max_window_per_lane: NonZeroUsize,
    /// Most ACK ranges above the watermark of one group × partition; fetching pauses at it
    /// (nothing is dropped).
    pub max_ack_ranges_per_lane: NonZeroUsize,
    /// Most records asked for by one fetch from the log.
    pub fetch_batch: NonZeroUsize,
    /// How long a failed fetch waits before it is retried.
    pub fetch_retry_ms: u64,
    /// ACKs, attempt counts and dead letters are made durable together once per interval.
    pub flush_interval_ms: NonZeroU64,
    /// Most progress writes in flight to the state store at once.
    pub max_outstanding_persists: NonZeroUsize,
    /// A client with no poll waiting, nothing in flight and no activity for this long is
    /// removed.
    pub client_idle_timeout_ms: u64,
    /// Most DLQ records replayed into one group at once.
    pub max_replay_per_group: NonZeroUsize,
    /// Largest `ackTimeoutMs` a subscription may ask for.
    pub max_ack_timeout_ms: NonZeroU64,
    /// Largest `maxAttempts` a subscription may ask for.
    pub max_attempts: NonZeroU32,
    /// Largest `maxInFlightPerClient` a subscription may ask for.
    pub max_in_flight_per_client: NonZeroU32,
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
            max_request_bytes: nonzero(publish.max_request_bytes),
            max_event_bytes: nonzero(publish.max_event_bytes),
            max_batch_events: nonzero(publish.max_batch_events),
            max_json_bytes: nonzero(1usize << 20),
            max_ids_per_request: nonzero(1_000usize),
            max_poll_events: nonzero(1_000u32),
            default_poll_events: nonzero(10u32),
            max_wait_ms: 60_000,
            default_wait_ms: 1_000,
            max_dlq_page: nonzero(1_000usize),
            default_dlq_page: nonzero(100usize),
            drain_bytes: 64 << 20,
            body_read_timeout_ms: nonzero(60_000u64),
            max_pending_requests: nonzero(10_000usize),
        }
    }
}

impl Default for Server {
    fn default() -> Self {
        Self {
            max_connections: nonzero(10_000usize),
            shutdown_grace_ms: 10_000,
            header_read_timeout_ms: nonzero(30_000u64),
            max_streams: nonzero(1_000usize),
            stream_window: nonzero(256u32),
            stream_heartbeat_ms: nonzero(15_000u64),
            stream_retry_ms: 1_000,
            console_interval_ms: 500,
            cors_allowed_origins: String::new(),
            insecure: false,
            worker_threads: 0,
            tls: Tls::default(),
        }
    }
}

impl Default for Storage {
    fn default() -> Self {
        Self {
            backend: StorageBackend::Embedded,
            default_partitions: 4,
            max_partitions: nonzero(1_024u32),
            max_topics: nonzero(10_000usize),
            max_record_bytes: 2 << 20,
            max_batch_bytes: 16 << 20,
            queue_capacity: nonzero(1_024usize),
            retention_ms: 0,
            retention_bytes_per_partition: 0,
            retention_check_ms: nonzero(60_000u64),
            retention_reclaim_bytes: 64 << 20,
            sync: SyncMode::Always,
            sync_interval_ms: 100,
            read_cache_bytes: crate::storage::log::DEFAULT_READ_CACHE_BYTES,
        }
    }
}

impl From<&crate::engine::EngineConfig> for Engine {
    fn from(c: &crate::engine::EngineConfig) -> Self {
        Self {
            fetch_wait_ms: c.fetch_wait_ms,
            fetch_max_bytes: nonzero(c.fetch_max_bytes),
            command_capacity: nonzero(c.command_capacity),
            max_rate_rules: nonzero(c.max_rate_rules),
        }
    }
}

impl From<&MeshConfig> for Mesh {
    fn from(c: &MeshConfig) -> Self {
        Self {
            max_groups: nonzero(c.max_groups),
            max_clients_per_group: nonzero(c.max_clients_per_group),
            max_partitions_per_group: nonzero(c.max_partitions_per_group),
            max_window_per_lane: nonzero(c.max_window_per_lane),
            max_ack_ranges_per_lane: nonzero(c.max_ack_ranges_per_lane),
            fetch_batch: nonzero(c.fetch_batch),
            fetch_retry_ms: c.fetch_retry_ms,
            flush_interval_ms: nonzero(c.flush_interval_ms),
            max_outstanding_persists: nonzero(c.max_outstanding_persists),
            client_idle_timeout_ms: c.client_idle_timeout_ms,
            max_replay_per_group: nonzero(c.max_replay_per_group),
            max_ack_timeout_ms: nonzero(c.limits.max_ack_timeout_ms),
            max_attempts: nonzero(c.limits.max_attempts),
            max_in_flight_per_client: nonzero(c.limits.max_in_flight_per_client),
            max_backoff_ms: c.limits.max_backoff_ms,
        }
    }
}

/// A default of the core's or the engine's (never zero; `defaults_round_trip_and_match_the_design`
/// checks that the defaults survive this unchanged), as its `NonZero` type.
fn nonzero<T: TryInto<N> + Copy, N: NonZeroMin>(v: T) -> N {
    v.try_into().unwrap_or(N::MIN)
}

/// The smallest value of a `NonZero` type, the fallback of [`nonzero`].
trait NonZeroMin {
    const MIN: Self;
}

impl NonZeroMin for NonZeroUsize {
    const MIN: Self = NonZeroUsize::MIN;
}

impl NonZeroMin for NonZeroU64 {
    const MIN: Self = NonZeroU64::MIN;
}

impl NonZeroMin for NonZeroU32 {
    const MIN: Self = NonZeroU32::MIN;
}

impl Config {
    /// The core's configuration. `commit_to_broker` is the storage backend's business
    /// (the embedded log keeps no group offsets), not a user setting.
    pub fn mesh_config(&self) -> MeshConfig {
        let m = &self.mesh;
        MeshConfig {
            max_groups: m.max_groups.get(),
            max_clients_per_group: m.max_clients_per_group.get(),
            max_partitions_per_group: m.max_partitions_per_group.get(),
            max_window_per_lane: m.max_window_per_lane.get(),
            max_ack_ranges_per_lane: m.max_ack_ranges_per_lane.get(),
            fetch_batch: m.fetch_batch.get(),
            fetch_retry_ms: m.fetch_retry_ms,
            flush_interval_ms: m.flush_interval_ms.get(),
            max_outstanding_persists: m.max_outstanding_persists.get(),
            client_idle_timeout_ms: m.client_idle_timeout_ms,
            max_replay_per_group: m.max_replay_per_group.get(),
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
            fetch_max_bytes: self.engine.fetch_max_bytes.get(),
            command_capacity: self.engine.command_capacity.get(),
            max_rate_rules: self.engine.max_rate_rules.get(),
            retention_interval_ms: if retains {
                s.retention_check_ms.get()
            } else {
                0
            },
            dedup: self.dedup_config(),
        }
    }

    /// The publish dedup windows. Call after [`Config::validate`] (names and bounds are
    /// checked there; a topic name that is not one is left out here).
    pub fn dedup_config(&self) -> crate::engine::dedup::DedupConfig {
        use crate::engine::dedup::{DedupConfig, WindowRule};
        let d = &self.dedup;
        let rule = |window_s: u64, max_entries: NonZeroUsize| {
            (window_s > 0).then_some(WindowRule {
                window_ms: window_s.saturating_mul(1_000),
                max_entries: max_entries.get(),
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
            max_ack_timeout_ms: self.mesh.max_ack_timeout_ms.get(),
            max_attempts: self.mesh.max_attempts.get(),
            max_in_flight_per_client: self.mesh.max_in_flight_per_client.get(),
            max_backoff_ms: self.mesh.max_backoff_ms,
        }
    }

    pub fn publish_limits(&self) -> PublishLimits {
        PublishLimits {
            max_event_bytes: self.limits.max_event_bytes.get(),
            max_request_bytes: self.limits.max_request_bytes.get(),
            max_batch_events: self.limits.max_batch_events.get(),
        }
    }

    /// The embedded log's configuration, rooted at `data/log`.
    pub fn log_config(&self) -> crate::storage::log::LogConfig {
        let s = &self.storage;
        let mut c = crate::storage::log::LogConfig::new(self.log_dir());
        c.default_partitions = s.default_partitions;
        c.max_partitions = s.max_partitions.get();
        c.max_topics = s.max_topics.get();
        c.max_record_bytes = s.max_record_bytes;
        c.max_records_per_append = self.limits.max_batch_events.get();
        c.max_batch_bytes = s.max_batch_bytes;
        c.queue_capacity = s.queue_capacity.get();
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

    /// Checks every section (each by its own `validate`) and the relations between them.
    /// The error names the key; `load` adds where its value came from.
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.http == self.admin && self.http.port() != 0 {
            return refuse(
                "admin",
                format!("{} is also the traffic address (http)", self.admin),
            );
        }
        if self.data.as_os_str().is_empty() {
            return refuse("data", "must not be empty");
        }
        if let Err(e) = tracing_subscriber::EnvFilter::builder().parse(&self.log) {
            return refuse("log", format!("is not a log filter: {e}"));
        }
        self.limits.validate()?;
        self.server.validate()?;
        self.push.validate()?;
        self.auth
            .validate()
            .map_err(|(key, why)| Invalid { key, why })?;
        self.storage.validate(&self.limits)?;
        self.dedup.validate()?;
        self.otel.validate()?;
        if self.storage.backend == StorageBackend::Kafka {
            self.kafka.validate()?;
        }
        Ok(())
    }
}

impl Limits {
    /// `[limits]`: every default within its maximum, every maximum within its hard ceiling
    /// (each bound is at least 1 by its type).
    pub fn validate(&self) -> Result<(), Invalid> {
        let l = self;
        if l.max_event_bytes > l.max_request_bytes {
            return refuse(
                "limits.max_event_bytes",
                "must not exceed limits.max_request_bytes",
            );
        }
        if l.max_poll_events.get() > POLL_EVENTS_HARD_MAX {
            return refuse(
                "limits.max_poll_events",
                format!("must be at most {POLL_EVENTS_HARD_MAX}"),
            );
        }
        if l.default_poll_events > l.max_poll_events {
            return refuse(
                "limits.default_poll_events",
                "must not exceed limits.max_poll_events",
            );
        }
        if l.max_wait_ms > WAIT_MS_HARD_MAX {
            return refuse(
                "limits.max_wait_ms",
                format!("must be at most {WAIT_MS_HARD_MAX}"),
            );
        }
        if l.default_wait_ms > l.max_wait_ms {
            return refuse(
                "limits.default_wait_ms",
                "must not exceed limits.max_wait_ms",
            );
        }
        if l.default_dlq_page > l.max_dlq_page {
            return refuse(
                "limits.default_dlq_page",
                "must not exceed limits.max_dlq_page",
            );
        }
        Ok(())
    }
}

impl Server {
    /// The async runtime's worker threads: `worker_threads`, or with 0 one less than
    /// `cores` (at least one).
    pub fn workers(&self, cores: usize) -> usize {
        match self.worker_threads {
            0 => cores.saturating_sub(1).max(1),
            n => n,
        }
    }

    /// `[server]` and `[server.tls]`.
    pub fn validate(&self) -> Result<(), Invalid> {
        if !(MIN_CONSOLE_INTERVAL_MS..=MAX_CONSOLE_INTERVAL_MS).contains(&self.console_interval_ms)
        {
            return refuse(
                "server.console_interval_ms",
                format!("must be between {MIN_CONSOLE_INTERVAL_MS} and {MAX_CONSOLE_INTERVAL_MS}"),
            );
        }
        if let Err(why) = crate::policy::Origins::parse(&self.cors_allowed_origins) {
            return refuse("server.cors_allowed_origins", why);
        }
        if self.worker_threads > MAX_WORKER_THREADS {
            return refuse(
                "server.worker_threads",
                format!("must be at most {MAX_WORKER_THREADS} (0: one less than the cores)"),
            );
        }
        let tls = &self.tls;
        let set = |p: &PathBuf| !p.as_os_str().is_empty();
        if set(&tls.cert) != set(&tls.key) {
            let (key, other) = if set(&tls.cert) {
                ("server.tls.key", "server.tls.cert")
            } else {
                ("server.tls.cert", "server.tls.key")
            };
            return refuse(key, format!("must be set together with {other}"));
        }
        if set(&tls.client_ca) && !tls.enabled() {
            return refuse(
                "server.tls.client_ca",
                "needs server.tls.cert and server.tls.key (client certificates come with TLS)",
            );
        }
        Ok(())
    }
}

impl Push {
    /// `[push]`.
    pub fn validate(&self) -> Result<(), Invalid> {
        if let Err(why) = crate::policy::TargetPolicy::parse(&self.allowed_hosts) {
            return refuse("push.allowed_hosts", why);
        }
        Ok(())
    }
}

impl Storage {
    /// `[storage]`; a record must hold the stored form of an event of `limits`.
    pub fn validate(&self, limits: &Limits) -> Result<(), Invalid> {
        let s = self;
        if s.default_partitions == 0 || s.default_partitions > s.max_partitions.get() {
            return refuse(
                "storage.default_partitions",
                format!(
                    "must be between 1 and storage.max_partitions ({})",
                    s.max_partitions
                ),
            );
        }
        // Base64 grows binary data by 4/3; the rest of the stored JSON (attributes) is
        // bounded by the event size already, plus a little for the stored framing.
        let event = limits.max_event_bytes.get();
        let room = event.saturating_add(event / 3).saturating_add(4096);
        if s.max_record_bytes < room {
            return refuse(
                "storage.max_record_bytes",
                format!(
                    "must be at least {room} to hold the stored form of an event of \
                     limits.max_event_bytes ({})",
                    limits.max_event_bytes
                ),
            );
        }
        if s.max_batch_bytes < s.max_record_bytes {
            return refuse(
                "storage.max_batch_bytes",
                "must be at least storage.max_record_bytes",
            );
        }
        if s.sync_interval_ms == 0 || s.sync_interval_ms > crate::storage::log::MAX_SYNC_INTERVAL_MS
        {
            return refuse(
                "storage.sync_interval_ms",
                format!(
                    "must be between 1 and {} (the loss window on a machine crash)",
                    crate::storage::log::MAX_SYNC_INTERVAL_MS
                ),
            );
        }
        if s.read_cache_bytes as u64 > crate::storage::log::MAX_READ_CACHE_BYTES {
            return refuse(
                "storage.read_cache_bytes",
                format!(
                    "must be at most {}",
                    crate::storage::log::MAX_READ_CACHE_BYTES
                ),
            );
        }
        Ok(())
    }
}

/// The most `kafka.request_timeout_ms` may be: librdkafka's bound on `socket.timeout.ms`.
pub const MAX_KAFKA_REQUEST_TIMEOUT_MS: u64 = 300_000;

impl Kafka {
    /// `[kafka]`, checked when `storage.backend = "kafka"`.
    pub fn validate(&self) -> Result<(), Invalid> {
        let k = self;
        if k.brokers.split(',').all(|b| b.trim().is_empty()) {
            return refuse("kafka.brokers", "must name at least one HOST:PORT");
        }
        for (key, topic) in [
            ("kafka.progress_topic", &k.progress_topic),
            ("kafka.subscriptions_topic", &k.subscriptions_topic),
        ] {
            if let Err(e) = unimesh_core::TopicName::new(topic) {
                return refuse(key, format!("is not a topic name: {e}"));
            }
        }
        if k.progress_topic == k.subscriptions_topic {
            return refuse(
                "kafka.subscriptions_topic",
                "must differ from kafka.progress_topic",
            );
        }
        // It is librdkafka's `socket.timeout.ms` too, which takes at most 5 minutes (an
        // instance started with more failed at its first client, naming that property).
        if k.request_timeout_ms.get() > MAX_KAFKA_REQUEST_TIMEOUT_MS {
            return refuse(
                "kafka.request_timeout_ms",
                format!(
                    "is {}: must be between 1 and {MAX_KAFKA_REQUEST_TIMEOUT_MS} (librdkafka's \
                     socket.timeout.ms, which it sets, takes no more)",
                    k.request_timeout_ms
                ),
            );
        }
        crate::storage::kafka::check_properties(
            &storage::property_tables(k),
            k.static_membership,
            &k.instance,
        )
        .map_err(|(key, why)| Invalid { key, why })
    }
}

impl Otel {
    /// `[otel]`: an `http://` or `https://` URL when set, and a service name.
    pub fn validate(&self) -> Result<(), Invalid> {
        if !self.endpoint.is_empty() {
            match url::Url::parse(&self.endpoint) {
                Ok(u) if matches!(u.scheme(), "http" | "https") => {}
                Ok(u) => {
                    return refuse(
                        "otel.endpoint",
                        format!("scheme {} is not http or https", u.scheme()),
                    )
                }
                Err(e) => return refuse("otel.endpoint", format!("is not a URL: {e}")),
            }
        }
        if self.service_name.trim().is_empty() {
            return refuse("otel.service_name", "must not be empty");
        }
        Ok(())
    }
}

impl Dedup {
    /// `[dedup]`: every window in range, every entry bound at most `MAX_ENTRIES` (at least 1
    /// by its type), every topic a topic name.
    pub fn validate(&self) -> Result<(), Invalid> {
        use crate::engine::dedup::{MAX_ENTRIES, MAX_WINDOW_MS};
        let max_window_s = MAX_WINDOW_MS / 1_000;
        let window = |key: &str, v: u64| {
            if v > max_window_s {
                return refuse(
                    key,
                    format!("is {v}: must be between 0 (off) and {max_window_s} seconds (a week)"),
                );
            }
            Ok(())
        };
        let entries = |key: &str, v: NonZeroUsize| {
            if v.get() > MAX_ENTRIES {
                return refuse(key, format!("is {v}: must be between 1 and {MAX_ENTRIES}"));
            }
            Ok(())
        };
        window("dedup.window_s", self.window_s)?;
        entries("dedup.max_entries", self.max_entries)?;
        for (name, t) in &self.topics {
            let key = |k: &str| format!("{DEDUP_TOPICS_KEY}.{name}{k}");
            if let Err(e) = unimesh_core::TopicName::new(name) {
                return refuse(&key(""), format!("is not a topic name: {e}"));
            }
            if let Some(v) = t.window_s {
                window(&key(".window_s"), v)?;
            }
            if let Some(v) = t.max_entries {
                entries(&key(".max_entries"), v)?;
            }
        }
        Ok(())
    }
}

/// Why the configuration could not be built: one line naming the key (or the file, or the
/// variable) and where the refused value came from (`config file PATH`, `environment
/// variable NAME`, `flag --NAME` or `default`).
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
    #[error("unknown key `{key}` in {origin}{hint}")]
    UnknownKey {
        key: String,
        origin: String,
        hint: String,
    },
    #[error(
        "unknown environment variable {name}: UNIMESH_* variables are configuration keys \
         (UNIMESH_ + the dotted key in upper case, _ for .; --print-config lists them){hint}"
    )]
    UnknownEnv { name: String, hint: String },
    #[error("`{key}` in {origin} must be {expected}, not {found}")]
    WrongType {
        origin: String,
        key: String,
        expected: String,
        found: String,
    },
    #[error("{key} ({origin}): {why}")]
    Invalid {
        key: String,
        origin: String,
        why: String,
    },
}

/// A value refused by its section's check: the dotted key and why (the loader adds where
/// the value came from).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    pub key: String,
    pub why: String,
}

impl Invalid {
    pub fn new(key: &str, why: impl Into<String>) -> Self {
        Self {
            key: key.to_owned(),
            why: why.into(),
        }
    }
}

/// `Err` of a refused `key`.
fn refuse(key: &str, why: impl Into<String>) -> Result<(), Invalid> {
    Err(Invalid::new(key, why))
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

    /// The error of a load that must fail, as the user reads it.
    fn refused(o: &Overrides, pairs: &[(&str, &str)]) -> String {
        load(o, env(pairs)).expect_err("refused").to_string()
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
        let example: toml::Table = toml::from_str(EXAMPLE).expect("the example is TOML");
        let defaults = toml::Table::try_from(Config::default()).expect("defaults serialise");
        assert_eq!(example, defaults);
        let f = file(EXAMPLE);
        let loaded = load(&with_file(&f), env(&[])).expect("the example loads");
        assert_eq!(loaded.config, Config::default());
    }

    #[test]
    fn defaults_round_trip_and_match_the_design() {
        let text = toml::to_string(&Config::default()).expect("defaults serialise");
        assert_eq!(
            toml::from_str::<Config>(&text).expect("defaults deserialise"),
            Config::default()
        );
        assert_eq!(
            Engine::from(&crate::engine::EngineConfig::default()),
            Config::default().engine
        );
        let e = Config::default().engine_config();
        let d = crate::engine::EngineConfig::default();
        assert_eq!(
            (e.fetch_max_bytes, e.command_capacity, e.max_rate_rules),
            (d.fetch_max_bytes, d.command_capacity, d.max_rate_rules),
            "the engine's defaults pass through NonZero unchanged"
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
        assert_eq!(c.limits.max_poll_events.get(), 1000);
        assert_eq!(c.limits.max_wait_ms, 60_000);
        assert_eq!(c.mesh_config(), MeshConfig::default());
    }

    /// Goal: the async runtime's size is the documented rule, and a number the machine
    /// cannot mean is refused by name. Method: `workers` at 1, 2 and 8 cores with 0 and 3;
    /// an environment variable sets it; 5,000 is refused.
    #[test]
    fn worker_threads_default_to_one_less_than_the_cores() {
        let auto = Server::default();
        assert_eq!(
            (auto.workers(1), auto.workers(2), auto.workers(8)),
            (1, 1, 7)
        );
        let three = Server {
            worker_threads: 3,
            ..Server::default()
        };
        assert_eq!((three.workers(1), three.workers(8)), (3, 3));
        let c = load(
            &Overrides::default(),
            env(&[("UNIMESH_SERVER_WORKER_THREADS", "2")]),
        )
        .expect("loads")
        .config;
        assert_eq!(c.server.workers(8), 2);
        let err = refused(
            &Overrides::default(),
            &[("UNIMESH_SERVER_WORKER_THREADS", "5000")],
        );
        assert!(err.contains("server.worker_threads"), "{err}");
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
        // Beyond what librdkafka takes for the socket timeout it sets from it.
        let err = refused(
            &Overrides::default(),
            &[
                ("UNIMESH_STORAGE_BACKEND", "kafka"),
                ("UNIMESH_KAFKA_REQUEST_TIMEOUT_MS", "300001"),
            ],
        );
        assert!(
            err.starts_with("kafka.request_timeout_ms (environment variable UNIMESH_KAFKA_REQUEST_TIMEOUT_MS): is 300001: must be between 1 and 300000"),
            "{err}"
        );
        let ok = load(
            &Overrides::default(),
            env(&[
                ("UNIMESH_STORAGE_BACKEND", "kafka"),
                ("UNIMESH_KAFKA_REQUEST_TIMEOUT_MS", "300000"),
            ]),
        );
        assert!(ok.is_ok(), "the bound itself is taken");
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
        assert_eq!(c.local_store().dir(), None);
        assert_eq!(c.limits.max_poll_events.get(), 50);
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

    /// Goal: a misspelt `UNIMESH_*` variable stops the load naming it (it used to be a
    /// warning, easy to miss while the setting silently kept its default); the project's
    /// own variables and other programs' are not refused. Method: load with each.
    #[test]
    fn unknown_env_is_refused_naming_the_variable() {
        let err = load(
            &Overrides::default(),
            env(&[("UNIMESH_HTPP", "127.0.0.1:9000"), ("PATH", "/bin")]),
        )
        .expect_err("an unknown variable is refused");
        assert!(matches!(err, ConfigError::UnknownEnv { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("UNIMESH_HTPP"), "{text}");
        assert!(text.contains("did you mean UNIMESH_HTTP?"), "{text}");
        let err = load(
            &Overrides::default(),
            env(&[("UNIMESH_LIMITS_MAX_WAIT", "5")]),
        )
        .expect_err("refused")
        .to_string();
        assert!(
            err.contains("did you mean UNIMESH_LIMITS_MAX_WAIT_MS?"),
            "{err}"
        );
        let loaded = load(
            &Overrides::default(),
            env(&[
                ("UNIMESH_SEED", "7"),
                ("UNIMESH_TANSU", "/usr/bin/tansu"),
                ("UNIMESH_TEST_LOGS", "1"),
                ("PATH", "/bin"),
            ]),
        )
        .expect("the project's own variables are not configuration");
        assert_eq!(loaded.config, Config::default());
    }

    /// Goal: a bound that means "at least 1" is a `NonZero` type in every section, so a 0
    /// is refused while the value is read, in one line naming the key and its source (and
    /// in `[kafka]` whichever the backend). Method: a 0 for one such key of each section.
    #[test]
    fn a_zero_where_at_least_1_is_needed_is_refused_in_every_section() {
        for key in [
            "limits.max_request_bytes",
            "limits.max_event_bytes",
            "limits.max_batch_events",
            "limits.max_json_bytes",
            "limits.max_ids_per_request",
            "limits.max_poll_events",
            "limits.default_poll_events",
            "limits.max_dlq_page",
            "limits.default_dlq_page",
            "limits.body_read_timeout_ms",
            "limits.max_pending_requests",
            "server.max_connections",
            "server.header_read_timeout_ms",
            "server.max_streams",
            "server.stream_window",
            "server.stream_heartbeat_ms",
            "push.max_concurrency",
            "push.request_timeout_ms",
            "push.scan_interval_ms",
            "storage.max_partitions",
            "storage.max_topics",
            "storage.queue_capacity",
            "storage.retention_check_ms",
            "kafka.replication",
            "kafka.request_timeout_ms",
        ] {
            let var = env_name(key);
            assert_eq!(
                refused(&Overrides::default(), &[(var.as_str(), "0")]),
                format!("{key} (environment variable {var}): is 0: must be at least 1"),
            );
        }
    }

    /// Goal: every refusal names the key and the layer its value came from: the file's
    /// path, the variable, the flag, or the default. Method: the same kinds of mistake
    /// (unknown key, wrong type, zero where at least 1 is needed, a relation broken) from
    /// each layer.
    #[test]
    fn every_error_names_the_key_and_its_source() {
        let f = file("[mesh]\nmax_groups = 0\n");
        let path = f.path().display().to_string();
        let err = load(&with_file(&f), env(&[])).expect_err("refused");
        match &err {
            ConfigError::Invalid { key, origin, why } => {
                assert_eq!(key, "mesh.max_groups");
                assert_eq!(origin, &format!("config file {path}"));
                assert_eq!(why, "is 0: must be at least 1");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            err.to_string(),
            format!("mesh.max_groups (config file {path}): is 0: must be at least 1")
        );
        let err = refused(
            &Overrides::default(),
            &[("UNIMESH_ENGINE_COMMAND_CAPACITY", "0")],
        );
        assert_eq!(
            err,
            "engine.command_capacity (environment variable UNIMESH_ENGINE_COMMAND_CAPACITY): \
             is 0: must be at least 1"
        );
        let err = refused(
            &Overrides::default(),
            &[("UNIMESH_LIMITS_MAX_POLL_EVENTS", "0")],
        );
        assert_eq!(
            err,
            "limits.max_poll_events (environment variable UNIMESH_LIMITS_MAX_POLL_EVENTS): \
             is 0: must be at least 1"
        );
        // A relation: the value named is the one refused, and the default is a source too.
        let err = refused(
            &Overrides {
                http: Some("127.0.0.1:8081".into()),
                ..Overrides::default()
            },
            &[],
        );
        assert_eq!(
            err,
            "admin (default): 127.0.0.1:8081 is also the traffic address (http)"
        );
        let err = refused(
            &Overrides {
                storage: Some("rocks".into()),
                ..Overrides::default()
            },
            &[],
        );
        assert_eq!(
            err,
            "storage.backend (flag --storage): is \"rocks\": must be one of embedded, kafka"
        );
        let f = file("[server]\nstream_windo = 5\n");
        let err = refused(&with_file(&f), &[]);
        assert!(
            err.starts_with(&format!(
                "unknown key `server.stream_windo` in config file {} (did you mean stream_window?)",
                f.path().display()
            )),
            "{err}"
        );
        let f = file("[server]\ninsecure = \"yes\"\n");
        let err = refused(&with_file(&f), &[]);
        assert_eq!(
            err,
            format!(
                "`server.insecure` in config file {} must be a boolean (true or false), not \
                 the string \"yes\"",
                f.path().display()
            )
        );
        let err = refused(&Overrides::default(), &[("UNIMESH_SERVER_INSECURE", "yes")]);
        assert_eq!(
            err,
            "`server.insecure` in environment variable UNIMESH_SERVER_INSECURE must be true or \
             false, not \"yes\""
        );
        // A property name holding dots is named whole, with the variable that set it.
        let err = refused(
            &Overrides::default(),
            &[
                ("UNIMESH_STORAGE_BACKEND", "kafka"),
                ("UNIMESH_KAFKA_CONSUMER", "enable.auto.commit=true"),
            ],
        );
        assert!(
            err.starts_with(
                "kafka.consumer.enable.auto.commit (environment variable UNIMESH_KAFKA_CONSUMER):"
            ),
            "{err}"
        );
        let f = file("[mesh]\nmax_attempts = 99999999999\n");
        let err = refused(&with_file(&f), &[]);
        assert!(
            err.ends_with("is 99999999999: must be at most 4294967295"),
            "{err}"
        );
        for text in ["[dedup]\nmax_entries = 0\n", "[mesh]\nmax_attempts = 0\n"] {
            let f = file(text);
            let err = load(&with_file(&f), env(&[])).expect_err(text).to_string();
            assert!(err.contains(&f.path().display().to_string()), "{err}");
        }
    }

    /// Goal: a key set in all three layers takes the flag's value, one set in the file and
    /// the environment the environment's, for every kind of value (address, path, number,
    /// enum, boolean, a Kafka property). Method: one load with all layers.
    #[test]
    fn each_layer_overrides_the_one_below_key_by_key() {
        let f = file(
            "http = \"127.0.0.1:1001\"\n[storage]\nbackend = \"embedded\"\nmax_topics = 5\n\
             [server]\ninsecure = false\nstream_window = 7\n\
             [kafka.properties]\n\"linger.ms\" = 1\n\"client.rack\" = \"r1\"\n",
        );
        let e = env(&[
            ("UNIMESH_HTTP", "127.0.0.1:2001"),
            ("UNIMESH_STORAGE_BACKEND", "kafka"),
            ("UNIMESH_STORAGE_MAX_TOPICS", "6"),
            ("UNIMESH_SERVER_INSECURE", "1"),
            ("UNIMESH_KAFKA_PROPERTIES", "linger.ms=2"),
        ]);
        let o = Overrides {
            http: Some("127.0.0.1:3001".into()),
            storage: Some("embedded".into()),
            ..with_file(&f)
        };
        let c = load(&o, e).expect("loads").config;
        assert_eq!(
            c.http.to_string(),
            "127.0.0.1:3001",
            "flag over env over file"
        );
        assert_eq!(c.storage.backend, StorageBackend::Embedded, "flag over env");
        assert_eq!(c.storage.max_topics.get(), 6, "env over file");
        assert!(c.server.insecure, "env over file");
        assert_eq!(c.server.stream_window.get(), 7, "file over default");
        assert_eq!(c.server.max_streams.get(), 1_000, "default");
        assert_eq!(
            c.kafka.properties["linger.ms"], "2",
            "env over file, per property"
        );
        assert_eq!(
            c.kafka.properties["client.rack"], "r1",
            "the file's others kept"
        );
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
                Err(ConfigError::Invalid { key: k, why, .. }) => {
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
                Err(ConfigError::Invalid { key: k, why: w, .. }) => {
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
