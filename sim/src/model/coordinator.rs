//! A model of Kafka's group coordinator for every subscription group of a cluster: which
//! instances are members, which member owns each (group, partition) lane, and a
//! generation per lane, bumped whenever the coordinator hands the lane out or takes it
//! from an expired member — so the writes of a former owner (a zombie that was never told)
//! can be fenced, as Kafka fences commits of a stale generation.
//!
//! The harness drives the protocol (cooperative: a lane is revoked from its owner, and
//! handed to the next one only once the old owner's writes are through); the coordinator
//! only keeps the books and proposes where lanes should go.

use std::collections::{BTreeMap, BTreeSet};

use unimesh_core::Partition;

use super::store::NodeId;
use crate::rng::Rng;

/// A (group index, partition) lane.
pub type LaneId = (usize, Partition);

#[derive(Clone, Copy, Debug, Default)]
struct Lane {
    owner: Option<NodeId>,
    gen: u64,
    /// Revoked from its owner, waiting to be handed to the next one.
    moving: bool,
}

#[derive(Clone, Debug, Default)]
pub struct Coordinator {
    members: BTreeSet<NodeId>,
    lanes: BTreeMap<LaneId, Lane>,
}

impl Coordinator {
    pub fn new(groups: usize, partitions: u32) -> Self {
        let lanes = (0..groups)
            .flat_map(|g| (0..partitions).map(move |p| ((g, p), Lane::default())))
            .collect();
        Self {
            members: BTreeSet::new(),
            lanes,
        }
    }

    pub fn join(&mut self, n: NodeId) {
        self.members.insert(n);
    }

    /// `n` leaves the group (its lanes are revoked by the harness first).
    pub fn leave(&mut self, n: NodeId) {
        self.members.remove(&n);
    }

    pub fn is_member(&self, n: NodeId) -> bool {
        self.members.contains(&n)
    }

    pub fn members(&self) -> Vec<NodeId> {
        self.members.iter().copied().collect()
    }

    pub fn owner(&self, lane: LaneId) -> Option<NodeId> {
        self.lanes.get(&lane).and_then(|l| l.owner)
    }

    pub fn gen(&self, lane: LaneId) -> u64 {
        self.lanes.get(&lane).map_or(0, |l| l.gen)
    }

    /// Whether a write stamped with `gen` comes from the lane's current owner.
    pub fn is_current(&self, lane: LaneId, gen: u64) -> bool {
        gen >= self.gen(lane)
    }

    /// The lanes `n` owns.
    pub fn lanes_of(&self, n: NodeId) -> Vec<LaneId> {
        self.lanes
            .iter()
            .filter(|(_, l)| l.owner == Some(n))
            .map(|(&id, _)| id)
            .collect()
    }

    /// Hands `lane` to `n`; returns the lane's new generation.
    pub fn assign(&mut self, lane: LaneId, n: NodeId) -> u64 {
        let l = self.lanes.entry(lane).or_default();
        l.gen += 1;
        l.owner = Some(n);
        l.moving = false;
        l.gen
    }

    /// The owner gave `lane` up (a clean revocation): it waits for its next owner.
    pub fn release(&mut self, lane: LaneId) {
        let l = self.lanes.entry(lane).or_default();
        l.owner = None;
        l.moving = true;
    }

    /// A handover that cannot complete (its target left): the lane is free again.
    pub fn abandon(&mut self, lane: LaneId) {
        if let Some(l) = self.lanes.get_mut(&lane) {
            if l.owner.is_none() {
                l.moving = false;
            }
        }
    }

    /// `n`'s session expired (it crashed, or it is a zombie): it is no member, and every
    /// lane it owned is free, under a new generation that fences its writes.
    pub fn expire(&mut self, n: NodeId) -> Vec<LaneId> {
        self.members.remove(&n);
        let mut freed = Vec::new();
        for (&id, l) in self.lanes.iter_mut() {
            if l.owner == Some(n) {
                l.owner = None;
                l.gen += 1;
                freed.push(id);
            }
        }
        freed
    }

    /// Lanes with no owner and no handover under way.
    pub fn free_lanes(&self) -> Vec<LaneId> {
        self.lanes
            .iter()
            .filter(|(_, l)| l.owner.is_none() && !l.moving)
            .map(|(&id, _)| id)
            .collect()
    }

    /// Whether every lane has an owner.
    pub fn all_owned(&self) -> bool {
        self.lanes.values().all(|l| l.owner.is_some())
    }

    fn load(&self, n: NodeId) -> usize {
        self.lanes.values().filter(|l| l.owner == Some(n)).count()
    }

    /// The member that should take a free lane: one of the least loaded among `eligible`.
    pub fn least_loaded(&self, eligible: &[NodeId], rng: &mut Rng) -> Option<NodeId> {
        let min = eligible.iter().map(|&n| self.load(n)).min()?;
        let best: Vec<NodeId> = eligible
            .iter()
            .copied()
            .filter(|&n| self.load(n) == min)
            .collect();
        Some(best[rng.index(best.len())])
    }

    /// Moves that bring the loads of `eligible` members within one of each other: (lane,
    /// from, to), the most loaded giving to the least loaded.
    pub fn balance(&self, eligible: &[NodeId]) -> Vec<(LaneId, NodeId, NodeId)> {
        let mut load: BTreeMap<NodeId, Vec<LaneId>> =
            eligible.iter().map(|&n| (n, Vec::new())).collect();
        for (&id, l) in &self.lanes {
            if let Some(v) = l.owner.and_then(|o| load.get_mut(&o)) {
                v.push(id);
            }
        }
        let mut moves = Vec::new();
        loop {
            let most = load
                .iter()
                .max_by_key(|(&n, v)| (v.len(), n))
                .map(|(&n, v)| (n, v.len()));
            let least = load
                .iter()
                .min_by_key(|(&n, v)| (v.len(), n))
                .map(|(&n, v)| (n, v.len()));
            let (Some((hi, hn)), Some((lo, ln))) = (most, least) else {
                break;
            };
            if hn <= ln + 1 {
                break;
            }
            let Some(lane) = load.get_mut(&hi).and_then(Vec::pop) else {
                break;
            };
            if let Some(v) = load.get_mut(&lo) {
                v.push(lane);
            }
            moves.push((lane, hi, lo));
        }
        moves
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_fences_and_balance_spreads() {
        let mut c = Coordinator::new(2, 2);
        c.join(0);
        c.join(1);
        let mut rng = Rng::new(3);
        for lane in c.free_lanes() {
            let n = c.least_loaded(&[0], &mut rng).unwrap();
            c.assign(lane, n);
        }
        assert_eq!(c.lanes_of(0).len(), 4);
        let moves = c.balance(&[0, 1]);
        assert_eq!(moves.len(), 2);
        assert!(moves.iter().all(|&(_, from, to)| from == 0 && to == 1));
        let gen = c.gen((0, 0));
        assert!(c.is_current((0, 0), gen));
        assert_eq!(c.expire(0).len(), 4);
        assert!(!c.is_current((0, 0), gen));
        assert!(!c.is_member(0) && c.is_member(1));
        assert_eq!(c.free_lanes().len(), 4);
    }
}
