//! The store at work: one batch at a time, in ticket order, after a latency drawn from the
//! seed; during faults a batch may fail instead.

use unimesh_core::Input;

use super::queue::Ev;
use super::Sim;
use crate::checker::Violation;

impl Sim {
    /// Starts the store on its next batch unless it is busy or has none.
    pub(super) fn kick_store(&mut self) {
        if !self.store_busy && self.store.has_pending() {
            self.store_busy = true;
            let lat = self.broker_rng.range(0, self.opt.faults.persist_latency_ms);
            let inc = self.inc;
            self.at(lat, Ev::StoreWork { inc });
        }
    }

    /// `Ev::StoreWork`: the store applies (or fails) the batch at its front and the mesh of
    /// incarnation `inc`, if still alive, is told.
    pub(super) fn on_store_work(&mut self, inc: u32) -> Result<(), Violation> {
        if inc != self.inc {
            return Ok(());
        }
        self.store_busy = false;
        if !self.liveness && self.rng.chance(self.opt.faults.persist_fail) {
            if let Some(ticket) = self.store.fail_front() {
                self.faults.persist_failures += 1;
                self.note("persist-failed", [ticket, 0, 0, 0]);
                self.checker.persist_failed(ticket);
                self.input(Input::PersistFailed { ticket })?;
                self.drain()?;
            }
        } else if let Some((ticket, batch)) = self.store.apply_front() {
            self.note("persisted", [ticket, 0, 0, 0]);
            self.checker.persist_applied(ticket, &batch)?;
            self.checker.persist_notified(ticket);
            self.input(Input::Persisted { ticket })?;
            self.drain()?;
        }
        self.kick_store();
        Ok(())
    }
}
