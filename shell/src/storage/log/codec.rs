//! The on-disk layout of the embedded log, and the key hash that picks a partition.
//!
//! Records column family: key = topic bytes, `\0`, partition (u32 BE), offset (u64 BE), so
//! one partition is one contiguous, offset-ordered key range. Topic names are restricted to
//! `[A-Za-z0-9._-]` (see `TopicName`), so the `\0` separator cannot occur inside a name and
//! no topic's range overlaps another's.
//!
//! Record value, version 1 (21 header bytes, then the payload):
//!
//! ```text
//! [0]      version = 1
//! [1..9]   append wall time, ms (u64 BE), non-decreasing per partition: retention by age
//! [9..17]  position: payload bytes appended to the partition before this record (u64 BE),
//!          so the size of any suffix is one subtraction: retention by size
//! [17..21] CRC-32 of bytes [0..17] and of the payload
//! [21..]   payload
//! ```
//!
//! Meta column family: `T` + topic → topic header; `E` + topic + `\0` + partition (u32 BE) →
//! the partition's earliest offset once retention has moved it (absent = 0); `I` + topic +
//! `\0` + partition (u32 BE) + second (u64 BE) → the first offset appended in that wall-clock
//! second (the time index: one entry per partition per second in which it was appended to,
//! written in the same batch as the records, deleted by retention with them).
//!
//! Everything read back is checked (length, version, checksum) before use: a corrupt value
//! becomes a [`LogError::Corrupt`], never a panic or an out-of-bounds slice.

use unimesh_core::{Offset, Partition, TopicName};

use super::LogError;

pub(crate) const RECORD_VERSION: u8 = 1;
pub(crate) const RECORD_HEADER_LEN: usize = 21;

const TOPIC_VERSION: u8 = 1;
const TOPIC_META_LEN: usize = 13;
const EARLIEST_VERSION: u8 = 1;
const TIME_INDEX_VERSION: u8 = 1;
/// A version byte and a u64 (the earliest-offset meta, a time-index entry).
const OFFSET_VALUE_LEN: usize = 9;

const TOPIC_META_TAG: u8 = b'T';
const EARLIEST_META_TAG: u8 = b'E';
const TIME_INDEX_TAG: u8 = b'I';

/// The width of one time-index bucket: an entry per partition per wall-clock second.
pub(crate) const TIME_INDEX_BUCKET_MS: u64 = 1_000;

/// The stored header of one record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RecordHeader {
    pub append_ms: u64,
    pub position: u64,
}

/// `topic \0 partition` — the common prefix of one partition's record keys.
pub(crate) fn partition_prefix(topic: &TopicName, partition: Partition) -> Vec<u8> {
    let mut key = Vec::with_capacity(topic.as_str().len() + 1 + 4 + 8);
    key.extend_from_slice(topic.as_str().as_bytes());
    key.push(0);
    key.extend_from_slice(&partition.to_be_bytes());
    key
}

pub(crate) fn record_key(topic: &TopicName, partition: Partition, offset: Offset) -> Vec<u8> {
    let mut key = partition_prefix(topic, partition);
    key.extend_from_slice(&offset.to_be_bytes());
    key
}

/// Writes the record key into `out` (reused across a batch to spare an allocation per record).
pub(crate) fn record_key_into(
    out: &mut Vec<u8>,
    topic: &TopicName,
    partition: Partition,
    offset: Offset,
) {
    out.clear();
    out.extend_from_slice(topic.as_str().as_bytes());
    out.push(0);
    out.extend_from_slice(&partition.to_be_bytes());
    out.extend_from_slice(&offset.to_be_bytes());
}

/// The offset of a record key of the partition whose prefix is `prefix_len` bytes long.
pub(crate) fn record_key_offset(key: &[u8], prefix_len: usize) -> Result<Offset, LogError> {
    let tail = key
        .get(prefix_len..)
        .filter(|tail| tail.len() == 8)
        .ok_or_else(|| LogError::Corrupt {
            what: format!(
                "record key of {} bytes, expected {}",
                key.len(),
                prefix_len + 8
            ),
        })?;
    let mut be = [0u8; 8];
    be.copy_from_slice(tail);
    Ok(Offset::from_be_bytes(be))
}

