//! Regressions found by the deterministic simulation (`unimesh-sim`). Each test names the
//! seed that found the bug, states the contract it broke, and replays the smallest input
//! sequence that shows it. Self-contained on purpose: it drives `Mesh` through its public
//! API only.

use bytes::Bytes;
use unimesh_core::*;

fn group() -> GroupName {
    GroupName::new("g").unwrap()
}

fn record(offset: Offset) -> Record {
    Record::event(
        offset,
        EventMeta {
            id: format!("id-{offset}"),
            ty: "t".into(),
            ..EventMeta::default()
        },
        Bytes::new(),
    )
}

fn effects(mesh: &mut Mesh) -> Vec<Effect> {
    std::iter::from_fn(|| mesh.poll_effect()).collect()
}

fn persist_ticket(effects: &[Effect]) -> Option<(Ticket, PersistBatch)> {
    effects.iter().find_map(|e| match e {
        Effect::Persist { ticket, batch } => Some((*ticket, (**batch).clone())),
        _ => None,
    })
}

/// Seed 22 (C1 liveness). Goal: a lane recovered with as many ACK ranges as
/// `max_ack_ranges_per_lane` still fetches. Method: recover a checkpoint with two ranges
/// and a cap of two; before the fix fetching paused "for ranges" although only fetching
/// the gaps below them could ever close a range, so the lane stalled for good.
#[test]
fn seed_22_lane_recovered_at_the_range_cap_still_fetches_its_gaps() {
    let config = MeshConfig {
        max_ack_ranges_per_lane: 2,
        ..MeshConfig::default()
    };
    let progress = Progress::from_parts(0, [(1, 2), (3, 4)]).unwrap();
    let recovered = Recovered {
        epoch: 0,
        subscriptions: vec![SubscriptionSpec::new(group(), TopicName::new("t").unwrap())],
        checkpoints: vec![(
            group(),
            0,
            Checkpoint {
                progress,
                attempts: vec![],
            },
        )],
    };
    let mut mesh = Mesh::new(config, recovered, 0).unwrap();
    let (ticket, _) = persist_ticket(&effects(&mut mesh)).expect("the epoch is persisted");
    let _ = mesh.handle(0, Input::Persisted { ticket });
    let _ = mesh.handle(
        0,
        Input::PartitionsAssigned {
            group: group(),
            partitions: vec![Assignment {
                partition: 0,
                earliest: 0,
                end: 5,
                checkpoint: None,
            }],
        },
    );
    let fetch = effects(&mut mesh).into_iter().find_map(|e| match e {
        Effect::Fetch { fetch_id, from, .. } => Some((fetch_id, from)),
        _ => None,
    });
    let (fetch_id, from) = fetch.expect("the recovered lane fetches the gaps below its ranges");
    assert_eq!(from, 0);
    let _ = mesh.handle(
        1,
        Input::Fetched {
            group: group(),
            partition: 0,
            fetch_id,
            result: FetchResult::Records((0..5).map(record).collect()),
        },
    );
    let _ = mesh.handle(
        1,
        Input::ClientPoll {
            group: group(),
            client: ClientId::new("c").unwrap(),
            max: 10,
        },
    );
    let delivered: Vec<Offset> = effects(&mut mesh)
        .into_iter()
        .filter_map(|e| match e {
            Effect::Deliver { delivery, .. } => Some(delivery.record.offset),
            _ => None,
        })
        .collect();
    assert_eq!(delivered, vec![0, 2, 4], "gaps delivered, ranges skipped");
}

