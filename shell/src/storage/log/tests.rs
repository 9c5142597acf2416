//! Scenario tests of the embedded log, each on its own temporary directory.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use unimesh_core::{Offset, Partition, TopicName};

use super::*;

/// A wall clock the test moves by hand.
#[derive(Debug, Default)]
struct ManualClock(AtomicU64);

impl ManualClock {
    fn set(&self, ms: u64) {
        self.0.store(ms, Ordering::SeqCst);
    }
}

impl WallClock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

fn topic(name: &str) -> TopicName {
    TopicName::new(name).unwrap()
}

fn item(key: Option<&str>, value: impl Into<Bytes>) -> AppendItem {
    AppendItem {
        key: key.map(str::to_owned),
        value: value.into(),
    }
}

fn open(dir: &Path) -> EmbeddedLog {
    EmbeddedLog::open(LogConfig::new(dir)).unwrap()
}

/// A log in `dir` fsynced every 10 ms rather than per write (`sync_interval_ms`), where
/// small appends may be written on their caller's thread.
fn open_interval(dir: &Path) -> EmbeddedLog {
    EmbeddedLog::open(interval_config(dir, Some(10))).unwrap()
}

fn interval_config(dir: &Path, sync_interval_ms: Option<u64>) -> LogConfig {
    let mut cfg = LogConfig::new(dir);
    cfg.sync_interval_ms = sync_interval_ms;
    cfg
}

/// Every record of a partition, read in pages of 7 to exercise paging.
fn read_all(log: &EmbeddedLog, t: &TopicName, p: Partition) -> Vec<(Offset, Bytes)> {
    let (mut from, end) = log.offsets(t, p).unwrap();
    let mut all = Vec::new();
    while from < end {
        match log.read(t, p, from, 7, usize::MAX).unwrap() {
            ReadResult::Records { records, .. } => {
                assert!(!records.is_empty(), "no progress at {from} < {end}");
                from = records.last().unwrap().0 + 1;
                all.extend(records);
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    all
}

/// Copies a directory as it is on disk right now (a crash image: nothing closed or flushed).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

#[tokio::test]
async fn offsets_are_dense_per_partition_and_records_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path());
    let t = topic("orders");
    let mut written: BTreeMap<Partition, Vec<(Offset, Bytes)>> = BTreeMap::new();
    for i in 0..60u32 {
        let key = format!("k{}", i % 9);
        let value = Bytes::from(format!("event-{i}"));
        let key = if i % 3 == 0 { None } else { Some(key.as_str()) };
        let got = log
            .append(&t, vec![item(key, value.clone())])
            .await
            .unwrap();
        assert_eq!(got.len(), 1);
        written.entry(got[0].0).or_default().push((got[0].1, value));
    }
    assert_eq!(log.topic(&t).unwrap().partitions, 4);
    for (p, records) in &written {
        let offsets: Vec<Offset> = records.iter().map(|r| r.0).collect();
        let dense: Vec<Offset> = (0..records.len() as u64).collect();
        assert_eq!(offsets, dense, "partition {p}");
        assert_eq!(log.offsets(&t, *p).unwrap(), (0, records.len() as u64));
        assert_eq!(&read_all(&log, &t, *p), records);
    }
}

#[tokio::test]
async fn a_multi_record_append_gets_consecutive_offsets_in_item_order() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path());
    let t = topic("batch");
    let items = (0..10)
        .map(|i| item(Some("same"), format!("v{i}")))
        .collect();
    let got = log.append(&t, items).await.unwrap();
    let p = partition_for_key(b"same", 4);
    let want: Vec<(Partition, Offset)> = (0..10).map(|o| (p, o)).collect();
    assert_eq!(got, want);
    let values: Vec<Bytes> = read_all(&log, &t, p).into_iter().map(|r| r.1).collect();
    let want: Vec<Bytes> = (0..10).map(|i| Bytes::from(format!("v{i}"))).collect();
    assert_eq!(values, want);
}

#[tokio::test]
async fn a_key_always_maps_to_the_same_pinned_partition() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path());
    let t = topic("keys");
    // Pinned: murmur2("foobar") = -790332482 → 1357151166 % 4 = 2 (Kafka's partitioner).
    for _ in 0..5 {
        let got = log
            .append(&t, vec![item(Some("foobar"), "x")])
            .await
            .unwrap();
        assert_eq!(got[0].0, 2);
    }
    for key in ["user-1", "user-2", "a", ""] {
        let want = partition_for_key(key.as_bytes(), 4);
        for _ in 0..3 {
            let got = log.append(&t, vec![item(Some(key), "x")]).await.unwrap();
            assert_eq!(got[0].0, want, "key {key:?}");
        }
    }
}

#[tokio::test]
async fn unkeyed_records_are_spread_round_robin() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path());
    let t = topic("rr");
    let mut per_partition = [0u32; 4];
    for _ in 0..8 {
        let got = log.append(&t, vec![item(None, "x")]).await.unwrap();
        per_partition[got[0].0 as usize] += 1;
    }
    let got = log
        .append(&t, (0..4).map(|_| item(None, "y")).collect())
        .await
        .unwrap();
    for (p, _) in got {
        per_partition[p as usize] += 1;
    }
    assert_eq!(per_partition, [3, 3, 3, 3]);
}

#[tokio::test]
async fn reopen_after_close_recovers_end_offsets_and_data() {
    let dir = tempfile::tempdir().unwrap();
    let t = topic("durable");
    let mut before = BTreeMap::new();
    {
        let log = open(dir.path());
        log.create_topic(&t, 3).unwrap();
        for i in 0..20 {
            log.append(&t, vec![item(None, format!("r{i}"))])
                .await
                .unwrap();
        }
        for p in 0..3 {
            before.insert(p, read_all(&log, &t, p));
        }
        log.close().unwrap();
    }
    let log = open(dir.path());
    assert_eq!(
        log.topics(),
        vec![TopicInfo {
            name: t.clone(),
            partitions: 3
        }]
    );
    for p in 0..3 {
        let records = &before[&p];
        assert_eq!(log.offsets(&t, p).unwrap(), (0, records.len() as u64));
        assert_eq!(&read_all(&log, &t, p), records);
    }
    // Appends continue after the recovered end, not over it.
    let got = log.append(&t, vec![item(Some("k"), "next")]).await.unwrap();
    let p = got[0].0;
    assert_eq!(got[0].1, before[&p].len() as u64);
}

