//! Durability: persists as the mesh emits them and as the store applies them. C1 (a
//! checkpoint marks done only what was ACKed, dead-lettered, filtered out, skipped by
//! retention or passed over by a seek, in the generation it was emitted in), C3 (the
//! durable watermark goes back only by a seek), C4 (the epoch written is the live one) and
//! C5 (a dead letter only after its last attempt). What a persist made durably done becomes
//! a promise of broker ACKs (C6) once the mesh is told.

use unimesh_core::{DlqKey, LaneCheckpoint, Offset, PersistBatch, Progress, RecordMeta, Ticket};

use super::state::{bit, newly_done, Emitted, EmittedLane, LaneState, NewlyDone};
use super::{fail, Check, Checker, Clause, Violation};

impl Checker {
    /// The mesh asked for `batch` to be persisted (before the store applies it).
    pub fn persist_emitted(&mut self, ticket: Ticket, batch: &PersistBatch) -> Check {
        if let Some(e) = batch.epoch {
            if e != self.epoch {
                return fail(
                    Clause::C4,
                    format!(
                        "persist {ticket} writes epoch {e}, incarnation has {}",
                        self.epoch
                    ),
                );
            }
        }
        let mut lanes = Vec::with_capacity(batch.checkpoints.len());
        for c in &batch.checkpoints {
            if let Some(lane) = self.lane_mut(&c.group, c.partition) {
                lanes.push((c.group.clone(), c.partition, lane.gen, lane.drop_gen));
            }
        }
        self.emitted.insert(
            (self.incarnation, ticket),
            Emitted {
                lanes,
                newly_done: Vec::new(),
            },
        );
        Ok(())
    }

    /// The store made `batch` durable (whether or not the mesh hears of it).
    pub fn persist_applied(&mut self, ticket: Ticket, batch: &PersistBatch) -> Check {
        self.stats.persists_applied += 1;
        let key = (self.incarnation, ticket);
        let Some(mut em) = self.emitted.remove(&key) else {
            return fail(
                Clause::C3,
                format!("persist {ticket} applied but never emitted by this incarnation"),
            );
        };
        self.apply_dead_letter_changes(batch)?;
        for (c, lane) in batch.checkpoints.iter().zip(em.lanes.iter()) {
            if let Some(fresh) = self.apply_checkpoint(c, lane)? {
                em.newly_done.push(fresh);
            }
        }
        if let Some(e) = batch.epoch {
            self.durable_epoch = self.durable_epoch.max(e);
        }
        self.emitted.insert(key, em);
        Ok(())
    }

    /// The groups a batch removes, the dead letters it writes (C5: each only after its last
    /// allowed attempt failed, a durable ledger said the attempts ran out, or it cannot be
    /// decoded) and the dead letters it resolves.
    fn apply_dead_letter_changes(&mut self, batch: &PersistBatch) -> Check {
        for name in &batch.removed_groups {
            self.groups.remove(name);
            self.dlq.retain(|k| k.group != *name);
        }
        for d in &batch.dead_letters {
            self.stats.dead_letters += 1;
            let Some(g) = self.groups.get(&d.key.group) else {
                continue;
            };
            let max_attempts = g.max_attempts;
            let undecodable = matches!(d.record.meta, RecordMeta::Undecodable(_));
            let Some(lane) = g.lanes.get(&d.key.partition) else {
                return fail(
                    Clause::C5,
                    format!("dead letter {:?} for a lane never seen", d.key),
                );
            };
            let r = lane
                .recs
                .get(d.key.offset as usize)
                .cloned()
                .unwrap_or_default();
            if !undecodable && r.max_attempt_any < max_attempts && r.ledger_max < max_attempts {
                return fail(
                    Clause::C5,
                    format!(
                        "dead letter {:?} after attempt {} (ledger {}) of {max_attempts}",
                        d.key, r.max_attempt_any, r.ledger_max
                    ),
                );
            }
            self.dlq.insert(d.key.clone());
        }
        for k in &batch.dlq_resolved {
            self.dlq.remove(k);
        }
        Ok(())
    }

