//! Liveness once faults stopped (C1: every matching record ACKed, dead-lettered or skipped
//! and the durable watermark at the log end; C6: every promised broker ACK sent; C2: the
//! duplicate bound), and what the checker can tell a harness about the durable state.

use unimesh_core::{DlqKey, GroupName, Offset, Partition};

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
                let end = log.recs.len() as Offset;
                let wm = lane
                    .and_then(|l| l.durable.as_ref())
                    .map(|c| c.progress.watermark());
                if start < end && wm != Some(end) {
                    return fail(
                        Clause::C1,
                        format!(
                            "{gname}/{p}: durable watermark {wm:?} never reached the log end {end}"
                        ),
                    );
                }
                for o in start..end {
                    if self.matches(g, *p, o) != Some(true) {
                        continue;
                    }
                    let r = lane.and_then(|l| l.recs.get(o as usize));
                    let dlq = self.dlq.contains(&DlqKey {
                        group: gname.clone(),
                        partition: *p,
                        offset: o,
                    });
                    let skipped = lane.is_some_and(|l| l.is_skipped(o));
                    let acked = r.is_some_and(|r| r.acked_any || r.op_mask != 0);
                    if !(acked || dlq || skipped) {
                        return fail(
                            Clause::C1,
                            format!("{gname}/{p}/{o}: never ACKed nor dead-lettered"),
                        );
                    }
                    if let Some(r) = r {
                        if r.broker_ack_due && !r.broker_acked {
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

    /// Whether every lane of every group is durably done up to the log end, with no seek
    /// whose own checkpoint is not durable yet.
    pub fn converged(&self) -> bool {
        self.groups.values().all(|g| {
            if g.lanes.values().any(|l| l.seek_pending) {
                return false;
            }
            self.logs.iter().all(|((topic, p), log)| {
                if *topic != g.topic {
                    return true;
                }
                let start = g.start.get(p).copied().unwrap_or(0);
                let end = log.recs.len() as Offset;
                start >= end
                    || g.lanes
                        .get(p)
                        .and_then(|l| l.durable.as_ref())
                        .is_some_and(|c| c.progress.watermark() == end)
            })
        })
    }

    /// Whether the lane has a durable checkpoint (its start position is pinned).
    pub fn is_pinned(&self, group: &GroupName, p: Partition) -> bool {
        self.groups
            .get(group)
            .and_then(|g| g.lanes.get(&p))
            .is_some_and(|l| l.durable.is_some())
    }

    /// The durable watermark of a lane, for diagnostics.
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
