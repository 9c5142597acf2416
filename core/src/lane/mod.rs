//! A lane: one group's view of one partition. It owns the fetch cursor, the progress and
//! the records not yet done. Lanes of different groups share nothing, so a slow group never
//! holds back a fast one (C7; the seed shared one cursor per partition: upstream #5294).
//!
//! # Rooms
//! The lane's state and its invariants are here; `entries` and `ready` are its two
//! stores, `intake` what a fetch brings, `records` the life of its records after that,
//! `persist` its part in persists, `table` the group's lanes and which of them have
//! records ready.

mod entries;
mod intake;
mod persist;
mod ready;
mod records;
mod table;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;

pub(crate) use entries::{EntryState, InFlight};
pub(crate) use intake::Arrival;
pub(crate) use persist::WrittenLane;
pub(crate) use records::Retired;
pub(crate) use table::LaneTable;

use crate::checkpoint::Checkpoint;
use crate::config::MeshConfig;
use crate::io::{DeadLetter, DlqKey, FetchId, Ticket, REPLAY_PARTITION};
use crate::mesh::timers::Timer;
use crate::mesh::{Expected, LaneView};
use crate::progress::Progress;
use crate::record::RecordMeta;
use crate::slots::{GroupSlot, Lease};
use crate::types::{Offset, Partition};
use entries::{Entries, Entry};
use ready::Ready;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FetchState {
    Idle,
    Outstanding(FetchId),
    /// Waiting for its `FetchRetry` timer.
    Retrying,
}

/// Records sharing a key: the head is the one in progress, the rest wait in offset order.
#[derive(Clone, Debug)]
struct KeyQueue {
    head: Offset,
    waiting: VecDeque<Offset>,
}

#[derive(Clone, Debug)]
pub(crate) struct Lane {
    group: GroupSlot,
    partition: Partition,
    /// Fresh on every assignment and seek; part of every delivery id.
    lease: Lease,
    /// False for the replay lane, whose progress is not persisted.
    persistent: bool,
    progress: Progress,
    /// The next offset to fetch. Starts at the recovered watermark: restart alignment.
    cursor: Offset,
    /// One past the highest offset handed out in this incarnation (a gauge).
    push_end: Offset,
    entries: Entries,
    /// Entries that can be handed out now: exactly the eligible ones.
    ready: Ready,
    keys: BTreeMap<String, KeyQueue>,
    /// Attempt numbers (>= 2) that may have been issued for not-done offsets.
    ledger: BTreeMap<Offset, u32>,
    /// Entries waiting for their ledger bump to be durable: (ticket needed, offset).
    awaiting_ledger: BTreeSet<(Ticket, Offset)>,
    /// Dead letters decided but not yet durable; every flush of the lane carries them all.
    unsynced_dead_letters: Vec<(Ticket, DeadLetter)>,
    /// DLQ entries whose replay was ACKed, not yet durably deleted, each with the record
    /// replayed (a resolution deletes that record's entry).
    unsynced_resolved: Vec<(Ticket, DlqKey, RecordMeta)>,
    /// POP receipt handles of done records, ACKed to the broker once durable.
    unsynced_broker_acks: Vec<(Ticket, Bytes)>,
    fetch: FetchState,
    /// It is in the `Ctx`'s dirty list.
    dirty: bool,
    /// It is in the `Ctx`'s touched list.
    touched: bool,
    /// The newest ticket that carried this lane and is durable.
    durable_ticket: Ticket,
    /// The newest ticket that carried this lane (durable or not).
    written_ticket: Ticket,
    /// Its partition is being revoked: nothing more is handed out or fetched (see
    /// `Input::PartitionsRevoking`).
    draining: bool,
    /// The watermark in that ticket.
    durable_watermark: Option<Offset>,
    committed: Option<Offset>,
    /// C3: the watermark never goes back but by a broker truncation (`truncate`) or a seek
    /// (a new lane). Where it did, the first time: (from, to); reported by `check`.
    regressed: Option<(Offset, Offset)>,
    paused_for_ranges: bool,
    /// It is in its table's ready-lane set (kept by `LaneTable`).
    listed: bool,
}

