//! The sled backend (pure Rust). A commit is one `Tree::apply_batch` (atomic, also across
//! a crash) followed by `flush()`, which returns once the batch is on disk: sled
//! otherwise only writes back every few hundred milliseconds.
//!
//! sled batches have no range deletion, so removing a group lists its keys first; the
//! store has a single writer (`apply` takes `&mut self`), so the list cannot go stale
//! before the batch is applied.

use std::path::{Path, PathBuf};

use super::{net_writes, state_store_via_kv, Flow, Kv, Op, StoreError, Visitor};

/// A [`StateStore`](super::StateStore) on sled, in a directory of its own.
pub struct SledStore {
    db: sled::Db,
    path: PathBuf,
    /// Set when a batch was applied but its flush failed: sled then shows writes that may
    /// not be on disk, which the contract forbids, so the store refuses all further work
    /// until it is reopened (reopening reads what really is on disk).
    poisoned: bool,
}

impl std::fmt::Debug for SledStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SledStore")
            .field("path", &self.path)
            .finish()
    }
}

fn io(op: &'static str, e: sled::Error) -> StoreError {
    match e {
        sled::Error::Corruption { at, .. } => StoreError::Corrupt {
            key: format!("sled log at {at:?}"),
            why: "sled found its files corrupt".to_owned(),
        },
        other => StoreError::Io {
            backend: "sled",
            op,
            message: other.to_string(),
        },
    }
}

/// How long an open waits for a directory lock this process may still be releasing.
const LOCK_WAIT_MAX_MS: u64 = 2_000;
const LOCK_WAIT_STEP_MS: u64 = 10;

impl SledStore {
    /// Opens (creating if missing) the store in `dir`. Fails if another process holds it.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = dir.as_ref().to_path_buf();
        // Every batch is flushed explicitly, so sled's periodic flusher thread adds nothing;
        // without it, dropping the last handle releases the directory lock at once.
        let config = sled::Config::new().path(&path).flush_every_ms(None);
        // sled 0.34 may still hold the directory lock for a moment after a `Db` of this
        // process was dropped (sled#1234, #1289: its threads release it lazily), so a reopen
        // waits a bounded time for the lock; another process holding it still fails.
        let mut waited_ms = 0;
        let db = loop {
            match config.open() {
                Ok(db) => break db,
                // sled reports lock contention only in the message (ErrorKind::Other).
                Err(sled::Error::Io(e))
                    if e.to_string().contains("could not acquire lock")
                        && waited_ms < LOCK_WAIT_MAX_MS =>
                {
                    std::thread::sleep(std::time::Duration::from_millis(LOCK_WAIT_STEP_MS));
                    waited_ms += LOCK_WAIT_STEP_MS;
                }
                Err(e) => return Err(io("open", e)),
            }
        };
        Ok(Self {
            db,
            path,
            poisoned: false,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn check(&self) -> Result<(), StoreError> {
        if self.poisoned {
            return Err(StoreError::Io {
                backend: "sled",
                op: "use the store",
                message: "an earlier flush failed; reopen the store".to_owned(),
            });
        }
        Ok(())
    }

    fn keys_in(&self, start: &[u8], end: &[u8]) -> Result<Vec<Vec<u8>>, StoreError> {
        let mut out = Vec::new();
        for item in self.db.range(start..end) {
            let (k, _) = item.map_err(|e| io("scan", e))?;
            out.push(k.to_vec());
        }
        Ok(out)
    }
}

impl Kv for SledStore {
    fn kv_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.check()?;
        self.db
            .get(key)
            .map(|v| v.map(|v| v.to_vec()))
            .map_err(|e| io("read", e))
    }

    fn kv_scan(&self, start: &[u8], end: &[u8], visit: &mut Visitor<'_>) -> Result<(), StoreError> {
        self.check()?;
        if start >= end {
            return Ok(());
        }
        for item in self.db.range(start..end) {
            let (k, v) = item.map_err(|e| io("scan", e))?;
            if let Flow::Stop = visit(&k, &v)? {
                break;
            }
        }
        Ok(())
    }

    fn kv_commit(&mut self, ops: &[Op]) -> Result<(), StoreError> {
        self.check()?;
        let net = net_writes(ops, &mut |start, end| self.keys_in(start, end))?;
        let mut batch = sled::Batch::default();
        for (k, v) in net {
            match v {
                Some(v) => batch.insert(k, v),
                None => batch.remove(k),
            }
        }
        self.db.apply_batch(batch).map_err(|e| io("write", e))?;
        if let Err(e) = self.db.flush() {
            self.poisoned = true;
            return Err(io("flush", e));
        }
        Ok(())
    }
}

state_store_via_kv!(SledStore);
