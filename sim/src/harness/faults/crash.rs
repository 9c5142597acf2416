//! Crashes and restarts: a process dies (sometimes right after a write reached the disk)
//! and comes back after a while as a new incarnation that recovers from the store. In the
//! Kafka world the coordinator notices a death only when the session expires; a node that
//! restarts before rejoins as a new member (the old one expired then).

use std::collections::BTreeMap;

use unimesh_core::{Assignment, Input, Mesh, Response};

use crate::checker::{Clause, Violation};
use crate::harness::queue::Ev;
use crate::harness::{violation, Sim};
use crate::model::store::Front;

impl Sim {
    /// `Ev::Crash`: a process dies if it is alive.
    pub(in crate::harness) fn on_crash(&mut self) -> Result<(), Violation> {
        self.recur(Ev::Crash, self.opt.faults.crash_every_ms, |s| {
            let Some(n) = s.victim() else {
                return Ok(());
            };
            if s.nodes[n].mesh.is_some() {
                s.crash(n)?;
            }
            Ok(())
        })
    }

    /// `Ev::Restart`: node `n`'s process comes back if it is down.
    pub(in crate::harness) fn on_restart(&mut self, n: usize) -> Result<(), Violation> {
        if self.nodes[n].mesh.is_none() {
            self.restart(n)?;
        }
        Ok(())
    }

    /// Node `n`'s process dies: its mesh's memory and its unsynced writes are lost (a write
    /// that reached the disk may survive without the mesh having heard of it).
    fn crash(&mut self, n: usize) -> Result<(), Violation> {
        self.faults.crashes += 1;
        if self.rng.chance(self.opt.faults.crash_mid_persist) {
            // The write reached the disk; the process died before hearing so (a fenced
            // batch never reaches it).
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
                    self.faults.crashes_mid_persist += 1;
                    self.check(n).persist_applied(ticket, &batch)?;
                }
                Some(Front::Fenced(ticket)) => self.check(n).persist_failed(ticket),
                None => {}
            }
        }
        let inc = self.nodes[n].inc;
        self.note(n, "crash", [u64::from(inc), 0, 0, 0]);
        self.store.crash_node(n as u32);
        let node = &mut self.nodes[n];
        node.mesh = None;
        node.store_busy = false;
        node.tick_at = None;
        node.inc += 1;
        node.last_emitted = 0;
        node.held.clear();
        node.fetching.clear();
        node.recovered.clear();
        node.answers_pending = 0;
        node.last_answered = 0;
        node.zombie = false;
        let t = self.core_now(n);
        self.check(n).crashed(t);
        for g in &mut self.groups {
            g.revoked.clear();
        }
        let d = self.rng.range(0, self.opt.faults.restart_after_ms);
        self.at(d, Ev::Restart { node: n });
        if let Some(k) = self.kafka() {
            // The coordinator notices when the session expires.
            let (session, inc) = (k.session_ms, self.nodes[n].inc);
            self.at(session, Ev::SessionExpired { node: n, inc });
        }
        Ok(())
    }

    /// A new incarnation of node `n` starts from what the store recovered: it subscribes
    /// every group and — classic world — is assigned every partition (from the broker's
    /// current bounds), or — Kafka world — joins the group and gets what the coordinator
    /// hands it.
    pub(in crate::harness) fn restart(&mut self, n: usize) -> Result<(), Violation> {
        let broker = &self.broker;
        let recovered = self
            .store
            .recovered_for(n as u32, |p, e| broker.divergence(p, e))
            .map_err(|e| {
                violation(
                    Clause::Core,
                    format!("the store holds a checkpoint the core cannot read: {e}"),
                )
            })?;
        let snapshot: BTreeMap<_, _> = recovered
            .checkpoints
            .iter()
            .filter_map(|(g, p, c)| {
                let gi = self.groups.iter().position(|x| x.name == *g)?;
                Some(((gi, *p), c.clone()))
            })
            .collect();
        let t = self.core_now(n);
        let mut mesh = Mesh::new(self.config.clone(), recovered, t)
            .map_err(|e| violation(Clause::Core, format!("recovery refused: {e}")))?;
        mesh.check_every_step = false;
        self.nodes[n].inc += 1;
        self.check(n).started(t, mesh.epoch())?;
        self.note(n, "start", [u64::from(mesh.epoch()), 0, 0, 0]);
        self.nodes[n].mesh = Some(mesh);
        self.nodes[n].recovered = snapshot;
        self.drain(n)?;
        let kafka = self.kafka().is_some();
        for g in 0..self.groups.len() {
            self.subscribe_group(n, g, !kafka)?;
        }
        // Clients find out the mesh restarted when their next poll registers them anew.
        for c in &mut self.clients {
            c.connected[n] = false;
        }
        if kafka {
            if self.coordinator.is_member(n as u32) {
                // The member of the last incarnation is replaced.
                self.faults.session_expiries += 1;
                self.coordinator.expire(n as u32);
            }
            let node = &mut self.nodes[n];
            node.zombie = false;
            node.away = false;
            self.coordinator.join(n as u32);
            self.assign_free()?;
            self.balance()?;
        }
        Ok(())
    }

    /// `Ev::SessionExpired`: the coordinator gives up on node `n`'s dead incarnation `inc`
    /// (unless it restarted since): its lanes are free, under new generations.
    pub(in crate::harness) fn on_session_expired(
        &mut self,
        n: usize,
        inc: u32,
    ) -> Result<(), Violation> {
        if self.nodes[n].inc != inc || !self.coordinator.is_member(n as u32) {
            return Ok(());
        }
        self.faults.session_expiries += 1;
        self.note(n, "session-expired", [u64::from(inc), 0, 0, 0]);
        self.coordinator.expire(n as u32);
        self.assign_free()
    }

    /// Subscribes group `g` on node `n` and, if `assign_all`, assigns it every partition.
    fn subscribe_group(&mut self, n: usize, g: usize, assign_all: bool) -> Result<(), Violation> {
        let spec = self.groups[g].spec.clone();
        let name = spec.group.clone();
        let r = self.input(n, Input::Subscribe(spec))?;
        if r != Some(Response::Ok) {
            return Err(violation(
                Clause::Core,
                format!("subscribe {name} answered {r:?}"),
            ));
        }
        if !assign_all {
            return self.drain(n);
        }
        let partitions = (0..self.opt.partitions)
            .map(|p| Assignment {
                partition: p,
                earliest: self.broker.earliest(p),
                end: self.broker.end(p),
                checkpoint: None,
            })
            .collect();
        let r = self.input(
            n,
            Input::PartitionsAssigned {
                group: name.clone(),
                partitions,
            },
        )?;
        if r != Some(Response::Ok) {
            return Err(violation(
                Clause::Core,
                format!("assign {name} answered {r:?}"),
            ));
        }
        for p in 0..self.opt.partitions {
            self.check(n).assigned(&name, p);
        }
        self.groups[g].revoked.clear();
        self.drain(n)
    }
}
