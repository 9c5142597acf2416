//! The not-done records of a lane and where each is in its life.

use std::collections::VecDeque;

use crate::io::Ticket;
use crate::record::Record;
use crate::slots::{ClientSlot, DeliverySeq};
use crate::types::{Millis, Offset, Partition};

/// Where a not-done record is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EntryState {
    /// Waiting to be handed out (possibly also for its key or its attempt ledger).
    Queued,
    /// Handed to a client.
    InFlight(InFlight),
    /// Waiting out a redelivery backoff (its `Backoff` timer says until when).
    Backoff,
}

/// A record handed to a client: redelivered at `deadline` unless settled. `seq` names the
/// delivery in the group's ACK-deadline FIFO; `moved` says the deadline is kept in the
/// group's out-of-order set instead (see `AckDeadlines`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct InFlight {
    pub client: ClientSlot,
    pub deadline: Millis,
    pub seq: DeliverySeq,
    pub moved: bool,
}

/// One not-done record of a lane.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    pub(super) record: Record,
    /// The record's own partition (differs from the lane's only in the replay lane).
    pub(super) origin: Partition,
    /// Attempts issued so far, or assumed issued after a restart (the durable ledger).
    pub(super) attempts: u32,
    /// The lowest attempt number issued in this lane incarnation; ids below it are unknown.
    pub(super) first_here: u32,
    pub(super) state: EntryState,
    /// The ticket whose persist makes the next attempt number durable; `None` when the next
    /// attempt needs no ledger entry (a first attempt, or a non-persistent lane).
    pub(super) ledger_needed: Option<Ticket>,
    /// Another record with the same key is ahead of this one.
    pub(super) key_blocked: bool,
}

impl Entry {
    /// A record arriving in a lane as attempt `attempts + 1`.
    pub(super) fn new(record: Record, origin: Partition, attempts: u32) -> Self {
        Self {
            record,
            origin,
            attempts,
            first_here: attempts + 1,
            state: EntryState::Queued,
            ledger_needed: None,
            key_blocked: false,
        }
    }

    /// It can be handed out now: queued, its attempt number durable, its key free.
    #[inline]
    pub fn eligible(&self) -> bool {
        matches!(self.state, EntryState::Queued)
            && self.ledger_needed.is_none()
            && !self.key_blocked
    }

    #[inline]
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    #[inline]
    pub fn record(&self) -> &Record {
        &self.record
    }

    /// The delivery out, if it is in flight.
    #[inline]
    pub fn in_flight(&self) -> Option<InFlight> {
        match self.state {
            EntryState::InFlight(f) => Some(f),
            EntryState::Backoff | EntryState::Queued => None,
        }
    }
}

/// The not-done records of a lane, by offset. A lane only ever adds records above all it
/// holds (the fetch cursor and the replay slot counter only grow, and a truncation drops
/// everything above the new cursor first), so the records live in a deque in offset order:
/// appending is O(1), a lookup is O(1) while offsets are dense (else a binary search), and
/// a removal leaves a hole that is reclaimed when it reaches either end or when holes
/// outnumber records (amortised O(1), memory bounded by twice the records held + `HOLE_SLACK`). A
/// `BTreeMap` moved the ~140-byte entries around its nodes on every insert and remove.
/// Holes tolerated beyond one per record before the entry store is compacted (small in
/// unit tests, so that they reach compaction).
const HOLE_SLACK: usize = if cfg!(test) { 4 } else { 64 };

#[derive(Clone, Debug, Default)]
pub(crate) struct Entries {
    /// Strictly ascending offsets; `None` is a hole. The first and last slots are never holes.
    slots: VecDeque<(Offset, Option<Entry>)>,
    live: usize,
}

impl Entries {
    pub fn len(&self) -> usize {
        self.live
    }

    /// The slot index of `offset`, if a slot (record or hole) has it.
    fn index(&self, offset: Offset) -> Option<usize> {
        let first = self.slots.front()?.0;
        let guess = usize::try_from(offset.checked_sub(first)?).ok()?;
        // Offsets are strictly ascending, so slot i holds an offset >= first + i: the slot
        // of `offset`, if any, is at or below `guess`, and at `guess` when nothing between
        // was skipped.
        if self.slots.get(guess).is_some_and(|s| s.0 == offset) {
            return Some(guess);
        }
        let end = guess.min(self.slots.len());
        let (a, b) = self.slots.as_slices();
        if end <= a.len() {
            a[..end].binary_search_by_key(&offset, |s| s.0).ok()
        } else {
            match a.binary_search_by_key(&offset, |s| s.0) {
                Ok(i) => Some(i),
                Err(_) => b[..end - a.len()]
                    .binary_search_by_key(&offset, |s| s.0)
                    .ok()
                    .map(|i| i + a.len()),
            }
        }
    }

