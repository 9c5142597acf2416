//! Model-based property test: random sequences of inputs (publishes, polls, ACK/NACK/extend
//! of any id ever issued, time, persists that succeed or fail, crashes, rebalances, client
//! departures) against a trivially correct reference model made of sets and maps.
//!
//! The model predicts every ACK/NACK/extend answer, checks that every delivery is legal
//! (not done, not already out, credit and `max_in_flight` respected, filter and key order
//! obeyed, attempt numbers as C5 allows), and after every step the set of records done per
//! group must be the same in the core and in the model. After a crash the model's done set
//! becomes what the store durably holds, and that must be a subset of what was really done
//! (no loss); dead letters must be in the store's DLQ exactly when their progress is. At the
//! end faults stop and every published record must become done for every group (liveness).

// Groups are addressed by index in the core's names, the model and the op generator alike.
#![allow(clippy::needless_range_loop)]

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::*;
use proptest::prelude::*;
use unimesh_core::*;

const PARTITIONS: u32 = 2;
const MAX_ATTEMPTS: u32 = 3;
const ACK_TIMEOUT_MS: u64 = 100;
const MAX_IN_FLIGHT: u32 = 3;
/// Group "b" only takes type "t0" and orders by key; group "a" takes everything.
const GROUPS: [&str; 2] = ["a", "b"];
const CLIENTS: [&str; 3] = ["c0", "c1", "c2"];

#[derive(Clone, Debug)]
enum Op {
    Publish {
        partition: u32,
        key: Option<u8>,
        ty: u8,
    },
    Poll {
        group: usize,
        client: usize,
        max: u32,
    },
    Ack {
        group: usize,
        pick: usize,
    },
    Nack {
        group: usize,
        pick: usize,
        delay: Option<u64>,
    },
    Extend {
        group: usize,
        pick: usize,
    },
    Advance {
        ms: u64,
    },
    PersistOne,
    FailOne,
    Crash,
    Rebalance {
        group: usize,
        partition: u32,
    },
    ClientGone {
        group: usize,
        client: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..PARTITIONS, proptest::option::of(0u8..3), 0u8..2)
            .prop_map(|(partition, key, ty)| Op::Publish { partition, key, ty }),
        4 => (0..2usize, 0..3usize, 0u32..4).prop_map(|(group, client, max)| Op::Poll { group, client, max }),
        5 => (0..2usize, any::<usize>()).prop_map(|(group, pick)| Op::Ack { group, pick }),
        2 => (0..2usize, any::<usize>(), proptest::option::of(0u64..50))
            .prop_map(|(group, pick, delay)| Op::Nack { group, pick, delay }),
        1 => (0..2usize, any::<usize>()).prop_map(|(group, pick)| Op::Extend { group, pick }),
        3 => (0u64..150).prop_map(|ms| Op::Advance { ms }),
        3 => Just(Op::PersistOne),
        1 => Just(Op::FailOne),
        1 => Just(Op::Crash),
        1 => (0..2usize, 0..PARTITIONS).prop_map(|(group, partition)| Op::Rebalance { group, partition }),
        1 => (0..2usize, 0..3usize).prop_map(|(group, client)| Op::ClientGone { group, client }),
    ]
}

type Rec = (Partition, Offset);

#[derive(Clone, Debug)]
struct Out {
    id: DeliveryId,
    client: ClientId,
    deadline: Millis,
}

#[derive(Default)]
struct GroupModel {
    done: BTreeSet<Rec>,
    dead: BTreeSet<Rec>,
    acked: BTreeSet<Rec>,
    out: BTreeMap<Rec, Out>,
    /// Every id handed out in the current epoch, with its record.
    issued: BTreeMap<DeliveryId, Rec>,
    /// Ids of earlier epochs (answer: stale) and of revoked lanes (answer: revoked).
    stale: Vec<DeliveryId>,
    revoked: BTreeSet<DeliveryId>,
    max_attempt: BTreeMap<Rec, u32>,
    credit: BTreeMap<ClientId, u32>,
    /// Records that were ever done / dead-lettered, to judge what the store may hold
    /// (a revoked owner's late persist may still land after a rebalance).
    ever_done: BTreeSet<Rec>,
    ever_dead: BTreeSet<Rec>,
    ever_acked: BTreeSet<Rec>,
    /// Records whose durable attempt ledger reached the maximum before a restart: the core
    /// dead-letters them when it fetches them again, at a time the model does not know.
    doomed: BTreeSet<Rec>,
    /// Records whose first attempt may be repeated (a restart lost its ledger-free count).
    allow_repeat: BTreeSet<Rec>,
}

