//! Durability: persists as the mesh emits them and as the store applies them. C1 (a
//! checkpoint marks done only what was ACKed, dead-lettered, filtered out, skipped by
//! retention, passed over by a seek, or is absent from the broker — in the generation it
//! was emitted in), C3 (the durable watermark goes back only by a seek or a loss of the
//! broker's tail; nothing a fenced owner wrote becomes durable), C4 (the epoch written is
//! the live one) and C5 (a dead letter only after its last attempt). What a persist made
//! durably done becomes a promise of broker ACKs (C6) once the mesh is told.

use unimesh_core::{
    Checkpoint, DlqKey, GroupName, LaneCheckpoint, Offset, Partition, PersistBatch, Progress,
    RecordMeta, Ticket,
};

use super::state::{
    bit, clip, newly_done, Emitted, EmittedLane, LaneState, NewlyDone, SlotState, Unread,
};

/// Unread checkpoints kept per lane ([`Checker::read_back`]). A reader may take one long
/// after it was written: a claim (the checkpoint an assignment resumed from, written again
/// under the new generation) carries it on from owner to owner while zombies' writes pile
/// up outranked behind it — group seed 4643 read one 16 outranked writes later, after 16
/// kept had forgotten it. Each is a few numbers (the checkpoint is the reader's).
const UNREAD_PER_LANE: usize = 256;

use super::world::passes;
use super::{fail, Check, Checker, Clause, Violation};

impl Checker {
    /// The selected instance's mesh asked for `batch` to be persisted (before the store
    /// applies it).
    pub fn persist_emitted(&mut self, ticket: Ticket, batch: &PersistBatch) -> Check {
        let inst = self.current;
        let (epoch, incarnation) = {
            let n = self.node();
            (n.epoch, n.incarnation)
        };
        if let Some(e) = batch.epoch {
            if e != epoch {
                return fail(
                    Clause::C4,
                    format!("persist {ticket} writes epoch {e}, incarnation has {epoch}"),
                );
            }
        }
        let mut lanes = Vec::with_capacity(batch.checkpoints.len());
        for c in &batch.checkpoints {
            // Every checkpoint gets its entry, known group or not, so `persist_applied`
            // pairs them in batch order.
            lanes.push(self.lane_mut(&c.group, c.partition).map(|lane| {
                let stamp = lane.owner_stamp;
                let o = lane.owner(inst);
                EmittedLane {
                    group: c.group.clone(),
                    partition: c.partition,
                    gen: o.gen,
                    drop_gen: o.drop_gen,
                    stamp: o.stamp.min(stamp),
                    knows: o.knows,
                }
            }));
        }
        self.emitted.insert(
            (incarnation, ticket),
            Emitted {
                instance: inst,
                lanes,
                world_seq: self.world_seq,
                newly_done: Vec::new(),
                letters_applied: false,
            },
        );
        Ok(())
    }

    /// The store made `batch` of the selected instance durable (whether or not the mesh
    /// hears of it).
    pub fn persist_applied(&mut self, ticket: Ticket, batch: &PersistBatch) -> Check {
        self.persist_applied_outranked(ticket, batch, &[])
    }

    /// [`Checker::persist_applied`] on a store that fences at read: the batch is durable,
    /// but the checkpoints whose position in `batch.checkpoints` is `true` in `outranked`
    /// are not their lanes' durable state — a reader never takes them, because a record of
    /// a later owner ranks above them (Kafka's progress topic ranks a lane's records by
    /// the writer's ownership generation, so a replaced owner's late write lands and is
    /// never read). Those are neither judged nor applied; dead letters and the rest of the
    /// batch are. A position missing from `outranked` counts as `false`.
    pub fn persist_applied_outranked(
        &mut self,
        ticket: Ticket,
        batch: &PersistBatch,
        outranked: &[bool],
    ) -> Check {
        let counts = |i: usize| !outranked.get(i).copied().unwrap_or(false);
        self.stats.persists_applied += 1;
        let incarnation = self.node().incarnation;
        let key = (incarnation, ticket);
        let Some(mut em) = self.emitted.remove(&key) else {
            return fail(
                Clause::C3,
                format!("persist {ticket} applied but never emitted by this incarnation"),
            );
        };
        self.check_not_fenced(ticket, batch, &em, &counts)?;
        if !em.letters_applied {
            self.apply_dead_letter_changes(batch, em.instance)?;
        }
        for (i, (c, lane)) in batch.checkpoints.iter().zip(em.lanes.iter()).enumerate() {
            let Some(lane) = lane.as_ref() else {
                continue;
            };
            if !counts(i) {
                self.keep_unread(c, lane, em.instance, key, i, em.world_seq);
                continue;
            }
            if let Some(fresh) = self.apply_checkpoint(c, lane, em.instance, em.world_seq)? {
                em.newly_done.push(fresh);
            }
        }
        if let Some(e) = batch.epoch {
            let n = self.node();
            n.durable_epoch = n.durable_epoch.max(e);
        }
        self.emitted.insert(key, em);
        Ok(())
    }

