//! A group's live clients: their credit, what they hold, which can take a delivery now,
//! and when an idle one is forgotten.

use std::collections::{BTreeMap, BTreeSet};

use super::settle::End;
use super::Group;
use crate::io::{Refusal, Response};
use crate::mesh::timers::{Timer, TimerTable};
use crate::mesh::{ClientView, Ctx};
use crate::slots::{ClientSlot, GroupSlot};
use crate::types::{ClientId, Millis};

#[derive(Clone, Debug)]
struct Client {
    id: ClientId,
    /// How many more deliveries the client asked for.
    credit: u32,
    /// Deliveries it holds. Which ones is found from the group's ACK deadlines when it
    /// leaves (rare), so a departure hands them back at once instead of waiting for their
    /// ACK timeouts (upstream #5282) without an index updated on every delivery.
    in_flight: u32,
    last_active_ms: Millis,
    /// When the client will be forgotten if it stays without credit and deliveries; `None`
    /// while it has either. Its `ClientIdle` timer is due at or before this: the timer is
    /// armed once and left alone while the client goes busy and idle again (every cycle
    /// for a client taking one record at a time); when it fires early it moves here.
    idle_at: Option<Millis>,
    /// It is in `Clients::ready`.
    listed: bool,
    /// The group's `max_in_flight_per_client` when it last received a delivery. Lowering
    /// the limit revokes nothing: the client may hold up to this until it ACKs down.
    limit_at_delivery: u32,
}

/// The clients of one group, by slot. Invariants: `ids` maps exactly the clients held;
/// `ready` holds exactly the clients with credit and room under the in-flight limit, each
/// as (in_flight, slot) and with `listed` set.
#[derive(Clone, Debug)]
pub(super) struct Clients {
    group: GroupSlot,
    slots: Vec<Option<Client>>,
    free: Vec<ClientSlot>,
    ids: BTreeMap<ClientId, ClientSlot>,
    /// Clients that can take a delivery now, least loaded first: (in_flight, slot).
    ready: BTreeSet<(u32, ClientSlot)>,
}

impl Clients {
    pub fn new(group: GroupSlot) -> Self {
        Self {
            group,
            slots: Vec::new(),
            free: Vec::new(),
            ids: BTreeMap::new(),
            ready: BTreeSet::new(),
        }
    }

    #[inline]
    fn idle_timer(&self, client: ClientSlot) -> Timer {
        Timer::ClientIdle {
            group: self.group,
            client,
        }
    }

    /// The client that should get the next delivery: the least loaded that can take one.
    #[inline]
    pub fn first_ready(&self) -> Option<ClientSlot> {
        self.ready.first().map(|&(_, slot)| slot)
    }