#[tokio::test]
async fn a_crash_image_keeps_every_acknowledged_append() {
    // Goal: what `append` acknowledged is on disk without close or flush. Method: copy the
    // directory while the log is still open (the image a power cut would leave, as far as
    // synced data goes) and open the copy.
    let dir = tempfile::tempdir().unwrap();
    let image = tempfile::tempdir().unwrap();
    let t = topic("crash");
    let log = open(dir.path());
    let mut acked = Vec::new();
    for i in 0..50 {
        let got = log
            .append(&t, vec![item(Some(&format!("k{i}")), format!("v{i}"))])
            .await
            .unwrap();
        acked.push((got[0], Bytes::from(format!("v{i}"))));
    }
    copy_dir(dir.path(), image.path());
    let recovered = open(image.path());
    for ((p, o), value) in acked {
        match recovered.read(&t, p, o, 1, usize::MAX).unwrap() {
            ReadResult::Records { records, .. } => assert_eq!(records, vec![(o, value)]),
            other => panic!("{p}@{o}: {other:?}"),
        }
    }
    drop(log);
}

#[tokio::test]
async fn drop_without_close_keeps_every_acknowledged_append() {
    let dir = tempfile::tempdir().unwrap();
    let t = topic("dropped");
    let mut acked = Vec::new();
    {
        let log = open(dir.path());
        for i in 0..30 {
            let got = log
                .append(&t, vec![item(None, format!("v{i}"))])
                .await
                .unwrap();
            acked.push((got[0], Bytes::from(format!("v{i}"))));
        }
        let clone = log.clone();
        drop(log);
        drop(clone);
    }
    let log = open(dir.path());
    for ((p, o), value) in acked {
        match log.read(&t, p, o, 1, usize::MAX).unwrap() {
            ReadResult::Records { records, .. } => assert_eq!(records, vec![(o, value)]),
            other => panic!("{p}@{o}: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_appends_get_distinct_dense_offsets_and_are_all_readable() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path());
    concurrent_appends(&log).await;
    let stats = log.stats();
    assert!((1..=64 * 20).contains(&stats.synced_writes), "{stats:?}");
    assert_eq!(
        log.stats().inline_appends,
        0,
        "an fsync per write is never inline"
    );
}

/// Goal: with `sync_interval_ms`, appends written on their callers' threads and appends
/// given to the writer thread share one run of offsets (dense, none given twice, each
/// reading back its own value). Method: 64 tasks on 4 workers append 20 times each, every
/// fifth append too large to be written inline; sequential appends first, which find the
/// writer idle.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_a_sync_interval_inline_and_queued_appends_share_dense_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let log = open_interval(dir.path());
    let warm = topic("warm");
    for i in 0..5u64 {
        let got = log.append(&warm, vec![item(Some("k"), "x")]).await.unwrap();
        assert_eq!(got[0].1, i);
    }
    assert_eq!(
        log.stats().inline_appends,
        5,
        "an idle writer lets its callers write"
    );
    concurrent_appends(&log).await;
    let inline = log.stats().inline_appends - 5;
    assert!(
        inline <= 64 * 16,
        "large appends are queued: {inline} inline"
    );
}

/// 64 tasks append 20 records each, one per append, every fifth one larger than
/// `INLINE_MAX_BYTES`; every (partition, offset) is given once, each partition's offsets
/// are dense, and every record reads back.
async fn concurrent_appends(log: &EmbeddedLog) {
    let t = topic("busy");
    let before = log.stats().records_appended;
    let tasks: Vec<_> = (0..64u32)
        .map(|task| {
            let log = log.clone();
            let t = t.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                for seq in 0..20u32 {
                    let mut value = format!("{task}/{seq}");
                    if seq % 5 == 4 {
                        value.push_str(&"p".repeat(writer::INLINE_MAX_BYTES));
                    }
                    let value = Bytes::from(value);
                    let key = (seq % 2 == 0).then(|| format!("key-{task}"));
                    let at = log
                        .append(
                            &t,
                            vec![AppendItem {
                                key,
                                value: value.clone(),
                            }],
                        )
                        .await
                        .unwrap();
                    got.push((at[0], value));
                }
                got
            })
        })
        .collect();
    let mut by_position: BTreeMap<(Partition, Offset), Bytes> = BTreeMap::new();
    for task in tasks {
        for (at, value) in task.await.unwrap() {
            assert!(
                by_position.insert(at, value).is_none(),
                "{at:?} given twice"
            );
        }
    }
    assert_eq!(by_position.len(), 64 * 20);
    assert_eq!(log.stats().records_appended - before, 64 * 20);
    for p in 0..4 {
        let offsets: Vec<Offset> = by_position
            .keys()
            .filter(|(q, _)| *q == p)
            .map(|(_, o)| *o)
            .collect();
        let dense: Vec<Offset> = (0..offsets.len() as u64).collect();
        assert_eq!(offsets, dense, "partition {p}");
        for (o, value) in read_all(log, &t, p) {
            assert_eq!(by_position[&(p, o)], value);
        }
    }
}

