//! A subscription's topic is prepared at the log off the engine task: a topic whose
//! creation is slow (a synced write on a busy disk, a broker far away) holds up only the
//! subscriptions behind it, never the deliveries, ACKs and polls of everyone else. The
//! same for a partition's end offsets that the log reads slowly (a broker round trip):
//! the views and seeks that want them wait, nothing else does.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use madsim_tokio as tokio;
use tokio::sync::{Notify, Semaphore};
use unimesh_core::{GroupName, Offset, Partition};

use super::{c, config, events, g, patient, t};
use super::{start, MemoryDisk, MemoryLog, MemoryStore, Settling, StoreAdapter, TopicName};
use crate::engine::ports::{BoxFut, LogPort, LogRead, StorageError, TopicFacts};
use crate::storage::log::AppendItem;

/// The in-memory log, whose preparation of the topics named in `held` says so on
/// `reached`, then waits for `open`; while `ends_held`, each answer to `offsets` is
/// counted in `ends_asked`, waits for a permit of `ends_open`, and claims an end
/// `HELD_SHIFT` past the log's (so a view shows which answer it took).
struct SlowTopics {
    inner: Arc<MemoryLog>,
    held: Mutex<BTreeSet<TopicName>>,
    reached: Notify,
    open: Arc<Notify>,
    ends_held: AtomicBool,
    ends_asked: AtomicUsize,
    ends_open: Arc<Semaphore>,
}

/// How far past the log's end a held `offsets` answer claims the end is.
const HELD_SHIFT: Offset = 100;

impl LogPort for SlowTopics {
    fn fetch(
        &self,
        group: GroupName,
        topic: TopicName,
        partition: Partition,
        from: Offset,
        max: usize,
        max_bytes: usize,
        wait_ms: u64,
    ) -> BoxFut<LogRead> {
        self.inner
            .fetch(group, topic, partition, from, max, max_bytes, wait_ms)
    }
    fn append(
        &self,
        topic: TopicName,
        items: Vec<AppendItem>,
    ) -> BoxFut<Result<Vec<(Partition, Offset)>, StorageError>> {
        self.inner.append(topic, items)
    }
    fn prepare_topic(
        &self,
        topic: TopicName,
        with_offsets: bool,
    ) -> BoxFut<Result<TopicFacts, StorageError>> {
        let held = self.held.lock().unwrap().contains(&topic);
        if held {
            self.reached.notify_one();
        }
        let (open, prepare) = (
            self.open.clone(),
            self.inner.prepare_topic(topic, with_offsets),
        );
        Box::pin(async move {
            if held {
                open.notified().await;
            }
            prepare.await
        })
    }
    fn partitions(&self, topic: TopicName) -> BoxFut<Option<u32>> {
        LogPort::partitions(&self.inner, topic)
    }
    fn offsets(
        &self,
        topic: TopicName,
        partition: Partition,
    ) -> BoxFut<Result<(Offset, Offset), StorageError>> {
        let range = LogPort::offsets(&self.inner, topic, partition);
        if !self.ends_held.load(Ordering::SeqCst) {
            return range;
        }
        self.ends_asked.fetch_add(1, Ordering::SeqCst);
        let open = self.ends_open.clone();
        Box::pin(async move {
            let _permit = open.acquire().await;
            range
                .await
                .map(|(earliest, end)| (earliest, end + HELD_SHIFT))
        })
    }
    fn enforce_retention(&self) -> BoxFut<Result<usize, StorageError>> {
        LogPort::enforce_retention(&self.inner)
    }
}

/// An engine on a [`SlowTopics`] log of `partitions` per topic holding the preparation of
/// the topics `held`, with group `fast` reading topic `orders`.
async fn boot(
    partitions: u32,
    held: BTreeSet<TopicName>,
) -> (Arc<SlowTopics>, crate::engine::EngineHandle) {
    let log = Arc::new(SlowTopics {
        inner: Arc::new(MemoryLog::new(partitions)),
        held: Mutex::new(held),
        reached: Notify::new(),
        open: Arc::new(Notify::new()),
        ends_held: AtomicBool::new(false),
        ends_asked: AtomicUsize::new(0),
        ends_open: Arc::new(Semaphore::new(0)),
    });
    let state = Arc::new(StoreAdapter::new(Box::new(MemoryStore::open(
        MemoryDisk::new(),
    ))));
    let (handle, _join) = start(config(), log.clone(), state).await.unwrap();
    super::until("ready", async || handle.is_ready()).await;
    assert!(handle.subscribe(patient("fast", "orders")).await.unwrap());
    (log, handle)
}

