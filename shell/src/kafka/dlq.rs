//! The dead-letter queue on Kafka: topic `<topic>.dlq.<group>`, compacted, keyed by the
//! source coordinates `<partition>/<offset>`.
//!
//! One key per (group, record), so the ledger stays exactly-once across instances: the
//! instance that dead-letters a record and any instance that (after a takeover) would do
//! it again write the same key, and compaction keeps one. A replay that was ACKed writes a
//! tombstone. The value is the record as the mesh stored it (a structured-mode CloudEvent
//! when it was one, then with `content-type: application/cloudevents+json`, so any Kafka
//! consumer can read it), with the reason, attempts and source coordinates as
//! `unimesh_*` headers. Browse and replay read the topic to its end, from any instance.

use std::collections::BTreeMap;
use std::time::Duration;
#[cfg(not(madsim))]
use std::time::Instant;

use bytes::Bytes;
use madsim_rdkafka::consumer::BaseConsumer;
#[cfg(not(madsim))]
use madsim_rdkafka::consumer::Consumer;
use madsim_rdkafka::producer::FutureRecord;
use madsim_rdkafka::{Message, Offset as KOffset, TopicPartitionList};
use unimesh_core::{DeadLetter, DlqKey, GroupName, Offset, Partition, RecordMeta, TopicName};

use super::log::KafkaLog;
use super::records::{incoming, Outgoing};
use crate::event::STRUCTURED_MEDIA_TYPE;
use crate::state::DlqEntry;

/// The DLQ topic of a group reading `topic`.
pub(super) fn dlq_topic(topic: &str, group: &str) -> String {
    format!("{topic}.dlq.{group}")
}

fn dlq_key(partition: Partition, offset: Offset) -> String {
    format!("{partition}/{offset}")
}

/// Queues the write of one dead letter; the caller awaits the delivery report.
pub(super) async fn write(
    log: &KafkaLog,
    d: &DeadLetter,
    now_wall_ms: u64,
) -> Result<madsim_rdkafka::producer::DeliveryFuture, String> {
    let topic = dlq_topic(d.topic.as_str(), d.key.group.as_str());
    let name = TopicName::new(&topic).map_err(|e| format!("DLQ topic {topic}: {e}"))?;
    log.topic_partitions(&name, true)
        .await
        .map_err(|e| format!("DLQ topic {topic}: {e:?}"))?;
    let key = dlq_key(d.key.partition, d.key.offset);
    let reason = d.reason.to_string();
    let attempts = d.attempts.to_string();
    let partition = d.key.partition.to_string();
    let offset = d.key.offset.to_string();
    let at = now_wall_ms.to_string();
    let mut headers: Vec<(&str, &[u8])> = Vec::with_capacity(7);
    for (k, v) in [
        ("unimesh_reason", reason.as_str()),
        ("unimesh_attempts", attempts.as_str()),
        ("unimesh_source_topic", d.topic.as_str()),
        ("unimesh_source_partition", partition.as_str()),
        ("unimesh_source_offset", offset.as_str()),
        ("unimesh_dead_lettered_at_ms", at.as_str()),
    ] {
        headers.push((k, v.as_bytes()));
    }
    if matches!(d.record.meta, RecordMeta::Event(_)) {
        headers.push(("content-type", STRUCTURED_MEDIA_TYPE.as_bytes()));
    }
    let out = Outgoing::new(&headers, d.record.body.as_ref());
    let record = out.record(&topic).key(key.as_str());
    log.inner
        .producer
        .send_result(record)
        .map_err(|(e, _)| format!("cannot write the DLQ topic {topic}: {e}"))
}

/// Queues the tombstone of a resolved dead letter.
pub(super) fn resolve(
    log: &KafkaLog,
    topic: &TopicName,
    key: &DlqKey,
) -> Result<madsim_rdkafka::producer::DeliveryFuture, String> {
    let t = dlq_topic(topic.as_str(), key.group.as_str());
    let k = dlq_key(key.partition, key.offset);
    let record: FutureRecord<'_, str, [u8]> = FutureRecord::to(&t).key(k.as_str());
    log.inner
        .producer
        .send_result(record)
        .map_err(|(e, _)| format!("cannot write the DLQ topic {t}: {e}"))
}

