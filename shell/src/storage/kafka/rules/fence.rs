//! The progress choice and the generation fence: which of a lane's progress records (one
//! per ownership generation, `progress.rs`) a reader given the lane resumes from, and which
//! it deletes after its own first write. Pure: the reader (`progress.rs`) hands it the
//! records it read and the group's committed offset.

use std::borrow::Borrow;
use std::collections::BTreeMap;

use unimesh_core::{Checkpoint, Offset};

/// The coordinator generation in which a progress record's writer was given the lane;
/// `None` when the client reported none (ranks below every generation).
pub type OwnerGen = Option<i32>;

/// The fence: of a lane's progress records (by ownership generation), the one a reader
/// given the lane in generation `reader` resumes from, and the generations whose keys the
/// reader deletes after its own first durable write (see "Deletion"), so records of
/// earlier owners and of an earlier life of the group do not linger.
///
/// Contract. `floor` is the group's committed offset of the lane, if any: the broker
/// fences commits by generation (a replaced owner's commit is refused), every owner writes
/// its checkpoint here before it commits the watermark, and every owner starts from a
/// checkpoint at or above the committed offset. So the lane's newest record (its current
/// owner's) never has a watermark below `floor`, and a record below it is an overtaken
/// one: an earlier owner's, possibly of an earlier life of the group, whose generations
/// were higher. Such records are not candidates. Among the candidates, **a record of a
/// lower generation never replaces one of a higher generation**: the highest generation
/// not above `reader` wins (every generation when `reader` is unknown). One above
/// `reader` is from an earlier life of the group (a broker restarts generations when it
/// deletes an empty group: Kafka once its offsets expire) and is taken only when every
/// candidate is above `reader`, as that life's last owner. These two numbers are what a
/// reader can know: the generation ranks the records, the fenced commit bounds them from
/// below, so restarted generations cannot make a stale record win over a fresh one that
/// the group's commits already passed. None when no record is a candidate (the caller
/// resumes from `floor`).
///
/// Rewound. One writer breaks "the newest record is never below `floor`": an operator's
/// seek back (or a lane whose log diverged) takes the watermark below what the group
/// committed, and the owner's record of it is durable before its commit — which the
/// coordinator refuses if the owner's session has just expired. By generation and
/// watermark alone that record is one left from an earlier life, and the floor dropped it:
/// the next owner resumed from the committed offset and the seek was lost (records the
/// operator asked for again never came: C1; madsim group shape, seeds 713 and 882). So a
/// record whose watermark is below the highest position its lane's owners had reached
/// carries that position ([`Record::rewound_from`]: every record of the lane's owners from
/// the seek until the watermark reaches it again, claims included) and stays a candidate
/// while `floor` is not above it: the commits have then passed nothing the seek's lineage
/// had not reached before it went back. A commit above it was made by an owner after the
/// seek, which wrote a record of its own first. The cost: a rewound record of an earlier
/// life that outlived its deletion may win by generation while the new life's commits are
/// below the mark — a resume from older progress, duplicates, never loss.
///
/// Deletion. A reader deletes the keys of generations below its own (the unstamped key
/// included), and of those above it only the ones that are no candidate (below `floor`,
/// not rewound to it). A key above the reader's generation is an earlier life's or the
/// lane's *later* owner's — the reader being a zombie acting on an assignment the
/// coordinator has since overtaken (a paused process, lost heartbeats), which read the
/// topic after that owner claimed the lane — and the reader cannot tell which. Deleting
/// the live owner's key (as every reader did until issue 20) left the zombie's own
/// record, of a lower generation, the lane's highest until the owner wrote again: a reader
/// in that window resumed behind (or ahead of) what the owner had made durable. A key the
/// floor already excludes is safe to delete either way: a live owner's record is below
/// the committed offset only when a later owner's record, written before that commit,
/// outranks it. The cost: an earlier life's key stays while the new life's commits are
/// not past it, and once the new life's generations reach it, it wins by generation until
/// they are (duplicates of what the new life ACKed above its watermark, never loss). A
/// reader that knows no generation deletes every stamped key (its own record would never
/// be read otherwise).
pub fn choose<T: Record>(
    records: &BTreeMap<OwnerGen, T>,
    reader: OwnerGen,
    floor: Option<Offset>,
) -> (Option<(OwnerGen, &T)>, Vec<OwnerGen>) {
    let candidate = |r: &T| {
        floor.is_none_or(|f| {
            r.borrow().progress.watermark() >= f || r.rewound_from().is_some_and(|b| b >= f)
        })
    };
    let winner = records
        .range(..=reader.map_or(Some(i32::MAX), Some))
        .rev()
        .find(|(_, cp)| candidate(cp))
        .or_else(|| records.iter().rev().find(|(_, cp)| candidate(cp)))
        .map(|(&g, cp)| (g, cp));
    let stale = records
        .iter()
        .filter(|&(&g, r)| match reader {
            Some(_) => g < reader || (g > reader && !candidate(r)),
            None => g.is_some(),
        })
        .map(|(&g, _)| g)
        .collect();
    (winner, stale)
}

