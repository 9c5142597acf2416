//! Driving a node's mesh: the time it is given (its own clock, with clock glitches), one
//! input at a time with its own invariant check, and its timers.

use std::panic::{catch_unwind, AssertUnwindSafe};

use unimesh_core::{Input, Mesh, Millis, Response};

use super::queue::Ev;
use super::{violation, Sim};
use crate::checker::{Clause, Violation};

impl Sim {
    /// The time node `n`'s next input is given at: the harness clock plus the node's clock
    /// jumps so far, now and then (during faults) glitched a little into the past.
    pub(super) fn mesh_now(&mut self, n: usize) -> Millis {
        let t = self.now + self.nodes[n].skew;
        if !self.liveness && self.rng.chance(self.opt.faults.clock_glitch) {
            self.faults.clock_glitches += 1;
            return t.saturating_sub(self.rng.range(1, 500));
        }
        t
    }

    /// The time node `n`'s mesh last acted at: what its deadlines were computed from (a
    /// glitched, earlier time is ignored by the core, so it may lag the node's clock).
    pub(super) fn core_now(&self, n: usize) -> Millis {
        let node = &self.nodes[n];
        node.mesh.as_ref().map_or(self.now + node.skew, Mesh::now)
    }

    /// Feeds one input to node `n`'s mesh (no effects drained yet) and checks the mesh's
    /// own invariants. None if the node is down.
    pub(super) fn input(&mut self, n: usize, input: Input) -> Result<Option<Response>, Violation> {
        let t = self.mesh_now(n);
        let Some(mesh) = self.nodes[n].mesh.as_mut() else {
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

    /// Fires node `n`'s due timers first, so effects of timers are not mistaken for effects
    /// of the next input (the core fires due timers at the start of every `handle`; a flush
    /// fired by a seek's `handle` carries the lane as it was before the seek).
    pub(super) fn fire_due_timers(&mut self, n: usize) -> Result<(), Violation> {
        for _ in 0..8 {
            let node = &self.nodes[n];
            let due = node
                .mesh
                .as_ref()
                .and_then(Mesh::poll_timeout)
                .is_some_and(|t| t <= self.now + node.skew);
            if !due {
                break;
            }
            self.note(n, "tick", [1, 0, 0, 0]);
            self.input(n, Input::Tick)?;
            self.drain(n)?;
        }
        Ok(())
    }

    /// Arms one `Ev::Tick` at node `n`'s next deadline (in harness time), unless one is
    /// armed earlier already.
    pub(super) fn schedule_tick(&mut self, n: usize) {
        let node = &self.nodes[n];
        let Some(t) = node.mesh.as_ref().and_then(Mesh::poll_timeout) else {
            return;
        };
        let at = t.saturating_sub(node.skew).max(self.now);
        if node.tick_at.is_none_or(|p| at < p) {
            self.nodes[n].tick_at = Some(at);
            self.at(at - self.now, Ev::Tick { node: n });
        }
    }

    /// `Ev::Tick`: fires node `n`'s timers if one is due, else arms the next tick.
    pub(super) fn on_tick(&mut self, n: usize) -> Result<(), Violation> {
        if self.nodes[n].tick_at.is_some_and(|t| t <= self.now) {
            self.nodes[n].tick_at = None;
        }
        let skew = self.nodes[n].skew;
        let timeout = self.nodes[n].mesh.as_ref().and_then(Mesh::poll_timeout);
        if timeout.is_some_and(|t| t <= self.now + skew) {
            let pt = timeout.unwrap_or(0);
            let cn = self.core_now(n);
            self.note(n, "tick", [0, pt, cn, skew]);
            self.input(n, Input::Tick)?;
            self.drain(n)?;
        } else {
            self.schedule_tick(n);
        }
        Ok(())
    }
}
