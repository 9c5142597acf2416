//! Draining effects: every effect the mesh asked for is reported to the checker and carried
//! out against the models — a fetch answered later by the broker, a delivery handed to its
//! client, a persist queued at the store; commits, broker ACKs and skips are only checked.

use unimesh_core::{
    ClientId, Delivery, Effect, FetchId, GroupName, Millis, Offset, Partition, PersistBatch,
    SkipReason, Ticket, REPLAY_PARTITION,
};

use super::queue::{Ev, FetchCall};
use super::{violation, Sim};
use crate::checker::{Clause, Violation};
use crate::model::broker::decode_handle;

impl Sim {
    /// Carries out every effect the mesh asked for, checking each, then arms the next tick.
    pub(super) fn drain(&mut self) -> Result<(), Violation> {
        let Some(mesh) = self.mesh.as_mut() else {
            return Ok(());
        };
        let mut effects = std::mem::take(&mut self.effects);
        while let Some(e) = mesh.poll_effect() {
            effects.push(e);
        }
        // No input is fed while effects are carried out, so the mesh's time stands still.
        let t = self.core_now();
        for e in effects.drain(..) {
            match e {
                Effect::BrokerAck {
                    group,
                    partition,
                    handle,
                    ..
                } => self.do_broker_ack(&group, partition, &handle)?,
                Effect::Commit {
                    group,
                    partition,
                    offset,
                    ..
                } => self.do_commit(&group, partition, offset)?,
                Effect::Deliver {
                    group,
                    client,
                    delivery,
                } => self.do_deliver(t, &group, &client, &delivery)?,
                Effect::Fetch {
                    group,
                    partition,
                    fetch_id,
                    from,
                    max,
                    ..
                } => self.do_fetch(&group, partition, fetch_id, from, max)?,
                Effect::Persist { ticket, batch } => self.do_persist(ticket, *batch)?,
                Effect::Skipped {
                    group,
                    partition,
                    from,
                    to,
                    reason,
                    ..
                } => self.do_skipped(&group, partition, from, to, reason)?,
                other => {
                    return Err(violation(Clause::Core, format!("unknown effect {other:?}")));
                }
            }
        }
        self.effects = effects;
        self.schedule_tick();
        Ok(())
    }

    /// A POP broker ACK: its handle names the record; a lane ACKs only its own partition.
    fn do_broker_ack(
        &mut self,
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
            self.checker.replay_broker_acked(group, p, o)
        } else {
            self.checker.broker_acked(group, p, o)
        }
    }

    fn do_commit(
        &mut self,
        group: &GroupName,
        partition: Partition,
        offset: Offset,
    ) -> Result<(), Violation> {
        self.note("commit", [0, u64::from(partition), offset, 0]);
        self.checker.committed(group, partition, offset)
    }

    /// A delivery, at the mesh's time `t`: checked, then handed to its client.
    fn do_deliver(
        &mut self,
        t: Millis,
        group: &GroupName,
        client: &ClientId,
        delivery: &Delivery,
    ) -> Result<(), Violation> {
        self.note(
            "deliver",
            [
                delivery.id.lease,
                u64::from(delivery.id.partition),
                delivery.id.offset,
                u64::from(delivery.attempt),
            ],
        );
        self.checker.delivered(t, group, client, delivery)?;
        self.receive(group, client, delivery.id, &delivery.record)
    }

    /// A fetch: the broker answers it after a latency drawn from the seed.
    fn do_fetch(
        &mut self,
        group: &GroupName,
        partition: Partition,
        fetch_id: FetchId,
        from: Offset,
        max: usize,
    ) -> Result<(), Violation> {
        let g = self.group_index(group)?;
        self.note("fetch", [g as u64, u64::from(partition), from, max as u64]);
        let lat = self.broker_rng.range(0, self.opt.faults.fetch_latency_ms);
        let call = FetchCall {
            inc: self.inc,
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

    /// A persist: checked, then queued at the store.
    fn do_persist(&mut self, ticket: Ticket, batch: PersistBatch) -> Result<(), Violation> {
        self.note(
            "persist",
            [
                ticket,
                batch.checkpoints.len() as u64,
                batch.dead_letters.len() as u64,
                u64::from(batch.epoch.is_some()),
            ],
        );
        self.checker.persist_emitted(ticket, &batch)?;
        self.last_emitted = self.last_emitted.max(ticket);
        self.store.submit(ticket, batch);
        self.kick_store();
        Ok(())
    }

    fn do_skipped(
        &mut self,
        group: &GroupName,
        partition: Partition,
        from: Offset,
        to: Offset,
        reason: SkipReason,
    ) -> Result<(), Violation> {
        self.note("skipped", [0, u64::from(partition), from, to]);
        self.checker.skipped(group, partition, from, to, reason)
    }
}