impl GroupModel {
    fn finish(&mut self, rec: Rec, dead: bool) {
        self.out.remove(&rec);
        self.done.insert(rec);
        self.ever_done.insert(rec);
        if dead {
            self.dead.insert(rec);
            self.ever_dead.insert(rec);
        } else {
            self.acked.insert(rec);
            self.ever_acked.insert(rec);
        }
    }

    /// After a restart or rebalance of `partitions`: the model keeps what the store holds.
    fn reset_to_store(
        &mut self,
        w: &World,
        g: usize,
        log: &[Vec<(Option<u8>, u8)>],
        partitions: &[u32],
    ) {
        for &p in partitions {
            for o in 0..log[p as usize].len() as Offset {
                let rec = (p, o);
                if store_done(w, g, rec) {
                    // Really done before (the crash check asserts it): keep it done.
                    self.done.insert(rec);
                    self.out.remove(&rec);
                } else {
                    self.done.remove(&rec);
                    self.dead.remove(&rec);
                    self.acked.remove(&rec);
                    if self.max_attempt.get(&rec) == Some(&1) {
                        self.allow_repeat.insert(rec);
                    }
                    let ledger = w
                        .store
                        .checkpoints
                        .get(&(group(GROUPS[g]), p))
                        .map_or(0, |c| c.attempts_of(o));
                    if ledger >= MAX_ATTEMPTS {
                        self.doomed.insert(rec);
                    }
                }
            }
        }
    }
}

struct Model {
    groups: Vec<GroupModel>,
    epoch: Epoch,
    /// partition -> (key, type) per offset
    log: Vec<Vec<(Option<u8>, u8)>>,
}

impl Model {
    fn matches(&self, g: usize, (p, o): Rec) -> bool {
        g == 0 || self.log[p as usize][o as usize].1 == 0
    }

    fn key(&self, (p, o): Rec) -> Option<u8> {
        self.log[p as usize][o as usize].0
    }

    /// An outstanding delivery ends without completion (timeout, NACK, client gone).
    fn end(&mut self, g: usize, rec: Rec) {
        let gm = &mut self.groups[g];
        let Some(out) = gm.out.remove(&rec) else {
            return;
        };
        if out.id.attempt >= MAX_ATTEMPTS {
            gm.finish(rec, true);
        }
    }

    fn expire(&mut self, now: Millis) {
        for g in 0..self.groups.len() {
            let due: Vec<Rec> = self.groups[g]
                .out
                .iter()
                .filter(|(_, o)| o.deadline <= now)
                .map(|(r, _)| *r)
                .collect();
            for r in due {
                self.end(g, r);
            }
        }
    }
}

fn spec(g: usize) -> SubscriptionSpec {
    let mut s = SubscriptionSpec::new(group(GROUPS[g]), topic("t"));
    s.max_attempts = MAX_ATTEMPTS;
    s.ack_timeout_ms = ACK_TIMEOUT_MS;
    s.max_in_flight_per_client = MAX_IN_FLIGHT;
    s.backoff = Backoff {
        initial_ms: 10,
        max_ms: 40,
        multiplier: 2.0,
    };
    if g == 1 {
        s.ordering = Ordering::Key;
        s.filter = Filter {
            ty: Some("t0".into()),
            ..Default::default()
        };
    }
    s
}

