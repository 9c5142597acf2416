//! The dead-letter queue on Kafka: topic `<topic>.dlq.<group>`, compacted, keyed by the
//! source coordinates *and the record*: `<partition>/<offset>/<record id>`.
//!
//! One key per (group, record), so the ledger stays exactly-once across instances: the
//! instance that dead-letters a record and any instance that (after a takeover) would do
//! it again write the same key, and compaction keeps one. Coordinates alone are not
//! enough (docs/DESIGN.md §8, "DLQ keys are coordinates, which a lost tail reuses"): after
//! the broker lost its tail, a new record lives at a lost record's offset, and with one
//! key per offset its dead letter would replace the lost one's (last write wins). So the
//! key ends in the [`record_id`] — what tells two records at one offset apart: the
//! event's source and id (CloudEvents' identity), or an undecodable record's bytes.
//!
//! A replay that was ACKed writes a tombstone of the entry of *the record that was
//! replayed*, never of another at the same coordinates: the core's resolution names only
//! the coordinates, so the state port remembers which record of a key it handed over for
//! replay, and hands an instance at most one record of a key at a time (as the
//! simulation's shell does). The value is the record as the mesh stored it (a
//! structured-mode CloudEvent when it was one, then with `content-type:
//! application/cloudevents+json`, so any Kafka consumer can read it), with the reason,
//! attempts and source coordinates as `unimesh_*` headers. Browse and replay read the
//! topic to its end, from any instance. A key of two parts (`<partition>/<offset>`,
//! written before records were told apart) is read as the record with an empty id.
//!
//! `cfg(madsim)` chooses whole files: `real.rs` reads the topic with librdkafka's blocking
//! consumer, `sim.rs` with the simulated consumer's async polls.

use std::collections::BTreeMap;

use bytes::Bytes;
use madsim_rdkafka::producer::FutureRecord;
use madsim_rdkafka::Message;
use unimesh_core::{
    DeadLetter, DlqKey, GroupName, Offset, Partition, Record, RecordMeta, TopicName,
};

use super::log::{in_context, KafkaLog};
use super::records::{incoming, Outgoing};
use crate::event::STRUCTURED_MEDIA_TYPE;
use crate::storage::ports::StorageError;
use crate::storage::state::DlqEntry;

#[cfg(not(madsim))]
mod real;
#[cfg(madsim)]
mod sim;

#[cfg(not(madsim))]
pub(super) use real::ledger;
#[cfg(madsim)]
pub(super) use sim::ledger;

/// The DLQ topic of a group reading `topic` (public so a simulation can make it before the
/// mesh does).
pub fn dlq_topic(topic: &str, group: &str) -> String {
    format!("{topic}.dlq.{group}")
}

/// What tells a record from another at the same coordinates: a stable 64-bit FNV-1a hash
/// (the same in every build and process) of the event's source and id, or of an
/// undecodable record's bytes, as 16 hex digits. The bytes, not the reason: a replayed
/// record is decoded again from the DLQ entry, which may word the reason differently.
pub(super) fn record_id(r: &Record) -> String {
    let mut h = Fnv::default();
    match &r.meta {
        RecordMeta::Event(e) => {
            h.write(b"event\0");
            h.write(e.source.as_bytes());
            h.write(b"\0");
            h.write(e.id.as_bytes());
        }
        RecordMeta::Undecodable(_) => {
            h.write(b"bytes\0");
            h.write(&r.body);
        }
    }
    format!("{:016x}", h.0)
}

/// FNV-1a, 64 bits.
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// The Kafka key of the entry of record `id` at (partition, offset).
pub(super) fn dlq_key(partition: Partition, offset: Offset, id: &str) -> String {
    format!("{partition}/{offset}/{id}")
}

/// A DLQ key split into coordinates and record id (empty for a two-part key).
fn parse_dlq_key(key: &str) -> Option<(Partition, Offset, &str)> {
    let mut parts = key.splitn(3, '/');
    let p = parts.next()?.parse().ok()?;
    let o = parts.next()?.parse().ok()?;
    Some((p, o, parts.next().unwrap_or("")))
}

