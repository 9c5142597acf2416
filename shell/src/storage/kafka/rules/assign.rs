//! What an assignment does with one partition: from the progress record the fence chose
//! (`fence.rs`), the group's committed offset and the log's offsets, where the lane
//! resumes, with what checkpoint, what it checks against the log before it reads on, and
//! which older progress records its owner deletes after its first write.

use unimesh_core::{Assignment, Checkpoint, Offset, Partition};

use super::epochs::known_end;
use super::fence::Chosen;
use super::part::{Part, Span, Validate, Waiting};

/// What was read for one partition at its assignment.
#[derive(Clone, Debug, Default)]
pub struct Found {
    /// The progress record the fence chose, if any, and the keys to delete.
    pub chosen: Chosen,
    /// The group's committed offset of the partition, if any.
    pub committed: Option<Offset>,
    /// The log's (earliest, end) read now; `None` when they could not be read.
    pub range: Option<Span>,
    /// The log's (earliest, end) as last read, for a lane whose offsets could not be read.
    pub cached: Option<Span>,
}

/// How a lane starts: what the engine is told, the partition's buffer (its `base` is where
/// the stream must hold every record from), the leader epoch of the checkpoint resumed
/// from (what the owner's progress records are stamped with until the lane reads on) and
/// the keys of the lane's older progress records, deleted after the owner's first write.
/// `reached`: the highest position the lane's owners are known to have reached (the
/// checkpoint's watermark, its rewound mark, the group's commit), from which the owner's
/// records below it are marked rewound (`fence.rs`).
pub struct LaneStart<F> {
    pub assignment: Assignment,
    pub part: Part<F>,
    pub stamp: Option<i32>,
    pub stale: Vec<String>,
    pub reached: Offset,
}

/// What the new owner of a lane writes, under its own generation, before the engine takes
/// the lane: the checkpoint it resumes from (nothing when it starts without one). The
/// generation fence ranks records by the writer's generation, not by when they land: a
/// record of an earlier owner that lands after this owner read the topic (a replaced
/// owner's late write, or its last write still on its way) would otherwise rank above what
/// this owner took until it wrote something itself — and a reader after it, should it lose
/// the lane first, would take that record: a state the lane's owners never had, older or
/// newer (the madsim group shape found both; docs/DESIGN.md §8).
pub fn claim<F>(lane: &LaneStart<F>) -> Option<(&Checkpoint, Option<i32>)> {
    lane.assignment.checkpoint.as_ref().map(|c| (c, lane.stamp))
}

/// The checkpoint a lane resumes from and its leader epoch: the progress record, unless
/// the group's committed offset is past it — then the committed offset alone (a commit
/// carries no leader epoch here, so such a lane is checked against the log's end only) —
/// or the record is rewound from at least the commit (a seek back whose commit was
/// refused: `fence.rs`, "Rewound").
pub fn resume_point(
    chosen: &Chosen,
    committed: Option<Offset>,
) -> (Option<Checkpoint>, Option<i32>) {
    match (chosen.checkpoint.as_ref(), committed) {
        (Some(cp), Some(c))
            if c > cp.progress.watermark() && chosen.rewound_from.is_none_or(|b| b < c) =>
        {
            (Some(Checkpoint::new(c)), None)
        }
        (Some(cp), _) => (Some(cp.clone()), chosen.leader_epoch),
        (None, Some(c)) => (Some(Checkpoint::new(c)), None),
        (None, None) => (None, None),
    }
}

/// How `partition` starts from what was read for it ([`resume_point`]). Offsets that could
/// not be read are unknown, never (0, 0): taken as the log's end, 0 made every lane that
/// knew offsets "diverge" at 0 and deliver its ACK ranges again (issue 23); the check
/// before the lane's first fetch reads them then (`Validate::range` is `None`).
pub fn lane_start<F: Waiting>(partition: Partition, found: Found) -> LaneStart<F> {
    let (earliest, end) = found.range.or(found.cached).unwrap_or((0, 0));
    let (checkpoint, stamp) = resume_point(&found.chosen, found.committed);
    let start = checkpoint
        .as_ref()
        .map_or(earliest, |c| c.progress.watermark());
    let reached = [found.chosen.rewound_from, found.committed]
        .into_iter()
        .flatten()
        .fold(start, Offset::max);
    let mut part = Part::new(start);
    part.epoch = stamp;
    // From the log's earliest no record can be skipped; from above it, the first fetch
    // reads where the stream must start (`Part::start_unchecked`).
    part.start_unchecked = start > earliest;
    if let Some(c) = &checkpoint {
        part.known_end = known_end(c);
        part.validate = Some(Validate {
            stamp,
            known_end: part.known_end,
            range: found.range,
        });
    }
    LaneStart {
        assignment: Assignment {
            partition,
            earliest,
            end,
            checkpoint,
        },
        part,
        stamp,
        stale: found.chosen.stale,
        reached,
    }
}

