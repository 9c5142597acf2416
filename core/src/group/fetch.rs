//! What a fetch brings a group's lane: records to take in (or skip, or dead-letter at
//! once), a range the broker no longer has, or a failure to retry.

use super::Group;
use crate::config::Ordering;
use crate::io::{DeadLetterReason, Effect, FetchId, FetchResult, Response, SkipReason};
use crate::lane::Arrival;
use crate::mesh::Ctx;
use crate::record::{Record, RecordMeta};
use crate::types::{Offset, Partition};

impl Group {
    /// The answer to a fetch; an answer to any but the lane's outstanding fetch is stale.
    pub fn fetched(
        &mut self,
        cx: &mut Ctx,
        p: Partition,
        fetch_id: FetchId,
        result: FetchResult,
    ) -> Response {
        let Some(lane) = self.lanes.get_mut(p) else {
            cx.stats.stale_fetch_answers += 1;
            return Response::Ok;
        };
        if !lane.take_fetch_answer(fetch_id) {
            cx.stats.stale_fetch_answers += 1;
            return Response::Ok;
        }
        cx.touch_lane(lane);
        match result {
            FetchResult::Records(records) => self.intake(cx, p, records),
            FetchResult::OutOfRange { earliest, end } => self.out_of_range(cx, p, earliest, end),
            FetchResult::Failed { .. } => {
                cx.stats.fetch_failures += 1;
                lane.retry_fetch_later(cx);
            }
        }
        cx.touch_group(self);
        Response::Ok
    }

    /// A lane's `FetchRetry` timer fired.
    pub fn retry_fetch(&mut self, cx: &mut Ctx, p: Partition) {
        if let Some(lane) = self.lanes.get_mut(p) {
            lane.retry_fetch_now();
            cx.touch_lane(lane);
        }
    }

    /// Takes fetched records into a lane: skips what is already known or done (duplicates,
    /// rewinds, restart alignment), completes filtered records, queues the rest.
    fn intake(&mut self, cx: &mut Ctx, p: Partition, records: Vec<Record>) {
        let max_window = cx.config.max_window_per_lane;
        for record in records {
            let Some(lane) = self.lanes.get_mut(p) else {
                return;
            };
            match lane.arrive(cx, &record, max_window, &self.spec.filter) {
                Arrival::Known => {}
                // More than was asked for: the rest is fetched again later.
                Arrival::Full => break,
                Arrival::Filtered => self.stats.filtered += 1,
                Arrival::New { attempts } => {
                    self.admit(cx, p, record.offset, p, record, attempts);
                }
            }
        }
        self.lanes.sync(p);
        if let Some(lane) = self.lanes.get_mut(p) {
            lane.trim_ledger();
        }
    }

    /// Places one record in a lane as an entry (or dead-letters it at once). The caller then
    /// syncs the lane's place in the ready-lane set once for its whole batch.
    #[inline]
    pub(super) fn admit(
        &mut self,
        cx: &mut Ctx,
        p: Partition,
        slot: Offset,
        origin: Partition,
        record: Record,
        attempts: u32,
    ) {
        let keyed = self.spec.ordering == Ordering::Key;
        let undecodable = match &record.meta {
            RecordMeta::Undecodable(why) => Some(DeadLetterReason::Undecodable(why.to_string())),
            RecordMeta::Event(_) => None,
        };
        // An undecodable record, or one whose attempts ran out before a restart, is
        // dead-lettered without a delivery. It goes in as an entry so the one retirement
        // path handles it.
        let dead_now = undecodable.or(if attempts >= self.spec.max_attempts {
            Some(DeadLetterReason::AckTimeout)
        } else {
            None
        });
        let Some(lane) = self.lanes.get_mut(p) else {
            return;
        };
        match dead_now {
            Some(reason) => {
                lane.insert_dead_on_arrival(slot, origin, record, attempts);
                self.dead_letter(cx, p, slot, reason);
            }
            None => lane.admit(cx, slot, origin, record, attempts, keyed),
        }
    }

    /// The broker says the lane's cursor is outside what it holds: retention deleted
    /// records not fetched yet, or the broker lost its tail. Either is reported.
    fn out_of_range(&mut self, cx: &mut Ctx, p: Partition, earliest: Offset, end: Offset) {
        let Some(lane) = self.lanes.get_mut(p) else {
            return;
        };
        let (from, to, not_done, reason) = if lane.cursor() < earliest {
            // Only [cursor, earliest) is lost: records held in memory are not.
            let (from, not_done) = lane.skip_to(earliest);
            cx.stats.skipped_retention += not_done;
            self.stats.skipped_retention += not_done;
            cx.dirty(lane);
            (from, earliest, not_done, SkipReason::Retention)
        } else if lane.cursor() > end {
            // Offsets from `end` will name new records: forget what is known above it and
            // start again there. From the top: fresh ready offsets then leave the end of
            // their deque.
            let to = lane.cursor();
            let above: Vec<Offset> = lane.offsets_from(end).collect();
            let not_done = lane.progress().not_done_between(end, to);
            for o in above.into_iter().rev() {
                self.drop_entry(cx, p, o);
            }
            let Some(lane) = self.lanes.get_mut(p) else {
                return;
            };
            lane.truncate(end);
            cx.stats.truncations += 1;
            cx.dirty(lane);
            (end, to, not_done, SkipReason::BrokerTruncated)
        } else if let Some(to) = lane.forget_above(end) {
            // The lane never fetched past `end` but knew offsets above it (see
            // `Lane::forget_above`); the fetch goes on from the cursor.
            cx.stats.truncations += 1;
            cx.dirty(lane);
            (end, to, 0, SkipReason::BrokerTruncated)
        } else {
            // The broker contradicts itself; try again later rather than guess.
            cx.stats.fetch_failures += 1;
            lane.retry_fetch_later(cx);
            return;
        };
        if reason == SkipReason::BrokerTruncated {
            let lease = self.issue_lease(cx, p);
            if let Some(lane) = self.lanes.get_mut(p) {
                lane.relet(lease);
            }
        }
        cx.effects.push_back(Effect::Skipped {
            group: self.name.clone(),
            topic: self.spec.topic.clone(),
            partition: p,
            from,
            to,
            not_done,
            reason,
        });
    }

    /// Forgets one entry without marking it done (its offset will be fetched again or no
    /// longer exists).
    fn drop_entry(&mut self, cx: &mut Ctx, p: Partition, offset: Offset) {
        let keyed = self.spec.ordering == Ordering::Key;
        let Some(lane) = self.lanes.get_mut(p) else {
            return;
        };
        let Some(f) = lane.drop_entry(cx, offset, keyed) else {
            return;
        };
        if let Some(f) = f {
            self.acks.forget(&mut cx.timers, p, offset, f);
        }
        self.lanes.sync(p);
        if let Some(f) = f {
            self.unhold(cx, f.client);
        }
    }
}
