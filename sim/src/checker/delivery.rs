//! Deliveries: what the mesh may hand to whom. C1 (the broker's record, or one it lost
//! that the lane does not know is lost yet), C2 (nothing done goes out again), C4 (fresh
//! ids of the live epoch), C5 (attempt numbers), C7 (the group's topic, filter, partitions
//! and key order) and C8 (credit and the in-flight bound) — per instance; a zombie's
//! deliveries (see "Several instances" in [`super`]) are allowed duplicates.

use unimesh_core::{
    Checkpoint, ClientId, Delivery, DeliveryId, DlqKey, GroupName, Millis, Offset, Ordering,
    Partition, RecordMeta, REPLAY_PARTITION,
};

use super::state::{GroupState, Held, Issued, Owner, Rec};
use super::world::wanted;
use super::{fail, Check, Checker, CheckerStats, Clause, Instance, Violation};

/// Which record a delivery carries.
#[derive(Clone, Copy, Debug)]
struct Carried {
    serial: u64,
    /// The broker lost it, in this truncation (index into the log's).
    lost_in: Option<usize>,
}

impl Checker {
    /// A client asked the selected instance for `max` deliveries (absolute). `accepted`:
    /// the mesh took the poll.
    pub fn client_poll(&mut self, group: &GroupName, client: &ClientId, max: u32, accepted: bool) {
        let inst = self.current;
        if let Some(g) = self.groups.get_mut(group) {
            if accepted {
                g.credit.insert((inst, client.clone()), max);
            }
        }
    }

    /// The selected instance's mesh forgot `client` (gone, idle): its credit and
    /// deliveries there end.
    pub fn client_gone(&mut self, now: Millis, group: &GroupName, client: &ClientId) {
        self.tick(now);
        let inst = self.current;
        if let Some(g) = self.groups.get_mut(group) {
            g.credit.remove(&(inst, client.clone()));
            g.inflight
                .retain(|(i, _, _), h| !(*i == inst && h.client == *client));
        }
    }