/// Goal: an inline append that meets a RocksDB write stall neither waits on its caller's
/// thread nor loses its offsets: it goes to the writer, which writes it. Method: a stall
/// planted in the next inline write; that append is answered by the writer (the inline
/// count does not move) with the next offset, and the next inline append follows it.
#[tokio::test]
async fn an_inline_append_that_meets_a_write_stall_is_written_by_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let log = open_interval(dir.path());
    let t = topic("stalled");
    log.create_topic(&t, 1).unwrap();
    assert_eq!(
        log.append(&t, vec![item(None, "a")]).await.unwrap(),
        vec![(0, 0)]
    );
    assert_eq!(log.stats().inline_appends, 1);
    log.stall_next_inline();
    assert_eq!(
        log.append(&t, vec![item(None, "b")]).await.unwrap(),
        vec![(0, 1)]
    );
    assert_eq!(
        log.stats().inline_appends,
        1,
        "the stalled append was queued"
    );
    assert_eq!(
        log.append(&t, vec![item(None, "c")]).await.unwrap(),
        vec![(0, 2)]
    );
    assert_eq!(log.stats().inline_appends, 2);
    assert_eq!(
        read_all(&log, &t, 0),
        vec![
            (0, Bytes::from("a")),
            (1, Bytes::from("b")),
            (2, Bytes::from("c"))
        ]
    );
    assert_eq!(log.fault(), None);
}

#[tokio::test]
async fn reads_page_by_count_and_bytes_and_answer_out_of_range() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path());
    let t = topic("paging");
    log.create_topic(&t, 1).unwrap();
    let items = (0..10u8).map(|i| item(None, vec![i; 100])).collect();
    log.append(&t, items).await.unwrap();

    let offsets_of = |r: ReadResult| match r {
        ReadResult::Records { records, .. } => records.iter().map(|r| r.0).collect::<Vec<_>>(),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        offsets_of(log.read(&t, 0, 0, 3, usize::MAX).unwrap()),
        [0, 1, 2]
    );
    assert_eq!(offsets_of(log.read(&t, 0, 4, 100, 250).unwrap()), [4, 5]);
    assert_eq!(offsets_of(log.read(&t, 0, 4, 100, 200).unwrap()), [4, 5]);
    // A record larger than max_bytes still comes alone, or the reader could never progress.
    assert_eq!(offsets_of(log.read(&t, 0, 7, 100, 10).unwrap()), [7]);
    assert_eq!(
        offsets_of(log.read(&t, 0, 8, 100, usize::MAX).unwrap()),
        [8, 9]
    );
    match log.read(&t, 0, 9, 1, usize::MAX).unwrap() {
        ReadResult::Records { records, .. } => assert_eq!(records[0].1, vec![9u8; 100]),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        log.read(&t, 0, 10, 5, usize::MAX).unwrap(),
        ReadResult::Records {
            records: Vec::new(),
            earliest: 0,
            end: 10
        }
    );
    assert_eq!(
        log.read(&t, 0, 11, 5, usize::MAX).unwrap(),
        ReadResult::OutOfRange {
            earliest: 0,
            end: 10
        }
    );
    assert!(matches!(
        log.read(&t, 1, 0, 5, 5),
        Err(LogError::UnknownPartition { partition: 1, .. })
    ));
    assert!(matches!(
        log.read(&topic("nope"), 0, 0, 5, 5),
        Err(LogError::UnknownTopic(_))
    ));
}

fn clocked(dir: &Path, clock: &Arc<ManualClock>) -> LogConfig {
    let mut cfg = LogConfig::new(dir);
    cfg.clock = clock.clone();
    cfg
}

#[tokio::test]
async fn retention_by_age_deletes_a_prefix_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::default());
    let t = topic("aged");
    {
        let mut cfg = clocked(dir.path(), &clock);
        cfg.retention_ms = Some(2_000);
        let log = EmbeddedLog::open(cfg).unwrap();
        log.create_topic(&t, 1).unwrap();
        clock.set(1_000);
        log.append(&t, (0..5).map(|_| item(None, "old")).collect())
            .await
            .unwrap();
        clock.set(5_000);
        log.append(&t, (0..3).map(|_| item(None, "new")).collect())
            .await
            .unwrap();
        // The wall clock steps back: stored times stay non-decreasing, so these two are not
        // taken for old records sitting after young ones.
        clock.set(500);
        log.append(&t, (0..2).map(|_| item(None, "stepped-back")).collect())
            .await
            .unwrap();

        let report = log.enforce_retention(3_000).unwrap();
        assert_eq!(report.truncated, vec![], "nothing is 2 s old at 3 s");
        let report = log.enforce_retention(6_000).unwrap();
        assert_eq!(
            report.truncated,
            vec![Truncation {
                topic: t.clone(),
                partition: 0,
                earliest_before: 0,
                earliest_after: 5
            }]
        );
        assert!(report.failed.is_empty());
        assert_eq!(log.offsets(&t, 0).unwrap(), (5, 10));
        assert_eq!(
            log.read(&t, 0, 4, 10, usize::MAX).unwrap(),
            ReadResult::OutOfRange {
                earliest: 5,
                end: 10
            }
        );
        let kept: Vec<Offset> = read_all(&log, &t, 0).iter().map(|r| r.0).collect();
        assert_eq!(kept, [5, 6, 7, 8, 9]);
        // Running again changes nothing.
        assert!(log.enforce_retention(6_000).unwrap().truncated.is_empty());
    }
    let log = EmbeddedLog::open(clocked(dir.path(), &clock)).unwrap();
    assert_eq!(log.offsets(&t, 0).unwrap(), (5, 10));
    assert!(matches!(
        log.read(&t, 0, 0, 10, usize::MAX).unwrap(),
        ReadResult::OutOfRange { earliest: 5, .. }
    ));
}