    pub fn get(&self, offset: &Offset) -> Option<&Entry> {
        let i = self.index(*offset)?;
        self.slots[i].1.as_ref()
    }

    pub fn get_mut(&mut self, offset: &Offset) -> Option<&mut Entry> {
        let i = self.index(*offset)?;
        self.slots[i].1.as_mut()
    }

    pub fn contains_key(&self, offset: &Offset) -> bool {
        self.get(offset).is_some()
    }

    /// Adds or replaces the record at `offset`. O(1) above everything held; an insertion
    /// below (which the lane never does) still works, in O(n).
    pub fn insert(&mut self, offset: Offset, entry: Entry) -> Option<Entry> {
        match self.slots.back() {
            None => {}
            Some(&(last, _)) if offset > last => {}
            Some(_) => {
                return match self.index(offset) {
                    Some(i) => {
                        let old = self.slots[i].1.replace(entry);
                        if old.is_none() {
                            self.live += 1;
                        }
                        old
                    }
                    None => {
                        let i = self.slots.partition_point(|s| s.0 < offset);
                        self.slots.insert(i, (offset, Some(entry)));
                        self.live += 1;
                        None
                    }
                };
            }
        }
        self.slots.push_back((offset, Some(entry)));
        self.live += 1;
        None
    }

    pub fn remove(&mut self, offset: &Offset) -> Option<Entry> {
        let i = self.position(*offset)?;
        self.remove_at(i)
    }

    /// Where the record at `offset` is, for the `_at` methods (one lookup for several uses).
    pub fn position(&self, offset: Offset) -> Option<usize> {
        self.index(offset)
            .filter(|&i| self.slots.get(i).is_some_and(|s| s.1.is_some()))
    }

    /// The record at a `position`.
    pub fn at(&self, i: usize) -> Option<&Entry> {
        self.slots.get(i).and_then(|s| s.1.as_ref())
    }

    /// Removes the record at a `position`.
    pub fn remove_at(&mut self, i: usize) -> Option<Entry> {
        let entry = self.slots.get_mut(i)?.1.take()?;
        self.reclaim(i);
        Some(entry)
    }

    /// `remove_at` without handing the entry out: it is dropped where it lies. Returns
    /// false if there was none.
    pub fn discard_at(&mut self, i: usize) -> bool {
        match self.slots.get_mut(i) {
            Some(slot) if slot.1.is_some() => {
                slot.1 = None;
                self.reclaim(i);
                true
            }
            _ => false,
        }
    }

    /// After the record in slot `i` became a hole: drops the holes it joins at either end
    /// (in place: popping would move every ~170-byte slot out) and compacts when holes
    /// outnumber records + `HOLE_SLACK`.
    fn reclaim(&mut self, i: usize) {
        self.live -= 1;
        if self.live == 0 {
            self.slots.clear();
            return;
        }
        let hole = |s: Option<&(Offset, Option<Entry>)>| s.is_some_and(|s| s.1.is_none());
        if i == 0 {
            let mut n = 1;
            while hole(self.slots.get(n)) {
                n += 1;
            }
            if n == 1 {
                self.slots.pop_front();
            } else {
                self.slots.drain(..n);
            }
        } else if i + 1 == self.slots.len() {
            let mut n = 1;
            while hole(self.slots.get(i - n)) {
                n += 1;
            }
            self.slots.truncate(self.slots.len() - n);
        }
        if self.slots.len() > 2 * self.live + HOLE_SLACK {
            self.slots.retain(|s| s.1.is_some());
        }
    }

    pub fn first_key_value(&self) -> Option<(&Offset, &Entry)> {
        self.iter().next()
    }

