//! Operation sequences: a `Vec<Op>` drawn by `arbitrary` drives the core through a small
//! shell (the simulation's model broker and store), with time steps taken from the input.
//! The mesh checks its own invariants after every step (`check_every_step`), and the
//! simulation's contract checker watches every delivery, answer and persist, so any
//! sequence that breaks C1–C8 safety is a crash the fuzzer keeps.
#![no_main]

use std::collections::VecDeque;
use std::sync::Arc;

use arbitrary::Arbitrary;
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use unimesh_core::{
    Assignment, ClientId, DeliveryId, Effect, EventMeta, FetchResult, Filter, GroupName, Input,
    Mesh, MeshConfig, Millis, Ordering, Partition, RecordMeta, Response, SubscriptionSpec,
    TopicName,
};
use unimesh_sim::checker::{Checker, SettleKind};
use unimesh_sim::model::broker::{decode_handle, Broker};
use unimesh_sim::model::store::Store;

const PARTITIONS: u32 = 2;
const GROUPS: usize = 2;

#[derive(Arbitrary, Debug)]
enum Op {
    Publish {
        partition: u8,
        key: u8,
        ty: u8,
        undecodable: bool,
    },
    AnswerFetch {
        which: u8,
        distort: u8,
        twice: bool,
    },
    Poll {
        group: u8,
        client: u8,
        max: u8,
    },
    Ack {
        which: u16,
    },
    Nack {
        which: u16,
        delay: Option<u8>,
    },
    Extend {
        which: u16,
        by: Option<u16>,
    },
    Bogus {
        epoch: u8,
        lease: u8,
        partition: u8,
        offset: u8,
        attempt: u8,
    },
    ClientGone {
        group: u8,
        client: u8,
    },
    Advance {
        ms: u16,
    },
    Persist {
        fail: bool,
    },
    Crash {
        mid_persist: bool,
    },
    Revoke {
        group: u8,
        partition: u8,
    },
    Assign {
        group: u8,
        partition: u8,
    },
    Seek {
        group: u8,
        partition: u8,
        offset: u8,
    },
    Replay {
        group: u8,
    },
    Retention {
        partition: u8,
        by: u8,
    },
    FlushNow,
}

struct Fetch {
    group: usize,
    partition: Partition,
    fetch_id: u64,
    from: u64,
    max: usize,
}

struct World {
    now: Millis,
    mesh: Mesh,
    config: MeshConfig,
    broker: Broker,
    store: Store,
    checker: Checker,
    specs: Vec<SubscriptionSpec>,
    revoked: Vec<Vec<bool>>,
    fetches: Vec<Fetch>,
    repeats: VecDeque<(usize, Partition, u64, FetchResult)>,
    ids: Vec<(usize, DeliveryId)>,
}

fn group_name(g: usize) -> GroupName {
    GroupName::new(&format!("g{g}")).unwrap()
}

fn client_name(g: usize, c: u8) -> ClientId {
    ClientId::new(&format!("g{g}-c{}", c % 2)).unwrap()
}

impl World {
    fn new() -> Self {
        let config = MeshConfig {
            max_window_per_lane: 8,
            max_ack_ranges_per_lane: 4,
            fetch_batch: 4,
            flush_interval_ms: 10,
            max_outstanding_persists: 2,
            max_replay_per_group: 4,
            commit_to_broker: true,
            client_idle_timeout_ms: 1_000,
            ..MeshConfig::default()
        };
        let topic = TopicName::new("t").unwrap();
        let mut specs = Vec::new();
        for g in 0..GROUPS {
            let mut s = SubscriptionSpec::new(group_name(g), topic.clone());
            s.ack_timeout_ms = 50;
            s.max_attempts = 3;
            s.max_in_flight_per_client = 2;
            s.backoff.initial_ms = 5;
            s.backoff.max_ms = 40;
            if g == 1 {
                s.ordering = Ordering::Key;
                s.filter = Filter {
                    ty: Some("a".into()),
                    ..Filter::default()
                };
            }
            specs.push(s);
        }
        let mut checker = Checker::new(config.limits.max_ack_timeout_ms);
        for s in &specs {
            checker.add_group(s);
        }
        let store = Store::default();
        let mesh = Mesh::new(config.clone(), store.recovered().unwrap(), 0).unwrap();
        let mut w = World {
            now: 0,
            mesh,
            config,
            broker: Broker::new(topic, PARTITIONS),
            store,
            checker,
            specs,
            revoked: vec![vec![false; PARTITIONS as usize]; GROUPS],
            fetches: Vec::new(),
            repeats: VecDeque::new(),
            ids: Vec::new(),
        };
        w.start();
        w
    }