/// Queues the write of one dead letter; the caller awaits the delivery report.
pub(super) async fn write(
    log: &KafkaLog,
    d: &DeadLetter,
    now_wall_ms: u64,
) -> Result<super::log::Delivery, StorageError> {
    let topic = dlq_topic(d.topic.as_str(), d.key.group.as_str());
    let named = format!("DLQ topic {topic}");
    let name = TopicName::new(&topic).map_err(|e| StorageError::failed(&named, e))?;
    log.topic_partitions(&name, true)
        .await
        .map_err(|e| in_context(&named, e))?;
    let key = dlq_key(d.key.partition, d.key.offset, &record_id(&d.record));
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
        .map_err(|(e, _)| StorageError::failed(&format!("cannot write the DLQ topic {topic}"), e))
}

/// Queues the tombstone of the entry of record `id` at `key` (its replay was ACKed).
pub(super) fn resolve(
    log: &KafkaLog,
    topic: &TopicName,
    key: &DlqKey,
    id: &str,
) -> Result<super::log::Delivery, StorageError> {
    let t = dlq_topic(topic.as_str(), key.group.as_str());
    let k = dlq_key(key.partition, key.offset, id);
    let record: FutureRecord<'_, str, [u8]> = FutureRecord::to(&t).key(k.as_str());
    log.inner
        .producer
        .send_result(record)
        .map_err(|(e, _)| StorageError::failed(&format!("cannot write the DLQ topic {t}"), e))
}

/// The dead letters of a group: per source coordinates, one entry per record, in the
/// order first written (a record written again keeps its place).
#[derive(Debug, Default)]
pub(super) struct Ledger {
    entries: BTreeMap<(Partition, Offset), Vec<(String, DlqEntry)>>,
}

impl Ledger {
    /// A record of the topic: the entry of record `id` at the coordinates, or its
    /// deletion (`None`).
    fn apply(&mut self, coords: (Partition, Offset), id: &str, entry: Option<DlqEntry>) {
        let at = self.entries.entry(coords).or_default();
        match (at.iter_mut().find(|(i, _)| i == id), entry) {
            (Some(slot), Some(e)) => slot.1 = e,
            (None, Some(e)) => at.push((id.to_owned(), e)),
            (_, None) => at.retain(|(i, _)| i != id),
        }
        if at.is_empty() {
            self.entries.remove(&coords);
        }
    }

    /// Every entry, by coordinates, at most `max`.
    pub fn all(self, max: usize) -> Vec<(String, DlqEntry)> {
        self.entries.into_values().flatten().take(max).collect()
    }

    /// For a replay: the first entry of each coordinates `skip` does not exclude (at most
    /// one record of a key in replay at a time), at most `max`.
    pub fn for_replay(self, max: usize, skip: impl Fn(&DlqKey) -> bool) -> Vec<(String, DlqEntry)> {
        self.entries
            .into_values()
            .filter_map(|at| at.into_iter().next())
            .filter(|(_, e)| !skip(&e.key))
            .take(max)
            .collect()
    }
}

/// Who reads a DLQ topic ([`super::whole::read`]).
const READER: super::whole::Reader<'static> = super::whole::Reader {
    role: "DLQ reader",
    group_id: "dlq-reader",
    what: "DLQ topic",
    // A browse or replay answers an error the caller may retry.
    unclaimed: super::whole::Unclaimed::Fails,
};