    /// C3 for a store that fences at read: the selected instance resumes `group/p` from
    /// `checkpoint`, as it read it from the store (called before [`Checker::assigned`]),
    /// and the harness knows which record that was (`source`: written by checkpoint
    /// `index` of persist `ticket` of incarnation `incarnation` of instance `writer`:
    /// `(writer, incarnation, ticket, batch, index)`; `None` when it cannot tell, e.g. a
    /// resume from the committed offset). A record the checker did not apply — one of a
    /// batch not yet durable as a whole (its record landed first), or one the store holds
    /// below another ([`Checker::persist_applied_outranked`]) — is taken only when nothing
    /// a later owner wrote is durable: then it is the lane's newest record (a replaced
    /// owner's late write that no successor outranked yet: read-fencing adopts it), and it
    /// is applied now, judged in its writer's generation (C1); never when a later owner's
    /// durable checkpoint outranks it (C3).
    pub fn read_back(
        &mut self,
        group: &GroupName,
        p: Partition,
        checkpoint: &Checkpoint,
        source: Option<(super::Instance, u32, Ticket, &PersistBatch, usize)>,
    ) -> Check {
        let reader = self.current;
        let durable = self
            .groups
            .get(group)
            .and_then(|g| g.lanes.get(&p))
            .and_then(|l| l.durable.as_ref());
        if durable == Some(checkpoint) {
            return Ok(());
        }
        let Some((writer, incarnation, ticket, batch, index)) = source else {
            return Ok(());
        };
        let unread = self
            .unread_of(group, p, (writer, incarnation, ticket, index))
            .cloned();
        let result = match unread {
            Some(u) => {
                // The record holds what its writer wrote: the tap names a record's writer
                // by the checkpoint it holds.
                let c = LaneCheckpoint {
                    group: group.clone(),
                    topic: u.topic.clone(),
                    partition: p,
                    checkpoint: checkpoint.clone(),
                };
                self.adoptable(&c, &u.lane, u.instance)
                    .and_then(|()| self.apply_checkpoint(&c, &u.lane, u.instance, u.world_seq))
                    .map(|_| ())
            }
            None => {
                self.current = writer;
                self.persist_lane_applied((incarnation, ticket), batch, index)
            }
        };
        self.current = reader;
        result
    }

    /// What a reader acting on an assignment the coordinator had already overtaken (a
    /// zombie, [`Checker::assigned_stale`]) resumed from: not a read of the lane's durable
    /// state (the zombie's writes rank below the live owner's, whose later write outranks
    /// the record it took: seeds 84 and 130), but the base of the zombie's own checkpoints —
    /// an offset done in the record it read, ACKed in that record's writer's generation,
    /// may be done in them when a reader later takes one. Without it, such a checkpoint was
    /// judged as if the zombie resumed from older state (group seed 1093: an offset ACKed by
    /// the record's writer counted as never ACKed). Called before
    /// [`Checker::assigned_stale`]; a record the harness cannot name gives no base.
    pub fn read_back_stale(
        &mut self,
        group: &GroupName,
        p: Partition,
        checkpoint: &Checkpoint,
        source: Option<(super::Instance, u32, Ticket, &PersistBatch, usize)>,
    ) -> Check {
        // The record was read from the store: the attempts it counts are durable (C5), as
        // the zombie's own redeliveries and dead letters may rely on them.
        if let Some(lane) = self.lane_mut(group, p) {
            for &(o, n) in &checkpoint.attempts {
                let r = lane.rec(o);
                r.ledger_max = r.ledger_max.max(n);
            }
        }
        let Some((writer, incarnation, ticket, _, index)) = source else {
            return Ok(());
        };
        let kept = self
            .unread_of(group, p, (writer, incarnation, ticket, index))
            .map(|u| u.lane.gen);
        let writer_gen = kept.or_else(|| {
            self.emitted
                .get(&(incarnation, ticket))
                .and_then(|em| em.lanes.get(index))
                .and_then(|l| l.as_ref())
                .map(|l| l.gen)
        });
        let reader = self.current;
        let Some(lane) = self.lane_mut(group, p) else {
            return Ok(());
        };
        // An applied record (no writer's generation found) gives no base: its done offsets
        // are judged already.
        let base = writer_gen.map(|g| (checkpoint.progress.clone(), g));
        let gen = lane.owner(reader).gen;
        match base {
            Some(b) => {
                lane.zombie_bases.insert(gen, b);
            }
            None => {
                lane.zombie_bases.remove(&gen);
            }
        }
        Ok(())
    }

