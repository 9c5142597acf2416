//! Seek by time, as an operator does it (issue 22): "replay what came after 10:42", "replay
//! the last hour". One scenario for every backend (the embedded log's time index, Kafka's
//! offsets-for-times), run by `tests/admin.rs` and `tests/kafka.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::{event, json, published, Server, Value};

/// Milliseconds since the Unix epoch, now.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// `ms` since the Unix epoch as RFC 3339 in UTC with milliseconds
/// (`2024-05-17T08:30:15.250Z`), by the civil-from-days algorithm (Howard Hinnant's).
pub fn rfc3339(ms: u64) -> String {
    let secs = ms / 1_000;
    let days = (secs / 86_400) as i64;
    let rest = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3_600,
        rest % 3_600 / 60,
        rest % 60,
        ms % 1_000
    )
}

/// `POST /admin/subscriptions/{group}/seek` by time; the offset the partition restarts at.
pub fn seek_to_time(s: &Server, group: &str, partition: u32, time: &str) -> u64 {
    let v = s
        .admin("POST", &format!("/admin/subscriptions/{group}/seek"))
        .json(&json!({"partition": partition, "time": time}))
        .send()
        .ok_json(200);
    assert_eq!(v["time"], time, "{v}");
    assert_eq!(v["partition"], partition, "{v}");
    v["offset"]
        .as_u64()
        .unwrap_or_else(|| panic!("a seek answer without an offset: {v}"))
}

/// Goal: a seek by time restarts each partition at the first event published at or after
/// the time, "the last hour" replays everything published since, a time after every event
/// restarts at the end (nothing comes), and a bad time or partition is a 400 naming it.
/// Method: six events, a time taken 20 ms after they were answered, six more 20 ms later
/// (spread over the topic's partitions as the backend spreads them), all ACKed; then
/// seeks of every partition to that time (only the second six come again, exactly), to an
/// hour ago (all twelve), and past the end (none).
pub fn replay_by_time(s: &Server, group: &str, topic: &str) {
    s.subscribe(
        group,
        &json!({"topic": topic, "startFrom": "earliest", "ackTimeoutMs": 60000}),
    );
    let batch = |tag: &str| -> Vec<Value> {
        (0..6)
            .map(|i| event(&format!("{tag}{i}"), "seek.by.time", json!({"i": i})))
            .collect()
    };
    let before = published(&s.publish_batch(topic, &batch("before-")), 6);
    std::thread::sleep(Duration::from_millis(20));
    let cut_ms = now_ms();
    std::thread::sleep(Duration::from_millis(20));
    let after = published(&s.publish_batch(topic, &batch("after-")), 6);
    let all = take_and_ack(s, group, 12);
    assert_eq!(all.len(), 12);
    // However many partitions the broker gave the topic (librdkafka's mock cluster makes
    // four whatever it is asked).
    let view = s.get(&format!("/v1/subscriptions/{group}")).ok_json(200);
    let partitions = view["partitions"].as_array().map_or(0, Vec::len) as u32;
    assert!(partitions > 0, "{view}");

    // Per partition, where the second six start, and each partition's end.
    let mut first_after: BTreeMap<u32, u64> = BTreeMap::new();
    let mut end: BTreeMap<u32, u64> = BTreeMap::new();
    for p in before.iter().chain(&after) {
        let e = end.entry(p.partition).or_default();
        *e = (*e).max(p.offset + 1);
    }
    for p in &after {
        let f = first_after.entry(p.partition).or_insert(p.offset);
        *f = (*f).min(p.offset);
    }
    let cut = rfc3339(cut_ms);
    for partition in 0..partitions {
        let want = first_after
            .get(&partition)
            .or(end.get(&partition))
            .copied()
            .unwrap_or(0);
        assert_eq!(
            seek_to_time(s, group, partition, &cut),
            want,
            "partition {partition} by {cut}: the first of the second six (or the end)"
        );
    }
    let again: BTreeSet<String> = take_and_ack(s, group, 6).into_iter().collect();
    let want: BTreeSet<String> = after.iter().map(|p| p.id.clone()).collect();
    assert_eq!(
        again, want,
        "exactly the events published after {cut} came again"
    );
    let none = s.poll(group, "c", 10, 300);
    assert!(none.is_empty(), "more came again than asked: {none:?}");

    let hour_ago = rfc3339(now_ms() - 3_600_000);
    for partition in 0..partitions {
        let earliest = seek_to_time(s, group, partition, &hour_ago);
        assert_eq!(
            earliest, 0,
            "partition {partition}: the last hour is all of it"
        );
    }
    let everything: BTreeSet<String> = take_and_ack(s, group, 12).into_iter().collect();
    assert_eq!(everything.len(), 12, "the last hour replayed every event");

    let later = rfc3339(now_ms() + 3_600_000);
    for partition in 0..partitions {
        let at = seek_to_time(s, group, partition, &later);
        assert_eq!(
            at,
            end.get(&partition).copied().unwrap_or(0),
            "partition {partition}: the end"
        );
    }
    let none = s.poll(group, "c", 10, 300);
    assert!(none.is_empty(), "a seek past the end delivered {none:?}");

    let path = format!("/admin/subscriptions/{group}/seek");
    s.admin("POST", &path)
        .json(&json!({"partition": 0, "time": "an hour ago"}))
        .send()
        .expect_error_naming(400, "invalid-request", &["\"time\""]);
    s.admin("POST", &path)
        .json(&json!({"partition": partitions, "time": cut}))
        .send()
        .expect_error_naming(400, "invalid-request", &[&partitions.to_string()]);
}

/// Polls and ACKs `n` deliveries of `group`; their event ids.
fn take_and_ack(s: &Server, group: &str, n: usize) -> Vec<String> {
    let got = s.poll_n(group, "c", n, Duration::from_secs(60));
    let ids: Vec<&str> = got.iter().map(|d| d.id.as_str()).collect();
    s.ack(group, &ids).all_ok(n);
    got.iter().map(|d| d.event_id().to_owned()).collect()
}

#[cfg(test)]
mod tests {
    use super::rfc3339;

    #[test]
    fn rfc3339_formats_utc_with_milliseconds() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_715_934_615_250), "2024-05-17T08:30:15.250Z");
        assert_eq!(rfc3339(951_782_400_001), "2000-02-29T00:00:00.001Z");
        assert_eq!(rfc3339(253_402_300_799_999), "9999-12-31T23:59:59.999Z");
    }
}