    /// Records in offset order.
    pub fn iter(&self) -> EntriesIter<'_> {
        fn held((o, e): &(Offset, Option<Entry>)) -> Option<(&Offset, &Entry)> {
            e.as_ref().map(|e| (o, e))
        }
        self.slots.iter().filter_map(held)
    }

    pub fn values(&self) -> impl Iterator<Item = &Entry> + '_ {
        self.iter().map(|(_, e)| e)
    }

    /// Offsets held at or above `from`, ascending.
    pub fn offsets_from(&self, from: Offset) -> impl Iterator<Item = Offset> + '_ {
        let start = self.slots.partition_point(|s| s.0 < from);
        self.slots
            .range(start..)
            .filter(|s| s.1.is_some())
            .map(|s| s.0)
    }

    /// Checks the structure's own invariants; used by `Mesh::check_invariants`.
    pub fn check(&self) -> Result<(), String> {
        let live = self.slots.iter().filter(|s| s.1.is_some()).count();
        if live != self.live {
            return Err(format!("entry count {} but {live} held", self.live));
        }
        if self.slots.front().is_some_and(|s| s.1.is_none())
            || self.slots.back().is_some_and(|s| s.1.is_none())
        {
            return Err("entry store starts or ends with a hole".into());
        }
        if self
            .slots
            .iter()
            .zip(self.slots.iter().skip(1))
            .any(|(a, b)| a.0 >= b.0)
        {
            return Err("entry offsets not strictly ascending".into());
        }
        if self.slots.len() > 2 * self.live + HOLE_SLACK {
            return Err(format!(
                "{} slots for {} entries",
                self.slots.len(),
                self.live
            ));
        }
        Ok(())
    }
}

pub(crate) type EntriesIter<'a> = std::iter::FilterMap<
    std::collections::vec_deque::Iter<'a, (Offset, Option<Entry>)>,
    fn(&'a (Offset, Option<Entry>)) -> Option<(&'a Offset, &'a Entry)>,
>;

impl<'a> IntoIterator for &'a Entries {
    type Item = (&'a Offset, &'a Entry);
    type IntoIter = EntriesIter<'a>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::EventMeta;
    use bytes::Bytes;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn entry(attempts: u32) -> Entry {
        Entry::new(
            Record::event(0, EventMeta::default(), Bytes::new()),
            0,
            attempts,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]
        /// Against a `BTreeMap`: same answers to every query, holes bounded.
        #[test]
        fn entries_agree_with_a_map(ops in prop::collection::vec((0u8..8, 0u64..40, 1u64..4), 0..200)) {
            let mut e = Entries::default();
            let mut model: BTreeMap<Offset, u32> = BTreeMap::new();
            let mut next: Offset = 0;
            for (i, (kind, o, step)) in ops.into_iter().enumerate() {
                let tag = i as u32;
                match kind {
                    // Appends dominate, as in a lane; gaps between offsets are common.
                    0..=2 => {
                        next += step;
                        prop_assert!(e.insert(next, entry(tag)).is_none());
                        model.insert(next, tag);
                    }
                    3 => {
                        let old = e.insert(o, entry(tag)).map(|x| x.attempts);
                        prop_assert_eq!(old, model.insert(o, tag));
                        next = next.max(o);
                    }
                    _ => {
                        let target = if kind == 4 || model.is_empty() {
                            o
                        } else {
                            model.keys().nth(o as usize % model.len()).copied().unwrap_or(o)
                        };
                        if kind == 7 {
                            let discarded = e.position(target).is_some_and(|i| e.discard_at(i));
                            prop_assert_eq!(discarded, model.remove(&target).is_some());
                        } else {
                            prop_assert_eq!(e.remove(&target).map(|x| x.attempts), model.remove(&target));
                        }
                    }
                }
                e.check().unwrap();
                prop_assert_eq!(e.len(), model.len());
                let got: Vec<(Offset, u32)> = e.iter().map(|(&o, x)| (o, x.attempts)).collect();
                let want: Vec<(Offset, u32)> = model.iter().map(|(&o, &a)| (o, a)).collect();
                prop_assert_eq!(got, want);
                for q in 0..next + 3 {
                    prop_assert_eq!(e.get(&q).map(|x| x.attempts), model.get(&q).copied());
                    prop_assert_eq!(e.contains_key(&q), model.contains_key(&q));
                }
                for q in [0, o, next / 2, next] {
                    let from: Vec<Offset> = e.offsets_from(q).collect();
                    let want_from: Vec<Offset> = model.range(q..).map(|(&o, _)| o).collect();
                    prop_assert_eq!(from, want_from);
                }
            }
        }
    }
}