    /// The checkpoint kept unread for `group/p` that `(writer, incarnation, ticket, index)`
    /// names, if the checker holds it ([`Checker::keep_unread`]).
    fn unread_of(
        &self,
        group: &GroupName,
        p: Partition,
        (writer, incarnation, ticket, index): (super::Instance, u32, Ticket, usize),
    ) -> Option<&super::state::Unread> {
        self.unread.get(&(group.clone(), p))?.iter().find(|u| {
            u.instance == writer
                && u.incarnation == incarnation
                && u.ticket == ticket
                && u.index == index
        })
    }

    /// Checkpoint `index` of persist `key` (incarnation, ticket) of the selected instance,
    /// emitted and not yet durable as a whole, was read by a reader (a store that fences at
    /// read: its record landed before the rest of the batch): judged as
    /// [`Checker::read_back`] says and applied now; the batch's own apply leaves it out.
    fn persist_lane_applied(
        &mut self,
        key: (u32, Ticket),
        batch: &PersistBatch,
        index: usize,
    ) -> Check {
        let Some(mut em) = self.emitted.remove(&key) else {
            // Applied and notified already (and not outranked): nothing to take back.
            return Ok(());
        };
        // The batch's dead letters and resolutions are written before its checkpoints.
        if !em.letters_applied {
            em.letters_applied = true;
            if let Err(v) = self.apply_dead_letter_changes(batch, em.instance) {
                self.emitted.insert(key, em);
                return Err(v);
            }
        }
        let applied = match (batch.checkpoints.get(index), em.lanes.get(index)) {
            (Some(c), Some(Some(lane))) => self
                .adoptable(c, lane, em.instance)
                .and_then(|()| self.apply_checkpoint(c, lane, em.instance, em.world_seq)),
            _ => Ok(None),
        };
        if let Ok(Some(fresh)) = &applied {
            em.newly_done.push(fresh.clone());
        }
        if let Some(lane) = em.lanes.get_mut(index) {
            *lane = None;
        }
        self.emitted.insert(key, em);
        applied.map(|_| ())
    }

    /// Whether a reader may take checkpoint `c` that `writer` emitted (`el`), not applied
    /// when it landed: not when a later owner's checkpoint is durable (C3: the fence ranks
    /// that one above it). A replaced owner's late write that nothing later outranks is
    /// adopted (counted).
    fn adoptable(
        &mut self,
        c: &LaneCheckpoint,
        el: &EmittedLane,
        writer: super::Instance,
    ) -> Check {
        let (durable_stamp, owner_stamp) = self
            .groups
            .get(&c.group)
            .and_then(|g| g.lanes.get(&c.partition))
            .map_or((0, 0), |l| (l.durable_stamp, l.owner_stamp));
        if el.stamp < durable_stamp {
            return fail(
                Clause::C3,
                format!(
                    "{}/{}: instance {} resumed from a checkpoint (watermark {}) of instance {writer} that a later owner's durable checkpoint outranks",
                    c.group,
                    c.partition,
                    self.current,
                    c.checkpoint.progress.watermark(),
                ),
            );
        }
        if el.stamp < owner_stamp {
            self.stats.adopted_late_writes += 1;
        }
        Ok(())
    }

