//! Two `unimesh serve --storage kafka` instances sharing one subscription group under load:
//! what the failover, takeover and static-membership tests (`kafka_failover.rs`,
//! `kafka_takeover.rs`) share. Defining the group on one instance and waiting for the
//! partitions to split, publishing, polling and ACKing with a book of every delivery and
//! accepted ACK, durability barriers (`PUT /v1/subscriptions/{g}` answers once everything
//! pending, progress included, is durable), and the contract checks after a kill: C1 (every
//! published event ACKed) and C2 (nothing whose ACK was durable before the kill delivered
//! again).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::{event, json, published, Server, Value};

/// Events published per request during a load.
pub const BATCH: usize = 20;

/// The topic, the group and its partition count.
#[derive(Clone, Copy, Debug)]
pub struct Scenario {
    pub topic: &'static str,
    pub group: &'static str,
    pub partitions: u32,
}

impl Scenario {
    /// The group's definition: from the earliest record, ACK timeout 60 s (no redelivery
    /// by timeout during a test), up to 200 in flight per client.
    pub fn spec(&self) -> Value {
        json!({"topic": self.topic, "startFrom": "earliest", "ackTimeoutMs": 60000, "maxInFlightPerClient": 200})
    }

    /// The partitions of the group that `s` serves, from its own `/admin/offsets`.
    pub fn owned(&self, s: &Server) -> BTreeSet<u32> {
        s.offsets(self.topic)
            .into_iter()
            .filter(|((g, _), row)| g == self.group && row["owner"].is_string())
            .map(|((_, p), _)| p)
            .collect()
    }

    /// Waits until the instances serve disjoint sets covering every partition, each at
    /// least one; returns them.
    pub fn wait_split(&self, servers: &[&Server], timeout: Duration) -> Vec<BTreeSet<u32>> {
        crate::wait_for(
            "the partitions split between the instances",
            timeout,
            || {
                let sets: Vec<BTreeSet<u32>> = servers.iter().map(|s| self.owned(s)).collect();
                let total: usize = sets.iter().map(BTreeSet::len).sum();
                let union: BTreeSet<u32> = sets.iter().flatten().copied().collect();
                let ok = total == self.partitions as usize
                    && union.len() == self.partitions as usize
                    && sets.iter().all(|s| !s.is_empty());
                ok.then_some(sets)
            },
        )
    }

    /// Defines the group on `a` (`a` joins the Kafka group first, so it is the group's
    /// leader: the member that computes the assignment), waits until `b` has learned the
    /// definition from the subscriptions topic and the partitions are split between the
    /// two; returns what each serves.
    pub fn share(&self, a: &Server, b: &Server, timeout: Duration) -> [BTreeSet<u32>; 2] {
        a.subscribe(self.group, &self.spec());
        crate::wait_for(
            "b to learn the group from the subscriptions topic",
            timeout,
            || (b.get(&format!("/v1/subscriptions/{}", self.group)).status == 200).then_some(()),
        );
        let sets = self.wait_split(&[a, b], timeout);
        eprintln!("split: a serves {:?}, b serves {:?}", sets[0], sets[1]);
        [sets[0].clone(), sets[1].clone()]
    }
}

/// What a load saw: every event published, delivered and ACKed, by which instance.
pub struct Book {
    sc: Scenario,
    published: BTreeSet<String>,
    /// Deliveries per event id.
    deliveries: BTreeMap<String, u32>,
    /// Accepted ACKs: id → (sequence, instance).
    acked: BTreeMap<String, (u64, &'static str)>,
    /// Per instance, the ACK sequence number covered by its last durability barrier.
    barrier: BTreeMap<&'static str, u64>,
    seq: u64,
    /// ACKs refused as `revoked` (the partition moved between the poll and the ACK).
    revoked: BTreeSet<String>,
    /// Per killed instance, the ACK sequence number when it was killed.
    killed: BTreeMap<&'static str, u64>,
}

/// What the contract checks after a kill found.
#[derive(Debug)]
pub struct AfterKill {
    /// Events delivered more than once, with their delivery counts.
    pub duplicates: Vec<(String, u32)>,
    /// ACKs the killed instance answered after its last durability barrier (the bound on
    /// what may come back).
    pub acks_after_last_barrier: usize,
}

impl AfterKill {
    /// Deliveries beyond the first.
    pub fn extra_deliveries(&self) -> u32 {
        self.duplicates.iter().map(|(_, n)| n - 1).sum()
    }
}

impl Book {
    pub fn new(sc: Scenario) -> Self {
        Self {
            sc,
            published: BTreeSet::new(),
            deliveries: BTreeMap::new(),
            acked: BTreeMap::new(),
            barrier: BTreeMap::new(),
            seq: 0,
            revoked: BTreeSet::new(),
            killed: BTreeMap::new(),
        }
    }

