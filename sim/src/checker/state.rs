//! The checker's mirror of the world: what the broker holds, and what the checker knows of
//! every group, lane, record and delivery. Plain data; the clause families (the sibling
//! modules) read and change it. Nothing here is ever read from the mesh.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use unimesh_core::{
    Checkpoint, ClientId, DeliveryId, Epoch, Filter, GroupName, Millis, Offset, Ordering,
    Partition, Progress, RecordMeta, TopicName,
};

/// One record the broker acknowledged to its publisher.
#[derive(Clone, Debug)]
pub(super) struct PubRec {
    pub(super) meta: RecordMeta,
    /// Whether the record came with a POP receipt handle (C6 applies).
    pub(super) handle: bool,
}

/// One broker partition as the checker saw it published.
#[derive(Clone, Debug, Default)]
pub(super) struct Log {
    pub(super) recs: Vec<PubRec>,
    /// Retention deleted everything below this.
    pub(super) earliest: Offset,
}

/// What the checker knows of one record for one group.
#[derive(Clone, Debug, Default)]
pub(super) struct Rec {
    /// Bit `gen % 64` set when ACKed (accepted) in that generation of the lane.
    pub(super) acked_mask: u64,
    /// Bit set when an operator seek passed over the record in that generation.
    pub(super) op_mask: u64,
    pub(super) acked_any: bool,
    /// The generation of the first accepted ACK.
    pub(super) first_ack_gen: Option<u32>,
    /// Highest attempt delivered in the lane since the last seek reset (C5).
    pub(super) max_attempt: u32,
    pub(super) had_ge2: bool,
    pub(super) first_count: u32,
    /// The lane's reset counter when the last first attempt was delivered.
    pub(super) first_reset: u32,
    /// Highest attempt ever delivered, replay lane included (justifies dead letters).
    pub(super) max_attempt_any: u32,
    /// Highest attempt number seen in a durable ledger.
    pub(super) ledger_max: u32,
    /// (epoch, lease) in which the record was last done (ACK accepted).
    pub(super) done_in: Option<(Epoch, u64)>,
    pub(super) broker_ack_due: bool,
    pub(super) broker_acked: bool,
    pub(super) deliveries: u32,
}

/// What the checker knows of one (group, partition) lane. See "Generations" in the module
/// documentation of [`super`].
#[derive(Clone, Debug, Default)]
pub(super) struct LaneState {
    pub(super) recs: Vec<Rec>,
    pub(super) durable: Option<Checkpoint>,
    pub(super) gen: u32,
    /// Generation of the last seek.
    pub(super) seek_gen: u32,
    /// Generations of every seek (a durable watermark may go back across one).
    pub(super) seek_gens: BTreeSet<u32>,
    /// Generation of the checkpoint last applied.
    pub(super) applied_gen: u32,
    /// A seek happened and no checkpoint written after it is durable yet.
    pub(super) seek_pending: bool,
    /// Crashes and revocations: after one, a first attempt may be handed out again.
    pub(super) resets: u32,
    /// Bumped by revocation and crash: broker ACKs promised by older persists are void.
    pub(super) drop_gen: u32,
    /// Leases below this were revoked in this incarnation.
    pub(super) revoked_below: u64,
    pub(super) max_lease: u64,
    pub(super) assigned: bool,
    pub(super) skipped: Vec<(Offset, Offset)>,
    pub(super) committed: Option<Offset>,
    pub(super) commit_seek_gen: u32,
    /// Key order: the highest offset delivered per key in the current lease.
    pub(super) key_last: BTreeMap<String, (u64, Offset)>,
}

impl LaneState {
    /// A revocation or crash voids broker ACKs not yet sent (every effect for the lane
    /// stops; a POP broker hands such records out again after their invisibility time).
    pub(super) fn void_pending_broker_acks(&mut self) {
        for r in &mut self.recs {
            if !r.broker_acked {
                r.broker_ack_due = false;
            }
        }
    }

    pub(super) fn rec(&mut self, o: Offset) -> &mut Rec {
        let i = o as usize;
        if self.recs.len() <= i {
            self.recs.resize_with(i + 1, Rec::default);
        }
        &mut self.recs[i]
    }

    pub(super) fn durable_done(&self, o: Offset) -> bool {
        self.durable.as_ref().is_some_and(|c| c.progress.is_done(o))
    }

