//! The offsets of a lane's records that can be handed out now.

use std::collections::{BTreeSet, VecDeque};

use crate::types::Offset;

/// The offsets of a lane's records that can be handed out now, lowest first. Fresh records
/// arrive in ascending order and go to a deque (O(1) in and out); the rest (redeliveries,
/// released keys, durable ledger bumps) go to an ordered set, and the lower of both heads
/// goes out first: the same order as one ordered set, without a B-tree insert and removal
/// for every record that simply flows through.
#[derive(Clone, Debug, Default)]
pub(crate) struct Ready {
    /// Strictly ascending.
    fresh: VecDeque<Offset>,
    /// Disjoint from `fresh`.
    other: BTreeSet<Offset>,
}

impl Ready {
    pub fn len(&self) -> usize {
        self.fresh.len() + self.other.len()
    }

    pub fn is_empty(&self) -> bool {
        self.fresh.is_empty() && self.other.is_empty()
    }

    fn fresh_index(&self, offset: Offset) -> Option<usize> {
        self.fresh.binary_search(&offset).ok()
    }

    pub fn contains(&self, offset: &Offset) -> bool {
        self.other.contains(offset) || self.fresh_index(*offset).is_some()
    }

    /// Adds an offset. Returns false if it was already there.
    pub fn insert(&mut self, offset: Offset) -> bool {
        if self.fresh_index(offset).is_some() {
            return false;
        }
        self.other.insert(offset)
    }

    /// Adds an offset above everything the lane ever offered (a just-admitted record).
    pub fn push_fresh(&mut self, offset: Offset) -> bool {
        if self.fresh.back().is_some_and(|&b| b >= offset) {
            return self.insert(offset);
        }
        if self.other.contains(&offset) {
            return false;
        }
        self.fresh.push_back(offset);
        true
    }

    /// Removes an offset. Removing from the middle of the deque is O(n), but only a
    /// truncation drops fresh records, and it drops them from the top (O(1) each).
    pub fn remove(&mut self, offset: &Offset) -> bool {
        if self.other.remove(offset) {
            return true;
        }
        match self.fresh_index(*offset) {
            Some(0) => self.fresh.pop_front().is_some(),
            Some(i) if i + 1 == self.fresh.len() => self.fresh.pop_back().is_some(),
            Some(i) => self.fresh.remove(i).is_some(),
            None => false,
        }
    }

    pub fn pop_first(&mut self) -> Option<Offset> {
        match (self.fresh.front(), self.other.first()) {
            (Some(f), Some(o)) if o < f => self.other.pop_first(),
            (Some(_), _) => self.fresh.pop_front(),
            (None, _) => self.other.pop_first(),
        }
    }

    /// Checks the structure's own invariants; used by `Mesh::check_invariants`.
    pub fn check(&self) -> Result<(), String> {
        if self
            .fresh
            .iter()
            .zip(self.fresh.iter().skip(1))
            .any(|(a, b)| a >= b)
        {
            return Err("fresh ready offsets not strictly ascending".into());
        }
        if self.fresh.iter().any(|o| self.other.contains(o)) {
            return Err("an offset is ready twice".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]
        /// Against a `BTreeSet`: same membership and the same order out.
        #[test]
        fn ready_agrees_with_a_set(ops in prop::collection::vec((0u8..6, 0u64..50), 0..200)) {
            let mut r = Ready::default();
            let mut model: BTreeSet<Offset> = BTreeSet::new();
            let mut next: Offset = 0;
            for (kind, o) in ops {
                match kind {
                    0 | 1 => {
                        next += 1 + o % 3;
                        prop_assert_eq!(r.push_fresh(next), model.insert(next));
                    }
                    2 => prop_assert_eq!(r.push_fresh(o), model.insert(o)),
                    3 => prop_assert_eq!(r.insert(o), model.insert(o)),
                    4 => prop_assert_eq!(r.remove(&o), model.remove(&o)),
                    _ => prop_assert_eq!(r.pop_first(), model.pop_first()),
                }
                r.check().unwrap();
                prop_assert_eq!(r.len(), model.len());
                prop_assert_eq!(r.is_empty(), model.is_empty());
                for q in 0..next.max(50) + 2 {
                    prop_assert_eq!(r.contains(&q), model.contains(&q));
                }
            }
            let mut out = Vec::new();
            while let Some(o) = r.pop_first() {
                out.push(o);
            }
            prop_assert_eq!(out, model.into_iter().collect::<Vec<_>>());
        }
    }
}
