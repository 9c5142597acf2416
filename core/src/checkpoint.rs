//! The persisted state of one (group, topic, partition) lane and its byte encoding.
//!
//! A checkpoint is written as a whole (never as a delta), so persists are idempotent and a
//! retried or reordered-then-overwritten write cannot corrupt progress. The encoding is
//! versioned and ends in a CRC-32; the decoder checks every length against what is left
//! before allocating (the seed allocated from sizes it had not checked: upstream #5361) and
//! refuses anything that would break the progress invariants.
//!
//! Layout, little-endian:
//! ```text
//! magic "UMCK" | version u8 = 1 | watermark u64
//! | range_count u32 | (start u64, end u64) * range_count
//! | attempt_count u32 | (offset u64, attempts u32) * attempt_count
//! | crc32 u32 (of everything before it)
//! ```

use std::fmt;

use crate::progress::{Progress, ProgressError};
use crate::types::Offset;

const MAGIC: &[u8; 4] = b"UMCK";
const VERSION: u8 = 1;
const HEADER_LEN: usize = 4 + 1 + 8;
const RANGE_LEN: usize = 16;
const ATTEMPT_LEN: usize = 12;

/// What a lane must remember across a crash.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Checkpoint {
    pub progress: Progress,
    /// Attempt numbers (>= 2) that may have been issued for not-done records, ascending by
    /// offset. A redelivery is handed out only after its attempt number is in a durable
    /// checkpoint, so retries stay bounded across crashes (C5). A first attempt is not
    /// recorded: after a crash it may be repeated once, as C2 allows for in-flight records.
    pub attempts: Vec<(Offset, u32)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckpointError {
    Truncated { needed: usize, available: usize },
    BadMagic,
    UnsupportedVersion(u8),
    ChecksumMismatch,
    TrailingBytes(usize),
    InvalidProgress(ProgressError),
    AttemptsNotAscending { offset: Offset },
    AttemptBelowWatermark { offset: Offset },
    AttemptNumberBelowTwo { offset: Offset },
}

impl fmt::Display for CheckpointError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "corrupt checkpoint: {self:?}")
    }
}

impl std::error::Error for CheckpointError {}

impl Checkpoint {
    pub fn new(watermark: Offset) -> Self {
        Self {
            progress: Progress::new(watermark),
            attempts: Vec::new(),
        }
    }