    /// Which checkpoints of `ticket` of the selected instance (emitted, not yet applied)
    /// are of lanes given to another owner since the batch was emitted: a zombie's writes,
    /// which a store that fences at read ranks below the new owner's (see
    /// [`Checker::persist_applied_outranked`]). All false for a ticket it does not know.
    pub fn replaced_lanes(&mut self, ticket: Ticket, batch: &PersistBatch) -> Vec<bool> {
        let incarnation = self.node().incarnation;
        let Some(em) = self.emitted.get(&(incarnation, ticket)) else {
            return vec![false; batch.checkpoints.len()];
        };
        batch
            .checkpoints
            .iter()
            .zip(em.lanes.iter())
            .map(|(c, lane)| {
                let stamp = self
                    .groups
                    .get(&c.group)
                    .and_then(|g| g.lanes.get(&c.partition))
                    .map_or(0, |l| l.owner_stamp);
                lane.as_ref().is_some_and(|el| el.stamp < stamp)
            })
            .collect()
    }

    /// C3: a checkpoint of an owner the coordinator has since replaced or expired (a
    /// zombie) must be fenced by the store, never applied.
    fn check_not_fenced(
        &self,
        ticket: Ticket,
        batch: &PersistBatch,
        em: &Emitted,
        counts: &impl Fn(usize) -> bool,
    ) -> Check {
        for (i, (c, lane)) in batch.checkpoints.iter().zip(em.lanes.iter()).enumerate() {
            let Some(el) = lane.as_ref().filter(|_| counts(i)) else {
                continue;
            };
            let stamp = self
                .groups
                .get(&c.group)
                .and_then(|g| g.lanes.get(&c.partition))
                .map_or(0, |l| l.owner_stamp);
            if el.stamp < stamp {
                return fail(
                    Clause::C3,
                    format!(
                        "persist {ticket} of instance {} made a checkpoint of {}/{} durable after the lane was given to another owner (a zombie's write must be fenced)",
                        em.instance, c.group, c.partition
                    ),
                );
            }
        }
        Ok(())
    }

