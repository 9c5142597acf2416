//! The in-memory backend, for tests and simulation. Its "disk" is a [`MemoryDisk`] that
//! outlives the store: open a new store on the same disk to model a restart. A commit is
//! durable the moment it returns, which is exactly the contract the other backends get
//! from a synced write; [`MemoryDisk::fail_next_commits`] injects write failures.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use super::{net_writes, state_store_via_kv, Flow, Kv, Op, StoreError, Visitor};

/// Shared, durable-by-definition storage for [`MemoryStore`]s. Clones share the data.
#[derive(Clone, Debug, Default)]
pub struct MemoryDisk {
    inner: Arc<Mutex<Disk>>,
}

#[derive(Debug, Default)]
struct Disk {
    data: BTreeMap<Vec<u8>, Vec<u8>>,
    fail_commits: u32,
    commits: u64,
}

impl MemoryDisk {
    pub fn new() -> Self {
        Self::default()
    }

    /// The next `n` commits fail with an I/O error and change nothing.
    pub fn fail_next_commits(&self, n: u32) {
        self.lock().fail_commits = n;
    }

    /// How many commits have succeeded so far.
    pub fn commits(&self) -> u64 {
        self.lock().commits
    }

    /// How many keys are stored.
    pub fn len(&self) -> usize {
        self.lock().data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, Disk> {
        // A panic while the lock was held cannot have left a half-applied commit: commits
        // are computed first and applied without any fallible step.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A [`StateStore`](super::StateStore) in memory.
#[derive(Debug, Default)]
pub struct MemoryStore {
    disk: MemoryDisk,
}

impl MemoryStore {
    /// A store on a fresh disk of its own.
    pub fn new() -> Self {
        Self::default()
    }

    /// A store on `disk`, seeing everything earlier stores committed to it.
    pub fn open(disk: MemoryDisk) -> Self {
        Self { disk }
    }

    pub fn disk(&self) -> &MemoryDisk {
        &self.disk
    }
}

impl Kv for MemoryStore {
    fn kv_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.disk.lock().data.get(key).cloned())
    }

    fn kv_scan(&self, start: &[u8], end: &[u8], visit: &mut Visitor<'_>) -> Result<(), StoreError> {
        if start >= end {
            return Ok(());
        }
        let disk = self.disk.lock();
        for (k, v) in disk.data.range(start.to_vec()..end.to_vec()) {
            if let Flow::Stop = visit(k, v)? {
                break;
            }
        }
        Ok(())
    }

    fn kv_commit(&mut self, ops: &[Op]) -> Result<(), StoreError> {
        let mut disk = self.disk.lock();
        if disk.fail_commits > 0 {
            disk.fail_commits -= 1;
            return Err(StoreError::Io {
                backend: "memory",
                op: "commit",
                message: "injected write failure".to_owned(),
            });
        }
        let net = net_writes(ops, &mut |start, end| {
            Ok(disk
                .data
                .range(start.to_vec()..end.to_vec())
                .map(|(k, _)| k.clone())
                .collect())
        })?;
        for (k, v) in net {
            match v {
                Some(v) => disk.data.insert(k, v),
                None => disk.data.remove(&k),
            };
        }
        disk.commits += 1;
        Ok(())
    }
}

state_store_via_kv!(MemoryStore);
