//! The contract every state store keeps, run against each backend.
//!
//! Each scenario is a generic function over [`Backend`]; `contract_suite!` instantiates all
//! of them per backend, so a new backend gets the whole suite with one line. Reopen cases
//! use the same directory (or, for memory, the same shared disk). The crash case for the
//! on-disk backends runs the writer in a child process and SIGKILLs it mid-stream.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use tempfile::TempDir;
use unimesh_core::{
    Backoff, Checkpoint, DeadLetter, DeadLetterReason, DlqKey, EventMeta, Filter, GroupName,
    LaneCheckpoint, Ordering, Partition, PersistBatch, Progress, RateRule, Record, StartFrom,
    SubscriptionSpec, TopicName,
};

use super::{
    keys, DlqEntry, Kv, MemoryDisk, MemoryStore, Op, RocksStore, SledStore, StateStore, StoreError,
};

/// A backend under test: something that can be opened again on the same storage.
trait Backend: Sized {
    type Store: StateStore + Kv;
    fn fresh() -> Self;
    fn open(&self) -> Self::Store;
    /// Loses the store the way a crashed process does: no close, no flush, no destructor
    /// beyond what the OS would do.
    fn crash(store: Self::Store);
}

struct Rocks(TempDir);
struct Sled(TempDir);
struct Memory(MemoryDisk);

impl Backend for Rocks {
    type Store = RocksStore;
    fn fresh() -> Self {
        Rocks(tempfile::tempdir().unwrap())
    }
    fn open(&self) -> RocksStore {
        RocksStore::open(self.0.path()).unwrap()
    }
    fn crash(store: RocksStore) {
        // Leaking would keep RocksDB's in-process lock, so the in-process variant drops;
        // `crash_mid_stream_keeps_every_acknowledged_batch` covers a real kill.
        drop(store)
    }
}

impl Backend for Sled {
    type Store = SledStore;
    fn fresh() -> Self {
        Sled(tempfile::tempdir().unwrap())
    }
    fn open(&self) -> SledStore {
        SledStore::open(self.0.path()).unwrap()
    }
    fn crash(store: SledStore) {
        drop(store)
    }
}

impl Backend for Memory {
    type Store = MemoryStore;
    fn fresh() -> Self {
        Memory(MemoryDisk::new())
    }
    fn open(&self) -> MemoryStore {
        MemoryStore::open(self.0.clone())
    }
    fn crash(store: MemoryStore) {
        std::mem::forget(store)
    }
}

// ---------------------------------------------------------------------------------------
// Sample data

fn g(s: &str) -> GroupName {
    GroupName::new(s).unwrap()
}

fn t(s: &str) -> TopicName {
    TopicName::new(s).unwrap()
}

fn spec(group: &str, topic: &str) -> SubscriptionSpec {
    SubscriptionSpec::new(g(group), t(topic))
}

/// A spec with every setting away from its default.
fn rich_spec(group: &str) -> SubscriptionSpec {
    let mut s = spec(group, "orders");
    s.filter = Filter {
        ty: Some("order.created".into()),
        type_prefix: Some("order.".into()),
        source: Some("/shop".into()),
        subject: Some("eu/42".into()),
        subject_prefix: Some("eu/".into()),
        extensions: vec![
            ("region".into(), "eu".into()),
            ("tier".into(), "gold".into()),
        ],
    };
    s.ordering = Ordering::Key;
    s.ack_timeout_ms = 1_234;
    s.max_attempts = 7;
    s.backoff = Backoff {
        initial_ms: 3,
        max_ms: 900,
        multiplier: 1.7,
    };
    s.max_in_flight_per_client = 9;
    s.start_from = StartFrom::Latest(BTreeMap::from([(0, 10), (1, 0), (7, u64::MAX)]));
    s.push_url = Some("https://hooks.example.com/x".into());
    s
}

fn checkpoint(watermark: u64) -> Checkpoint {
    let mut progress = Progress::new(watermark);
    progress.mark_done(watermark + 2);
    progress.mark_done(watermark + 3);
    progress.mark_done(watermark + 10);
    Checkpoint {
        progress,
        attempts: vec![(watermark, 3), (watermark + 1, 2)],
    }
}