fn record(p: Partition, o: Offset, key: Option<u8>, ty: u8) -> Record {
    let mut r = event(o, &format!("t{ty}"), None);
    if let RecordMeta::Event(m) = &mut r.meta {
        let mut meta = (**m).clone();
        meta.partition_key = key.map(|k| format!("k{k}"));
        meta.source = format!("/p{p}");
        *m = std::sync::Arc::new(meta);
    }
    r
}

fn core_done(w: &World, g: usize, rec: Rec) -> bool {
    let view = w.view(GROUPS[g]);
    match view.lanes.iter().find(|l| l.partition == rec.0) {
        Some(l) => Progress::from_parts(l.watermark, l.ack_ranges.iter().copied())
            .unwrap()
            .is_done(rec.1),
        None => false,
    }
}

fn store_done(w: &World, g: usize, rec: Rec) -> bool {
    w.store
        .checkpoints
        .get(&(group(GROUPS[g]), rec.0))
        .is_some_and(|c| c.progress.is_done(rec.1))
}

/// Applies deliveries the core made since `from`, checking each against the model.
fn observe(w: &World, m: &mut Model, from: usize) {
    // Records dead-lettered at intake (ledger exhausted before a restart) are done now if
    // the core says so; key order may release the next record of their key.
    for g in 0..GROUPS.len() {
        let doomed: Vec<Rec> = m.groups[g].doomed.iter().copied().collect();
        for rec in doomed {
            if core_done(w, g, rec) {
                m.groups[g].doomed.remove(&rec);
                m.groups[g].finish(rec, true);
            }
        }
    }
    for (gname, client, d) in &w.deliveries[from..] {
        let g = GROUPS.iter().position(|x| *x == gname.as_str()).unwrap();
        let rec = (d.partition, d.record.offset);
        assert_eq!(d.id.epoch, m.epoch, "delivery ids carry the current epoch");
        assert!(m.matches(g, rec), "filter: {rec:?} delivered to {gname}");
        assert!(
            !m.groups[g].done.contains(&rec),
            "done record {rec:?} delivered again to {gname}"
        );
        assert!(
            !m.groups[g].out.contains_key(&rec),
            "{rec:?} delivered twice at once to {gname}"
        );
        if g == 1 {
            if let Some(k) = m.key(rec) {
                for o in 0..rec.1 {
                    let earlier = (rec.0, o);
                    if m.key(earlier) == Some(k) && m.matches(1, earlier) {
                        assert!(
                            m.groups[1].done.contains(&earlier),
                            "key order: {rec:?} before {earlier:?}"
                        );
                    }
                }
            }
        }
        // C5: attempt numbers never repeat except a first attempt after a crash.
        let prev = m.groups[g].max_attempt.get(&rec).copied().unwrap_or(0);
        assert!(
            d.attempt >= 1 && d.attempt <= MAX_ATTEMPTS,
            "attempt {} of {rec:?}",
            d.attempt
        );
        if d.attempt >= 2 {
            assert!(
                d.attempt > prev,
                "attempt {} after {prev} for {rec:?}",
                d.attempt
            );
        } else {
            assert!(
                prev == 0 || (prev == 1 && m.groups[g].allow_repeat.contains(&rec)),
                "attempt 1 repeated for {rec:?} (prev {prev})"
            );
        }
        assert!(
            !m.groups[g].doomed.contains(&rec),
            "{rec:?} delivered past its last attempt"
        );
        let gm = &mut m.groups[g];
        gm.allow_repeat.remove(&rec);
        gm.max_attempt.insert(rec, prev.max(d.attempt));
        // C8: credit and max_in_flight.
        let credit = gm
            .credit
            .get_mut(client)
            .expect("delivery to a client that polled");
        assert!(*credit > 0, "delivery to {client} without credit");
        *credit -= 1;
        let held = gm.out.values().filter(|o| o.client == *client).count() as u32;
        assert!(held < MAX_IN_FLIGHT, "{client} over max_in_flight");
        assert!(
            gm.issued.insert(d.id, rec).is_none(),
            "id {} issued twice",
            d.id
        );
        gm.out.insert(
            rec,
            Out {
                id: d.id,
                client: client.clone(),
                deadline: w.now + ACK_TIMEOUT_MS,
            },
        );
    }
}

