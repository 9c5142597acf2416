//! A group's lanes by partition, and which of them have a record ready.

use std::collections::{BTreeMap, BTreeSet};

use super::{InFlight, Lane};
use crate::io::REPLAY_PARTITION;
use crate::types::{Offset, Partition};

/// The lanes of one group. Invariant (after every group operation, see `sync`): `ready`
/// holds exactly the lanes with a ready record that are not draining (being revoked),
/// each with its `listed` flag set.
#[derive(Clone, Debug, Default)]
pub(crate) struct LaneTable {
    lanes: BTreeMap<Partition, Lane>,
    ready: BTreeSet<Partition>,
    /// Round-robin position over ready lanes, so no partition starves another.
    next: Partition,
}

impl LaneTable {
    #[inline]
    pub fn get(&self, p: Partition) -> Option<&Lane> {
        self.lanes.get(&p)
    }

    /// A lane to change. A change to what it has ready is followed by `sync`.
    #[inline]
    pub fn get_mut(&mut self, p: Partition) -> Option<&mut Lane> {
        self.lanes.get_mut(&p)
    }

    #[inline]
    pub fn contains(&self, p: Partition) -> bool {
        self.lanes.contains_key(&p)
    }

    /// Adds a new lane (none for its partition is held).
    pub fn insert(&mut self, lane: Lane) {
        let p = lane.partition;
        debug_assert!(
            !lane.listed && lane.ready.is_empty(),
            "a new lane has nothing ready"
        );
        let replaced = self.lanes.insert(p, lane);
        debug_assert!(replaced.is_none(), "lane {p} added twice");
    }

    /// Takes a lane out, and out of the ready-lane set.
    pub fn remove(&mut self, p: Partition) -> Option<Lane> {
        let lane = self.lanes.remove(&p)?;
        self.ready.remove(&p);
        Some(lane)
    }

    /// Lanes by partition.
    pub fn iter(&self) -> impl Iterator<Item = &Lane> + '_ {
        self.lanes.values()
    }

    pub fn partitions(&self) -> Vec<Partition> {
        self.lanes.keys().copied().collect()
    }

    /// Lanes of real partitions (not the replay lane).
    pub fn real_lanes(&self) -> usize {
        self.lanes
            .keys()
            .filter(|&&p| p != REPLAY_PARTITION)
            .count()
    }

    /// The delivery out of `offset` of lane `p`, if it is in flight.
    #[inline]
    pub fn in_flight(&self, p: Partition, offset: Offset) -> Option<InFlight> {
        self.lanes.get(&p)?.entries.get(&offset)?.in_flight()
    }

    /// Re-evaluates a lane's place in the ready-lane set.
    #[inline]
    pub fn sync(&mut self, p: Partition) {
        let Some(lane) = self.lanes.get_mut(&p) else {
            self.ready.remove(&p);
            return;
        };
        let ready = !lane.ready.is_empty() && !lane.draining;
        if ready != lane.listed {
            if ready {
                self.ready.insert(p);
            } else {
                self.ready.remove(&p);
            }
            lane.listed = ready;
        }
    }

    /// The next lane to serve, round-robin.
    #[inline]
    pub fn pick(&mut self) -> Option<Partition> {
        let p = self
            .ready
            .range(self.next..)
            .next()
            .or_else(|| self.ready.first())
            .copied()?;
        self.next = p.wrapping_add(1);
        Some(p)
    }

    /// Takes the lowest ready offset of lane `p` (a `pick`), keeping the ready-lane set
    /// exact. Returns the lane with it.
    #[inline]
    pub fn pop_ready(&mut self, p: Partition) -> Option<(&mut Lane, Offset)> {
        let Some(lane) = self.lanes.get_mut(&p) else {
            self.ready.remove(&p);
            return None;
        };
        debug_assert!(lane.listed, "only a listed lane is picked");
        let popped = lane.ready.pop_first();
        if lane.ready.is_empty() {
            lane.listed = false;
            self.ready.remove(&p);
        }
        Some((lane, popped?))
    }

    /// The ready-lane set agrees with the lanes.
    pub fn check(&self, name: &str) -> Result<(), String> {
        for (&p, lane) in &self.lanes {
            let listable = !lane.ready.is_empty() && !lane.draining;
            if self.ready.contains(&p) != listable || lane.listed != listable {
                return Err(format!("{name}/{p}: ready-lane set disagrees"));
            }
        }
        if self.ready.iter().any(|p| !self.lanes.contains_key(p)) {
            return Err(format!("{name}: ready-lane set holds unknown lanes"));
        }
        Ok(())
    }
}
