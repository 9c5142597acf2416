//! What a lane fetches and what the fetch brings: the fetch cursor, restart alignment,
//! gaps, filtered records, new entries, retention and truncation.

use std::collections::VecDeque;

use super::entries::{Entry, EntryState};
use super::{FetchState, KeyQueue, Lane};
use crate::filter::Filter;
use crate::io::{Effect, FetchId};
use crate::mesh::timers::Timer;
use crate::mesh::Ctx;
use crate::record::{Record, RecordMeta};
use crate::types::{GroupName, Offset, Partition, TopicName};

/// What a fetched record is to the lane (`Lane::arrive`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Arrival {
    /// Known already or done: a duplicate, or done before a restart (restart alignment).
    Known,
    /// The window is full; this record and the rest of the batch are fetched again later.
    Full,
    /// The group's filter does not want it: done at once.
    Filtered,
    /// To be admitted, as attempt `attempts + 1` (the ledger may say some were issued).
    New { attempts: u32 },
}

impl Lane {
    /// Takes a fetched record's offset: skips what is already known or done (duplicates,
    /// rewinds, restart alignment), marks the offsets the broker skipped done, completes a
    /// filtered record. The cursor moves past it unless the window is full.
    #[inline]
    pub fn arrive(
        &mut self,
        cx: &mut Ctx,
        record: &Record,
        max_window: usize,
        filter: &Filter,
    ) -> Arrival {
        let offset = record.offset;
        if offset < self.cursor {
            cx.stats.duplicate_records += 1;
            return Arrival::Known;
        }
        if self.window_used() >= max_window {
            return Arrival::Full;
        }
        if offset > self.cursor {
            // Offsets the broker does not have (compaction, transaction markers).
            cx.stats.gap_offsets += offset - self.cursor;
            self.mark_done_span(self.cursor, offset);
            // A record that had attempts recorded may be gone (compacted): its offset is
            // done by absence now, and its attempt count goes with it, or a checkpoint
            // would carry an attempt below its watermark (unimesh-sim, Kafka world, seed
            // 2357).
            let cursor = self.cursor;
            if self.ledger.range(cursor..offset).next().is_some() {
                self.ledger.retain(|&o, _| o < cursor || o >= offset);
            }
            cx.dirty(self);
        }
        self.cursor = offset + 1;
        if self.progress.is_done(offset) {
            // Done before a restart (in a persisted ACK range): never delivered again (C2).
            cx.stats.realigned_records += 1;
            return Arrival::Known;
        }
        let matches = match &record.meta {
            RecordMeta::Event(meta) => filter.matches(meta),
            RecordMeta::Undecodable(_) => true,
        };
        if !matches {
            self.mark_done(offset);
            self.ledger.remove(&offset);
            if let Some(h) = &record.broker_handle {
                self.unsynced_broker_acks.push((cx.next_ticket, h.clone()));
            }
            cx.dirty(self);
            return Arrival::Filtered;
        }
        Arrival::New {
            attempts: self.ledger.get(&offset).copied().unwrap_or(0),
        }
    }

    /// Places a record at `slot` as an entry that will go out as attempt `attempts + 1`;
    /// the group syncs the lane's place in its ready-lane set after the batch.
    #[inline]
    pub fn admit(
        &mut self,
        cx: &mut Ctx,
        slot: Offset,
        origin: Partition,
        record: Record,
        attempts: u32,
        keyed: bool,
    ) {
        let mut entry = Entry::new(record, origin, attempts);
        if attempts > 0 && self.persistent {
            // Attempt `attempts` may have been issued before a restart: the next must be
            // recorded durably before it goes out.
            self.ledger.insert(slot, attempts + 1);
            let needed = cx.next_ticket;
            entry.ledger_needed = Some(needed);
            self.awaiting_ledger.insert((needed, slot));
            cx.dirty(self);
        }
        if keyed {
            if let Some(k) = entry.record.partition_key() {
                match self.keys.get_mut(k) {
                    Some(q) => {
                        q.waiting.push_back(slot);
                        entry.key_blocked = true;
                    }
                    None => {
                        self.keys.insert(
                            k.to_owned(),
                            KeyQueue {
                                head: slot,
                                waiting: VecDeque::new(),
                            },
                        );
                    }
                }
            }
        }
        self.entries.insert(slot, entry);
        self.offer_fresh(slot);
    }

    /// Places a record that is dead on arrival (undecodable, or out of attempts before a
    /// restart): never ready, the group retires it at once.
    pub fn insert_dead_on_arrival(
        &mut self,
        slot: Offset,
        origin: Partition,
        record: Record,
        attempts: u32,
    ) {
        let mut entry = Entry::new(record, origin, attempts);
        entry.key_blocked = true;
        debug_assert!(!entry.eligible() && entry.state == EntryState::Queued);
        self.entries.insert(slot, entry);
    }

    /// The next slot of the replay lane, whose offsets are its own counter.
    pub fn take_replay_slot(&mut self) -> Offset {
        let slot = self.cursor;
        self.cursor += 1;
        slot
    }