fn pick(gm: &GroupModel, pick: usize) -> Option<DeliveryId> {
    let n = gm.issued.len() + gm.stale.len() + gm.revoked.len();
    if n == 0 {
        return None;
    }
    let i = pick % n;
    if i < gm.issued.len() {
        return gm.issued.keys().nth(i).copied();
    }
    let i = i - gm.issued.len();
    if i < gm.stale.len() {
        return Some(gm.stale[i]);
    }
    gm.revoked.iter().nth(i - gm.stale.len()).copied()
}

/// The answer the model expects for an ACK (`ack`) or a NACK/extend of `id`.
fn predict(gm: &GroupModel, id: DeliveryId, ack: bool) -> Settle {
    if gm.stale.contains(&id) {
        return Settle::Rejected(RejectReason::Stale);
    }
    if gm.revoked.contains(&id) {
        return Settle::Rejected(RejectReason::Revoked);
    }
    let rec = gm.issued[&id];
    if gm.done.contains(&rec) {
        return Settle::Rejected(RejectReason::AlreadyDone);
    }
    if ack {
        return Settle::Accepted;
    }
    match gm.out.get(&rec) {
        Some(o) if o.id == id => Settle::Accepted,
        _ => Settle::Rejected(RejectReason::AlreadyDone),
    }
}

fn compare_done(w: &World, m: &mut Model) {
    for g in 0..GROUPS.len() {
        for p in 0..PARTITIONS {
            for o in 0..m.log[p as usize].len() as Offset {
                let rec = (p, o);
                if !m.matches(g, rec) {
                    continue;
                }
                if m.groups[g].doomed.contains(&rec) {
                    if core_done(w, g, rec) {
                        m.groups[g].doomed.remove(&rec);
                        m.groups[g].finish(rec, true);
                    }
                    continue;
                }
                assert_eq!(
                    core_done(w, g, rec),
                    m.groups[g].done.contains(&rec),
                    "done sets differ for {} {rec:?}",
                    GROUPS[g]
                );
            }
        }
    }
}

