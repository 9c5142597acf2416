//! Draining effects: every effect a node's mesh asked for is reported to the checker and
//! carried out against the models — a fetch answered later by the broker, a delivery
//! handed to its client, a persist queued at the store (stamped by the node's shell);
//! commits (fenced when the node lost the lane without knowing), broker ACKs and skips are
//! only checked.

use unimesh_core::{
    ClientId, Delivery, Effect, FetchId, GroupName, Millis, Offset, Partition, PersistBatch,
    SkipReason, Ticket, REPLAY_PARTITION,
};

use super::queue::{Ev, FetchCall};
use super::{violation, Sim};
use crate::checker::{Clause, Violation};
use crate::model::broker::decode_handle;
use crate::model::store::Stamp;

impl Sim {
    /// Carries out every effect node `n`'s mesh asked for, checking each, then arms the
    /// next tick.
    pub(super) fn drain(&mut self, n: usize) -> Result<(), Violation> {
        let Some(mesh) = self.nodes[n].mesh.as_mut() else {
            return Ok(());
        };
        let mut effects = std::mem::take(&mut self.effects);
        while let Some(e) = mesh.poll_effect() {
            effects.push(e);
        }
        // No input is fed while effects are carried out, so the mesh's time stands still.
        let t = self.core_now(n);
        for e in effects.drain(..) {
            match e {
                Effect::BrokerAck {
                    group,
                    partition,
                    handle,
                    ..
                } => self.do_broker_ack(n, &group, partition, &handle)?,
                Effect::Commit {
                    group,
                    partition,
                    offset,
                    ..
                } => self.do_commit(n, &group, partition, offset)?,
                Effect::Deliver {
                    group,
                    client,
                    delivery,
                } => self.do_deliver(n, t, &group, &client, &delivery)?,
                Effect::Fetch {
                    group,
                    partition,
                    fetch_id,
                    from,
                    max,
                    ..
                } => self.do_fetch(n, &group, partition, fetch_id, from, max)?,
                Effect::Persist { ticket, batch } => self.do_persist(n, ticket, *batch)?,
                Effect::Skipped {
                    group,
                    partition,
                    from,
                    to,
                    reason,
                    ..
                } => self.do_skipped(n, &group, partition, from, to, reason)?,
                other => {
                    return Err(violation(Clause::Core, format!("unknown effect {other:?}")));
                }
            }
        }
        self.effects = effects;
        self.schedule_tick(n);
        Ok(())
    }

    /// A POP broker ACK: its handle names the record; a lane ACKs only its own partition.
    fn do_broker_ack(
        &mut self,
        n: usize,
        group: &GroupName,
        partition: Partition,
        handle: &[u8],
    ) -> Result<(), Violation> {
        let Some((p, o)) = decode_handle(handle) else {
            return Err(violation(
                Clause::C6,
                "broker ACK with a handle the broker never gave".into(),
            ));
        };
        self.note(
            n,
            "broker-ack",
            [0, u64::from(p), o, u64::from(partition == REPLAY_PARTITION)],
        );
        if partition != REPLAY_PARTITION && partition != p {
            return Err(violation(
                Clause::C6,
                format!("broker ACK of {p}/{o} sent for partition {partition}"),
            ));
        }
        if partition == REPLAY_PARTITION {
            self.check(n).replay_broker_acked(group, p, o)
        } else {
            self.check(n).broker_acked(group, p, o)
        }
    }

    /// A commit; in the Kafka world the broker refuses one from a node whose ownership of
    /// the lane is of an older generation than the coordinator's (a zombie's).
    fn do_commit(
        &mut self,
        n: usize,
        group: &GroupName,
        partition: Partition,
        offset: Offset,
    ) -> Result<(), Violation> {
        self.note(n, "commit", [0, u64::from(partition), offset, 0]);
        if self.kafka().is_some() {
            let lane = (self.group_index(group)?, partition);
            let current = self.nodes[n]
                .held
                .get(&lane)
                .is_some_and(|h| self.coordinator.is_current(lane, h.gen));
            if !current {
                self.faults.fenced_commits += 1;
                self.note(n, "commit-fenced", [0, u64::from(partition), offset, 0]);
                return Ok(());
            }
        }
        self.check(n).committed(group, partition, offset)
    }

    /// A delivery, at the mesh's time `t`: checked, then handed to its client.
    fn do_deliver(
        &mut self,
        n: usize,
        t: Millis,
        group: &GroupName,
        client: &ClientId,
        delivery: &Delivery,
    ) -> Result<(), Violation> {
        self.note(
            n,
            "deliver",
            [
                delivery.id.lease,
                u64::from(delivery.id.partition),
                delivery.id.offset,
                u64::from(delivery.attempt),
            ],
        );
        self.check(n).delivered(t, group, client, delivery)?;
        self.receive(n, group, client, delivery.id, &delivery.record)
    }

    /// A fetch: the broker answers it after a latency drawn from the seed.
    fn do_fetch(
        &mut self,
        n: usize,
        group: &GroupName,
        partition: Partition,
        fetch_id: FetchId,
        from: Offset,
        max: usize,
    ) -> Result<(), Violation> {
        let g = self.group_index(group)?;
        self.note(
            n,
            "fetch",
            [g as u64, u64::from(partition), from, max as u64],
        );
        let lat = self.broker_rng.range(0, self.opt.faults.fetch_latency_ms);
        self.nodes[n].fetching.insert((g, partition), fetch_id);
        let call = FetchCall {
            node: n,
            inc: self.nodes[n].inc,
            group: g,
            partition,
            fetch_id,
            from,
            max,
        };
        self.at(
            lat,
            Ev::FetchAnswer {
                call,
                waited: false,
            },
        );
        Ok(())
    }

    /// A persist: checked, stamped (Kafka world) with what the node's shell knows of each
    /// lane, then queued at the store.
    fn do_persist(
        &mut self,
        n: usize,
        ticket: Ticket,
        batch: PersistBatch,
    ) -> Result<(), Violation> {
        self.note(
            n,
            "persist",
            [
                ticket,
                batch.checkpoints.len() as u64,
                batch.dead_letters.len() as u64,
                u64::from(batch.epoch.is_some()),
            ],
        );
        self.check(n).persist_emitted(ticket, &batch)?;
        let node = &mut self.nodes[n];
        node.last_emitted = node.last_emitted.max(ticket);
        let mut stamps = Vec::new();
        if self.opt.kafka.is_some() {
            for c in &batch.checkpoints {
                let g = self
                    .groups
                    .iter()
                    .position(|g| g.name == c.group)
                    .unwrap_or(usize::MAX);
                // A lane the shell does not hold is stamped with no ownership: fenced.
                let held = self.nodes[n].held.get(&(g, c.partition)).copied();
                stamps.push(held.map_or(Stamp::default(), |h| Stamp {
                    owner_gen: h.gen,
                    leader_epoch: h.leader_epoch,
                }));
            }
        }
        self.store.submit_for(n as u32, ticket, batch, stamps);
        self.kick_store(n);
        Ok(())
    }

    fn do_skipped(
        &mut self,
        n: usize,
        group: &GroupName,
        partition: Partition,
        from: Offset,
        to: Offset,
        reason: SkipReason,
    ) -> Result<(), Violation> {
        self.note(n, "skipped", [0, u64::from(partition), from, to]);
        self.check(n).skipped(group, partition, from, to, reason)
    }
}