    /// The selected instance's mesh handed `delivery` to `client`.
    pub fn delivered(
        &mut self,
        now: Millis,
        group: &GroupName,
        client: &ClientId,
        d: &Delivery,
    ) -> Check {
        let now = self.tick(now);
        let inst = self.current;
        self.stats.deliveries += 1;
        let id = d.id;
        let at = format!("{group} {id} to {client} (instance {inst})");
        self.check_delivery_id(&at, d)?;
        let carried = self.check_delivered_record(&at, group, d)?;
        let (origin, o) = (d.partition, d.record.offset);
        let key = d.record.partition_key().map(str::to_owned);
        let (epoch, incarnation) = {
            let n = self.node();
            (n.epoch, n.incarnation)
        };
        let g = self.groups.get_mut(group).ok_or_else(|| Violation {
            clause: Clause::C7,
            message: format!("{at}: group vanished"),
        })?;
        let (max_attempts, ack_timeout, ordering) = (g.max_attempts, g.ack_timeout_ms, g.ordering);
        let slot = (inst, id.partition, id.offset);
        g.take_credit(&at, inst, client, slot, now)?;
        if d.attempt == 0 || d.attempt > max_attempts {
            return fail(
                Clause::C5,
                format!("{at}: attempt {} outside 1..={max_attempts}", d.attempt),
            );
        }
        if id.partition == REPLAY_PARTITION {
            g.deliver_replay(&at, inst, d, carried)?;
            let key = DlqKey {
                group: group.clone(),
                partition: origin,
                offset: o,
            };
            self.replayed.insert((inst, key), carried.serial);
        } else {
            if origin != id.partition || o != id.offset {
                return fail(
                    Clause::C1,
                    format!("{at}: carries record {origin}/{o}, not the id's position"),
                );
            }
            let lane = g.lanes.entry(id.partition).or_default();
            let (lane_stamp, resets) = (lane.owner_stamp, lane.resets);
            let (zombie, knows, seek_pending) = {
                let owner = lane.owner(inst);
                owner.deliver(&at, d, ordering, key.as_deref())?;
                (owner.fenced(lane_stamp), owner.knows, owner.seek_pending)
            };
            if let Some(t) = carried.lost_in {
                // The broker lost the record: only a lane that has not fetched since may
                // still hold it.
                if knows > t {
                    return fail(
                        Clause::C1,
                        format!(
                            "{at}: record {o} was lost by the broker, which the lane already knew"
                        ),
                    );
                }
                self.stats.lost_deliveries += 1;
            } else if zombie {
                self.stats.zombie_deliveries += 1;
                let seen = &mut lane.rec(o).zombie_attempts;
                match seen.iter_mut().find(|(i, _)| *i == inst) {
                    Some((_, a)) => *a = (*a).max(d.attempt),
                    None => seen.push((inst, d.attempt)),
                }
            } else {
                if lane.rec(o).done_in == Some((inst, epoch, id.lease)) {
                    return fail(
                        Clause::C2,
                        format!("{at}: record was already ACKed in this lane"),
                    );
                }
                check_against_durable(&at, d, seek_pending, lane.durable.as_ref())?;
                lane.rec(o)
                    .count_attempt(&at, d.attempt, resets, &mut self.stats)?;
            }
            if ordering == Ordering::Key {
                g.check_key_clash(&at, inst, id, key.as_deref(), now)?;
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
            (inst, id),
            Issued {
                incarnation,
                group: group.clone(),
                origin,
                offset: o,
                serial: carried.serial,
            },
        );
        Ok(())
    }

    /// C4: ids carry the live incarnation's epoch, which is durable first, and never repeat
    /// on their instance; C5: the id's attempt is the delivery's.
    fn check_delivery_id(&mut self, at: &str, d: &Delivery) -> Check {
        let id = d.id;
        let inst = self.current;
        let n = self.node().clone();
        if !n.alive {
            return fail(
                Clause::C4,
                format!("{at}: delivery while no incarnation is alive"),
            );
        }
        if id.epoch != n.epoch {
            return fail(
                Clause::C4,
                format!(
                    "{at}: id carries epoch {} in incarnation of epoch {}",
                    id.epoch, n.epoch
                ),
            );
        }
        if n.durable_epoch < n.epoch {
            return fail(
                Clause::C4,
                format!("{at}: delivered before epoch {} was durable", n.epoch),
            );
        }
        if let Some(prev) = self.issued.get(&(inst, id)) {
            return fail(
                Clause::C4,
                format!(
                    "{at}: delivery id already issued (incarnation {}, now {}; record {}/{})",
                    prev.incarnation, n.incarnation, prev.origin, prev.offset
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

    /// C1: the record is the broker's record at its position (or was, before the broker
    /// lost it); C7: of the group's topic and matching its filter.
    fn check_delivered_record(
        &self,
        at: &str,
        group: &GroupName,
        d: &Delivery,
    ) -> Result<Carried, Violation> {
        let (origin, o) = (d.partition, d.record.offset);
        let Some(g) = self.groups.get(group) else {
            return Err(Violation {
                clause: Clause::C7,
                message: format!("{at}: delivery for an unknown group"),
            });
        };
        if d.topic != g.topic {
            return Err(Violation {
                clause: Clause::C7,
                message: format!("{at}: topic {} is not the group's", d.topic),
            });
        }
        let Some(log) = self.logs.get(&(g.topic.clone(), origin)) else {
            return Err(Violation {
                clause: Clause::C1,
                message: format!("{at}: no such partition {origin}"),
            });
        };
        let Some((serial, lost_in)) = log.identify(o, &d.record.meta) else {
            return Err(Violation {
                clause: Clause::C1,
                message: format!("{at}: record {origin}/{o} is not the broker's record there"),
            });
        };
        if !wanted(g, &d.record.meta) || matches!(d.record.meta, RecordMeta::Undecodable(_)) {
            return Err(Violation {
                clause: Clause::C7,
                message: format!("{at}: record {origin}/{o} does not match the group's filter"),
            });
        }
        Ok(Carried { serial, lost_in })
    }
}

/// C2: nothing durably done is delivered again (except after an operator seek); C5: a
/// redelivery's attempt number is durable before it goes out.
fn check_against_durable(
    at: &str,
    d: &Delivery,
    seek_pending: bool,
    durable: Option<&Checkpoint>,
) -> Check {
    let o = d.record.offset;
    if !seek_pending && durable.as_ref().is_some_and(|c| c.progress.is_done(o)) {
        return fail(
            Clause::C2,
            format!("{at}: record is done in the persisted checkpoint"),
        );
    }
    if d.attempt >= 2 {
        let have = durable.as_ref().map_or(0, |c| c.attempts_of(o));
        if have < d.attempt {
            return fail(
                Clause::C5,
                format!(
                    "{at}: attempt {} handed out while the durable ledger says {have}",
                    d.attempt
                ),
            );
        }
    }
    Ok(())
}

impl GroupState {
    /// C8: the client had credit left at the instance (one is used) and holds fewer than
    /// the in-flight bound of unexpired deliveries of that instance besides the one in
    /// `slot`.
    fn take_credit(
        &mut self,
        at: &str,
        inst: Instance,
        client: &ClientId,
        slot: (Instance, Partition, Offset),
        now: Millis,
    ) -> Check {
        let key = (inst, client.clone());
        let credit = self.credit.get(&key).copied().unwrap_or(0);
        if credit == 0 {
            return fail(Clause::C8, format!("{at}: client had no credit left"));
        }
        self.credit.insert(key, credit - 1);
        let held = self
            .inflight
            .iter()
            .filter(|(k, h)| k.0 == inst && h.client == *client && h.deadline > now && **k != slot)
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
    fn deliver_replay(
        &mut self,
        at: &str,
        inst: Instance,
        d: &Delivery,
        carried: Carried,
    ) -> Check {
        let id = d.id;
        let s = self
            .replay
            .entry((inst, id.epoch, id.lease, id.offset))
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
        if carried.lost_in.is_none() {
            let lane = self.lanes.entry(d.partition).or_default();
            let r = lane.rec(d.record.offset);
            r.max_attempt_any = r.max_attempt_any.max(d.attempt);
            r.deliveries += 1;
        }
        Ok(())
    }

    /// Key order: no other record of the key is in flight (unexpired) in the same lane of
    /// the same instance.
    fn check_key_clash(
        &self,
        at: &str,
        inst: Instance,
        id: DeliveryId,
        key: Option<&str>,
        now: Millis,
    ) -> Check {
        let Some(k) = key else {
            return Ok(());
        };
        let clash = self.inflight.iter().find(|(&(i, lp, lo), h)| {
            i == inst
                && lp == id.partition
                && lo != id.offset
                && h.deadline > now
                && h.key.as_deref() == Some(k)
        });
        if let Some((&(_, _, other), _)) = clash {
            return fail(
                Clause::C7,
                format!("{at}: key {k} is also in flight at offset {other}"),
            );
        }
        Ok(())
    }
}

impl Owner {
    /// A delivery from this instance's lane (not the replay lane): C7 the lane is held,
    /// C4 under a live lease, key order within the lease.
    fn deliver(&mut self, at: &str, d: &Delivery, ordering: Ordering, key: Option<&str>) -> Check {
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
        self.delivered_end = self.delivered_end.max(o + 1);
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
        Ok(())
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
