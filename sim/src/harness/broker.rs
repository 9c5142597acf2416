//! The broker side: records published over the fault phase (in the Kafka world with
//! transaction markers and aborted transactions between them), and fetches answered by the
//! model broker — validated against the broker's leader epochs (a lane whose state is from
//! before a lost tail is answered "out of range" at the divergence point, as Kafka's
//! KIP-320 validation tells a consumer), held a while when empty (long poll), distorted
//! during faults (failed, spuriously out of range, rewound, duplicated), now and then
//! answered twice.

use std::sync::Arc;

use bytes::Bytes;
use unimesh_core::{EventMeta, FetchResult, Input, Partition, RecordMeta};

use super::queue::{Ev, FetchCall};
use super::{topic, Sim};
use crate::checker::Violation;
use crate::faults::{distort_fetch, FetchDistortion};
use crate::options::{REGIONS, SOURCES, SUBJECTS, TIERS};

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
    /// seed; in the Kafka world a source, subject and extensions too, and maybe an aborted
    /// transaction before it and a transaction marker after it) and tells the checker the
    /// broker acknowledged it.
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
        let kafka = self.kafka().is_some();
        let meta = if self.rng.chance(self.opt.undecodable) {
            self.faults.undecodable_records += 1;
            // In the Kafka world each undecodable record is told apart from another at
            // the same offset (a lost tail reuses offsets).
            let why = if kafka {
                format!("not a CloudEvent (e{n})")
            } else {
                "not a CloudEvent".into()
            };
            RecordMeta::Undecodable(Arc::from(why))
        } else {
            let mut m = EventMeta {
                id: format!("e{n}"),
                source: "/sim".into(),
                ty: TYPES[self.rng.index(TYPES.len())].into(),
                subject: None,
                partition_key: Some(format!("k{key}")),
                extensions: Vec::new(),
            };
            if kafka {
                self.enrich(&mut m);
            }
            RecordMeta::Event(Arc::new(m))
        };
        let poison = self.rng.chance(self.opt.poison);
        if poison {
            self.faults.poison_records += 1;
        }
        let body = Bytes::from_static(if poison { b"poison" } else { b"ok" });
        if kafka {
            self.maybe_holes(p, true)?;
        }
        let record = self.broker.publish(p, meta, body, self.opt.pop);
        self.note(
            0,
            "publish",
            [u64::from(p), record.offset, u64::from(poison), 0],
        );
        let t = topic();
        self.checker.published(&t, p, &record)?;
        self.checker
            .publish_answered(&t, true, Some((p, record.offset)))?;
        if kafka {
            self.maybe_holes(p, false)?;
        }
        Ok(())
    }

    /// The Kafka world's attributes of an event: a source, maybe a subject, extensions
    /// (sorted by name, as the shell gives them).
    fn enrich(&mut self, m: &mut EventMeta) {
        let r = &mut self.kafka_rng;
        m.source = SOURCES[r.index(SOURCES.len())].into();
        if r.chance(0.7) {
            m.subject = Some(SUBJECTS[r.index(SUBJECTS.len())].into());
        }
        if r.chance(0.6) {
            m.extensions
                .push(("region".into(), REGIONS[r.index(REGIONS.len())].into()));
        }
        if r.chance(0.4) {
            m.extensions
                .push(("tier".into(), TIERS[r.index(TIERS.len())].into()));
        }
    }

    /// Offsets no consumer sees, around a record: before it (`before`) the records and
    /// marker of an aborted transaction, after it a commit marker — as drawn.
    fn maybe_holes(&mut self, p: Partition, before: bool) -> Result<(), Violation> {
        let Some(k) = self.kafka() else {
            return Ok(());
        };
        let (chance, size) = if before {
            (k.aborted, 1 + self.kafka_rng.range(1, 4))
        } else {
            (k.markers, 1)
        };
        if !self.kafka_rng.chance(chance) {
            return Ok(());
        }
        if before {
            self.faults.aborted_transactions += 1;
        } else {
            self.faults.transaction_markers += 1;
        }
        let (from, to) = self.broker.append_holes(p, size);
        self.note(0, "holes", [u64::from(p), from, to, u64::from(before)]);
        self.checker.holes(&topic(), p, from, to)
    }

    /// `Ev::FetchAnswer`: the broker answers a fetch of node `call.node`'s incarnation
    /// `call.inc`; an empty answer is first held for the broker's long-poll wait.
    pub(super) fn on_fetch_answer(
        &mut self,
        call: FetchCall,
        waited: bool,
    ) -> Result<(), Violation> {
        let n = call.node;
        if call.inc != self.nodes[n].inc || self.nodes[n].mesh.is_none() {
            return Ok(());
        }
        if let Some(diverged) = self.diverged(call) {
            return self.fetched(call, diverged);
        }
        let honest = self.broker.fetch(call.partition, call.from, call.max);
        if !waited && matches!(&honest, FetchResult::Records(r) if r.is_empty()) {
            // Long poll: the broker holds an empty fetch a while before answering.
            let wait = self.opt.broker_wait_ms;
            self.at(wait, Ev::FetchAnswer { call, waited: true });
            return Ok(());
        }
        self.count_gaps(call, &honest);
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
        self.fetched(call, result)
    }

    /// Kafka world: the answer to a fetch of a lane whose state comes from before the
    /// broker lost the partition's tail — "out of range", with the divergence point as the
    /// end, so the core drops what it knew from there (records it fetched, ACK ranges of a
    /// checkpoint it started from) and reports it. The earliest offset given is never above
    /// the asked one, so the answer cannot be read as retention; the next answer is the
    /// broker's own. None when the lane's state is of the current leader epoch.
    fn diverged(&mut self, call: FetchCall) -> Option<FetchResult> {
        self.kafka()?;
        let lane = (call.group, call.partition);
        let known = self.nodes[call.node].held.get(&lane)?.leader_epoch;
        let x = self.broker.divergence(call.partition, known)?;
        self.faults.truncations_detected += 1;
        let earliest = self.broker.earliest(call.partition).min(x).min(call.from);
        Some(FetchResult::OutOfRange { earliest, end: x })
    }

    /// Counts the gaps of an honest answer: at its start (the first record is past the
    /// asked offset), in its middle, at its end (the offset after its last record holds
    /// none a consumer sees).
    fn count_gaps(&mut self, call: FetchCall, honest: &FetchResult) {
        if self.kafka().is_none() {
            return;
        }
        let FetchResult::Records(r) = honest else {
            return;
        };
        let (Some(first), Some(last)) = (r.first(), r.last()) else {
            return;
        };
        if first.offset > call.from {
            self.faults.answers_gap_start += 1;
        }
        if r.windows(2).any(|w| w[1].offset > w[0].offset + 1) {
            self.faults.answers_gap_middle += 1;
        }
        if self.broker.is_gap(call.partition, last.offset + 1) {
            self.faults.answers_gap_end += 1;
        }
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
                |start| broker.records(partition, start, from),
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
        if call.inc == self.nodes[call.node].inc {
            self.fetched(call, result)?;
        }
        Ok(())
    }

    /// Feeds one fetch answer to the node's mesh. When the mesh takes it (it answers the
    /// lane's outstanding fetch, and is no failure) the lane's position now comes from the
    /// broker's current leader epoch: the shell and the checker are told, once the
    /// answer's effects are through.
    fn fetched(&mut self, call: FetchCall, result: FetchResult) -> Result<(), Violation> {
        let (n, group, partition, fetch_id) =
            (call.node, call.group, call.partition, call.fetch_id);
        let (what, a, b) = match &result {
            FetchResult::Records(r) => {
                ("fetched", r.len() as u64, r.first().map_or(0, |r| r.offset))
            }
            FetchResult::OutOfRange { earliest, end } => ("out-of-range", *earliest, *end),
            FetchResult::Failed { .. } => ("fetch-failed", 0, 0),
        };
        self.note(n, what, [group as u64, u64::from(partition), a, b]);
        let lane = (group, partition);
        let taken = self.nodes[n].fetching.get(&lane) == Some(&fetch_id)
            && !matches!(result, FetchResult::Failed { .. });
        if self.nodes[n].fetching.get(&lane) == Some(&fetch_id) {
            self.nodes[n].fetching.remove(&lane);
        }
        let name = self.groups[group].name.clone();
        self.input(
            n,
            Input::Fetched {
                group: name.clone(),
                partition,
                fetch_id,
                result,
            },
        )?;
        self.drain(n)?;
        if taken && self.kafka().is_some() {
            let epoch = self.broker.leader_epoch(partition);
            if let Some(h) = self.nodes[n].held.get_mut(&lane) {
                h.leader_epoch = epoch;
            }
            self.check(n).fetch_answered(&name, partition)?;
        }
        Ok(())
    }
}
