//! Faults of the environment that arrive at random times during the fault phase: crashes
//! and restarts, rebalances, operator seeks and DLQ replays, retention, clock jumps. Each
//! arrives as a Poisson process of the mean the seed drew (no arrivals for a mean of 0),
//! and stops once faults stop. Faults of the broker, store and clients that strike one
//! operation (a failed fetch, a lost delivery) live with that operation.

mod crash;
mod operator;
mod rebalance;
mod retention;

use unimesh_core::{Input, Millis};

use super::queue::Ev;
use super::Sim;
use crate::checker::Violation;

impl Sim {
    /// Exponentially distributed delay with the given mean (for fault arrivals).
    fn exp(&mut self, mean: Millis) -> Millis {
        let u = self.rng.unit().max(1e-9);
        ((-u.ln()) * mean as f64) as Millis + 1
    }

    /// Schedules the first arrival of every recurring fault.
    pub(super) fn schedule_fault_arrivals(&mut self) {
        let f = self.opt.faults.clone();
        let arrivals = [
            (f.crash_every_ms, Ev::Crash),
            (f.rebalance_every_ms, Ev::Rebalance),
            (f.seek_every_ms, Ev::Seek),
            (f.replay_every_ms, Ev::Replay),
            (f.retention_every_ms, Ev::Retention),
            (f.clock_jump_every_ms, Ev::ClockJump),
        ];
        for (mean, ev) in arrivals {
            if mean > 0 {
                let d = self.exp(mean);
                self.at(d, ev);
            }
        }
    }

    /// One arrival of a recurring fault: while faults last, `strike`, then schedule the
    /// next arrival of `ev` after an exponential delay of mean `mean_ms`.
    fn recur(
        &mut self,
        ev: Ev,
        mean_ms: Millis,
        strike: fn(&mut Self) -> Result<(), Violation>,
    ) -> Result<(), Violation> {
        if self.liveness {
            return Ok(());
        }
        strike(self)?;
        let d = self.exp(mean_ms);
        self.at(d, ev);
        Ok(())
    }

    /// `Ev::ClockJump`: the mesh's clock jumps forward (a suspended VM, an NTP step).
    pub(super) fn on_clock_jump(&mut self) -> Result<(), Violation> {
        self.recur(
            Ev::ClockJump,
            self.opt.faults.clock_jump_every_ms,
            Self::clock_jump,
        )
    }

    fn clock_jump(&mut self) -> Result<(), Violation> {
        self.faults.clock_jumps += 1;
        let j = self.rng.range(500, 20_000);
        self.skew += j;
        self.note("clock-jump", [j, 0, 0, 0]);
        self.input(Input::Tick)?;
        self.drain()
    }
}
