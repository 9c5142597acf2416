//! Where events and state are kept, behind the seam the engine sees (`ports`): the
//! embedded log (`log/`), the state stores (`state/`), a log in memory (`memory/`) and
//! Kafka (`kafka/`), each in a folder of its own.

pub mod kafka;
pub mod log;
pub mod memory;
pub mod ports;
mod records;
pub mod state;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use madsim_tokio as tokio;

use kafka::{KafkaLog, KafkaSettings, KafkaState};
#[cfg(feature = "rocksdb")]
use log::EmbeddedLog;
use log::LogConfig;
use ports::{LogPort, StatePort, StorageError};
pub(crate) use records::decode_record;
#[cfg(feature = "rocksdb")]
use state::RocksStore;
#[cfg(feature = "sled")]
use state::SledStore;
use state::{MemoryDisk, MemoryStore, StateStore, StoreAdapter};

/// Runs blocking storage work (RocksDB, sled) off the async workers. Under the madsim
/// simulator, where every port is in memory and nothing blocks, it is an ordinary task
/// (madsim has no blocking pool, and its `spawn_blocking` is deprecated for that reason).
pub(crate) fn spawn_blocking<F, R>(f: F) -> tokio::task::JoinHandle<R>
where
    F: FnOnce() -> R + Send + 'static,
    R: Send + 'static,
{
    #[cfg(madsim)]
    {
        tokio::spawn(async move { f() })
    }
    #[cfg(not(madsim))]
    {
        tokio::task::spawn_blocking(f)
    }
}

/// The log and state ports the engine runs on.
pub type Ports = (Arc<dyn LogPort>, Arc<dyn StatePort>);

/// Where storage is (a configuration section in: `Config::storage_backend` builds it):
/// the one factory of the engine's ports, used by `serve` and by the madsim harness.
pub enum Backend {
    /// The embedded log (RocksDB) in its directory; the local store keeps every state.
    Embedded(LogConfig),
    /// Kafka: events, progress and shared definitions on the broker; the local store
    /// keeps the rest.
    Kafka(KafkaStart),
    /// A log the caller built (the simulation's, a test's); the local store keeps every
    /// state.
    Given(Arc<dyn LogPort>),
}

/// This node's own state store (`state.backend`: `Config::local_store` builds it), which
/// [`Backend::open`] takes opened: every backend keeps its local state there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LocalStore {
    /// RocksDB in this directory.
    Rocksdb(PathBuf),
    /// sled in this directory.
    Sled(PathBuf),
    /// In memory: nothing survives a restart.
    Memory,
}

impl LocalStore {
    /// Opens the store; the error names its kind and directory.
    pub fn open(&self) -> Result<Box<dyn StateStore>, String> {
        let opened: Result<Box<dyn StateStore>, String> = match self {
            #[cfg(feature = "rocksdb")]
            LocalStore::Rocksdb(dir) => RocksStore::open(dir)
                .map(|s| Box::new(s) as Box<dyn StateStore>)
                .map_err(|e| e.to_string()),
            #[cfg(not(feature = "rocksdb"))]
            LocalStore::Rocksdb(_) => Err("built without it (feature rocksdb)".to_owned()),
            #[cfg(feature = "sled")]
            LocalStore::Sled(dir) => SledStore::open(dir)
                .map(|s| Box::new(s) as Box<dyn StateStore>)
                .map_err(|e| e.to_string()),
            #[cfg(not(feature = "sled"))]
            LocalStore::Sled(_) => Err("built without it (feature sled)".to_owned()),
            LocalStore::Memory => Ok(Box::new(MemoryStore::open(MemoryDisk::new()))),
        };
        opened.map_err(|e| {
            let place = self
                .dir()
                .map(|d| format!(" in {}", d.display()))
                .unwrap_or_default();
            format!("cannot open the {} state store{place}: {e}", self.kind())
        })
    }

    /// Its directory (`None` in memory).
    pub fn dir(&self) -> Option<&Path> {
        match self {
            LocalStore::Rocksdb(dir) | LocalStore::Sled(dir) => Some(dir),
            LocalStore::Memory => None,
        }
    }

    /// Its `state.backend` name.
    fn kind(&self) -> &'static str {
        match self {
            LocalStore::Rocksdb(_) => "rocksdb",
            LocalStore::Sled(_) => "sled",
            LocalStore::Memory => "memory",
        }
    }
}

/// How the Kafka backend starts.
pub struct KafkaStart {
    pub settings: KafkaSettings,
    /// How often a thread probes the broker for health (and rebuilds a fatal producer);
    /// `None`: no probe. Not under madsim, which has no threads.
    pub watch_every: Option<Duration>,
    /// How often the partition ends the engine reads are refreshed.
    pub offsets_refresh: Duration,
}

