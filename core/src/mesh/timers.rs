//! The timer table: every deadline of the mesh, each kept in one place, and the order in
//! which they fall due; and what the mesh does when one falls due.

use std::collections::{BTreeMap, BTreeSet};

use super::Mesh;
use crate::slots::{ClientSlot, GroupSlot};
use crate::types::{Millis, Offset, Partition};

/// What a deadline is for. Timers due at the same millisecond fire in this order (the
/// derived one: variant, then fields), which the simulation's traces depend on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Timer {
    /// The earliest ACK deadline of a group (see `AckDeadlines`). It may be due for
    /// deliveries settled since: it then fires, finds nothing due and moves on.
    Acks { group: GroupSlot },
    /// A record's redelivery backoff is over.
    Backoff {
        group: GroupSlot,
        partition: Partition,
        offset: Offset,
    },
    /// A client without credit and deliveries may be forgotten. Armed once and left alone
    /// while the client goes busy and idle again; when it fires early it moves on.
    ClientIdle {
        group: GroupSlot,
        client: ClientSlot,
    },
    /// A failed or contradicted fetch of a lane may be tried again.
    FetchRetry {
        group: GroupSlot,
        partition: Partition,
    },
    /// Pending state is persisted.
    Flush,
}

/// When each armed timer is due. The deadline of a timer lives only here: owners ask the
/// table (`due`) instead of keeping a copy. The index answers "when is this timer due" in
/// O(1) for the timers asked about on every input (the flush, a group's ACKs, an idle
/// client) and O(log n) for the others; `order` sorts the same (deadline, timer) pairs for
/// `next` and `pop_due`. Bounded by the state: a timer is stopped when what it guards ends,
/// except as documented on `Timer`.
#[derive(Clone, Debug, Default)]
pub(crate) struct TimerTable {
    order: BTreeSet<(Millis, Timer)>,
    flush: Option<Millis>,
    /// By group slot.
    acks: Vec<Option<Millis>>,
    /// By group slot, then client slot.
    idle: Vec<Vec<Option<Millis>>>,
    /// `Backoff` and `FetchRetry` timers.
    keyed: BTreeMap<Timer, Millis>,
}

impl TimerTable {
    /// When `timer` is due, if it is armed.
    #[inline]
    pub fn due(&self, timer: Timer) -> Option<Millis> {
        match timer {
            Timer::Acks { group } => self.acks.get(group.index()).copied().flatten(),
            Timer::ClientIdle { group, client } => self
                .idle
                .get(group.index())
                .and_then(|g| g.get(client.index()))
                .copied()
                .flatten(),
            Timer::Backoff { .. } | Timer::FetchRetry { .. } => self.keyed.get(&timer).copied(),
            Timer::Flush => self.flush,
        }
    }

    /// Arms `timer` at `at`, moving it if it was armed.
    pub fn set(&mut self, timer: Timer, at: Millis) {
        if let Some(old) = self.replace(timer, Some(at)) {
            self.order.remove(&(old, timer));
        }
        self.order.insert((at, timer));
    }

    /// Disarms `timer` if it is armed.
    pub fn stop(&mut self, timer: Timer) {
        if let Some(old) = self.replace(timer, None) {
            self.order.remove(&(old, timer));
        }
    }

    /// The earliest deadline and what it is for.
    pub fn next(&self) -> Option<(Millis, Timer)> {
        self.order.first().copied()
    }

    /// Disarms and returns the earliest timer if it is due at `now`.
    pub fn pop_due(&mut self, now: Millis) -> Option<(Millis, Timer)> {
        let &(at, timer) = self.order.first()?;
        if at > now {
            return None;
        }
        self.order.pop_first();
        self.replace(timer, None);
        Some((at, timer))
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Every armed timer, by deadline.
    pub fn iter(&self) -> impl Iterator<Item = (Millis, Timer)> + '_ {
        self.order.iter().copied()
    }

    /// Sets the index entry of `timer`, returning the deadline it held.
    fn replace(&mut self, timer: Timer, at: Option<Millis>) -> Option<Millis> {
        fn grow<T: Clone + Default>(v: &mut Vec<T>, i: usize) -> &mut T {
            if v.len() <= i {
                v.resize(i + 1, T::default());
            }
            &mut v[i]
        }
        let slot = match timer {
            Timer::Acks { group } => grow(&mut self.acks, group.index()),
            Timer::ClientIdle { group, client } => {
                grow(grow(&mut self.idle, group.index()), client.index())
            }
            Timer::Backoff { .. } | Timer::FetchRetry { .. } => {
                return match at {
                    Some(at) => self.keyed.insert(timer, at),
                    None => self.keyed.remove(&timer),
                };
            }
            Timer::Flush => &mut self.flush,
        };
        std::mem::replace(slot, at)
    }

