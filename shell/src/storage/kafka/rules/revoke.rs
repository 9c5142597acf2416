//! What a revocation does: what the engine is asked, what is committed, what is let go,
//! in which order.
//!
//! Contract (docs/DESIGN.md §8, "the durability barrier, per backend"):
//! - taken back (not lost): the engine makes the partitions' progress durable in the
//!   progress topic and drops the lanes ([`Ask::FlushThenDrop`]); the consumer waits for
//!   that, then gives up the ownership (a later write of the lanes is fenced here), then
//!   commits what the engine asked to commit meanwhile (newest offset per partition), then
//!   lets the partitions go. So the next owner reads exactly this progress.
//! - lost (the coordinator already gave them to another member: a session timeout): the
//!   engine drops the lanes at once ([`Ask::DropNow`]) and nothing more is written or
//!   committed for them — a write now would be a zombie's, and the broker refuses its
//!   commits anyway.

use std::collections::BTreeMap;

use unimesh_core::{Offset, Partition};

/// What the engine is asked to do with the partitions a revocation takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ask {
    /// Drop the lanes at once: whatever is not durable is redelivered by the next owner.
    DropNow,
    /// Make their progress durable, then drop them.
    FlushThenDrop,
}

/// A revocation under way, from the callback until the partitions are let go.
#[derive(Clone, Debug)]
pub struct Revocation {
    partitions: Vec<Partition>,
    lost: bool,
    commits: BTreeMap<Partition, Offset>,
}

/// What is done once the engine answered (or the wait gave up), in this order: the
/// ownership of `release` ends, `commit` is committed (synchronously), the buffers of
/// `drop` are dropped and the partitions let go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Handover {
    pub release: Vec<Partition>,
    pub commit: BTreeMap<Partition, Offset>,
    pub drop: Vec<Partition>,
}

impl Revocation {
    pub fn new(partitions: Vec<Partition>, lost: bool) -> Self {
        Self {
            partitions,
            lost,
            commits: BTreeMap::new(),
        }
    }

    pub fn partitions(&self) -> &[Partition] {
        &self.partitions
    }

    pub fn lost(&self) -> bool {
        self.lost
    }

    /// What the engine is asked.
    pub fn ask(&self) -> Ask {
        if self.lost {
            Ask::DropNow
        } else {
            Ask::FlushThenDrop
        }
    }

    /// The engine asked to commit `offset` of `partition` while the revocation waits for
    /// it: the newest offset of a partition wins.
    pub fn commit_asked(&mut self, partition: Partition, offset: Offset) {
        self.commits.insert(partition, offset);
    }

    /// The engine answered: what is done now ([`Handover`]). A lost revocation commits
    /// nothing.
    pub fn finish(self) -> Handover {
        Handover {
            release: self.partitions.clone(),
            commit: if self.lost {
                BTreeMap::new()
            } else {
                self.commits
            },
            drop: self.partitions,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: partitions taken back are flushed and their newest commits made; lost ones are
    /// dropped at once and nothing is committed for them. Method: both kinds, each with
    /// commits asked during the wait (two of one partition).
    #[test]
    fn a_lost_revocation_drops_at_once_and_commits_nothing() {
        let mut taken = Revocation::new(vec![1, 2], false);
        assert_eq!(taken.ask(), Ask::FlushThenDrop);
        taken.commit_asked(1, 5);
        taken.commit_asked(1, 9);
        taken.commit_asked(2, 3);
        let h = taken.finish();
        assert_eq!(
            h.commit.into_iter().collect::<Vec<_>>(),
            vec![(1, 9), (2, 3)]
        );
        assert_eq!((h.release, h.drop), (vec![1, 2], vec![1, 2]));

        let mut lost = Revocation::new(vec![0], true);
        assert_eq!(lost.ask(), Ask::DropNow);
        lost.commit_asked(0, 4);
        let h = lost.finish();
        assert!(h.commit.is_empty());
        assert_eq!((h.release, h.drop), (vec![0], vec![0]));
    }
}
