//! The end of a run: faults stop (TigerBeetle's liveness mode), the rest of the records
//! are published, every node comes back if it is down (zombies learn they lost their
//! lanes, members that left rejoin, every lane gets an owner); then the run must converge
//! within a time budget, and the quiescent checks run.

use unimesh_core::{Mesh, Millis};

use super::queue::Ev;
use super::{violation, Sim, MAX_STEPS};
use crate::checker::{Clause, Violation};

/// How long after faults stop the run must converge (virtual time).
const LIVENESS_BUDGET_MS: Millis = 600_000;

impl Sim {
    /// `Ev::EndFaults`: faults stop.
    pub(super) fn on_end_faults(&mut self) -> Result<(), Violation> {
        self.note(0, "end-faults", [0; 4]);
        self.liveness = true;
        self.liveness_since = self.now;
        while self.published < self.opt.records_before + self.opt.records {
            self.publish_one()?;
        }
        for n in 0..self.nodes.len() {
            if self.nodes[n].mesh.is_none() {
                self.at(0, Ev::Restart { node: n });
            } else if self.nodes[n].zombie {
                self.zombie_wakes(n)?;
            } else if self.nodes[n].away {
                self.rejoin_now(n)?;
            }
        }
        if self.kafka().is_some() {
            self.assign_free()?;
        }
        Ok(())
    }

    /// After an event once faults stopped: the run's outcome if it is decided — the
    /// quiescent checks once converged, a violation once the budget is spent — else None.
    pub(super) fn liveness_verdict(&self) -> Option<Result<(), Violation>> {
        if self.converged() {
            return Some(self.checker.check_quiescent());
        }
        if self.now > self.liveness_since + LIVENESS_BUDGET_MS || self.steps > MAX_STEPS {
            return Some(Err(violation(
                Clause::C1,
                format!(
                    "no convergence {}ms after faults stopped: {}",
                    self.now - self.liveness_since,
                    self.lag_report()
                ),
            )));
        }
        None
    }

    /// Whether the run converged: every lane durably done up to the end of the log, held
    /// by one live node (Kafka world: the coordinator's owner of it), and every mesh idle
    /// (nothing in flight, queued, in backoff, or being persisted or answered).
    fn converged(&self) -> bool {
        if !self.checker.converged() {
            return false;
        }
        if self.kafka().is_some() && !self.cluster_settled() {
            return false;
        }
        self.nodes.iter().enumerate().all(|(n, node)| {
            let Some(mesh) = &node.mesh else {
                return false;
            };
            if mesh.outstanding_persists() > 0
                || self.store.has_pending_for(n as u32)
                || node.answers_pending > 0
            {
                return false;
            }
            self.mesh_idle(mesh)
        })
    }

    /// Kafka world: no zombie, nobody away, every lane owned by an alive member that
    /// holds it.
    fn cluster_settled(&self) -> bool {
        let all_back =
            self.nodes.iter().enumerate().all(|(n, node)| {
                !node.zombie && !node.away && self.coordinator.is_member(n as u32)
            });
        all_back
            && self.coordinator.all_owned()
            && (0..self.groups.len()).all(|g| {
                (0..self.opt.partitions).all(|p| {
                    self.coordinator
                        .owner((g, p))
                        .is_some_and(|o| self.nodes[o as usize].held.contains_key(&(g, p)))
                })
            })
    }

    /// Whether one mesh's own lanes agree: the durable state alone is not enough, a seek
    /// may have moved a lane back after its last checkpoint was written.
    fn mesh_idle(&self, mesh: &Mesh) -> bool {
        self.groups.iter().all(|g| {
            g.revoked.is_empty()
                && mesh.group_view(&g.name).is_some_and(|v| {
                    v.replay
                        .is_none_or(|r| r.in_flight + r.queued + r.backoff == 0)
                        && v.lanes.iter().all(|l| {
                            // Every record shown is below the watermark (in the classic
                            // world: the watermark is the end).
                            let p = l.partition;
                            let done = |wm| self.broker.target(p) <= wm && wm <= self.broker.end(p);
                            done(l.watermark)
                                // None: not written in this incarnation (the store has it).
                                && l.durable_watermark.is_none_or(done)
                                && l.in_flight + l.queued + l.backoff == 0
                        })
                })
        })
    }
}
