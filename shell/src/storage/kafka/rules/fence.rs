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
/// reader deletes after its own first durable write (all but its own), so records of an
/// earlier life of the group do not linger.
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
pub fn choose<T: Borrow<Checkpoint>>(
    records: &BTreeMap<OwnerGen, T>,
    reader: OwnerGen,
    floor: Option<Offset>,
) -> (Option<(OwnerGen, &T)>, Vec<OwnerGen>) {
    let candidate = |cp: &T| floor.is_none_or(|f| cp.borrow().progress.watermark() >= f);
    let winner = records
        .range(..=reader.map_or(Some(i32::MAX), Some))
        .rev()
        .find(|(_, cp)| candidate(cp))
        .or_else(|| records.iter().rev().find(|(_, cp)| candidate(cp)))
        .map(|(&g, cp)| (g, cp));
    let stale = records.keys().copied().filter(|&g| g != reader).collect();
    (winner, stale)
}

/// What the reader found for one lane at its assignment.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Chosen {
    /// The record resumed from, if any survived the fence.
    pub checkpoint: Option<Checkpoint>,
    /// The leader epoch that record was stamped with (`epochs.rs`).
    pub leader_epoch: Option<i32>,
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

    /// Goal: a group the broker deleted and recreated (generations start again) neither
    /// pins its lanes to a record of its earlier life nor forgets that life's progress.
    /// Method: a reader in generation 2 sees records of generations 1 and 9: 9 is of the
    /// earlier life, 1 of this one, which is taken (and both deleted after its write);
    /// seeing only 9 (the last owner before the group emptied), it takes 9.
    #[test]
    fn a_record_above_the_readers_generation_is_from_an_earlier_group() {
        let recs = records(&[(Some(1), 30), (Some(9), 50)]);
        let (winner, stale) = choose(&recs, Some(2), None);
        assert_eq!(
            winner.map(|(g, cp)| (g, cp.progress.watermark())),
            Some((Some(1), 30))
        );
        assert_eq!(stale, vec![Some(1), Some(9)]);
        let only_later = records(&[(Some(9), 50)]);
        let (winner, stale) = choose(&only_later, Some(2), None);
        assert_eq!(
            winner.map(|(g, cp)| (g, cp.progress.watermark())),
            Some((Some(9), 50))
        );
        assert_eq!(stale, vec![Some(9)]);
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
