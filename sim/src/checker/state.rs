//! The checker's mirror of the world: what the broker holds, and what the checker knows of
//! every group, lane, record, owner and delivery. Plain data; the clause families (the
//! sibling modules) read and change it. Nothing here is ever read from the mesh.
//!
//! Durable things are kept once for the cluster (a lane's durable checkpoint, its commits,
//! what was done to each record); what lives in a process's memory is kept per instance (a
//! lane's [`Owner`] on that instance, credit, deliveries in flight, emitted persists).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use unimesh_core::{
    Checkpoint, ClientId, DeliveryId, Epoch, Filter, GroupName, Millis, Offset, Ordering,
    Partition, Progress, RecordMeta, TopicName,
};

use super::Instance;

/// What the broker has at one offset of a partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum SlotState {
    /// A record the broker acknowledged, still there.
    Record,
    /// A record compaction removed, at world step `.0`.
    Compacted(u64),
    /// An offset that never held a record a consumer sees (a transaction marker, an
    /// aborted transaction's record), since world step `.0`.
    Hole(u64),
}

/// One offset of a broker partition as the checker saw it published.
#[derive(Clone, Debug)]
pub(super) struct PubRec {
    /// The record's attributes (None for a hole).
    pub(super) meta: Option<RecordMeta>,
    /// Whether the record came with a POP receipt handle (C6 applies).
    pub(super) handle: bool,
    pub(super) state: SlotState,
    /// Unique over the run: tells a record from a later one at the same offset (after the
    /// broker lost its tail, offsets name new records).
    pub(super) serial: u64,
}

impl PubRec {
    pub(super) fn is_hole(&self) -> bool {
        matches!(self.state, SlotState::Hole(_))
    }

    /// The world step since which a consumer cannot see this offset, if it cannot.
    pub(super) fn absent_since(&self) -> Option<u64> {
        match self.state {
            SlotState::Record => None,
            SlotState::Compacted(at) | SlotState::Hole(at) => Some(at),
        }
    }
}

/// The broker lost `[new_end, old_end)` of a partition (an unclean leader election).
#[derive(Clone, Copy, Debug)]
pub(super) struct Truncation {
    pub(super) new_end: Offset,
    pub(super) old_end: Offset,
}

/// One broker partition as the checker saw it published.
#[derive(Clone, Debug, Default)]
pub(super) struct Log {
    /// By offset: records, compacted records and holes.
    pub(super) recs: Vec<PubRec>,
    /// Retention deleted everything below this.
    pub(super) earliest: Offset,
    /// Every tail the broker lost, oldest first: a lane that knows the first `n` of them
    /// (see [`Owner::knows`]) has seen none of the others.
    pub(super) truncations: Vec<Truncation>,
    /// Records the broker lost (a lane may still hold them in memory, the DLQ copies).
    pub(super) lost: Vec<Lost>,
}

/// A record the broker lost: where it was, and which truncation lost it.
#[derive(Clone, Debug)]
pub(super) struct Lost {
    pub(super) offset: Offset,
    pub(super) rec: PubRec,
    /// Its index in [`Log::truncations`].
    pub(super) truncation: usize,
}

impl Log {
    /// Where a lane is done once every record is: one past the last record the broker
    /// still shows, or the earliest offset if retention deleted past that. Holes (and
    /// compacted records) after it are never seen by a consumer, so no lane's watermark can
    /// pass them before a record follows. (Compaction keeps a partition's last record; only
    /// a lost tail can leave a compacted record last.)
    pub(super) fn target(&self) -> Offset {
        let last = self
            .recs
            .iter()
            .rposition(|r| r.state == SlotState::Record)
            .map_or(0, |i| i as Offset + 1);
        last.max(self.earliest)
    }

    /// Whether a watermark at `wm` has every record the broker still shows below it: at
    /// least the target, at most the log's end (offsets in between hold nothing a consumer
    /// sees; a lane may have passed one while it still held a record compaction removed).
    pub(super) fn is_done_at(&self, wm: Offset) -> bool {
        self.target() <= wm && wm <= self.recs.len() as Offset
    }