fn lane(group: &str, partition: Partition, watermark: u64) -> LaneCheckpoint {
    LaneCheckpoint {
        group: g(group),
        topic: t("orders"),
        partition,
        checkpoint: checkpoint(watermark),
    }
}

fn dlq_key(group: &str, partition: Partition, offset: u64) -> DlqKey {
    DlqKey {
        group: g(group),
        partition,
        offset,
    }
}

fn dead(group: &str, partition: Partition, offset: u64) -> DeadLetter {
    DeadLetter {
        key: dlq_key(group, partition, offset),
        topic: t("orders"),
        record: Record::event(
            offset,
            EventMeta::default(),
            Bytes::from(format!("body {group} {partition} {offset}")),
        ),
        attempts: 4,
        reason: DeadLetterReason::Nacked,
    }
}

/// Everything a store shows, for whole-state comparisons.
#[derive(Debug, PartialEq)]
struct Snapshot {
    epoch: u32,
    subscriptions: Vec<SubscriptionSpec>,
    checkpoints: Vec<(GroupName, Partition, Checkpoint)>,
    rate_rules: Vec<(TopicName, RateRule)>,
    dlq: BTreeMap<GroupName, Vec<DlqEntry>>,
}

fn snapshot(store: &impl StateStore, groups: &[&str]) -> Snapshot {
    let loaded = store.load().unwrap();
    let dlq = groups
        .iter()
        .map(|name| (g(name), store.dlq_list(&g(name), None, usize::MAX).unwrap()))
        .collect();
    Snapshot {
        epoch: loaded.recovered.epoch,
        subscriptions: loaded.recovered.subscriptions,
        checkpoints: loaded.recovered.checkpoints,
        rate_rules: loaded.rate_rules,
        dlq,
    }
}

/// A batch that touches every field.
fn full_batch() -> PersistBatch {
    PersistBatch {
        epoch: Some(3),
        removed_groups: vec![g("gone")],
        subscriptions: vec![rich_spec("g1"), spec("g2", "audit")],
        checkpoints: vec![lane("g1", 0, 100), lane("g1", 5, 7), lane("g2", 0, 0)],
        dead_letters: vec![dead("g1", 0, 99), dead("g1", 5, 3)],
        dlq_resolved: vec![dlq_key("g2", 0, 1)],
    }
}

// ---------------------------------------------------------------------------------------
// Scenarios

