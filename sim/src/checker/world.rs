//! The world outside the mesh: groups as defined, records the broker acknowledged (C9),
//! offsets it never shows (holes), records compaction and retention removed, and tails an
//! unclean leader election lost.

use std::collections::{BTreeMap, HashMap};

use unimesh_core::{
    Filter, Offset, Partition, Record, RecordMeta, StartFrom, SubscriptionSpec, TopicName,
};

use super::filter::admits;
use super::state::{clip, GroupState, Lost, PubRec, SlotState, Truncation};
use super::{fail, Check, Checker, Clause};

impl Checker {
    /// A group exists with this definition (the checker's scope for it starts here).
    pub fn add_group(&mut self, spec: &SubscriptionSpec) {
        let start = match &spec.start_from {
            StartFrom::Earliest => BTreeMap::new(),
            StartFrom::Latest(ends) => ends.clone(),
        };
        self.groups.insert(
            spec.group.clone(),
            GroupState {
                topic: spec.topic.clone(),
                filter: spec.filter.clone(),
                ordering: spec.ordering,
                max_attempts: spec.max_attempts,
                ack_timeout_ms: spec.ack_timeout_ms,
                max_in_flight: spec.max_in_flight_per_client,
                start,
                lanes: BTreeMap::new(),
                credit: BTreeMap::new(),
                inflight: BTreeMap::new(),
                replay: HashMap::new(),
            },
        );
    }

    /// The broker acknowledged `record` to its publisher at `(topic, partition, offset)`.
    pub fn published(&mut self, topic: &TopicName, partition: Partition, record: &Record) -> Check {
        self.serials += 1;
        let serial = self.serials;
        let log = self.logs.entry((topic.clone(), partition)).or_default();
        if record.offset != log.recs.len() as Offset {
            return fail(
                Clause::C9,
                format!(
                    "{topic}/{partition}: broker acknowledged offset {} but its log ends at {}",
                    record.offset,
                    log.recs.len()
                ),
            );
        }
        log.recs.push(PubRec {
            meta: Some(record.meta.clone()),
            handle: record.broker_handle.is_some(),
            state: SlotState::Record,
            serial,
        });
        Ok(())
    }

    /// Offsets `[from, to)` will never show a consumer a record (transaction markers,
    /// aborted transactions); the log continues at `to`.
    pub fn holes(
        &mut self,
        topic: &TopicName,
        partition: Partition,
        from: Offset,
        to: Offset,
    ) -> Check {
        self.world_seq += 1;
        let at = self.world_seq;
        let log = self.logs.entry((topic.clone(), partition)).or_default();
        if from != log.recs.len() as Offset {
            return fail(
                Clause::C9,
                format!(
                    "{topic}/{partition}: holes from {from} but the log ends at {}",
                    log.recs.len()
                ),
            );
        }
        for _ in from..to {
            log.recs.push(PubRec {
                meta: None,
                handle: false,
                state: SlotState::Hole(at),
                serial: 0,
            });
        }
        Ok(())
    }

    /// Compaction removed the record at `offset` (a later record has its key).
    pub fn compacted(&mut self, topic: &TopicName, partition: Partition, offset: Offset) -> Check {
        self.world_seq += 1;
        let at = self.world_seq;
        let log = self.logs.entry((topic.clone(), partition)).or_default();
        match log.recs.get_mut(offset as usize) {
            Some(r) if r.state == SlotState::Record => {
                r.state = SlotState::Compacted(at);
                Ok(())
            }
            _ => fail(
                Clause::C9,
                format!(
                    "{topic}/{partition}: compaction of offset {offset}, which holds no record"
                ),
            ),
        }
    }

    /// A publisher got an answer. C9: success only for a write the broker acknowledged.
    pub fn publish_answered(
        &mut self,
        topic: &TopicName,
        ok: bool,
        acknowledged_at: Option<(Partition, Offset)>,
    ) -> Check {
        if !ok {
            return Ok(());
        }
        match acknowledged_at {
            Some((p, o))
                if self
                    .logs
                    .get(&(topic.clone(), p))
                    .is_some_and(|l| (o as usize) < l.recs.len()) =>
            {
                Ok(())
            }
            _ => fail(
                Clause::C9,
                format!("{topic}: publish answered OK without a broker acknowledgement"),
            ),
        }
    }

    /// Retention deleted everything below `earliest`.
    pub fn retention(&mut self, topic: &TopicName, partition: Partition, earliest: Offset) {
        let log = self.logs.entry((topic.clone(), partition)).or_default();
        log.earliest = log.earliest.max(earliest);
    }

    /// The broker lost everything from `new_end` on (an unclean leader election): later
    /// records reuse those offsets. Durable checkpoints are clipped there (a reader that
    /// honours leader epochs sees no more), what was known of the lost records is dropped,
    /// and every lane that delivered one of them owes a report of the loss.
    pub fn truncated(&mut self, topic: &TopicName, partition: Partition, new_end: Offset) -> Check {
        let log = self.logs.entry((topic.clone(), partition)).or_default();
        let old_end = log.recs.len() as Offset;
        if new_end >= old_end || new_end < log.earliest {
            return fail(
                Clause::C9,
                format!(
                    "{topic}/{partition}: truncation to {new_end} of a log holding [{}, {old_end})",
                    log.earliest
                ),
            );
        }
        let t = log.truncations.len();
        log.truncations.push(Truncation { new_end, old_end });
        let gone: Vec<PubRec> = log.recs.drain(new_end as usize..).collect();
        for (i, rec) in gone.into_iter().enumerate() {
            if !rec.is_hole() {
                log.lost.push(Lost {
                    offset: new_end + i as Offset,
                    rec,
                    truncation: t,
                });
            }
        }
        for g in self.groups.values_mut() {
            if g.topic != *topic {
                continue;
            }
            let Some(lane) = g.lanes.get_mut(&partition) else {
                continue;
            };
            if let Some(d) = lane.durable.as_mut() {
                clip(d, new_end);
            }
            lane.recs.truncate(new_end as usize);
            lane.committed = lane.committed.map(|c| c.min(new_end));
            for owner in lane.owners.values_mut() {
                if owner.assigned && owner.delivered_end > new_end {
                    owner.must_report = Some(owner.must_report.map_or(new_end, |x| x.min(new_end)));
                }
            }
        }
        Ok(())
    }

    /// Whether the record now at `p/o` of the group's topic passes its filter (an
    /// undecodable record always does); None if there is no record there (never
    /// acknowledged, or a hole).
    pub(super) fn matches(&self, g: &GroupState, p: Partition, o: Offset) -> Option<bool> {
        let log = self.logs.get(&(g.topic.clone(), p))?;
        let meta = log.recs.get(o as usize)?.meta.as_ref()?;
        Some(wanted(g, meta))
    }
}

/// Whether a record with `meta` passes the group's filter, by the checker's own model (an
/// undecodable record always does: it is dead-lettered for every group).
pub(super) fn wanted(g: &GroupState, meta: &RecordMeta) -> bool {
    passes(&g.filter, meta)
}

/// [`wanted`] for a filter.
pub(super) fn passes(filter: &Filter, meta: &RecordMeta) -> bool {
    match meta {
        RecordMeta::Event(m) => admits(filter, m),
        RecordMeta::Undecodable(_) => true,
    }
}
