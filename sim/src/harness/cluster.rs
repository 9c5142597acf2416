//! The group coordinator's side of the Kafka world: lanes handed to members (with the
//! checkpoint the progress store holds now, clipped at any lost tail, sometimes after
//! retention deleted into its ACK ranges), revoked cleanly and handed to the next owner
//! once the old owner's writes are through (cooperative rebalancing), spread evenly when a
//! member joins.
//!
//! A node's shell plays Kafka's part too: before a clean revocation it usually flushes
//! (issue 11: progress is persisted before the revocation callback returns), and it may
//! hand an assignment no checkpoint when the one it recovered at start is still the
//! store's (the core then takes the recovered one).

use unimesh_core::{Assignment, Input, Partition, Response, Ticket};

use super::queue::Ev;
use super::{topic, violation, HeldLane, Sim};
use crate::checker::{Clause, Violation};
use crate::model::coordinator::LaneId;

impl Sim {
    /// Members the coordinator may give lanes to: alive, not a zombie, not away.
    pub(super) fn eligible(&self) -> Vec<u32> {
        self.coordinator
            .members()
            .into_iter()
            .filter(|&n| {
                let node = &self.nodes[n as usize];
                node.mesh.is_some() && !node.zombie && !node.away
            })
            .collect()
    }

    /// Every lane without an owner goes to one of the least loaded eligible members.
    pub(super) fn assign_free(&mut self) -> Result<(), Violation> {
        for lane in self.coordinator.free_lanes() {
            let eligible = self.eligible();
            let Some(n) = self
                .coordinator
                .least_loaded(&eligible, &mut self.kafka_rng)
            else {
                return Ok(());
            };
            self.assign_lane(lane, n as usize)?;
        }
        Ok(())
    }

    /// Moves lanes from the most loaded eligible members to the least loaded.
    pub(super) fn balance(&mut self) -> Result<(), Violation> {
        let eligible = self.eligible();
        for (lane, from, to) in self.coordinator.balance(&eligible) {
            if self.coordinator.owner(lane) == Some(from) {
                self.move_lane(lane, to as usize)?;
            }
        }
        Ok(())
    }

    /// Hands `lane` to node `n` now, with the checkpoint the store holds for it.
    pub(super) fn assign_lane(&mut self, lane: LaneId, n: usize) -> Result<(), Violation> {
        let (g, p) = lane;
        self.maybe_retention_over_ranges(lane)?;
        let name = self.groups[g].name.clone();
        let broker = &self.broker;
        let checkpoint = self
            .store
            .checkpoint_read(&name, p, |p, e| broker.divergence(p, e))
            .map_err(|e| violation(Clause::Core, format!("unreadable checkpoint: {e}")))?;
        let gen = self.coordinator.assign(lane, n as u32);
        // The core takes the checkpoint it recovered at start when given none: only right
        // while that is still the store's.
        let recovered_current = checkpoint.is_some()
            && self.nodes[n].recovered.get(&lane) == checkpoint.as_ref()
            && self.kafka_rng.chance(0.5);
        let recovered = self.nodes[n].recovered.get(&lane);
        if recovered_current {
            self.faults.assigned_as_recovered += 1;
        } else if recovered.is_some() && recovered != checkpoint.as_ref() {
            // Another owner wrote since this node started: the core must take this one.
            self.faults.assigned_fresher_than_recovered += 1;
        }
        let given = if recovered_current {
            self.nodes[n].recovered.remove(&lane);
            None
        } else {
            checkpoint
        };
        self.note(
            n,
            "assign",
            [g as u64, u64::from(p), u64::from(given.is_some()), gen],
        );
        let r = self.input(
            n,
            Input::PartitionsAssigned {
                group: name.clone(),
                partitions: vec![Assignment {
                    partition: p,
                    earliest: self.broker.earliest(p),
                    end: self.broker.end(p),
                    checkpoint: given,
                }],
            },
        )?;
        if r != Some(Response::Ok) {
            return Err(violation(
                Clause::Core,
                format!("assign {name}/{p} to node {n} answered {r:?}"),
            ));
        }
        let leader_epoch = self.broker.leader_epoch(p);
        self.nodes[n]
            .held
            .insert(lane, HeldLane { gen, leader_epoch });
        self.check(n).assigned(&name, p);
        self.drain(n)
    }

