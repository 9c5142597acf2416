//! The store at work: one batch of a node at a time, in ticket order, after a latency
//! drawn from the seed; during faults a batch may fail instead. In the Kafka world the
//! store also fences a batch holding a checkpoint of a replaced owner, and its answers are
//! asynchronous: each arrives after its own delay (so answers overtake each other), and
//! now and then twice.

use unimesh_core::{Input, Ticket};

use super::queue::Ev;
use super::Sim;
use crate::checker::Violation;
use crate::model::store::Front;

impl Sim {
    /// Starts the store on node `n`'s next batch unless it is busy or has none.
    pub(super) fn kick_store(&mut self, n: usize) {
        let node = &self.nodes[n];
        if !node.store_busy && self.store.has_pending_for(n as u32) {
            self.nodes[n].store_busy = true;
            let lat = self.broker_rng.range(0, self.opt.faults.persist_latency_ms);
            let inc = self.nodes[n].inc;
            self.at(lat, Ev::StoreWork { node: n, inc });
        }
    }

    /// `Ev::StoreWork`: the store applies (or fails, or fences) node `n`'s batch at its
    /// front and the mesh of incarnation `inc`, if still alive, is told.
    pub(super) fn on_store_work(&mut self, n: usize, inc: u32) -> Result<(), Violation> {
        if inc != self.nodes[n].inc {
            return Ok(());
        }
        self.nodes[n].store_busy = false;
        if !self.liveness && self.rng.chance(self.opt.faults.persist_fail) {
            if let Some(ticket) = self.store.fail_front_for(n as u32) {
                self.faults.persist_failures += 1;
                self.note(n, "persist-failed", [ticket, 0, 0, 0]);
                self.check(n).persist_failed(ticket);
                self.answer(n, ticket, false)?;
            }
        } else {
            let coordinator = &self.coordinator;
            let groups = &self.groups;
            let front = self.store.apply_front_for(n as u32, |g, p, gen| {
                groups
                    .iter()
                    .position(|x| x.name == *g)
                    .is_some_and(|gi| coordinator.is_current((gi, p), gen))
            });
            match front {
                Some(Front::Applied(ticket, batch)) => {
                    self.note(n, "persisted", [ticket, 0, 0, 0]);
                    self.check(n).persist_applied(ticket, &batch)?;
                    self.answer(n, ticket, true)?;
                }
                Some(Front::Fenced(ticket)) => {
                    self.faults.fenced_persists += 1;
                    self.note(n, "persist-fenced", [ticket, 0, 0, 0]);
                    self.check(n).persist_failed(ticket);
                    self.answer(n, ticket, false)?;
                }
                None => {}
            }
        }
        self.kick_store(n);
        Ok(())
    }

    /// Tells node `n`'s mesh how `ticket` went: at once in the classic world; in the Kafka
    /// world after a delay of its own, and now and then a second time.
    fn answer(&mut self, n: usize, ticket: Ticket, ok: bool) -> Result<(), Violation> {
        let Some(k) = self.kafka() else {
            if ok {
                self.check(n).persist_notified(ticket);
                self.input(n, Input::Persisted { ticket })?;
            } else {
                self.input(n, Input::PersistFailed { ticket })?;
            }
            return self.drain(n);
        };
        let (late_ms, twice) = (k.persist_answer_ms, k.persist_answer_twice);
        let inc = self.nodes[n].inc;
        let schedule = |sim: &mut Self| {
            let d = sim.kafka_rng.range(0, late_ms);
            sim.nodes[n].answers_pending += 1;
            sim.at(
                d,
                Ev::PersistAnswer {
                    node: n,
                    inc,
                    ticket,
                    ok,
                },
            );
        };
        schedule(self);
        if !self.liveness && self.kafka_rng.chance(twice) {
            self.faults.persist_answers_twice += 1;
            schedule(self);
        }
        Ok(())
    }

    /// `Ev::PersistAnswer`: the store's (late) answer reaches node `n`'s mesh, if the
    /// incarnation that asked is still alive.
    pub(super) fn on_persist_answer(
        &mut self,
        n: usize,
        inc: u32,
        ticket: Ticket,
        ok: bool,
    ) -> Result<(), Violation> {
        if inc != self.nodes[n].inc {
            return Ok(());
        }
        let node = &mut self.nodes[n];
        node.answers_pending = node.answers_pending.saturating_sub(1);
        if ticket < node.last_answered {
            self.faults.persist_answers_reordered += 1;
        }
        node.last_answered = node.last_answered.max(ticket);
        self.note(n, "persist-answer", [ticket, u64::from(ok), 0, 0]);
        if ok {
            self.check(n).persist_notified(ticket);
            self.input(n, Input::Persisted { ticket })?;
        } else {
            self.input(n, Input::PersistFailed { ticket })?;
        }
        self.drain(n)
    }
}
