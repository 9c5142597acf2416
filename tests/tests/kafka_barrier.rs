//! The durability barrier on Kafka (issue 23): an ACK answered before a barrier — a
//! `PUT /v1/subscriptions/{g}` answered 200, which the server gives only once everything
//! pending before it is durable — is never delivered again after a SIGKILL (C2), on
//! librdkafka's mock cluster, which can fail requests on demand.
//!
//! The crash suite (`crash.rs`) found this by chance, in some runs on a loaded machine: the
//! restarted instance's offset queries (Kafka's ListOffsets) failed while it took its
//! partitions, and the backend then resumed from the committed offset alone (the progress
//! topic could not be read to its end) or took the log's end as 0 (the partition's offsets
//! could not be read) — either way every ACK range above the watermark came back. Here
//! the queries fail on purpose, every time.

use std::time::Duration;

use unimesh_tests::kafka::Broker;
use unimesh_tests::{json, published, Delivery, Server, Value};

const TIMEOUT: Duration = Duration::from_secs(180);
const GROUP: &str = "barrier";
const TOPIC: &str = "barrier";
/// Kafka's ListOffsets API key, and "not leader for partition" (what a broker answers for
/// a moment while a partition's leader moves; librdkafka's offset queries return it).
const LIST_OFFSETS: i16 = 2;
const NOT_LEADER: i32 = 6;

/// Event `i`, with the one partition key of the test.
fn keyed(i: usize) -> Value {
    let mut e = unimesh_tests::event(&format!("b{i}"), "barrier.test", json!({ "i": i }));
    e["partitionkey"] = json!("one-key");
    e
}

fn offsets_of(deliveries: &[Delivery]) -> Vec<u64> {
    deliveries.iter().map(|d| d.offset).collect()
}

fn subscription() -> Value {
    json!({"topic": TOPIC, "startFrom": "earliest", "ackTimeoutMs": 600000})
}

/// Goal: what a barrier made durable stays done across a kill, even when the broker's
/// offset queries fail while the restarted instance takes the partition. Method: one
/// partition; 20 records delivered, all but offset 0 ACKed, a barrier; SIGKILL; every
/// ListOffsets request answered "not leader" until the restarted instance has taken the
/// partition or is waiting to read its progress; then the errors stop. Delivered again:
/// offset 0 (in flight at the kill) and nothing else, then the next record published.
#[test]
fn acks_before_a_barrier_stay_done_when_offset_queries_fail_at_the_takeover() {
    let broker = Broker::start_mock();
    // librdkafka's default session timeout (45 s): the takeover waits it out, as a user's does.
    let opts = broker
        .server_options("barrier", 1)
        .toml("[mesh]\nflush_interval_ms = 20\n");
    let mut server = Server::start(opts);
    server.subscribe(GROUP, &subscription());
    // One key, so one partition (the mock cluster may create the topic with more).
    let events: Vec<Value> = (0..21).map(keyed).collect();
    let placed = published(&server.publish_batch(TOPIC, &events[..20]), 20);
    let partition = placed[0].partition;
    assert!(
        placed
            .iter()
            .enumerate()
            .all(|(i, p)| p.partition == partition && p.offset == i as u64),
        "{placed:?}"
    );

    let got = server.poll_n(GROUP, "c", 20, TIMEOUT);
    let mut offsets: Vec<u64> = got.iter().map(|d| d.offset).collect();
    offsets.sort_unstable();
    assert_eq!(offsets, (0..20).collect::<Vec<u64>>());
    let acked: Vec<&str> = got
        .iter()
        .filter(|d| d.offset != 0)
        .map(|d| d.id.as_str())
        .collect();
    server.ack(GROUP, &acked).all_ok(19);
    // The barrier: answered once everything pending before it is durable.
    server
        .call("PUT", &format!("/v1/subscriptions/{GROUP}"))
        .json(&subscription())
        .send()
        .expect(200);

    server.kill9();
    broker.fail_requests(LIST_OFFSETS, NOT_LEADER, 100_000);
    server.restart();
    let incarnation = server.incarnation();
    // Until the restarted instance took the partition, or is reading its progress again.
    unimesh_tests::wait_for("the takeover to meet the failing queries", TIMEOUT, || {
        let log = server.stderr_of(incarnation);
        (log.contains("Kafka assigned partitions") || log.contains("reading it again"))
            .then_some(())
    });
    broker.clear_request_errors(LIST_OFFSETS);

    let again = server.poll_n(GROUP, "c", 1, TIMEOUT);
    assert_eq!(
        offsets_of(&again),
        vec![0],
        "only the record in flight at the kill comes back; ACKed ones did (C2):\n{}",
        server.stderr()
    );
    server.ack(GROUP, &[again[0].id.as_str()]).all_ok(1);
    let placed = published(&server.publish_structured(TOPIC, &events[20]), 1);
    assert_eq!((placed[0].partition, placed[0].offset), (partition, 20));
    let after = server.poll_n(GROUP, "c", 1, TIMEOUT);
    assert_eq!(
        offsets_of(&after),
        vec![20],
        "after the record in flight, the next one published, and nothing ACKed before:\n{}",
        server.stderr()
    );
    let metrics = server.metrics();
    let retries = unimesh_tests::metric(&metrics, "unimesh_kafka_progress_read_retries_total", "");
    eprintln!("progress read retries: {retries:?}");
}