/// Seed 3973 (C2). Goal: a store never holds progress of a group whose definition it does
/// not hold. Method: the persist carrying a new group's definition fails after a later
/// persist, carrying only the group's progress, was already handed out; the later one
/// succeeds and the mesh crashes. Before the fix the recovered store had the checkpoint but
/// not the group, so the checkpoint was ignored and durably ACKed records were redelivered
/// once the group was created again.
#[test]
fn seed_3973_checkpoints_carry_their_group_until_its_definition_is_durable() {
    let mut mesh = Mesh::new(MeshConfig::default(), Recovered::default(), 0).unwrap();
    let (epoch_ticket, _) = persist_ticket(&effects(&mut mesh)).unwrap();
    let _ = mesh.handle(
        0,
        Input::Persisted {
            ticket: epoch_ticket,
        },
    );
    let spec = SubscriptionSpec::new(group(), TopicName::new("t").unwrap());
    assert_eq!(mesh.handle(0, Input::Subscribe(spec)), Response::Ok);
    let _ = mesh.handle(
        0,
        Input::PartitionsAssigned {
            group: group(),
            partitions: vec![Assignment {
                partition: 0,
                earliest: 0,
                end: 3,
                checkpoint: None,
            }],
        },
    );
    let _ = mesh.handle(0, Input::FlushNow);
    let first = effects(&mut mesh);
    let (t1, b1) = persist_ticket(&first).expect("definition and start position persisted");
    assert_eq!(b1.subscriptions.len(), 1);
    let fetch_id = first
        .iter()
        .find_map(|e| match e {
            Effect::Fetch { fetch_id, .. } => Some(*fetch_id),
            _ => None,
        })
        .unwrap();
    let _ = mesh.handle(
        1,
        Input::Fetched {
            group: group(),
            partition: 0,
            fetch_id,
            result: FetchResult::Records((0..3).map(record).collect()),
        },
    );
    let _ = mesh.handle(
        1,
        Input::ClientPoll {
            group: group(),
            client: ClientId::new("c").unwrap(),
            max: 1,
        },
    );
    let id = effects(&mut mesh)
        .into_iter()
        .find_map(|e| match e {
            Effect::Deliver { delivery, .. } => Some(delivery.id),
            _ => None,
        })
        .unwrap();
    let _ = mesh.handle(
        2,
        Input::Ack {
            group: group(),
            ids: vec![id],
        },
    );
    let _ = mesh.handle(2, Input::FlushNow);
    let (t2, b2) = persist_ticket(&effects(&mut mesh)).expect("the ACK is persisted");
    assert_eq!(b2.checkpoints.len(), 1);
    assert!(
        b2.subscriptions.iter().any(|s| s.group == group()),
        "a checkpoint of a group whose definition is not durable carries the definition"
    );
    // The first persist fails, the second is written, then the process dies.
    let _ = mesh.handle(3, Input::PersistFailed { ticket: t1 });
    let _ = mesh.handle(3, Input::Persisted { ticket: t2 });
    let recovered = Recovered {
        epoch: 1,
        subscriptions: b2.subscriptions.clone(),
        checkpoints: b2
            .checkpoints
            .iter()
            .map(|c| (c.group.clone(), c.partition, c.checkpoint.clone()))
            .collect(),
    };
    let mut mesh = Mesh::new(MeshConfig::default(), recovered, 4).unwrap();
    assert!(mesh.subscription(&group()).is_some(), "the group survived");
    let (t, _) = persist_ticket(&effects(&mut mesh)).unwrap();
    let _ = mesh.handle(4, Input::Persisted { ticket: t });
    let _ = mesh.handle(
        4,
        Input::PartitionsAssigned {
            group: group(),
            partitions: vec![Assignment {
                partition: 0,
                earliest: 0,
                end: 3,
                checkpoint: None,
            }],
        },
    );
    let from = effects(&mut mesh).into_iter().find_map(|e| match e {
        Effect::Fetch { from, .. } => Some(from),
        _ => None,
    });
    assert_eq!(
        from,
        Some(1),
        "restart alignment resumes after the durable ACK"
    );
}

/// The fetch a mesh asked for last, if any: (fetch id, from).
fn last_fetch(effects: &[Effect]) -> Option<(FetchId, Offset)> {
    effects.iter().rev().find_map(|e| match e {
        Effect::Fetch { fetch_id, from, .. } => Some((*fetch_id, *from)),
        _ => None,
    })
}

/// The ids of the deliveries among some effects.
fn delivered_ids(effects: &[Effect]) -> Vec<DeliveryId> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Deliver { delivery, .. } => Some(delivery.id),
            _ => None,
        })
        .collect()
}

