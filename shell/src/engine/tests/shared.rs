//! Definitions shared between instances (Kafka's subscriptions topic) at start: one
//! another instance wrote that this node's limits refuse is logged and skipped, and the
//! node starts (`engine::shared::admitted`), as the watcher skips it while serving.

use std::io::Write;
use std::sync::{Arc, Mutex};

use madsim_tokio as tokio;
use unimesh_core::{PersistBatch, RateRule, SubscriptionSpec};

use super::{config, g, spec, start, EngineError, MemoryDisk, MemoryLog, MemoryStore};
use super::{GroupName, StoreAdapter, TopicName};
use crate::engine::ports::{BoxFut, StorageError};
use crate::engine::StatePort;
use crate::storage::state::{DlqEntry, Loaded};

/// The memory store, with `definitions` in place of its own: as the Kafka state port
/// recovers what the subscriptions topic holds, written by every instance.
struct SharedDefinitions {
    inner: StoreAdapter,
    definitions: Vec<SubscriptionSpec>,
}

impl StatePort for SharedDefinitions {
    fn load(&self) -> BoxFut<Result<Loaded, StorageError>> {
        let local = self.inner.load();
        let definitions = self.definitions.clone();
        Box::pin(async move {
            let mut loaded = local.await?;
            loaded.recovered.subscriptions = definitions;
            loaded.shared_definitions = true;
            Ok(loaded)
        })
    }
    fn apply(
        &self,
        batch: Arc<PersistBatch>,
        now_wall_ms: u64,
    ) -> BoxFut<Result<(), StorageError>> {
        self.inner.apply(batch, now_wall_ms)
    }
    fn dlq_list(
        &self,
        group: GroupName,
        max: usize,
    ) -> BoxFut<Result<Vec<DlqEntry>, StorageError>> {
        self.inner.dlq_list(group, max)
    }
    fn put_rate_rule(
        &self,
        topic: TopicName,
        rule: Option<RateRule>,
    ) -> BoxFut<Result<(), StorageError>> {
        self.inner.put_rate_rule(topic, rule)
    }
}

/// What the code under test logs, as text.
#[derive(Clone, Default)]
struct Logged(Arc<Mutex<Vec<u8>>>);

impl Write for Logged {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logged {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

/// Goal: a definition another instance wrote that this node's limits refuse does not stop
/// this node's start (it used to: `Mesh::new` refuses the whole recovery); it is logged
/// with the group and the reason and skipped, and the definitions this node takes are
/// served. Method: the shared definitions hold `wide` (more attempts than this node's
/// `max_attempts`), `a` and `b` (valid) under `max_groups = 1`; the engine starts with
/// `a` only (the first by name), and the log names `wide` and `b` with their reasons.
#[tokio::test]
async fn a_shared_definition_this_node_refuses_is_logged_and_skipped_at_start() {
    let logged = Logged::default();
    let sink = logged.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let mut cfg = config();
    cfg.mesh.max_groups = 1;
    let mut wide = spec("wide", "t");
    wide.max_attempts = cfg.mesh.limits.max_attempts + 1;
    let state = Arc::new(SharedDefinitions {
        inner: StoreAdapter::new(Box::new(MemoryStore::open(MemoryDisk::new()))),
        definitions: vec![spec("a", "t"), spec("b", "t"), wide],
    });
    let log = Arc::new(Arc::new(MemoryLog::new(2)));
    let started = start(cfg, log, state).await;
    let (handle, _join) = match started {
        Ok(started) => started,
        Err(e) => panic!("the node did not start: {e}"),
    };

    assert!(handle.subscription(&g("a")).await.is_ok());
    for skipped in ["b", "wide"] {
        assert_eq!(
            handle.subscription(&g(skipped)).await.unwrap_err(),
            EngineError::UnknownGroup(g(skipped))
        );
    }
    let text = logged.text();
    let line = |group: &str| {
        text.lines()
            .find(|l| l.contains("WARN") && l.contains(&format!("group={group} ")))
            .unwrap_or_else(|| panic!("no warning names group {group}:\n{text}"))
            .to_owned()
    };
    assert!(line("wide").contains("maxAttempts"), "{text}");
    assert!(line("b").contains("at most 1 groups"), "{text}");
    let warned_a = text
        .lines()
        .any(|l| l.contains("WARN") && l.contains("group=a "));
    assert!(!warned_a, "{text}");
}