/// A progress record as the fence ranks it: its checkpoint, and the mark of a rewound
/// lane.
pub trait Record: Borrow<Checkpoint> {
    /// The highest position the lane's owners had reached before a seek took this
    /// record's watermark below it (`progress.rs`'s `unimesh-rewound` header); `None` when
    /// the watermark is the highest the lane reached, or the writer wrote no mark.
    fn rewound_from(&self) -> Option<Offset>;
}

impl Record for Checkpoint {
    fn rewound_from(&self) -> Option<Offset> {
        None
    }
}

/// The position a lane's owner has reached, and the mark its records carry: `reached` is
/// raised to `watermark`, and a watermark below it is rewound from it
/// ([`Record::rewound_from`]).
pub fn mark(reached: &mut Offset, watermark: Offset) -> Option<Offset> {
    *reached = (*reached).max(watermark);
    (watermark < *reached).then_some(*reached)
}

/// What the reader found for one lane at its assignment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Chosen {
    /// The record resumed from, if any survived the fence.
    pub checkpoint: Option<Checkpoint>,
    /// The leader epoch that record was stamped with (`epochs.rs`).
    pub leader_epoch: Option<i32>,
    /// That record's rewound mark ([`Record::rewound_from`]).
    pub rewound_from: Option<Offset>,
    /// Keys of the lane's other records, to delete once the new owner wrote its own.
    pub stale: Vec<String>,
}

#[cfg(test)]
mod tests {
    use unimesh_core::Progress;

    use super::*;

    fn checkpoint(watermark: u64) -> Checkpoint {
        Checkpoint {
            progress: Progress::new(watermark),
            attempts: Vec::new(),
        }
    }

    fn records(of: &[(OwnerGen, u64)]) -> BTreeMap<OwnerGen, Checkpoint> {
        of.iter().map(|&(g, wm)| (g, checkpoint(wm))).collect()
    }

    /// Goal: a replaced owner's progress never replaces its successor's. Method: the
    /// zombie (generation 3) writes after the new owner (generation 5); whatever the
    /// order of writes, the next reader (generation 8) resumes from generation 5's record,
    /// and the new owner's own key is never among those it deletes.
    #[test]
    fn a_late_write_of_a_replaced_owner_is_fenced_out() {
        let recs = records(&[(Some(3), 40), (Some(5), 12)]);
        let (winner, stale) = choose(&recs, Some(8), None);
        assert_eq!(
            winner.map(|(g, cp)| (g, cp.progress.watermark())),
            Some((Some(5), 12))
        );
        assert_eq!(stale, vec![Some(3), Some(5)]);
        // The new owner itself (generation 5) re-reads: its own record, never the zombie's.
        let (winner, stale) = choose(&recs, Some(5), None);
        assert_eq!(winner.map(|(g, _)| g), Some(Some(5)));
        assert_eq!(stale, vec![Some(3)]);
        // A record without a generation ranks below every stamped one.
        let recs = records(&[(None, 90), (Some(0), 7)]);
        assert_eq!(
            choose(&recs, Some(2), None).0.map(|(g, _)| g),
            Some(Some(0))
        );
    }

