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
