//! A subscription's topic is prepared at the log off the engine task: a topic whose
//! creation is slow (a synced write on a busy disk, a broker far away) holds up only the
//! subscriptions behind it, never the deliveries, ACKs and polls of everyone else.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use madsim_tokio as tokio;
use tokio::sync::Notify;
use unimesh_core::{GroupName, Offset, Partition};

use super::{c, config, events, g, patient, t};
use super::{start, MemoryDisk, MemoryLog, MemoryStore, Settling, StoreAdapter, TopicName};
use crate::engine::ports::{BoxFut, LogPort, LogRead, StorageError, TopicFacts};
use crate::storage::log::AppendItem;

/// The in-memory log, whose preparation of the topics named in `held` says so on
/// `reached`, then waits for `open`.
struct SlowTopics {
    inner: Arc<MemoryLog>,
    held: Mutex<BTreeSet<TopicName>>,
    reached: Notify,
    open: Arc<Notify>,
}

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
        LogPort::offsets(&self.inner, topic, partition)
    }
    fn enforce_retention(&self) -> BoxFut<Result<usize, StorageError>> {
        LogPort::enforce_retention(&self.inner)
    }
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
    let log = Arc::new(SlowTopics {
        inner: Arc::new(MemoryLog::new(2)),
        held: Mutex::new(BTreeSet::from([t("slow")])),
        reached: Notify::new(),
        open: Arc::new(Notify::new()),
    });
    let state = Arc::new(StoreAdapter::new(Box::new(MemoryStore::open(
        MemoryDisk::new(),
    ))));
    let (handle, _join) = start(config(), log.clone(), state).await.unwrap();
    super::until("ready", async || handle.is_ready()).await;
    assert!(handle.subscribe(patient("fast", "orders")).await.unwrap());

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
    let mut got = Vec::new();
    while got.len() < 3 {
        let more = handle.poll(&g("fast"), &c("c1"), 3, 5_000).await.unwrap();
        assert!(!more.is_empty(), "a poll of 5 s came back empty");
        got.extend(more);
    }
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