/// Kafka-world seeds 0 and 6370 (C4, and through it C1). Goal: after the broker lost its
/// tail (an unclean leader election) and later records reuse the offsets, a new record
/// never gets the delivery id of the lost record it replaces, so a late ACK of the lost one
/// cannot settle the new one unseen; and no id that was never issued is accepted. Method:
/// deliver offsets 0 and 1, lose offset 1 (the fetch answers "out of range, end 1"), fetch
/// a new record at offset 1 and deliver it. Before the fix (seed 0) the lane kept its
/// lease, the new delivery carried the old id, and the old delivery's ACK was accepted for
/// the new record; with a new lease alone (seed 6370) offset 0, delivered under the old
/// lease, still took an id of the new lease that was never issued.
#[test]
fn seed_0_kafka_a_lost_tail_gives_the_records_reusing_its_offsets_fresh_ids() {
    let mut mesh = Mesh::new(MeshConfig::default(), Recovered::default(), 0).unwrap();
    let (t, _) = persist_ticket(&effects(&mut mesh)).unwrap();
    let _ = mesh.handle(0, Input::Persisted { ticket: t });
    let spec = SubscriptionSpec::new(group(), TopicName::new("t").unwrap());
    assert_eq!(mesh.handle(0, Input::Subscribe(spec)), Response::Ok);
    let _ = mesh.handle(
        0,
        Input::PartitionsAssigned {
            group: group(),
            partitions: vec![Assignment {
                partition: 0,
                earliest: 0,
                end: 2,
                checkpoint: None,
            }],
        },
    );
    let (fetch_id, _) = last_fetch(&effects(&mut mesh)).unwrap();
    let fetched = |fetch_id, result| Input::Fetched {
        group: group(),
        partition: 0,
        fetch_id,
        result,
    };
    let ack = |id| Input::Ack {
        group: group(),
        ids: vec![id],
    };
    let poll = || Input::ClientPoll {
        group: group(),
        client: ClientId::new("c").unwrap(),
        max: 2,
    };
    let two = FetchResult::Records(vec![record(0), record(1)]);
    let _ = mesh.handle(1, fetched(fetch_id, two));
    let _ = mesh.handle(1, poll());
    let first = effects(&mut mesh);
    let ids = delivered_ids(&first);
    let (kept, old) = (ids[0], ids[1]);
    assert_eq!((kept.offset, old.offset), (0, 1));
    // The broker lost offset 1: the next fetch (from 2) hears "out of range, end 1".
    let (fetch_id, from) = last_fetch(&first).unwrap();
    assert_eq!(from, 2);
    let lost = FetchResult::OutOfRange {
        earliest: 0,
        end: 1,
    };
    let _ = mesh.handle(2, fetched(fetch_id, lost));
    let after = effects(&mut mesh);
    assert!(after.iter().any(|e| matches!(
        e,
        Effect::Skipped {
            reason: SkipReason::BrokerTruncated,
            from: 1,
            to: 2,
            ..
        }
    )));
    // Offset 0, delivered under the old lease, takes no id of the new one.
    let never_issued = DeliveryId {
        lease: old.lease + 1,
        ..kept
    };
    assert_eq!(
        mesh.handle(2, ack(never_issued)),
        Response::Settled(vec![Settle::Rejected(RejectReason::Unknown)])
    );
    // A new record at offset 1, delivered.
    let (fetch_id, from) = last_fetch(&after).unwrap();
    assert_eq!(from, 1);
    let mut replacement = record(1);
    replacement.meta = RecordMeta::Event(std::sync::Arc::new(EventMeta {
        id: "a-new-record".into(),
        ty: "t".into(),
        ..EventMeta::default()
    }));
    let _ = mesh.handle(
        3,
        fetched(fetch_id, FetchResult::Records(vec![replacement])),
    );
    let _ = mesh.handle(3, poll());
    let new = delivered_ids(&effects(&mut mesh));
    assert_eq!(new.len(), 1, "the new record is delivered");
    assert_eq!(new[0].offset, 1);
    assert_ne!(new[0], old, "the new record has an id of its own");
    // The lost record's late ACK settles nothing; the new record's own ACK does.
    assert_ne!(
        mesh.handle(4, ack(old)),
        Response::Settled(vec![Settle::Accepted])
    );
    assert_eq!(
        mesh.handle(4, ack(new[0])),
        Response::Settled(vec![Settle::Accepted])
    );
}