    /// The record `meta` at offset `o`, now there or lost: its serial, and whether the
    /// broker lost it (then the index of the truncation that did).
    pub(super) fn identify(&self, o: Offset, meta: &RecordMeta) -> Option<(u64, Option<usize>)> {
        if let Some(r) = self.recs.get(o as usize) {
            if r.meta.as_ref() == Some(meta) {
                return Some((r.serial, None));
            }
        }
        self.lost
            .iter()
            .rev()
            .find(|l| l.offset == o && l.rec.meta.as_ref() == Some(meta))
            .map(|l| (l.rec.serial, Some(l.truncation)))
    }

    /// The serial of the record now at offset `o`, if a record is there (compacted or not).
    pub(super) fn serial_at(&self, o: Offset) -> Option<u64> {
        self.recs
            .get(o as usize)
            .filter(|r| !r.is_hole())
            .map(|r| r.serial)
    }
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
    /// Per instance, the highest attempt it delivered while a zombie for the lane (those
    /// count for no one else; they justify that instance's own dead letter of the record,
    /// which a store that fences only progress — Kafka's DLQ topic — takes).
    pub(super) zombie_attempts: Vec<(Instance, u32)>,
    /// Highest attempt number seen in a durable ledger.
    pub(super) ledger_max: u32,
    /// (instance, epoch, lease) in which the record was last done (ACK accepted).
    pub(super) done_in: Option<(Instance, Epoch, u64)>,
    /// The instance that owes the POP broker an ACK of this record (C6), once told its
    /// persist is durable.
    pub(super) broker_ack_due: Option<Instance>,
    /// An operator seek re-opened the record while it was durably done: the broker ACK
    /// owed for it (see `broker_ack_due`) stands, whichever instance owes it (C6).
    pub(super) done_when_sought: bool,
    pub(super) broker_acked: bool,
    pub(super) deliveries: u32,
}

/// One instance's hold on a (group, partition) lane: what that process remembers of it.
/// See "Generations" in the module documentation of [`super`].
#[derive(Clone, Debug, Default)]
pub(super) struct Owner {
    pub(super) gen: u32,
    /// Generation of the last seek on this instance.
    pub(super) seek_gen: u32,
    /// A seek happened and no checkpoint written after it is durable yet.
    pub(super) seek_pending: bool,
    /// Bumped by revocation and crash: broker ACKs promised by older persists are void.
    pub(super) drop_gen: u32,
    /// Leases below this were revoked in this incarnation.
    pub(super) revoked_below: u64,
    pub(super) max_lease: u64,
    pub(super) assigned: bool,
    /// The lane's [`LaneState::owner_stamp`] when this instance was given the lane: older
    /// than the lane's once the coordinator gave it to someone else or expired this
    /// instance (a zombie), whose writes must then be fenced.
    pub(super) stamp: u32,
    /// How many of the partition's truncations this lane knows of (see [`Log::truncations`]).
    pub(super) knows: usize,
    /// One past the highest offset delivered since the lane was given to this instance
    /// (or last sought).
    pub(super) delivered_end: Offset,
    /// The broker lost records from this offset that this lane delivered: it must report
    /// the loss (`Skipped{BrokerTruncated}`) before its next fetch answer is done with.
    pub(super) must_report: Option<Offset>,
    /// The highest watermark of a checkpoint of this owner made durable (what it may commit).
    pub(super) applied_wm: Option<Offset>,
    /// The offset of this owner's last commit as the mesh emitted it, the lane's
    /// [`LaneState::rewinds`] then, and whether the owner was fenced then (a broker that
    /// takes commits later, such as Kafka's coordinator after a revocation, judges it by
    /// the seeks before its emission and by the fence at its emission).
    pub(super) commit_emitted: Option<(Offset, u32, bool)>,
    /// Key order: the highest offset delivered per key in the current lease.
    pub(super) key_last: BTreeMap<String, (u64, Offset)>,
}

impl Owner {
    /// Whether the coordinator moved the lane away from this instance without telling it.
    pub(super) fn fenced(&self, lane_stamp: u32) -> bool {
        self.stamp < lane_stamp
    }