    /// Goal: restarted generations never make a stale record win over a fresh one the
    /// group's commits already passed, and the floor never lets a lower generation
    /// replace a higher one above it. Method: a group deleted and recreated (its
    /// generations start again) left a record of generation 9 (watermark 30) behind; the
    /// new life's owner of generation 1 reached 50 and committed 50. A reader of
    /// generation 12 of the new life ranks 9 above 1, but 9 is below the floor: 1 wins.
    /// Without the commit (no floor), 9 would win. A zombie's record above the floor still
    /// loses to its successor's; every record below the floor: none (resume at the floor).
    #[test]
    fn a_record_below_the_committed_offset_is_not_a_candidate() {
        let recs = records(&[(Some(1), 50), (Some(9), 30)]);
        let won = |floor| {
            choose(&recs, Some(12), floor)
                .0
                .map(|(g, cp)| (g, cp.progress.watermark()))
        };
        assert_eq!(won(Some(50)), Some((Some(1), 50)));
        assert_eq!(won(None), Some((Some(9), 30)));
        assert_eq!(won(Some(30)), Some((Some(9), 30)));
        // The floor keeps both the zombie (3) and its successor (5): generation decides.
        let zombie = records(&[(Some(3), 40), (Some(5), 12)]);
        let (winner, stale) = choose(&zombie, Some(8), Some(10));
        assert_eq!(winner.map(|(g, _)| g), Some(Some(5)));
        assert_eq!(stale, vec![Some(3), Some(5)]);
        assert_eq!(choose(&zombie, Some(8), Some(41)).0, None);
        // Every candidate above the reader: the highest candidate, not the highest record.
        let earlier_life = records(&[(Some(7), 20), (Some(9), 4)]);
        let winner = choose(&earlier_life, Some(2), Some(10)).0;
        assert_eq!(winner.map(|(g, _)| g), Some(Some(7)));
    }

    /// Goal: a zombie never deletes the live owner's record. Method: the coordinator gave
    /// the lane to generation 5, which claimed it at 12 (committed 12); a zombie acting on
    /// its overtaken assignment of generation 3 reads the topic afterwards: it resumes
    /// from its predecessor's record (2), deletes that one and the unstamped key, and
    /// keeps 5's. A record above the reader that the commits passed (an earlier life's,
    /// or one outranked by a later owner) is deleted.
    #[test]
    fn a_reader_never_deletes_a_later_owners_record() {
        let recs = records(&[(None, 3), (Some(2), 12), (Some(5), 12)]);
        let (winner, stale) = choose(&recs, Some(3), Some(12));
        assert_eq!(winner.map(|(g, _)| g), Some(Some(2)));
        assert_eq!(stale, vec![None, Some(2)]);
        let passed = records(&[(Some(2), 20), (Some(9), 4)]);
        assert_eq!(choose(&passed, Some(3), Some(20)).1, vec![Some(2), Some(9)]);
    }

    /// A record with its rewound mark.
    struct Marked(Checkpoint, Option<Offset>);

    impl Borrow<Checkpoint> for Marked {
        fn borrow(&self) -> &Checkpoint {
            &self.0
        }
    }

    impl Record for Marked {
        fn rewound_from(&self) -> Option<Offset> {
            self.1
        }
    }

