//! Publish deduplication through the engine's handle (DESIGN §8): what is appended, what
//! is answered, and what a restart keeps on a log that can refill the window (the embedded
//! one) and on one that cannot (in memory here; Kafka is the same: `recent_appends` is
//! `None`).

use std::sync::Arc;

use madsim_tokio as tokio;

use unimesh_core::TopicName;

use super::super::dedup::{DedupConfig, WindowRule};
use super::super::*;
use crate::storage::state::{MemoryDisk, MemoryStore};

fn t(s: &str) -> TopicName {
    TopicName::new(s).unwrap()
}

/// A batch of events with these (source, id) pairs.
fn batch(identities: &[(&str, &str)]) -> Vec<crate::event::Published> {
    let items: Vec<String> = identities
        .iter()
        .map(|(source, id)| {
            format!(
                r#"{{"specversion":"1.0","id":"{id}","source":"{source}","type":"t","data":1}}"#
            )
        })
        .collect();
    super::parse_batch(&items)
}

/// Publishes a batch of these (source, id) pairs; asserts it is accepted.
async fn publish(
    handle: &EngineHandle,
    topic: &str,
    identities: &[(&str, &str)],
) -> Vec<PublishResult> {
    handle.publish(&t(topic), batch(identities)).await.unwrap()
}

/// Dedup on `orders` only, a minute long.
fn config() -> EngineConfig {
    let mut dedup = DedupConfig::default();
    dedup.topics.insert(
        t("orders"),
        Some(WindowRule {
            window_ms: 60_000,
            max_entries: 1_000,
        }),
    );
    EngineConfig {
        fetch_wait_ms: 50,
        retention_interval_ms: 0,
        dedup,
        ..EngineConfig::default()
    }
}

async fn boot(log: Arc<dyn LogPort>) -> EngineHandle {
    let state = Arc::new(StoreAdapter::new(Box::new(MemoryStore::open(
        MemoryDisk::new(),
    ))));
    start(config(), log, state).await.unwrap().0
}

/// Records in the log's topic, over every partition.
async fn stored(log: &dyn LogPort, topic: &str) -> u64 {
    let n = log.partitions(t(topic)).await.unwrap_or(0);
    let mut sum = 0;
    for p in 0..n {
        sum += log.offsets(t(topic), p).await.unwrap().1;
    }
    sum
}

fn places(results: &[PublishResult]) -> Vec<(u32, u64, bool)> {
    results
        .iter()
        .map(|r| (r.partition, r.offset, r.duplicate))
        .collect()
}

/// Goal: a repeated (source, id) on a deduplicating topic is answered with the first
/// publish's place, marked, and not appended; a repeat inside one request likewise; the
/// same id from another source is another event. Method: count the log's records.
#[tokio::test]
async fn a_repeat_is_answered_with_the_first_place_and_not_appended() {
    let log = Arc::new(MemoryLog::new(2));
    let handle = boot(Arc::new(log.clone())).await;
    let first = publish(&handle, "orders", &[("/a", "1"), ("/a", "2")]).await;
    assert!(first.iter().all(|r| !r.duplicate));
    assert_eq!(stored(&log, "orders").await, 2);

    let again = handle
        .publish(
            &t("orders"),
            batch(&[("/a", "2"), ("/b", "1"), ("/b", "1"), ("/a", "1")]),
        )
        .await
        .unwrap();
    assert_eq!(stored(&log, "orders").await, 3, "only /b 1 is new");
    let (p2, o2, _) = places(&first)[1];
    let (p1, o1, _) = places(&first)[0];
    let got = places(&again);
    assert_eq!(got[0], (p2, o2, true));
    assert!(
        !got[1].2,
        "the same id from another source is another event"
    );
    assert_eq!(
        got[2],
        (got[1].0, got[1].1, true),
        "a repeat inside the request"
    );
    assert_eq!(got[3], (p1, o1, true));
    assert_eq!(
        again.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(),
        ["2", "1", "1", "1"]
    );
}

/// Goal: topics without a window append every repeat (dedup is per topic, off by default).
#[tokio::test]
async fn a_topic_without_a_window_appends_every_repeat() {
    let log = Arc::new(MemoryLog::new(2));
    let handle = boot(Arc::new(log.clone())).await;
    for _ in 0..2 {
        let r = publish(&handle, "other", &[("/a", "1")]).await;
        assert!(!r[0].duplicate);
    }
    assert_eq!(stored(&log, "other").await, 2);
}

/// Goal: a publish that failed leaves nothing in the window, so its retry is appended
/// (C9: the publisher may retry). Method: fail the log once, then publish again.
#[tokio::test]
async fn a_failed_publish_is_not_remembered_and_its_retry_appends() {
    let log = Arc::new(MemoryLog::new(2));
    let handle = boot(Arc::new(log.clone())).await;
    log.set_fault(Some("disk on fire".into()));
    let err = handle
        .publish(&t("orders"), batch(&[("/a", "1")]))
        .await
        .unwrap_err();
    assert!(matches!(err, EngineError::Unavailable(_)), "{err:?}");
    log.set_fault(None);
    let r = publish(&handle, "orders", &[("/a", "1")]).await;
    assert!(!r[0].duplicate);
    assert_eq!(stored(&log, "orders").await, 1);
}

/// The in-memory log, whose appends take a while (so publishes overlap).
struct SlowAppends(Arc<MemoryLog>);

