//! A small, synchronous world for driving one `Mesh` in tests: an in-memory partitioned log,
//! a store that applies `Persist` batches (immediately or when told), and a record of every
//! effect. Time moves only when a test says so.

#![allow(dead_code)]

use std::collections::{BTreeMap, VecDeque};

use bytes::Bytes;
use unimesh_core::*;

pub fn group(s: &str) -> GroupName {
    GroupName::new(s).unwrap()
}
pub fn topic(s: &str) -> TopicName {
    TopicName::new(s).unwrap()
}
pub fn client(s: &str) -> ClientId {
    ClientId::new(s).unwrap()
}

pub fn event(offset: Offset, ty: &str, key: Option<&str>) -> Record {
    Record::event(
        offset,
        EventMeta {
            id: format!("id-{offset}"),
            source: "/test".into(),
            ty: ty.into(),
            subject: None,
            partition_key: key.map(str::to_owned),
            extensions: vec![],
        },
        Bytes::from(format!("payload-{offset}")),
    )
}

/// What the store holds: the same shape a real state store keeps.
#[derive(Clone, Debug, Default)]
pub struct Store {
    pub epoch: Epoch,
    pub subscriptions: BTreeMap<GroupName, SubscriptionSpec>,
    pub checkpoints: BTreeMap<(GroupName, Partition), Checkpoint>,
    pub dlq: BTreeMap<(GroupName, Partition, Offset), DeadLetter>,
    /// How many times each DLQ key was written (to prove exactly-once).
    pub dlq_writes: BTreeMap<(GroupName, Partition, Offset), u32>,
}

impl Store {
    pub fn apply(&mut self, batch: &PersistBatch) {
        for g in &batch.removed_groups {
            self.subscriptions.remove(g);
            self.checkpoints.retain(|(gg, _), _| gg != g);
            self.dlq.retain(|(gg, _, _), _| gg != g);
        }
        for s in &batch.subscriptions {
            self.subscriptions.insert(s.group.clone(), s.clone());
        }
        for c in &batch.checkpoints {
            self.checkpoints
                .insert((c.group.clone(), c.partition), c.checkpoint.clone());
        }
        for d in &batch.dead_letters {
            let k = (d.key.group.clone(), d.key.partition, d.key.offset);
            if !self.dlq.contains_key(&k) {
                *self.dlq_writes.entry(k.clone()).or_default() += 1;
            }
            self.dlq.insert(k, d.clone());
        }
        for k in &batch.dlq_resolved {
            self.dlq.remove(&(k.group.clone(), k.partition, k.offset));
        }
        if let Some(e) = batch.epoch {
            self.epoch = e;
        }
    }

    pub fn recovered(&self) -> Recovered {
        Recovered {
            epoch: self.epoch,
            subscriptions: self.subscriptions.values().cloned().collect(),
            checkpoints: self
                .checkpoints
                .iter()
                .map(|((g, p), c)| (g.clone(), *p, c.clone()))
                .collect(),
        }
    }
}

pub struct World {
    pub mesh: Mesh,
    pub now: Millis,
    pub config: MeshConfig,
    /// topic -> partitions -> records
    pub log: BTreeMap<TopicName, Vec<Vec<Record>>>,
    pub earliest: BTreeMap<(TopicName, Partition), Offset>,
    pub store: Store,
    /// Persists not yet applied (when `auto_persist` is off), in ticket order.
    pub pending_persists: VecDeque<(Ticket, Box<PersistBatch>)>,
    pub auto_persist: bool,
    /// Fetches waiting for data: (group, topic, partition, fetch_id, from, max).
    pub parked: Vec<(GroupName, TopicName, Partition, FetchId, Offset, usize)>,
    pub deliveries: Vec<(GroupName, ClientId, Delivery)>,
    pub commits: Vec<(GroupName, Partition, Offset)>,
    pub skipped: Vec<Effect>,
    pub broker_acks: Vec<Bytes>,
    pub fetches_seen: usize,
}

