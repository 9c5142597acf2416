//! What an operator does: seek a lane, replay dead letters.

use unimesh_core::{Input, Partition, Response};

use crate::checker::Violation;
use crate::harness::queue::Ev;
use crate::harness::Sim;

impl Sim {
    /// `Ev::Seek`: an operator seek.
    pub(in crate::harness) fn on_seek(&mut self) -> Result<(), Violation> {
        self.recur(Ev::Seek, self.opt.faults.seek_every_ms, Self::seek)
    }

    /// `Ev::Replay`: an operator replay of dead letters.
    pub(in crate::harness) fn on_replay(&mut self) -> Result<(), Violation> {
        self.recur(Ev::Replay, self.opt.faults.replay_every_ms, Self::replay)
    }

    /// An operator moves one lane drawn from the seed to an offset drawn from its bounds
    /// (a little below the earliest, too).
    fn seek(&mut self) -> Result<(), Violation> {
        if self.mesh.is_none() {
            return Ok(());
        }
        let g = self.rng.index(self.groups.len());
        let p = self.rng.below(u64::from(self.opt.partitions)) as Partition;
        if self.groups[g].revoked.contains(&p) {
            return Ok(());
        }
        let earliest = self.broker.earliest(p);
        let end = self.broker.end(p);
        let offset = self.rng.range(earliest.saturating_sub(2), end);
        self.faults.seeks += 1;
        self.fire_due_timers()?;
        let name = self.groups[g].name.clone();
        self.note("seek", [g as u64, u64::from(p), offset, 0]);
        let r = self.input(Input::Seek {
            group: name.clone(),
            partition: p,
            offset,
        })?;
        if r == Some(Response::Ok) {
            let t = self.core_now();
            self.checker.sought(t, &name, p, offset);
        }
        self.drain()
    }

    /// An operator replays a few dead letters of one group.
    fn replay(&mut self) -> Result<(), Violation> {
        if self.mesh.is_none() {
            return Ok(());
        }
        let g = self.rng.index(self.groups.len());
        let name = self.groups[g].name.clone();
        let max = self.rng.range(1, 6) as usize;
        let records = self.store.dead_letters(&name, max);
        if records.is_empty() {
            return Ok(());
        }
        self.faults.replays += 1;
        self.note("replay", [g as u64, records.len() as u64, 0, 0]);
        self.input(Input::Replay {
            group: name,
            records,
        })?;
        self.drain()
    }
}
