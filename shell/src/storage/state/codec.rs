//! Value encodings of a state store. Every value starts with a format version byte, so a
//! later format can be told apart from corruption; the decoders check every length against
//! what is left before allocating (upstream #5361) and never panic on any input.
//!
//! Checkpoints are stored as `Checkpoint::encode()` bytes, which carry their own magic,
//! version and CRC.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use unimesh_core::{
    DeadLetter, DlqKey, Epoch, GroupName, Offset, Partition, RateRule, StartFrom, SubscriptionSpec,
    TopicName,
};

use super::{DlqEntry, StoreError};
use crate::spec_json::SubscriptionDoc;

const VERSION: u8 = 1;

fn corrupt(key: &str, why: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        key: key.to_owned(),
        why: why.into(),
    }
}

/// Strips and checks the version byte.
fn versioned<'a>(key: &str, bytes: &'a [u8]) -> Result<&'a [u8], StoreError> {
    match bytes.split_first() {
        None => Err(corrupt(key, "empty value")),
        Some((&VERSION, rest)) => Ok(rest),
        Some((&v, _)) => Err(corrupt(key, format!("unsupported format version {v}"))),
    }
}

pub(crate) fn encode_epoch(epoch: Epoch) -> Vec<u8> {
    let mut v = vec![VERSION];
    v.extend_from_slice(&epoch.to_le_bytes());
    v
}

pub(crate) fn decode_epoch(key: &str, bytes: &[u8]) -> Result<Epoch, StoreError> {
    let body = versioned(key, bytes)?;
    let b: [u8; 4] = body
        .try_into()
        .map_err(|_| corrupt(key, format!("epoch is {} bytes, not 4", body.len())))?;
    Ok(Epoch::from_le_bytes(b))
}

pub(crate) fn encode_rate_rule(rule: &RateRule) -> Vec<u8> {
    let mut v = vec![VERSION];
    v.extend_from_slice(&rule.events_per_second.to_le_bytes());
    v.extend_from_slice(&rule.burst.to_le_bytes());
    v
}

pub(crate) fn decode_rate_rule(key: &str, bytes: &[u8]) -> Result<RateRule, StoreError> {
    let body = versioned(key, bytes)?;
    if body.len() != 16 {
        return Err(corrupt(
            key,
            format!("rate rule is {} bytes, not 16", body.len()),
        ));
    }
    let mut r = Reader::new(key, body);
    Ok(RateRule {
        events_per_second: r.u64()?,
        burst: r.u64()?,
    })
}

/// The persisted form of a subscription: the API document plus what the document does not
/// carry exactly.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct StoredSubscription {
    group: String,
    spec: SubscriptionDoc,
    /// JSON text is not guaranteed to round-trip every `f64` bit for bit when read back
    /// (serde_json parses floats best-effort by default); the bits are.
    backoff_multiplier_bits: u64,
    /// The end offsets read when a `startFrom: latest` group was created. Without them a
    /// restart would start such a group at the then-current end and skip what came between.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    latest_offsets: Option<BTreeMap<Partition, Offset>>,
}

pub(crate) fn encode_subscription(spec: &SubscriptionSpec) -> Result<Vec<u8>, StoreError> {
    let stored = StoredSubscription {
        group: spec.group.as_str().to_owned(),
        spec: SubscriptionDoc::from_spec(spec),
        backoff_multiplier_bits: spec.backoff.multiplier.to_bits(),
        latest_offsets: match &spec.start_from {
            StartFrom::Earliest => None,
            StartFrom::Latest(map) => Some(map.clone()),
        },
    };
    let mut v = vec![VERSION];
    serde_json::to_writer(&mut v, &stored).map_err(|e| StoreError::Encode {
        what: "subscription",
        why: e.to_string(),
    })?;
    Ok(v)
}

pub(crate) fn decode_subscription(
    key: &str,
    expected_group: &GroupName,
    bytes: &[u8],
) -> Result<SubscriptionSpec, StoreError> {
    let body = versioned(key, bytes)?;
    let stored: StoredSubscription =
        serde_json::from_slice(body).map_err(|e| corrupt(key, e.to_string()))?;
    if stored.group != expected_group.as_str() {
        return Err(corrupt(
            key,
            format!("value names group {:?}", stored.group),
        ));
    }
    let mut spec = stored
        .spec
        .into_spec_unchecked(expected_group.clone())
        .map_err(|e| corrupt(key, e.to_string()))?;
    spec.backoff.multiplier = f64::from_bits(stored.backoff_multiplier_bits);
    match (&mut spec.start_from, stored.latest_offsets) {
        (StartFrom::Latest(map), Some(offsets)) => *map = offsets,
        (StartFrom::Latest(_), None) => {}
        (StartFrom::Earliest, None) => {}
        (StartFrom::Earliest, Some(_)) => {
            return Err(corrupt(key, "latest offsets stored for an earliest group"))
        }
    }
    Ok(spec)
}