    /// Goal: an operator's seek back, durable in the progress topic but whose commit the
    /// coordinator refused (the owner's session had just expired), is where the next owner
    /// resumes — not the committed offset it went back from (madsim group shape, seeds
    /// 713 and 882: the floor dropped the record and the seek was lost). Method: the owner
    /// of generation 4 had reached 50 (committed) and seeked to 30; its record carries the
    /// mark 50. The reader of generation 5 with the floor 50 takes it, also beside a late
    /// write of the owner before it (generation 3, at 50). A commit above the mark (made
    /// by an owner after the seek) still drops it, and an unmarked record below the floor
    /// (an earlier life's) is still no candidate.
    #[test]
    fn a_rewound_record_below_the_committed_offset_is_a_candidate_until_the_commits_pass_its_mark()
    {
        let rec = |wm, mark| Marked(checkpoint(wm), mark);
        let seek: BTreeMap<OwnerGen, Marked> = [(Some(4), rec(30, Some(50)))].into();
        let won = |recs: &BTreeMap<OwnerGen, Marked>, floor| {
            choose(recs, Some(5), floor)
                .0
                .map(|(g, r)| (g, r.0.progress.watermark()))
        };
        assert_eq!(won(&seek, Some(50)), Some((Some(4), 30)));
        let zombie: BTreeMap<OwnerGen, Marked> =
            [(Some(3), rec(50, None)), (Some(4), rec(30, Some(50)))].into();
        assert_eq!(won(&zombie, Some(50)), Some((Some(4), 30)));
        assert_eq!(won(&seek, Some(51)), None);
        assert_eq!(won(&zombie, Some(51)), None);
        let earlier_life: BTreeMap<OwnerGen, Marked> =
            [(Some(1), rec(50, None)), (Some(4), rec(30, None))].into();
        assert_eq!(won(&earlier_life, Some(50)), Some((Some(1), 50)));
    }

    /// Goal: a lane's records carry the rewound mark exactly while their watermark is below
    /// the highest position the lane reached. Method: 40, 50, a seek to 30, 45, 50, 60.
    #[test]
    fn the_mark_lasts_until_the_watermark_is_back_where_it_was() {
        let mut reached = 0;
        let marks: Vec<_> = [40, 50, 30, 45, 50, 60]
            .into_iter()
            .map(|wm| mark(&mut reached, wm))
            .collect();
        assert_eq!(marks, vec![None, None, Some(50), Some(50), None, None]);
        assert_eq!(reached, 60);
    }

    /// Goal: a group the broker deleted and recreated (generations start again) neither
    /// pins its lanes to a record of its earlier life nor forgets that life's progress.
    /// Method: a reader in generation 2 sees records of generations 1 and 9: 9 is of the
    /// earlier life, 1 of this one, which is taken (and deleted after its write; 9, above
    /// the reader and not below the floor, is kept: it may be a later owner's); seeing
    /// only 9 (the last owner before the group emptied), it takes 9.
    #[test]
    fn a_record_above_the_readers_generation_is_from_an_earlier_group() {
        let recs = records(&[(Some(1), 30), (Some(9), 50)]);
        let (winner, stale) = choose(&recs, Some(2), None);
        assert_eq!(
            winner.map(|(g, cp)| (g, cp.progress.watermark())),
            Some((Some(1), 30))
        );
        assert_eq!(stale, vec![Some(1)]);
        let only_later = records(&[(Some(9), 50)]);
        let (winner, stale) = choose(&only_later, Some(2), None);
        assert_eq!(
            winner.map(|(g, cp)| (g, cp.progress.watermark())),
            Some((Some(9), 50))
        );
        assert_eq!(stale, Vec::<OwnerGen>::new());
        // Once the group's commits passed it, the earlier life's key is deleted.
        assert_eq!(choose(&recs, Some(2), Some(51)).1, vec![Some(1), Some(9)]);
        // A reader that knows no generation takes the highest and deletes all stamped keys.
        let (winner, stale) = choose(&recs, None, None);
        assert_eq!(winner.map(|(g, _)| g), Some(Some(9)));
        assert_eq!(stale, vec![Some(1), Some(9)]);
        assert_eq!(
            choose(&BTreeMap::<OwnerGen, Checkpoint>::new(), Some(1), None),
            (None, vec![])
        );
    }
}
