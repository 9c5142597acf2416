//! Deliveries: what the mesh may hand to whom. C1 (the broker's record), C2 (nothing done
//! goes out again), C4 (fresh ids of the live epoch), C5 (attempt numbers), C7 (the group's
//! topic, filter, partitions and key order) and C8 (credit and the in-flight bound).

use unimesh_core::{
    ClientId, Delivery, DeliveryId, Epoch, GroupName, Millis, Offset, Ordering, Partition,
    RecordMeta, REPLAY_PARTITION,
};

use super::state::{GroupState, Held, Issued, LaneState, Rec};
use super::{fail, Check, Checker, CheckerStats, Clause, Violation};

impl Checker {
    /// A client asked for `max` deliveries (absolute). `accepted`: the mesh took the poll.
    pub fn client_poll(&mut self, group: &GroupName, client: &ClientId, max: u32, accepted: bool) {
        if let Some(g) = self.groups.get_mut(group) {
            if accepted {
                g.credit.insert(client.clone(), max);
            }
        }
    }

    /// The mesh forgot `client` (gone, idle): its credit and deliveries end.
    pub fn client_gone(&mut self, now: Millis, group: &GroupName, client: &ClientId) {
        self.tick(now);
        if let Some(g) = self.groups.get_mut(group) {
            g.credit.remove(client);
            g.inflight.retain(|_, h| h.client != *client);
        }
    }

    /// The mesh handed `delivery` to `client`.
    pub fn delivered(
        &mut self,
        now: Millis,
        group: &GroupName,
        client: &ClientId,
        d: &Delivery,
    ) -> Check {
        self.tick(now);
        let now = self.now;
        self.stats.deliveries += 1;
        let id = d.id;
        let at = format!("{group} {id} to {client}");
        self.check_delivery_id(&at, d)?;
        self.check_delivered_record(&at, group, d)?;
        let (origin, o) = (d.partition, d.record.offset);
        let key = d.record.partition_key().map(str::to_owned);
        let epoch = self.epoch;
        let g = self.groups.get_mut(group).ok_or_else(|| Violation {
            clause: Clause::C7,
            message: format!("{at}: group vanished"),
        })?;
        let (max_attempts, ack_timeout, ordering) = (g.max_attempts, g.ack_timeout_ms, g.ordering);
        let slot = (id.partition, id.offset);
        g.take_credit(&at, client, slot, now)?;
        if d.attempt == 0 || d.attempt > max_attempts {
            return fail(
                Clause::C5,
                format!("{at}: attempt {} outside 1..={max_attempts}", d.attempt),
            );
        }
        if id.partition == REPLAY_PARTITION {
            g.deliver_replay(&at, d)?;
        } else {
            if origin != id.partition || o != id.offset {
                return fail(
                    Clause::C1,
                    format!("{at}: carries record {origin}/{o}, not the id's position"),
                );
            }
            let lane = g.lanes.entry(id.partition).or_default();
            lane.deliver(&at, d, epoch, ordering, key.as_deref(), &mut self.stats)?;
            if ordering == Ordering::Key {
                g.check_key_clash(&at, id, key.as_deref(), now)?;
            }
        }
        g.inflight.insert(
            slot,
            Held {
                id,
                client: client.clone(),
                deadline: now + ack_timeout,
                key,
            },
        );
        self.issued.insert(
            id,
            Issued {
                incarnation: self.incarnation,
                group: group.clone(),
                origin,
                offset: o,
            },
        );
        Ok(())
    }