#[tokio::test]
async fn retention_by_size_keeps_the_newest_bytes_per_partition() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = LogConfig::new(dir.path());
    cfg.retention_bytes_per_partition = Some(350);
    let log = EmbeddedLog::open(cfg).unwrap();
    let t = topic("sized");
    log.create_topic(&t, 2).unwrap();
    // Partition 0 gets ten 100-byte records; partition 1 two, under the limit.
    log.append(
        &t,
        (0..10)
            .map(|_| item(Some("foobar"), vec![0u8; 100]))
            .collect(),
    )
    .await
    .unwrap();
    let p0 = partition_for_key(b"foobar", 2);
    let p1 = 1 - p0;
    let other_key = (0..)
        .map(|i| format!("k{i}"))
        .find(|k| partition_for_key(k.as_bytes(), 2) == p1)
        .unwrap();
    log.append(
        &t,
        (0..2)
            .map(|_| item(Some(&other_key), vec![1u8; 100]))
            .collect(),
    )
    .await
    .unwrap();

    let report = log.enforce_retention(0).unwrap();
    assert_eq!(report.truncated.len(), 1);
    assert_eq!(report.truncated[0].partition, p0);
    // 300 bytes ≤ 350 < 400: the newest three stay.
    assert_eq!(log.offsets(&t, p0).unwrap(), (7, 10));
    assert_eq!(log.offsets(&t, p1).unwrap(), (0, 2));
    assert!(matches!(
        log.read(&t, p0, 6, 1, usize::MAX).unwrap(),
        ReadResult::OutOfRange { earliest: 7, .. }
    ));
}

#[tokio::test]
async fn retention_can_empty_a_partition_and_offsets_continue_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::default());
    let t = topic("emptied");
    let mut cfg = clocked(dir.path(), &clock);
    cfg.retention_ms = Some(10);
    {
        let log = EmbeddedLog::open(cfg.clone()).unwrap();
        log.create_topic(&t, 1).unwrap();
        clock.set(100);
        log.append(&t, (0..4).map(|_| item(None, "x")).collect())
            .await
            .unwrap();
        log.enforce_retention(1_000).unwrap();
        assert_eq!(log.offsets(&t, 0).unwrap(), (4, 4));
        assert_eq!(
            log.read(&t, 0, 4, 1, 1).unwrap(),
            ReadResult::Records {
                records: vec![],
                earliest: 4,
                end: 4
            }
        );
    }
    let log = EmbeddedLog::open(cfg).unwrap();
    assert_eq!(log.offsets(&t, 0).unwrap(), (4, 4));
    clock.set(2_000);
    assert_eq!(
        log.append(&t, vec![item(None, "y")]).await.unwrap(),
        [(0, 4)]
    );
    assert_eq!(read_all(&log, &t, 0), [(4, Bytes::from("y"))]);
}

#[tokio::test]
async fn watch_end_wakes_a_waiter_on_append() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path());
    let t = topic("watched");
    log.create_topic(&t, 1).unwrap();
    let mut end = log.watch_end(&t, 0).unwrap();
    assert_eq!(*end.borrow_and_update(), 0);
    let waiter = tokio::spawn(async move {
        end.changed().await.unwrap();
        let seen = *end.borrow_and_update();
        seen
    });
    log.append(&t, vec![item(None, "wake up")]).await.unwrap();
    // The guard only stops a broken build from hanging CI; it is not a timing assertion.
    let seen = tokio::time::timeout(Duration::from_secs(60), waiter)
        .await
        .expect("the waiter was never woken")
        .unwrap();
    assert_eq!(seen, 1);
}

#[tokio::test]
async fn corrupt_stored_values_are_errors_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    let t = topic("rotten");
    let log = open(dir.path());
    log.create_topic(&t, 1).unwrap();
    log.append(&t, (0..4).map(|i| item(None, format!("v{i}"))).collect())
        .await
        .unwrap();
    let db = &log.inner.shared.db;
    let cf = records_cf(db).unwrap();
    let mut flipped = db
        .get_cf(&cf, codec::record_key(&t, 0, 1))
        .unwrap()
        .unwrap();
    let last = flipped.len() - 1;
    flipped[last] ^= 0x01;
    db.put_cf(&cf, codec::record_key(&t, 0, 1), &flipped)
        .unwrap();
    db.put_cf(&cf, codec::record_key(&t, 0, 2), [1u8, 2, 3])
        .unwrap();

    // Record 0 is fine on its own; a read reaching record 1 fails and names it.
    assert!(matches!(
        log.read(&t, 0, 0, 1, usize::MAX).unwrap(),
        ReadResult::Records { .. }
    ));
    match log.read(&t, 0, 0, 10, usize::MAX) {
        Err(LogError::Corrupt { what }) => assert!(what.contains("rotten/0@1"), "{what}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        log.read(&t, 0, 2, 10, usize::MAX),
        Err(LogError::Corrupt { .. })
    ));
    // A hole (a record gone from the middle) is an error too, not a silent skip.
    db.delete_cf(&cf, codec::record_key(&t, 0, 1)).unwrap();
    assert!(matches!(
        log.read(&t, 0, 0, 10, usize::MAX),
        Err(LogError::Corrupt { .. })
    ));

    // The last record being unreadable makes open fail cleanly: its end cannot be known.
    db.put_cf(
        &cf,
        codec::record_key(&t, 0, 3),
        b"garbage-value-0123456789",
    )
    .unwrap();
    drop(log);
    match EmbeddedLog::open(LogConfig::new(dir.path())) {
        Err(LogError::Corrupt { what }) => assert!(what.contains("rotten/0@3"), "{what}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn retention_over_a_corrupt_record_reports_the_partition_and_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = LogConfig::new(dir.path());
    cfg.retention_bytes_per_partition = Some(0);
    let log = EmbeddedLog::open(cfg).unwrap();
    let bad = topic("bad");
    let good = topic("good");
    log.create_topic(&bad, 1).unwrap();
    log.create_topic(&good, 1).unwrap();
    log.append(&bad, vec![item(None, "a"), item(None, "b")])
        .await
        .unwrap();
    log.append(&good, vec![item(None, "a")]).await.unwrap();
    let db = &log.inner.shared.db;
    let cf = records_cf(db).unwrap();
    db.put_cf(&cf, codec::record_key(&bad, 0, 1), [9u8; 30])
        .unwrap();

    let report = log.enforce_retention(0).unwrap();
    assert_eq!(report.failed.len(), 1);
    assert_eq!(report.failed[0].0, bad);
    assert!(matches!(report.failed[0].2, LogError::Corrupt { .. }));
    assert_eq!(log.offsets(&bad, 0).unwrap(), (0, 2));
    assert_eq!(log.offsets(&good, 0).unwrap(), (1, 1));
}

#[tokio::test]
async fn limits_are_enforced_with_named_errors() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = LogConfig::new(dir.path());
    cfg.max_record_bytes = 16;
    cfg.max_batch_bytes = 40;
    cfg.max_records_per_append = 3;
    cfg.max_topics = 2;
    let log = EmbeddedLog::open(cfg).unwrap();
    let t = topic("limited");
    assert_eq!(
        log.append(&t, vec![item(None, vec![0u8; 17])]).await,
        Err(LogError::RecordTooLarge { bytes: 17, max: 16 })
    );
    assert_eq!(
        log.append(&t, (0..3).map(|_| item(None, vec![0u8; 16])).collect())
            .await,
        Err(LogError::AppendTooLarge { bytes: 48, max: 40 })
    );
    assert_eq!(
        log.append(&t, (0..4).map(|_| item(None, "x")).collect())
            .await,
        Err(LogError::TooManyRecords { count: 4, max: 3 })
    );
    // Nothing refused was half-applied, nor did it create the topic.
    assert_eq!(log.topic(&t), None);
    assert_eq!(log.append(&t, vec![]).await, Ok(vec![]));

    log.append(&t, vec![item(None, "ok")]).await.unwrap();
    log.ensure_topic(&topic("second")).unwrap();
    let err = log.ensure_topic(&topic("third")).unwrap_err();
    assert_eq!(err, LogError::TooManyTopics { max: 2 });
    assert!(err.is_caller_error());
    assert!(matches!(
        log.create_topic(&topic("zero"), 0),
        Err(LogError::InvalidPartitionCount { .. })
    ));
    // An existing topic keeps its partition count.
    assert_eq!(log.create_topic(&t, 9).unwrap().partitions, 4);

    let mut bad = LogConfig::new(dir.path());
    bad.default_partitions = 0;
    assert!(matches!(
        EmbeddedLog::open(bad),
        Err(LogError::InvalidConfig(_))
    ));
}