    /// Attempts recorded for `offset` (0 when none are recorded).
    pub fn attempts_of(&self, offset: Offset) -> u32 {
        self.attempts
            .binary_search_by_key(&offset, |&(o, _)| o)
            .map_or(0, |i| self.attempts[i].1)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            HEADER_LEN
                + 8
                + self.progress.range_count() * RANGE_LEN
                + self.attempts.len() * ATTEMPT_LEN
                + 4,
        );
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.extend_from_slice(&self.progress.watermark().to_le_bytes());
        // Counts are bounded by configuration far below u32::MAX; the assertion documents it.
        let ranges = u32::try_from(self.progress.range_count()).unwrap_or(u32::MAX);
        assert!((ranges as usize) == self.progress.range_count());
        out.extend_from_slice(&ranges.to_le_bytes());
        for (s, e) in self.progress.ranges() {
            out.extend_from_slice(&s.to_le_bytes());
            out.extend_from_slice(&e.to_le_bytes());
        }
        let attempts = u32::try_from(self.attempts.len()).unwrap_or(u32::MAX);
        assert!((attempts as usize) == self.attempts.len());
        out.extend_from_slice(&attempts.to_le_bytes());
        for (o, n) in &self.attempts {
            out.extend_from_slice(&o.to_le_bytes());
            out.extend_from_slice(&n.to_le_bytes());
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, CheckpointError> {
        if bytes.len() < HEADER_LEN + 8 + 4 {
            return Err(CheckpointError::Truncated {
                needed: HEADER_LEN + 8 + 4,
                available: bytes.len(),
            });
        }
        let (body, crc) = bytes.split_at(bytes.len() - 4);
        if &body[..4] != MAGIC {
            return Err(CheckpointError::BadMagic);
        }
        if body[4] != VERSION {
            return Err(CheckpointError::UnsupportedVersion(body[4]));
        }
        let want = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
        if crc32fast::hash(body) != want {
            return Err(CheckpointError::ChecksumMismatch);
        }
        let mut r = Reader {
            buf: body,
            pos: HEADER_LEN - 8,
        };
        let watermark = r.u64()?;
        let range_count = r.u32()? as usize;
        r.need(range_count.saturating_mul(RANGE_LEN))?;
        let mut ranges = Vec::with_capacity(range_count);
        for _ in 0..range_count {
            ranges.push((r.u64()?, r.u64()?));
        }
        let progress =
            Progress::from_parts(watermark, ranges).map_err(CheckpointError::InvalidProgress)?;
        let attempt_count = r.u32()? as usize;
        r.need(attempt_count.saturating_mul(ATTEMPT_LEN))?;
        let mut attempts: Vec<(Offset, u32)> = Vec::with_capacity(attempt_count);
        for _ in 0..attempt_count {
            let offset = r.u64()?;
            let n = r.u32()?;
            if offset < watermark {
                return Err(CheckpointError::AttemptBelowWatermark { offset });
            }
            if n < 2 {
                return Err(CheckpointError::AttemptNumberBelowTwo { offset });
            }
            if let Some(&(prev, _)) = attempts.last() {
                if offset <= prev {
                    return Err(CheckpointError::AttemptsNotAscending { offset });
                }
            }
            attempts.push((offset, n));
        }
        if r.pos != body.len() {
            return Err(CheckpointError::TrailingBytes(body.len() - r.pos));
        }
        Ok(Self { progress, attempts })
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn need(&self, n: usize) -> Result<(), CheckpointError> {
        let available = self.buf.len() - self.pos;
        if n > available {
            return Err(CheckpointError::Truncated {
                needed: n,
                available,
            });
        }
        Ok(())
    }

    fn u64(&mut self) -> Result<u64, CheckpointError> {
        self.need(8)?;
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.buf[self.pos..self.pos + 8]);
        self.pos += 8;
        Ok(u64::from_le_bytes(b))
    }

    fn u32(&mut self) -> Result<u32, CheckpointError> {
        self.need(4)?;
        let mut b = [0u8; 4];
        b.copy_from_slice(&self.buf[self.pos..self.pos + 4]);
        self.pos += 4;
        Ok(u32::from_le_bytes(b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quickcheck::{quickcheck, Arbitrary, Gen};

    fn sample() -> Checkpoint {
        let mut progress = Progress::new(100);
        progress.mark_done(105);
        progress.mark_done(106);
        progress.mark_done(110);
        Checkpoint {
            progress,
            attempts: vec![(100, 2), (103, 5)],
        }
    }

    #[test]
    fn round_trips() {
        let c = sample();
        assert_eq!(Checkpoint::decode(&c.encode()), Ok(c));
    }

    #[test]
    fn every_single_bit_flip_is_refused() {
        let bytes = sample().encode();
        for i in 0..bytes.len() * 8 {
            let mut b = bytes.clone();
            b[i / 8] ^= 1 << (i % 8);
            assert!(Checkpoint::decode(&b).is_err(), "flip of bit {i} accepted");
        }
    }

    #[test]
    fn every_truncation_is_refused() {
        let bytes = sample().encode();
        for n in 0..bytes.len() {
            assert!(
                Checkpoint::decode(&bytes[..n]).is_err(),
                "prefix {n} accepted"
            );
        }
    }

    /// A checksum-valid body whose count claims more entries than the input holds must be
    /// refused before anything is allocated for it.
    #[test]
    fn huge_counts_are_refused_without_allocating() {
        let mut body = Vec::new();
        body.extend_from_slice(MAGIC);
        body.push(VERSION);
        body.extend_from_slice(&0u64.to_le_bytes());
        body.extend_from_slice(&u32::MAX.to_le_bytes());
        let crc = crc32fast::hash(&body);
        body.extend_from_slice(&crc.to_le_bytes());
        assert!(matches!(
            Checkpoint::decode(&body),
            Err(CheckpointError::Truncated { .. })
        ));
    }

    #[test]
    fn semantic_corruption_is_refused() {
        let mut c = sample();
        c.attempts = vec![(50, 2)];
        assert_eq!(
            Checkpoint::decode(&c.encode()),
            Err(CheckpointError::AttemptBelowWatermark { offset: 50 })
        );
        let mut c = sample();
        c.attempts = vec![(103, 2), (101, 2)];
        assert!(matches!(
            Checkpoint::decode(&c.encode()),
            Err(CheckpointError::AttemptsNotAscending { .. })
        ));
    }

    #[derive(Clone, Debug)]
    struct AnyCheckpoint(Checkpoint);

    impl Arbitrary for AnyCheckpoint {
        fn arbitrary(g: &mut Gen) -> Self {
            let wm = u64::arbitrary(g) % 1_000_000;
            let mut progress = Progress::new(wm);
            for _ in 0..usize::arbitrary(g) % 20 {
                progress.mark_done(wm + 1 + u64::arbitrary(g) % 500);
            }
            let mut attempts: Vec<(u64, u32)> = (0..usize::arbitrary(g) % 10)
                .map(|_| (wm + u64::arbitrary(g) % 500, 2 + u32::arbitrary(g) % 9))
                .collect();
            attempts.sort_unstable();
            attempts.dedup_by_key(|a| a.0);
            AnyCheckpoint(Checkpoint { progress, attempts })
        }
    }

    quickcheck! {
        fn encode_decode_round_trip(c: AnyCheckpoint) -> bool {
            Checkpoint::decode(&c.0.encode()) == Ok(c.0)
        }

        fn decode_any_bytes_never_panics(bytes: Vec<u8>) -> bool {
            // Either an error or a checkpoint that re-encodes to the same bytes.
            match Checkpoint::decode(&bytes) {
                Ok(c) => c.encode() == bytes,
                Err(_) => true,
            }
        }
    }
}
