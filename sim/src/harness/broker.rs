//! The broker side: records published over the fault phase, and fetches answered by the
//! model broker — held a while when empty (long poll), distorted during faults (failed,
//! spuriously out of range, rewound, duplicated), now and then answered twice.

use std::sync::Arc;

use bytes::Bytes;
use unimesh_core::{EventMeta, FetchId, FetchResult, Input, Partition, RecordMeta};

use super::queue::{Ev, FetchCall};
use super::{topic, Sim};
use crate::checker::Violation;
use crate::faults::{distort_fetch, FetchDistortion};

/// The event types records are drawn from (groups filter on them).
const TYPES: [&str; 3] = ["a.created", "a.updated", "b.created"];

impl Sim {
    /// `Ev::Publish`: one more record, and the next one scheduled, until all are out.
    pub(super) fn on_publish(&mut self) -> Result<(), Violation> {
        if self.published < self.opt.records_before + self.opt.records {
            self.publish_one()?;
            let gap = (2 * self.opt.fault_phase_ms / u64::from(self.opt.records.max(1))).max(1);
            let d = self.rng.range(0, gap);
            self.at(d, Ev::Publish);
        }
        Ok(())
    }

    /// Publishes one record (a partition, type, key, poison and decodability drawn from the
    /// seed) and tells the checker the broker acknowledged it.
    pub(super) fn publish_one(&mut self) -> Result<(), Violation> {
        let n = self.published;
        self.published += 1;
        let key = self.rng.below(u64::from(self.opt.keys));
        // Key-partitioned, as producers with a partition key are.
        let p = (key % u64::from(self.opt.partitions)) as Partition;
        let p = if self.rng.chance(0.3) {
            self.rng.below(u64::from(self.opt.partitions)) as Partition
        } else {
            p
        };
        let meta = if self.rng.chance(self.opt.undecodable) {
            self.faults.undecodable_records += 1;
            RecordMeta::Undecodable(Arc::from("not a CloudEvent"))
        } else {
            RecordMeta::Event(Arc::new(EventMeta {
                id: format!("e{n}"),
                source: "/sim".into(),
                ty: TYPES[self.rng.index(TYPES.len())].into(),
                subject: None,
                partition_key: Some(format!("k{key}")),
                extensions: Vec::new(),
            }))
        };
        let poison = self.rng.chance(self.opt.poison);
        if poison {
            self.faults.poison_records += 1;
        }
        let body = Bytes::from_static(if poison { b"poison" } else { b"ok" });
        let record = self.broker.publish(p, meta, body, self.opt.pop);
        self.note(
            "publish",
            [u64::from(p), record.offset, u64::from(poison), 0],
        );
        let t = topic();
        self.checker.published(&t, p, &record)?;
        self.checker
            .publish_answered(&t, true, Some((p, record.offset)))
    }

    /// `Ev::FetchAnswer`: the broker answers a fetch of incarnation `call.inc`; an empty
    /// answer is first held for the broker's long-poll wait.
    pub(super) fn on_fetch_answer(
        &mut self,
        call: FetchCall,
        waited: bool,
    ) -> Result<(), Violation> {
        if call.inc != self.inc || self.mesh.is_none() {
            return Ok(());
        }
        let honest = self.broker.fetch(call.partition, call.from, call.max);
        if !waited && matches!(&honest, FetchResult::Records(r) if r.is_empty()) {
            // Long poll: the broker holds an empty fetch a while before answering.
            let wait = self.opt.broker_wait_ms;
            self.at(wait, Ev::FetchAnswer { call, waited: true });
            return Ok(());
        }
        let result = self.distort(call, honest);
        if !self.liveness && self.broker_rng.chance(self.opt.faults.fetch_answer_twice) {
            self.faults.answers_twice += 1;
            let d = self.broker_rng.range(0, 100);
            self.at(
                d,
                Ev::FetchRepeat {
                    call,
                    result: result.clone(),
                },
            );
        }
        self.fetched(call.group, call.partition, call.fetch_id, result)
    }

    /// The answer the mesh gets: the honest one once faults stopped, else one distorted as
    /// drawn from the seed (counted).
    fn distort(&mut self, call: FetchCall, honest: FetchResult) -> FetchResult {
        let (result, how) = if self.liveness {
            (honest, FetchDistortion::None)
        } else {
            let (partition, from) = (call.partition, call.from);
            let earliest = self.broker.earliest(partition);
            let end = self.broker.end(partition);
            let broker = &self.broker;
            distort_fetch(
                &mut self.broker_rng,
                &self.opt.faults,
                honest,
                earliest,
                end,
                from,
                |start| broker.records(partition, start, from).to_vec(),
            )
        };
        match how {
            FetchDistortion::None => {}
            FetchDistortion::Failed => self.faults.fetch_failures += 1,
            FetchDistortion::SpuriousOutOfRange => self.faults.spurious_out_of_range += 1,
            FetchDistortion::Rewound => self.faults.fetch_rewinds += 1,
            FetchDistortion::Duplicated => self.faults.fetch_duplicates += 1,
        }
        result
    }

    /// `Ev::FetchRepeat`: the same answer a second time, if its incarnation is still alive.
    pub(super) fn on_fetch_repeat(
        &mut self,
        call: FetchCall,
        result: FetchResult,
    ) -> Result<(), Violation> {
        if call.inc == self.inc {
            self.fetched(call.group, call.partition, call.fetch_id, result)?;
        }
        Ok(())
    }

    /// Feeds one fetch answer to the mesh.
    fn fetched(
        &mut self,
        group: usize,
        partition: Partition,
        fetch_id: FetchId,
        result: FetchResult,
    ) -> Result<(), Violation> {
        let (what, a, b) = match &result {
            FetchResult::Records(r) => {
                ("fetched", r.len() as u64, r.first().map_or(0, |r| r.offset))
            }
            FetchResult::OutOfRange { earliest, end } => ("out-of-range", *earliest, *end),
            FetchResult::Failed { .. } => ("fetch-failed", 0, 0),
        };
        self.note(what, [group as u64, u64::from(partition), a, b]);
        let name = self.groups[group].name.clone();
        self.input(Input::Fetched {
            group: name,
            partition,
            fetch_id,
            result,
        })?;
        self.drain()
    }
}
