//! Where events and state are kept, behind the seam the engine sees (`ports`): the
//! embedded log (`log/`), the state stores (`state/`), a log in memory (`memory/`) and
//! Kafka (`kafka/`), each in a folder of its own.

pub mod kafka;
pub mod log;
pub mod memory;
pub mod ports;
mod records;
pub mod state;

use madsim_tokio as tokio;

pub(crate) use records::decode_record;

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
