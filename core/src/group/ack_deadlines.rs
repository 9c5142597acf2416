//! The ACK deadlines of a group's deliveries and the group's one `Acks` timer.

use std::collections::{BTreeSet, VecDeque};

use super::settle::End;
use super::Group;
use crate::lane::{InFlight, LaneTable};
use crate::mesh::timers::{Timer, TimerTable};
use crate::mesh::{Ctx, Expected};
use crate::slots::{ClientSlot, DeliverySeq, GroupSlot};
use crate::types::{Millis, Offset, Partition};

/// Dead FIFO entries tolerated beyond one per live one before compaction.
const ACK_SLACK: usize = 64;

/// One delivery's ACK deadline, queued in delivery order. It is live while the record is
/// still in flight under this delivery (`seq`) and its deadline was not moved since.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct AckDue {
    deadline: Millis,
    partition: Partition,
    offset: Offset,
    seq: DeliverySeq,
}

/// The ACK deadlines of a group's deliveries. Deliveries get `now + ack_timeout`, which
/// only grows while the timeout stays the same, so the deadlines go into a FIFO in delivery
/// order and an ACK just leaves its entry behind (dead, skipped when it reaches the front);
/// the few deadlines out of that order (an extension, a lowered timeout) go into `moved`.
/// The timer table holds one `Acks` timer per group at the earliest of both fronts, so
/// delivering and ACKing touch no shared ordered structure. Dead FIFO entries are dropped
/// when the timer fires and by compaction once they outnumber live ones + `ACK_SLACK`:
/// the FIFO holds at most twice the deliveries in flight + `ACK_SLACK` + 1.
#[derive(Clone, Debug)]
pub(super) struct AckDeadlines {
    /// The group's `Acks` timer.
    timer: Timer,
    fifo: VecDeque<AckDue>,
    /// Deliveries whose deadline is not in FIFO order: (deadline, partition, offset).
    moved: BTreeSet<(Millis, Partition, Offset)>,
    /// How many FIFO entries are live.
    live: usize,
}

impl AckDeadlines {
    pub fn new(group: GroupSlot) -> Self {
        Self {
            timer: Timer::Acks { group },
            fifo: VecDeque::new(),
            moved: BTreeSet::new(),
            live: 0,
        }
    }

