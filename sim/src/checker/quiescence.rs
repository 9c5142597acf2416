//! Liveness once faults stopped (C1: every matching record the broker still shows ACKed,
//! dead-lettered or skipped, and the durable watermark at the log's target; C6: every
//! promised broker ACK sent; C2: the duplicate bound), and what the checker can tell a
//! harness about the durable state.

use unimesh_core::{Checkpoint, GroupName, Offset, Partition};

use super::state::SlotState;
use super::{fail, Check, Checker, Clause};

impl Checker {
    /// After faults stopped and the run converged: liveness (C1, C5 exactly-once, C6).
    pub fn check_quiescent(&self) -> Check {
        for (gname, g) in &self.groups {
            for ((topic, p), log) in &self.logs {
                if *topic != g.topic {
                    continue;
                }
                let start = g.start.get(p).copied().unwrap_or(0);
                let lane = g.lanes.get(p);
                let end = log.target();
                let wm = lane
                    .and_then(|l| l.durable.as_ref())
                    .map(|c| c.progress.watermark());
                if start < end && !wm.is_some_and(|w| log.is_done_at(w)) {
                    return fail(
                        Clause::C1,
                        format!(
                            "{gname}/{p}: durable watermark {wm:?} never reached the log end {end}"
                        ),
                    );
                }
                for o in start..end {
                    // Holes and compacted records need no delivery.
                    if log.recs.get(o as usize).map(|r| r.state) != Some(SlotState::Record) {
                        continue;
                    }
                    if self.matches(g, *p, o) != Some(true) {
                        continue;
                    }
                    let r = lane.and_then(|l| l.recs.get(o as usize));
                    let dlq = self.dead_lettered(gname, *p, o);
                    let skipped = lane.is_some_and(|l| l.is_skipped(o));
                    let acked = r.is_some_and(|r| r.acked_any || r.op_mask != 0);
                    if !(acked || dlq || skipped) {
                        return fail(
                            Clause::C1,
                            format!("{gname}/{p}/{o}: never ACKed nor dead-lettered"),
                        );
                    }
                    if let Some(r) = r {
                        if r.broker_ack_due.is_some() && !r.broker_acked {
                            return fail(
                                Clause::C6,
                                format!("{gname}/{p}/{o}: durably done but never ACKed to the POP broker"),
                            );
                        }
                        // Duplicates: one first attempt per reset the record went through.
                        let resets = lane.map_or(0, |l| l.resets);
                        if r.first_count > resets + 1 {
                            return fail(
                                Clause::C2,
                                format!("{gname}/{p}/{o}: first attempt delivered {} times over {resets} resets", r.first_count),
                            );
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Whether every lane of every group is durably done up to its log's target (see
    /// `Log::is_done_at`), with no seek whose own checkpoint is not durable yet.
    pub fn converged(&self) -> bool {
        self.groups.values().all(|g| {
            if g.lanes.values().any(|l| l.seek_pending()) {
                return false;
            }
            self.logs.iter().all(|((topic, p), log)| {
                if *topic != g.topic {
                    return true;
                }
                let start = g.start.get(p).copied().unwrap_or(0);
                start >= log.target()
                    || g.lanes
                        .get(p)
                        .and_then(|l| l.durable.as_ref())
                        .is_some_and(|c| log.is_done_at(c.progress.watermark()))
            })
        })
    }

    /// Where a lane of `topic`'s partition is done once every record is: one past its last
    /// record (holes after it are never seen), or the earliest offset retention left.
    pub fn log_target(&self, topic: &unimesh_core::TopicName, p: Partition) -> Offset {
        self.logs
            .get(&(topic.clone(), p))
            .map_or(0, super::state::Log::target)
    }

    /// Whether the lane has a durable checkpoint (its start position is pinned).
    pub fn is_pinned(&self, group: &GroupName, p: Partition) -> bool {
        self.groups
            .get(group)
            .and_then(|g| g.lanes.get(&p))
            .is_some_and(|l| l.durable.is_some())
    }

    /// The durable watermark of a lane, for diagnostics.
    /// Whether `checkpoint` is the lane's durable checkpoint (what the next reader takes).
    pub fn is_durable(&self, group: &GroupName, p: Partition, checkpoint: &Checkpoint) -> bool {
        self.groups
            .get(group)
            .and_then(|g| g.lanes.get(&p))
            .and_then(|l| l.durable.as_ref())
            == Some(checkpoint)
    }

    pub fn durable_watermark(&self, group: &GroupName, p: Partition) -> Option<Offset> {
        self.groups
            .get(group)
            .and_then(|g| g.lanes.get(&p))
            .and_then(|l| l.durable.as_ref())
            .map(|c| c.progress.watermark())
    }

    /// Most first attempts of one record, over all groups (a figure for reports).
    pub fn max_first_attempts(&self) -> u32 {
        self.groups
            .values()
            .flat_map(|g| g.lanes.values())
            .flat_map(|l| l.recs.iter())
            .map(|r| r.first_count)
            .max()
            .unwrap_or(0)
    }
}