/// Goal: every field of a batch reads back exactly. Method: apply one batch with all of
/// them, then replacement writes, and compare `load` and `dlq_list` with what was written.
fn round_trip_of_every_field<B: Backend>() {
    let b = B::fresh();
    let mut store = b.open();
    let fresh = store.load().unwrap();
    assert_eq!(fresh.recovered.epoch, 0);
    assert!(fresh.recovered.subscriptions.is_empty());
    assert!(fresh.recovered.checkpoints.is_empty());
    assert!(fresh.rate_rules.is_empty());

    store.apply(&full_batch(), 1_000).unwrap();
    let loaded = store.load().unwrap();
    assert_eq!(loaded.recovered.epoch, 3);
    assert_eq!(
        loaded.recovered.subscriptions,
        vec![rich_spec("g1"), spec("g2", "audit")]
    );
    assert_eq!(
        loaded.recovered.checkpoints,
        vec![
            (g("g1"), 0, checkpoint(100)),
            (g("g1"), 5, checkpoint(7)),
            (g("g2"), 0, checkpoint(0)),
        ]
    );
    let entries = store.dlq_list(&g("g1"), None, 10).unwrap();
    assert_eq!(entries.len(), 2);
    for (e, d) in entries.iter().zip([dead("g1", 0, 99), dead("g1", 5, 3)]) {
        assert_eq!(e.key, d.key);
        assert_eq!(e.topic, d.topic);
        assert_eq!(e.body, d.record.body);
        assert_eq!(e.attempts, 4);
        assert_eq!(e.reason, "nacked");
        assert_eq!(e.dead_lettered_at_ms, 1_000);
    }

    // Upserts and replacements: a changed spec, a moved checkpoint, a re-written dead
    // letter (new attempts, reason and time), a resolved one, a higher epoch.
    let mut changed = rich_spec("g1");
    changed.max_attempts = 2;
    changed.push_url = None;
    let mut again = dead("g1", 5, 3);
    again.attempts = 9;
    again.reason = DeadLetterReason::Undecodable("not json".into());
    store
        .apply(
            &PersistBatch {
                epoch: Some(4),
                subscriptions: vec![changed.clone()],
                checkpoints: vec![lane("g1", 0, 250)],
                dead_letters: vec![again],
                dlq_resolved: vec![dlq_key("g1", 0, 99)],
                ..Default::default()
            },
            2_000,
        )
        .unwrap();
    let loaded = store.load().unwrap();
    assert_eq!(loaded.recovered.epoch, 4);
    assert_eq!(
        loaded.recovered.subscriptions,
        vec![changed, spec("g2", "audit")]
    );
    assert_eq!(
        loaded.recovered.checkpoints[0],
        (g("g1"), 0, checkpoint(250))
    );
    let entries = store.dlq_list(&g("g1"), None, 10).unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].key, dlq_key("g1", 5, 3));
    assert_eq!(entries[0].attempts, 9);
    assert_eq!(entries[0].reason, "undecodable: not json");
    assert_eq!(entries[0].dead_lettered_at_ms, 2_000);

    // Rate rules: set, replace, remove.
    let rule = |eps, burst| RateRule {
        events_per_second: eps,
        burst,
    };
    store
        .put_rate_rule(&t("orders"), Some(rule(10, 20)))
        .unwrap();
    store.put_rate_rule(&t("audit"), Some(rule(1, 1))).unwrap();
    store
        .put_rate_rule(&t("orders"), Some(rule(5, 50)))
        .unwrap();
    assert_eq!(
        store.load().unwrap().rate_rules,
        vec![(t("audit"), rule(1, 1)), (t("orders"), rule(5, 50))]
    );
    store.put_rate_rule(&t("audit"), None).unwrap();
    assert_eq!(
        store.load().unwrap().rate_rules,
        vec![(t("orders"), rule(5, 50))]
    );
    // Removing a rule that does not exist is not an error.
    store.put_rate_rule(&t("audit"), None).unwrap();
}

/// Goal: the order inside a batch is removed groups, subscriptions, checkpoints, dead
/// letters, resolutions — so a group removed and re-created in one batch keeps only the
/// new state, and a dead letter resolved in the same batch is gone.
fn order_inside_a_batch<B: Backend>() {
    let b = B::fresh();
    let mut store = b.open();
    store.apply(&full_batch(), 1).unwrap();
    let mut recreated = spec("g1", "orders");
    recreated.max_attempts = 1;
    store
        .apply(
            &PersistBatch {
                removed_groups: vec![g("g1")],
                subscriptions: vec![recreated.clone()],
                checkpoints: vec![lane("g1", 9, 1)],
                dead_letters: vec![dead("g1", 9, 0), dead("g1", 9, 1)],
                dlq_resolved: vec![dlq_key("g1", 9, 0)],
                ..Default::default()
            },
            2,
        )
        .unwrap();
    let loaded = store.load().unwrap();
    assert_eq!(
        loaded.recovered.subscriptions,
        vec![recreated, spec("g2", "audit")]
    );
    assert_eq!(
        loaded.recovered.checkpoints,
        vec![(g("g1"), 9, checkpoint(1)), (g("g2"), 0, checkpoint(0))]
    );
    let keys: Vec<DlqKey> = store
        .dlq_list(&g("g1"), None, 10)
        .unwrap()
        .into_iter()
        .map(|e| e.key)
        .collect();
    assert_eq!(keys, vec![dlq_key("g1", 9, 1)]);
}