/// Waits until the Kafka broker answers (its own topics exist): true then, false when
/// the start should stop instead (a stop signal while waiting), an error for a refusal
/// that stays ([`KafkaLog::ensure_own_topics`]'s; [`Backend::open`] names the broker).
/// `serve` answers 503 meanwhile.
pub type WaitForBroker<'a> = Box<
    dyn FnOnce(KafkaLog) -> Pin<Box<dyn Future<Output = Result<bool, StorageError>> + Send + 'a>>
        + Send
        + 'a,
>;

/// What [`Backend::open`] made: the ports, with their concrete types for a caller that
/// wraps them (the madsim harness) or drives what only one backend has (Kafka's watchers).
pub enum Opened {
    #[cfg(feature = "rocksdb")]
    Embedded {
        log: EmbeddedLog,
        state: StoreAdapter,
    },
    Kafka {
        log: KafkaLog,
        state: KafkaState,
    },
    Given {
        log: Arc<dyn LogPort>,
        state: StoreAdapter,
    },
}

impl Opened {
    /// The ports as the engine takes them.
    pub fn ports(self) -> Ports {
        match self {
            #[cfg(feature = "rocksdb")]
            Opened::Embedded { log, state } => (Arc::new(log), Arc::new(state)),
            Opened::Kafka { log, state } => (Arc::new(log), Arc::new(state)),
            Opened::Given { log, state } => (log, Arc::new(state)),
        }
    }

    /// The Kafka log, when storage is on Kafka.
    pub fn kafka(&self) -> Option<&KafkaLog> {
        match self {
            Opened::Kafka { log, .. } => Some(log),
            _ => None,
        }
    }
}

impl Backend {
    /// Opens storage on `local`, this node's own state store. On Kafka, `wait` holds the
    /// start until the broker answers (`None`: its own topics are created once, and an
    /// error if the broker does not answer). `Ok(None)`: `wait` said to stop.
    pub async fn open(
        self,
        local: Box<dyn StateStore>,
        wait: Option<WaitForBroker<'_>>,
    ) -> Result<Option<Opened>, String> {
        let local = StoreAdapter::new(local);
        match self {
            Backend::Embedded(config) => open_embedded(config, local),
            Backend::Given(log) => Ok(Some(Opened::Given { log, state: local })),
            Backend::Kafka(start) => {
                let brokers = start.settings.brokers.clone();
                let log = KafkaLog::connect(start.settings)
                    .await
                    .map_err(|e| format!("cannot use Kafka at {brokers}: {e}"))?;
                // A thread of its own: not under the simulator, which has none.
                #[cfg(not(madsim))]
                if let Some(every) = start.watch_every {
                    log.spawn_watch(every);
                }
                let ready = match wait {
                    Some(wait) => wait(log.clone()).await,
                    None => log.ensure_own_topics().await.map(|()| true),
                }
                .map_err(|e| format!("cannot use Kafka at {brokers}: {e}"))?;
                if !ready {
                    return Ok(None);
                }
                log.spawn_offsets_refresh(start.offsets_refresh);
                // Recovery takes the definitions from the topic, never from a local copy.
                let definitions = kafka::definitions(&log)
                    .await
                    .map_err(|e| format!("cannot read the subscriptions topic: {e}"))?;
                let state = KafkaState::new(local, log.clone(), definitions);
                Ok(Some(Opened::Kafka { log, state }))
            }
        }
    }
}

#[cfg(feature = "rocksdb")]
fn open_embedded(config: LogConfig, local: StoreAdapter) -> Result<Option<Opened>, String> {
    let dir = config.dir.clone();
    let log = EmbeddedLog::open(config)
        .map_err(|e| format!("cannot open the event log in {}: {e}", dir.display()))?;
    Ok(Some(Opened::Embedded { log, state: local }))
}

#[cfg(not(feature = "rocksdb"))]
fn open_embedded(config: LogConfig, _local: StoreAdapter) -> Result<Option<Opened>, String> {
    Err(format!(
        "cannot open the event log in {}: built without the embedded log (feature rocksdb)",
        config.dir.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_local_store_that_cannot_open_names_its_kind_and_directory() {
        let tmp = tempfile::tempdir().expect("a temporary directory");
        // A file where the store's directory should be.
        let file = tmp.path().join("state");
        std::fs::write(&file, b"not a directory").expect("write the file");
        for (store, kind) in [
            (LocalStore::Rocksdb(file.clone()), "rocksdb"),
            (LocalStore::Sled(file.clone()), "sled"),
        ] {
            let Err(e) = store.open() else {
                panic!("{kind} opened on a file");
            };
            let start = format!("cannot open the {kind} state store in {}: ", file.display());
            assert!(e.starts_with(&start), "{e}");
        }
        assert!(LocalStore::Memory.open().is_ok());
        assert_eq!(LocalStore::Memory.dir(), None);
    }
}