fn run(ops: Vec<Op>) {
    let mut config = World::small_config();
    config.max_window_per_lane = 6;
    config.fetch_batch = 4;
    let mut w = World::new(config);
    w.topic("t", PARTITIONS);
    w.subscribe(spec(0));
    w.subscribe(spec(1));
    w.advance(20); // subscriptions and start positions durable
    w.auto_persist = false;
    let mut m = Model {
        groups: vec![GroupModel::default(), GroupModel::default()],
        epoch: w.mesh.epoch(),
        log: vec![Vec::new(); PARTITIONS as usize],
    };
    for op in ops {
        if std::env::var("MODEL_DEBUG").is_ok() {
            eprintln!(
                "now {} op {op:?}\n  a: {:?}\n  model a done {:?} out {:?}",
                w.now,
                w.view("a").lanes,
                m.groups[0].done,
                m.groups[0].out.keys().collect::<Vec<_>>()
            );
        }
        let seen = w.deliveries.len();
        match op {
            Op::Publish { partition, key, ty } => {
                let o = m.log[partition as usize].len() as Offset;
                m.log[partition as usize].push((key, ty));
                m.expire(w.now);
                w.publish_raw("t", partition, record(partition, o, key, ty));
            }
            Op::Poll {
                group: g,
                client: c,
                max,
            } => {
                m.expire(w.now);
                m.groups[g].credit.insert(client(CLIENTS[c]), max);
                w.poll(GROUPS[g], CLIENTS[c], max);
            }
            Op::Ack { group: g, pick: i }
            | Op::Nack {
                group: g, pick: i, ..
            }
            | Op::Extend { group: g, pick: i } => {
                m.expire(w.now);
                let Some(id) = pick(&m.groups[g], i) else {
                    continue;
                };
                let is_ack = matches!(op, Op::Ack { .. });
                let want = predict(&m.groups[g], id, is_ack);
                let input = match op {
                    Op::Ack { .. } => Input::Ack {
                        group: group(GROUPS[g]),
                        ids: vec![id],
                    },
                    Op::Nack { delay, .. } => Input::Nack {
                        group: group(GROUPS[g]),
                        ids: vec![id],
                        delay_ms: delay,
                    },
                    _ => Input::Extend {
                        group: group(GROUPS[g]),
                        ids: vec![id],
                        extend_ms: None,
                    },
                };
                let got = w.handle(input);
                assert_eq!(got, Response::Settled(vec![want]), "{op:?} of {id}");
                if want == Settle::Accepted {
                    let rec = m.groups[g].issued[&id];
                    match op {
                        Op::Ack { .. } => m.groups[g].finish(rec, false),
                        Op::Nack { .. } => m.end(g, rec),
                        _ => {
                            if let Some(o) = m.groups[g].out.get_mut(&rec) {
                                o.deadline = w.now + ACK_TIMEOUT_MS;
                            }
                        }
                    }
                }
            }
            Op::Advance { ms } => {
                // Step through every deadline so the model expires in the same order.
                let end = w.now + ms;
                while let Some(t) = w.mesh.poll_timeout().filter(|&t| t <= end) {
                    w.now = w.now.max(t);
                    m.expire(w.now);
                    let before = w.deliveries.len();
                    let _ = w.handle(Input::Tick);
                    observe(&w, &mut m, before);
                }
                w.now = end;
                m.expire(w.now);
                let before = w.deliveries.len();
                let _ = w.handle(Input::Tick);
                observe(&w, &mut m, before);
                if std::env::var("MODEL_DEBUG").is_ok() {
                    eprintln!(
                        "after advance b: {:?}\n stats {:?}",
                        w.view("b").lanes,
                        w.view("b").stats
                    );
                }
                compare_done(&w, &mut m);
                continue;
            }
            Op::PersistOne => {
                m.expire(w.now);
                if let Some((ticket, batch)) = w.pending_persists.pop_front() {
                    w.store.apply(&batch);
                    let _ = w.handle(Input::Persisted { ticket });
                }
            }
            Op::FailOne => {
                m.expire(w.now);
                if let Some((ticket, _)) = w.pending_persists.pop_front() {
                    let _ = w.handle(Input::PersistFailed { ticket });
                }
            }
            Op::Crash => {
                // What the store holds must have really been done (no loss), and a durably
                // done dead letter must be in the DLQ (same batch as its progress).
                for g in 0..GROUPS.len() {
                    let gm = &m.groups[g];
                    for p in 0..PARTITIONS {
                        for o in 0..m.log[p as usize].len() as Offset {
                            let rec = (p, o);
                            if !m.matches(g, rec) {
                                continue;
                            }
                            let durable = store_done(&w, g, rec);
                            assert!(
                                !durable || gm.ever_done.contains(&rec),
                                "{rec:?} durable but never done"
                            );
                            let in_dlq = w.store.dlq.contains_key(&(group(GROUPS[g]), p, o));
                            // (A record ACKed anywhere may be durably done by that ACK's
                            // persist, e.g. a revoked owner's late write, without a DLQ entry.)
                            if durable && gm.dead.contains(&rec) && !gm.ever_acked.contains(&rec) {
                                assert!(in_dlq, "{rec:?} dead but not in the DLQ");
                            }
                            if in_dlq {
                                assert!(
                                    gm.ever_dead.contains(&rec),
                                    "{rec:?} in the DLQ but never dead"
                                );
                            }
                        }
                    }
                }
                w.crash_and_restart();
                m.epoch = w.mesh.epoch();
                for g in 0..GROUPS.len() {
                    let log = m.log.clone();
                    let gm = &mut m.groups[g];
                    gm.out.clear();
                    gm.credit.clear();
                    let issued = std::mem::take(&mut gm.issued);
                    gm.stale.extend(issued.keys());
                    gm.stale.extend(std::mem::take(&mut gm.revoked));
                    gm.reset_to_store(&w, g, &log, &[0, 1]);
                }
                w.persist_all(); // the epoch, so deliveries can start again
            }
            Op::Rebalance {
                group: g,
                partition: p,
            } => {
                m.expire(w.now);
                let name = group(GROUPS[g]);
                let _ = w.handle(Input::PartitionsRevoked {
                    group: name.clone(),
                    partitions: vec![p],
                });
                // Another owner would resume from the store: the model does the same.
                let log = m.log.clone();
                let gm = &mut m.groups[g];
                let ids: Vec<DeliveryId> = gm
                    .issued
                    .iter()
                    .filter(|(_, r)| r.0 == p)
                    .map(|(i, _)| *i)
                    .collect();
                for id in ids {
                    let rec = gm.issued.remove(&id).unwrap();
                    gm.revoked.insert(id);
                    if gm.out.get(&rec).is_some_and(|o| o.id == id) {
                        gm.out.remove(&rec);
                    }
                }
                gm.reset_to_store(&w, g, &log, &[p]);
                let checkpoint = w.store.checkpoints.get(&(name.clone(), p)).cloned();
                let end = m.log[p as usize].len() as Offset;
                let r = w.handle(Input::PartitionsAssigned {
                    group: name,
                    partitions: vec![Assignment {
                        partition: p,
                        earliest: 0,
                        end,
                        checkpoint,
                    }],
                });
                assert_eq!(r, Response::Ok);
            }
            Op::ClientGone {
                group: g,
                client: c,
            } => {
                m.expire(w.now);
                let id = client(CLIENTS[c]);
                let held: Vec<Rec> = m.groups[g]
                    .out
                    .iter()
                    .filter(|(_, o)| o.client == id)
                    .map(|(r, _)| *r)
                    .collect();
                for r in held {
                    m.end(g, r);
                }
                m.groups[g].credit.remove(&id);
                let _ = w.handle(Input::ClientGone {
                    group: group(GROUPS[g]),
                    client: id,
                });
            }
        }
        observe(&w, &mut m, seen);
        compare_done(&w, &mut m);
    }

    // Liveness: faults stop; persists succeed, clients poll and ACK everything.
    w.auto_persist = true;
    let seen = w.deliveries.len();
    w.pump();
    m.expire(w.now);
    observe(&w, &mut m, seen);
    for _ in 0..400 {
        if std::env::var("MODEL_DEBUG").is_ok() {
            eprintln!(
                "live now {} a: {:?} out {:?} done {:?}",
                w.now,
                w.view("a").lanes,
                m.groups[0].out.keys().collect::<Vec<_>>(),
                m.groups[0].done
            );
        }
        let seen = w.deliveries.len();
        m.expire(w.now);
        for g in 0..GROUPS.len() {
            m.groups[g].credit.insert(client("c0"), MAX_IN_FLIGHT);
            w.poll(GROUPS[g], "c0", MAX_IN_FLIGHT);
        }
        observe(&w, &mut m, seen);
        let seen = w.deliveries.len();
        for g in 0..GROUPS.len() {
            let out: Vec<(Rec, DeliveryId)> =
                m.groups[g].out.iter().map(|(r, o)| (*r, o.id)).collect();
            for (rec, id) in out {
                assert_eq!(w.ack(GROUPS[g], &[id]), vec![Settle::Accepted]);
                m.groups[g].finish(rec, false);
            }
        }
        w.advance(50);
        m.expire(w.now);
        observe(&w, &mut m, seen);
        let all_done = (0..GROUPS.len()).all(|g| {
            (0..PARTITIONS).all(|p| {
                (0..m.log[p as usize].len() as Offset)
                    .all(|o| !m.matches(g, (p, o)) || m.groups[g].done.contains(&(p, o)))
            })
        });
        compare_done(&w, &mut m);
        if all_done && m.groups.iter().all(|gm| gm.doomed.is_empty()) {
            return;
        }
    }
    panic!("liveness: not every record became done once faults stopped");
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 8_000,
        max_shrink_iters: 2_000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn core_agrees_with_the_model(ops in prop::collection::vec(op(), 1..60)) {
        run(ops);
    }
}