    /// Publishes events `{prefix}-{from}` … `{prefix}-{from + n - 1}` through `s`, their
    /// partition keys spread over every partition.
    pub fn publish(&mut self, s: &Server, prefix: &str, from: usize, n: usize) {
        let events: Vec<Value> = (from..from + n)
            .map(|i| {
                let mut e = event(&format!("{prefix}-{i}"), "job.run", json!({"i": i}));
                e["partitionkey"] = json!(format!("key-{}", i % 16));
                e
            })
            .collect();
        for p in published(&s.publish_batch(self.sc.topic, &events), n) {
            self.published.insert(p.id);
        }
    }

    /// Events published with `prefix`.
    pub fn published(&self, prefix: &str) -> usize {
        self.published
            .iter()
            .filter(|id| id.starts_with(prefix))
            .count()
    }

    /// Accepted ACKs so far.
    pub fn acked(&self) -> usize {
        self.acked.len()
    }

    /// ACKs refused as revoked so far.
    pub fn revoked(&self) -> usize {
        self.revoked.len()
    }

    /// One poll on `s` (named `name`) and the ACK of everything it returned; the
    /// (partition, event id) of each delivery.
    pub fn poll_and_ack(&mut self, s: &Server, name: &'static str) -> Vec<(u32, String)> {
        let group = self.sc.group;
        let got = s.poll(group, &format!("client-{name}"), 100, 200);
        let out: Vec<(u32, String)> = got
            .iter()
            .map(|d| (d.partition, d.event_id().to_owned()))
            .collect();
        for (_, id) in &out {
            *self.deliveries.entry(id.clone()).or_default() += 1;
        }
        if got.is_empty() {
            return out;
        }
        let ids: Vec<&str> = got.iter().map(|d| d.id.as_str()).collect();
        let settled = s.ack(group, &ids);
        let rejected: BTreeMap<&str, &str> = settled
            .rejected
            .iter()
            .map(|(id, why)| (id.as_str(), why.as_str()))
            .collect();
        for d in &got {
            match rejected.get(d.id.as_str()) {
                None => {
                    self.seq += 1;
                    self.acked
                        .entry(d.event_id().to_owned())
                        .or_insert((self.seq, name));
                }
                Some(&"revoked") => {
                    self.revoked.insert(d.event_id().to_owned());
                }
                Some(other) => panic!("ACK of {} refused: {other}", d.event_id()),
            }
        }
        out
    }

    /// Notes that `name` is killed now (call it right before the kill): ACKs it answers
    /// after a restart under the same name are not in flight at the kill.
    pub fn killed(&mut self, name: &'static str) {
        self.killed.insert(name, self.seq);
    }

    /// A durability barrier on `s`: every ACK it answered so far is durable after this.
    pub fn barrier(&mut self, s: &Server, name: &'static str) {
        s.subscribe(self.sc.group, &self.sc.spec());
        self.barrier.insert(name, self.seq);
    }

