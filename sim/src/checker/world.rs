//! The world outside the mesh: groups as defined, records the broker acknowledged (C9),
//! and what retention deleted.

use std::collections::{BTreeMap, HashMap};

use unimesh_core::{Offset, Partition, Record, RecordMeta, StartFrom, SubscriptionSpec, TopicName};

use super::state::{GroupState, PubRec};
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
            meta: record.meta.clone(),
            handle: record.broker_handle.is_some(),
        });
        Ok(())
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

    /// Whether the record at `p/o` of the group's topic passes its filter (an undecodable
    /// record always does); None if the broker never acknowledged it.
    pub(super) fn matches(&self, g: &GroupState, p: Partition, o: Offset) -> Option<bool> {
        let log = self.logs.get(&(g.topic.clone(), p))?;
        let r = log.recs.get(o as usize)?;
        Some(match &r.meta {
            RecordMeta::Event(m) => g.filter.matches(m),
            RecordMeta::Undecodable(_) => true,
        })
    }
}