/// The dead letters of `group` (reading `topic`), ordered by source coordinates, at most
/// `max`: the topic read to its end. Blocking: run it off the async workers.
#[cfg(not(madsim))]
pub(super) fn list(
    log: &KafkaLog,
    group: &GroupName,
    topic: &TopicName,
    max: usize,
) -> Result<Vec<DlqEntry>, String> {
    let s = log.settings();
    let name = dlq_topic(topic.as_str(), group.as_str());
    let runtime = &log.inner.runtime;
    let mut c = s.client_config();
    c.set("group.id", format!("{}dlq-reader", s.group_prefix))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("auto.offset.reset", "earliest");
    let consumer: BaseConsumer = runtime
        .block_on(c.create())
        .map_err(|e| format!("cannot create the DLQ reader: {e}"))?;
    let meta = runtime
        .block_on(consumer.fetch_metadata(Some(&name), s.request_timeout))
        .map_err(|e| format!("DLQ topic metadata: {e}"))?;
    let n = meta
        .topics()
        .iter()
        .find(|t| t.name() == name && t.error().is_none())
        .map_or(0, |t| t.partitions().len() as i32);
    if n == 0 {
        // Nothing was ever dead-lettered for the group.
        return Ok(Vec::new());
    }
    let mut tpl = TopicPartitionList::new();
    let mut highs = BTreeMap::new();
    for p in 0..n {
        let _ = tpl.add_partition_offset(&name, p, KOffset::Beginning);
        let (_, hi) = runtime
            .block_on(consumer.fetch_watermarks(&name, p, s.request_timeout))
            .map_err(|e| format!("DLQ topic offsets: {e}"))?;
        highs.insert(p, hi);
    }
    consumer
        .assign(&tpl)
        .map_err(|e| format!("cannot read the DLQ topic: {e}"))?;
    let mut entries: BTreeMap<(Partition, Offset), DlqEntry> = BTreeMap::new();
    let deadline = Instant::now() + s.request_timeout;
    loop {
        let done = consumer.position().is_ok_and(|pos| {
            highs.iter().all(|(&p, &hi)| {
                hi <= 0
                    || pos
                        .find_partition(&name, p)
                        .is_some_and(|e| matches!(e.offset(), KOffset::Offset(o) if o >= hi))
            })
        });
        if done {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("the DLQ topic {name} could not be read to its end"));
        }
        let Some(polled) = consumer.poll(Duration::from_millis(20)) else {
            continue;
        };
        let m = polled.map_err(|e| format!("DLQ topic read: {e}"))?;
        take(&mut entries, &m, group, topic);
    }
    Ok(entries.into_values().take(max).collect())
}

/// The dead letters of `group` (reading `topic`), as [`list`] reads them, under madsim:
/// the simulated consumer polls asynchronously and has no `position` (the offsets of what
/// it returned tell how far it read).
#[cfg(madsim)]
pub(super) async fn list(
    log: &KafkaLog,
    group: &GroupName,
    topic: &TopicName,
    max: usize,
) -> Result<Vec<DlqEntry>, String> {
    use madsim_tokio as tokio;
    let s = log.settings();
    let name = dlq_topic(topic.as_str(), group.as_str());
    let mut c = s.client_config();
    c.set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("auto.offset.reset", "earliest");
    let consumer: BaseConsumer = c
        .create()
        .await
        .map_err(|e| format!("cannot create the DLQ reader: {e}"))?;
    let n = match consumer
        .fetch_metadata(Some(&name), s.request_timeout)
        .await
    {
        Ok(meta) => meta
            .topics()
            .iter()
            .find(|t| t.name() == name)
            .map_or(0, |t| t.partitions().len() as i32),
        // Nothing was ever dead-lettered for the group: the broker has no such topic.
        Err(_) => 0,
    };
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut tpl = TopicPartitionList::new();
    let mut highs = BTreeMap::new();
    for p in 0..n {
        let _ = tpl.add_partition_offset(&name, p, KOffset::Beginning);
        let (_, hi) = consumer
            .fetch_watermarks(&name, p, s.request_timeout)
            .await
            .map_err(|e| format!("DLQ topic offsets: {e}"))?;
        highs.insert(p, hi);
    }
    consumer
        .assign(&tpl)
        .map_err(|e| format!("cannot read the DLQ topic: {e}"))?;
    let mut entries: BTreeMap<(Partition, Offset), DlqEntry> = BTreeMap::new();
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + s.request_timeout;
    loop {
        let done = highs
            .iter()
            .all(|(p, &hi)| hi <= 0 || next.get(p).is_some_and(|&o| o >= hi));
        if done {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!("the DLQ topic {name} could not be read to its end"));
        }
        let Some(polled) = consumer.poll(Duration::from_millis(20)).await else {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        };
        let m = polled.map_err(|e| format!("DLQ topic read: {e}"))?;
        next.insert(m.partition(), m.offset() + 1);
        take(&mut entries, &m, group, topic);
    }
    Ok(entries.into_values().take(max).collect())
}

/// One record of a DLQ topic: a dead letter by its source coordinates, or a tombstone
/// removing one.
fn take<M: Message>(
    entries: &mut BTreeMap<(Partition, Offset), DlqEntry>,
    m: &M,
    group: &GroupName,
    topic: &TopicName,
) {
    let Some(coords) = m
        .key()
        .and_then(|k| std::str::from_utf8(k).ok())
        .and_then(|k| k.split_once('/'))
        .and_then(|(p, o)| Some((p.parse::<Partition>().ok()?, o.parse::<Offset>().ok()?)))
    else {
        return;
    };
    let (headers, payload) = incoming(m);
    let Some(body) = payload else {
        entries.remove(&coords);
        return;
    };
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| *k == name)
            .and_then(|(_, v)| *v)
            .and_then(|v| std::str::from_utf8(v).ok())
            .map(str::to_owned)
    };
    entries.insert(
        coords,
        DlqEntry {
            key: DlqKey {
                group: group.clone(),
                partition: coords.0,
                offset: coords.1,
            },
            topic: topic.clone(),
            body: Bytes::copy_from_slice(body),
            attempts: header("unimesh_attempts")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            reason: header("unimesh_reason").unwrap_or_default(),
            dead_lettered_at_ms: header("unimesh_dead_lettered_at_ms")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
        },
    );
}