    pub(super) fn is_skipped(&self, o: Offset) -> bool {
        self.skipped.iter().any(|&(a, b)| a <= o && o < b)
    }
}

/// The current delivery of one lane slot.
#[derive(Clone, Debug)]
pub(super) struct Held {
    pub(super) id: DeliveryId,
    pub(super) client: ClientId,
    pub(super) deadline: Millis,
    pub(super) key: Option<String>,
}

/// One dead letter being replayed, by (epoch, lease, replay offset).
#[derive(Clone, Debug, Default)]
pub(super) struct ReplaySlot {
    pub(super) attempt: u32,
    pub(super) done: bool,
}

/// What the checker knows of one group: its definition, and its lanes, clients and
/// deliveries.
#[derive(Clone, Debug)]
pub(super) struct GroupState {
    pub(super) topic: TopicName,
    pub(super) filter: Filter,
    pub(super) ordering: Ordering,
    pub(super) max_attempts: u32,
    pub(super) ack_timeout_ms: Millis,
    pub(super) max_in_flight: u32,
    pub(super) start: BTreeMap<Partition, Offset>,
    pub(super) lanes: BTreeMap<Partition, LaneState>,
    pub(super) credit: BTreeMap<ClientId, u32>,
    /// The current delivery of every lane slot, by (lane partition, lane offset).
    pub(super) inflight: BTreeMap<(Partition, Offset), Held>,
    pub(super) replay: HashMap<(Epoch, u64, Offset), ReplaySlot>,
}

/// A delivery id the mesh handed out: who got it and for which record.
#[derive(Clone, Debug)]
pub(super) struct Issued {
    pub(super) incarnation: u32,
    pub(super) group: GroupName,
    pub(super) origin: Partition,
    pub(super) offset: Offset,
}

/// Offsets one persist made durably done in one lane: (group, partition, drop generation,
/// intervals).
pub(super) type NewlyDone = (GroupName, Partition, u32, Vec<(Offset, Offset)>);

/// (group, partition, generation, drop generation) of one checkpoint of an emitted persist.
pub(super) type EmittedLane = (GroupName, Partition, u32, u32);

/// What one emitted persist carried, to judge it when the store applies it.
#[derive(Clone, Debug)]
pub(super) struct Emitted {
    /// One per checkpoint of a group the checker knew at emission, in batch order.
    pub(super) lanes: Vec<EmittedLane>,
    /// Offsets newly made durable, recorded at apply, for C6 once the mesh is told.
    pub(super) newly_done: Vec<NewlyDone>,
}

/// The bit of generation `gen` in a [`Rec`]'s masks.
pub(super) fn bit(gen: u32) -> u64 {
    1u64 << (gen % 64)
}

/// Offsets done in `new` and not in `old`, as half-open intervals.
pub(super) fn newly_done(old: &Progress, new: &Progress) -> Vec<(Offset, Offset)> {
    let intervals = |p: &Progress| {
        let mut v = Vec::with_capacity(p.range_count() + 1);
        if p.watermark() > 0 {
            v.push((0, p.watermark()));
        }
        v.extend(p.ranges());
        v
    };
    let old_iv = intervals(old);
    let mut out = Vec::new();
    for (mut a, b) in intervals(new) {
        for &(s, e) in &old_iv {
            if e <= a {
                continue;
            }
            if s >= b {
                break;
            }
            if s > a {
                out.push((a, s));
            }
            a = a.max(e);
            if a >= b {
                break;
            }
        }
        if a < b {
            out.push((a, b));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(wm: Offset, ranges: &[(Offset, Offset)]) -> Progress {
        Progress::from_parts(wm, ranges.iter().copied()).unwrap()
    }

    #[test]
    fn newly_done_subtracts_what_was_done() {
        assert_eq!(newly_done(&p(0, &[]), &p(3, &[])), vec![(0, 3)]);
        assert_eq!(
            newly_done(&p(2, &[(5, 7)]), &p(3, &[(4, 9)])),
            vec![(2, 3), (4, 5), (7, 9)]
        );
        assert_eq!(newly_done(&p(10, &[]), &p(4, &[])), vec![]);
        assert_eq!(
            newly_done(&p(2, &[(4, 6)]), &p(8, &[])),
            vec![(2, 4), (6, 8)]
        );
    }
}