    /// The index and the order hold the same timers.
    pub fn check(&self) -> Result<(), String> {
        let indexed = usize::from(self.flush.is_some())
            + self.acks.iter().flatten().count()
            + self.idle.iter().flatten().flatten().count()
            + self.keyed.len();
        if indexed != self.order.len() {
            return Err(format!(
                "timer table indexes {indexed} timers, orders {}",
                self.order.len()
            ));
        }
        match self.order.iter().find(|&&(at, t)| self.due(t) != Some(at)) {
            Some((at, t)) => Err(format!("timer {t:?} at {at} not indexed there")),
            None => Ok(()),
        }
    }
}

/// What the next timeout is for (`Mesh::poll_timeout_reason`): for traces and metrics.
/// Variants in alphabetical order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeoutReason {
    /// The earliest ACK deadline of a group, possibly of a delivery settled since.
    AckDeadline,
    /// A redelivery backoff ends.
    Backoff,
    /// An idle client may be forgotten (possibly one that was busy in between).
    ClientIdle,
    /// A failed or contradicted fetch is tried again.
    FetchRetry,
    /// Pending state is persisted.
    Flush,
}

impl Timer {
    pub fn reason(self) -> TimeoutReason {
        match self {
            Timer::Acks { .. } => TimeoutReason::AckDeadline,
            Timer::Backoff { .. } => TimeoutReason::Backoff,
            Timer::ClientIdle { .. } => TimeoutReason::ClientIdle,
            Timer::FetchRetry { .. } => TimeoutReason::FetchRetry,
            Timer::Flush => TimeoutReason::Flush,
        }
    }
}

impl Mesh {
    /// Fires every timer due now, earliest first (ties in `Timer` order), each handed to
    /// the structure it guards. A timer armed while firing fires in the same pass if due.
    pub(super) fn fire_timers(&mut self) {
        while let Some((at, timer)) = self.cx.timers.pop_due(self.cx.now) {
            let cx = &mut self.cx;
            match timer {
                Timer::Acks { group } => {
                    if let Some(g) = self.groups.get_mut(group) {
                        g.expire_acks(cx, at);
                    }
                }
                Timer::Backoff {
                    group,
                    partition,
                    offset,
                } => {
                    if let Some(g) = self.groups.get_mut(group) {
                        g.end_backoff(cx, partition, offset);
                    }
                }
                Timer::ClientIdle { group, client } => {
                    if let Some(g) = self.groups.get_mut(group) {
                        g.client_idle_due(cx, client, at);
                    }
                }
                Timer::FetchRetry { group, partition } => {
                    if let Some(g) = self.groups.get_mut(group) {
                        g.retry_fetch(cx, partition);
                    }
                }
                Timer::Flush => self.flush(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn timer(kind: u8, a: u32, b: u32) -> Timer {
        let group = GroupSlot::at(a as usize);
        match kind % 5 {
            0 => Timer::Acks { group },
            1 => Timer::Backoff {
                group,
                partition: b,
                offset: u64::from(a ^ b),
            },
            2 => Timer::ClientIdle {
                group,
                client: ClientSlot::at(b as usize),
            },
            3 => Timer::FetchRetry {
                group,
                partition: b,
            },
            _ => Timer::Flush,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]
        /// Against a map from timer to deadline: the same deadlines, the same order out.
        #[test]
        fn table_agrees_with_a_map(
            ops in prop::collection::vec((0u8..4, 0u8..5, 0u32..3, 0u32..3, 0u64..20), 0..200)
        ) {
            let mut table = TimerTable::default();
            let mut model: BTreeMap<Timer, Millis> = BTreeMap::new();
            for (op, kind, a, b, at) in ops {
                let t = timer(kind, a, b);
                match op {
                    0 | 1 => {
                        table.set(t, at);
                        model.insert(t, at);
                    }
                    2 => {
                        table.stop(t);
                        model.remove(&t);
                    }
                    _ => {
                        let want = model
                            .iter()
                            .map(|(&t, &at)| (at, t))
                            .min()
                            .filter(|&(due, _)| due <= at);
                        if let Some((_, t)) = want {
                            model.remove(&t);
                        }
                        prop_assert_eq!(table.pop_due(at), want);
                    }
                }
                table.check().unwrap();
                prop_assert_eq!(table.len(), model.len());
                prop_assert_eq!(table.due(t), model.get(&t).copied());
                let next = model.iter().map(|(&t, &at)| (at, t)).min();
                prop_assert_eq!(table.next(), next);
            }
        }
    }
}