#[tokio::test]
async fn topics_are_listed_sorted_with_their_partition_counts() {
    let dir = tempfile::tempdir().unwrap();
    let log = open(dir.path());
    log.create_topic(&topic("b"), 2).unwrap();
    log.ensure_topic(&topic("a")).unwrap();
    let names: BTreeSet<_> = log
        .topics()
        .into_iter()
        .map(|i| (i.name, i.partitions))
        .collect();
    let want: BTreeSet<_> = [(topic("a"), 4), (topic("b"), 2)].into_iter().collect();
    assert_eq!(names, want);
    assert_eq!(log.topics()[0].name, topic("a"));
}

#[tokio::test]
async fn a_failed_write_stops_appends_names_the_fault_and_a_reopen_recovers() {
    a_failed_write_stops_appends(None).await;
}

/// The same with `sync_interval_ms`, where the failing write is made on the caller's
/// thread (inline) and must set the same fault.
#[tokio::test]
async fn a_failed_inline_write_stops_appends_names_the_fault_and_a_reopen_recovers() {
    a_failed_write_stops_appends(Some(10)).await;
}

async fn a_failed_write_stops_appends(sync_interval_ms: Option<u64>) {
    let dir = tempfile::tempdir().unwrap();
    let t = topic("faulty");
    let cfg = interval_config(dir.path(), sync_interval_ms);
    let open = || EmbeddedLog::open(cfg.clone()).unwrap();
    {
        let log = open();
        log.create_topic(&t, 1).unwrap();
        log.append(&t, vec![item(None, "kept")]).await.unwrap();
        assert_eq!(log.fault(), None);

        log.fail_next_writes(1);
        let failed = log.append(&t, vec![item(None, "lost")]).await;
        assert!(matches!(failed, Err(LogError::Storage(_))), "{failed:?}");
        // The disk works again, but the writer does not trust it until a reopen.
        let refused = log.append(&t, vec![item(None, "refused")]).await;
        assert!(
            matches!(refused, Err(LogError::Unavailable(_))),
            "{refused:?}"
        );
        let fault = log.fault().expect("the fault is reported");
        assert!(fault.contains("injected write failure"), "{fault}");
        assert_eq!(log.stats().write_failures, 2);
        let inline = if sync_interval_ms.is_some() { 1 } else { 0 };
        assert_eq!(
            log.stats().inline_appends,
            inline,
            "only the first append was written"
        );
        // Reads keep being served and see only what was acknowledged.
        assert_eq!(read_all(&log, &t, 0), vec![(0, Bytes::from("kept"))]);
        log.close().unwrap();
    }
    let log = open();
    assert_eq!(log.fault(), None);
    let got = log.append(&t, vec![item(None, "after")]).await.unwrap();
    assert_eq!(got, vec![(0, 1)]);
    assert_eq!(
        read_all(&log, &t, 0),
        vec![(0, Bytes::from("kept")), (1, Bytes::from("after"))]
    );
}

/// Disk bytes before and after one retention pass that keeps 64 KiB of a partition holding
/// ~2 MiB of incompressible records (flushed to table files by a close and reopen).
async fn disk_before_after_retention(reclaim_after_bytes: u64) -> (u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let t = topic("reclaimed");
    let mut cfg = LogConfig::new(dir.path());
    cfg.reclaim_after_bytes = reclaim_after_bytes;
    {
        let log = EmbeddedLog::open(cfg.clone()).unwrap();
        log.create_topic(&t, 1).unwrap();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20 {
            let batch = (0..100)
                .map(|_| {
                    let payload: Vec<u8> = (0..1024)
                        .map(|_| {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            x as u8
                        })
                        .collect();
                    item(None, payload)
                })
                .collect();
            log.append(&t, batch).await.unwrap();
        }
        log.close().unwrap();
    }
    cfg.retention_bytes_per_partition = Some(64 << 10);
    let log = EmbeddedLog::open(cfg).unwrap();
    let before = log.disk_bytes().unwrap();
    let report = log.enforce_retention(0).unwrap();
    assert_eq!(report.truncated.len(), 1);
    assert_eq!(log.offsets(&t, 0).unwrap(), (2_000 - 64, 2_000));
    let after = log.disk_bytes().unwrap();
    // The kept records read back whole after the compaction.
    assert_eq!(read_all(&log, &t, 0).len(), 64);
    (before, after)
}

