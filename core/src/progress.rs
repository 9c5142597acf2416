//! The ACK watermark of one (group, topic, partition) and the sparse ACK ranges above it.
//!
//! The watermark is the lowest offset not yet done (ACKed or dead-lettered): every offset
//! below it is done. Offsets done above it are kept as disjoint, non-adjacent half-open
//! ranges until the gap below them closes. The seed kept "the last ACKed offset" and
//! restarted from the minimum of those, which skips records when ACKs arrive out of order;
//! this structure cannot express that mistake.

use std::collections::BTreeMap;

use crate::types::Offset;

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Progress {
    watermark: Offset,
    /// start -> end (exclusive). Invariants: every start > watermark (a range starting at the
    /// watermark is folded into it), ranges are disjoint and never adjacent.
    ranges: BTreeMap<Offset, Offset>,
}

/// Why a stored progress could not be rebuilt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProgressError {
    EmptyRange { start: Offset },
    RangeAtOrBelowWatermark { start: Offset },
    RangesOverlapOrTouch { start: Offset },
}

impl Progress {
    pub fn new(watermark: Offset) -> Self {
        Self {
            watermark,
            ranges: BTreeMap::new(),
        }
    }

    /// Rebuilds progress from persisted parts, refusing anything that breaks the invariants
    /// (a corrupt checkpoint must not become a watermark that skips records).
    pub fn from_parts(
        watermark: Offset,
        ranges: impl IntoIterator<Item = (Offset, Offset)>,
    ) -> Result<Self, ProgressError> {
        let mut out = Self::new(watermark);
        let mut prev_end: Option<Offset> = None;
        for (start, end) in ranges {
            if end <= start {
                return Err(ProgressError::EmptyRange { start });
            }
            if start <= watermark {
                return Err(ProgressError::RangeAtOrBelowWatermark { start });
            }
            if let Some(prev) = prev_end {
                if start <= prev {
                    return Err(ProgressError::RangesOverlapOrTouch { start });
                }
            }
            prev_end = Some(end);
            out.ranges.insert(start, end);
        }
        Ok(out)
    }

    /// The lowest offset not yet done.
    pub fn watermark(&self) -> Offset {
        self.watermark
    }

    pub fn range_count(&self) -> usize {
        self.ranges.len()
    }

