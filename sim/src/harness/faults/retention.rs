//! Retention: the broker deletes the oldest records of a partition, up to half of what it
//! holds, once every lane's start is durable.

use unimesh_core::Partition;

use crate::checker::Violation;
use crate::harness::queue::Ev;
use crate::harness::{topic, Sim};

impl Sim {
    /// `Ev::Retention`: one retention run.
    pub(in crate::harness) fn on_retention(&mut self) -> Result<(), Violation> {
        self.recur(
            Ev::Retention,
            self.opt.faults.retention_every_ms,
            Self::retention,
        )
    }

    /// The broker deletes a prefix of one partition drawn from the seed.
    fn retention(&mut self) -> Result<(), Violation> {
        // Retention starts once every lane's start is durable: a group that never had a
        // durable position legitimately starts at whatever is earliest then.
        let all_pinned = self
            .groups
            .iter()
            .all(|g| (0..self.opt.partitions).all(|p| self.checker.is_pinned(&g.name, p)));
        if !all_pinned {
            return Ok(());
        }
        let p = self.rng.below(u64::from(self.opt.partitions)) as Partition;
        let earliest = self.broker.earliest(p);
        let end = self.broker.end(p);
        if end <= earliest {
            return Ok(());
        }
        let to = earliest + self.rng.range(1, ((end - earliest) / 2).max(1));
        self.faults.retention_runs += 1;
        self.note("retention", [u64::from(p), to, 0, 0]);
        self.broker.delete_below(p, to);
        self.checker.retention(&topic(), p, self.broker.earliest(p));
        Ok(())
    }
}