/// Encodes a record value into `out` (cleared first).
pub(crate) fn encode_record_into(out: &mut Vec<u8>, header: RecordHeader, payload: &[u8]) {
    out.clear();
    out.reserve(RECORD_HEADER_LEN + payload.len());
    out.push(RECORD_VERSION);
    out.extend_from_slice(&header.append_ms.to_be_bytes());
    out.extend_from_slice(&header.position.to_be_bytes());
    let mut crc = crc32fast::Hasher::new();
    crc.update(&out[..17]);
    crc.update(payload);
    out.extend_from_slice(&crc.finalize().to_be_bytes());
    out.extend_from_slice(payload);
}

/// Checks and splits a stored record value into its header and payload.
pub(crate) fn decode_record(value: &[u8]) -> Result<(RecordHeader, &[u8]), LogError> {
    if value.len() < RECORD_HEADER_LEN {
        return Err(LogError::Corrupt {
            what: format!(
                "record value of {} bytes is shorter than its {RECORD_HEADER_LEN}-byte header",
                value.len()
            ),
        });
    }
    let (head, payload) = value.split_at(RECORD_HEADER_LEN);
    if head[0] != RECORD_VERSION {
        return Err(LogError::Corrupt {
            what: format!("record value version {} is not {RECORD_VERSION}", head[0]),
        });
    }
    let stored_crc = u32::from_be_bytes([head[17], head[18], head[19], head[20]]);
    let mut crc = crc32fast::Hasher::new();
    crc.update(&head[..17]);
    crc.update(payload);
    if crc.finalize() != stored_crc {
        return Err(LogError::Corrupt {
            what: "record value checksum mismatch".to_owned(),
        });
    }
    let header = RecordHeader {
        append_ms: be_u64(&head[1..9]),
        position: be_u64(&head[9..17]),
    };
    Ok((header, payload))
}

pub(crate) fn topic_meta_key(topic: &TopicName) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + topic.as_str().len());
    key.push(TOPIC_META_TAG);
    key.extend_from_slice(topic.as_str().as_bytes());
    key
}

/// The prefix shared by every topic meta key (to list the topics at open).
pub(crate) fn topic_meta_prefix() -> [u8; 1] {
    [TOPIC_META_TAG]
}

/// The topic named by a topic meta key.
pub(crate) fn topic_from_meta_key(key: &[u8]) -> Result<TopicName, LogError> {
    let name = key
        .strip_prefix(&[TOPIC_META_TAG])
        .and_then(|name| std::str::from_utf8(name).ok())
        .ok_or_else(|| LogError::Corrupt {
            what: "topic meta key is not a tag followed by UTF-8".to_owned(),
        })?;
    TopicName::new(name).map_err(|e| LogError::Corrupt {
        what: format!("topic meta key: {e}"),
    })
}

/// What is stored about a topic: its partition count (fixed at creation) and when it was made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TopicMeta {
    pub partitions: u32,
    pub created_ms: u64,
}

pub(crate) fn encode_topic_meta(meta: TopicMeta) -> Vec<u8> {
    let mut out = Vec::with_capacity(TOPIC_META_LEN);
    out.push(TOPIC_VERSION);
    out.extend_from_slice(&meta.partitions.to_be_bytes());
    out.extend_from_slice(&meta.created_ms.to_be_bytes());
    out
}

pub(crate) fn decode_topic_meta(value: &[u8]) -> Result<TopicMeta, LogError> {
    if value.len() != TOPIC_META_LEN || value[0] != TOPIC_VERSION {
        return Err(LogError::Corrupt {
            what: format!(
                "topic meta of {} bytes (version {:?}), expected {TOPIC_META_LEN} bytes of version {TOPIC_VERSION}",
                value.len(),
                value.first()
            ),
        });
    }
    Ok(TopicMeta {
        partitions: u32::from_be_bytes([value[1], value[2], value[3], value[4]]),
        created_ms: be_u64(&value[5..13]),
    })
}

pub(crate) fn earliest_meta_key(topic: &TopicName, partition: Partition) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + topic.as_str().len() + 1 + 4);
    key.push(EARLIEST_META_TAG);
    key.extend_from_slice(topic.as_str().as_bytes());
    key.push(0);
    key.extend_from_slice(&partition.to_be_bytes());
    key
}

pub(crate) fn encode_earliest(earliest: Offset) -> Vec<u8> {
    encode_offset(EARLIEST_VERSION, earliest).to_vec()
}