/// Goal: a batch that fails leaves nothing behind. Method: a batch carrying every kind of
/// write plus an epoch below the stored one must be refused before anything is written.
fn refused_batch_leaves_nothing<B: Backend>() {
    let b = B::fresh();
    let mut store = b.open();
    store
        .apply(
            &PersistBatch {
                epoch: Some(5),
                subscriptions: vec![spec("keep", "orders")],
                checkpoints: vec![lane("keep", 0, 1)],
                dead_letters: vec![dead("keep", 0, 0)],
                ..Default::default()
            },
            1,
        )
        .unwrap();
    let groups = ["keep", "g1", "g2"];
    let before = snapshot(&store, &groups);
    let mut bad = full_batch();
    bad.epoch = Some(4);
    bad.removed_groups = vec![g("keep")];
    match store.apply(&bad, 2) {
        Err(StoreError::EpochRegression {
            stored: 5,
            requested: 4,
        }) => {}
        other => panic!("expected an epoch regression, got {other:?}"),
    }
    assert_eq!(snapshot(&store, &groups), before);
    drop(store);
    assert_eq!(snapshot(&b.open(), &groups), before);
}

/// Goal: removing a group deletes its subscription, checkpoints and DLQ entries and
/// nothing of any other group, including groups whose names extend it ("a" vs "a.b").
fn removed_group_takes_only_its_own_state<B: Backend>() {
    let b = B::fresh();
    let mut store = b.open();
    let names = ["a", "a.b", "a-", "a0", "b", "A"];
    let mut batch = PersistBatch::default();
    for (i, name) in names.iter().enumerate() {
        batch.subscriptions.push(spec(name, "orders"));
        for p in [0, 1, 255, 256, u32::MAX - 1] {
            batch.checkpoints.push(lane(name, p, i as u64));
            batch.dead_letters.push(dead(name, p, 0));
            batch.dead_letters.push(dead(name, p, u64::MAX));
        }
    }
    store.apply(&batch, 1).unwrap();
    let before = snapshot(&store, &names);
    store
        .apply(
            &PersistBatch {
                removed_groups: vec![g("a")],
                ..Default::default()
            },
            2,
        )
        .unwrap();
    let after = snapshot(&store, &names);
    let mut want = before;
    want.subscriptions.retain(|s| s.group != g("a"));
    want.checkpoints.retain(|(grp, _, _)| *grp != g("a"));
    want.dlq.insert(g("a"), Vec::new());
    assert_eq!(after, want);
    assert_eq!(store.dlq_count(&g("a")).unwrap(), 0);
    assert_eq!(store.dlq_count(&g("a.b")).unwrap(), 10);
    // Removing a group that does not exist is a no-op, not an error.
    store
        .apply(
            &PersistBatch {
                removed_groups: vec![g("never")],
                ..Default::default()
            },
            3,
        )
        .unwrap();
    assert_eq!(snapshot(&store, &names), want);
}

/// Goal: DLQ pages come in (partition, offset) order, numerically (not by decimal text),
/// paging with the last key as cursor visits every entry exactly once, and the count is
/// right; cursors of another group are refused.
fn dlq_list_orders_pages_and_counts<B: Backend>() {
    let b = B::fresh();
    let mut store = b.open();
    let mut positions: Vec<(Partition, u64)> = Vec::new();
    for p in [0u32, 1, 2, 10, 256] {
        for o in [0u64, 1, 9, 10, 255, 256, 1_000_000, u64::MAX] {
            positions.push((p, o));
        }
    }
    // Written out of order, across batches, with a neighbouring group in between.
    let mut scrambled = positions.clone();
    scrambled.reverse();
    scrambled.rotate_left(7);
    for chunk in scrambled.chunks(6) {
        let mut batch = PersistBatch::default();
        for &(p, o) in chunk {
            batch.dead_letters.push(dead("g", p, o));
            batch.dead_letters.push(dead("g.x", p, o));
        }
        store.apply(&batch, 5).unwrap();
    }
    assert_eq!(store.dlq_count(&g("g")).unwrap(), positions.len() as u64);
    assert_eq!(store.dlq_count(&g("nobody")).unwrap(), 0);

    for page in [1usize, 3, 7, 40, 1000] {
        let mut seen = Vec::new();
        let mut cursor: Option<DlqKey> = None;
        loop {
            let entries = store.dlq_list(&g("g"), cursor.as_ref(), page).unwrap();
            assert!(entries.len() <= page);
            let Some(last) = entries.last() else { break };
            cursor = Some(last.key.clone());
            seen.extend(entries.into_iter().map(|e| {
                assert_eq!(e.key.group, g("g"));
                (e.key.partition, e.key.offset)
            }));
        }
        assert_eq!(seen, positions, "page size {page}");
    }
    assert!(store.dlq_list(&g("g"), None, 0).unwrap().is_empty());

    // A cursor past the last entry gives an empty page; one of another group is refused.
    let last = dlq_key("g", 256, u64::MAX);
    assert!(store.dlq_list(&g("g"), Some(&last), 5).unwrap().is_empty());
    let foreign = dlq_key("g.x", 0, 0);
    assert!(matches!(
        store.dlq_list(&g("g"), Some(&foreign), 5),
        Err(StoreError::CursorGroupMismatch { .. })
    ));

    // Writing an existing key again replaces it and does not add an entry.
    store
        .apply(
            &PersistBatch {
                dead_letters: vec![dead("g", 0, 0)],
                dlq_resolved: vec![dlq_key("g", 10, 9), dlq_key("g", 77, 77)],
                ..Default::default()
            },
            6,
        )
        .unwrap();
    assert_eq!(
        store.dlq_count(&g("g")).unwrap(),
        positions.len() as u64 - 1
    );
    let first = &store.dlq_list(&g("g"), None, 1).unwrap()[0];
    assert_eq!((first.key.partition, first.key.offset), (0, 0));
    assert_eq!(first.dead_lettered_at_ms, 6);
}