/// Kafka-world seed 84 (C1). Goal: a lane that starts from a checkpoint with ACK ranges
/// above its cursor forgets the ranges the broker lost when it hears that the log now ends
/// below them, so the new records reusing those offsets are delivered. Method: assign with
/// watermark 0 and range [1, 3), answer the first fetch "out of range, end 1" (the broker
/// lost its tail from 1), then fetch new records at 1 and 2. Before the fix the core read
/// an end above its cursor as the broker contradicting itself, kept the range, and skipped
/// the new records as done.
#[test]
fn seed_84_kafka_a_lost_tail_clears_the_ack_ranges_above_it() {
    let mut mesh = Mesh::new(MeshConfig::default(), Recovered::default(), 0).unwrap();
    let (t, _) = persist_ticket(&effects(&mut mesh)).unwrap();
    let _ = mesh.handle(0, Input::Persisted { ticket: t });
    let spec = SubscriptionSpec::new(group(), TopicName::new("t").unwrap());
    assert_eq!(mesh.handle(0, Input::Subscribe(spec)), Response::Ok);
    let _ = mesh.handle(
        0,
        Input::PartitionsAssigned {
            group: group(),
            partitions: vec![Assignment {
                partition: 0,
                earliest: 0,
                end: 5,
                checkpoint: Some(Checkpoint {
                    progress: Progress::from_parts(0, [(1, 3)]).unwrap(),
                    attempts: vec![],
                }),
            }],
        },
    );
    let (fetch_id, from) = last_fetch(&effects(&mut mesh)).unwrap();
    assert_eq!(from, 0);
    let fetched = |fetch_id, result| Input::Fetched {
        group: group(),
        partition: 0,
        fetch_id,
        result,
    };
    let lost = FetchResult::OutOfRange {
        earliest: 0,
        end: 1,
    };
    let _ = mesh.handle(1, fetched(fetch_id, lost));
    let after = effects(&mut mesh);
    assert!(
        after.iter().any(|e| matches!(
            e,
            Effect::Skipped {
                reason: SkipReason::BrokerTruncated,
                from: 1,
                to: 3,
                ..
            }
        )),
        "the loss is reported: {after:?}"
    );
    // The fetch goes on (at once or after a retry) from 0; new records at 1 and 2 follow.
    let (fetch_id, from) = match last_fetch(&after) {
        Some(f) => f,
        None => {
            let _ = mesh.handle(1_000, Input::Tick);
            last_fetch(&effects(&mut mesh)).expect("the lane fetches again")
        }
    };
    assert_eq!(from, 0);
    let _ = mesh.handle(
        1_000,
        fetched(fetch_id, FetchResult::Records((0..3).map(record).collect())),
    );
    let _ = mesh.handle(
        1_000,
        Input::ClientPoll {
            group: group(),
            client: ClientId::new("c").unwrap(),
            max: 10,
        },
    );
    let delivered: Vec<Offset> = delivered_ids(&effects(&mut mesh))
        .iter()
        .map(|id| id.offset)
        .collect();
    assert_eq!(delivered, vec![0, 1, 2], "no new record is taken for done");
}

/// Kafka-world seed 2357 (a checkpoint the core cannot read back). Goal: the attempt count
/// of a record that compaction removed leaves with it. Method: start from a checkpoint
/// recording attempt 2 for offset 1, fetch offsets 0 and 2 (1 was compacted: a gap), ACK
/// both; the watermark passes 1. Before the fix the gap marked offset 1 done but kept its
/// attempt count, and the next checkpoint had an attempt below its watermark, which
/// `Checkpoint::decode` refuses: the lane could not be recovered from it.
#[test]
fn seed_2357_kafka_a_gap_takes_the_attempt_count_of_its_offsets_with_it() {
    let mut mesh = Mesh::new(MeshConfig::default(), Recovered::default(), 0).unwrap();
    let (t, _) = persist_ticket(&effects(&mut mesh)).unwrap();
    let _ = mesh.handle(0, Input::Persisted { ticket: t });
    let spec = SubscriptionSpec::new(group(), TopicName::new("t").unwrap());
    assert_eq!(mesh.handle(0, Input::Subscribe(spec)), Response::Ok);
    let _ = mesh.handle(
        0,
        Input::PartitionsAssigned {
            group: group(),
            partitions: vec![Assignment {
                partition: 0,
                earliest: 0,
                end: 3,
                checkpoint: Some(Checkpoint {
                    progress: Progress::new(0),
                    attempts: vec![(1, 2)],
                }),
            }],
        },
    );
    let (fetch_id, _) = last_fetch(&effects(&mut mesh)).unwrap();
    let _ = mesh.handle(
        1,
        Input::Fetched {
            group: group(),
            partition: 0,
            fetch_id,
            result: FetchResult::Records(vec![record(0), record(2)]),
        },
    );
    let _ = mesh.handle(
        1,
        Input::ClientPoll {
            group: group(),
            client: ClientId::new("c").unwrap(),
            max: 10,
        },
    );
    let ids = delivered_ids(&effects(&mut mesh));
    assert_eq!(ids.len(), 2);
    let r = mesh.handle(
        2,
        Input::Ack {
            group: group(),
            ids,
        },
    );
    assert_eq!(r, Response::Settled(vec![Settle::Accepted; 2]));
    let _ = mesh.handle(2, Input::FlushNow);
    let (_, batch) = persist_ticket(&effects(&mut mesh)).expect("the ACKs are persisted");
    let written = &batch.checkpoints[0].checkpoint;
    assert_eq!(written.progress.watermark(), 3);
    assert_eq!(
        Checkpoint::decode(&written.encode()).as_ref(),
        Ok(written),
        "the checkpoint reads back"
    );
}