    /// One checkpoint of an applied batch with what [`Checker::persist_emitted`] noted of
    /// it (the group and partition named in messages, the lane's generation and drop
    /// generation at emission): judged (C3, C1), then made the lane's durable state. The
    /// offsets it newly made done, if broker ACKs may still follow from them.
    fn apply_checkpoint(
        &mut self,
        c: &LaneCheckpoint,
        emitted: &EmittedLane,
    ) -> Result<Option<NewlyDone>, Violation> {
        let (gname, p, gen, drop_gen) = emitted;
        let (gen, drop_gen) = (*gen, *drop_gen);
        let Some(g) = self.groups.get(&c.group) else {
            return Ok(None);
        };
        let start = g.start.get(&c.partition).copied().unwrap_or(0);
        let log = self.logs.get(&(g.topic.clone(), c.partition));
        let log_len = log.map_or(0, |l| l.recs.len() as Offset);
        let dlq = &self.dlq;
        let Some(g) = self.groups.get_mut(&c.group) else {
            return Ok(None);
        };
        let (filter, lanes) = (&g.filter, &mut g.lanes);
        let filtered_out = |o: Offset| {
            log.and_then(|l| l.recs.get(o as usize))
                .is_some_and(|r| match &r.meta {
                    RecordMeta::Event(m) => !filter.matches(m),
                    RecordMeta::Undecodable(_) => false,
                })
        };
        let lane = lanes.entry(c.partition).or_default();
        let old = lane
            .durable
            .as_ref()
            .map(|d| d.progress.clone())
            .unwrap_or_else(|| Progress::new(start));
        let fresh = newly_done(&old, &c.checkpoint.progress);
        let rewound_ok = gen > lane.applied_gen
            && lane
                .seek_gens
                .range(lane.applied_gen + 1..=gen)
                .next()
                .is_some();
        // C3: the durable watermark never goes back except by an operator seek.
        if c.checkpoint.progress.watermark() < old.watermark() && !rewound_ok {
            return Err(Violation {
                clause: Clause::C3,
                message: format!(
                    "{gname}/{p}: durable watermark went back {} -> {}",
                    old.watermark(),
                    c.checkpoint.progress.watermark()
                ),
            });
        }
        // C1: every newly durable done offset was ACKed, dead-lettered, filtered out,
        // skipped by retention (reported) or passed over by a seek — in that generation.
        let dead_lettered = |o: Offset| {
            dlq.contains(&DlqKey {
                group: c.group.clone(),
                partition: c.partition,
                offset: o,
            })
        };
        let justified = |o: Offset| dead_lettered(o) || filtered_out(o);
        match lane.first_unjustified(&fresh, gen, start, log_len, justified) {
            None => {}
            Some(Unjustified::PastLogEnd(e)) => fail(
                Clause::C1,
                format!("{gname}/{p}: offsets up to {e} marked done but the log ends at {log_len}"),
            )?,
            Some(Unjustified::NeverAcked(o)) => fail(
                Clause::C1,
                format!(
                    "{gname}/{p}: offset {o} made durable as done (watermark {}, generation {gen}) but never ACKed or dead-lettered",
                    c.checkpoint.progress.watermark()
                ),
            )?,
        }
        for &(o, n) in &c.checkpoint.attempts {
            let r = lane.rec(o);
            r.ledger_max = r.ledger_max.max(n);
        }
        if gen >= lane.seek_gen {
            lane.seek_pending = false;
        }
        lane.applied_gen = lane.applied_gen.max(gen);
        lane.durable = Some(c.checkpoint.clone());
        Ok((drop_gen == lane.drop_gen).then(|| (c.group.clone(), c.partition, drop_gen, fresh)))
    }

    /// The mesh was told `Persisted{ticket}`: the broker ACKs it promised are now due (C6).
    pub fn persist_notified(&mut self, ticket: Ticket) {
        let Some(em) = self.emitted.remove(&(self.incarnation, ticket)) else {
            return;
        };
        for (gname, p, drop_gen, fresh) in em.newly_done {
            let Some(g) = self.groups.get_mut(&gname) else {
                continue;
            };
            let Some(log) = self.logs.get(&(g.topic.clone(), p)) else {
                continue;
            };
            let Some(lane) = g.lanes.get_mut(&p) else {
                continue;
            };
            if lane.drop_gen != drop_gen {
                continue;
            }
            for (a, e) in fresh {
                for o in a..e {
                    let handle = log.recs.get(o as usize).is_some_and(|r| r.handle);
                    if handle && !lane.is_skipped(o) {
                        let r = lane.rec(o);
                        if r.op_mask == 0 {
                            r.broker_ack_due = true;
                        }
                    }
                }
            }
        }
    }

    /// The store refused `ticket`: nothing in it counts.
    pub fn persist_failed(&mut self, ticket: Ticket) {
        self.emitted.remove(&(self.incarnation, ticket));
    }
}

/// Why a checkpoint may not mark an offset done (C1).
enum Unjustified {
    /// It marks offsets up to this one done, past the end of the broker's log.
    PastLogEnd(Offset),
    /// It marks this offset done, which nothing justifies.
    NeverAcked(Offset),
}

impl LaneState {
    /// The first of the offsets in `fresh` (from `start` on) that was neither ACKed nor
    /// passed over by a seek in generation `gen`, not `justified` otherwise (dead-lettered,
    /// filtered out) and not skipped by retention; or the first interval past `log_len`.
    fn first_unjustified(
        &mut self,
        fresh: &[(Offset, Offset)],
        gen: u32,
        start: Offset,
        log_len: Offset,
        justified: impl Fn(Offset) -> bool,
    ) -> Option<Unjustified> {
        let b = bit(gen);
        for &(a, e) in fresh {
            if e > log_len {
                return Some(Unjustified::PastLogEnd(e));
            }
            for o in a..e {
                if o < start {
                    continue;
                }
                let r = self.rec(o);
                let acked = r.acked_mask & b != 0 || r.op_mask & b != 0;
                if !acked && !justified(o) && !self.is_skipped(o) {
                    return Some(Unjustified::NeverAcked(o));
                }
            }
        }
        None
    }
}
