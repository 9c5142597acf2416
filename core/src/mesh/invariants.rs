//! The invariant check: C3, C7, C8 and the internal consistency of every structure. Each
//! structure checks itself (`TimerTable::check`, `Group::check`, `LaneTable::check`,
//! `Lane::check`, `AckDeadlines::check`, `Clients::check`); this module ties them together
//! and holds what one structure tells another's check to expect.

use std::collections::{BTreeMap, BTreeSet};

use super::timers::Timer;
use super::Mesh;
use crate::slots::{ClientSlot, DeliverySeq};
use crate::types::{Millis, Offset, Partition};

/// What a group's lanes say the group's other structures must hold: gathered by
/// `Lane::check`, compared by `AckDeadlines::check` and `Clients::check`.
#[derive(Debug, Default)]
pub(crate) struct Expected {
    /// How many deliveries each client holds.
    pub held: BTreeMap<ClientSlot, usize>,
    /// The live ACK FIFO entries: seq -> (deadline, partition, offset).
    pub fifo: BTreeMap<DeliverySeq, (Millis, Partition, Offset)>,
    /// The moved ACK deadlines: (deadline, partition, offset).
    pub moved: BTreeSet<(Millis, Partition, Offset)>,
}

impl Mesh {
    /// Checks C3, C7, C8 and the internal consistency of every structure. O(state): for
    /// tests, the simulation and debug builds. Changes nothing.
    pub fn check_invariants(&self) -> Result<(), String> {
        let config = &self.cx.config;
        let timers = &self.cx.timers;
        timers.check()?;
        // The timers the state says are armed; each structure checks the deadlines of its
        // own where the state constrains them.
        let mut armed: BTreeSet<Timer> = BTreeSet::new();
        if timers.due(Timer::Flush).is_some() {
            armed.insert(Timer::Flush);
        }
        for (name, g) in self.groups.ids() {
            let group = self
                .groups
                .get(g)
                .ok_or_else(|| format!("group {name} has an empty slot"))?;
            group.check(config, timers, &mut armed)?;
        }
        let in_table: BTreeSet<Timer> = timers.iter().map(|(_, t)| t).collect();
        if armed != in_table {
            return Err(format!(
                "timer table disagrees with state: {} live, {} in table",
                armed.len(),
                timers.len()
            ));
        }
        self.persistence.check(config)
    }
}
