//! The end of a run: faults stop (TigerBeetle's liveness mode), the rest of the records
//! are published and the mesh comes back if it is down; then the run must converge within
//! a time budget, and the quiescent checks run.

use unimesh_core::Millis;

use super::queue::Ev;
use super::{violation, Sim, MAX_STEPS};
use crate::checker::{Clause, Violation};

/// How long after faults stop the run must converge (virtual time).
const LIVENESS_BUDGET_MS: Millis = 600_000;

impl Sim {
    /// `Ev::EndFaults`: faults stop.
    pub(super) fn on_end_faults(&mut self) -> Result<(), Violation> {
        self.note("end-faults", [0; 4]);
        self.liveness = true;
        self.liveness_since = self.now;
        while self.published < self.opt.records_before + self.opt.records {
            self.publish_one()?;
        }
        if self.mesh.is_none() {
            self.at(0, Ev::Restart);
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

    /// Whether the run converged: every lane durably done up to the end of the log, and
    /// the mesh idle (nothing in flight, queued, in backoff, or being persisted).
    fn converged(&self) -> bool {
        let Some(mesh) = &self.mesh else {
            return false;
        };
        if !self.checker.converged() || mesh.outstanding_persists() > 0 || self.store.has_pending()
        {
            return false;
        }
        // The durable state alone is not enough: a seek may have moved a lane back after
        // its last checkpoint was written, so the mesh's own lanes must agree.
        self.groups.iter().all(|g| {
            g.revoked.is_empty()
                && mesh.group_view(&g.name).is_some_and(|v| {
                    v.replay
                        .is_none_or(|r| r.in_flight + r.queued + r.backoff == 0)
                        && v.lanes.iter().all(|l| {
                            let end = self.broker.end(l.partition);
                            l.watermark == end
                                // None: not written in this incarnation (the store has it).
                                && l.durable_watermark.is_none_or(|d| d == end)
                                && l.in_flight + l.queued + l.backoff == 0
                        })
                })
        })
    }
}