#[tokio::test]
async fn retention_past_the_reclaim_threshold_gives_the_disk_space_back() {
    let (before, after) = disk_before_after_retention(1 << 20).await;
    assert!(before > 1_900_000, "the records are on disk: {before}");
    assert!(after < before / 4, "{before} -> {after} bytes");
    // Under the threshold the range tombstone alone frees nothing yet.
    let (before, after) = disk_before_after_retention(u64::MAX).await;
    assert!(after >= before, "{before} -> {after} bytes");
}

/// Polls `cond` every 5 ms for up to 30 s (a condition wait, not a timing assertion).
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[tokio::test]
async fn with_a_sync_interval_appends_are_synced_by_the_syncer_and_survive_a_drop() {
    // Goal: `sync_interval_ms` answers appends without an fsync each, the syncer fsyncs the
    // WAL within its interval once something was written (and not while nothing is), and a
    // drop without close (a crash of the process) keeps every answered append. Method: 40
    // appends one by one, then wait for the syncer's fsync count to move; an idle spell
    // of 10 intervals adds no fsync; reopen after a drop and read every append back.
    let dir = tempfile::tempdir().unwrap();
    let t = topic("interval");
    let mut cfg = LogConfig::new(dir.path());
    cfg.sync_interval_ms = Some(10);
    let mut acked = Vec::new();
    {
        let log = EmbeddedLog::open(cfg.clone()).unwrap();
        for i in 0..40 {
            let got = log
                .append(&t, vec![item(None, format!("v{i}"))])
                .await
                .unwrap();
            acked.push((got[0], Bytes::from(format!("v{i}"))));
        }
        assert_eq!(log.stats().records_appended, 40);
        assert!(
            log.stats().synced_writes < 40,
            "an fsync per append: {:?}",
            log.stats()
        );
        wait_for("the syncer fsyncs the WAL", || {
            log.stats().synced_writes >= 1
        });
        // Whatever the syncer still had to do is done within two intervals of the last
        // write; from then on an idle log is not fsynced again.
        std::thread::sleep(Duration::from_millis(30));
        let idle = log.stats().synced_writes;
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(log.stats().synced_writes, idle, "fsyncs while idle");
        drop(log);
    }
    let log = EmbeddedLog::open(cfg).unwrap();
    for ((p, o), value) in acked {
        match log.read(&t, p, o, 1, usize::MAX).unwrap() {
            ReadResult::Records { records, .. } => assert_eq!(records, vec![(o, value)]),
            other => panic!("{p}@{o}: {other:?}"),
        }
    }
}

#[test]
fn a_sync_interval_outside_its_bounds_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for ms in [0, MAX_SYNC_INTERVAL_MS + 1] {
        let mut cfg = LogConfig::new(dir.path());
        cfg.sync_interval_ms = Some(ms);
        match EmbeddedLog::open(cfg) {
            Err(LogError::InvalidConfig(why)) => assert!(why.contains("sync_interval_ms"), "{why}"),
            other => panic!("{ms}: {other:?}"),
        }
    }
}

// ----- the window of recent records -----

/// Goal: a read answered from the window of recent records is exactly the read RocksDB
/// answers — same offsets, same bytes, same paging by count and bytes — and the window
/// holds at most its share of `read_cache_bytes`, so older records come from the
/// database. Method: 40 records of 100 bytes on one partition with a window of 1 000 bytes
/// (10 records); every (from, max, max_bytes) compared between `read_recent` and `read`.
#[tokio::test]
async fn the_window_of_recent_records_answers_as_the_database_does() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = LogConfig::new(dir.path());
    cfg.default_partitions = 1;
    cfg.read_cache_bytes = 1_000;
    let log = EmbeddedLog::open(cfg).unwrap();
    let t = topic("recent");
    for batch in 0..4u8 {
        let items = (0..10u8)
            .map(|i| item(None, vec![batch * 10 + i; 100]))
            .collect();
        log.append(&t, items).await.unwrap();
    }
    assert_eq!(log.offsets(&t, 0).unwrap(), (0, 40));
    let mut answered_in_memory = 0;
    for from in 0..=41u64 {
        for (max, max_bytes) in [
            (1, usize::MAX),
            (7, usize::MAX),
            (100, 250),
            (100, usize::MAX),
        ] {
            let disk = log.read(&t, 0, from, max, max_bytes).unwrap();
            match log.read_recent(&t, 0, from, max, max_bytes) {
                Some(memory) => {
                    assert_eq!(
                        memory, disk,
                        "from {from}, max {max}, max_bytes {max_bytes}"
                    );
                    if matches!(&memory, ReadResult::Records { records, .. } if !records.is_empty())
                    {
                        answered_in_memory += 1;
                        assert!(from >= 30, "record {from} is outside a window of 10");
                    }
                }
                None => assert!(from < 30, "record {from} is in the window"),
            }
        }
    }
    assert_eq!(
        answered_in_memory,
        10 * 4,
        "every read of the last 10 records"
    );
}