    /// The earliest deadline held, live or not: when the group's timer is due.
    #[inline]
    fn next_due(&self) -> Option<Millis> {
        let fifo = self.fifo.front().map(|d| d.deadline);
        let moved = self.moved.first().map(|&(t, _, _)| t);
        match (fifo, moved) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether a delivery due at `deadline` would break the FIFO's order (the ACK timeout
    /// was lowered): it then goes to the moved set.
    #[inline]
    pub fn out_of_order(&self, deadline: Millis) -> bool {
        self.fifo.back().is_some_and(|d| d.deadline > deadline)
    }

    /// A new delivery, `moved` if its deadline is `out_of_order`.
    #[inline]
    pub fn add(&mut self, partition: Partition, offset: Offset, f: InFlight) {
        debug_assert_eq!(f.moved, self.out_of_order(f.deadline));
        if f.moved {
            self.moved.insert((f.deadline, partition, offset));
        } else {
            self.fifo.push_back(AckDue {
                deadline: f.deadline,
                partition,
                offset,
                seq: f.seq,
            });
            self.live += 1;
        }
    }

    /// A delivery stops being in flight under its deadline: its FIFO entry stops counting
    /// as live, or its moved deadline goes. A dead entry at the back, or at the front with
    /// an equal deadline behind it, is dropped at once (the timer's deadline stays the
    /// same): with ACKs in delivery order the FIFO then needs no compaction.
    #[inline]
    pub fn forget(
        &mut self,
        timers: &mut TimerTable,
        partition: Partition,
        offset: Offset,
        f: InFlight,
    ) {
        if f.moved {
            self.moved.remove(&(f.deadline, partition, offset));
            self.rearm(timers);
            return;
        }
        self.live -= 1;
        let fifo = &mut self.fifo;
        if fifo.len() >= 2 && fifo.back().is_some_and(|d| d.seq == f.seq) {
            fifo.pop_back();
        } else if fifo.front().is_some_and(|d| d.seq == f.seq)
            && fifo.get(1).is_some_and(|d| d.deadline == f.deadline)
        {
            fifo.pop_front();
        }
    }

    /// A delivery's deadline moves to `to` (an extension): out of delivery order from now
    /// on, so the moved set holds it. `f` is the delivery as it was.
    pub fn move_to(
        &mut self,
        timers: &mut TimerTable,
        partition: Partition,
        offset: Offset,
        f: InFlight,
        to: Millis,
    ) {
        self.forget(timers, partition, offset, f);
        self.moved.insert((to, partition, offset));
        self.rearm(timers);
    }

    /// Keeps the group's one `Acks` timer at its earliest deadline.
    #[inline]
    pub fn rearm(&self, timers: &mut TimerTable) {
        let want = self.next_due();
        if want != timers.due(self.timer) {
            match want {
                Some(t) => timers.set(self.timer, t),
                None => timers.stop(self.timer),
            }
        }
    }

    /// Drops dead FIFO entries once they outnumber the live ones + `ACK_SLACK` (amortised
    /// O(1) per delivery), so the FIFO stays within twice the deliveries in flight.
    #[inline]
    pub fn compact(&mut self, lanes: &LaneTable) {
        if self.fifo.len() > 2 * self.live + ACK_SLACK {
            self.fifo.retain(|d| d.is_live(lanes));
            debug_assert_eq!(self.fifo.len(), self.live);
        }
    }

    /// Takes the deliveries due at `at` (the group's timer, its earliest deadline) off the
    /// FIFO and the moved set, dropping dead FIFO entries met on the way, in (partition,
    /// offset) order. The FIFO is left with a live front, so the next timer is a real
    /// deadline.
    fn take_due(&mut self, at: Millis, lanes: &LaneTable) -> Vec<(Partition, Offset)> {
        let mut due = Vec::new();
        while let Some(d) = self.fifo.front() {
            if d.is_live(lanes) {
                if d.deadline > at {
                    break;
                }
                due.push((d.partition, d.offset));
            }
            self.fifo.pop_front();
        }
        while let Some(&(t, p, o)) = self.moved.first() {
            if t > at {
                break;
            }
            self.moved.pop_first();
            due.push((p, o));
        }
        due.sort_unstable();
        due
    }

    /// The FIFO's live entries are exactly the in-flight deliveries not moved (`want`), in
    /// deadline order; the moved set is exact; one timer at the earliest deadline.
    pub fn check(
        &self,
        name: &str,
        want: &mut Expected,
        cap: usize,
        timers: &TimerTable,
        armed: &mut BTreeSet<Timer>,
    ) -> Result<(), String> {
        let mut live = 0;
        let mut prev = 0;
        for d in &self.fifo {
            if d.deadline < prev {
                return Err(format!("{name}: ACK FIFO out of deadline order"));
            }
            prev = d.deadline;
            if want.fifo.get(&d.seq) == Some(&(d.deadline, d.partition, d.offset)) {
                want.fifo.remove(&d.seq);
                live += 1;
            }
        }
        if !want.fifo.is_empty() {
            return Err(format!(
                "{name}: {} deliveries have no ACK deadline",
                want.fifo.len()
            ));
        }
        if live != self.live {
            return Err(format!(
                "{name}: ACK FIFO counts {} live, {live} are",
                self.live
            ));
        }
        if self.moved != want.moved {
            return Err(format!("{name}: moved ACK deadlines disagree with state"));
        }
        // C8: the FIFO holds at most twice the records the group can hold + the slack + the
        // push before compaction.
        if self.fifo.len() > 2 * cap + ACK_SLACK + 1 {
            return Err(format!("{name}: C8 ACK FIFO holds {}", self.fifo.len()));
        }
        let due = timers.due(self.timer);
        if due != self.next_due() {
            return Err(format!("{name}: ACK timer not at the earliest deadline"));
        }
        if due.is_some() {
            armed.insert(self.timer);
        }
        Ok(())
    }
}

impl AckDue {
    /// The delivery is still in flight with this deadline.
    #[inline]
    fn is_live(&self, lanes: &LaneTable) -> bool {
        lanes
            .in_flight(self.partition, self.offset)
            .is_some_and(|f| f.seq == self.seq && !f.moved)
    }
}

impl Group {
    /// The group's `Acks` timer fired at `at`: deliveries due then are redelivered (or
    /// dead-lettered), in (partition, offset) order.
    pub fn expire_acks(&mut self, cx: &mut Ctx, at: Millis) {
        for (partition, offset) in self.acks.take_due(at, &self.lanes) {
            self.stats.expired += 1;
            self.end_delivery(cx, partition, offset, End::Timeout, None);
        }
        self.acks.rearm(&mut cx.timers);
    }

    /// The deliveries a client holds, in (partition, offset) order: every in-flight
    /// delivery has a live entry in the ACK FIFO or is in the moved set. O(deadlines held).
    pub(super) fn held_by(&self, slot: ClientSlot) -> Vec<(Partition, Offset)> {
        let lanes = &self.lanes;
        let holder = |p: Partition, o: Offset| lanes.in_flight(p, o).map(|f| f.client);
        let mut held: Vec<(Partition, Offset)> = self
            .acks
            .fifo
            .iter()
            .filter(|d| d.is_live(lanes) && holder(d.partition, d.offset) == Some(slot))
            .map(|d| (d.partition, d.offset))
            .collect();
        held.extend(
            self.acks
                .moved
                .iter()
                .filter(|&&(_, p, o)| holder(p, o) == Some(slot))
                .map(|&(_, p, o)| (p, o)),
        );
        held.sort_unstable();
        held
    }
}