/// Kafka-world seed 18305 (C5). Goal: a lane forgets the attempt counts the broker's lost
/// tail took with it, so a new record reusing the offset starts at attempt 1. Method: a
/// group of two attempts starts from a checkpoint recording two attempts for offset 1;
/// the broker loses offset 1 (the fetch hears "out of range, end 1"); a new record at 1
/// follows. Before the fix the lane kept the count and dead-lettered the new record at
/// once, never delivered.
#[test]
fn seed_18305_kafka_a_lost_tail_takes_its_attempt_counts_with_it() {
    let mut mesh = Mesh::new(MeshConfig::default(), Recovered::default(), 0).unwrap();
    let (t, _) = persist_ticket(&effects(&mut mesh)).unwrap();
    let _ = mesh.handle(0, Input::Persisted { ticket: t });
    let mut spec = SubscriptionSpec::new(group(), TopicName::new("t").unwrap());
    spec.max_attempts = 2;
    assert_eq!(mesh.handle(0, Input::Subscribe(spec)), Response::Ok);
    let _ = mesh.handle(
        0,
        Input::PartitionsAssigned {
            group: group(),
            partitions: vec![Assignment {
                partition: 0,
                earliest: 0,
                end: 2,
                checkpoint: Some(Checkpoint {
                    progress: Progress::new(0),
                    attempts: vec![(1, 2)],
                }),
            }],
        },
    );
    let (fetch_id, _) = last_fetch(&effects(&mut mesh)).unwrap();
    let fetched = |fetch_id, result| Input::Fetched {
        group: group(),
        partition: 0,
        fetch_id,
        result,
    };
    let lost = FetchResult::OutOfRange {
        earliest: 0,
        end: 1,
    };
    let _ = mesh.handle(1, fetched(fetch_id, lost));
    let after = effects(&mut mesh);
    let fetch_id = match last_fetch(&after) {
        Some((fetch_id, _)) => fetch_id,
        None => {
            let _ = mesh.handle(1_000, Input::Tick);
            last_fetch(&effects(&mut mesh))
                .expect("the lane fetches again")
                .0
        }
    };
    let mut replacement = record(1);
    replacement.meta = RecordMeta::Event(std::sync::Arc::new(EventMeta {
        id: "a-new-record".into(),
        ty: "t".into(),
        ..EventMeta::default()
    }));
    let records = FetchResult::Records(vec![record(0), replacement]);
    let _ = mesh.handle(1_000, fetched(fetch_id, records));
    let _ = mesh.handle(
        1_000,
        Input::ClientPoll {
            group: group(),
            client: ClientId::new("c").unwrap(),
            max: 10,
        },
    );
    let out = effects(&mut mesh);
    let delivered: Vec<(Offset, u32)> = out
        .iter()
        .filter_map(|e| match e {
            Effect::Deliver { delivery, .. } => Some((delivery.record.offset, delivery.attempt)),
            _ => None,
        })
        .collect();
    assert_eq!(delivered, vec![(0, 1), (1, 1)], "{out:?}");
}

