//! The clients: they poll, get deliveries, settle them as planned (ACK, late ACK, double
//! ACK, NACK, extend, ignore), disconnect and come back, and during faults send stale and
//! bogus ACKs and ask for a flush.

use unimesh_core::{ClientId, DeliveryId, GroupName, Input, Mesh, Record, Response, Settle};

use super::queue::Ev;
use super::{violation, Sim};
use crate::checker::{Clause, SettleKind, Violation};
use crate::model::client::Behaviour;
use crate::options::ClientOptions;

impl Sim {
    /// A client gets a delivery (unless it is lost on the way) and plans how it will settle
    /// it, as its behaviour and the record's poison dictate.
    pub(super) fn receive(
        &mut self,
        group: &GroupName,
        client: &ClientId,
        id: DeliveryId,
        record: &Record,
    ) -> Result<(), Violation> {
        let g = self.group_index(group)?;
        let Some(c) = self.client_index(g, client) else {
            return Err(violation(
                Clause::C8,
                format!("delivery to {client}, which never polled"),
            ));
        };
        if !self.liveness && self.client_rng.chance(self.opt.faults.delivery_lost) {
            self.faults.deliveries_lost += 1;
            return Ok(());
        }
        let poison = record.body.as_ref() == b"poison";
        let timeout = self.groups[g].spec.ack_timeout_ms;
        let (plan, behaviour) =
            self.clients[c].plan(&mut self.client_rng, poison, timeout, self.liveness);
        match behaviour {
            Behaviour::Ack => {}
            Behaviour::LateAck => self.faults.late_acks += 1,
            Behaviour::DoubleAck => self.faults.double_acks += 1,
            Behaviour::Nack => self.faults.nacks += 1,
            Behaviour::Ignore => self.faults.ignored += 1,
            Behaviour::Extend => self.faults.extends += 1,
        }
        let cl = &mut self.clients[c];
        cl.held.insert(id);
        cl.remember(id);
        for (after, kind) in plan {
            self.at(
                after,
                Ev::ClientSettle {
                    client: c,
                    id,
                    kind,
                },
            );
        }
        Ok(())
    }

    /// `Ev::ClientWake`: a client wakes up, schedules its next wake-up and, if the mesh is
    /// alive, disconnects, stays away, or polls (and during faults misbehaves).
    pub(super) fn on_client_wake(&mut self, c: usize) -> Result<(), Violation> {
        let wake = self.clients[c].opts.wake_ms;
        let d = self.client_rng.range(1, wake);
        self.at(d, Ev::ClientWake { client: c });
        if self.mesh.is_none() {
            return Ok(());
        }
        let g = self.clients[c].group;
        let group = self.groups[g].name.clone();
        let id = self.clients[c].id.clone();
        let opts = self.clients[c].opts.clone();
        if !self.liveness && self.clients[c].connected && self.client_rng.chance(opts.disconnect) {
            return self.disconnect(c, group, id);
        }
        if !self.clients[c].connected && !self.liveness && self.client_rng.chance(0.5) {
            // Stays away a little longer.
            return Ok(());
        }
        self.clients[c].connected = true;
        self.poll(c, group, id, &opts)?;
        if self.liveness {
            return Ok(());
        }
        self.misbehave(c, &opts)
    }

    /// The client goes away; the mesh is told.
    fn disconnect(&mut self, c: usize, group: GroupName, id: ClientId) -> Result<(), Violation> {
        self.faults.disconnects += 1;
        self.clients[c].connected = false;
        self.note("client-gone", [c as u64, 0, 0, 0]);
        self.input(Input::ClientGone {
            group: group.clone(),
            client: id.clone(),
        })?;
        let t = self.core_now();
        self.checker.client_gone(t, &group, &id);
        self.drain()
    }