impl Lane {
    pub fn new(
        group: GroupSlot,
        partition: Partition,
        lease: Lease,
        persistent: bool,
        checkpoint: Checkpoint,
    ) -> Self {
        let watermark = checkpoint.progress.watermark();
        Self {
            group,
            partition,
            lease,
            persistent,
            cursor: watermark,
            push_end: watermark,
            progress: checkpoint.progress,
            entries: Entries::default(),
            ready: Ready::default(),
            keys: BTreeMap::new(),
            ledger: checkpoint.attempts.into_iter().collect(),
            awaiting_ledger: BTreeSet::new(),
            unsynced_dead_letters: Vec::new(),
            unsynced_resolved: Vec::new(),
            unsynced_broker_acks: Vec::new(),
            fetch: FetchState::Idle,
            dirty: false,
            touched: false,
            durable_ticket: 0,
            written_ticket: 0,
            draining: false,
            durable_watermark: None,
            committed: None,
            regressed: None,
            paused_for_ranges: false,
            listed: false,
        }
    }

    /// The lane that replaces `old` after a seek to `offset`, under a new lease. Decisions
    /// already taken stay: dead letters and broker ACKs still get written.
    pub fn reseeked(old: Lane, lease: Lease, offset: Offset) -> Self {
        let mut lane = Lane::new(
            old.group,
            old.partition,
            lease,
            true,
            Checkpoint::new(offset),
        );
        lane.unsynced_dead_letters = old.unsynced_dead_letters;
        lane.unsynced_resolved = old.unsynced_resolved;
        lane.unsynced_broker_acks = old.unsynced_broker_acks;
        lane.draining = old.draining;
        lane
    }

    /// The lane goes on under a new lease after the broker lost its tail: offsets from the
    /// new end name new records, so their deliveries need ids of their own (an ACK of a
    /// lost record's delivery must not settle the record that reuses its offset:
    /// unimesh-sim, Kafka world, seed 0). The records held keep their attempts, but the new
    /// lease names only attempts issued from now on (seed 6370); deliveries under the old
    /// lease answer `revoked`.
    pub fn relet(&mut self, lease: Lease) {
        self.lease = lease;
        let held: Vec<Offset> = self.entries.offsets_from(0).collect();
        for o in held {
            if let Some(e) = self.entries.get_mut(&o) {
                e.first_here = e.attempts + 1;
            }
        }
    }

    #[inline]
    pub fn group(&self) -> GroupSlot {
        self.group
    }

    #[inline]
    pub fn partition(&self) -> Partition {
        self.partition
    }

    #[inline]
    pub fn lease(&self) -> Lease {
        self.lease
    }

    #[inline]
    pub fn cursor(&self) -> Offset {
        self.cursor
    }

    #[inline]
    pub fn progress(&self) -> &Progress {
        &self.progress
    }

    #[inline]
    pub fn entry(&self, offset: Offset) -> Option<&Entry> {
        self.entries.get(&offset)
    }

    /// The delivery out of `offset` and its attempt number, if it is in flight.
    #[inline]
    pub fn delivery(&self, offset: Offset) -> Option<(InFlight, u32)> {
        let e = self.entries.get(&offset)?;
        Some((e.in_flight()?, e.attempts))
    }