/// The three records published to `orders`, polled by client `c1` of group `fast`.
async fn poll_three(handle: &crate::engine::EngineHandle) -> Vec<unimesh_core::Delivery> {
    let mut got = Vec::new();
    while got.len() < 3 {
        let more = handle.poll(&g("fast"), &c("c1"), 3, 5_000).await.unwrap();
        assert!(!more.is_empty(), "a poll of 5 s came back empty");
        got.extend(more);
    }
    got
}

/// Goal: while one subscription's topic is being created, the engine serves everyone else
/// — a long-poll of another group is answered with what was published, and ACKs are
/// taken — and the held subscription applies once its topic is there. Before, the engine
/// task created the topic itself (a synced write): a schemathesis run on a loaded CI machine
/// saw a long-poll with a 100 ms wait answered after 36 s. Method: a log whose preparation
/// of topic `slow` waits until the test opens it; the subscription to it is still
/// unanswered when the other group's poll and ACK are answered.
#[tokio::test]
async fn a_slow_topic_holds_up_only_the_subscriptions_behind_it() {
    let (log, handle) = boot(2, BTreeSet::from([t("slow")])).await;

    let held = {
        let handle = handle.clone();
        tokio::spawn(async move { handle.subscribe(patient("held", "slow")).await })
    };
    // The held subscription is out at the log: the next one queues behind it.
    log.reached.notified().await;
    let behind = {
        let handle = handle.clone();
        tokio::spawn(async move { handle.subscribe(patient("behind", "orders")).await })
    };

    handle.publish(&t("orders"), events(3, None)).await.unwrap();
    let got = poll_three(&handle).await;
    let settled = handle
        .settle(
            &g("fast"),
            Settling::Ack,
            got.iter().map(|d| d.id).collect(),
        )
        .await
        .unwrap();
    assert_eq!(settled.len(), 3);
    assert!(
        !held.is_finished() && !behind.is_finished(),
        "the held subscription, and the one behind it, wait for the topic"
    );
    assert!(handle.subscription(&g("held")).await.is_err());

    log.open.notify_one();
    assert!(
        held.await.unwrap().unwrap(),
        "created once its topic is there"
    );
    assert!(behind.await.unwrap().unwrap(), "then the one behind it");
    let info = handle.subscription(&g("held")).await.unwrap();
    assert_eq!(
        info.lanes.len(),
        2,
        "every partition of the new topic assigned"
    );
}

/// Goal: a view or a seek that needs a partition's end offsets from a log that reads them
/// slowly holds up only itself: the engine serves polls and ACKs meanwhile, and the view
/// then shows the log's ends, the seek checks against them. Before, the engine task read
/// them itself (on Kafka a `block_on` round trip to the broker when they were not cached).
/// Method: a log whose `offsets` answers wait until the test opens them; the offsets view
/// and a seek are asked, a publish, a poll and its ACK are answered while both wait, then
/// the view answers with the end the log gave it (3 published, claimed 100 further; a view
/// that did not wait would show the cursor, 3) and the seek to offset 2 is taken.
#[tokio::test]
async fn slow_end_offsets_hold_up_only_the_views_and_seeks_that_want_them() {
    let (log, handle) = boot(1, BTreeSet::new()).await;
    handle.publish(&t("orders"), events(3, None)).await.unwrap();

    log.ends_held.store(true, Ordering::SeqCst);
    let view = {
        let handle = handle.clone();
        tokio::spawn(async move { handle.offsets(&t("orders")).await })
    };
    let seek = {
        let handle = handle.clone();
        tokio::spawn(async move { handle.seek(&g("fast"), 0, 2).await })
    };
    // Both are out at the log.
    super::until("both ends asked", async || {
        log.ends_asked.load(Ordering::SeqCst) >= 2
    })
    .await;
    let got = poll_three(&handle).await;
    let settled = handle
        .settle(&g("fast"), Settling::Ack, vec![got[0].id])
        .await
        .unwrap();
    assert_eq!(settled.len(), 1);
    assert!(
        !view.is_finished() && !seek.is_finished(),
        "the view and the seek wait for the log's ends"
    );

    log.ends_held.store(false, Ordering::SeqCst);
    log.ends_open.add_permits(2);
    let rows = view.await.unwrap().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        rows[0].end,
        3 + HELD_SHIFT,
        "the view shows the log's answer"
    );
    seek.await.unwrap().unwrap();
}