    /// C4: ids carry the live incarnation's epoch, which is durable first, and never repeat;
    /// C5: the id's attempt is the delivery's.
    fn check_delivery_id(&self, at: &str, d: &Delivery) -> Check {
        let id = d.id;
        if !self.alive {
            return fail(
                Clause::C4,
                format!("{at}: delivery while no incarnation is alive"),
            );
        }
        if id.epoch != self.epoch {
            return fail(
                Clause::C4,
                format!(
                    "{at}: id carries epoch {} in incarnation of epoch {}",
                    id.epoch, self.epoch
                ),
            );
        }
        if self.durable_epoch < self.epoch {
            return fail(
                Clause::C4,
                format!("{at}: delivered before epoch {} was durable", self.epoch),
            );
        }
        if let Some(prev) = self.issued.get(&id) {
            return fail(
                Clause::C4,
                format!(
                    "{at}: delivery id already issued (incarnation {}, now {})",
                    prev.incarnation, self.incarnation
                ),
            );
        }
        if id.attempt != d.attempt {
            return fail(
                Clause::C5,
                format!("{at}: attempt {} != id attempt", d.attempt),
            );
        }
        Ok(())
    }

    /// C1: the record is the broker's record at its position; C7: of the group's topic and
    /// matching its filter.
    fn check_delivered_record(&self, at: &str, group: &GroupName, d: &Delivery) -> Check {
        let (origin, o) = (d.partition, d.record.offset);
        let Some(g) = self.groups.get(group) else {
            return fail(Clause::C7, format!("{at}: delivery for an unknown group"));
        };
        if d.topic != g.topic {
            return fail(
                Clause::C7,
                format!("{at}: topic {} is not the group's", d.topic),
            );
        }
        let Some(log) = self.logs.get(&(g.topic.clone(), origin)) else {
            return fail(Clause::C1, format!("{at}: no such partition {origin}"));
        };
        let same = log
            .recs
            .get(o as usize)
            .is_some_and(|r| match (&r.meta, &d.record.meta) {
                (RecordMeta::Event(a), RecordMeta::Event(b)) => a.id == b.id,
                _ => false,
            });
        if !same {
            return fail(
                Clause::C1,
                format!("{at}: record {origin}/{o} is not the broker's record there"),
            );
        }
        if self.matches(g, origin, o) != Some(true) {
            return fail(
                Clause::C7,
                format!("{at}: record {origin}/{o} does not match the group's filter"),
            );
        }
        Ok(())
    }
}

impl GroupState {
    /// C8: the client had credit left (one is used) and holds fewer than the in-flight
    /// bound of unexpired deliveries besides the one in `slot`.
    fn take_credit(
        &mut self,
        at: &str,
        client: &ClientId,
        slot: (Partition, Offset),
        now: Millis,
    ) -> Check {
        let credit = self.credit.get(client).copied().unwrap_or(0);
        if credit == 0 {
            return fail(Clause::C8, format!("{at}: client had no credit left"));
        }
        self.credit.insert(client.clone(), credit - 1);
        let held = self
            .inflight
            .iter()
            .filter(|(k, h)| h.client == *client && h.deadline > now && **k != slot)
            .count() as u32;
        if held >= self.max_in_flight {
            return fail(
                Clause::C8,
                format!(
                    "{at}: client already holds {held} of at most {}",
                    self.max_in_flight
                ),
            );
        }
        Ok(())
    }

    /// A delivery from the replay lane: C2 not after its ACK, C5 attempts in sequence.
    fn deliver_replay(&mut self, at: &str, d: &Delivery) -> Check {
        let id = d.id;
        let s = self
            .replay
            .entry((id.epoch, id.lease, id.offset))
            .or_default();
        if s.done {
            return fail(
                Clause::C2,
                format!("{at}: replayed record delivered after its ACK"),
            );
        }
        if d.attempt != s.attempt + 1 {
            return fail(
                Clause::C5,
                format!(
                    "{at}: replay attempt {} after attempt {}",
                    d.attempt, s.attempt
                ),
            );
        }
        s.attempt = d.attempt;
        let lane = self.lanes.entry(d.partition).or_default();
        let r = lane.rec(d.record.offset);
        r.max_attempt_any = r.max_attempt_any.max(d.attempt);
        r.deliveries += 1;
        Ok(())
    }