    fn start(&mut self) {
        self.mesh.check_every_step = true;
        self.checker.started(self.now, self.mesh.epoch()).unwrap();
        self.drain();
        for g in 0..GROUPS {
            let r = self
                .mesh
                .handle(self.now, Input::Subscribe(self.specs[g].clone()));
            assert_eq!(r, Response::Ok);
            let partitions = (0..PARTITIONS)
                .map(|p| Assignment {
                    partition: p,
                    earliest: self.broker.earliest(p),
                    end: self.broker.end(p),
                    checkpoint: None,
                })
                .collect();
            let r = self.mesh.handle(
                self.now,
                Input::PartitionsAssigned {
                    group: group_name(g),
                    partitions,
                },
            );
            assert_eq!(r, Response::Ok);
            for p in 0..PARTITIONS {
                self.checker.assigned(&group_name(g), p);
                self.revoked[g][p as usize] = false;
            }
            self.drain();
        }
    }

    fn handle(&mut self, input: Input) -> Response {
        let r = self.mesh.handle(self.now, input);
        r
    }

    fn drain(&mut self) {
        while let Some(e) = self.mesh.poll_effect() {
            let r = match e {
                Effect::Fetch {
                    group,
                    partition,
                    fetch_id,
                    from,
                    max,
                    ..
                } => {
                    let g = self.specs.iter().position(|s| s.group == group).unwrap();
                    self.fetches.push(Fetch {
                        group: g,
                        partition,
                        fetch_id,
                        from,
                        max,
                    });
                    Ok(())
                }
                Effect::Deliver {
                    group,
                    client,
                    delivery,
                } => {
                    let g = self.specs.iter().position(|s| s.group == group).unwrap();
                    if self.ids.len() < 4_096 {
                        self.ids.push((g, delivery.id));
                    }
                    self.checker.delivered(self.now, &group, &client, &delivery)
                }
                Effect::Persist { ticket, batch } => {
                    let r = self.checker.persist_emitted(ticket, &batch);
                    self.store.submit(ticket, *batch);
                    r
                }
                Effect::Commit {
                    group,
                    partition,
                    offset,
                    ..
                } => self.checker.committed(&group, partition, offset),
                Effect::BrokerAck { group, handle, .. } => {
                    let (p, o) = decode_handle(&handle).unwrap();
                    self.checker.broker_acked(&group, p, o)
                }
                Effect::Skipped {
                    group,
                    partition,
                    from,
                    to,
                    reason,
                    ..
                } => self.checker.skipped(&group, partition, from, to, reason),
                _ => Ok(()),
            };
            if let Err(v) = r {
                panic!("contract violated: {v}");
            }
        }
    }

    fn settle(&mut self, which: u16, kind: SettleKind) {
        if self.ids.is_empty() {
            return;
        }
        let (g, id) = self.ids[usize::from(which) % self.ids.len()];
        self.settle_id(g, id, kind);
    }

    fn settle_id(&mut self, g: usize, id: DeliveryId, kind: SettleKind) {
        let group = group_name(g);
        let ids = vec![id];
        let input = match kind {
            SettleKind::Ack => Input::Ack {
                group: group.clone(),
                ids: ids.clone(),
            },
            SettleKind::Nack(delay_ms) => Input::Nack {
                group: group.clone(),
                ids: ids.clone(),
                delay_ms,
            },
            SettleKind::Extend(extend_ms) => Input::Extend {
                group: group.clone(),
                ids: ids.clone(),
                extend_ms,
            },
        };
        let r = self.handle(input);
        if let Err(v) = self.checker.settled(self.now, &group, kind, &ids, &r) {
            panic!("contract violated: {v}");
        }
        self.drain();
    }