/// Goal: what was applied survives closing and reopening, and the reopened store keeps
/// working (writes, epoch checks).
fn reopen_after_close<B: Backend>() {
    let b = B::fresh();
    let groups = ["g1", "g2"];
    let mut store = b.open();
    store.apply(&full_batch(), 10).unwrap();
    store
        .put_rate_rule(
            &t("orders"),
            Some(RateRule {
                events_per_second: 3,
                burst: 4,
            }),
        )
        .unwrap();
    let before = snapshot(&store, &groups);
    drop(store);

    let mut store = b.open();
    assert_eq!(snapshot(&store, &groups), before);
    store
        .apply(
            &PersistBatch {
                epoch: Some(4),
                checkpoints: vec![lane("g2", 0, 50)],
                ..Default::default()
            },
            11,
        )
        .unwrap();
    assert!(matches!(
        store.apply(
            &PersistBatch {
                epoch: Some(2),
                ..Default::default()
            },
            12
        ),
        Err(StoreError::EpochRegression { stored: 4, .. })
    ));
    drop(store);
    let loaded = b.open().load().unwrap();
    assert_eq!(loaded.recovered.epoch, 4);
    assert_eq!(
        loaded.recovered.checkpoints[2],
        (g("g2"), 0, checkpoint(50))
    );
}

/// Goal: a store lost without any close call (a crash) keeps every batch `apply` returned
/// Ok for. Method: many small batches, each Ok'd, then the store is crashed and reopened.
fn drop_without_flush_keeps_every_ok_batch<B: Backend>() {
    let b = B::fresh();
    let mut store = b.open();
    for i in 0..50u64 {
        let batch = PersistBatch {
            epoch: Some(i as u32 + 1),
            subscriptions: vec![spec(&format!("g{i}"), "orders")],
            checkpoints: vec![lane("g0", 0, i)],
            dead_letters: vec![dead("g0", 0, i)],
            ..Default::default()
        };
        store.apply(&batch, i).unwrap();
    }
    B::crash(store);
    let store = b.open();
    let loaded = store.load().unwrap();
    assert_eq!(loaded.recovered.epoch, 50);
    assert_eq!(loaded.recovered.subscriptions.len(), 50);
    assert_eq!(
        loaded.recovered.checkpoints,
        vec![(g("g0"), 0, checkpoint(49))]
    );
    assert_eq!(store.dlq_count(&g("g0")).unwrap(), 50);
}