/// Goal: retention is never hidden by the window: a record it deleted is out of range in
/// memory too. Method: a partition whose every record is in the window loses its first
/// five to retention by age; a read of them is `OutOfRange`, a read after them still
/// answered from memory.
#[tokio::test]
async fn the_window_of_recent_records_respects_retention() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::default());
    let mut cfg = clocked(dir.path(), &clock);
    cfg.default_partitions = 1;
    cfg.retention_ms = Some(2_000);
    let log = EmbeddedLog::open(cfg).unwrap();
    let t = topic("aging");
    clock.set(1_000);
    log.append(&t, (0..5).map(|i| item(None, vec![i; 10])).collect())
        .await
        .unwrap();
    clock.set(5_000);
    log.append(&t, (5..10).map(|i| item(None, vec![i; 10])).collect())
        .await
        .unwrap();
    assert!(matches!(
        log.read_recent(&t, 0, 0, 10, usize::MAX),
        Some(ReadResult::Records { ref records, .. }) if records.len() == 10
    ));
    let report = log.enforce_retention(6_000).unwrap();
    assert_eq!(report.truncated.len(), 1);
    assert_eq!(
        log.read_recent(&t, 0, 2, 10, usize::MAX),
        Some(ReadResult::OutOfRange {
            earliest: 5,
            end: 10
        })
    );
    assert_eq!(
        log.read_recent(&t, 0, 5, 10, usize::MAX),
        Some(log.read(&t, 0, 5, 10, usize::MAX).unwrap())
    );
}

/// Goal: `read_cache_bytes = 0` keeps nothing in memory: every read of a record goes to
/// the database (and still answers the same).
#[tokio::test]
async fn no_window_when_read_cache_bytes_is_zero() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = LogConfig::new(dir.path());
    cfg.default_partitions = 1;
    cfg.read_cache_bytes = 0;
    let log = EmbeddedLog::open(cfg).unwrap();
    let t = topic("none");
    log.append(&t, vec![item(None, "a"), item(None, "b")])
        .await
        .unwrap();
    assert_eq!(log.read_recent(&t, 0, 0, 10, usize::MAX), None);
    assert_eq!(
        log.read_recent(&t, 0, 2, 10, usize::MAX),
        Some(log.read(&t, 0, 2, 10, usize::MAX).unwrap()),
        "at the end, memory still answers (nothing to read)"
    );
    assert_eq!(read_all(&log, &t, 0).len(), 2);
}

/// The first offset at or after `time_ms` in `times` (one append time per offset from
/// `earliest`), else the end: what `offset_for_time` must answer.
fn first_at_or_after(times: &[(Offset, u64)], end: Offset, time_ms: u64) -> Offset {
    times
        .iter()
        .find(|(_, t)| *t >= time_ms)
        .map_or(end, |(o, _)| *o)
}

/// Every time worth asking about: each stored time, one ms either side, each second's
/// edges, before everything and far after.
fn probe_times(times: &[(Offset, u64)]) -> Vec<u64> {
    let mut probes: BTreeSet<u64> = [0, 1, u64::MAX / 2, u64::MAX].into();
    for (_, t) in times {
        for p in [
            t.saturating_sub(1),
            *t,
            t + 1,
            t / 1_000 * 1_000,
            t / 1_000 * 1_000 + 999,
        ] {
            probes.insert(p);
        }
    }
    probes.into_iter().collect()
}

fn check_every_probe(log: &EmbeddedLog, t: &TopicName, times: &[(Offset, u64)], what: &str) {
    let (_, end) = log.offsets(t, 0).unwrap();
    for probe in probe_times(times) {
        assert_eq!(
            log.offset_for_time(t, 0, probe).unwrap(),
            first_at_or_after(times, end, probe),
            "{what}: time {probe}"
        );
    }
}

/// Goal: a seek by time finds the first record appended at or after the time — the
/// earliest for a time before every record, the end after them all — exactly to the
/// millisecond, with one time-index entry per second that had appends, before and after a
/// reopen. Method: 12 records over four seconds (several in one second, one second
/// skipped), every interesting time probed against a brute-force answer.
#[tokio::test]
async fn seek_by_time_finds_the_first_record_at_or_after_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::default());
    let t = topic("timed");
    let stamps = [
        1_000, 1_000, 1_400, 1_999, 2_000, 2_500, 2_500, 2_501, 4_100, 4_900, 4_900, 5_000,
    ];
    let mut times = Vec::new();
    {
        let log = EmbeddedLog::open(clocked(dir.path(), &clock)).unwrap();
        log.create_topic(&t, 1).unwrap();
        assert_eq!(
            log.offset_for_time(&t, 0, 1_000).unwrap(),
            0,
            "empty: the end"
        );
        for (offset, ms) in stamps.iter().enumerate() {
            clock.set(*ms);
            log.append(&t, vec![item(None, format!("r{offset}"))])
                .await
                .unwrap();
            times.push((offset as Offset, *ms));
        }
        check_every_probe(&log, &t, &times, "open");
        assert_eq!(
            log.time_index_entries(&t, 0),
            vec![(1, 0), (2, 4), (4, 8), (5, 11)],
            "one entry per second with appends, naming its first record"
        );
        assert!(matches!(
            log.offset_for_time(&t, 1, 0),
            Err(LogError::UnknownPartition { .. })
        ));
        assert!(matches!(
            log.offset_for_time(&topic("nope"), 0, 0),
            Err(LogError::UnknownTopic(_))
        ));
        log.close().unwrap();
    }
    let log = EmbeddedLog::open(clocked(dir.path(), &clock)).unwrap();
    check_every_probe(&log, &t, &times, "reopened");
    // Appends after the reopen continue the index where it was: still in second 5, no new
    // entry; second 7 gets one.
    for ms in [5_500, 7_000] {
        clock.set(ms);
        let placed = log.append(&t, vec![item(None, "late")]).await.unwrap();
        times.push((placed[0].1, ms));
    }
    assert_eq!(
        log.time_index_entries(&t, 0),
        vec![(1, 0), (2, 4), (4, 8), (5, 11), (7, 13)]
    );
    check_every_probe(&log, &t, &times, "appended after the reopen");
}

