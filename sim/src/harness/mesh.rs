//! Driving the mesh: the time it is given (with clock glitches), one input at a time with
//! its own invariant check, and its timers.

use std::panic::{catch_unwind, AssertUnwindSafe};

use unimesh_core::{Input, Mesh, Millis, Response};

use super::queue::Ev;
use super::{violation, Sim};
use crate::checker::{Clause, Violation};

impl Sim {
    /// The time the next input is given at: the harness clock plus the clock jumps so far,
    /// now and then (during faults) glitched a little into the past.
    pub(super) fn mesh_now(&mut self) -> Millis {
        let t = self.now + self.skew;
        if !self.liveness && self.rng.chance(self.opt.faults.clock_glitch) {
            self.faults.clock_glitches += 1;
            return t.saturating_sub(self.rng.range(1, 500));
        }
        t
    }

    /// The time the mesh last acted at: what its deadlines were computed from (a glitched,
    /// earlier time is ignored by the core, so it may lag the harness clock).
    pub(super) fn core_now(&self) -> Millis {
        self.mesh.as_ref().map_or(self.now + self.skew, Mesh::now)
    }

    /// Feeds one input (no effects drained yet) and checks the mesh's own invariants.
    pub(super) fn input(&mut self, input: Input) -> Result<Option<Response>, Violation> {
        let t = self.mesh_now();
        let Some(mesh) = self.mesh.as_mut() else {
            return Ok(None);
        };
        self.steps += 1;
        let r = catch_unwind(AssertUnwindSafe(|| mesh.handle(t, input)));
        let response = r.map_err(|e| {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            violation(Clause::Core, format!("the core panicked: {msg}"))
        })?;
        if self.core_check {
            mesh.check_invariants()
                .map_err(|m| violation(Clause::Core, m))?;
        }
        Ok(Some(response))
    }

    /// Fires every due timer first, so effects of timers are not mistaken for effects of the
    /// next input (the core fires due timers at the start of every `handle`; a flush fired
    /// by a seek's `handle` carries the lane as it was before the seek).
    pub(super) fn fire_due_timers(&mut self) -> Result<(), Violation> {
        for _ in 0..8 {
            let due = self
                .mesh
                .as_ref()
                .and_then(Mesh::poll_timeout)
                .is_some_and(|t| t <= self.now + self.skew);
            if !due {
                break;
            }
            self.note("tick", [1, 0, 0, 0]);
            self.input(Input::Tick)?;
            self.drain()?;
        }
        Ok(())
    }

    /// Arms one `Ev::Tick` at the mesh's next deadline (in harness time), unless one is
    /// armed earlier already.
    pub(super) fn schedule_tick(&mut self) {
        let Some(t) = self.mesh.as_ref().and_then(Mesh::poll_timeout) else {
            return;
        };
        let at = t.saturating_sub(self.skew).max(self.now);
        if self.tick_at.is_none_or(|p| at < p) {
            self.tick_at = Some(at);
            self.at(at - self.now, Ev::Tick);
        }
    }

    /// `Ev::Tick`: fires the mesh's timers if one is due, else arms the next tick.
    pub(super) fn on_tick(&mut self) -> Result<(), Violation> {
        if self.tick_at.is_some_and(|t| t <= self.now) {
            self.tick_at = None;
        }
        let due = self
            .mesh
            .as_ref()
            .and_then(Mesh::poll_timeout)
            .is_some_and(|t| t <= self.now + self.skew);
        if due {
            let pt = self.mesh.as_ref().and_then(Mesh::poll_timeout).unwrap_or(0);
            let cn = self.core_now();
            self.note("tick", [0, pt, cn, self.skew]);
            self.input(Input::Tick)?;
            self.drain()?;
        } else {
            self.schedule_tick();
        }
        Ok(())
    }
}