    /// The client polls for up to its most (during faults, a number drawn below it).
    fn poll(
        &mut self,
        c: usize,
        group: GroupName,
        id: ClientId,
        opts: &ClientOptions,
    ) -> Result<(), Violation> {
        let max = if self.liveness {
            opts.poll_max.max(1)
        } else {
            self.client_rng.range(0, u64::from(opts.poll_max)) as u32
        };
        self.note("poll", [c as u64, u64::from(max), 0, 0]);
        let r = self.input(Input::ClientPoll {
            group: group.clone(),
            client: id.clone(),
            max,
        })?;
        self.checker
            .client_poll(&group, &id, max, r == Some(Response::Ok));
        self.drain()
    }

    /// During faults, after a poll: a stale ACK of an id the client once held, a bogus ACK
    /// of an id never issued, and a `FlushNow`, each as drawn from the seed.
    fn misbehave(&mut self, c: usize, opts: &ClientOptions) -> Result<(), Violation> {
        if self.client_rng.chance(opts.stale_ack) {
            if let Some(old) = self.clients[c].past_id(&mut self.client_rng) {
                self.faults.stale_acks += 1;
                self.settle(c, vec![old], SettleKind::Ack)?;
            }
        }
        if self.client_rng.chance(opts.bogus_ack) {
            self.faults.bogus_acks += 1;
            let epoch = self.mesh.as_ref().map_or(1, Mesh::epoch);
            let bogus = DeliveryId {
                epoch: epoch + self.client_rng.below(2) as u32,
                lease: self.client_rng.range(0, 40),
                partition: self.client_rng.below(4) as u32,
                offset: self.client_rng.range(0, 300),
                attempt: self.client_rng.range(0, 6) as u32,
            };
            self.settle(c, vec![bogus], SettleKind::Ack)?;
        }
        if self.client_rng.chance(self.opt.faults.flush_now) {
            self.faults.flush_nows += 1;
            self.input(Input::FlushNow)?;
            self.drain()?;
        }
        Ok(())
    }

    /// `Ev::ClientSettle`: a client settles a delivery as it planned when it got it.
    pub(super) fn on_client_settle(
        &mut self,
        c: usize,
        id: DeliveryId,
        kind: SettleKind,
    ) -> Result<(), Violation> {
        if matches!(kind, SettleKind::Ack | SettleKind::Nack(_)) {
            self.clients[c].held.remove(&id);
        }
        self.settle(c, vec![id], kind)
    }

    /// Sends one settle to the mesh and has its answer checked.
    fn settle(
        &mut self,
        c: usize,
        ids: Vec<DeliveryId>,
        kind: SettleKind,
    ) -> Result<(), Violation> {
        if self.mesh.is_none() {
            return Ok(());
        }
        let group = self.groups[self.clients[c].group].name.clone();
        let (what, first) = match kind {
            SettleKind::Ack => ("ack", ids[0]),
            SettleKind::Nack(_) => ("nack", ids[0]),
            SettleKind::Extend(_) => ("extend", ids[0]),
        };
        self.note(
            what,
            [
                u64::from(first.epoch) << 32 | first.lease,
                u64::from(first.partition),
                first.offset,
                u64::from(first.attempt),
            ],
        );
        let input = match kind {
            SettleKind::Ack => Input::Ack {
                group: group.clone(),
                ids: ids.clone(),
            },
            SettleKind::Nack(delay_ms) => Input::Nack {
                group: group.clone(),
                ids: ids.clone(),
                delay_ms,
            },
            SettleKind::Extend(extend_ms) => Input::Extend {
                group: group.clone(),
                ids: ids.clone(),
                extend_ms,
            },
        };
        let Some(response) = self.input(input)? else {
            return Ok(());
        };
        let t = self.core_now();
        if let Response::Settled(v) = &response {
            let code = match v.first() {
                Some(Settle::Accepted) => 0,
                Some(Settle::Rejected(r)) => 1 + *r as u64,
                None => 9,
            };
            self.note("settled", [code, 0, 0, 0]);
        }
        self.checker.settled(t, &group, kind, &ids, &response)?;
        self.drain()
    }

    /// The index of `id` among the clients of group `g`.
    pub(super) fn client_index(&self, g: usize, id: &ClientId) -> Option<usize> {
        self.clients
            .iter()
            .position(|c| c.group == g && c.id == *id)
    }
}