pub(crate) fn decode_earliest(value: &[u8]) -> Result<Offset, LogError> {
    decode_offset("earliest-offset meta", EARLIEST_VERSION, value)
}

/// A version byte and an offset (u64 BE): the earliest-offset meta and a time-index entry.
fn encode_offset(version: u8, offset: Offset) -> [u8; OFFSET_VALUE_LEN] {
    let mut out = [0u8; OFFSET_VALUE_LEN];
    out[0] = version;
    out[1..].copy_from_slice(&offset.to_be_bytes());
    out
}

fn decode_offset(what: &str, version: u8, value: &[u8]) -> Result<Offset, LogError> {
    if value.len() != OFFSET_VALUE_LEN || value[0] != version {
        return Err(LogError::Corrupt {
            what: format!(
                "{what} of {} bytes (version {:?}), expected {OFFSET_VALUE_LEN} bytes of version {version}",
                value.len(),
                value.first()
            ),
        });
    }
    Ok(be_u64(&value[1..9]))
}

/// The time-index bucket of an append time.
pub(crate) fn time_bucket(append_ms: u64) -> u64 {
    append_ms / TIME_INDEX_BUCKET_MS
}

/// `I topic \0 partition` — the common prefix of one partition's time-index keys.
pub(crate) fn time_index_prefix(topic: &TopicName, partition: Partition) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + topic.as_str().len() + 1 + 4 + 8);
    key.push(TIME_INDEX_TAG);
    key.extend_from_slice(topic.as_str().as_bytes());
    key.push(0);
    key.extend_from_slice(&partition.to_be_bytes());
    key
}

/// The time-index key of `bucket` (a second since the epoch) of one partition.
pub(crate) fn time_index_key(topic: &TopicName, partition: Partition, bucket: u64) -> Vec<u8> {
    let mut key = time_index_prefix(topic, partition);
    key.extend_from_slice(&bucket.to_be_bytes());
    key
}

/// The bucket of a time-index key of the partition whose prefix is `prefix_len` bytes long.
#[cfg(test)]
pub(crate) fn time_index_bucket(key: &[u8], prefix_len: usize) -> Result<u64, LogError> {
    key.get(prefix_len..)
        .filter(|tail| tail.len() == 8)
        .map(be_u64)
        .ok_or_else(|| LogError::Corrupt {
            what: format!(
                "time-index key of {} bytes, expected {}",
                key.len(),
                prefix_len + 8
            ),
        })
}

pub(crate) fn encode_time_index(first: Offset) -> [u8; OFFSET_VALUE_LEN] {
    encode_offset(TIME_INDEX_VERSION, first)
}

pub(crate) fn decode_time_index(value: &[u8]) -> Result<Offset, LogError> {
    decode_offset("time-index entry", TIME_INDEX_VERSION, value)
}

/// Callers pass exactly 8 bytes (checked by the slicing above them).
fn be_u64(bytes: &[u8]) -> u64 {
    let mut be = [0u8; 8];
    be.copy_from_slice(bytes);
    u64::from_be_bytes(be)
}