/// One record of a DLQ topic: the dead letter of a record at its source coordinates, or
/// a tombstone removing it.
fn take<M: Message>(ledger: &mut Ledger, m: &M, group: &GroupName, topic: &TopicName) {
    let Some((partition, offset, id)) = m
        .key()
        .and_then(|k| std::str::from_utf8(k).ok())
        .and_then(parse_dlq_key)
    else {
        return;
    };
    let coords = (partition, offset);
    let (headers, payload) = incoming(m);
    let Some(body) = payload else {
        ledger.apply(coords, id, None);
        return;
    };
    let header = |name: &str| {
        super::records::header(&headers, name)
            .and_then(|v| std::str::from_utf8(v).ok())
            .map(str::to_owned)
    };
    ledger.apply(
        coords,
        id,
        Some(DlqEntry {
            key: DlqKey {
                group: group.clone(),
                partition,
                offset,
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
        }),
    );
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use unimesh_core::EventMeta;

    use super::*;

    fn event(offset: Offset, id: &str) -> Record {
        Record {
            offset,
            meta: RecordMeta::Event(Arc::new(EventMeta {
                id: id.into(),
                source: "/orders".into(),
                ty: "order.created".into(),
                subject: None,
                partition_key: None,
                extensions: Vec::new(),
            })),
            body: Bytes::from_static(b"{}"),
            broker_handle: None,
        }
    }

    fn entry(partition: Partition, offset: Offset, reason: &str) -> DlqEntry {
        DlqEntry {
            key: DlqKey {
                group: GroupName::new("g").expect("valid"),
                partition,
                offset,
            },
            topic: TopicName::new("t").expect("valid"),
            body: Bytes::new(),
            attempts: 1,
            reason: reason.into(),
            dead_lettered_at_ms: 0,
        }
    }

    /// Goal: two records at one offset (a lost tail reused it) have two DLQ keys, and the
    /// same record always the same one. Method: keys of records that differ only in id,
    /// only in body (undecodable), and of one record twice.
    #[test]
    fn records_at_one_offset_have_keys_of_their_own() {
        let (lost, new) = (event(7, "e1"), event(7, "e2"));
        assert_ne!(record_id(&lost), record_id(&new));
        assert_eq!(record_id(&lost), record_id(&event(7, "e1")));
        // The id does not depend on the body of an event, nor on an offset.
        let mut again = event(9, "e1");
        again.body = Bytes::from_static(b"{\"x\":1}");
        assert_eq!(record_id(&lost), record_id(&again));
        let bytes = |b: &'static [u8], why: &str| Record {
            offset: 7,
            meta: RecordMeta::Undecodable(Arc::from(why)),
            body: Bytes::from_static(b),
            broker_handle: None,
        };
        assert_ne!(record_id(&bytes(b"x", "r")), record_id(&bytes(b"y", "r")));
        // A replayed undecodable record may carry another reason: the same entry.
        assert_eq!(record_id(&bytes(b"x", "r")), record_id(&bytes(b"x", "s")));
        let key = dlq_key(3, 7, &record_id(&lost));
        assert_eq!(parse_dlq_key(&key), Some((3, 7, record_id(&lost).as_str())));
        assert_eq!(parse_dlq_key("3/7"), Some((3, 7, "")));
        assert_eq!(parse_dlq_key("3"), None);
    }

    /// Goal: the ledger keeps one entry per record, so the dead letter of the new record
    /// at a lost record's offset does not replace the lost one's, and a resolution deletes
    /// only the entry of the record it names. Method: the topic's records replayed into
    /// a ledger; a replay is handed one record of a key at a time.
    #[test]
    fn the_ledger_keeps_one_entry_per_record_at_a_key() {
        let mut l = Ledger::default();
        l.apply((0, 7), "lost", Some(entry(0, 7, "nacked")));
        l.apply((0, 7), "new", Some(entry(0, 7, "ack-timeout")));
        // Written again (another instance dead-lettered the same record): replaced.
        l.apply((0, 7), "lost", Some(entry(0, 7, "client-gone")));
        l.apply((0, 3), "other", Some(entry(0, 3, "nacked")));
        let reasons = |l: &Ledger| -> Vec<String> {
            l.entries
                .values()
                .flatten()
                .map(|(_, e)| e.reason.clone())
                .collect()
        };
        assert_eq!(reasons(&l), vec!["nacked", "client-gone", "ack-timeout"]);
        // The lost record's replay was ACKed: its entry goes, the new one's stays.
        l.apply((0, 7), "lost", None);
        assert_eq!(reasons(&l), vec!["nacked", "ack-timeout"]);
        let mut l2 = Ledger::default();
        l2.apply((0, 7), "lost", Some(entry(0, 7, "nacked")));
        l2.apply((0, 7), "new", Some(entry(0, 7, "ack-timeout")));
        l2.apply((0, 8), "x", Some(entry(0, 8, "nacked")));
        let ids: Vec<String> = l2
            .for_replay(10, |_| false)
            .into_iter()
            .map(|(i, _)| i)
            .collect();
        assert_eq!(ids, vec!["lost", "x"]);
        let mut l3 = Ledger::default();
        l3.apply((0, 7), "lost", Some(entry(0, 7, "nacked")));
        l3.apply((0, 8), "x", Some(entry(0, 8, "nacked")));
        let ids: Vec<String> = l3
            .for_replay(10, |k| k.offset == 7)
            .into_iter()
            .map(|(i, _)| i)
            .collect();
        assert_eq!(ids, vec!["x"]);
        assert_eq!(l.all(1).len(), 1);
    }
}
