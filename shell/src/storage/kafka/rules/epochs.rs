//! Leader epochs: how a lane tells that the log it reads diverged from the log its
//! checkpoint knew (docs/DESIGN.md §8, "the shell validates a lane against leader epochs";
//! Kafka's KIP-320, done here because a checkpoint knows offsets above the position
//! librdkafka would validate: its ACK ranges and attempt counts).
//!
//! Every record batch carries the leader epoch of the leader that appended it, and epochs
//! never fall along a partition's offsets. A lane's *epoch* is the highest leader epoch of
//! the records it read (or the stamp of the checkpoint it resumed from); every progress
//! record is stamped with it ([`LEADER_EPOCH_HEADER`]). When a replica loses its tail (an
//! unclean election; a follower truncated to its new leader's log), the offsets from the
//! divergence point on name records a later leader appended, whose epoch is above every
//! epoch the lost records had. So the contract, for a checkpoint stamped `E` that knows
//! offsets below `known_end`:
//!
//! **the log diverged from it at `D`, the first offset below `known_end` whose record has
//! a leader epoch above `E`** — or, when there is none but the log now ends below
//! `known_end`, at the log's end (the tail holding what it knew is gone).
//!
//! The lane's first fetch is then answered `OutOfRange{end: D}`, so the core forgets what
//! it knew from `D` and reports the loss (`consumer.rs`). [`divergence`] finds `D` by
//! reading first records: one read in the common case (the record at `known_end - 1`, or
//! the first one after it, has an epoch not above `E`, and by monotony nothing below it
//! has), a binary search over first-record reads otherwise. A record whose epoch the
//! broker does not report (`None`: an old message format, a broker that does not stamp
//! batches) is no evidence of divergence, and a checkpoint without a stamp is checked
//! only against the log's end.

// Under madsim only the header is used (its broker has no leader epochs; `io/probe.rs`,
// which reads them, is not built there).
#![cfg_attr(madsim, allow(dead_code))]

use unimesh_core::Offset;

/// The header of a progress record that carries its lane's leader epoch (ASCII decimal).
pub(crate) const LEADER_EPOCH_HEADER: &str = "unimesh-leader-epoch";

/// A leader epoch read from a header value; `None` for anything but a non-negative
/// decimal `i32`.
pub(crate) fn parse_epoch(value: &[u8]) -> Option<i32> {
    std::str::from_utf8(value)
        .ok()?
        .parse::<i32>()
        .ok()
        .filter(|&e| e >= 0)
}

/// The first record at or after an offset, as a probe reads it: its offset and leader
/// epoch (`None` when the broker reports none); `None` when no record follows.
pub(crate) type FirstRecord = Option<(Offset, Option<i32>)>;

/// Where the log diverged from a checkpoint stamped `stamp` that knows offsets below
/// `known_end`, given the log's `[earliest, end)` and `first_at(o)`, which reads the first
/// record at or after `o` (see the module documentation for the contract). `None` when it
/// did not diverge. At most about `2 * log2(known_end - earliest) + 2` reads.
pub(crate) fn divergence<E>(
    stamp: Option<i32>,
    earliest: Offset,
    end: Offset,
    known_end: Offset,
    mut first_at: impl FnMut(Offset) -> Result<FirstRecord, E>,
) -> Result<Option<Offset>, E> {
    let past_end = (known_end > end).then_some(end);
    let Some(stamp) = stamp else {
        return Ok(past_end);
    };
    let top = known_end.min(end);
    if top <= earliest {
        return Ok(past_end);
    }
    let newer = |r: FirstRecord| r.is_some_and(|(_, e)| e.is_some_and(|e| e > stamp));
    let mut last = top - 1;
    let mut first = first_at(last)?;
    if first.is_none() {
        // No record at or after `top - 1` (transaction markers, say): the last record
        // below `top` is the one before the first offset from which none follows.
        let none_from = first_where(earliest, last, |o| Ok(first_at(o)?.is_none()))?;
        if none_from == earliest {
            return Ok(past_end);
        }
        last = none_from - 1;
        first = first_at(last)?;
    }
    if !newer(first) {
        return Ok(past_end);
    }
    // Epochs never fall along the offsets, so "the first record at or after o is newer
    // than the stamp" holds from some offset on.
    first_where(earliest, last, |o| Ok(newer(first_at(o)?))).map(Some)
}

/// A log's end as the lane may take it: what the broker claimed, or what the log was shown
/// to hold when the claim is below what the lane knows (`refuted`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EvidentEnd {
    pub end: Offset,
    /// The broker claimed an end below records it still holds.
    pub refuted: bool,
}

