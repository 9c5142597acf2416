//! Rebalances. Classic world: a group loses a partition and, after a while, gets it back —
//! once what the old owner wrote is durable, from the checkpoint in the store (as a new
//! owner would). Kafka world: the coordinator moves one lane from its owner to a member
//! drawn from the seed (possibly the same one), cooperatively.

use unimesh_core::{Assignment, Input, Partition, Response, Ticket};

use crate::checker::{Clause, Violation};
use crate::harness::queue::Ev;
use crate::harness::{violation, Sim};

impl Sim {
    /// `Ev::Rebalance`: one partition of one group is revoked (or, Kafka world, moved).
    pub(in crate::harness) fn on_rebalance(&mut self) -> Result<(), Violation> {
        self.recur(
            Ev::Rebalance,
            self.opt.faults.rebalance_every_ms,
            Self::rebalance,
        )
    }

    /// `Ev::Reassign` (classic world): the revoked partition comes back to incarnation
    /// `inc`, once every persist up to `after_ticket` (what the old owner wrote) is out of
    /// the store's queue.
    pub(in crate::harness) fn on_reassign(
        &mut self,
        inc: u32,
        group: usize,
        partition: Partition,
        after_ticket: Ticket,
    ) -> Result<(), Violation> {
        if inc != self.nodes[0].inc || self.nodes[0].mesh.is_none() {
            return Ok(());
        }
        if self
            .store
            .front_ticket_for(0)
            .is_some_and(|t| t <= after_ticket)
        {
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

    fn rebalance(&mut self) -> Result<(), Violation> {
        if self.kafka().is_some() {
            return self.move_one_lane();
        }
        self.revoke_one()
    }

    /// Classic world: the group loses one partition drawn from the seed (if it owns it),
    /// to get it back after a while.
    fn revoke_one(&mut self) -> Result<(), Violation> {
        if self.nodes[0].mesh.is_none() {
            return Ok(());
        }
        let g = self.rng.index(self.groups.len());
        let p = self.rng.below(u64::from(self.opt.partitions)) as Partition;
        if self.groups[g].revoked.contains(&p) {
            return Ok(());
        }
        self.faults.rebalances += 1;
        self.fire_due_timers(0)?;
        let name = self.groups[g].name.clone();
        self.note(0, "revoke", [g as u64, u64::from(p), 0, 0]);
        self.input(
            0,
            Input::PartitionsRevoked {
                group: name.clone(),
                partitions: vec![p],
            },
        )?;
        let t = self.core_now(0);
        self.check(0).revoked(t, &name, p);
        self.groups[g].revoked.insert(p);
        self.drain(0)?;
        let d = self.rng.range(0, 300);
        let inc = self.nodes[0].inc;
        let after_ticket = self.nodes[0].last_emitted;
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

    /// Classic world: the group gets the partition back, with the checkpoint the store
    /// holds for it.
    fn reassign(&mut self, g: usize, p: Partition) -> Result<(), Violation> {
        if !self.groups[g].revoked.remove(&p) {
            return Ok(());
        }
        let name = self.groups[g].name.clone();
        let checkpoint = self
            .store
            .checkpoint_read(&name, p, |_, _| None)
            .map_err(|e| violation(Clause::Core, format!("unreadable checkpoint: {e}")))?;
        self.note(
            0,
            "assign",
            [g as u64, u64::from(p), u64::from(checkpoint.is_some()), 0],
        );
        let r = self.input(
            0,
            Input::PartitionsAssigned {
                group: name.clone(),
                partitions: vec![Assignment {
                    partition: p,
                    earliest: self.broker.earliest(p),
                    end: self.broker.end(p),
                    checkpoint,
                }],
            },
        )?;
        if r != Some(Response::Ok) {
            return Err(violation(
                Clause::Core,
                format!("reassign {name}/{p} answered {r:?}"),
            ));
        }
        self.check(0).assigned(&name, p);
        self.drain(0)
    }

    /// Kafka world: one owned lane drawn from the seed moves to a member drawn from the
    /// seed (its owner must be able to take part: alive, not a zombie).
    fn move_one_lane(&mut self) -> Result<(), Violation> {
        let eligible = self.eligible();
        let owned: Vec<_> = (0..self.groups.len())
            .flat_map(|g| (0..self.opt.partitions).map(move |p| (g, p)))
            .filter(|&lane| {
                self.coordinator
                    .owner(lane)
                    .is_some_and(|o| eligible.contains(&o))
            })
            .collect();
        if owned.is_empty() {
            return Ok(());
        }
        let lane = owned[self.kafka_rng.index(owned.len())];
        let to = eligible[self.kafka_rng.index(eligible.len())];
        self.faults.rebalances += 1;
        self.move_lane(lane, to as usize)
    }
}
