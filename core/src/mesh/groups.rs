//! The group table (slots reused, names unique) and the inputs that create, change and
//! remove groups.

use std::collections::BTreeMap;

use super::Mesh;
use crate::config::SubscriptionSpec;
use crate::group::Group;
use crate::io::{Refusal, Response};
use crate::slots::{Generation, GroupSlot, Lease};
use crate::types::GroupName;

/// The groups by slot, with a free list and a name index. Invariant: `ids` maps exactly
/// the names of the groups held, each to its slot; `free` holds exactly the empty slots.
pub(super) struct GroupTable {
    slots: Vec<Option<Group>>,
    free: Vec<GroupSlot>,
    ids: BTreeMap<GroupName, GroupSlot>,
    /// The generation the next group gets.
    next_generation: Generation,
}

impl Default for GroupTable {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            ids: BTreeMap::new(),
            next_generation: Generation::FIRST,
        }
    }
}

impl GroupTable {
    /// Adds a group; leases below `lease_floor` were never its own.
    pub fn add(&mut self, spec: SubscriptionSpec, lease_floor: Lease) -> GroupSlot {
        let generation = self.next_generation.take_next();
        let name = spec.group.clone();
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.slots.push(None);
                GroupSlot::at(self.slots.len() - 1)
            }
        };
        self.slots[slot.index()] = Some(Group::new(slot, generation, spec, lease_floor));
        self.ids.insert(name, slot);
        slot
    }

    /// Takes a group out; its slot is free for the next one.
    pub fn remove(&mut self, name: &GroupName) -> Option<Group> {
        let slot = self.ids.remove(name)?;
        let group = self.slots.get_mut(slot.index())?.take();
        debug_assert!(group.is_some(), "a named slot holds its group");
        self.free.push(slot);
        group
    }

    pub fn slot_of(&self, name: &GroupName) -> Option<GroupSlot> {
        self.ids.get(name).copied()
    }

    pub fn get(&self, slot: GroupSlot) -> Option<&Group> {
        self.slots.get(slot.index()).and_then(Option::as_ref)
    }

    pub fn get_mut(&mut self, slot: GroupSlot) -> Option<&mut Group> {
        self.slots.get_mut(slot.index()).and_then(Option::as_mut)
    }

    pub fn named(&self, name: &GroupName) -> Option<&Group> {
        self.get(self.slot_of(name)?)
    }

    pub fn named_mut(&mut self, name: &GroupName) -> Option<&mut Group> {
        self.get_mut(self.slot_of(name)?)
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Names and slots, by name.
    pub fn ids(&self) -> impl Iterator<Item = (&GroupName, GroupSlot)> + '_ {
        self.ids.iter().map(|(n, &s)| (n, s))
    }

    /// The groups held, by slot.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Group> + '_ {
        self.slots.iter_mut().flatten()
    }
}

impl Mesh {
    /// Whether `Input::Subscribe(spec)` would be accepted now, without changing anything,
    /// so the shell can refuse before it does work of its own (creating the topic).
    pub fn check_subscribe(&self, spec: &SubscriptionSpec) -> Result<(), Refusal> {
        self.judge_subscribe(spec).map(|_| ())
    }

    /// `check_subscribe`, answering the slot of the group when it exists already.
    fn judge_subscribe(&self, spec: &SubscriptionSpec) -> Result<Option<GroupSlot>, Refusal> {
        spec.validate(&self.cx.config.limits)
            .map_err(Refusal::InvalidSpec)?;
        match self.groups.slot_of(&spec.group) {
            Some(g) => {
                let current = self.groups.get(g).ok_or(Refusal::UnknownGroup)?.spec();
                if current.topic != spec.topic {
                    return Err(Refusal::TopicCannotChange {
                        topic: current.topic.clone(),
                    });
                }
                if current.ordering != spec.ordering {
                    return Err(Refusal::OrderingCannotChange);
                }
                Ok(Some(g))
            }
            None if self.groups.len() >= self.cx.config.max_groups => Err(Refusal::TooManyGroups {
                max: self.cx.config.max_groups,
            }),
            None => Ok(None),
        }
    }

    pub(super) fn subscribe(&mut self, spec: SubscriptionSpec) -> Response {
        let existing = match self.judge_subscribe(&spec) {
            Ok(existing) => existing,
            Err(r) => return Response::Refused(r),
        };
        let g = match existing {
            Some(g) => {
                let Some(group) = self.groups.get_mut(g) else {
                    return Response::Refused(Refusal::UnknownGroup);
                };
                group.respec(&mut self.cx, spec);
                g
            }
            None => self.groups.add(spec, self.cx.next_lease),
        };
        self.persistence.subscription_changed(g);
        Response::Ok
    }

    pub(super) fn unsubscribe(&mut self, name: &GroupName) -> Response {
        let Some(mut group) = self.groups.remove(name) else {
            return Response::Refused(Refusal::UnknownGroup);
        };
        let g = group.slot();
        group.shut_down(&mut self.cx);
        self.persistence.group_removed(g, name.clone());
        self.cx.forget_group(g);
        self.recovered.retain(|(gn, _), _| gn != name);
        self.cx.stats.removed_group_totals.absorb(group.stats());
        Response::Ok
    }
}