// DLQ entry, little-endian:
// version u8 | attempts u32 | dead_lettered_at_ms u64 | topic_len u16 | topic
// | reason_len u32 | reason (UTF-8) | body_len u32 | body | crc32 u32 (of all before)
const DLQ_FIXED: usize = 1 + 4 + 8 + 2 + 4 + 4 + 4;

pub(crate) fn encode_dead_letter(d: &DeadLetter, now_wall_ms: u64) -> Result<Vec<u8>, StoreError> {
    let topic = d.topic.as_str().as_bytes();
    let reason = d.reason.to_string();
    let body = &d.record.body;
    let too_large = |what: &'static str, len: usize| StoreError::Encode {
        what,
        why: format!("{len} bytes do not fit the DLQ entry format"),
    };
    let topic_len = u16::try_from(topic.len()).map_err(|_| too_large("topic", topic.len()))?;
    let reason_len =
        u32::try_from(reason.len()).map_err(|_| too_large("dead-letter reason", reason.len()))?;
    let body_len = u32::try_from(body.len()).map_err(|_| too_large("record body", body.len()))?;
    let mut v = Vec::with_capacity(DLQ_FIXED + topic.len() + reason.len() + body.len());
    v.push(VERSION);
    v.extend_from_slice(&d.attempts.to_le_bytes());
    v.extend_from_slice(&now_wall_ms.to_le_bytes());
    v.extend_from_slice(&topic_len.to_le_bytes());
    v.extend_from_slice(topic);
    v.extend_from_slice(&reason_len.to_le_bytes());
    v.extend_from_slice(reason.as_bytes());
    v.extend_from_slice(&body_len.to_le_bytes());
    v.extend_from_slice(body);
    let crc = crc32fast::hash(&v);
    v.extend_from_slice(&crc.to_le_bytes());
    Ok(v)
}

pub(crate) fn decode_dead_letter(
    key_text: &str,
    key: DlqKey,
    bytes: &[u8],
) -> Result<DlqEntry, StoreError> {
    if bytes.len() < DLQ_FIXED {
        return Err(corrupt(
            key_text,
            format!(
                "DLQ entry is {} bytes, shorter than its header",
                bytes.len()
            ),
        ));
    }
    let (signed, crc) = bytes.split_at(bytes.len() - 4);
    let mut r = Reader::new(key_text, crc);
    let want = r.u32()?;
    // The version is checked before the checksum so a future format is reported as such.
    let body = versioned(key_text, signed)?;
    if crc32fast::hash(signed) != want {
        return Err(corrupt(key_text, "DLQ entry checksum mismatch"));
    }
    let mut r = Reader::new(key_text, body);
    let attempts = r.u32()?;
    let dead_lettered_at_ms = r.u64()?;
    let topic_len = r.u16()? as usize;
    let topic = r.str(topic_len, "topic")?;
    let topic = TopicName::new(topic).map_err(|e| corrupt(key_text, e.to_string()))?;
    let reason_len = r.u32()? as usize;
    let reason = r.str(reason_len, "reason")?.to_owned();
    let body_len = r.u32()? as usize;
    let record_body = Bytes::copy_from_slice(r.bytes(body_len, "record body")?);
    if r.remaining() != 0 {
        return Err(corrupt(
            key_text,
            format!("{} trailing bytes in DLQ entry", r.remaining()),
        ));
    }
    Ok(DlqEntry {
        key,
        topic,
        body: record_body,
        attempts,
        reason,
        dead_lettered_at_ms,
    })
}