    /// The groups a batch of `inst` removes, the dead letters it writes (C5: each only
    /// after its last allowed attempt failed, a durable ledger said the attempts ran out,
    /// or it cannot be decoded) and the dead letters it resolves — the entry of the record
    /// `inst` replayed (a dead letter of a new record at the same coordinates, after the
    /// broker lost its tail, stays).
    fn apply_dead_letter_changes(&mut self, batch: &PersistBatch, inst: super::Instance) -> Check {
        for name in &batch.removed_groups {
            self.groups.remove(name);
            self.dlq.retain(|k, _| k.group != *name);
            self.dead_lettered.retain(|k, _| k.group != *name);
        }
        for d in &batch.dead_letters {
            self.stats.dead_letters += 1;
            let Some(g) = self.groups.get(&d.key.group) else {
                continue;
            };
            let identified = self
                .logs
                .get(&(g.topic.clone(), d.key.partition))
                .and_then(|l| l.identify(d.key.offset, &d.record.meta));
            let Some((serial, lost_in)) = identified else {
                return fail(
                    Clause::C1,
                    format!(
                        "dead letter {:?} holds a record the broker never had there",
                        d.key
                    ),
                );
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
            // The writer's own attempts as a zombie count for its own dead letter.
            let own = r
                .zombie_attempts
                .iter()
                .find(|(i, _)| *i == inst)
                .map_or(0, |&(_, a)| a);
            // A record the broker lost since: what was known of its attempts went with it.
            if lost_in.is_none()
                && !undecodable
                && r.max_attempt_any.max(own) < max_attempts
                && r.ledger_max < max_attempts
            {
                return fail(
                    Clause::C5,
                    format!(
                        "dead letter {:?} after attempt {} (ledger {}) of {max_attempts}",
                        d.key, r.max_attempt_any, r.ledger_max
                    ),
                );
            }
            self.dlq.entry(d.key.clone()).or_default().insert(serial);
            self.dead_lettered
                .entry(d.key.clone())
                .or_default()
                .insert(serial);
        }
        for k in &batch.dlq_resolved {
            let replayed = self.replayed.get(&(inst, k.clone())).copied();
            if let Some(serials) = self.dlq.get_mut(k) {
                match replayed {
                    Some(s) => {
                        serials.remove(&s);
                    }
                    None => serials.clear(),
                }
                if serials.is_empty() {
                    self.dlq.remove(k);
                }
            }
        }
        Ok(())
    }

    /// One checkpoint of an applied batch with what [`Checker::persist_emitted`] noted of
    /// it, written by `inst`: clipped at every truncation its lane did not know of, judged
    /// (C3, C1), then made the lane's durable state. The offsets it newly made done, if
    /// broker ACKs may still follow from them.
    fn apply_checkpoint(
        &mut self,
        c: &LaneCheckpoint,
        el: &EmittedLane,
        inst: super::Instance,
        world_seq: u64,
    ) -> Result<Option<NewlyDone>, Violation> {
        let (gen, drop_gen) = (el.gen, el.drop_gen);
        let Some(g) = self.groups.get(&c.group) else {
            return Ok(None);
        };
        let start = g.start.get(&c.partition).copied().unwrap_or(0);
        let log = self.logs.get(&(g.topic.clone(), c.partition));
        let log_len = log.map_or(0, |l| l.recs.len() as Offset);
        let mut written = c.checkpoint.clone();
        if let Some(l) = log {
            for t in l.truncations.iter().skip(el.knows) {
                clip(&mut written, t.new_end);
            }
        }
        let dlq = &self.dead_lettered;
        let Some(g) = self.groups.get_mut(&c.group) else {
            return Ok(None);
        };
        let mut absent_done = 0u64;
        let (filter, lanes) = (&g.filter, &mut g.lanes);
        let lane = lanes.entry(c.partition).or_default();
        let old = lane
            .durable
            .as_ref()
            .map(|d| d.progress.clone())
            .unwrap_or_else(|| Progress::new(start));
        let fresh = newly_done(&old, &written.progress);
        let rewound_ok = gen > lane.applied_gen
            && lane
                .seek_gens
                .range(lane.applied_gen + 1..=gen)
                .next()
                .is_some();
        // C3: the durable watermark never goes back except by an operator seek (a loss of
        // the broker's tail already moved the durable one back, when it happened).
        if written.progress.watermark() < old.watermark() && !rewound_ok {
            return Err(Violation {
                clause: Clause::C3,
                message: format!(
                    "{}/{}: durable watermark went back {} -> {}",
                    el.group,
                    el.partition,
                    old.watermark(),
                    written.progress.watermark()
                ),
            });
        }
        // C1: every newly durable done offset was ACKed, dead-lettered (resolved since or
        // not), filtered out, skipped by retention (reported), passed over by a seek — in
        // that generation — or is not shown by the broker since before the checkpoint was
        // written.
        let mut justified = |o: Offset| {
            let Some(r) = log.and_then(|l| l.recs.get(o as usize)) else {
                return false;
            };
            if r.absent_since().is_some_and(|at| at <= world_seq) {
                absent_done += 1;
                return true;
            }
            let dead_lettered = dlq
                .get(&DlqKey {
                    group: c.group.clone(),
                    partition: c.partition,
                    offset: o,
                })
                .is_some_and(|s| s.contains(&r.serial));
            let filtered_out = r
                .meta
                .as_ref()
                .is_some_and(|m| !matches!(m, RecordMeta::Undecodable(_)) && !passes(filter, m));
            dead_lettered || filtered_out
        };
        let verdict = lane.first_unjustified(&fresh, gen, start, log_len, &mut justified);
        match verdict {
            None => {}
            Some(Unjustified::PastLogEnd(e)) => fail(
                Clause::C1,
                format!(
                    "{}/{}: offsets up to {e} marked done but the log ends at {log_len}",
                    el.group, el.partition
                ),
            )?,
            Some(Unjustified::NeverAcked(o)) => fail(
                Clause::C1,
                format!(
                    "{}/{}: offset {o} made durable as done (watermark {}, generation {gen}, instance {inst}) but never ACKed or dead-lettered",
                    el.group,
                    el.partition,
                    written.progress.watermark()
                ),
            )?,
        }
        self.stats.done_by_absence += absent_done;
        for &(o, n) in &written.attempts {
            let r = lane.rec(o);
            r.ledger_max = r.ledger_max.max(n);
        }
        let wm = c.checkpoint.progress.watermark();
        let o = lane.owner(inst);
        if gen >= o.seek_gen {
            o.seek_pending = false;
        }
        o.applied_wm = Some(o.applied_wm.map_or(wm, |a| a.max(wm)));
        let owner_drop_gen = o.drop_gen;
        lane.applied_gen = lane.applied_gen.max(gen);
        lane.durable = Some(written);
        lane.durable_stamp = el.stamp;
        Ok((drop_gen == owner_drop_gen)
            .then(|| (c.group.clone(), c.partition, inst, drop_gen, fresh)))
    }

    /// The selected instance's mesh was told `Persisted{ticket}`: the broker ACKs it
    /// promised are now due (C6). A repeated answer finds nothing left to do.
    pub fn persist_notified(&mut self, ticket: Ticket) {
        let incarnation = self.node().incarnation;
        let Some(em) = self.emitted.remove(&(incarnation, ticket)) else {
            return;
        };
        for (gname, p, inst, drop_gen, fresh) in em.newly_done {
            let Some(g) = self.groups.get_mut(&gname) else {
                continue;
            };
            let Some(log) = self.logs.get(&(g.topic.clone(), p)) else {
                continue;
            };
            let Some(lane) = g.lanes.get_mut(&p) else {
                continue;
            };
            if lane.owners.get(&inst).map(|o| o.drop_gen) != Some(drop_gen) {
                continue;
            }
            for (a, e) in fresh {
                for o in a..e {
                    // Only a record the broker still shows can be ACKed to it.
                    let handle = log
                        .recs
                        .get(o as usize)
                        .is_some_and(|r| r.handle && r.state == SlotState::Record);
                    if handle && !lane.is_skipped(o) {
                        let r = lane.rec(o);
                        if r.op_mask == 0 {
                            r.broker_ack_due = Some(inst);
                        }
                    }
                }
            }
        }
    }

    /// The store refused `ticket` of the selected instance (or fenced it): nothing in it
    /// counts.
    pub fn persist_failed(&mut self, ticket: Ticket) {
        let incarnation = self.node().incarnation;
        self.emitted.remove(&(incarnation, ticket));
    }

    /// [`Checker::persist_failed`] on a store that writes a batch as several records and
    /// fences at read (Kafka's progress topic): some of its checkpoints may have landed
    /// before the write failed, so they are kept, unapplied, for a reader that takes one
    /// ([`Checker::read_back`]).
    pub fn persist_failed_partly(&mut self, ticket: Ticket, batch: &PersistBatch) {
        let incarnation = self.node().incarnation;
        let Some(em) = self.emitted.remove(&(incarnation, ticket)) else {
            return;
        };
        for (i, (c, lane)) in batch.checkpoints.iter().zip(em.lanes.iter()).enumerate() {
            if let Some(lane) = lane.as_ref() {
                self.keep_unread(c, lane, em.instance, (incarnation, ticket), i, em.world_seq);
            }
        }
    }

    /// Keeps checkpoint `index` of persist `key` (incarnation, ticket) of `instance`, which
    /// the checker did not apply, for a reader that takes it ([`Checker::read_back`]); the
    /// oldest kept of the lane goes when it holds [`UNREAD_PER_LANE`].
    fn keep_unread(
        &mut self,
        c: &LaneCheckpoint,
        lane: &EmittedLane,
        instance: super::Instance,
        (incarnation, ticket): (u32, Ticket),
        index: usize,
        world_seq: u64,
    ) {
        let held = self
            .unread
            .entry((c.group.clone(), c.partition))
            .or_default();
        if held.len() >= UNREAD_PER_LANE {
            held.pop_front();
        }
        held.push_back(Unread {
            topic: c.topic.clone(),
            lane: lane.clone(),
            instance,
            incarnation,
            ticket,
            index,
            world_seq,
        });
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
    /// filtered out, absent) and not skipped by retention; or the first interval past
    /// `log_len`.
    fn first_unjustified(
        &mut self,
        fresh: &[(Offset, Offset)],
        gen: u32,
        start: Offset,
        log_len: Offset,
        justified: &mut impl FnMut(Offset) -> bool,
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
                let base = self
                    .zombie_bases
                    .get(&gen)
                    .and_then(|(done, writer_gen)| done.is_done(o).then_some(bit(*writer_gen)));
                let r = self.rec(o);
                let acked = r.acked_mask & b != 0
                    || r.op_mask & b != 0
                    || base.is_some_and(|wb| r.acked_mask & wb != 0 || r.op_mask & wb != 0);
                if !acked && !self.is_skipped(o) && !justified(o) {
                    return Some(Unjustified::NeverAcked(o));
                }
            }
        }
        None
    }
}