/// Kafka-world seed 216855 (C1). Goal: a record dead-lettered again by its lane keeps its
/// DLQ entry although an earlier replay of its old entry was ACKed and that resolution is
/// not yet durable. Method: a group of two attempts starts from a checkpoint recording two
/// attempts for offset 0; the DLQ's entry of the record at 0 is replayed and ACKed, and the
/// persist carrying the resolution fails; then the lane fetches offset 0 and dead-letters
/// it at intake. A batch applies dead letters before resolutions, so before the fix the
/// next batch carried both, the resolution deleted the new dead letter, and the record
/// was durably done with no DLQ entry (the instance was a zombie whose persists were
/// fenced while the resolution waited, and the lane had been re-opened by a seek).
#[test]
fn seed_216855_kafka_a_new_dead_letter_outlives_an_older_resolution_of_its_record() {
    let mut mesh = Mesh::new(MeshConfig::default(), Recovered::default(), 0).unwrap();
    let (t, _) = persist_ticket(&effects(&mut mesh)).unwrap();
    let _ = mesh.handle(0, Input::Persisted { ticket: t });
    let mut spec = SubscriptionSpec::new(group(), TopicName::new("t").unwrap());
    spec.max_attempts = 2;
    assert_eq!(mesh.handle(0, Input::Subscribe(spec)), Response::Ok);
    let _ = mesh.handle(
        0,
        Input::PartitionsAssigned {
            group: group(),
            partitions: vec![Assignment {
                partition: 0,
                earliest: 0,
                end: 1,
                checkpoint: Some(Checkpoint {
                    progress: Progress::new(0),
                    attempts: vec![(0, 2)],
                }),
            }],
        },
    );
    let (fetch_id, _) = last_fetch(&effects(&mut mesh)).unwrap();
    // The record's old DLQ entry is replayed and ACKed.
    let replay = Input::Replay {
        group: group(),
        records: vec![(0, record(0))],
    };
    assert_eq!(mesh.handle(1, replay), Response::Ok);
    let _ = mesh.handle(
        1,
        Input::ClientPoll {
            group: group(),
            client: ClientId::new("c").unwrap(),
            max: 1,
        },
    );
    let replayed = delivered_ids(&effects(&mut mesh));
    assert_eq!(replayed.len(), 1);
    assert_eq!(replayed[0].partition, REPLAY_PARTITION);
    let ack = Input::Ack {
        group: group(),
        ids: replayed,
    };
    assert_eq!(
        mesh.handle(1, ack),
        Response::Settled(vec![Settle::Accepted])
    );
    let _ = mesh.handle(1_000, Input::Tick);
    let (t, batch) = persist_ticket(&effects(&mut mesh)).expect("the resolution is written");
    assert_eq!(batch.dlq_resolved.len(), 1);
    // That write fails (the seed's zombie was fenced): the resolution waits.
    let _ = mesh.handle(1_000, Input::PersistFailed { ticket: t });
    let _ = effects(&mut mesh);
    // The lane fetches the record; its attempts ran out: dead-lettered at intake.
    let _ = mesh.handle(
        1_001,
        Input::Fetched {
            group: group(),
            partition: 0,
            fetch_id,
            result: FetchResult::Records(vec![record(0)]),
        },
    );
    let _ = mesh.handle(2_000, Input::Tick);
    let mut out = effects(&mut mesh);
    let _ = mesh.handle(3_000, Input::Tick);
    out.extend(effects(&mut mesh));
    let batches: Vec<PersistBatch> = out
        .iter()
        .filter_map(|e| match e {
            Effect::Persist { batch, .. } => Some((**batch).clone()),
            _ => None,
        })
        .collect();
    let batch = batches
        .iter()
        .find(|b| !b.dead_letters.is_empty())
        .expect("the dead letter is written");
    assert!(batch
        .checkpoints
        .iter()
        .any(|c| c.checkpoint.progress.is_done(0)));
    // Applied in the batch's order (dead letters, then resolutions), the entry stays.
    let key = &batch.dead_letters[0].key;
    assert_eq!(key.offset, 0);
    assert!(
        !batch.dlq_resolved.contains(key),
        "the batch deletes the dead letter it writes: {batch:?}"
    );
}