/// Goal: corrupt stored bytes make `load` (or `dlq_list`) fail with an error naming the key,
/// never a panic. Method: write raw bad values (and bad keys) under each kind of key.
fn corrupt_bytes_are_named_errors<B: Backend>() {
    let b = B::fresh();
    let mut store = b.open();
    store.apply(&full_batch(), 1).unwrap();
    let good_ckpt = checkpoint(100).encode();
    let mut flipped = good_ckpt.clone();
    flipped[10] ^= 0x40;
    let sub_key = keys::subscription(&g("g1"));
    let cases: Vec<(Vec<u8>, Vec<u8>, &str)> = vec![
        (keys::EPOCH.to_vec(), vec![], "epoch"),
        (keys::EPOCH.to_vec(), vec![1, 2], "epoch"),
        (keys::EPOCH.to_vec(), vec![7, 0, 0, 0, 0], "epoch"),
        (
            sub_key.clone(),
            b"\x01{not json".to_vec(),
            "subscription/g1",
        ),
        (sub_key.clone(), b"\x02{}".to_vec(), "subscription/g1"),
        (
            sub_key,
            b"\x01{\"group\":\"g1\"}".to_vec(),
            "subscription/g1",
        ),
        (keys::checkpoint(&g("g1"), 0), flipped, "checkpoint/g1/0"),
        (
            keys::checkpoint(&g("g1"), 5),
            good_ckpt[..good_ckpt.len() - 1].to_vec(),
            "checkpoint/g1/5",
        ),
        // A key of the checkpoint kind whose partition is cut short.
        (b"c/g1\0\x01".to_vec(), good_ckpt.clone(), "c/g1\\x00\\x01"),
        // A group name outside the alphabet.
        (b"c/g 1\0\0\0\0\0".to_vec(), good_ckpt, "c/g 1\\x00"),
        (
            keys::rate_rule(&t("orders")),
            vec![1, 0, 0],
            "ratelimit/orders",
        ),
    ];
    for (key, value, named) in cases {
        let b2 = B::fresh();
        let mut s = b2.open();
        s.apply(&full_batch(), 1).unwrap();
        s.kv_commit(&[Op::Put {
            key: key.clone(),
            value,
        }])
        .unwrap();
        drop(s);
        let s = b2.open();
        match s.load() {
            Err(StoreError::Corrupt { key: k, why }) => {
                assert!(k.starts_with(named), "{k} does not name {named} ({why})")
            }
            other => panic!("{} accepted: {other:?}", key.escape_ascii()),
        }
    }

    // DLQ values are not read by `load`; `dlq_list` reports them.
    let dkey = keys::dlq(&dlq_key("g1", 5, 3));
    let mut value = store
        .kv_get(&dkey)
        .unwrap()
        .expect("the dead letter was written");
    let n = value.len();
    value[n / 2] ^= 1;
    store.kv_commit(&[Op::Put { key: dkey, value }]).unwrap();
    match store.dlq_list(&g("g1"), None, 10) {
        Err(StoreError::Corrupt { key, .. }) => assert_eq!(key, "dlq/g1/5/3"),
        other => panic!("corrupt DLQ entry accepted: {other:?}"),
    }
    // Counting does not read values, so it still works and the entry can be resolved.
    assert_eq!(store.dlq_count(&g("g1")).unwrap(), 2);
    store
        .apply(
            &PersistBatch {
                dlq_resolved: vec![dlq_key("g1", 5, 3)],
                ..Default::default()
            },
            2,
        )
        .unwrap();
    assert_eq!(store.dlq_list(&g("g1"), None, 10).unwrap().len(), 1);
}

/// Goal: an empty batch is accepted and changes nothing.
fn empty_batch_is_a_no_op<B: Backend>() {
    let b = B::fresh();
    let mut store = b.open();
    store.apply(&full_batch(), 1).unwrap();
    let before = snapshot(&store, &["g1", "g2"]);
    store.apply(&PersistBatch::default(), 2).unwrap();
    assert_eq!(snapshot(&store, &["g1", "g2"]), before);
}

