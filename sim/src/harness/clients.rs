//! The clients: they poll (their home instance; in a cluster they move between
//! instances), get deliveries, settle them as planned (ACK, late ACK, double ACK, NACK,
//! extend, ignore) at the instance that issued them, disconnect and come back, and during
//! faults send stale and bogus ACKs and ask for a flush.

use unimesh_core::{ClientId, DeliveryId, GroupName, Input, Mesh, Record, Response, Settle};

use super::queue::Ev;
use super::{violation, Sim};
use crate::checker::{Clause, SettleKind, Violation};
use crate::model::client::Behaviour;
use crate::options::ClientOptions;

impl Sim {
    /// A client gets a delivery from node `n` (unless it is lost on the way) and plans how
    /// it will settle it, as its behaviour and the record's poison dictate.
    pub(super) fn receive(
        &mut self,
        n: usize,
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
        cl.held.insert((n, id));
        cl.remember(id);
        for (after, kind) in plan {
            self.at(
                after,
                Ev::ClientSettle {
                    client: c,
                    node: n,
                    id,
                    kind,
                },
            );
        }
        Ok(())
    }

    /// `Ev::ClientWake`: a client wakes up, schedules its next wake-up and, if its home
    /// instance is alive, disconnects, stays away, or polls (and during faults misbehaves).
    /// In a cluster it first may move to another instance (always, if its home is down).
    pub(super) fn on_client_wake(&mut self, c: usize) -> Result<(), Violation> {
        let wake = self.clients[c].opts.wake_ms;
        let d = self.client_rng.range(1, wake);
        self.at(d, Ev::ClientWake { client: c });
        self.maybe_move(c);
        let n = self.clients[c].home;
        if self.nodes[n].mesh.is_none() {
            return Ok(());
        }
        let g = self.clients[c].group;
        let group = self.groups[g].name.clone();
        let id = self.clients[c].id.clone();
        let opts = self.clients[c].opts.clone();
        let connected = self.clients[c].connected[n];
        if !self.liveness && connected && self.client_rng.chance(opts.disconnect) {
            return self.disconnect(c, n, group, id);
        }
        if !connected && !self.liveness && self.client_rng.chance(0.5) {
            // Stays away a little longer.
            return Ok(());
        }
        self.clients[c].connected[n] = true;
        self.poll(c, n, group, id, &opts)?;
        if self.liveness {
            return Ok(());
        }
        self.misbehave(c, n, &opts)
    }

    /// Kafka world: the client's next poll goes to another instance (as a load balancer
    /// spreads polls), now and then, and always when its home is down; once faults stopped
    /// it goes round all of them, so every owner of its group's lanes is polled.
    fn maybe_move(&mut self, c: usize) {
        let Some(k) = self.kafka() else {
            return;
        };
        let switch = k.client_switch;
        let alive = self.alive_nodes();
        if alive.is_empty() {
            return;
        }
        let home = self.clients[c].home;
        let next = if self.liveness {
            let i = alive.iter().position(|&n| n > home).unwrap_or(0);
            alive[i]
        } else if self.nodes[home].mesh.is_none() || self.kafka_rng.chance(switch) {
            alive[self.kafka_rng.index(alive.len())]
        } else {
            home
        };
        if next != home {
            self.faults.client_switches += 1;
            self.clients[c].home = next;
        }
    }

    /// The client goes away from node `n`; the mesh is told.
    fn disconnect(
        &mut self,
        c: usize,
        n: usize,
        group: GroupName,
        id: ClientId,
    ) -> Result<(), Violation> {
        self.faults.disconnects += 1;
        self.clients[c].connected[n] = false;
        self.note(n, "client-gone", [c as u64, 0, 0, 0]);
        self.input(
            n,
            Input::ClientGone {
                group: group.clone(),
                client: id.clone(),
            },
        )?;
        let t = self.core_now(n);
        self.check(n).client_gone(t, &group, &id);
        self.drain(n)
    }