    /// Key order: no other record of the key is in flight (unexpired) in the same lane.
    fn check_key_clash(&self, at: &str, id: DeliveryId, key: Option<&str>, now: Millis) -> Check {
        let Some(k) = key else {
            return Ok(());
        };
        let clash = self.inflight.iter().find(|(&(lp, lo), h)| {
            lp == id.partition && lo != id.offset && h.deadline > now && h.key.as_deref() == Some(k)
        });
        if let Some((&(_, other), _)) = clash {
            return fail(
                Clause::C7,
                format!("{at}: key {k} is also in flight at offset {other}"),
            );
        }
        Ok(())
    }
}

impl LaneState {
    /// A delivery from this lane (not the replay lane) in the incarnation of `epoch`.
    fn deliver(
        &mut self,
        at: &str,
        d: &Delivery,
        epoch: Epoch,
        ordering: Ordering,
        key: Option<&str>,
        stats: &mut CheckerStats,
    ) -> Check {
        let (id, o) = (d.id, d.record.offset);
        if !self.assigned {
            return fail(
                Clause::C7,
                format!("{at}: delivery from a partition the group does not own (#5360)"),
            );
        }
        if id.lease < self.revoked_below {
            return fail(Clause::C4, format!("{at}: delivery under a revoked lease"));
        }
        self.max_lease = self.max_lease.max(id.lease);
        // C2: nothing durably done is delivered again (except after an operator seek).
        if !self.seek_pending && self.durable_done(o) {
            return fail(
                Clause::C2,
                format!("{at}: record is done in the persisted checkpoint"),
            );
        }
        // C5: a redelivery's attempt number is durable before it goes out.
        if d.attempt >= 2 {
            let durable = self.durable.as_ref().map_or(0, |c| c.attempts_of(o));
            if durable < d.attempt {
                return fail(
                    Clause::C5,
                    format!(
                        "{at}: attempt {} handed out while the durable ledger says {durable}",
                        d.attempt
                    ),
                );
            }
        }
        // Key order: within a lease, a key's records go out in offset order.
        if ordering == Ordering::Key {
            if let Some(k) = key {
                if let Some(&(lease, last)) = self.key_last.get(k) {
                    if lease == id.lease && o < last {
                        return fail(
                            Clause::C7,
                            format!("{at}: key {k} delivered {o} after {last}"),
                        );
                    }
                }
                self.key_last.insert(k.to_owned(), (id.lease, o));
            }
        }
        let resets = self.resets;
        let r = self.rec(o);
        if r.done_in == Some((epoch, id.lease)) {
            return fail(
                Clause::C2,
                format!("{at}: record was already ACKed in this lane"),
            );
        }
        r.count_attempt(at, d.attempt, resets, stats)
    }
}

impl Rec {
    /// C2/C5: a first attempt again only after a reset (crash, rebalance) and never after a
    /// later attempt; a later attempt exceeds every attempt delivered before.
    fn count_attempt(
        &mut self,
        at: &str,
        attempt: u32,
        resets: u32,
        stats: &mut CheckerStats,
    ) -> Check {
        if attempt == 1 {
            if self.first_count > 0 {
                if self.had_ge2 {
                    return fail(
                        Clause::C5,
                        format!(
                            "{at}: first attempt again after attempt {} was delivered",
                            self.max_attempt
                        ),
                    );
                }
                if resets <= self.first_reset {
                    return fail(
                        Clause::C2,
                        format!("{at}: first attempt repeated without a crash or rebalance"),
                    );
                }
                stats.repeated_first_attempts += 1;
            } else {
                stats.first_deliveries += 1;
            }
            self.first_count += 1;
            self.first_reset = resets;
        } else if attempt <= self.max_attempt {
            return fail(
                Clause::C5,
                format!(
                    "{at}: attempt {attempt} does not exceed attempt {} delivered before",
                    self.max_attempt
                ),
            );
        } else {
            self.had_ge2 = true;
        }
        self.max_attempt = self.max_attempt.max(attempt);
        self.max_attempt_any = self.max_attempt_any.max(attempt);
        self.deliveries += 1;
        Ok(())
    }
}