impl World {
    pub fn new(config: MeshConfig) -> Self {
        let mesh = Mesh::new(config.clone(), Recovered::default(), 0).unwrap();
        let mut w = World {
            mesh,
            now: 0,
            config,
            log: BTreeMap::new(),
            earliest: BTreeMap::new(),
            store: Store::default(),
            pending_persists: VecDeque::new(),
            auto_persist: true,
            parked: Vec::new(),
            deliveries: Vec::new(),
            commits: Vec::new(),
            skipped: Vec::new(),
            broker_acks: Vec::new(),
            fetches_seen: 0,
        };
        w.mesh.check_every_step = true;
        w.pump();
        w
    }

    /// A config small enough to make edge cases easy to reach.
    pub fn small_config() -> MeshConfig {
        MeshConfig {
            flush_interval_ms: 10,
            fetch_batch: 16,
            max_window_per_lane: 64,
            ..MeshConfig::default()
        }
    }

    pub fn topic(&mut self, t: &str, partitions: u32) {
        self.log
            .entry(topic(t))
            .or_insert_with(|| vec![Vec::new(); partitions as usize]);
    }

    pub fn publish(
        &mut self,
        t: &str,
        partition: Partition,
        ty: &str,
        key: Option<&str>,
    ) -> Offset {
        let parts = self.log.get_mut(&topic(t)).expect("topic exists");
        let p = &mut parts[partition as usize];
        let offset = p.len() as Offset;
        p.push(event(offset, ty, key));
        self.pump();
        offset
    }

    pub fn publish_raw(&mut self, t: &str, partition: Partition, record: Record) {
        let parts = self.log.get_mut(&topic(t)).expect("topic exists");
        parts[partition as usize].push(record);
        self.pump();
    }

    pub fn handle(&mut self, input: Input) -> Response {
        let r = self.mesh.handle(self.now, input);
        self.pump();
        r
    }

    pub fn subscribe(&mut self, spec: SubscriptionSpec) {
        let t = spec.topic.clone();
        let g = spec.group.clone();
        assert_eq!(self.handle(Input::Subscribe(spec)), Response::Ok);
        let n = self.log.get(&t).map_or(1, |p| p.len() as u32);
        let partitions = (0..n)
            .map(|p| Assignment {
                partition: p,
                earliest: 0,
                end: self.log.get(&t).map_or(0, |ps| ps[p as usize].len() as u64),
                checkpoint: None,
            })
            .collect();
        assert_eq!(
            self.handle(Input::PartitionsAssigned {
                group: g,
                partitions
            }),
            Response::Ok
        );
    }

    pub fn spec(&self, g: &str, t: &str) -> SubscriptionSpec {
        SubscriptionSpec::new(group(g), topic(t))
    }

    pub fn poll(&mut self, g: &str, c: &str, max: u32) -> Vec<Delivery> {
        let before = self.deliveries.len();
        let r = self.handle(Input::ClientPoll {
            group: group(g),
            client: client(c),
            max,
        });
        assert_eq!(r, Response::Ok);
        self.deliveries[before..]
            .iter()
            .map(|(_, _, d)| d.clone())
            .collect()
    }

    /// Deliveries handed out since index `from`.
    pub fn delivered_since(&self, from: usize) -> Vec<Delivery> {
        self.deliveries[from..]
            .iter()
            .map(|(_, _, d)| d.clone())
            .collect()
    }

    pub fn ack(&mut self, g: &str, ids: &[DeliveryId]) -> Vec<Settle> {
        match self.handle(Input::Ack {
            group: group(g),
            ids: ids.to_vec(),
        }) {
            Response::Settled(s) => s,
            other => panic!("ack answered {other:?}"),
        }
    }

    pub fn nack(&mut self, g: &str, ids: &[DeliveryId], delay_ms: Option<Millis>) -> Vec<Settle> {
        match self.handle(Input::Nack {
            group: group(g),
            ids: ids.to_vec(),
            delay_ms,
        }) {
            Response::Settled(s) => s,
            other => panic!("nack answered {other:?}"),
        }
    }

    /// Moves time forward in steps of at most `step` so every timer fires at its time.
    pub fn advance(&mut self, ms: Millis) {
        let end = self.now + ms;
        loop {
            let next = self.mesh.poll_timeout().filter(|&t| t <= end);
            match next {
                Some(t) => {
                    self.now = self.now.max(t);
                    let _ = self.handle(Input::Tick);
                }
                None => break,
            }
        }
        self.now = end;
        let _ = self.handle(Input::Tick);
    }

