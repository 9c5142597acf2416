//! Persists: what goes into the next one, the tickets outstanding, and what becomes
//! durable (or must be written again) when the shell answers.

use std::collections::{BTreeMap, BTreeSet};

use super::timers::Timer;
use super::{Ctx, Mesh};
use crate::config::MeshConfig;
use crate::io::{Effect, PersistBatch, Response, Ticket};
use crate::slots::{Generation, GroupSlot, Lease};
use crate::types::{GroupName, Offset, Partition};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EpochState {
    Unsaved,
    Saving(Ticket),
    Durable,
}

/// One incarnation of a group: a slot reused by a later group is not it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct GroupRef {
    slot: GroupSlot,
    generation: Generation,
}

/// One lane's state as a persist wrote it.
#[derive(Clone, Copy, Debug)]
struct CarriedLane {
    group: GroupRef,
    partition: Partition,
    lease: Lease,
    /// The watermark written: durable, and committed to the broker, once the persist is.
    watermark: Offset,
}

/// What one outstanding persist carried, to apply when it is reported durable or failed.
#[derive(Clone, Debug, Default)]
struct Carried {
    epoch: bool,
    lanes: Vec<CarriedLane>,
    subscriptions: Vec<GroupRef>,
    removed_groups: Vec<GroupName>,
}

/// The mesh's side of the persist protocol. Dirty lanes are listed in the `Ctx`; the rest
/// of what is pending is here. At most `max_outstanding_persists` tickets are out at once:
/// a flush beyond that is `blocked` and runs again when a ticket is answered.
pub(super) struct Persistence {
    epoch: EpochState,
    tickets: BTreeMap<Ticket, Carried>,
    blocked: bool,
    dirty_subscriptions: BTreeSet<GroupSlot>,
    removed_groups: Vec<GroupName>,
}

impl Default for Persistence {
    fn default() -> Self {
        Self {
            epoch: EpochState::Unsaved,
            tickets: BTreeMap::new(),
            blocked: false,
            dirty_subscriptions: BTreeSet::new(),
            removed_groups: Vec::new(),
        }
    }
}

impl Persistence {
    /// A group's definition changed (or is new): the next persist writes it.
    pub fn subscription_changed(&mut self, g: GroupSlot) {
        self.dirty_subscriptions.insert(g);
    }

    /// A group is gone: the next persist deletes what the store holds of it.
    pub fn group_removed(&mut self, g: GroupSlot, name: GroupName) {
        self.dirty_subscriptions.remove(&g);
        self.removed_groups.push(name);
    }

    /// Something waits for a persist to carry it.
    fn pending(&self, cx: &Ctx) -> bool {
        cx.has_dirty_lanes()
            || !self.dirty_subscriptions.is_empty()
            || !self.removed_groups.is_empty()
            || self.epoch == EpochState::Unsaved
    }

    /// Arms the flush timer if something is pending and no flush is armed or blocked.
    pub fn arm_flush(&self, cx: &mut Ctx) {
        let pending = self.pending(cx);
        if pending && cx.timers.due(Timer::Flush).is_none() && !self.blocked {
            let at = cx.now + cx.config.flush_interval_ms;
            cx.timers.set(Timer::Flush, at);
        }
    }

    pub fn outstanding(&self) -> usize {
        self.tickets.len()
    }

    pub fn check(&self, config: &MeshConfig) -> Result<(), String> {
        if self.tickets.len() > config.max_outstanding_persists {
            return Err("more persists outstanding than allowed".into());
        }
        Ok(())
    }
}

impl Mesh {
    /// Hands everything pending to one persist, unless too many are outstanding.
    pub(super) fn flush(&mut self) {
        self.cx.timers.stop(Timer::Flush);
        let state = &mut self.persistence;
        if state.tickets.len() >= self.cx.config.max_outstanding_persists {
            state.blocked = true;
            return;
        }
        state.blocked = false;
        let ticket = self.cx.next_ticket;
        let mut carried = Carried::default();
        let mut batch = PersistBatch::default();
        if state.epoch == EpochState::Unsaved {
            batch.epoch = Some(self.cx.epoch);
            carried.epoch = true;
            state.epoch = EpochState::Saving(ticket);
        }
        batch.removed_groups = std::mem::take(&mut state.removed_groups);
        carried.removed_groups = batch.removed_groups.clone();
        for g in std::mem::take(&mut state.dirty_subscriptions) {
            if let Some(group) = self.groups.get(g) {
                batch.subscriptions.push(group.spec().clone());
                carried.subscriptions.push(GroupRef {
                    slot: g,
                    generation: group.generation(),
                });
            }
        }
        for (g, p) in self.cx.take_dirty_lanes() {
            let Some(group) = self.groups.get_mut(g) else {
                continue;
            };
            let Some(written) = group.write_lane(p, &mut batch, ticket) else {
                continue;
            };
            let at = GroupRef {
                slot: g,
                generation: group.generation(),
            };
            // A checkpoint never becomes durable without its group's definition: an
            // earlier persist that carried the definition may have failed.
            if written.persistent && !group.spec_durable() && !carried.subscriptions.contains(&at) {
                batch.subscriptions.push(group.spec().clone());
                carried.subscriptions.push(at);
            }
            carried.lanes.push(CarriedLane {
                group: at,
                partition: p,
                lease: written.lease,
                watermark: written.watermark,
            });
        }
        if batch.is_empty() {
            return;
        }
        self.cx.next_ticket += 1;
        self.cx.stats.persists += 1;
        self.persistence.tickets.insert(ticket, carried);
        self.cx.effects.push_back(Effect::Persist {
            ticket,
            batch: Box::new(batch),
        });
    }