/// The end of a log whose broker claims `claimed`, for a lane that knows offsets below
/// `known_end`, given `first_at(o)`, which reads the first record at or after `o` with no
/// bound (an offset past the log's end reads as none).
///
/// Contract (docs/DESIGN.md §8, "a partition's end is a claim"): **an end below what the
/// lane knows is evidence of nothing until the log confirms it**. A claim at or above
/// `known_end` is taken as it is (no read). Below it, the log is read: a record at or
/// after `known_end - 1` shows that the log still holds everything the lane knew of (the
/// claim is refuted; a refill there is the leader-epoch check's to find, [`divergence`]);
/// otherwise the log ends at the first offset from which no record follows, which is the
/// claim when nothing follows it (confirmed) and above it when records do (refuted).
/// One read when the claim is refuted by the tail, `log2(known_end - claimed) + 1` more
/// otherwise. tansu 0.6.0 claims the start of a partition's last batch plus one: with the
/// claim taken as evidence, a lane dropped what it had handed out above it as a lost tail.
pub(crate) fn evident_end<E>(
    claimed: Offset,
    known_end: Offset,
    mut first_at: impl FnMut(Offset) -> Result<FirstRecord, E>,
) -> Result<EvidentEnd, E> {
    if claimed >= known_end {
        return Ok(EvidentEnd {
            end: claimed,
            refuted: false,
        });
    }
    if let Some((o, _)) = first_at(known_end - 1)? {
        return Ok(EvidentEnd {
            end: known_end.max(o + 1),
            refuted: true,
        });
    }
    // Nothing at or after `known_end - 1`: "no record follows" holds there, and from some
    // offset at or above the claim on.
    let end = first_where(claimed, known_end - 1, |o| Ok(first_at(o)?.is_none()))?;
    Ok(EvidentEnd {
        end,
        refuted: end > claimed,
    })
}

/// Look-backs at most this far below an offset (a record batch is rarely larger; past it
/// the broker's answer stands).
pub(crate) const MAX_LOOK_BACK: Offset = 1 << 20;

/// Where to read from next to learn whether a broker's answer from past `at` skipped
/// records: `step` below `at` (steps double: 1, 2, 4, ...), never below `earliest`;
/// `None` when the last look-back already read from `earliest` or the bound is reached.
pub(crate) fn look_back_from(at: Offset, step: Offset, earliest: Offset) -> Option<Offset> {
    if at <= earliest || step > MAX_LOOK_BACK || step == 0 {
        return None;
    }
    let previous = at.saturating_sub(step / 2);
    if step > 1 && previous <= earliest {
        return None;
    }
    Some(at.saturating_sub(step).max(earliest))
}

/// A read from a broker that may skip records: the offset to read from so that the
/// stream holds every record at or after the target, and the first record at or after it
/// (its offset and what was read of it: by default its leader epoch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Read<H = (Offset, Option<i32>)> {
    pub from: Offset,
    pub hit: Option<H>,
}

/// The first record at or after `o`, from a broker that may answer a read from inside a
/// record batch with the *next* batch (tansu 0.6.0 does: a read from offset 3 of a batch
/// of ten returns offset 10 first, and a read from inside the last batch returns
/// nothing), and where to read from to get it. `scan(from, target)` reads from `from` and
/// returns the first record it read and the first record at or after `target`.
///
/// Contract (docs/DESIGN.md §8, "absence is a claim after a reposition"): a read that
/// starts at `o` and returns nothing at `o` first says nothing of `o` to the next record
/// until a read from further back ([`look_back_from`]) returns a record at or below `o`
/// first (its batch came whole, so what follows is the log's own order) or starts at the
/// log's `earliest`. On a broker that returns whole batches (Kafka) this costs no read
/// more where the record at `o` exists, and one more where a gap or the log's end is.
pub(crate) fn read_looking_back<H, E>(
    o: Offset,
    earliest: Offset,
    mut scan: impl FnMut(Offset, Offset) -> Result<(Option<Offset>, Option<H>), E>,
) -> Result<Read<H>, E> {
    let (first, mut hit) = scan(o, o)?;
    if first.is_some_and(|f| f <= o) || o <= earliest {
        return Ok(Read { from: o, hit });
    }
    let mut step = 1;
    while let Some(from) = look_back_from(o, step, earliest) {
        let (first, h) = scan(from, o)?;
        hit = h;
        if first.is_some_and(|f| f <= o) || from <= earliest {
            return Ok(Read { from, hit });
        }
        step *= 2;
    }
    Ok(Read { from: o, hit })
}