/// Kafka's murmur2 (the Java client's `Utils.murmur2`). Chosen over a Rust hasher because it is
/// specified byte for byte, never changes with a toolchain or platform, and sends a key to the
/// same partition as Kafka's default partitioner would over the same partition count.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;

    // Java computes `seed ^ length` on an int; the truncation is part of the specification.
    let mut h: u32 = SEED ^ (data.len() as u32);
    let chunks = data.chunks_exact(4);
    let rest = chunks.remainder();
    for chunk in chunks {
        let mut k = u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if let Some(&first) = rest.first() {
        h ^= u32::from(first);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition of a keyed record: Kafka's `toPositive(murmur2(key)) % partitions`.
pub fn partition_for_key(key: &[u8], partitions: u32) -> Partition {
    let positive = (murmur2(key) as u32) & 0x7fff_ffff;
    positive % partitions.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Apache Kafka's `UtilsTest.testMurmur2` vectors: if these move, keys move partitions.
    #[test]
    fn murmur2_matches_the_kafka_reference_vectors() {
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ];
        for (key, want) in cases {
            assert_eq!(murmur2(key), want, "{}", String::from_utf8_lossy(key));
        }
    }

    #[test]
    fn key_partition_is_pinned() {
        // toPositive(-790332482) = 1357151166; 1357151166 % 50 = 16, % 4 = 2.
        assert_eq!(partition_for_key(b"foobar", 50), 16);
        assert_eq!(partition_for_key(b"foobar", 4), 2);
    }

    #[test]
    fn record_value_round_trips() {
        let mut out = Vec::new();
        let header = RecordHeader {
            append_ms: 1_700_000_000_123,
            position: 42,
        };
        encode_record_into(&mut out, header, b"payload");
        let (back, payload) = decode_record(&out).unwrap();
        assert_eq!(back, header);
        assert_eq!(payload, b"payload");
    }

    #[test]
    fn every_truncation_and_every_bit_flip_of_a_record_is_refused() {
        let mut good = Vec::new();
        encode_record_into(
            &mut good,
            RecordHeader {
                append_ms: 7,
                position: 9,
            },
            b"hello world",
        );
        for len in 0..good.len() {
            assert!(decode_record(&good[..len]).is_err(), "truncated to {len}");
        }
        for byte in 0..good.len() {
            for bit in 0..8 {
                let mut bad = good.clone();
                bad[byte] ^= 1 << bit;
                assert!(
                    matches!(decode_record(&bad), Err(LogError::Corrupt { .. })),
                    "flip byte {byte} bit {bit}"
                );
            }
        }
    }

    #[test]
    fn meta_values_round_trip_and_refuse_garbage() {
        let meta = TopicMeta {
            partitions: 12,
            created_ms: 99,
        };
        assert_eq!(decode_topic_meta(&encode_topic_meta(meta)).unwrap(), meta);
        assert_eq!(decode_earliest(&encode_earliest(77)).unwrap(), 77);
        assert!(decode_topic_meta(b"").is_err());
        assert!(decode_topic_meta(&[2; TOPIC_META_LEN]).is_err());
        assert!(decode_earliest(&[1; 4]).is_err());
        assert_eq!(
            decode_time_index(&encode_time_index(12_345)).unwrap(),
            12_345
        );
        assert!(decode_time_index(&[2; OFFSET_VALUE_LEN]).is_err());
        assert!(decode_time_index(&[1; 8]).is_err());
        let topic = TopicName::new("orders").unwrap();
        assert_eq!(topic_from_meta_key(&topic_meta_key(&topic)).unwrap(), topic);
        assert!(topic_from_meta_key(b"Tbad/name").is_err());
        assert!(topic_from_meta_key(b"").is_err());
    }

    #[test]
    fn record_keys_sort_by_offset_and_parse_back() {
        let topic = TopicName::new("t").unwrap();
        let a = record_key(&topic, 1, 255);
        let b = record_key(&topic, 1, 256);
        assert!(a < b);
        let prefix = partition_prefix(&topic, 1).len();
        assert_eq!(record_key_offset(&b, prefix).unwrap(), 256);
        assert!(record_key_offset(&b[..b.len() - 1], prefix).is_err());
        // A topic whose name extends another's must not fall inside its key range.
        let longer = TopicName::new("t.x").unwrap();
        assert!(record_key(&longer, 0, 0) > record_key(&topic, u32::MAX, u64::MAX));
    }

    #[test]
    fn time_index_keys_sort_by_second_within_their_partition_and_parse_back() {
        let topic = TopicName::new("t").unwrap();
        let a = time_index_key(&topic, 1, 255);
        let b = time_index_key(&topic, 1, 256);
        assert!(a < b);
        assert!(time_index_key(&topic, 0, u64::MAX) < a, "partitions apart");
        let prefix = time_index_prefix(&topic, 1).len();
        assert_eq!(time_index_bucket(&b, prefix).unwrap(), 256);
        assert!(time_index_bucket(&b[..b.len() - 1], prefix).is_err());
        // Another tag's keys never fall inside a partition's index range.
        assert!(!earliest_meta_key(&topic, 1).starts_with(&time_index_prefix(&topic, 1)));
        let longer = TopicName::new("t.x").unwrap();
        assert!(time_index_key(&longer, 0, 0) > time_index_key(&topic, u32::MAX, u64::MAX));
        assert_eq!(time_bucket(1_999), 1);
        assert_eq!(time_bucket(2_000), 2);
    }
}