    /// Offsets held at or above `from`, ascending.
    pub fn offsets_from(&self, from: Offset) -> impl Iterator<Item = Offset> + '_ {
        self.entries.offsets_from(from)
    }

    /// Every delivery out, in offset order.
    pub fn deliveries(&self) -> impl Iterator<Item = (Offset, InFlight)> + '_ {
        self.entries
            .iter()
            .filter_map(|(&o, e)| e.in_flight().map(|f| (o, f)))
    }

    /// Its partition is being revoked: it hands out and fetches nothing more (what is in
    /// flight can still be settled). Followed by `LaneTable::sync`.
    pub fn start_draining(&mut self) {
        self.draining = true;
    }

    /// Something of the lane is not durable yet: it is dirty, or the newest persist that
    /// carried it was not answered durable.
    pub fn unsaved(&self) -> bool {
        self.dirty || self.written_ticket > self.durable_ticket
    }

    /// Marks the lane dirty; true if it was not (see `Ctx::dirty`).
    #[inline]
    pub fn set_dirty(&mut self) -> bool {
        !std::mem::replace(&mut self.dirty, true)
    }

    /// Marks the lane touched; true if it was not (see `Ctx::touch_lane`).
    #[inline]
    pub fn set_touched(&mut self) -> bool {
        !std::mem::replace(&mut self.touched, true)
    }

    #[inline]
    pub fn clear_touched(&mut self) {
        self.touched = false;
    }

    /// Memory the lane holds for records, counted against `max_window_per_lane`.
    #[inline]
    pub fn window_used(&self) -> usize {
        self.entries.len()
            + self.unsynced_dead_letters.len()
            + self.unsynced_resolved.len()
            + self.unsynced_broker_acks.len()
    }

    #[inline]
    fn backoff_timer(&self, offset: Offset) -> Timer {
        Timer::Backoff {
            group: self.group,
            partition: self.partition,
            offset,
        }
    }

    /// Puts an entry in the ready set if it can be handed out. Returns true if it was added.
    #[inline]
    fn offer(&mut self, offset: Offset) -> bool {
        match self.entries.get(&offset) {
            Some(e) if e.eligible() => self.ready.insert(offset),
            _ => false,
        }
    }

    /// `offer` for a record just admitted, above every record the lane holds.
    #[inline]
    fn offer_fresh(&mut self, offset: Offset) -> bool {
        match self.entries.get(&offset) {
            Some(e) if e.eligible() => self.ready.push_fresh(offset),
            _ => false,
        }
    }

    /// Lets the next record of a key go, once the head at `offset` is done.
    fn release_key(&mut self, key: &str, offset: Offset) {
        let Some(q) = self.keys.get_mut(key) else {
            return;
        };
        debug_assert_eq!(q.head, offset, "only the head of a key finishes");
        if q.head != offset {
            return;
        }
        match q.waiting.pop_front() {
            Some(next) => {
                q.head = next;
                if let Some(e) = self.entries.get_mut(&next) {
                    e.key_blocked = false;
                }
                self.offer(next);
            }
            None => {
                self.keys.remove(key);
            }
        }
    }

    /// Marks an offset done; the watermark can only rise (C3).
    #[inline]
    fn mark_done(&mut self, offset: Offset) {
        let before = self.progress.watermark();
        self.progress.mark_done(offset);
        self.note_watermark(before);
    }

    /// Marks `[start, end)` done; the watermark can only rise (C3).
    #[inline]
    fn mark_done_span(&mut self, start: Offset, end: Offset) {
        let before = self.progress.watermark();
        self.progress.mark_done_span(start, end);
        self.note_watermark(before);
    }

    /// Pairs with every change of progress but a truncation: C3 says the watermark did not
    /// go back from `before`. A regression is kept for `check` to report.
    #[inline]
    fn note_watermark(&mut self, before: Offset) {
        let after = self.progress.watermark();
        if after < before && self.regressed.is_none() {
            self.regressed = Some((before, after));
        }
    }

    pub fn view(&self) -> LaneView {
        let count =
            |f: fn(&EntryState) -> bool| self.entries.values().filter(|e| f(&e.state)).count();
        LaneView {
            partition: self.partition,
            lease: self.lease.get(),
            cursor: self.cursor,
            push_end: self.push_end,
            watermark: self.progress.watermark(),
            durable_watermark: self.durable_watermark,
            ack_ranges: self.progress.ranges().collect(),
            in_flight: count(|s| matches!(s, EntryState::InFlight(_))),
            queued: count(|s| *s == EntryState::Queued),
            backoff: count(|s| *s == EntryState::Backoff),
            fetch_outstanding: matches!(self.fetch, FetchState::Outstanding(_)),
        }
    }

    /// C3, C5 and C8 for the lane, and its stores against each other; adds what its
    /// entries say the group's ACK deadlines and clients must hold to `want`, and the
    /// timers they account for to `armed`.
    pub fn check(
        &self,
        name: &str,
        config: &MeshConfig,
        max_attempts: u32,
        want: &mut Expected,
        armed: &mut BTreeSet<Timer>,
    ) -> Result<(), String> {
        // C8: memory bounded by configuration.
        let cap = if self.partition == REPLAY_PARTITION {
            config.max_replay_per_group
        } else {
            config.max_window_per_lane
        };
        let at = format!("{name}/{}", self.partition);
        self.progress.check().map_err(|e| format!("{at}: {e:?}"))?;
        self.entries.check().map_err(|e| format!("{at}: {e}"))?;
        self.ready.check().map_err(|e| format!("{at}: {e}"))?;
        let wm = self.progress.watermark();
        // C3: never passes an un-done offset... The watermark may be beyond the cursor:
        // after a restart, closing the gap below a persisted ACK range folds the range in
        // before its offsets are fetched again (they are done, and skipped when they come).
        if let Some((&first, _)) = self.entries.first_key_value() {
            if first < wm {
                return Err(format!("{at}: C3 watermark {wm} passed un-done {first}"));
            }
        }
        // ...and never goes back except by seek or broker truncation.
        if let Some((from, to)) = self.regressed {
            return Err(format!("{at}: C3 watermark regressed {from} -> {to}"));
        }
        if self.entries.len() > cap {
            return Err(format!(
                "{at}: C8 {} records held > {cap}",
                self.entries.len()
            ));
        }
        if self.progress.range_count() > config.max_ack_ranges_per_lane + cap + 1 {
            return Err(format!(
                "{at}: C8 {} ack ranges",
                self.progress.range_count()
            ));
        }
        for (&o, e) in &self.entries {
            self.check_entry(&at, o, e, max_attempts, want, armed)?;
        }
        if self.ready.len() > self.entries.len() {
            return Err(format!("{at}: ready set holds unknown entries"));
        }
        if matches!(self.fetch, FetchState::Retrying) {
            armed.insert(Timer::FetchRetry {
                group: self.group,
                partition: self.partition,
            });
        }
        self.check_keys(&at)
    }

    fn check_entry(
        &self,
        at: &str,
        o: Offset,
        e: &Entry,
        max_attempts: u32,
        want: &mut Expected,
        armed: &mut BTreeSet<Timer>,
    ) -> Result<(), String> {
        if self.progress.is_done(o) {
            return Err(format!("{at}: entry {o} is done but still held"));
        }
        if o >= self.cursor {
            return Err(format!("{at}: entry {o} at or beyond cursor"));
        }
        if e.attempts > max_attempts {
            return Err(format!("{at}/{o}: C5 attempt {} > max", e.attempts));
        }
        if self.ready.contains(&o) != e.eligible() {
            return Err(format!("{at}/{o}: ready set disagrees with state"));
        }
        match e.state {
            EntryState::InFlight(f) => {
                *want.held.entry(f.client).or_default() += 1;
                if f.moved {
                    want.moved.insert((f.deadline, self.partition, o));
                } else if want
                    .fifo
                    .insert(f.seq, (f.deadline, self.partition, o))
                    .is_some()
                {
                    return Err(format!("{at}/{o}: delivery seq {:?} reused", f.seq));
                }
            }
            EntryState::Backoff => {
                armed.insert(self.backoff_timer(o));
            }
            EntryState::Queued => {}
        }
        if let Some(t) = e.ledger_needed {
            if !self.awaiting_ledger.contains(&(t, o)) {
                return Err(format!("{at}/{o}: ledger wait not indexed"));
            }
        }
        Ok(())
    }

    fn check_keys(&self, at: &str) -> Result<(), String> {
        for (k, q) in &self.keys {
            let head = self.entries.get(&q.head);
            if head.is_none_or(|e| e.key_blocked) {
                return Err(format!("{at}: key {k} head {} missing or blocked", q.head));
            }
            for w in &q.waiting {
                if !self.entries.get(w).is_some_and(|e| e.key_blocked) {
                    return Err(format!("{at}: key {k} waiter {w} not blocked"));
                }
            }
        }
        Ok(())
    }
}