#[cfg(test)]
mod tests {
    use unimesh_core::Progress;

    use super::*;

    struct Want;

    impl Waiting for Want {
        fn max(&self) -> usize {
            1
        }
        fn max_bytes(&self) -> usize {
            1
        }
    }

    fn chosen(watermark: Option<Offset>, epoch: Option<i32>) -> Chosen {
        Chosen {
            checkpoint: watermark.map(|w| Checkpoint {
                progress: Progress::from_parts(w, [(w + 2, w + 4)]).expect("valid"),
                attempts: vec![(w, 2)],
            }),
            leader_epoch: epoch,
            rewound_from: None,
            stale: vec!["g\nt\n0\n3".into()],
        }
    }

    /// Goal: a lane resumes from its progress record (ranges, attempts and leader epoch)
    /// unless the committed offset passed it, and from the committed offset alone, without
    /// an epoch, when that is all there is. Method: every combination of a record at 10 and
    /// a commit below, at or above it.
    #[test]
    fn the_progress_record_wins_unless_the_commit_passed_it() {
        let wm = |r: &(Option<Checkpoint>, Option<i32>)| {
            r.0.as_ref()
                .map(|c| (c.progress.watermark(), c.progress.range_count()))
        };
        let rec = chosen(Some(10), Some(4));
        for commit in [None, Some(7), Some(10)] {
            let r = resume_point(&rec, commit);
            assert_eq!((wm(&r), r.1), (Some((10, 1)), Some(4)), "commit {commit:?}");
        }
        let r = resume_point(&rec, Some(11));
        assert_eq!((wm(&r), r.1), (Some((11, 0)), None));
        // A seek back whose commit was refused: the record stands up to its mark.
        let rewound = Chosen {
            rewound_from: Some(11),
            ..rec.clone()
        };
        let r = resume_point(&rewound, Some(11));
        assert_eq!((wm(&r), r.1), (Some((10, 1)), Some(4)));
        let r = resume_point(&rewound, Some(12));
        assert_eq!((wm(&r), r.1), (Some((12, 0)), None));
        let none = chosen(None, None);
        let r = resume_point(&none, Some(5));
        assert_eq!((wm(&r), r.1), (Some((5, 0)), None));
        assert_eq!(resume_point(&none, None), (None, None));
    }

    /// Goal: a lane starts at its checkpoint's watermark (else at the log's earliest), is
    /// checked against the log before its first fetch exactly when it resumes from a
    /// checkpoint, and never takes unread offsets for (0, 0). Method: lanes with and without
    /// a record, with the offsets read, only cached, and unknown.
    #[test]
    fn a_lane_starts_at_its_checkpoint_and_is_checked_before_it_reads() {
        let found = |chosen, range, cached| Found {
            chosen,
            committed: None,
            range,
            cached,
        };
        let l: LaneStart<Want> =
            lane_start(2, found(chosen(Some(10), Some(4)), Some((3, 20)), None));
        assert_eq!(
            (l.part.base, l.part.epoch, l.part.known_end),
            (10, Some(4), 14)
        );
        // Above the earliest (3): where the stream starts is read before it answers.
        assert!(l.part.start_unchecked);
        let v = l.part.validate.expect("a checkpoint is checked");
        assert_eq!(
            (v.stamp, v.known_end, v.range),
            (Some(4), 14, Some((3, 20)))
        );
        assert_eq!(
            (
                l.assignment.partition,
                l.assignment.earliest,
                l.assignment.end
            ),
            (2, 3, 20)
        );
        assert_eq!((l.stamp, l.stale.len(), l.reached), (Some(4), 1, 10));
        // The position reached is the highest of the watermark, its mark and the commit.
        let rewound = Chosen {
            rewound_from: Some(16),
            ..chosen(Some(10), Some(4))
        };
        let l: LaneStart<Want> = lane_start(
            2,
            Found {
                committed: Some(13),
                ..found(rewound, Some((3, 20)), None)
            },
        );
        assert_eq!((l.part.base, l.reached), (10, 16));
        // Offsets unread: the cache tells the engine, the check reads them afresh.
        let l: LaneStart<Want> = lane_start(0, found(chosen(Some(10), None), None, Some((1, 30))));
        assert_eq!((l.assignment.earliest, l.assignment.end), (1, 30));
        assert_eq!(l.part.validate.and_then(|v| v.range), None);
        // No record: from the earliest offset, nothing to check.
        let l: LaneStart<Want> = lane_start(0, found(Chosen::default(), Some((6, 9)), None));
        assert_eq!(
            (l.part.base, l.part.validate, l.assignment.checkpoint),
            (6, None, None)
        );
        assert!(!l.part.start_unchecked, "nothing lies below the earliest");
    }
}