    /// The slot of `id`, registering it (without credit) if it is new.
    #[inline]
    fn register(
        &mut self,
        id: ClientId,
        now: Millis,
        max_clients: usize,
    ) -> Result<ClientSlot, Refusal> {
        if let Some(&slot) = self.ids.get(&id) {
            return Ok(slot);
        }
        if self.ids.len() >= max_clients {
            return Err(Refusal::TooManyClients { max: max_clients });
        }
        let c = Client {
            id: id.clone(),
            credit: 0,
            in_flight: 0,
            last_active_ms: now,
            listed: false,
            idle_at: None,
            limit_at_delivery: 0,
        };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot.index()] = Some(c);
                slot
            }
            None => {
                self.slots.push(Some(c));
                ClientSlot::at(self.slots.len() - 1)
            }
        };
        self.ids.insert(id, slot);
        Ok(slot)
    }

    /// Changes a client and keeps `ready` exact, touching the set only when the client's
    /// place in it changes.
    #[inline]
    fn update<R>(
        &mut self,
        slot: ClientSlot,
        max_in_flight: u32,
        f: impl FnOnce(&mut Client) -> R,
    ) -> Option<R> {
        let c = self.slots.get_mut(slot.index())?.as_mut()?;
        let (was, before) = (c.listed, c.in_flight);
        let r = f(c);
        let ready = c.credit > 0 && c.in_flight < max_in_flight;
        if was && (!ready || c.in_flight != before) {
            self.ready.remove(&(before, slot));
        }
        if ready && (!was || c.in_flight != before) {
            self.ready.insert((c.in_flight, slot));
        }
        c.listed = ready;
        Some(r)
    }

    /// Re-ranks every client under a new in-flight limit.
    pub fn relist_all(&mut self, max_in_flight: u32) {
        for i in 0..self.slots.len() {
            self.update(ClientSlot::at(i), max_in_flight, |_| ());
        }
    }

    /// A client received a delivery: one less credit, one more held. Returns its id.
    #[inline]
    pub fn took_delivery(
        &mut self,
        cx: &mut Ctx,
        slot: ClientSlot,
        max_in_flight: u32,
    ) -> Option<ClientId> {
        let id = self.update(slot, max_in_flight, |c| {
            debug_assert!(c.listed, "only a ready client is handed a delivery");
            c.in_flight += 1;
            c.credit -= 1;
            c.limit_at_delivery = max_in_flight;
            c.id.clone()
        })?;
        self.refresh_idle(cx, slot);
        Some(id)
    }

    /// A client gives up a delivery it held (settled, expired, or its lane went).
    #[inline]
    pub fn gave_back(&mut self, cx: &mut Ctx, slot: ClientSlot, max_in_flight: u32) {
        self.update(slot, max_in_flight, |c| {
            c.in_flight = c.in_flight.saturating_sub(1);
        });
        self.refresh_idle(cx, slot);
    }

    /// Sets when a client will be forgotten: only a client with no credit and nothing in
    /// flight can be. Its timer is armed if none is (an armed one is never later: `idle_at`
    /// only grows, as time does) and otherwise left to fire early and move on.
    #[inline]
    fn refresh_idle(&mut self, cx: &mut Ctx, slot: ClientSlot) {
        let timer = self.idle_timer(slot);
        let Some(Some(c)) = self.slots.get_mut(slot.index()) else {
            return;
        };
        if c.credit == 0 && c.in_flight == 0 {
            let t = cx.now.max(c.last_active_ms) + cx.config.client_idle_timeout_ms;
            c.idle_at = Some(t);
            if cx.timers.due(timer).is_none() {
                cx.timers.set(timer, t);
            }
        } else {
            c.idle_at = None;
        }
    }

    /// A client's idle timer fired at `at`: true if it is to be forgotten now; if it was
    /// busy in between and is idle again since, the timer moves to the new deadline.
    fn idle_timer_fired(&self, timers: &mut TimerTable, slot: ClientSlot, at: Millis) -> bool {
        let Some(Some(c)) = self.slots.get(slot.index()) else {
            return false;
        };
        match c.idle_at {
            Some(t) if t <= at => true,
            Some(t) => {
                timers.set(self.idle_timer(slot), t);
                false
            }
            None => false,
        }
    }

    fn holds_any(&self, slot: ClientSlot) -> Option<bool> {
        let c = self.slots.get(slot.index())?.as_ref()?;
        Some(c.in_flight > 0)
    }

    /// Forgets a client (whose deliveries were handed back). False if there was none.
    fn remove(&mut self, timers: &mut TimerTable, slot: ClientSlot) -> bool {
        let Some(Some(c)) = self.slots.get(slot.index()) else {
            return false;
        };
        debug_assert_eq!(
            c.in_flight, 0,
            "a leaving client's deliveries went back first"
        );
        timers.stop(self.idle_timer(slot));
        let id = c.id.clone();
        self.ready.remove(&(c.in_flight, slot));
        self.slots[slot.index()] = None;
        self.ids.remove(&id);
        self.free.push(slot);
        true
    }

    /// Stops every client's idle timer (the group is being removed).
    pub fn stop_timers(&self, timers: &mut TimerTable) {
        for (i, c) in self.slots.iter().enumerate() {
            if c.is_some() {
                timers.stop(self.idle_timer(ClientSlot::at(i)));
            }
        }
    }

    pub fn views(&self) -> Vec<ClientView> {
        self.slots
            .iter()
            .flatten()
            .map(|c| ClientView {
                id: c.id.clone(),
                credit: c.credit,
                in_flight: c.in_flight,
                last_active_ms: c.last_active_ms,
            })
            .collect()
    }

    /// C8 per client, holdings against the lanes (`held`), the ready set, idle timers.
    pub fn check(
        &self,
        name: &str,
        max_in_flight: u32,
        mut held: BTreeMap<ClientSlot, usize>,
        timers: &TimerTable,
        armed: &mut BTreeSet<Timer>,
    ) -> Result<(), String> {
        for (i, c) in self.slots.iter().enumerate() {
            let Some(c) = c else { continue };
            let slot = ClientSlot::at(i);
            // C8: a client never holds more than max_in_flight (the one in force when it
            // last received a delivery: lowering the limit revokes nothing).
            if c.in_flight > max_in_flight.max(c.limit_at_delivery) {
                return Err(format!("{name}/{}: C8 {} in flight", c.id, c.in_flight));
            }
            if c.in_flight as usize != held.remove(&slot).unwrap_or(0) {
                return Err(format!("{name}/{}: holdings disagree", c.id));
            }
            let ready = c.credit > 0 && c.in_flight < max_in_flight;
            if self.ready.contains(&(c.in_flight, slot)) != ready || c.listed != ready {
                return Err(format!("{name}/{}: ready-client set disagrees", c.id));
            }
            if c.idle_at.is_some() != (c.credit == 0 && c.in_flight == 0) {
                return Err(format!("{name}/{}: idle state disagrees", c.id));
            }
            let timer = self.idle_timer(slot);
            let due = timers.due(timer);
            if c.idle_at.is_some_and(|t| due.is_none_or(|d| d > t)) {
                return Err(format!("{name}/{}: idle timer missing or late", c.id));
            }
            if due.is_some() {
                armed.insert(timer);
            }
        }
        if !held.is_empty() {
            return Err(format!("{name}: deliveries held by unknown clients"));
        }
        if self.ready.len() > self.ids.len() {
            return Err(format!("{name}: ready-client set too large"));
        }
        Ok(())
    }
}

