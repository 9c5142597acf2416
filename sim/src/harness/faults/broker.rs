//! Faults of a Kafka-protocol broker over time: compaction removes records a later record
//! of the same key supersedes, and an unclean leader election loses the acknowledged tail
//! of a partition (later records reuse its offsets).

use unimesh_core::Partition;

use crate::checker::Violation;
use crate::harness::queue::Ev;
use crate::harness::{topic, Sim};

/// At most this many offsets of a tail are lost at once.
const MAX_LOST: u64 = 8;

impl Sim {
    /// `Ev::Compaction`: one compaction run.
    pub(in crate::harness) fn on_compaction(&mut self) -> Result<(), Violation> {
        let mean = self.kafka().map_or(0, |k| k.compaction_every_ms);
        self.recur_kafka(Ev::Compaction, mean, Self::compaction)
    }

    /// Compacts one partition drawn from the seed, up to a few records short of its end
    /// (the active segment is never compacted).
    fn compaction(&mut self) -> Result<(), Violation> {
        let rate = self.kafka().map_or(0.0, |k| k.compaction_rate);
        let p = self.kafka_rng.below(u64::from(self.opt.partitions)) as Partition;
        let upto = self
            .broker
            .end(p)
            .saturating_sub(self.kafka_rng.range(0, 4));
        let removed = self.broker.compact(p, upto, rate, &mut self.kafka_rng);
        self.faults.compactions += 1;
        self.faults.compacted_records += removed.len() as u64;
        self.note(
            0,
            "compaction",
            [u64::from(p), upto, removed.len() as u64, 0],
        );
        for o in removed {
            self.checker.compacted(&topic(), p, o)?;
        }
        Ok(())
    }

    /// `Ev::Truncation`: a partition loses its tail.
    pub(in crate::harness) fn on_truncation(&mut self) -> Result<(), Violation> {
        let mean = self.kafka().map_or(0, |k| k.truncation_every_ms);
        self.recur_kafka(Ev::Truncation, mean, Self::truncation)
    }

    /// One partition drawn from the seed loses up to `MAX_LOST` offsets at its end —
    /// records the broker had acknowledged. Once every lane's start is durable only: a
    /// lane's start position from "latest" is never clipped.
    fn truncation(&mut self) -> Result<(), Violation> {
        if !self.all_pinned() {
            return Ok(());
        }
        let p = self.kafka_rng.below(u64::from(self.opt.partitions)) as Partition;
        let (earliest, end) = (self.broker.earliest(p), self.broker.end(p));
        if end <= earliest {
            return Ok(());
        }
        let lost = self.kafka_rng.range(1, (end - earliest).min(MAX_LOST));
        let new_end = end - lost;
        let records = self.broker.records(p, new_end, end).len() as u64;
        self.faults.truncations += 1;
        self.faults.truncated_records += records;
        self.note(0, "truncation", [u64::from(p), new_end, end, records]);
        self.broker.truncate(p, new_end);
        self.checker.truncated(&topic(), p, new_end)
    }
}