    pub(super) fn persisted(&mut self, ticket: Ticket) -> Response {
        let state = &mut self.persistence;
        let Some(carried) = state.tickets.remove(&ticket) else {
            self.cx.stats.unknown_tickets += 1;
            return Response::Ok;
        };
        if carried.epoch && state.epoch == EpochState::Saving(ticket) {
            state.epoch = EpochState::Durable;
            self.cx.dispatch_enabled = true;
            for group in self.groups.iter_mut() {
                self.cx.touch_group(group);
            }
        }
        for at in &carried.subscriptions {
            if let Some(group) = self.groups.get_mut(at.slot) {
                if group.generation() == at.generation {
                    group.set_spec_durable();
                }
            }
        }
        for lane in carried.lanes {
            let Some(group) = self.groups.get_mut(lane.group.slot) else {
                continue;
            };
            if group.generation() == lane.group.generation {
                group.lane_persisted(
                    &mut self.cx,
                    lane.partition,
                    lane.lease,
                    ticket,
                    lane.watermark,
                );
            }
        }
        if self.persistence.blocked {
            self.flush();
        }
        Response::Ok
    }

    pub(super) fn persist_failed(&mut self, ticket: Ticket) -> Response {
        let state = &mut self.persistence;
        let Some(carried) = state.tickets.remove(&ticket) else {
            self.cx.stats.unknown_tickets += 1;
            return Response::Ok;
        };
        self.cx.stats.persist_failures += 1;
        if carried.epoch && state.epoch == EpochState::Saving(ticket) {
            state.epoch = EpochState::Unsaved;
        }
        for lane in carried.lanes {
            let Some(group) = self.groups.get_mut(lane.group.slot) else {
                continue;
            };
            if group.generation() == lane.group.generation {
                group.lane_persist_failed(&mut self.cx, lane.partition, lane.lease);
            }
        }
        for at in carried.subscriptions {
            if let Some(group) = self.groups.get(at.slot) {
                if group.generation() == at.generation {
                    state.dirty_subscriptions.insert(at.slot);
                }
            }
        }
        for name in carried.removed_groups {
            if self.groups.slot_of(&name).is_none() {
                state.removed_groups.push(name);
            }
        }
        // Retry after a pause rather than at once: the store is failing.
        let at = self.cx.now + self.cx.config.fetch_retry_ms.max(1);
        self.cx.timers.set(Timer::Flush, at);
        state.blocked = false;
        Response::Ok
    }

    /// The persists handed out and not yet answered.
    pub fn outstanding_persists(&self) -> usize {
        self.persistence.outstanding()
    }

    /// Something waits for a persist to carry it (after a `FlushNow`: the outstanding
    /// persists were at `max_outstanding_persists`, and the next one carries it).
    pub fn flush_pending(&self) -> bool {
        self.persistence.pending(&self.cx)
    }

    /// The newest persist handed out and not yet answered. Persists are answered in
    /// order by the shell, so once it is durable, so is everything handed out before it.
    pub fn newest_outstanding_ticket(&self) -> Option<Ticket> {
        self.persistence.tickets.keys().next_back().copied()
    }

    /// Something of these partitions of `group` is not durable yet: a lane is dirty (an
    /// ACK since the last persist), or the newest persist that carried it was not answered
    /// durable. The shell flushes a revocation until this is false
    /// (`Input::PartitionsRevoking`). False for an unknown group.
    pub fn revoke_pending(&self, group: &GroupName, partitions: &[Partition]) -> bool {
        self.groups
            .named(group)
            .is_some_and(|g| g.unsaved(partitions))
    }
}