/// Goal: the index only narrows the search, so answers stay exact without it (a log
/// written before it existed) and when the wall clock steps back (stored times stay
/// non-decreasing, so the step-back records count as appended at the earlier time).
/// Method: 400 records at pseudo-random steps of 0 to 1.5 s with two step-backs, probed
/// with and without the index.
#[tokio::test]
async fn seek_by_time_is_exact_without_the_index_and_across_clock_step_backs() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::default());
    let log = EmbeddedLog::open(clocked(dir.path(), &clock)).unwrap();
    let t = topic("stepped");
    log.create_topic(&t, 1).unwrap();
    let mut wall = 1_700_000_000_000u64;
    let mut stored = 0u64;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut times = Vec::new();
    for i in 0..400u64 {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        wall += seed % 1_500;
        if i == 100 || i == 250 {
            wall -= 4_000; // the wall clock steps back
        }
        clock.set(wall);
        stored = stored.max(wall);
        let batch = 1 + (seed % 3) as usize;
        let placed = log
            .append(&t, (0..batch).map(|_| item(None, "x")).collect())
            .await
            .unwrap();
        times.extend(placed.iter().map(|(_, o)| (*o, stored)));
    }
    check_every_probe(&log, &t, &times, "indexed");
    let entries = log.time_index_entries(&t, 0);
    let seconds: BTreeSet<u64> = times.iter().map(|(_, ms)| ms / 1_000).collect();
    assert_eq!(
        entries.len(),
        seconds.len(),
        "one entry per second with appends"
    );
    log.drop_time_index(&t, 0);
    assert!(log.time_index_entries(&t, 0).is_empty());
    check_every_probe(&log, &t, &times, "without the index");
}

/// Goal: retention takes the index entries of the seconds it deleted (so the index stays as
/// bounded as the records), a time before the new earliest answers the new earliest, and a
/// partition retention emptied answers its end. Method: records in seconds 1, 2 and 6,
/// retention at 4 s keeps second 6, then at 20 s keeps nothing.
#[tokio::test]
async fn retention_deletes_the_index_entries_of_the_seconds_it_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::default());
    let mut cfg = clocked(dir.path(), &clock);
    cfg.retention_ms = Some(2_000);
    let log = EmbeddedLog::open(cfg).unwrap();
    let t = topic("kept");
    log.create_topic(&t, 1).unwrap();
    for ms in [1_100, 1_200, 2_300, 6_000, 6_500] {
        clock.set(ms);
        log.append(&t, vec![item(None, "x")]).await.unwrap();
    }
    assert_eq!(log.time_index_entries(&t, 0), vec![(1, 0), (2, 2), (6, 3)]);
    log.enforce_retention(5_000).unwrap();
    assert_eq!(log.offsets(&t, 0).unwrap(), (3, 5));
    assert_eq!(log.time_index_entries(&t, 0), vec![(6, 3)]);
    assert_eq!(
        log.offset_for_time(&t, 0, 0).unwrap(),
        3,
        "before: the earliest"
    );
    assert_eq!(log.offset_for_time(&t, 0, 6_200).unwrap(), 4);
    assert_eq!(
        log.offset_for_time(&t, 0, 9_000).unwrap(),
        5,
        "after: the end"
    );
    log.enforce_retention(20_000).unwrap();
    assert_eq!(log.offsets(&t, 0).unwrap(), (5, 5));
    assert!(log.time_index_entries(&t, 0).is_empty());
    assert_eq!(log.offset_for_time(&t, 0, 0).unwrap(), 5, "empty: the end");
    clock.set(21_000);
    log.append(&t, vec![item(None, "y")]).await.unwrap();
    assert_eq!(log.time_index_entries(&t, 0), vec![(21, 5)]);
    assert_eq!(log.offset_for_time(&t, 0, 0).unwrap(), 5);
    assert_eq!(log.offset_for_time(&t, 0, 21_001).unwrap(), 6);
}

/// Goal: `appended_since` (the refill of the publish dedup window at start) reads a
/// partition backwards from its end, newest first, stopping at the first record older than
/// asked, at `max`, and at the earliest retained record — after a reopen too. Method: a
/// hand-moved clock stamps three generations of records; retention deletes the oldest.
#[tokio::test]
async fn appended_since_reads_the_newest_back_to_a_time_and_a_count() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::default());
    let t = topic("recent");
    {
        let log = EmbeddedLog::open(clocked(dir.path(), &clock)).unwrap();
        log.create_topic(&t, 1).unwrap();
        assert!(log.appended_since(&t, 0, 0, 10).unwrap().is_empty());
        for (at, n) in [(1_000, 3), (2_000, 2), (3_000, 2)] {
            clock.set(at);
            log.append(
                &t,
                (0..n).map(|i| item(None, format!("{at}-{i}"))).collect(),
            )
            .await
            .unwrap();
        }
    }
    let log = EmbeddedLog::open(clocked(dir.path(), &clock)).unwrap();
    let got = |since, max| -> Vec<(u64, Offset)> {
        log.appended_since(&t, 0, since, max)
            .unwrap()
            .into_iter()
            .map(|(at, o, _)| (at, o))
            .collect()
    };
    assert_eq!(
        got(2_000, 100),
        [(3_000, 6), (3_000, 5), (2_000, 4), (2_000, 3)]
    );
    assert_eq!(got(0, 3), [(3_000, 6), (3_000, 5), (2_000, 4)]);
    assert_eq!(got(3_001, 100), []);
    let (_, o, payload) = log.appended_since(&t, 0, 0, 1).unwrap().remove(0);
    assert_eq!((o, payload), (6, Bytes::from("3000-1")));
    let mut cfg = clocked(dir.path(), &clock);
    cfg.retention_ms = Some(1_500);
    drop(log);
    let log = EmbeddedLog::open(cfg).unwrap();
    log.enforce_retention(3_000).unwrap();
    let all: Vec<Offset> = log
        .appended_since(&t, 0, 0, 100)
        .unwrap()
        .into_iter()
        .map(|r| r.1)
        .collect();
    assert_eq!(all, [6, 5, 4, 3], "retention's deletions are not read back");
    assert!(matches!(
        log.appended_since(&topic("nope"), 0, 0, 1),
        Err(LogError::UnknownTopic(_))
    ));
}
