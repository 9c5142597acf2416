//! The RocksDB backend (the default). One `WriteBatch` per commit, written with
//! `sync = true`: RocksDB applies a batch atomically (also across a crash, through its
//! write-ahead log) and the sync makes it survive a power loss, not only a process crash.
//! Removing a group is a range deletion inside the same batch, so its cost does not grow
//! with the size of the group's DLQ.

use std::path::{Path, PathBuf};

use rocksdb::{Options, ReadOptions, WriteBatch, WriteOptions, DB};

use super::{state_store_via_kv, Flow, Kv, Op, StoreError, Visitor};

/// A [`StateStore`](super::StateStore) on RocksDB, in a directory of its own.
pub struct RocksStore {
    db: DB,
    path: PathBuf,
}

impl std::fmt::Debug for RocksStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksStore")
            .field("path", &self.path)
            .finish()
    }
}

fn io(op: &'static str, e: rocksdb::Error) -> StoreError {
    StoreError::Io {
        backend: "rocksdb",
        op,
        message: e.into_string(),
    }
}

impl RocksStore {
    /// Opens (creating if missing) the store in `dir`. Fails if another process holds it.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = dir.as_ref().to_path_buf();
        let mut opts = Options::default();
        opts.create_if_missing(true);
        // The store is small and written in small synced batches; bound its side files.
        opts.set_keep_log_file_num(4);
        let db = DB::open(&opts, &path).map_err(|e| io("open", e))?;
        Ok(Self { db, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Kv for RocksStore {
    fn kv_get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, StoreError> {
        self.db.get(key).map_err(|e| io("read", e))
    }

    fn kv_scan(&self, start: &[u8], end: &[u8], visit: &mut Visitor<'_>) -> Result<(), StoreError> {
        if start >= end {
            return Ok(());
        }
        let mut ro = ReadOptions::default();
        ro.set_iterate_upper_bound(end.to_vec());
        let mut it = self.db.raw_iterator_opt(ro);
        it.seek(start);
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            if let Flow::Stop = visit(k, v)? {
                return Ok(());
            }
            it.next();
        }
        // An iterator that stops early because of an I/O error only says so here.
        it.status().map_err(|e| io("scan", e))
    }

    fn kv_commit(&mut self, ops: &[Op]) -> Result<(), StoreError> {
        let mut batch = WriteBatch::default();
        for op in ops {
            match op {
                Op::Put { key, value } => batch.put(key, value),
                Op::Delete { key } => batch.delete(key),
                Op::DeleteRange { start, end } => batch.delete_range(start, end),
            }
        }
        let mut wo = WriteOptions::default();
        wo.set_sync(true);
        self.db.write_opt(batch, &wo).map_err(|e| io("write", e))
    }
}

state_store_via_kv!(RocksStore);