/// The first offset in `[lo, hi]` where `holds`, for a `holds` that is false up to some
/// offset and true from there on, and true at `hi` (so the answer is at most `hi`).
pub(crate) fn first_where<E>(
    mut lo: Offset,
    mut hi: Offset,
    mut holds: impl FnMut(Offset) -> Result<bool, E>,
) -> Result<Offset, E> {
    // Invariant: `holds(hi)`; not `holds(o)` for every `o` below `lo`.
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if holds(mid)? {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Ok(lo)
}

/// The offset a checkpoint knows up to (exclusive): its done offsets and its attempt
/// counts.
pub(crate) fn known_end(c: &unimesh_core::Checkpoint) -> Offset {
    let attempts = c.attempts.iter().map(|&(o, _)| o + 1).max().unwrap_or(0);
    c.progress.done_end().max(attempts)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// A partition as a probe sees it: records by offset with their epochs (offsets
    /// missing are gaps), and how many reads were made.
    struct Log {
        records: BTreeMap<Offset, Option<i32>>,
        reads: usize,
    }

    impl Log {
        fn new(of: &[(Offset, Option<i32>)]) -> Self {
            Self {
                records: of.iter().copied().collect(),
                reads: 0,
            }
        }

        fn first_at(&mut self, o: Offset) -> Result<FirstRecord, ()> {
            self.reads += 1;
            Ok(self.records.range(o..).next().map(|(&o, &e)| (o, e)))
        }

        fn check(
            &mut self,
            stamp: Option<i32>,
            earliest: Offset,
            known_end: Offset,
        ) -> Option<Offset> {
            let end = self.records.keys().last().map_or(earliest, |&o| o + 1);
            self.check_with_end(stamp, earliest, end, known_end)
        }

        fn check_with_end(
            &mut self,
            stamp: Option<i32>,
            earliest: Offset,
            end: Offset,
            known_end: Offset,
        ) -> Option<Offset> {
            divergence(stamp, earliest, end, known_end, |o| self.first_at(o)).expect("no error")
        }
    }

    fn epochs(from: Offset, to: Offset, e: i32) -> Vec<(Offset, Option<i32>)> {
        (from..to).map(|o| (o, Some(e))).collect()
    }

    /// Goal: a checkpoint read against a log that has only what it knew (in its epoch or
    /// before) does not diverge, and costs one read. Method: logs whose records up to the
    /// checkpoint's end are of epochs at or below the stamp, later ones above it.
    #[test]
    fn a_log_that_kept_what_the_checkpoint_knew_does_not_diverge() {
        let mut of = epochs(0, 5, 0);
        of.extend(epochs(5, 10, 1));
        of.extend(epochs(10, 20, 3));
        let mut log = Log::new(&of);
        assert_eq!(log.check(Some(1), 0, 10), None);
        assert_eq!(log.reads, 1);
        // A higher stamp, from the same history, is as good.
        assert_eq!(log.check(Some(3), 0, 20), None);
        // Records the checkpoint did not know may be newer.
        assert_eq!(log.check(Some(0), 0, 5), None);
    }

    /// Goal: the divergence point is the first offset of a newer leader below what the
    /// checkpoint knew, wherever it lies (above the watermark, below it, at its first
    /// offset). Method: a log refilled by epoch 2 from offset `d` on, read with checkpoints
    /// stamped 1 knowing up to 12, for every `d`.
    #[test]
    fn the_divergence_is_the_first_offset_of_a_newer_leader() {
        for d in 0..12 {
            let mut of = epochs(0, d, 1);
            of.extend(epochs(d, 15, 2));
            let mut log = Log::new(&of);
            assert_eq!(log.check(Some(1), 0, 12), Some(d), "refilled from {d}");
            assert!(log.reads <= 6, "{} reads for 12 offsets", log.reads);
        }
    }

    /// Goal: gaps (compaction, transaction markers) neither hide a divergence nor make
    /// one up. Method: gaps right below the divergence point, and a run of absent offsets
    /// at the log's tail below what the checkpoint knew.
    #[test]
    fn gaps_neither_hide_nor_make_up_a_divergence() {
        // 0..4 of epoch 0, 4..7 absent, 7.. of epoch 1: new records start at 7, and 4..7
        // (absent either way) count from the point after the last old record.
        let mut of = epochs(0, 4, 0);
        of.extend(epochs(7, 12, 1));
        let mut log = Log::new(&of);
        assert_eq!(log.check(Some(0), 0, 12), Some(4));
        // A tail of absent offsets (markers) below the checkpoint's end, log end 12.
        let mut of = epochs(0, 3, 0);
        of.extend(epochs(3, 6, 1));
        let mut log = Log::new(&of);
        assert_eq!(log.check_with_end(Some(0), 0, 12, 12), Some(3));
        let mut log = Log::new(&epochs(0, 6, 0));
        assert_eq!(log.check_with_end(Some(0), 0, 12, 12), None);
        // Nothing at all between earliest and the end.
        let mut log = Log::new(&[]);
        assert_eq!(log.check_with_end(Some(0), 0, 12, 12), None);
    }

    /// Goal: a log shorter than what the checkpoint knew diverged at its end at the latest,
    /// earlier when a newer leader refilled part of it; without a stamp only the end
    /// tells. Method: a log cut back to 8 and refilled from 5 by epoch 1, checkpoint knowing
    /// up to 10.
    #[test]
    fn a_shorter_log_diverges_at_its_end_or_below() {
        let mut of = epochs(0, 5, 0);
        of.extend(epochs(5, 8, 1));
        let mut log = Log::new(&of);
        assert_eq!(log.check(Some(0), 0, 10), Some(5));
        assert_eq!(log.check(None, 0, 10), Some(8));
        let mut log = Log::new(&epochs(0, 8, 0));
        assert_eq!(log.check(Some(0), 0, 10), Some(8));
        assert_eq!(log.check(None, 0, 8), None);
    }

    /// Goal: epochs the broker does not report are no evidence, and retention bounds the
    /// search. Method: unstamped records, and a divergence below the log's earliest.
    #[test]
    fn unknown_epochs_and_retention() {
        let of: Vec<_> = (0..10).map(|o| (o, None)).collect();
        let mut log = Log::new(&of);
        assert_eq!(log.check(Some(0), 0, 10), None);
        // Earliest 4, every record of epoch 2: the search stops at earliest.
        let mut log = Log::new(&epochs(4, 10, 2));
        assert_eq!(log.check(Some(1), 4, 10), Some(4));
    }

    /// What [`evident_end`] makes of a claimed end over this log, and the reads it took.
    fn evident(
        of: &[(Offset, Option<i32>)],
        claimed: Offset,
        known_end: Offset,
    ) -> (EvidentEnd, usize) {
        let mut log = Log::new(of);
        let e = evident_end(claimed, known_end, |o| log.first_at(o)).expect("no error");
        (e, log.reads)
    }

    /// Goal: a broker's end below what the lane knows is taken only once the log confirms
    /// it (issue 18: tansu claimed 1 after one batch of 10, and the lane dropped 2..10).
    /// Method: the same claims over logs that hold the tail, hold part of it, and lost it;
    /// a claim at or above what the lane knows costs no read.
    #[test]
    fn an_end_below_what_the_lane_knows_needs_the_log_to_confirm_it() {
        let ten = epochs(0, 10, 0);
        // tansu's claim after one batch of ten: refuted by the record at 9, one read.
        assert_eq!(
            evident(&ten, 1, 10),
            (
                EvidentEnd {
                    end: 10,
                    refuted: true
                },
                1
            )
        );
        // The log holds more than the lane knew: the end is at least past that record.
        assert_eq!(
            evident(&ten, 1, 5).0,
            EvidentEnd {
                end: 5,
                refuted: true
            }
        );
        // A claim at or above what the lane knows: as claimed, nothing read.
        assert_eq!(
            evident(&ten, 10, 10),
            (
                EvidentEnd {
                    end: 10,
                    refuted: false
                },
                0
            )
        );
        assert_eq!(
            evident(&[], 0, 0),
            (
                EvidentEnd {
                    end: 0,
                    refuted: false
                },
                0
            )
        );
        // Really cut back to 6: confirmed, and the lane forgets from 6.
        let six = epochs(0, 6, 0);
        assert_eq!(
            evident(&six, 6, 10).0,
            EvidentEnd {
                end: 6,
                refuted: false
            }
        );
        // Cut back to 6, claimed 2: the log shows 6.
        let (e, reads) = evident(&six, 2, 10);
        assert_eq!(
            e,
            EvidentEnd {
                end: 6,
                refuted: true
            }
        );
        assert!(reads <= 5, "{reads} reads");
        // Every claim below the end of a log that lost its tail at 6 finds 6.
        for claimed in 0..=6 {
            assert_eq!(evident(&six, claimed, 10).0.end, 6, "claimed {claimed}");
        }
        // An empty log confirms any claim.
        assert_eq!(
            evident(&[], 0, 10).0,
            EvidentEnd {
                end: 0,
                refuted: false
            }
        );
    }

    /// A broker that answers a read from inside a batch with the next batch (tansu
    /// 0.6.0): `scan(from, target)` over batches of records.
    fn batched_scan<'a>(
        batches: &'a [(Offset, Offset)],
        reads: &'a mut usize,
    ) -> impl FnMut(Offset, Offset) -> Result<(Option<Offset>, FirstRecord), ()> + 'a {
        move |from, target| {
            *reads += 1;
            // The first batch whose base is at or above `from`, and every batch after it.
            let records: Vec<Offset> = batches
                .iter()
                .filter(|(base, _)| *base >= from)
                .flat_map(|&(base, end)| base..end)
                .collect();
            let first = records.first().copied();
            let hit = records
                .iter()
                .find(|&&r| r >= target)
                .map(|&r| (r, Some(0)));
            Ok((first, hit))
        }
    }

    /// Goal: a read from inside a batch that the broker answers with the next batch does
    /// not make the rest of the batch absent (issue 18, tansu); a real gap stays a gap.
    /// Method: batches [0, 10), [10, 20), [25, 26) read from every offset, against the
    /// record that is really first at or after it.
    #[test]
    fn a_read_from_inside_a_batch_looks_back_before_taking_a_gap() {
        let batches = [(0, 10), (10, 20), (25, 26)];
        for o in 0..27 {
            let mut reads = 0;
            let read =
                read_looking_back(o, 0, batched_scan(&batches, &mut reads)).expect("no error");
            let got = read.hit.map(|(r, _)| r);
            // Reading on from where it read gives the same answer.
            let mut again = 0;
            let (_, from_there) =
                batched_scan(&batches, &mut again)(read.from, o).expect("no error");
            assert_eq!(from_there.map(|(r, _)| r), got, "read from {}", read.from);
            let want = match o {
                0..=19 => Some(o),
                20..=25 => Some(25),
                _ => None,
            };
            assert_eq!(got, want, "first record at or after {o}");
            assert!(reads <= 6, "{reads} reads from {o}");
        }
        // What a read from `o` over `batches` (log from `earliest`) answers, and its reads.
        let read_at = |batches: &[(Offset, Offset)], o: Offset, earliest: Offset| {
            let mut reads = 0;
            let read = read_looking_back(o, earliest, batched_scan(batches, &mut reads));
            (read, reads)
        };
        let found = |from, at| {
            Ok(Read {
                from,
                hit: Some((at, Some(0))),
            })
        };
        // A batch start costs one read, and reads from there.
        assert_eq!(read_at(&batches, 10, 0), (found(10, 10), 1));
        // Inside the last batch nothing comes from there; the batch is found behind.
        assert_eq!(read_at(&[(5, 12)], 8, 5).0, found(5, 8));
        // A whole-batch broker at the log's end: one read more, from just before it.
        let whole: Vec<(Offset, Offset)> = (0..10).map(|o| (o, o + 1)).collect();
        assert_eq!(read_at(&whole, 10, 0), (Ok(Read { from: 9, hit: None }), 2));
    }

    #[test]
    fn look_backs_double_and_stop_at_the_earliest() {
        let steps: Vec<Offset> = (0..6)
            .map_while(|i| look_back_from(100, 1 << i, 90))
            .collect();
        assert_eq!(steps, vec![99, 98, 96, 92, 90]);
        assert_eq!(look_back_from(5, 1, 5), None);
        assert_eq!(look_back_from(0, 1, 0), None);
        assert_eq!(
            look_back_from(3, 8, 0),
            None,
            "the read from 0 was the last"
        );
    }

    /// Goal: a read error is the caller's, never a verdict.
    #[test]
    fn a_failed_read_is_an_error() {
        let r: Result<Option<Offset>, &str> = divergence(Some(0), 0, 10, 10, |_| Err("down"));
        assert_eq!(r, Err("down"));
    }

    #[test]
    fn epoch_headers_parse_strictly() {
        assert_eq!(parse_epoch(b"7"), Some(7));
        assert_eq!(parse_epoch(b"-1"), None);
        assert_eq!(parse_epoch(b"x"), None);
        assert_eq!(parse_epoch(b""), None);
    }

    #[test]
    fn a_checkpoint_knows_its_ranges_and_attempts() {
        use unimesh_core::{Checkpoint, Progress};
        let cp = Checkpoint {
            progress: Progress::from_parts(3, [(5, 7)]).expect("valid"),
            attempts: vec![(9, 2)],
        };
        assert_eq!(known_end(&cp), 10);
        assert_eq!(known_end(&Checkpoint::new(4)), 4);
    }
}