    /// Done ranges above the watermark, ascending, as (start, end-exclusive).
    pub fn ranges(&self) -> impl Iterator<Item = (Offset, Offset)> + '_ {
        self.ranges.iter().map(|(&s, &e)| (s, e))
    }

    /// The highest done offset + 1 (the watermark when nothing above it is done).
    pub fn done_end(&self) -> Offset {
        self.ranges
            .last_key_value()
            .map_or(self.watermark, |(_, &end)| end)
    }

    pub fn is_done(&self, offset: Offset) -> bool {
        if offset < self.watermark {
            return true;
        }
        match self.ranges.range(..=offset).next_back() {
            Some((_, &end)) => offset < end,
            None => false,
        }
    }

    /// Marks one offset done. Returns false if it already was. O(log ranges).
    pub fn mark_done(&mut self, offset: Offset) -> bool {
        self.mark_done_span(offset, offset.saturating_add(1))
    }

    /// Marks `[start, end)` done. Returns false if all of it already was.
    pub fn mark_done_span(&mut self, start: Offset, end: Offset) -> bool {
        if end <= start || end <= self.watermark {
            return false;
        }
        if start <= self.watermark {
            // The common case, an in-order ACK: the watermark moves. Only the span clear of
            // the first range is handled here; one that reaches it takes the general path
            // (ranges start above the watermark and never touch each other).
            match self.ranges.first_key_value() {
                None => {
                    self.watermark = end;
                    return true;
                }
                Some((&s, _)) if s > end => {
                    self.watermark = end;
                    return true;
                }
                _ => {}
            }
        }
        let start = start.max(self.watermark);
        if self.covered(start, end) {
            return false;
        }
        // Absorb every range that overlaps or touches [start, end).
        let mut new_start = start;
        let mut new_end = end;
        if let Some((&s, &e)) = self.ranges.range(..=start).next_back() {
            if e >= start {
                new_start = s;
                new_end = new_end.max(e);
            }
        }
        loop {
            let next = self
                .ranges
                .range(new_start..=new_end)
                .next()
                .map(|(&s, &e)| (s, e));
            match next {
                Some((s, e)) => {
                    self.ranges.remove(&s);
                    new_end = new_end.max(e);
                }
                None => break,
            }
        }
        if new_start <= self.watermark {
            self.watermark = new_end;
            // The watermark may now touch the next range.
            if let Some(e) = self.ranges.remove(&self.watermark) {
                self.watermark = e;
            }
        } else {
            self.ranges.insert(new_start, new_end);
        }
        true
    }

    fn covered(&self, start: Offset, end: Offset) -> bool {
        if end <= self.watermark {
            return true;
        }
        if start < self.watermark {
            return false;
        }
        match self.ranges.range(..=start).next_back() {
            Some((_, &e)) => e >= end,
            None => false,
        }
    }

    /// Everything below `offset` becomes done (the broker no longer has it). Returns the
    /// number of offsets that were not done before: what was skipped.
    pub fn advance_to(&mut self, offset: Offset) -> u64 {
        if offset <= self.watermark {
            return 0;
        }
        let mut not_done = offset - self.watermark;
        for (s, e) in self.ranges.range(..offset) {
            not_done -= (*e).min(offset) - *s;
        }
        self.mark_done_span(self.watermark, offset);
        not_done
    }

    /// How many offsets in `[from, to)` are not done. O(log ranges + ranges in the span).
    pub fn not_done_between(&self, from: Offset, to: Offset) -> u64 {
        if to <= from {
            return 0;
        }
        let mut done = self.watermark.clamp(from, to) - from;
        let lo = from.max(self.watermark);
        if lo >= to {
            return (to - from) - done;
        }
        let first = self.ranges.range(..=lo).next_back().map_or(lo, |(&s, _)| s);
        for (&s, &e) in self.ranges.range(first..to) {
            let (s, e) = (s.max(lo), e.min(to));
            if e > s {
                done += e - s;
            }
        }
        (to - from) - done
    }

    /// Forgets that anything at or above `end` was done: the broker lost its tail, and the
    /// offsets will name new records. The watermark moves back to `end` if it was above.
    pub fn truncate_from(&mut self, end: Offset) {
        if self.watermark >= end {
            self.watermark = end;
            self.ranges.clear();
            return;
        }
        let mut above = self.ranges.split_off(&end);
        above.clear();
        if let Some(mut last) = self.ranges.last_entry() {
            if *last.get() > end {
                *last.get_mut() = end;
            }
        }
    }

    /// Forgets everything and restarts at `offset`: an operator's seek (C3's one exception).
    pub fn reset(&mut self, offset: Offset) {
        self.watermark = offset;
        self.ranges.clear();
    }

    /// The first offset at or after `offset` that is not done.
    pub fn next_not_done(&self, offset: Offset) -> Offset {
        if offset < self.watermark {
            return self.watermark;
        }
        match self.ranges.range(..=offset).next_back() {
            Some((_, &e)) if offset < e => e,
            _ => offset,
        }
    }

    /// Checks the structure's own invariants; used by `Mesh::check_invariants`.
    pub fn check(&self) -> Result<(), ProgressError> {
        Self::from_parts(self.watermark, self.ranges()).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn in_order_acks_move_the_watermark() {
        let mut p = Progress::new(10);
        assert!(p.mark_done(10));
        assert!(p.mark_done(11));
        assert_eq!(p.watermark(), 12);
        assert_eq!(p.range_count(), 0);
    }

    #[test]
    fn out_of_order_ack_waits_for_the_gap() {
        // The seed's bug: offset 100 acked before 90 must not move the watermark past 90.
        let mut p = Progress::new(90);
        p.mark_done(100);
        assert_eq!(p.watermark(), 90);
        assert!(!p.is_done(90));
        assert!(p.is_done(100));
        for o in 91..100 {
            p.mark_done(o);
        }
        assert_eq!(p.watermark(), 90);
        p.mark_done(90);
        assert_eq!(p.watermark(), 101);
        assert_eq!(p.range_count(), 0);
    }

    #[test]
    fn ranges_merge_when_adjacent() {
        let mut p = Progress::new(0);
        p.mark_done(5);
        p.mark_done(7);
        assert_eq!(p.range_count(), 2);
        p.mark_done(6);
        assert_eq!(p.ranges().collect::<Vec<_>>(), vec![(5, 8)]);
        assert!(!p.mark_done(6));
    }

    #[test]
    fn advance_counts_what_was_skipped() {
        let mut p = Progress::new(0);
        p.mark_done(3);
        p.mark_done(4);
        assert_eq!(p.advance_to(10), 8);
        assert_eq!(p.watermark(), 10);
        assert_eq!(p.advance_to(5), 0);
    }

    #[test]
    fn from_parts_refuses_broken_invariants() {
        assert!(Progress::from_parts(5, [(5, 6)]).is_err());
        assert!(Progress::from_parts(5, [(7, 7)]).is_err());
        assert!(Progress::from_parts(5, [(7, 9), (9, 10)]).is_err());
        assert!(Progress::from_parts(5, [(9, 10), (7, 8)]).is_err());
        assert!(Progress::from_parts(5, [(7, 9), (10, 11)]).is_ok());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// Against a plain set of done offsets: same answers, minimal representation.
        #[test]
        fn agrees_with_a_set(start in 0u64..5, ops in prop::collection::vec((0u64..64, 1u64..4, 0u8..8), 0..80)) {
            let mut p = Progress::new(start);
            let mut model: BTreeSet<u64> = (0..start).collect();
            for (o, len, kind) in ops {
                if kind == 3 {
                    let n = p.not_done_between(o, o + len * 7);
                    let want = (o..o + len * 7).filter(|x| !model.contains(x)).count() as u64;
                    prop_assert_eq!(n, want);
                } else if kind == 4 {
                    p.truncate_from(o + 10);
                    model.retain(|&x| x < o + 10);
                } else if kind == 0 {
                    let skipped = p.advance_to(o);
                    let want = (0..o).filter(|x| !model.contains(x)).count() as u64;
                    prop_assert_eq!(skipped, want);
                    model.extend(0..o);
                } else if kind == 1 {
                    p.mark_done_span(o, o + len);
                    model.extend(o..o + len);
                } else {
                    let fresh = p.mark_done(o);
                    prop_assert_eq!(fresh, model.insert(o));
                }
                p.check().unwrap();
                let wm = (0..).find(|x| !model.contains(x)).unwrap();
                prop_assert_eq!(p.watermark(), wm);
                for x in 0..80 {
                    prop_assert_eq!(p.is_done(x), model.contains(&x));
                    let next = (x..).find(|y| !model.contains(y)).unwrap();
                    prop_assert_eq!(p.next_not_done(x), next);
                }
            }
        }
    }
}
