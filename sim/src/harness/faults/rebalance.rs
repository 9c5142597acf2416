//! Rebalances: a group loses a partition and, after a while, gets it back — once what the
//! old owner wrote is durable, from the checkpoint in the store (as a new owner would).

use unimesh_core::{Assignment, Input, Partition, Response, Ticket};

use crate::checker::{Clause, Violation};
use crate::harness::queue::Ev;
use crate::harness::{violation, Sim};

impl Sim {
    /// `Ev::Rebalance`: one partition of one group is revoked.
    pub(in crate::harness) fn on_rebalance(&mut self) -> Result<(), Violation> {
        self.recur(
            Ev::Rebalance,
            self.opt.faults.rebalance_every_ms,
            Self::rebalance,
        )
    }

    /// `Ev::Reassign`: the revoked partition comes back to incarnation `inc`, once every
    /// persist up to `after_ticket` (what the old owner wrote) is out of the store's queue.
    pub(in crate::harness) fn on_reassign(
        &mut self,
        inc: u32,
        group: usize,
        partition: Partition,
        after_ticket: Ticket,
    ) -> Result<(), Violation> {
        if inc != self.inc || self.mesh.is_none() {
            return Ok(());
        }
        if self.store.front_ticket().is_some_and(|t| t <= after_ticket) {
            // The shell waits until what the old owner wrote is durable, then reads it.
            self.at(
                5,
                Ev::Reassign {
                    inc,
                    group,
                    partition,
                    after_ticket,
                },
            );
            return Ok(());
        }
        self.reassign(group, partition)
    }

    /// The group loses one partition drawn from the seed (if it owns it), to get it back
    /// after a while.
    fn rebalance(&mut self) -> Result<(), Violation> {
        if self.mesh.is_none() {
            return Ok(());
        }
        let g = self.rng.index(self.groups.len());
        let p = self.rng.below(u64::from(self.opt.partitions)) as Partition;
        if self.groups[g].revoked.contains(&p) {
            return Ok(());
        }
        self.faults.rebalances += 1;
        self.fire_due_timers()?;
        let name = self.groups[g].name.clone();
        self.note("revoke", [g as u64, u64::from(p), 0, 0]);
        self.input(Input::PartitionsRevoked {
            group: name.clone(),
            partitions: vec![p],
        })?;
        let t = self.core_now();
        self.checker.revoked(t, &name, p);
        self.groups[g].revoked.insert(p);
        self.drain()?;
        let d = self.rng.range(0, 300);
        let inc = self.inc;
        let after_ticket = self.last_emitted;
        self.at(
            d,
            Ev::Reassign {
                inc,
                group: g,
                partition: p,
                after_ticket,
            },
        );
        Ok(())
    }

    /// The group gets the partition back, with the checkpoint the store holds for it.
    fn reassign(&mut self, g: usize, p: Partition) -> Result<(), Violation> {
        if !self.groups[g].revoked.remove(&p) {
            return Ok(());
        }
        let name = self.groups[g].name.clone();
        let checkpoint = self
            .store
            .checkpoint(&name, p)
            .map_err(|e| violation(Clause::Core, format!("unreadable checkpoint: {e}")))?;
        self.note(
            "assign",
            [g as u64, u64::from(p), u64::from(checkpoint.is_some()), 0],
        );
        let r = self.input(Input::PartitionsAssigned {
            group: name.clone(),
            partitions: vec![Assignment {
                partition: p,
                earliest: self.broker.earliest(p),
                end: self.broker.end(p),
                checkpoint,
            }],
        })?;
        if r != Some(Response::Ok) {
            return Err(violation(
                Clause::Core,
                format!("reassign {name}/{p} answered {r:?}"),
            ));
        }
        self.checker.assigned(&name, p);
        self.drain()
    }
}