    /// The client polls node `n` for up to its most (during faults, a number drawn below
    /// it).
    fn poll(
        &mut self,
        c: usize,
        n: usize,
        group: GroupName,
        id: ClientId,
        opts: &ClientOptions,
    ) -> Result<(), Violation> {
        let max = if self.liveness {
            opts.poll_max.max(1)
        } else {
            self.client_rng.range(0, u64::from(opts.poll_max)) as u32
        };
        self.note(n, "poll", [c as u64, u64::from(max), 0, 0]);
        let r = self.input(
            n,
            Input::ClientPoll {
                group: group.clone(),
                client: id.clone(),
                max,
            },
        )?;
        self.check(n)
            .client_poll(&group, &id, max, r == Some(Response::Ok));
        self.drain(n)
    }

    /// During faults, after a poll of node `n`: a stale ACK of an id the client once held
    /// (from whichever instance), a bogus ACK of an id never issued, and a `FlushNow`, each
    /// as drawn from the seed.
    fn misbehave(&mut self, c: usize, n: usize, opts: &ClientOptions) -> Result<(), Violation> {
        if self.client_rng.chance(opts.stale_ack) {
            if let Some(old) = self.clients[c].past_id(&mut self.client_rng) {
                self.faults.stale_acks += 1;
                self.settle(c, n, vec![old], SettleKind::Ack)?;
            }
        }
        if self.client_rng.chance(opts.bogus_ack) {
            self.faults.bogus_acks += 1;
            let epoch = self.nodes[n].mesh.as_ref().map_or(1, Mesh::epoch);
            let bogus = DeliveryId {
                epoch: epoch + self.client_rng.below(2) as u32,
                lease: self.client_rng.range(0, 40),
                partition: self.client_rng.below(4) as u32,
                offset: self.client_rng.range(0, 300),
                attempt: self.client_rng.range(0, 6) as u32,
            };
            self.settle(c, n, vec![bogus], SettleKind::Ack)?;
        }
        if self.client_rng.chance(self.opt.faults.flush_now) {
            self.faults.flush_nows += 1;
            self.input(n, Input::FlushNow)?;
            self.drain(n)?;
        }
        Ok(())
    }

    /// `Ev::ClientSettle`: a client settles a delivery of node `n` as it planned when it
    /// got it.
    pub(super) fn on_client_settle(
        &mut self,
        c: usize,
        n: usize,
        id: DeliveryId,
        kind: SettleKind,
    ) -> Result<(), Violation> {
        if matches!(kind, SettleKind::Ack | SettleKind::Nack(_)) {
            self.clients[c].held.remove(&(n, id));
        }
        self.settle(c, n, vec![id], kind)
    }

    /// Sends one settle to node `n`'s mesh and has its answer checked.
    fn settle(
        &mut self,
        c: usize,
        n: usize,
        ids: Vec<DeliveryId>,
        kind: SettleKind,
    ) -> Result<(), Violation> {
        if self.nodes[n].mesh.is_none() {
            return Ok(());
        }
        let group = self.groups[self.clients[c].group].name.clone();
        let (what, first) = match kind {
            SettleKind::Ack => ("ack", ids[0]),
            SettleKind::Nack(_) => ("nack", ids[0]),
            SettleKind::Extend(_) => ("extend", ids[0]),
        };
        self.note(
            n,
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
        let Some(response) = self.input(n, input)? else {
            return Ok(());
        };
        let t = self.core_now(n);
        if let Response::Settled(v) = &response {
            let code = match v.first() {
                Some(Settle::Accepted) => 0,
                Some(Settle::Rejected(r)) => 1 + *r as u64,
                None => 9,
            };
            self.note(n, "settled", [code, 0, 0, 0]);
        }
        self.check(n).settled(t, &group, kind, &ids, &response)?;
        self.drain(n)
    }

    /// The index of `id` among the clients of group `g`.
    pub(super) fn client_index(&self, g: usize, id: &ClientId) -> Option<usize> {
        self.clients
            .iter()
            .position(|c| c.group == g && c.id == *id)
    }
}