impl LogPort for SlowAppends {
    fn fetch(
        &self,
        group: unimesh_core::GroupName,
        topic: TopicName,
        partition: unimesh_core::Partition,
        from: unimesh_core::Offset,
        max: usize,
        max_bytes: usize,
        wait_ms: u64,
    ) -> BoxFut<LogRead> {
        self.0
            .fetch(group, topic, partition, from, max, max_bytes, wait_ms)
    }
    fn append(
        &self,
        topic: TopicName,
        items: Vec<crate::storage::log::AppendItem>,
    ) -> BoxFut<Result<Vec<(unimesh_core::Partition, unimesh_core::Offset)>, StorageError>> {
        let append = self.0.append(topic, items);
        Box::pin(async move {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            append.await
        })
    }
    fn prepare_topic(
        &self,
        topic: TopicName,
        with_offsets: bool,
    ) -> BoxFut<Result<TopicFacts, StorageError>> {
        self.0.prepare_topic(topic, with_offsets)
    }
    fn partitions(&self, topic: TopicName) -> BoxFut<Option<u32>> {
        LogPort::partitions(&self.0, topic)
    }
    fn offsets(
        &self,
        topic: TopicName,
        partition: unimesh_core::Partition,
    ) -> BoxFut<Result<(unimesh_core::Offset, unimesh_core::Offset), StorageError>> {
        LogPort::offsets(&self.0, topic, partition)
    }
    fn enforce_retention(&self) -> BoxFut<Result<usize, StorageError>> {
        LogPort::enforce_retention(&self.0)
    }
}

/// Goal: concurrent publishes of one identity append it once. Method: many requests of
/// the same event at once on a log whose appends take 20 ms, so they overlap; one is new,
/// all others wait for it and are answered with its place.
#[tokio::test]
async fn concurrent_repeats_append_once() {
    let log = Arc::new(MemoryLog::new(2));
    let handle = boot(Arc::new(SlowAppends(log.clone()))).await;
    let tasks: Vec<_> = (0..16)
        .map(|_| {
            let h = handle.clone();
            tokio::spawn(async move { h.publish(&t("orders"), batch(&[("/a", "x")])).await })
        })
        .collect();
    let mut results = Vec::new();
    for task in tasks {
        results.push(task.await.unwrap().unwrap().remove(0));
    }
    assert_eq!(stored(&log, "orders").await, 1);
    assert_eq!(results.iter().filter(|r| !r.duplicate).count(), 1);
    let place = (results[0].partition, results[0].offset);
    assert!(results.iter().all(|r| (r.partition, r.offset) == place));
}

/// Goal: the documented limit of a log that cannot tell when its records were appended
/// (the Kafka backend; the in-memory log here): after a restart the window is empty and a
/// repeat is appended again. Method: restart the engine on the same log.
#[tokio::test]
async fn a_log_without_append_times_starts_each_window_empty() {
    let log = Arc::new(MemoryLog::new(2));
    let handle = boot(Arc::new(log.clone())).await;
    publish(&handle, "orders", &[("/a", "1")]).await;
    handle.shutdown().await.unwrap();
    assert!(LogPort::recent_appends(&log, &|_| Some((0, 10))).is_none());
    let handle = boot(Arc::new(log.clone())).await;
    let r = publish(&handle, "orders", &[("/a", "1")]).await;
    assert!(!r[0].duplicate);
    assert_eq!(stored(&log, "orders").await, 2);
}

/// Goal: the embedded log's window survives a restart: it is refilled from the records
/// appended within the window. Method: publish, restart the engine on the same RocksDB
/// log, publish the same identity: answered as a duplicate of the first place.
#[cfg(feature = "rocksdb")]
#[tokio::test]
async fn the_embedded_log_refills_the_window_at_restart() {
    let dir = tempfile::tempdir().unwrap();
    let log =
        crate::storage::log::EmbeddedLog::open(crate::storage::log::LogConfig::new(dir.path()))
            .unwrap();
    let handle = boot(Arc::new(log.clone())).await;
    let first = publish(&handle, "orders", &[("/a", "1"), ("/a", "2")]).await;
    handle.shutdown().await.unwrap();

    let handle = boot(Arc::new(log.clone())).await;
    let again = publish(&handle, "orders", &[("/a", "2"), ("/a", "3")]).await;
    assert_eq!(
        (again[0].partition, again[0].offset, again[0].duplicate),
        (first[1].partition, first[1].offset, true)
    );
    assert!(!again[1].duplicate);
    assert_eq!(stored(&log, "orders").await, 3);
}

/// Goal: the refill reads only the window: records appended before it are not kept.
/// Method: a log whose clock is an hour behind stamps the first record; the restart's
/// refill (at the real time) finds it outside the one-minute window.
#[cfg(feature = "rocksdb")]
#[tokio::test]
async fn the_refill_leaves_out_what_is_older_than_the_window() {
    #[derive(Debug)]
    struct HourAgo;
    impl crate::storage::log::WallClock for HourAgo {
        fn now_ms(&self) -> u64 {
            super::super::persist::wall_ms().saturating_sub(3_600_000)
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = crate::storage::log::LogConfig::new(dir.path());
    cfg.clock = Arc::new(HourAgo);
    let log = crate::storage::log::EmbeddedLog::open(cfg).unwrap();
    let handle = boot(Arc::new(log.clone())).await;
    publish(&handle, "orders", &[("/a", "1")]).await;
    handle.shutdown().await.unwrap();
    let handle = boot(Arc::new(log.clone())).await;
    let r = publish(&handle, "orders", &[("/a", "1")]).await;
    assert!(
        !r[0].duplicate,
        "an hour-old publish was kept by a one-minute window"
    );
}