    /// Applies every pending persist, in order.
    pub fn persist_all(&mut self) {
        while let Some((ticket, batch)) = self.pending_persists.pop_front() {
            self.store.apply(&batch);
            let _ = self.mesh.handle(self.now, Input::Persisted { ticket });
            self.drain();
        }
        self.pump();
    }

    /// Simulates a crash: every persist not applied is lost; a new mesh starts from the store.
    pub fn crash_and_restart(&mut self) {
        self.pending_persists.clear();
        self.parked.clear();
        self.mesh = Mesh::new(self.config.clone(), self.store.recovered(), self.now).unwrap();
        self.mesh.check_every_step = true;
        self.pump();
        let groups: Vec<SubscriptionSpec> = self.store.subscriptions.values().cloned().collect();
        for spec in groups {
            let n = self.log.get(&spec.topic).map_or(1, |p| p.len() as u32);
            let partitions = (0..n)
                .map(|p| Assignment {
                    partition: p,
                    earliest: *self.earliest.get(&(spec.topic.clone(), p)).unwrap_or(&0),
                    end: self
                        .log
                        .get(&spec.topic)
                        .map_or(0, |ps| ps[p as usize].len() as u64),
                    checkpoint: None,
                })
                .collect();
            let _ = self.handle(Input::PartitionsAssigned {
                group: spec.group.clone(),
                partitions,
            });
        }
    }

    fn drain(&mut self) {
        while let Some(e) = self.mesh.poll_effect() {
            match e {
                Effect::Fetch {
                    group,
                    topic,
                    partition,
                    fetch_id,
                    from,
                    max,
                } => {
                    self.fetches_seen += 1;
                    self.parked
                        .push((group, topic, partition, fetch_id, from, max));
                }
                Effect::Persist { ticket, batch } => {
                    self.pending_persists.push_back((ticket, batch));
                }
                Effect::Deliver {
                    group,
                    client,
                    delivery,
                } => self.deliveries.push((group, client, delivery)),
                Effect::Commit {
                    group,
                    partition,
                    offset,
                    ..
                } => self.commits.push((group, partition, offset)),
                Effect::BrokerAck { handle, .. } => self.broker_acks.push(handle),
                e @ Effect::Skipped { .. } => self.skipped.push(e),
                other => panic!("unexpected effect {other:?}"),
            }
        }
    }

    /// Carries out effects until nothing more happens without time passing.
    pub fn pump(&mut self) {
        for _ in 0..10_000 {
            self.drain();
            let mut progressed = false;
            if self.auto_persist {
                while let Some((ticket, batch)) = self.pending_persists.pop_front() {
                    self.store.apply(&batch);
                    let _ = self.mesh.handle(self.now, Input::Persisted { ticket });
                    self.drain();
                    progressed = true;
                }
            }
            // Answer parked fetches that now have data (or are out of range).
            let parked = std::mem::take(&mut self.parked);
            for (g, t, p, id, from, max) in parked {
                let log = &self.log[&t][p as usize];
                let earliest = *self.earliest.get(&(t.clone(), p)).unwrap_or(&0);
                let end = log.len() as Offset;
                let result = if from < earliest || from > end {
                    FetchResult::OutOfRange { earliest, end }
                } else if from == end {
                    self.parked.push((g, t, p, id, from, max));
                    continue;
                } else {
                    let hi = (from as usize + max).min(log.len());
                    FetchResult::Records(log[from as usize..hi].to_vec())
                };
                let _ = self.mesh.handle(
                    self.now,
                    Input::Fetched {
                        group: g,
                        partition: p,
                        fetch_id: id,
                        result,
                    },
                );
                progressed = true;
            }
            if !progressed {
                return;
            }
        }
        panic!("world did not settle");
    }

    pub fn view(&self, g: &str) -> GroupView {
        self.mesh.group_view(&group(g)).expect("group exists")
    }

    pub fn watermark(&self, g: &str, p: Partition) -> Offset {
        self.view(g)
            .lanes
            .iter()
            .find(|l| l.partition == p)
            .expect("lane")
            .watermark
    }
}