macro_rules! contract_suite {
    ($module:ident, $backend:ty) => {
        mod $module {
            use super::*;

            #[test]
            fn round_trip_of_every_field() {
                super::round_trip_of_every_field::<$backend>();
            }

            #[test]
            fn order_inside_a_batch() {
                super::order_inside_a_batch::<$backend>();
            }

            #[test]
            fn refused_batch_leaves_nothing() {
                super::refused_batch_leaves_nothing::<$backend>();
            }

            #[test]
            fn removed_group_takes_only_its_own_state() {
                super::removed_group_takes_only_its_own_state::<$backend>();
            }

            #[test]
            fn dlq_list_orders_pages_and_counts() {
                super::dlq_list_orders_pages_and_counts::<$backend>();
            }

            #[test]
            fn reopen_after_close() {
                super::reopen_after_close::<$backend>();
            }

            #[test]
            fn drop_without_flush_keeps_every_ok_batch() {
                super::drop_without_flush_keeps_every_ok_batch::<$backend>();
            }

            #[test]
            fn corrupt_bytes_are_named_errors() {
                super::corrupt_bytes_are_named_errors::<$backend>();
            }

            #[test]
            fn empty_batch_is_a_no_op() {
                super::empty_batch_is_a_no_op::<$backend>();
            }
        }
    };
}

contract_suite!(memory, Memory);
contract_suite!(rocks, Rocks);
contract_suite!(sled, Sled);

// ---------------------------------------------------------------------------------------
// Backend-specific cases

/// Goal: one `apply` is one commit, and a commit that fails leaves nothing and does not
/// poison the store. Method: the memory disk's injected write failure.
#[test]
fn memory_failed_commit_leaves_nothing_and_store_recovers() {
    let b = Memory::fresh();
    let mut store = b.open();
    store.apply(&full_batch(), 1).unwrap();
    assert_eq!(b.0.commits(), 1);
    let before = snapshot(&store, &["g1", "g2", "x"]);
    b.0.fail_next_commits(1);
    let batch = PersistBatch {
        epoch: Some(9),
        removed_groups: vec![g("g1")],
        subscriptions: vec![spec("x", "orders")],
        checkpoints: vec![lane("x", 0, 1)],
        dead_letters: vec![dead("x", 0, 0)],
        dlq_resolved: vec![dlq_key("g1", 0, 99)],
    };
    assert!(matches!(
        store.apply(&batch, 2),
        Err(StoreError::Io {
            backend: "memory",
            ..
        })
    ));
    assert_eq!(snapshot(&store, &["g1", "g2", "x"]), before);
    assert_eq!(b.0.commits(), 1);
    // The retry (as the core does after `PersistFailed`) goes through whole.
    store.apply(&batch, 3).unwrap();
    assert_eq!(b.0.commits(), 2);
    let after = snapshot(&store, &["g1", "g2", "x"]);
    assert_eq!(after.epoch, 9);
    assert!(after.dlq[&g("g1")].is_empty());
    assert_eq!(after.dlq[&g("x")].len(), 1);
}

#[test]
fn on_disk_stores_refuse_a_second_opener() {
    let dir = tempfile::tempdir().unwrap();
    let _first = RocksStore::open(dir.path()).unwrap();
    match RocksStore::open(dir.path()) {
        Err(StoreError::Io {
            backend: "rocksdb",
            op: "open",
            ..
        }) => {}
        other => panic!("second RocksDB opener accepted: {other:?}"),
    }
    // sled waits a bounded time for the lock (a dropped handle may still be releasing
    // it), then refuses too.
    let dir = tempfile::tempdir().unwrap();
    let _first = SledStore::open(dir.path()).unwrap();
    match SledStore::open(dir.path()) {
        Err(StoreError::Io {
            backend: "sled",
            op: "open",
            message,
        }) => assert!(message.contains("lock"), "{message}"),
        other => panic!("second sled opener accepted: {other:?}"),
    }
}

/// sled 0.34 releases its directory lock lazily after the last handle is dropped; a
/// restart in the same process (as these tests and an embedding application do) must not
/// fail on it.
#[test]
fn sled_reopens_at_once_after_a_drop_and_keeps_every_batch() {
    let dir = tempfile::tempdir().unwrap();
    for i in 0..40u64 {
        let mut store = SledStore::open(dir.path()).unwrap();
        let loaded = store.load().unwrap();
        assert_eq!(loaded.recovered.epoch, i as u32, "batch {i} was kept");
        store.apply(&crash_batch(i), i).unwrap();
        drop(store);
    }
}

