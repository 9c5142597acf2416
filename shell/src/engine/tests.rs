//! The engine end to end in one process, on in-memory ports: what the HTTP front will see.

use std::sync::Arc;

use madsim_tokio as tokio;

use http::HeaderMap;
use unimesh_core::{
    Backoff, ClientId, GroupName, RejectReason, Settle, StartFrom, SubscriptionSpec, TopicName,
};

use super::*;
use crate::event::{parse_publish, PublishLimits};
use crate::storage::state::{MemoryDisk, MemoryStore};

mod dedup;
mod revoke;
mod shared;
mod topics;

fn g(s: &str) -> GroupName {
    GroupName::new(s).unwrap()
}
fn t(s: &str) -> TopicName {
    TopicName::new(s).unwrap()
}
fn c(s: &str) -> ClientId {
    ClientId::new(s).unwrap()
}

fn events(n: usize, key: Option<&str>) -> Vec<crate::event::Published> {
    let items: Vec<String> = (0..n)
        .map(|i| {
            let key = key.map_or(String::new(), |k| format!(",\"partitionkey\":\"{k}\""));
            format!(
                r#"{{"specversion":"1.0","id":"e{i}","source":"/test","type":"test.event"{key},"data":{{"n":{i}}}}}"#
            )
        })
        .collect();
    parse_batch(&items)
}

/// These structured events, parsed as one batch publish.
fn parse_batch(items: &[String]) -> Vec<crate::event::Published> {
    let body = format!("[{}]", items.join(","));
    let mut headers = HeaderMap::new();
    headers.insert(
        "content-type",
        "application/cloudevents-batch+json".parse().unwrap(),
    );
    parse_publish(&headers, body.as_bytes(), &PublishLimits::default()).unwrap()
}

struct Rig {
    handle: EngineHandle,
    log: Arc<MemoryLog>,
    disk: MemoryDisk,
}

fn config() -> EngineConfig {
    let mut cfg = EngineConfig {
        fetch_wait_ms: 50,
        retention_interval_ms: 0,
        ..EngineConfig::default()
    };
    cfg.mesh.flush_interval_ms = 5;
    cfg
}

async fn boot(log: Arc<MemoryLog>, disk: MemoryDisk) -> Rig {
    let state = Arc::new(StoreAdapter::new(Box::new(MemoryStore::open(disk.clone()))));
    let (handle, _join) = start(config(), Arc::new(log.clone()), state).await.unwrap();
    Rig { handle, log, disk }
}

async fn fresh() -> Rig {
    boot(Arc::new(MemoryLog::new(2)), MemoryDisk::new()).await
}

