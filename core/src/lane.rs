//! A lane: one group's view of one partition. It owns the fetch cursor, the progress and
//! the records not yet done. Lanes of different groups share nothing, so a slow group never
//! holds back a fast one (C7; the seed shared one cursor per partition: upstream #5294).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;

use crate::checkpoint::Checkpoint;
use crate::io::{DeadLetter, DlqKey, FetchId, Ticket};
use crate::progress::Progress;
use crate::record::Record;
use crate::types::{Millis, Offset, Partition};

/// Where a not-done record is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EntryState {
    /// Waiting to be handed out (possibly also for its key or its attempt ledger).
    Queued,
    /// Handed to a client; redelivered at `deadline` unless settled.
    InFlight { client: u32, deadline: Millis },
    /// Waiting out a redelivery backoff.
    Backoff { until: Millis },
}

#[derive(Clone, Debug)]
pub(crate) struct Entry {
    pub record: Record,
    /// The record's own partition (differs from the lane's only in the replay lane).
    pub origin: Partition,
    /// Attempts issued so far, or assumed issued after a restart (the durable ledger).
    pub attempts: u32,
    /// The lowest attempt number issued in this lane incarnation; ids below it are unknown.
    pub first_here: u32,
    pub state: EntryState,
    /// The ticket whose persist makes the next attempt number durable; `None` when the next
    /// attempt needs no ledger entry (a first attempt, or a non-persistent lane).
    pub ledger_needed: Option<Ticket>,
    /// Another record with the same key is ahead of this one.
    pub key_blocked: bool,
}

impl Entry {
    pub fn eligible(&self) -> bool {
        self.state == EntryState::Queued && self.ledger_needed.is_none() && !self.key_blocked
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FetchState {
    Idle,
    Outstanding(FetchId),
    RetryAt(Millis),
}

/// Records sharing a key: the head is the one in progress, the rest wait in offset order.
#[derive(Clone, Debug)]
pub(crate) struct KeyQueue {
    pub head: Offset,
    pub waiting: VecDeque<Offset>,
}

#[derive(Clone, Debug)]
pub(crate) struct Lane {
    pub partition: Partition,
    /// Fresh on every assignment and seek; part of every delivery id.
    pub lease: u64,
    /// False for the replay lane, whose progress is not persisted.
    pub persistent: bool,
    pub progress: Progress,
    /// The next offset to fetch. Starts at the recovered watermark: restart alignment.
    pub cursor: Offset,
    /// One past the highest offset handed out in this incarnation (a gauge).
    pub push_end: Offset,
    pub entries: BTreeMap<Offset, Entry>,
    /// Entries that can be handed out now.
    pub ready: BTreeSet<Offset>,
    pub keys: BTreeMap<String, KeyQueue>,
    /// Attempt numbers (>= 2) that may have been issued for not-done offsets.
    pub ledger: BTreeMap<Offset, u32>,
    /// Entries waiting for their ledger bump to be durable: (ticket needed, offset).
    pub awaiting_ledger: BTreeSet<(Ticket, Offset)>,
    /// Dead letters decided but not yet durable; every flush of the lane carries them all.
    pub unsynced_dead_letters: Vec<(Ticket, DeadLetter)>,
    /// DLQ entries whose replay was ACKed, not yet durably deleted.
    pub unsynced_resolved: Vec<(Ticket, DlqKey)>,
    /// POP receipt handles of done records, ACKed to the broker once durable.
    pub unsynced_broker_acks: Vec<(Ticket, Bytes)>,
    pub fetch: FetchState,
    pub dirty: bool,
    pub touched: bool,
    /// The newest ticket that carried this lane and is durable.
    pub durable_ticket: Ticket,
    /// The watermark in that ticket.
    pub durable_watermark: Option<Offset>,
    pub committed: Option<Offset>,
    /// Set when a seek or broker truncation moved the watermark back on purpose.
    pub rewound: bool,
    /// The watermark at the last invariant check (C3: it never regresses otherwise).
    pub checked_watermark: Offset,
    pub paused_for_ranges: bool,
}

impl Lane {
    pub fn new(partition: Partition, lease: u64, persistent: bool, checkpoint: Checkpoint) -> Self {
        let watermark = checkpoint.progress.watermark();
        Self {
            partition,
            lease,
            persistent,
            cursor: watermark,
            push_end: watermark,
            progress: checkpoint.progress,
            entries: BTreeMap::new(),
            ready: BTreeSet::new(),
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
            durable_watermark: None,
            committed: None,
            rewound: false,
            checked_watermark: watermark,
            paused_for_ranges: false,
        }
    }

    /// Memory the lane holds for records, counted against `max_window_per_lane`.
    pub fn window_used(&self) -> usize {
        self.entries.len()
            + self.unsynced_dead_letters.len()
            + self.unsynced_resolved.len()
            + self.unsynced_broker_acks.len()
    }

    /// The state a persist of this lane writes now.
    pub fn checkpoint(&self) -> Checkpoint {
        Checkpoint {
            progress: self.progress.clone(),
            attempts: self.ledger.iter().map(|(&o, &n)| (o, n)).collect(),
        }
    }

    /// Puts an entry in the ready set if it can be handed out. Returns true if it was added.
    pub fn offer(&mut self, offset: Offset) -> bool {
        match self.entries.get(&offset) {
            Some(e) if e.eligible() => self.ready.insert(offset),
            _ => false,
        }
    }

    /// Lets the next record of a key go, once the head at `offset` is done.
    pub fn release_key(&mut self, key: &str, offset: Offset) {
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
}