    /// Revokes `lane` from node `n` (which holds it): the shell fires due timers first,
    /// and, when `flush`, persists what the lane has before the revocation.
    pub(super) fn revoke_lane(
        &mut self,
        n: usize,
        lane: LaneId,
        flush: bool,
    ) -> Result<(), Violation> {
        let (g, p) = lane;
        self.fire_due_timers(n)?;
        if flush {
            self.input(n, Input::FlushNow)?;
            self.drain(n)?;
        }
        let name = self.groups[g].name.clone();
        self.note(n, "revoke", [g as u64, u64::from(p), u64::from(flush), 0]);
        self.input(
            n,
            Input::PartitionsRevoked {
                group: name.clone(),
                partitions: vec![p],
            },
        )?;
        let t = self.core_now(n);
        self.check(n).revoked(t, &name, p);
        self.nodes[n].held.remove(&lane);
        self.nodes[n].fetching.remove(&lane);
        self.drain(n)
    }

    /// Moves `lane` from its owner to node `to` (possibly the same): revoked cleanly now,
    /// handed over once what the old owner wrote is durable.
    pub(super) fn move_lane(&mut self, lane: LaneId, to: usize) -> Result<(), Violation> {
        let Some(from) = self.coordinator.owner(lane).map(|n| n as usize) else {
            return Ok(());
        };
        self.faults.lane_moves += 1;
        let flush = self.kafka_rng.chance(0.7);
        self.revoke_lane(from, lane, flush)?;
        self.coordinator.release(lane);
        let after = self.nodes[from].last_emitted;
        let inc = self.nodes[from].inc;
        let d = self.kafka_rng.range(0, 300);
        self.at(
            d,
            Ev::Handover {
                lane,
                from: Some((from, inc, after)),
                to,
            },
        );
        Ok(())
    }

    /// `Ev::Handover`: once the old owner's writes up to its last ticket are out of the
    /// store's queue (or it died), the lane goes to its next owner — or, if that one is no
    /// longer eligible, back to the free lanes.
    pub(super) fn on_handover(
        &mut self,
        lane: LaneId,
        from: Option<(usize, u32, Ticket)>,
        to: usize,
    ) -> Result<(), Violation> {
        if let Some((f, inc, after)) = from {
            let waiting = self.nodes[f].inc == inc
                && self
                    .store
                    .front_ticket_for(f as u32)
                    .is_some_and(|t| t <= after);
            if waiting {
                self.at(5, Ev::Handover { lane, from, to });
                return Ok(());
            }
        }
        if self.coordinator.owner(lane).is_some() {
            return Ok(());
        }
        if self.eligible().contains(&(to as u32)) {
            self.assign_lane(lane, to)
        } else {
            self.coordinator.abandon(lane);
            self.assign_free()
        }
    }

    /// Now and then, before a lane is handed out with ACK ranges in its checkpoint,
    /// retention deletes records between its watermark and its last range: the new owner
    /// must fold those ranges when it hears "out of range", before it fetches again.
    fn maybe_retention_over_ranges(&mut self, lane: LaneId) -> Result<(), Violation> {
        let Some(k) = self.kafka() else {
            return Ok(());
        };
        let chance = k.retention_over_ranges;
        if self.liveness || !self.kafka_rng.chance(chance) {
            return Ok(());
        }
        let (g, p) = lane;
        let name = self.groups[g].name.clone();
        let broker = &self.broker;
        let Ok(Some(cp)) = self
            .store
            .checkpoint_read(&name, p, |p, e| broker.divergence(p, e))
        else {
            return Ok(());
        };
        if cp.progress.range_count() == 0 || !self.all_pinned() {
            return Ok(());
        }
        let (wm, done_end) = (cp.progress.watermark(), cp.progress.done_end());
        let lo = (wm + 1).max(self.broker.earliest(p) + 1);
        if lo > done_end {
            return Ok(());
        }
        let to = self.kafka_rng.range(lo, done_end);
        self.faults.retention_over_ranges += 1;
        self.note(0, "retention-ranges", [u64::from(p), to, wm, done_end]);
        self.broker.delete_below(p, to);
        self.checker.retention(&topic(), p, self.broker.earliest(p));
        Ok(())
    }

    /// Whether every lane of every group has a durable checkpoint (its start is pinned):
    /// before that, deleting records could take some a group never had a position for.
    pub(super) fn all_pinned(&self) -> bool {
        self.groups.iter().all(|g| {
            (0..self.opt.partitions).all(|p: Partition| self.checker.is_pinned(&g.name, p))
        })
    }
}
