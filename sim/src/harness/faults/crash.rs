//! Crashes and restarts: the process dies (sometimes right after a write reached the disk)
//! and comes back after a while as a new incarnation that recovers from the store.

use unimesh_core::{Assignment, Input, Mesh, Response};

use crate::checker::{Clause, Violation};
use crate::harness::queue::Ev;
use crate::harness::{violation, Sim};

impl Sim {
    /// `Ev::Crash`: the process dies if it is alive.
    pub(in crate::harness) fn on_crash(&mut self) -> Result<(), Violation> {
        self.recur(Ev::Crash, self.opt.faults.crash_every_ms, |s| {
            if s.mesh.is_some() {
                s.crash()?;
            }
            Ok(())
        })
    }

    /// `Ev::Restart`: the process comes back if it is down.
    pub(in crate::harness) fn on_restart(&mut self) -> Result<(), Violation> {
        if self.mesh.is_none() {
            self.restart()?;
        }
        Ok(())
    }

    /// The process dies: the mesh's memory and the store's unsynced writes are lost (a write
    /// that reached the disk may survive without the mesh having heard of it).
    fn crash(&mut self) -> Result<(), Violation> {
        self.faults.crashes += 1;
        if self.rng.chance(self.opt.faults.crash_mid_persist) {
            // The write reached the disk; the process died before hearing so.
            if let Some((ticket, batch)) = self.store.apply_front() {
                self.faults.crashes_mid_persist += 1;
                self.checker.persist_applied(ticket, &batch)?;
            }
        }
        self.note("crash", [u64::from(self.inc), 0, 0, 0]);
        self.mesh = None;
        self.store.crash();
        self.store_busy = false;
        self.tick_at = None;
        self.inc += 1;
        self.last_emitted = 0;
        let t = self.core_now();
        self.checker.crashed(t);
        for g in &mut self.groups {
            g.revoked.clear();
        }
        let d = self.rng.range(0, self.opt.faults.restart_after_ms);
        self.at(d, Ev::Restart);
        Ok(())
    }

    /// A new incarnation starts from what the store recovered: it subscribes every group
    /// and is assigned every partition (from the broker's current bounds).
    pub(in crate::harness) fn restart(&mut self) -> Result<(), Violation> {
        let recovered = self.store.recovered().map_err(|e| {
            violation(
                Clause::Core,
                format!("the store holds a checkpoint the core cannot read: {e}"),
            )
        })?;
        let t = self.core_now();
        let mut mesh = Mesh::new(self.config.clone(), recovered, t)
            .map_err(|e| violation(Clause::Core, format!("recovery refused: {e}")))?;
        mesh.check_every_step = false;
        self.inc += 1;
        self.checker.started(t, mesh.epoch())?;
        self.note("start", [u64::from(mesh.epoch()), 0, 0, 0]);
        self.mesh = Some(mesh);
        self.drain()?;
        for g in 0..self.groups.len() {
            self.subscribe_group(g)?;
        }
        // Clients find out the mesh restarted when their next poll registers them anew.
        for c in &mut self.clients {
            c.connected = false;
        }
        Ok(())
    }

    /// Subscribes group `g` and assigns it every partition.
    fn subscribe_group(&mut self, g: usize) -> Result<(), Violation> {
        let spec = self.groups[g].spec.clone();
        let name = spec.group.clone();
        let r = self.input(Input::Subscribe(spec))?;
        if r != Some(Response::Ok) {
            return Err(violation(
                Clause::Core,
                format!("subscribe {name} answered {r:?}"),
            ));
        }
        let partitions = (0..self.opt.partitions)
            .map(|p| Assignment {
                partition: p,
                earliest: self.broker.earliest(p),
                end: self.broker.end(p),
                checkpoint: None,
            })
            .collect();
        let r = self.input(Input::PartitionsAssigned {
            group: name.clone(),
            partitions,
        })?;
        if r != Some(Response::Ok) {
            return Err(violation(
                Clause::Core,
                format!("assign {name} answered {r:?}"),
            ));
        }
        for p in 0..self.opt.partitions {
            self.checker.assigned(&name, p);
        }
        self.groups[g].revoked.clear();
        self.drain()
    }
}