struct Reader<'a> {
    key: &'a str,
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn new(key: &'a str, buf: &'a [u8]) -> Self {
        Self { key, buf, pos: 0 }
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn bytes(&mut self, n: usize, what: &str) -> Result<&'a [u8], StoreError> {
        if n > self.remaining() {
            return Err(corrupt(
                self.key,
                format!(
                    "{what} claims {n} bytes but only {} remain",
                    self.remaining()
                ),
            ));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], StoreError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N, "a number")?);
        Ok(a)
    }

    fn u16(&mut self) -> Result<u16, StoreError> {
        Ok(u16::from_le_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, StoreError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, StoreError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn str(&mut self, n: usize, what: &str) -> Result<&'a str, StoreError> {
        let key = self.key;
        std::str::from_utf8(self.bytes(n, what)?)
            .map_err(|_| corrupt(key, format!("{what} is not UTF-8")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use unimesh_core::{DeadLetterReason, EventMeta, Record};

    fn dead_letter() -> DeadLetter {
        DeadLetter {
            key: DlqKey {
                group: GroupName::new("g").unwrap(),
                partition: 2,
                offset: 40,
            },
            topic: TopicName::new("orders").unwrap(),
            record: Record::event(40, EventMeta::default(), Bytes::from_static(b"{\"a\":1}")),
            attempts: 5,
            reason: DeadLetterReason::Undecodable("bad \u{e9}".into()),
        }
    }

    #[test]
    fn dead_letter_round_trips() {
        let d = dead_letter();
        let bytes = encode_dead_letter(&d, 1_700_000_000_000).unwrap();
        let e = decode_dead_letter("k", d.key.clone(), &bytes).unwrap();
        assert_eq!(e.key, d.key);
        assert_eq!(e.topic, d.topic);
        assert_eq!(e.body, d.record.body);
        assert_eq!(e.attempts, 5);
        assert_eq!(e.reason, "undecodable: bad \u{e9}");
        assert_eq!(e.dead_lettered_at_ms, 1_700_000_000_000);
    }

    #[test]
    fn every_dead_letter_bit_flip_and_truncation_is_refused() {
        let d = dead_letter();
        let bytes = encode_dead_letter(&d, 9).unwrap();
        for i in 0..bytes.len() * 8 {
            let mut b = bytes.clone();
            b[i / 8] ^= 1 << (i % 8);
            assert!(
                decode_dead_letter("k", d.key.clone(), &b).is_err(),
                "flip {i}"
            );
        }
        for n in 0..bytes.len() {
            assert!(
                decode_dead_letter("k", d.key.clone(), &bytes[..n]).is_err(),
                "prefix {n}"
            );
        }
    }

    /// A checksum-valid entry whose body length claims 4 GiB is refused before anything is
    /// allocated for it.
    #[test]
    fn huge_lengths_are_refused_without_allocating() {
        let mut v = vec![VERSION];
        v.extend_from_slice(&1u32.to_le_bytes());
        v.extend_from_slice(&0u64.to_le_bytes());
        v.extend_from_slice(&1u16.to_le_bytes());
        v.push(b't');
        v.extend_from_slice(&0u32.to_le_bytes());
        v.extend_from_slice(&u32::MAX.to_le_bytes());
        let crc = crc32fast::hash(&v);
        v.extend_from_slice(&crc.to_le_bytes());
        let key = dead_letter().key;
        match decode_dead_letter("dlq/g/2/40", key, &v) {
            Err(StoreError::Corrupt { key, why }) => {
                assert_eq!(key, "dlq/g/2/40");
                assert!(why.contains("record body claims"), "{why}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn unknown_versions_are_named() {
        let mut bytes = encode_epoch(3);
        assert_eq!(decode_epoch("epoch", &bytes).unwrap(), 3);
        bytes[0] = 9;
        let err = decode_epoch("epoch", &bytes).unwrap_err().to_string();
        assert!(err.contains("version 9") && err.contains("epoch"), "{err}");
    }

    #[test]
    fn rate_rule_round_trips_and_checks_length() {
        let r = RateRule {
            events_per_second: 10,
            burst: u64::MAX,
        };
        let bytes = encode_rate_rule(&r);
        assert_eq!(decode_rate_rule("k", &bytes).unwrap(), r);
        assert!(decode_rate_rule("k", &bytes[..bytes.len() - 1]).is_err());
    }

    #[test]
    fn subscription_keeps_latest_offsets_and_exact_floats() {
        let g = GroupName::new("g").unwrap();
        let mut spec = SubscriptionSpec::new(g.clone(), TopicName::new("t").unwrap());
        spec.start_from = StartFrom::Latest(BTreeMap::from([(0, 10), (5, u64::MAX)]));
        spec.backoff.multiplier = 1.0 + f64::EPSILON * 3.0;
        let bytes = encode_subscription(&spec).unwrap();
        assert_eq!(decode_subscription("k", &g, &bytes).unwrap(), spec);
        let other = GroupName::new("h").unwrap();
        assert!(decode_subscription("k", &other, &bytes).is_err());
    }
}
