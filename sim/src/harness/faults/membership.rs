//! Membership faults of the Kafka world: a member leaves the group cleanly for a while
//! (its lanes move to the others) and rejoins; a member's session expires while its
//! process runs on (a zombie: its lanes are handed to the others under a new generation,
//! its writes fenced) until it learns it lost them and rejoins.

use crate::checker::Violation;
use crate::harness::queue::Ev;
use crate::harness::Sim;

impl Sim {
    /// `Ev::Leave`: a member drawn from the seed leaves the group.
    pub(in crate::harness) fn on_leave(&mut self) -> Result<(), Violation> {
        let mean = self.kafka().map_or(0, |k| k.leave_every_ms);
        self.recur_kafka(Ev::Leave, mean, Self::leave)
    }

    /// The member revokes every lane it owns; each moves to another eligible member (or
    /// waits, free, if there is none). It rejoins after the time drawn.
    fn leave(&mut self) -> Result<(), Violation> {
        let eligible = self.eligible();
        if eligible.is_empty() {
            return Ok(());
        }
        let n = eligible[self.kafka_rng.index(eligible.len())] as usize;
        self.faults.leaves += 1;
        self.note(n, "leave", [0; 4]);
        self.nodes[n].away = true;
        let others: Vec<u32> = eligible.into_iter().filter(|&m| m as usize != n).collect();
        for lane in self.coordinator.lanes_of(n as u32) {
            match self.coordinator.least_loaded(&others, &mut self.kafka_rng) {
                Some(to) => self.move_lane(lane, to as usize)?,
                None => {
                    self.revoke_lane(n, lane, true)?;
                    self.coordinator.release(lane);
                    self.coordinator.abandon(lane);
                }
            }
        }
        self.coordinator.leave(n as u32);
        let away = self.kafka().map_or(0, |k| k.away_ms);
        let inc = self.nodes[n].inc;
        self.at(away, Ev::Rejoin { node: n, inc });
        Ok(())
    }

    /// `Ev::Rejoin`: the member that left comes back (if its incarnation still runs).
    pub(in crate::harness) fn on_rejoin(&mut self, n: usize, inc: u32) -> Result<(), Violation> {
        if self.nodes[n].inc != inc || self.nodes[n].mesh.is_none() || !self.nodes[n].away {
            return Ok(());
        }
        self.rejoin(n)
    }

    fn rejoin(&mut self, n: usize) -> Result<(), Violation> {
        self.note(n, "rejoin", [0; 4]);
        self.nodes[n].away = false;
        self.coordinator.join(n as u32);
        self.assign_free()?;
        self.balance()
    }

    /// `Ev::Zombie`: a member drawn from the seed loses its session while it runs.
    pub(in crate::harness) fn on_zombie(&mut self) -> Result<(), Violation> {
        let mean = self.kafka().map_or(0, |k| k.zombie_every_ms);
        self.recur_kafka(Ev::Zombie, mean, Self::zombie)
    }

    /// The coordinator expires the member: its lanes go to the others under new
    /// generations. The node is not told; it learns after the time drawn.
    fn zombie(&mut self) -> Result<(), Violation> {
        let eligible = self.eligible();
        if eligible.is_empty() {
            return Ok(());
        }
        let n = eligible[self.kafka_rng.index(eligible.len())] as usize;
        self.faults.zombies += 1;
        self.note(n, "zombie", [self.nodes[n].held.len() as u64, 0, 0, 0]);
        self.nodes[n].zombie = true;
        self.coordinator.expire(n as u32);
        let t = self.core_now(n);
        self.check(n).expired(t);
        let (after, inc) = (self.kafka().map_or(0, |k| k.zombie_ms), self.nodes[n].inc);
        self.at(after, Ev::ZombieWakes { node: n, inc });
        self.assign_free()
    }

    /// `Ev::ZombieWakes`: the zombie learns it lost its lanes (Kafka's "partitions lost":
    /// nothing can be committed any more), and rejoins.
    pub(in crate::harness) fn on_zombie_wakes(
        &mut self,
        n: usize,
        inc: u32,
    ) -> Result<(), Violation> {
        if self.nodes[n].inc != inc || self.nodes[n].mesh.is_none() || !self.nodes[n].zombie {
            return Ok(());
        }
        self.zombie_wakes(n)
    }

    /// The zombie's lanes are revoked (lost: no flush) and it rejoins.
    pub(in crate::harness) fn zombie_wakes(&mut self, n: usize) -> Result<(), Violation> {
        self.note(
            n,
            "zombie-wakes",
            [self.nodes[n].held.len() as u64, 0, 0, 0],
        );
        let held: Vec<_> = self.nodes[n].held.keys().copied().collect();
        for lane in held {
            self.revoke_lane(n, lane, false)?;
        }
        self.nodes[n].zombie = false;
        self.rejoin(n)
    }

    /// Once faults stopped: a node that left comes back at once.
    pub(in crate::harness) fn rejoin_now(&mut self, n: usize) -> Result<(), Violation> {
        self.rejoin(n)
    }
}
