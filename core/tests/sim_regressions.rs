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