/// The environment variable that turns a crash test into its own child writer.
const CRASH_CHILD_ENV: &str = "UNIMESH_STATE_CRASH_CHILD_DIR";
/// How many batches the parent waits to see acknowledged before it kills the child.
const CRASH_AFTER_OKS: u64 = 40;
const CRASH_MAX_BATCHES: u64 = 100_000;

/// Batch `i` of the crash stream: it moves the epoch to `i + 1`, replaces one checkpoint,
/// adds one DLQ entry. After a crash the store must hold a prefix of the stream: `n`
/// entries, epoch `n` and the checkpoint of batch `n - 1`, never a part of a batch.
fn crash_batch(i: u64) -> PersistBatch {
    PersistBatch {
        epoch: Some(i as u32 + 1),
        checkpoints: vec![lane("crash", (i % 4) as u32, i)],
        dead_letters: vec![dead("crash", 0, i)],
        ..Default::default()
    }
}

/// Child side: apply the stream, printing each acknowledged batch, until killed.
fn crash_child(store: &mut impl StateStore) -> ! {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    for i in 0..CRASH_MAX_BATCHES {
        store.apply(&crash_batch(i), i).unwrap();
        let _ = writeln!(out, "crash-ok {i}");
        let _ = out.flush();
    }
    std::process::abort()
}

/// Parent side: run this very test as a child writer, SIGKILL it once it acknowledged
/// `CRASH_AFTER_OKS` batches, reopen, and check that the store holds a whole prefix of
/// the stream that includes every acknowledged batch.
fn crash_mid_stream<S: StateStore>(test_name: &str, open: impl Fn(&std::path::Path) -> S) {
    use std::io::BufRead;
    use std::process::{Command, Stdio};

    if let Some(dir) = std::env::var_os(CRASH_CHILD_ENV) {
        let mut store = open(std::path::Path::new(&dir));
        crash_child(&mut store);
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CRASH_CHILD_ENV, dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut acked: Option<u64> = None;
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.unwrap();
        if let Some(n) = line.strip_prefix("crash-ok ") {
            let n: u64 = n.trim().parse().unwrap();
            acked = Some(n);
            if n + 1 >= CRASH_AFTER_OKS {
                child.kill().unwrap();
                break;
            }
        }
    }
    let _ = child.wait().unwrap();
    let acked = acked.expect("the child acknowledged no batch");
    assert!(acked + 1 >= CRASH_AFTER_OKS, "the child stopped early");

    let store = open(dir.path());
    let loaded = store.load().unwrap();
    let entries: BTreeSet<u64> = store
        .dlq_list(&g("crash"), None, usize::MAX)
        .unwrap()
        .into_iter()
        .map(|e| e.key.offset)
        .collect();
    let n = entries.len() as u64;
    assert!(
        n > acked,
        "acknowledged batch {acked} lost: only {n} batches kept"
    );
    assert_eq!(entries, (0..n).collect::<BTreeSet<u64>>(), "not a prefix");
    assert_eq!(
        u64::from(loaded.recovered.epoch),
        n,
        "epoch of a partial batch"
    );
    let last = n - 1;
    assert!(
        loaded
            .recovered
            .checkpoints
            .contains(&(g("crash"), (last % 4) as u32, checkpoint(last))),
        "checkpoint of the last kept batch missing"
    );
}

fn test_name(local: &str) -> String {
    let module = module_path!();
    let module = module.split_once("::").map_or(module, |(_, rest)| rest);
    format!("{module}::{local}")
}

#[test]
fn rocks_crash_mid_stream_keeps_every_acknowledged_batch() {
    crash_mid_stream(
        &test_name("rocks_crash_mid_stream_keeps_every_acknowledged_batch"),
        |p| RocksStore::open(p).unwrap(),
    );
}

#[test]
fn sled_crash_mid_stream_keeps_every_acknowledged_batch() {
    crash_mid_stream(
        &test_name("sled_crash_mid_stream_keeps_every_acknowledged_batch"),
        |p| SledStore::open(p).unwrap(),
    );
}