impl Group {
    /// A client wants up to `max` more deliveries now (registered on first use).
    pub fn client_poll(&mut self, cx: &mut Ctx, client: ClientId, max: u32) -> Response {
        let max_clients = cx.config.max_clients_per_group;
        let slot = match self.clients.register(client, cx.now, max_clients) {
            Ok(slot) => slot,
            Err(r) => return Response::Refused(r),
        };
        let now = cx.now;
        self.clients
            .update(slot, self.spec.max_in_flight_per_client, |c| {
                c.credit = max;
                c.last_active_ms = now;
            });
        self.clients.refresh_idle(cx, slot);
        cx.touch_group(self);
        Response::Ok
    }

    /// A client disconnected or was evicted.
    pub fn client_gone(&mut self, cx: &mut Ctx, client: &ClientId) -> Response {
        if let Some(&slot) = self.clients.ids.get(client) {
            self.remove_client(cx, slot);
        }
        Response::Ok
    }

    /// A client's idle timer fired at `at`.
    pub fn client_idle_due(&mut self, cx: &mut Ctx, slot: ClientSlot, at: Millis) {
        if self.clients.idle_timer_fired(&mut cx.timers, slot, at) {
            self.remove_client(cx, slot);
        }
    }

    /// Forgets a client, handing what it holds back at once.
    fn remove_client(&mut self, cx: &mut Ctx, slot: ClientSlot) {
        let Some(holds_any) = self.clients.holds_any(slot) else {
            return;
        };
        let holding = if holds_any {
            self.held_by(slot)
        } else {
            Vec::new()
        };
        for (p, offset) in holding {
            self.end_delivery(cx, p, offset, End::ClientGone, Some(0));
        }
        if self.clients.remove(&mut cx.timers, slot) {
            cx.touch_group(self);
        }
    }

    /// A client gives up a delivery it held.
    #[inline]
    pub(super) fn unhold(&mut self, cx: &mut Ctx, slot: ClientSlot) {
        let max = self.spec.max_in_flight_per_client;
        self.clients.gave_back(cx, slot, max);
    }
}
