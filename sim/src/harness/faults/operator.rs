//! What an operator does: seek a lane, replay dead letters — at the one mesh, or (Kafka
//! world) at an instance drawn from the seed, on a lane that instance holds.

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
        let Some((n, g, p)) = self.seek_target() else {
            return Ok(());
        };
        let earliest = self.broker.earliest(p);
        let end = self.broker.end(p);
        let offset = self.rng.range(earliest.saturating_sub(2), end);
        self.faults.seeks += 1;
        self.fire_due_timers(n)?;
        let name = self.groups[g].name.clone();
        self.note(n, "seek", [g as u64, u64::from(p), offset, 0]);
        let r = self.input(
            n,
            Input::Seek {
                group: name.clone(),
                partition: p,
                offset,
            },
        )?;
        if r == Some(Response::Ok) {
            // The new lane's position is of the log as it is now (a seek carries no
            // leader epoch to validate).
            let epoch = self.broker.leader_epoch(p);
            if let Some(h) = self.nodes[n].held.get_mut(&(g, p)) {
                h.leader_epoch = epoch;
            }
            let t = self.core_now(n);
            self.check(n).sought(t, &name, p, offset);
        }
        self.drain(n)
    }

    /// The node, group and partition of a seek: classic world, any lane not revoked;
    /// Kafka world, a lane an alive instance holds.
    fn seek_target(&mut self) -> Option<(usize, usize, Partition)> {
        if self.kafka().is_none() {
            self.nodes[0].mesh.as_ref()?;
            let g = self.rng.index(self.groups.len());
            let p = self.rng.below(u64::from(self.opt.partitions)) as Partition;
            if self.groups[g].revoked.contains(&p) {
                return None;
            }
            return Some((0, g, p));
        }
        let n = self.victim()?;
        let held: Vec<_> = self.nodes[n].held.keys().copied().collect();
        if held.is_empty() {
            return None;
        }
        let (g, p) = held[self.kafka_rng.index(held.len())];
        Some((n, g, p))
    }

    /// An operator replays a few dead letters of one group (at an instance drawn from the
    /// seed, in the Kafka world: the DLQ is the cluster's).
    fn replay(&mut self) -> Result<(), Violation> {
        let Some(n) = self.victim() else {
            return Ok(());
        };
        if self.nodes[n].mesh.is_none() {
            return Ok(());
        }
        let g = self.rng.index(self.groups.len());
        let name = self.groups[g].name.clone();
        let max = self.rng.range(1, 6) as usize;
        // A key holds two records only after a lost tail (the Kafka world).
        let exclusive = self.kafka().is_some();
        let records = self.store.dead_letters_for(n as u32, &name, max, exclusive);
        if records.is_empty() {
            return Ok(());
        }
        self.faults.replays += 1;
        self.note(n, "replay", [g as u64, records.len() as u64, 0, 0]);
        let r = self.input(
            n,
            Input::Replay {
                group: name.clone(),
                records: records.clone(),
            },
        )?;
        if matches!(r, Some(Response::Refused(_))) {
            self.store.replay_refused(n as u32, &name, &records);
        }
        self.drain(n)
    }
}