    /// The instance's mesh took the lane, with owner stamp `stamp`, knowing `knows` of the
    /// partition's truncations: what it delivered and made durable before is forgotten.
    pub(super) fn take(&mut self, stamp: u32, knows: usize) {
        self.assigned = true;
        self.stamp = stamp;
        self.knows = knows;
        self.delivered_end = 0;
        self.must_report = None;
        self.applied_wm = None;
    }
}

/// What the checker knows of one (group, partition) lane, for the cluster.
#[derive(Clone, Debug, Default)]
pub(super) struct LaneState {
    pub(super) recs: Vec<Rec>,
    /// The durable checkpoint as the next reader will see it (clipped at every broker
    /// truncation the lane that wrote it did not know of).
    pub(super) durable: Option<Checkpoint>,
    /// The owner stamp of the writer of `durable` (as it was when the writer emitted it).
    pub(super) durable_stamp: u32,
    /// Hands out generations, unique over the lane's owners.
    pub(super) gen_counter: u32,
    /// Generations of every seek (a durable watermark may go back across one).
    pub(super) seek_gens: BTreeSet<u32>,
    /// Generation of the checkpoint last applied.
    pub(super) applied_gen: u32,
    /// Crashes, revocations, moves: after one, a first attempt may be handed out again.
    pub(super) resets: u32,
    /// Bumped when the coordinator gives the lane to an instance or expires its owner.
    pub(super) owner_stamp: u32,
    pub(super) skipped: Vec<(Offset, Offset)>,
    pub(super) committed: Option<Offset>,
    /// Seeks so far, and their count at the last commit (a commit may go back only across
    /// one; a loss of the broker's tail clips the last commit instead).
    pub(super) rewinds: u32,
    pub(super) commit_rewinds: u32,
    pub(super) owners: BTreeMap<Instance, Owner>,
    /// What a zombie resumed from, by the generation it writes in: the record's progress
    /// and its writer's generation. An offset done there and ACKed in the writer's
    /// generation may be done in the zombie's checkpoints ([`super::Checker::read_back_stale`]).
    pub(super) zombie_bases: BTreeMap<u32, (unimesh_core::Progress, u32)>,
}

