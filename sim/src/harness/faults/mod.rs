//! Faults of the environment that arrive at random times during the fault phase: crashes
//! and restarts, rebalances, operator seeks and DLQ replays, retention, clock jumps; in the
//! Kafka world also members leaving, zombies, compaction and lost tails. Each arrives as a
//! Poisson process of the mean the seed drew (no arrivals for a mean of 0), and stops once
//! faults stop. Faults of the broker, store and clients that strike one operation (a
//! failed fetch, a lost delivery) live with that operation.

mod broker;
mod crash;
mod membership;
mod operator;
mod rebalance;
mod retention;

use unimesh_core::{Input, Millis};

use super::queue::Ev;
use super::Sim;
use crate::checker::Violation;
use crate::rng::Rng;

/// Exponentially distributed delay with the given mean (for fault arrivals).
fn exp(rng: &mut Rng, mean: Millis) -> Millis {
    let u = rng.unit().max(1e-9);
    ((-u.ln()) * mean as f64) as Millis + 1
}

impl Sim {
    /// Schedules the first arrival of every recurring fault (the Kafka world's drawing
    /// their delays from its own generator).
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
                let d = exp(&mut self.rng, mean);
                self.at(d, ev);
            }
        }
        let Some(k) = self.kafka().cloned() else {
            return;
        };
        let arrivals = [
            (k.compaction_every_ms, Ev::Compaction),
            (k.truncation_every_ms, Ev::Truncation),
            (k.leave_every_ms, Ev::Leave),
            (k.zombie_every_ms, Ev::Zombie),
        ];
        for (mean, ev) in arrivals {
            if mean > 0 {
                let d = exp(&mut self.kafka_rng, mean);
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
        let d = exp(&mut self.rng, mean_ms);
        self.at(d, ev);
        Ok(())
    }

    /// [`Sim::recur`] for a fault only the Kafka world has (its delays from its own
    /// generator).
    fn recur_kafka(
        &mut self,
        ev: Ev,
        mean_ms: Millis,
        strike: fn(&mut Self) -> Result<(), Violation>,
    ) -> Result<(), Violation> {
        if self.liveness || mean_ms == 0 {
            return Ok(());
        }
        strike(self)?;
        let d = exp(&mut self.kafka_rng, mean_ms);
        self.at(d, ev);
        Ok(())
    }

    /// A node a fault strikes: node 0 in the classic world, an alive one drawn from the
    /// seed in the Kafka world (None if every node is down).
    fn victim(&mut self) -> Option<usize> {
        if self.kafka().is_none() {
            return Some(0);
        }
        let alive = self.alive_nodes();
        if alive.is_empty() {
            return None;
        }
        Some(alive[self.kafka_rng.index(alive.len())])
    }

    /// `Ev::ClockJump`: a mesh's clock jumps forward (a suspended VM, an NTP step).
    pub(super) fn on_clock_jump(&mut self) -> Result<(), Violation> {
        self.recur(
            Ev::ClockJump,
            self.opt.faults.clock_jump_every_ms,
            Self::clock_jump,
        )
    }

    fn clock_jump(&mut self) -> Result<(), Violation> {
        let Some(n) = self.victim() else {
            return Ok(());
        };
        self.faults.clock_jumps += 1;
        let j = self.rng.range(500, 20_000);
        self.nodes[n].skew += j;
        self.note(n, "clock-jump", [j, 0, 0, 0]);
        self.input(n, Input::Tick)?;
        self.drain(n)
    }
}