    fn op(&mut self, op: Op) {
        match op {
            Op::Publish {
                partition,
                key,
                ty,
                undecodable,
            } => {
                let p = u32::from(partition) % PARTITIONS;
                if self.broker.end(p) >= 256 {
                    return;
                }
                let meta = if undecodable {
                    RecordMeta::Undecodable(Arc::from("bad"))
                } else {
                    RecordMeta::Event(Arc::new(EventMeta {
                        id: format!("{p}-{}", self.broker.end(p)),
                        ty: if ty % 2 == 0 { "a".into() } else { "b".into() },
                        partition_key: Some(format!("k{}", key % 3)),
                        ..EventMeta::default()
                    }))
                };
                let record = self.broker.publish(p, meta, Bytes::new(), true);
                let topic = self.broker.topic.clone();
                self.checker.published(&topic, p, &record).unwrap();
            }
            Op::AnswerFetch {
                which,
                distort,
                twice,
            } => {
                if let Some((g, p, fetch_id, result)) = self.repeats.pop_front() {
                    let _ = self.handle(Input::Fetched {
                        group: group_name(g),
                        partition: p,
                        fetch_id,
                        result,
                    });
                    self.drain();
                }
                if self.fetches.is_empty() {
                    return;
                }
                let f = self.fetches.remove(usize::from(which) % self.fetches.len());
                let earliest = self.broker.earliest(f.partition);
                let end = self.broker.end(f.partition);
                let mut result = self.broker.fetch(f.partition, f.from, f.max);
                if let FetchResult::Records(r) = &mut result {
                    match distort % 5 {
                        1 => {
                            result = FetchResult::Failed {
                                reason: "fuzz".into(),
                            }
                        }
                        2 => result = FetchResult::OutOfRange { earliest, end },
                        3 => {
                            let back = f.from.saturating_sub(3).max(earliest);
                            let mut v = self.broker.records(f.partition, back, f.from).to_vec();
                            v.append(r);
                            result = FetchResult::Records(v);
                        }
                        4 => {
                            let dup: Vec<_> =
                                r.iter().flat_map(|x| [x.clone(), x.clone()]).collect();
                            *r = dup;
                        }
                        _ => {}
                    }
                }
                if twice {
                    self.repeats
                        .push_back((f.group, f.partition, f.fetch_id, result.clone()));
                }
                let _ = self.handle(Input::Fetched {
                    group: group_name(f.group),
                    partition: f.partition,
                    fetch_id: f.fetch_id,
                    result,
                });
                self.drain();
            }
            Op::Poll { group, client, max } => {
                let g = usize::from(group) % GROUPS;
                let c = client_name(g, client);
                let max = u32::from(max % 5);
                let r = self.handle(Input::ClientPoll {
                    group: group_name(g),
                    client: c.clone(),
                    max,
                });
                self.checker
                    .client_poll(&group_name(g), &c, max, r == Response::Ok);
                self.drain();
            }
            Op::Ack { which } => self.settle(which, SettleKind::Ack),
            Op::Nack { which, delay } => self.settle(which, SettleKind::Nack(delay.map(u64::from))),
            Op::Extend { which, by } => self.settle(which, SettleKind::Extend(by.map(u64::from))),
            Op::Bogus {
                epoch,
                lease,
                partition,
                offset,
                attempt,
            } => {
                let id = DeliveryId {
                    epoch: self.mesh.epoch().saturating_sub(u32::from(epoch % 3)),
                    lease: u64::from(lease % 16),
                    partition: u32::from(partition % 3),
                    offset: u64::from(offset),
                    attempt: u32::from(attempt % 5),
                };
                self.settle_id(usize::from(epoch) % GROUPS, id, SettleKind::Ack);
            }
            Op::ClientGone { group, client } => {
                let g = usize::from(group) % GROUPS;
                let c = client_name(g, client);
                let _ = self.handle(Input::ClientGone {
                    group: group_name(g),
                    client: c.clone(),
                });
                self.checker.client_gone(self.now, &group_name(g), &c);
                self.drain();
            }
            Op::Advance { ms } => {
                self.now += Millis::from(ms % 2_000);
                let _ = self.handle(Input::Tick);
                self.drain();
            }
            Op::Persist { fail } => {
                if fail {
                    if let Some(t) = self.store.fail_front() {
                        self.checker.persist_failed(t);
                        let _ = self.handle(Input::PersistFailed { ticket: t });
                        self.drain();
                    }
                } else if let Some((t, batch)) = self.store.apply_front() {
                    if let Err(v) = self.checker.persist_applied(t, &batch) {
                        panic!("contract violated: {v}");
                    }
                    self.checker.persist_notified(t);
                    let _ = self.handle(Input::Persisted { ticket: t });
                    self.drain();
                }
            }
            Op::Crash { mid_persist } => {
                if mid_persist {
                    if let Some((t, batch)) = self.store.apply_front() {
                        if let Err(v) = self.checker.persist_applied(t, &batch) {
                            panic!("contract violated: {v}");
                        }
                    }
                }
                self.store.crash();
                self.checker.crashed(self.now);
                self.fetches.clear();
                self.repeats.clear();
                self.mesh = Mesh::new(
                    self.config.clone(),
                    self.store.recovered().unwrap(),
                    self.now,
                )
                .expect("recovery from what the mesh itself persisted");
                self.start();
            }
            Op::Revoke { group, partition } => {
                let g = usize::from(group) % GROUPS;
                let p = u32::from(partition) % PARTITIONS;
                if self.revoked[g][p as usize] {
                    return;
                }
                let _ = self.handle(Input::PartitionsRevoked {
                    group: group_name(g),
                    partitions: vec![p],
                });
                self.checker.revoked(self.now, &group_name(g), p);
                self.revoked[g][p as usize] = true;
                self.fetches.retain(|f| !(f.group == g && f.partition == p));
                self.drain();
            }
            Op::Assign { group, partition } => {
                let g = usize::from(group) % GROUPS;
                let p = u32::from(partition) % PARTITIONS;
                // A shell hands a partition over only once the old owner's writes landed.
                if !self.revoked[g][p as usize] || self.store.has_pending() {
                    return;
                }
                let checkpoint = self.store.checkpoint(&group_name(g), p).unwrap();
                let a = Assignment {
                    partition: p,
                    earliest: self.broker.earliest(p),
                    end: self.broker.end(p),
                    checkpoint,
                };
                let r = self.handle(Input::PartitionsAssigned {
                    group: group_name(g),
                    partitions: vec![a],
                });
                assert_eq!(r, Response::Ok);
                self.checker.assigned(&group_name(g), p);
                self.revoked[g][p as usize] = false;
                self.drain();
            }
            Op::Seek {
                group,
                partition,
                offset,
            } => {
                let g = usize::from(group) % GROUPS;
                let p = u32::from(partition) % PARTITIONS;
                let offset = u64::from(offset).min(self.broker.end(p));
                let r = self.handle(Input::Seek {
                    group: group_name(g),
                    partition: p,
                    offset,
                });
                if r == Response::Ok {
                    self.checker.sought(self.now, &group_name(g), p, offset);
                    self.fetches.retain(|f| !(f.group == g && f.partition == p));
                }
                self.drain();
            }
            Op::Replay { group } => {
                let g = usize::from(group) % GROUPS;
                let records = self.store.dead_letters(&group_name(g), 2);
                if !records.is_empty() {
                    let _ = self.handle(Input::Replay {
                        group: group_name(g),
                        records,
                    });
                    self.drain();
                }
            }
            Op::Retention { partition, by } => {
                let p = u32::from(partition) % PARTITIONS;
                let pinned = (0..GROUPS)
                    .all(|g| (0..PARTITIONS).all(|q| self.checker.is_pinned(&group_name(g), q)));
                if pinned {
                    let to = self.broker.earliest(p) + u64::from(by % 8);
                    self.broker.delete_below(p, to);
                    let topic = self.broker.topic.clone();
                    self.checker.retention(&topic, p, self.broker.earliest(p));
                }
            }
            Op::FlushNow => {
                let _ = self.handle(Input::FlushNow);
                self.drain();
            }
        }
    }
}

fuzz_target!(|ops: Vec<Op>| {
    let mut w = World::new();
    for op in ops.into_iter().take(2_000) {
        w.op(op);
    }
});