    /// Load through both instances until `publish` events with `prefix` are published (in
    /// batches, through each in turn) and `acked` more ACKs accepted, with a durability
    /// barrier on `victim` every third round; then one more poll on `victim`, whose ACKs
    /// come after its last barrier (they may come back after a kill: in flight).
    pub fn load(
        &mut self,
        victim: (&Server, &'static str),
        other: (&Server, &'static str),
        prefix: &str,
        publish: usize,
        acked: usize,
    ) {
        let target = self.acked.len() + acked;
        let mut rounds = 0usize;
        while self.published(prefix) < publish || self.acked.len() < target {
            let next = self.published(prefix);
            if next < publish {
                let through = if rounds.is_multiple_of(2) {
                    victim.0
                } else {
                    other.0
                };
                self.publish(through, prefix, next, BATCH.min(publish - next));
            }
            self.poll_and_ack(victim.0, victim.1);
            self.poll_and_ack(other.0, other.1);
            rounds += 1;
            if rounds.is_multiple_of(3) {
                self.barrier(victim.0, victim.1);
            }
            assert!(rounds < 2_000, "{prefix}: no progress in the load");
        }
        self.poll_and_ack(victim.0, victim.1);
    }

    /// After a fault: publishes the rest of `total` events with `prefix` through the first
    /// of `live` in batches while polling and ACKing on each of `live` until every one is
    /// ACKed; panics after `timeout` with what is missing, the first's log and `context`.
    /// Returns the time from `since` to the first delivery of a partition in `moved`.
    #[allow(clippy::too_many_arguments)]
    pub fn drain(
        &mut self,
        live: &[(&Server, &'static str)],
        prefix: &str,
        total: usize,
        moved: &BTreeSet<u32>,
        since: Instant,
        timeout: Duration,
        context: &dyn Fn() -> String,
    ) -> Option<Duration> {
        let mut first_moved = None;
        let (publisher, name) = live[0];
        while self.published(prefix) < total || !self.all_acked(prefix) {
            let next = self.published(prefix);
            if next < total {
                self.publish(publisher, prefix, next, BATCH.min(total - next));
            }
            if since.elapsed() > timeout {
                let missing = self.missing(prefix);
                let serving: Vec<(&str, BTreeSet<u32>)> =
                    live.iter().map(|(s, n)| (*n, self.sc.owned(s))).collect();
                panic!(
                    "{prefix}: {} of {} events not ACKed {timeout:?} after the fault \
                     (serving: {serving:?}), e.g. {:?}\n--- {name} ---\n{}\n{}",
                    missing.len(),
                    self.published(prefix),
                    missing.iter().take(10).collect::<Vec<_>>(),
                    publisher.stderr(),
                    context()
                );
            }
            for &(s, n) in live {
                for (p, _) in self.poll_and_ack(s, n) {
                    if first_moved.is_none() && moved.contains(&p) {
                        first_moved = Some(since.elapsed());
                    }
                }
            }
        }
        first_moved
    }

    /// Published events with `prefix` not ACKed yet.
    pub fn missing(&self, prefix: &str) -> Vec<&String> {
        self.published
            .iter()
            .filter(|id| id.starts_with(prefix) && !self.acked.contains_key(*id))
            .collect()
    }

    /// C1: every event published with `prefix` is ACKed.
    pub fn all_acked(&self, prefix: &str) -> bool {
        self.missing(prefix).is_empty()
    }

    /// Events with `prefix` delivered more than once, with their delivery counts.
    pub fn duplicates(&self, prefix: &str) -> Vec<(String, u32)> {
        self.deliveries
            .iter()
            .filter(|(id, &n)| id.starts_with(prefix) && n > 1)
            .map(|(id, &n)| (id.clone(), n))
            .collect()
    }

    /// C2 after a kill of `dead` ([`Book::killed`]): an event with `prefix` delivered more
    /// than once must have been ACKed first by `dead` between its last durability barrier
    /// and the kill (maybe not persisted), or had an ACK refused as revoked (in flight
    /// across a rebalance); panics otherwise. (Every delivery of a load is ACKed at once,
    /// so an event's first ACK answers its first delivery.)
    pub fn check_after_kill(&self, prefix: &str, dead: &str) -> AfterKill {
        let dead_barrier = self.barrier.get(dead).copied().unwrap_or(0);
        let killed = self.killed.get(dead).copied().unwrap_or(u64::MAX);
        let duplicates = self.duplicates(prefix);
        for (id, n) in &duplicates {
            let allowed = match self.acked.get(id) {
                Some(&(seq, who)) if who == dead => {
                    (seq > dead_barrier && seq <= killed) || self.revoked.contains(id)
                }
                _ => self.revoked.contains(id),
            };
            assert!(
                allowed,
                "{id} delivered {n} times although its ACK was durable before the kill (C2)"
            );
        }
        let acks_after_last_barrier = self
            .acked
            .iter()
            .filter(|(id, &(seq, who))| {
                id.starts_with(prefix) && who == dead && seq > dead_barrier && seq <= killed
            })
            .count();
        AfterKill {
            duplicates,
            acks_after_last_barrier,
        }
    }

    /// Whether an ACK of event `id` was refused as revoked.
    pub fn was_revoked(&self, id: &str) -> bool {
        self.revoked.contains(id)
    }
}