async fn ready(rig: &Rig) {
    for _ in 0..200 {
        if rig.handle.is_ready() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    panic!("engine never became ready");
}

fn spec(group: &str, topic: &str) -> SubscriptionSpec {
    SubscriptionSpec::new(g(group), t(topic))
}

/// Polls until `n` deliveries arrived (or the attempts run out).
async fn take(rig: &Rig, group: &str, client: &str, n: usize) -> Vec<unimesh_core::Delivery> {
    let mut got = Vec::new();
    for _ in 0..50 {
        let more = rig
            .handle
            .poll(&g(group), &c(client), (n - got.len()) as u32, 200)
            .await
            .unwrap();
        got.extend(more);
        if got.len() >= n {
            break;
        }
    }
    got
}

#[tokio::test]
async fn publish_poll_ack_round_trip() {
    let rig = fresh().await;
    ready(&rig).await;
    assert!(rig.handle.subscribe(spec("g", "orders")).await.unwrap());
    let placed = rig
        .handle
        .publish(&t("orders"), events(5, None))
        .await
        .unwrap();
    assert_eq!(placed.len(), 5);
    assert_eq!(placed[0].id, "e0");
    let got = take(&rig, "g", "c1", 5).await;
    assert_eq!(got.len(), 5);
    let ids: Vec<_> = got.iter().map(|d| d.id).collect();
    let settled = rig
        .handle
        .settle(&g("g"), Settling::Ack, ids)
        .await
        .unwrap();
    assert!(settled.iter().all(|s| *s == Settle::Accepted));
    let info = rig.handle.subscription(&g("g")).await.unwrap();
    let done: u64 = info.lanes.iter().map(|l| l.watermark).sum();
    assert_eq!(done, 5);
    assert!(info.lanes.iter().all(|l| l.lag == 0));
}

#[tokio::test]
async fn a_waiting_poll_wakes_on_publish_and_an_idle_one_times_out_empty() {
    let rig = fresh().await;
    ready(&rig).await;
    rig.handle.subscribe(spec("g", "orders")).await.unwrap();
    let empty = rig.handle.poll(&g("g"), &c("c"), 10, 30).await.unwrap();
    assert!(empty.is_empty());
    let h = rig.handle.clone();
    let waiting = tokio::spawn(async move { h.poll(&g("g"), &c("c"), 10, 5_000).await });
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    rig.handle
        .publish(&t("orders"), events(1, None))
        .await
        .unwrap();
    let got = waiting.await.unwrap().unwrap();
    assert_eq!(got.len(), 1);
}

#[tokio::test]
async fn two_groups_each_get_everything_and_two_clients_share_one_group() {
    let rig = fresh().await;
    ready(&rig).await;
    rig.handle.subscribe(spec("a", "t")).await.unwrap();
    rig.handle.subscribe(spec("b", "t")).await.unwrap();
    rig.handle.publish(&t("t"), events(6, None)).await.unwrap();
    assert_eq!(take(&rig, "a", "x", 6).await.len(), 6);
    let first = rig.handle.poll(&g("b"), &c("y1"), 3, 500).await.unwrap();
    let second = take(&rig, "b", "y2", 6 - first.len()).await;
    assert_eq!(first.len() + second.len(), 6);
    let mut offsets: Vec<_> = first
        .iter()
        .chain(&second)
        .map(|d| (d.partition, d.record.offset))
        .collect();
    offsets.sort();
    offsets.dedup();
    assert_eq!(
        offsets.len(),
        6,
        "clients of one group never share a record"
    );
}

#[tokio::test]
async fn restart_keeps_progress_rejects_stale_acks_and_redelivers_in_flight() {
    let rig = fresh().await;
    ready(&rig).await;
    rig.handle.subscribe(spec("g", "t")).await.unwrap();
    rig.handle
        .publish(&t("t"), events(4, Some("k")))
        .await
        .unwrap();
    let got = take(&rig, "g", "c", 4).await;
    assert_eq!(got.len(), 4);
    let (acked, held) = got.split_at(2);
    rig.handle
        .settle(&g("g"), Settling::Ack, acked.iter().map(|d| d.id).collect())
        .await
        .unwrap();
    rig.handle.shutdown().await.unwrap();

    let rig = boot(rig.log.clone(), rig.disk.clone()).await;
    ready(&rig).await;
    let again = take(&rig, "g", "c", 2).await;
    let mut offsets: Vec<_> = again.iter().map(|d| d.record.offset).collect();
    offsets.sort();
    let mut want: Vec<_> = held.iter().map(|d| d.record.offset).collect();
    want.sort();
    assert_eq!(offsets, want, "only what was in flight comes again");
    let stale = rig
        .handle
        .settle(&g("g"), Settling::Ack, vec![held[0].id])
        .await
        .unwrap();
    assert_eq!(stale, vec![Settle::Rejected(RejectReason::Stale)]);
}

#[tokio::test]
async fn nack_dead_letters_after_max_attempts_and_replay_brings_it_back() {
    let rig = fresh().await;
    ready(&rig).await;
    let mut s = spec("g", "t");
    s.max_attempts = 2;
    s.backoff = Backoff {
        initial_ms: 0,
        max_ms: 0,
        multiplier: 1.0,
    };
    rig.handle.subscribe(s).await.unwrap();
    rig.handle.publish(&t("t"), events(1, None)).await.unwrap();
    for attempt in 1..=2 {
        let d = take(&rig, "g", "c", 1).await;
        assert_eq!(d[0].attempt, attempt);
        rig.handle
            .settle(&g("g"), Settling::Nack { delay_ms: Some(0) }, vec![d[0].id])
            .await
            .unwrap();
    }
    let mut dlq = Vec::new();
    for _ in 0..100 {
        dlq = rig.handle.dlq(&g("g"), 10).await.unwrap();
        if !dlq.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    assert_eq!(dlq.len(), 1);
    assert_eq!(dlq[0].reason, "nacked");
    assert_eq!(dlq[0].attempts, 2);
    assert_eq!(rig.handle.dlq_replay(&g("g"), 10).await.unwrap(), 1);
    assert_eq!(
        rig.handle.dlq_replay(&g("g"), 10).await.unwrap(),
        0,
        "an entry already in replay is not replayed twice"
    );
    let d = take(&rig, "g", "c", 1).await;
    assert_eq!(d[0].attempt, 1);
    rig.handle
        .settle(&g("g"), Settling::Ack, vec![d[0].id])
        .await
        .unwrap();
    for _ in 0..100 {
        if rig.handle.dlq(&g("g"), 10).await.unwrap().is_empty() {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("the replayed entry never left the DLQ");
}

#[tokio::test]
async fn latest_start_skips_earlier_events() {
    let rig = fresh().await;
    ready(&rig).await;
    rig.handle.publish(&t("t"), events(3, None)).await.unwrap();
    let mut s = spec("g", "t");
    s.start_from = StartFrom::Latest(Default::default());
    rig.handle.subscribe(s).await.unwrap();
    let placed = rig.handle.publish(&t("t"), events(1, None)).await.unwrap();
    let d = take(&rig, "g", "c", 1).await;
    assert_eq!(
        (d[0].partition, d[0].record.offset),
        (placed[0].partition, placed[0].offset)
    );
    let none = rig.handle.poll(&g("g"), &c("c"), 10, 50).await.unwrap();
    assert!(none.is_empty());
}

#[tokio::test]
async fn unknown_group_and_topic_are_reported() {
    let rig = fresh().await;
    ready(&rig).await;
    assert_eq!(
        rig.handle
            .poll(&g("nope"), &c("c"), 1, 0)
            .await
            .unwrap_err(),
        EngineError::UnknownGroup(g("nope"))
    );
    assert_eq!(
        rig.handle.offsets(&t("nope")).await.unwrap_err(),
        EngineError::UnknownTopic(t("nope"))
    );
    rig.handle.subscribe(spec("g", "t")).await.unwrap();
    rig.handle.unsubscribe(&g("g")).await.unwrap();
    assert!(matches!(
        rig.handle.subscription(&g("g")).await,
        Err(EngineError::UnknownGroup(_))
    ));
}

#[tokio::test]
async fn a_failing_store_answers_unavailable_and_recovers() {
    let rig = fresh().await;
    ready(&rig).await;
    rig.disk.fail_next_commits(1);
    let r = rig.handle.subscribe(spec("g", "t")).await;
    assert!(matches!(r, Err(EngineError::Unavailable(_))), "{r:?}");
    // The group exists in memory and is retried; a second PUT is idempotent and succeeds.
    assert!(!rig.handle.subscribe(spec("g", "t")).await.unwrap());
    rig.handle.publish(&t("t"), events(1, None)).await.unwrap();
    assert_eq!(take(&rig, "g", "c", 1).await.len(), 1);
}

#[tokio::test]
async fn rate_limit_refuses_over_the_rate() {
    let rig = fresh().await;
    ready(&rig).await;
    rig.handle
        .set_rate_limit(
            &t("t"),
            unimesh_core::RateRule {
                events_per_second: 1,
                burst: 2,
            },
        )
        .await
        .unwrap();
    rig.handle.publish(&t("t"), events(2, None)).await.unwrap();
    let r = rig.handle.publish(&t("t"), events(1, None)).await;
    assert!(matches!(r, Err(EngineError::RateLimited { retry_after_ms }) if retry_after_ms > 0));
    let r = rig.handle.publish(&t("t"), events(3, None)).await;
    assert!(matches!(r, Err(EngineError::TooLarge(_))));
}

#[tokio::test]
async fn an_abandoned_poll_loses_its_credit_before_anything_is_handed_to_it() {
    let rig = fresh().await;
    ready(&rig).await;
    rig.handle.subscribe(spec("g", "t")).await.unwrap();
    let h = rig.handle.clone();
    let abandoned = tokio::spawn(async move { h.poll(&g("g"), &c("gone"), 10, 60_000).await });
    tokio::time::sleep(std::time::Duration::from_millis(30)).await;
    abandoned.abort(); // the HTTP request went away
    tokio::time::sleep(std::time::Duration::from_millis(120)).await;
    rig.handle.publish(&t("t"), events(3, None)).await.unwrap();
    let got = take(&rig, "g", "live", 3).await;
    assert_eq!(got.len(), 3);
    assert!(
        got.iter().all(|d| d.attempt == 1),
        "nothing was wasted on the abandoned poll: {:?}",
        got.iter().map(|d| d.attempt).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn a_seek_outside_the_log_is_refused_and_changes_nothing() {
    let rig = fresh().await;
    ready(&rig).await;
    rig.handle.subscribe(spec("g", "t")).await.unwrap();
    let placed = rig.handle.publish(&t("t"), events(1, None)).await.unwrap();
    let p = placed[0].partition;
    let r = rig.handle.seek(&g("g"), p, 999).await;
    assert!(
        matches!(r, Err(EngineError::BadRequest(ref m)) if m.contains("outside")),
        "{r:?}"
    );
    let r = rig.handle.seek(&g("g"), 77, 0).await;
    assert!(matches!(r, Err(EngineError::BadRequest(_))), "{r:?}");
    assert_eq!(
        take(&rig, "g", "c", 1).await.len(),
        1,
        "the lane is where it was"
    );
    rig.handle.seek(&g("g"), p, 1).await.unwrap();
}

/// Goal: a seek by time restarts the partition at the first record appended at or after
/// the time (the log resolves it; the core's seek takes the offset), at the earliest before
/// every record and at the end after them all, and answers the offset; a partition the
/// topic lacks is refused. Method: one partition, three records, a time taken between the
/// second and the third (5 ms clear of both on the wall clock), the first two ACKed.
#[tokio::test]
async fn a_seek_by_time_restarts_at_the_first_record_at_or_after_the_time() {
    let log = Arc::new(MemoryLog::new(1));
    let rig = boot(log, MemoryDisk::new()).await;
    ready(&rig).await;
    rig.handle.subscribe(spec("g", "t")).await.unwrap();
    rig.handle.publish(&t("t"), events(2, None)).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let between = crate::storage::log::WallClock::now_ms(&crate::storage::log::SystemClock);
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    rig.handle.publish(&t("t"), events(1, None)).await.unwrap();
    let got = take(&rig, "g", "c", 3).await;
    let ids: Vec<_> = got.iter().map(|d| d.id).collect();
    rig.handle
        .settle(&g("g"), Settling::Ack, ids)
        .await
        .unwrap();

    assert_eq!(rig.handle.seek_to_time(&g("g"), 0, between).await, Ok(2));
    let again = take(&rig, "g", "c", 1).await;
    assert_eq!(
        again.iter().map(|d| d.id.offset).collect::<Vec<_>>(),
        [2],
        "the third record comes again, the first two stay done"
    );
    rig.handle
        .settle(&g("g"), Settling::Ack, vec![again[0].id])
        .await
        .unwrap();
    assert_eq!(
        rig.handle.seek_to_time(&g("g"), 0, 0).await,
        Ok(0),
        "before all: the earliest"
    );
    assert_eq!(take(&rig, "g", "c", 3).await.len(), 3, "everything again");
    assert_eq!(
        rig.handle.seek_to_time(&g("g"), 0, u64::MAX).await,
        Ok(3),
        "after all: the end"
    );
    let r = rig.handle.seek_to_time(&g("g"), 5, between).await;
    assert!(
        matches!(r, Err(EngineError::BadRequest(ref m)) if m.contains("no partition 5")),
        "{r:?}"
    );
    let r = rig.handle.seek_to_time(&g("nope"), 0, between).await;
    assert!(matches!(r, Err(EngineError::UnknownGroup(_))), "{r:?}");
}

// ----- stream sessions (SSE, WebSocket, webhook share them) -----

/// A group whose ACK timeout is far beyond any test's patience: a delivery that comes
/// again within a test came again because of a session rule, not the timeout.
fn patient(group: &str, topic: &str) -> SubscriptionSpec {
    let mut s = spec(group, topic);
    s.ack_timeout_ms = 3_600_000;
    s.backoff = Backoff {
        initial_ms: 0,
        max_ms: 0,
        multiplier: 1.0,
    };
    s
}

/// The next `n` deliveries of a stream (bounded wait), reported written.
async fn next_n(stream: &Stream, n: usize) -> Vec<unimesh_core::Delivery> {
    let mut got = Vec::new();
    while got.len() < n {
        let more = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            stream.next(n - got.len()),
        )
        .await
        .expect("deliveries within 10 s")
        .expect("the session is open");
        stream.written(more.len());
        got.extend(more);
    }
    got
}

/// What one client holds in flight, per the engine.
async fn held(rig: &Rig, group: &str, client: &str) -> u32 {
    let clients = rig.handle.clients().await.unwrap();
    clients
        .iter()
        .find(|c| c.group.as_str() == group && c.id.as_str() == client)
        .map_or(0, |c| c.in_flight)
}

/// Waits (bounded) until `f` holds.
async fn until(what: &str, mut f: impl AsyncFnMut() -> bool) {
    for _ in 0..400 {
        if f().await {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("never: {what}");
}

/// Goal: a write that fails hands the delivery back at once. Method: the transport reports
/// the one delivery it took as failed; it comes again (attempt 2) on the same stream,
/// with an ACK timeout of an hour.
#[tokio::test]
async fn a_failed_write_hands_the_delivery_back_at_once() {
    let rig = fresh().await;
    ready(&rig).await;
    rig.handle.subscribe(patient("g", "t")).await.unwrap();
    let s = rig.handle.open_stream(&g("g"), &c("c"), 8).await.unwrap();
    rig.handle.publish(&t("t"), events(1, None)).await.unwrap();
    let first = tokio::time::timeout(std::time::Duration::from_secs(10), s.next(8))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((first.len(), first[0].attempt), (1, 1));
    s.failed(vec![first[0].id]);
    let again = next_n(&s, 1).await;
    assert_eq!(again[0].attempt, 2, "redelivered at once");
    assert_eq!(again[0].record.offset, first[0].record.offset);
    let stats = rig.handle.subscription(&g("g")).await.unwrap().stats;
    assert_eq!((stats.nacked, stats.redelivered), (1, 1));
}

/// Goal: a stream that closes hands back at once what was queued and not written, and
/// keeps what was written in flight. Method: three deliveries queued, one taken and
/// written, the stream dropped; another client gets the two others (attempt 2) at once,
/// while the written one stays with the first client until ACKed.
#[tokio::test]
async fn a_closed_stream_hands_back_what_it_had_not_written() {
    let rig = fresh().await;
    ready(&rig).await;
    rig.handle.subscribe(patient("g", "t")).await.unwrap();
    let s = rig
        .handle
        .open_stream(&g("g"), &c("gone"), 8)
        .await
        .unwrap();
    rig.handle.publish(&t("t"), events(3, None)).await.unwrap();
    until("three deliveries queued", async || {
        held(&rig, "g", "gone").await == 3
    })
    .await;
    let written = next_n(&s, 1).await;
    drop(s);
    let other = take(&rig, "g", "other", 2).await;
    assert_eq!(other.len(), 2, "the two unwritten ones came back at once");
    assert!(other.iter().all(|d| d.attempt == 2), "{other:?}");
    assert!(other.iter().all(
        |d| d.record.offset != written[0].record.offset || d.partition != written[0].partition
    ));
    assert_eq!(
        held(&rig, "g", "gone").await,
        1,
        "the written one stays in flight"
    );
    let settled = rig
        .handle
        .settle(&g("g"), Settling::Ack, vec![written[0].id])
        .await
        .unwrap();
    assert_eq!(settled, vec![Settle::Accepted], "and can still be ACKed");
}

/// Goal: a client that reconnects after a drop gets everything it had not ACKed again at
/// once, as redeliveries. Method: two deliveries written to a stream and not ACKed, the
/// stream dropped (they stay in flight), the same client opens a stream again.
#[tokio::test]
async fn a_reconnect_gets_everything_not_acked_again_at_once() {
    let rig = fresh().await;
    ready(&rig).await;
    rig.handle.subscribe(patient("g", "t")).await.unwrap();
    let s = rig.handle.open_stream(&g("g"), &c("c"), 8).await.unwrap();
    rig.handle.publish(&t("t"), events(2, None)).await.unwrap();
    let before = next_n(&s, 2).await;
    drop(s);
    until("the session ended", async || {
        rig.handle
            .clients()
            .await
            .unwrap()
            .iter()
            .any(|c| c.id.as_str() == "c" && c.credit == 0)
    })
    .await;
    assert_eq!(held(&rig, "g", "c").await, 2, "written: still in flight");
    let s = rig.handle.open_stream(&g("g"), &c("c"), 8).await.unwrap();
    let again = next_n(&s, 2).await;
    let key = |d: &unimesh_core::Delivery| (d.partition, d.record.offset);
    let mut a: Vec<_> = before.iter().map(key).collect();
    let mut b: Vec<_> = again.iter().map(key).collect();
    a.sort();
    b.sort();
    assert_eq!(a, b, "the same records");
    assert!(again.iter().all(|d| d.attempt == 2));
    let stats = rig.handle.subscription(&g("g")).await.unwrap().stats;
    assert_eq!(stats.redelivered, 2);
}

/// Goal: a session's credit is its window, refilled as the transport writes, and the
/// group's `maxInFlightPerClient` bounds what it holds. Method: five events, window 2:
/// two queued until two are written; with `maxInFlightPerClient` 3 the third write
/// brings no fourth.
#[tokio::test]
async fn a_stream_gets_its_window_and_no_more_than_max_in_flight() {
    let rig = fresh().await;
    ready(&rig).await;
    let mut sp = patient("g", "t");
    sp.max_in_flight_per_client = 3;
    rig.handle.subscribe(sp).await.unwrap();
    let s = rig.handle.open_stream(&g("g"), &c("c"), 2).await.unwrap();
    rig.handle.publish(&t("t"), events(5, None)).await.unwrap();
    until("the window is full", async || {
        held(&rig, "g", "c").await == 2
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(held(&rig, "g", "c").await, 2, "no more than the window");
    next_n(&s, 2).await;
    until("the window refilled", async || {
        held(&rig, "g", "c").await == 3
    })
    .await;
    next_n(&s, 1).await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert_eq!(held(&rig, "g", "c").await, 3, "maxInFlightPerClient holds");
}

/// Goal: the engine ends the sessions of a deleted group, and its transport sees the end.
#[tokio::test]
async fn deleting_the_group_ends_its_streams() {
    let rig = fresh().await;
    ready(&rig).await;
    rig.handle.subscribe(patient("g", "t")).await.unwrap();
    let s = rig.handle.open_stream(&g("g"), &c("c"), 2).await.unwrap();
    rig.handle.unsubscribe(&g("g")).await.unwrap();
    let end = tokio::time::timeout(std::time::Duration::from_secs(10), s.next(1)).await;
    assert!(matches!(end, Ok(None)), "the stream ended");
    let r = rig.handle.open_stream(&g("g"), &c("c"), 2).await;
    assert!(matches!(r, Err(EngineError::UnknownGroup(_))));
}
