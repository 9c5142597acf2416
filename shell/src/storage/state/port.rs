//! Any [`StateStore`] as the engine's [`StatePort`].

use std::sync::{Arc, Mutex};

use unimesh_core::{GroupName, PersistBatch, RateRule, TopicName};

use super::{DlqEntry, Loaded, StateStore, StoreError};
use crate::storage::ports::{BoxFut, StatePort, StorageError};

/// Any [`StateStore`] as a port: blocking calls run on the blocking pool, one at a time.
pub struct StoreAdapter {
    store: Arc<Mutex<Box<dyn StateStore>>>,
}

impl StoreAdapter {
    pub fn new(store: Box<dyn StateStore>) -> Self {
        Self {
            store: Arc::new(Mutex::new(store)),
        }
    }

    fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut dyn StateStore) -> Result<T, StoreError> + Send + 'static,
    ) -> BoxFut<Result<T, StorageError>> {
        let store = self.store.clone();
        Box::pin(async move {
            crate::storage::spawn_blocking(move || {
                // A poisoned lock means a store call panicked; the store itself is still
                // the one on disk, so carry on with it rather than wedge every caller.
                let mut guard = store.lock().unwrap_or_else(|p| p.into_inner());
                f(guard.as_mut()).map_err(StorageError::from_source)
            })
            .await
            .map_err(|e| StorageError::failed("store task failed", e))?
        })
    }
}

impl StatePort for StoreAdapter {
    fn load(&self) -> BoxFut<Result<Loaded, StorageError>> {
        // Read where it is awaited, once at start before anything is served (as it always
        // was): no task of its own, so a simulation's schedule is the same.
        let store = self.store.clone();
        Box::pin(async move {
            let guard = store.lock().unwrap_or_else(|p| p.into_inner());
            guard.load().map_err(StorageError::from_source)
        })
    }

    fn apply(
        &self,
        batch: Arc<PersistBatch>,
        now_wall_ms: u64,
    ) -> BoxFut<Result<(), StorageError>> {
        self.blocking(move |s| s.apply(&batch, now_wall_ms))
    }

    fn dlq_list(
        &self,
        group: GroupName,
        max: usize,
    ) -> BoxFut<Result<Vec<DlqEntry>, StorageError>> {
        self.blocking(move |s| s.dlq_list(&group, None, max))
    }

    fn put_rate_rule(
        &self,
        topic: TopicName,
        rule: Option<RateRule>,
    ) -> BoxFut<Result<(), StorageError>> {
        self.blocking(move |s| s.put_rate_rule(&topic, rule))
    }
}