    /// Ledger entries below the watermark belong to records that are done.
    pub fn trim_ledger(&mut self) {
        let wm = self.progress.watermark();
        if self.ledger.first_key_value().is_some_and(|(&o, _)| o < wm) {
            self.ledger = self.ledger.split_off(&wm);
        }
    }

    /// Retention deleted `[cursor, earliest)` before it was fetched: those offsets are done
    /// (lost) and fetching goes on at `earliest`. Returns where the loss starts and how many
    /// of the offsets were not done.
    pub fn skip_to(&mut self, earliest: Offset) -> (Offset, u64) {
        let from = self.cursor;
        let not_done = self.progress.not_done_between(from, earliest);
        self.mark_done_span(from, earliest);
        self.cursor = earliest;
        if self
            .ledger
            .first_key_value()
            .is_some_and(|(&o, _)| o < earliest)
        {
            let keep = self.ledger.split_off(&earliest);
            let entries = &self.entries;
            self.ledger.retain(|o, _| entries.contains_key(o));
            self.ledger.extend(keep);
        }
        (from, not_done)
    }

    /// The broker lost its tail from `end` (the group dropped the entries above it first):
    /// progress, cursor and ledger forget it. The one way the watermark may go back (C3).
    pub fn truncate(&mut self, end: Offset) {
        self.progress.truncate_from(end);
        self.cursor = end;
        self.push_end = self.push_end.min(end);
        let _forgotten_above_end = self.ledger.split_off(&end);
    }

    /// The broker's log now ends at `end`, at or above the cursor, yet the lane knows
    /// offsets above it — ACK ranges and attempt counts of the checkpoint it started from:
    /// the broker lost them, and they will name new records. Forgets them, or those
    /// records would be skipped as done (unimesh-sim, Kafka world, seed 84) or
    /// dead-lettered as out of attempts (seed 18305). Returns where what it knew ended;
    /// None if it knew nothing at or above `end`.
    pub fn forget_above(&mut self, end: Offset) -> Option<Offset> {
        let done = Some(self.progress.done_end()).filter(|&e| e > end);
        let attempted = self.ledger.range(end..).next_back().map(|(&o, _)| o + 1);
        let to = done.max(attempted)?;
        self.progress.truncate_from(end);
        let _forgotten_above_end = self.ledger.split_off(&end);
        Some(to)
    }

    /// Whether `fetch_id` answers the outstanding fetch; if so the lane may fetch again.
    #[inline]
    pub fn take_fetch_answer(&mut self, fetch_id: FetchId) -> bool {
        if self.fetch != FetchState::Outstanding(fetch_id) {
            return false;
        }
        self.fetch = FetchState::Idle;
        true
    }

    /// The fetch failed or was contradicted: try again after `fetch_retry_ms`.
    pub fn retry_fetch_later(&mut self, cx: &mut Ctx) {
        let at = cx.now + cx.config.fetch_retry_ms;
        self.fetch = FetchState::Retrying;
        let timer = Timer::FetchRetry {
            group: self.group,
            partition: self.partition,
        };
        cx.timers.set(timer, at);
    }

    /// The retry timer fired.
    pub fn retry_fetch_now(&mut self) {
        self.fetch = FetchState::Idle;
    }

    /// Fetches if the lane may and has room for at least half a batch.
    #[inline]
    pub fn maybe_fetch(&mut self, cx: &mut Ctx, group: &GroupName, topic: &TopicName) {
        if !self.persistent || self.draining || !matches!(self.fetch, FetchState::Idle) {
            return;
        }
        // At the cap on ACK ranges, fetching pauses only above the highest range: below it,
        // a fetch can only fill gaps (offsets inside ranges are skipped on intake), which is
        // what closes ranges. A restart that recovered a checkpoint with the maximum number
        // of ranges would otherwise never fetch the gaps, and the lane would stall for good
        // (found by unimesh-sim seed 22).
        if self.progress.range_count() >= cx.config.max_ack_ranges_per_lane
            && self.cursor >= self.progress.done_end()
        {
            if !self.paused_for_ranges {
                self.paused_for_ranges = true;
                cx.stats.fetch_pauses_for_ranges += 1;
            }
            return;
        }
        self.paused_for_ranges = false;
        let max_window = cx.config.max_window_per_lane;
        let room = max_window.saturating_sub(self.window_used());
        let min_room = (cx.config.fetch_batch.min(max_window) / 2).max(1);
        if room < min_room {
            return;
        }
        let fetch_id = cx.next_fetch_id;
        cx.next_fetch_id += 1;
        self.fetch = FetchState::Outstanding(fetch_id);
        cx.stats.fetches += 1;
        cx.effects.push_back(Effect::Fetch {
            group: group.clone(),
            topic: topic.clone(),
            partition: self.partition,
            fetch_id,
            from: self.cursor,
            max: room.min(cx.config.fetch_batch),
        });
    }
}