impl LaneState {
    /// A revocation or crash of `inst` voids the broker ACKs it owes but has not sent
    /// (every effect for the lane stops; a POP broker hands such records out again after
    /// their invisibility time).
    pub(super) fn void_pending_broker_acks(&mut self, inst: Instance) {
        for r in &mut self.recs {
            if !r.broker_acked && r.broker_ack_due == Some(inst) {
                r.broker_ack_due = None;
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

    /// A fresh generation for the lane.
    pub(super) fn next_gen(&mut self) -> u32 {
        self.gen_counter += 1;
        self.gen_counter
    }

    /// The lane's owner on `inst`, created (with a fresh generation) on first sight.
    pub(super) fn owner(&mut self, inst: Instance) -> &mut Owner {
        if !self.owners.contains_key(&inst) {
            let gen = self.next_gen();
            let stamp = self.owner_stamp;
            self.owners.insert(
                inst,
                Owner {
                    gen,
                    stamp,
                    ..Owner::default()
                },
            );
        }
        self.owners
            .get_mut(&inst)
            .unwrap_or_else(|| unreachable!("inserted above"))
    }

    /// Whether any owner still has a seek whose checkpoint is not durable.
    pub(super) fn seek_pending(&self) -> bool {
        self.owners.values().any(|o| o.seek_pending)
    }
}

/// Clips a checkpoint at a broker truncation: nothing at or above `end` is known done (those
/// offsets name new records now), nor has attempts.
pub(super) fn clip(c: &mut Checkpoint, end: Offset) {
    c.progress.truncate_from(end);
    c.attempts.retain(|&(o, _)| o < end);
}

/// The current delivery of one lane slot.
#[derive(Clone, Debug)]
pub(super) struct Held {
    pub(super) id: DeliveryId,
    pub(super) client: ClientId,
    pub(super) deadline: Millis,
    pub(super) key: Option<String>,
}

/// One dead letter being replayed, by (instance, epoch, lease, replay offset).
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
    pub(super) credit: BTreeMap<(Instance, ClientId), u32>,
    /// The current delivery of every lane slot, by (instance, lane partition, lane offset).
    pub(super) inflight: BTreeMap<(Instance, Partition, Offset), Held>,
    pub(super) replay: HashMap<(Instance, Epoch, u64, Offset), ReplaySlot>,
}

/// A delivery id the mesh handed out: who got it and for which record.
#[derive(Clone, Debug)]
pub(super) struct Issued {
    pub(super) incarnation: u32,
    pub(super) group: GroupName,
    pub(super) origin: Partition,
    pub(super) offset: Offset,
    /// The record's serial (see [`PubRec::serial`]).
    pub(super) serial: u64,
}

/// Offsets one persist made durably done in one lane: (group, partition, instance, drop
/// generation, intervals).
pub(super) type NewlyDone = (GroupName, Partition, Instance, u32, Vec<(Offset, Offset)>);

/// What [`super::Checker::persist_emitted`] noted of one checkpoint of a persist.
#[derive(Clone, Debug)]
pub(super) struct EmittedLane {
    pub(super) group: GroupName,
    pub(super) partition: Partition,
    pub(super) gen: u32,
    pub(super) drop_gen: u32,
    /// The owner's stamp (fencing) and truncation knowledge at emission.
    pub(super) stamp: u32,
    pub(super) knows: usize,
}

/// A checkpoint a store that fences at read holds but ranks below another: what its
/// writer emitted, to judge it should a reader take it anyway ([`super::Checker::read_back`]).
#[derive(Clone, Debug)]
pub(super) struct Unread {
    /// The lane's topic; the checkpoint is the one a reader takes (the harness names the
    /// record by the checkpoint it holds).
    pub(super) topic: unimesh_core::TopicName,
    pub(super) lane: EmittedLane,
    pub(super) instance: Instance,
    /// The persist it was in (tickets count again in every incarnation), and its position
    /// there.
    pub(super) incarnation: u32,
    pub(super) ticket: unimesh_core::Ticket,
    pub(super) index: usize,
    pub(super) world_seq: u64,
}

/// What one emitted persist carried, to judge it when the store applies it.
#[derive(Clone, Debug)]
pub(super) struct Emitted {
    pub(super) instance: Instance,
    /// One per checkpoint of the batch, in batch order; None for a group the checker did
    /// not know at emission.
    pub(super) lanes: Vec<Option<EmittedLane>>,
    /// The world step at emission: an offset the broker no longer showed by then may be
    /// marked done by absence.
    pub(super) world_seq: u64,
    /// Offsets newly made durable, recorded at apply, for C6 once the mesh is told.
    pub(super) newly_done: Vec<NewlyDone>,
    /// Its dead letters and resolutions are durable already (a checkpoint of it was read
    /// before the rest: [`super::Checker::persist_lane_applied`]).
    pub(super) letters_applied: bool,
}

/// One instance: its process, as the checker follows it.
#[derive(Clone, Debug, Default)]
pub(super) struct Node {
    pub(super) alive: bool,
    pub(super) epoch: Epoch,
    /// Unique over the run and every instance.
    pub(super) incarnation: u32,
    pub(super) durable_epoch: Epoch,
    /// The mesh's own time, as last reported (deadlines are computed from it).
    pub(super) now: Millis,
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

    #[test]
    fn clipping_forgets_what_the_broker_lost() {
        let mut c = Checkpoint {
            progress: p(4, &[(6, 9), (11, 12)]),
            attempts: vec![(5, 2), (9, 3)],
        };
        clip(&mut c, 8);
        assert_eq!(c.progress, p(4, &[(6, 8)]));
        assert_eq!(c.attempts, vec![(5, 2)]);
        clip(&mut c, 3);
        assert_eq!(c.progress, p(3, &[]));
        assert!(c.attempts.is_empty());
    }
}
