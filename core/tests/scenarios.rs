//! Scenario tests of the mesh, one behaviour of the contract each. Every test drives the
//! public API through the `World` harness (an in-memory log and store) and checks the
//! invariants after every step (`check_every_step`).

mod common;

use bytes::Bytes;
use common::*;
use std::sync::Arc;
use unimesh_core::*;

fn world_with(partitions: u32) -> World {
    let mut w = World::new(World::small_config());
    w.topic("t", partitions);
    w
}

#[test]
fn publish_poll_ack_moves_the_watermark() {
    let mut w = world_with(1);
    w.subscribe(w.spec("g", "t"));
    w.publish("t", 0, "a", None);
    let d = w.poll("g", "c1", 10);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].record.offset, 0);
    assert_eq!(d[0].attempt, 1);
    assert_eq!(w.ack("g", &[d[0].id]), vec![Settle::Accepted]);
    assert_eq!(w.watermark("g", 0), 1);
    // A second ACK changes nothing and says why.
    assert_eq!(
        w.ack("g", &[d[0].id]),
        vec![Settle::Rejected(RejectReason::AlreadyDone)]
    );
}

#[test]
fn nothing_is_delivered_before_the_epoch_is_durable() {
    let mut w = World::new(World::small_config());
    // Start over with a mesh whose epoch persist is held back.
    w.auto_persist = false;
    w.pending_persists.clear();
    w.mesh = Mesh::new(w.config.clone(), Recovered::default(), 0).unwrap();
    w.mesh.check_every_step = true;
    w.topic("t", 1);
    w.subscribe(w.spec("g", "t"));
    w.publish("t", 0, "a", None);
    assert!(w.poll("g", "c", 10).is_empty());
    assert!(!w.mesh.is_ready());
    w.persist_all();
    assert!(w.mesh.is_ready());
    assert_eq!(w.delivered_since(0).len(), 1);
}

#[test]
fn epoch_increments_on_every_restart() {
    let mut w = world_with(1);
    assert_eq!(w.mesh.epoch(), 1);
    w.crash_and_restart();
    assert_eq!(w.mesh.epoch(), 2);
    w.crash_and_restart();
    assert_eq!(w.mesh.epoch(), 3);
}

#[test]
fn clients_compete_least_loaded_first_within_max_in_flight() {
    let mut w = world_with(1);
    let mut spec = w.spec("g", "t");
    spec.max_in_flight_per_client = 2;
    w.subscribe(spec);
    for _ in 0..6 {
        w.publish("t", 0, "a", None);
    }
    let a = w.poll("g", "a", 10);
    assert_eq!(a.len(), 2, "max_in_flight caps a client");
    let b = w.poll("g", "b", 1);
    assert_eq!(b.len(), 1, "credit caps a client");
    let view = w.view("g");
    let held: u32 = view.clients.iter().map(|c| c.in_flight).sum();
    assert_eq!(held, 3);
    // b has credit 0 now, a is full: acking one of a's frees one slot for a.
    w.ack("g", &[a[0].id]);
    let again = w.delivered_since(3);
    assert_eq!(again.len(), 1);
    assert_eq!(w.deliveries[3].1, client("a"));
}

#[test]
fn ties_go_to_the_least_loaded_client() {
    let mut w = world_with(1);
    w.subscribe(w.spec("g", "t"));
    w.poll("g", "a", 10);
    w.poll("g", "b", 10);
    for _ in 0..4 {
        w.publish("t", 0, "a", None);
    }
    let per_client: Vec<_> = w.deliveries.iter().map(|(_, c, _)| c.to_string()).collect();
    assert_eq!(per_client, vec!["a", "b", "a", "b"]);
}

#[test]
fn broadcast_groups_progress_independently() {
    // C7: a fast group never advances a slow one (the seed's shared cursor: #5294).
    let mut w = world_with(1);
    w.subscribe(w.spec("fast", "t"));
    w.subscribe(w.spec("slow", "t"));
    for _ in 0..5 {
        w.publish("t", 0, "a", None);
    }
    let fast = w.poll("fast", "f", 10);
    assert_eq!(fast.len(), 5);
    let ids: Vec<_> = fast.iter().map(|d| d.id).collect();
    w.ack("fast", &ids);
    assert_eq!(w.watermark("fast", 0), 5);
    assert_eq!(w.watermark("slow", 0), 0);
    let slow = w.poll("slow", "s", 10);
    assert_eq!(slow.len(), 5, "the slow group still gets every record");
}

#[test]
fn out_of_order_acks_hold_the_watermark_at_the_gap() {
    let mut w = world_with(1);
    w.subscribe(w.spec("g", "t"));
    for _ in 0..4 {
        w.publish("t", 0, "a", None);
    }
    let d = w.poll("g", "c", 10);
    w.ack("g", &[d[3].id, d[1].id, d[2].id]);
    assert_eq!(w.watermark("g", 0), 0);
    assert_eq!(w.view("g").lanes[0].ack_ranges, vec![(1, 4)]);
    w.ack("g", &[d[0].id]);
    assert_eq!(w.watermark("g", 0), 4);
}

#[test]
fn ack_timeout_redelivers_with_backoff_and_counts_attempts() {
    let mut w = world_with(1);
    let mut spec = w.spec("g", "t");
    spec.ack_timeout_ms = 1_000;
    spec.backoff = Backoff {
        initial_ms: 100,
        max_ms: 150,
        multiplier: 2.0,
    };
    w.subscribe(spec);
    w.publish("t", 0, "a", None);
    let first = w.poll("g", "c", 10);
    assert_eq!(first[0].attempt, 1);
    w.advance(999);
    assert_eq!(w.deliveries.len(), 1);
    w.advance(1); // timeout at 1000, backoff 100 ms
    assert_eq!(w.deliveries.len(), 1, "waits out the backoff");
    w.poll("g", "c", 10);
    w.advance(100);
    assert_eq!(w.deliveries.len(), 2);
    let second = &w.deliveries[1].2;
    assert_eq!(second.attempt, 2);
    assert_ne!(second.id, first[0].id);
    assert_eq!(second.record.offset, 0);
    // Third attempt: backoff doubled to 200, capped at 150.
    w.advance(1_000);
    w.advance(149);
    assert_eq!(w.deliveries.len(), 2);
    w.advance(1);
    assert_eq!(w.deliveries.len(), 3);
    assert_eq!(w.deliveries[2].2.attempt, 3);
    assert_eq!(w.view("g").stats.expired, 2);
}

#[test]
fn nack_with_delay_redelivers_after_the_delay() {
    let mut w = world_with(1);
    w.subscribe(w.spec("g", "t"));
    w.publish("t", 0, "a", None);
    let d = w.poll("g", "c", 10);
    assert_eq!(w.nack("g", &[d[0].id], Some(500)), vec![Settle::Accepted]);
    w.advance(499);
    assert_eq!(w.deliveries.len(), 1);
    w.advance(1);
    assert_eq!(w.deliveries.len(), 2);
    assert_eq!(w.deliveries[1].2.attempt, 2);
    // NACKing the old delivery again is refused: it already ended.
    assert_eq!(
        w.nack("g", &[d[0].id], None),
        vec![Settle::Rejected(RejectReason::AlreadyDone)]
    );
}

#[test]
fn redelivery_waits_until_its_attempt_number_is_durable() {
    // C5 across crashes: attempt 2 is handed out only after the ledger says 2 durably.
    let mut w = world_with(1);
    w.subscribe(w.spec("g", "t"));
    w.publish("t", 0, "a", None);
    let d = w.poll("g", "c", 10);
    w.auto_persist = false;
    w.nack("g", &[d[0].id], Some(0));
    w.advance(1_000);
    assert_eq!(
        w.deliveries.len(),
        1,
        "no redelivery before the ledger persist"
    );
    let batch = &w.pending_persists.back().expect("a persist is pending").1;
    assert_eq!(batch.checkpoints[0].checkpoint.attempts, vec![(0, 2)]);
    w.persist_all();
    assert_eq!(w.deliveries.len(), 2);
    assert_eq!(w.deliveries[1].2.attempt, 2);
}

#[test]
fn dead_letter_after_max_attempts_exactly_once() {
    let mut w = world_with(1);
    let mut spec = w.spec("g", "t");
    spec.max_attempts = 2;
    spec.ack_timeout_ms = 100;
    spec.backoff.initial_ms = 0;
    w.subscribe(spec);
    w.publish("t", 0, "poison", None);
    w.poll("g", "c", 10);
    w.advance(100); // timeout; the redelivery waits for its ledger flush
    assert_eq!(w.deliveries.len(), 1);
    w.advance(10);
    assert_eq!(w.deliveries.len(), 2);
    w.advance(1_000);
    assert_eq!(w.deliveries.len(), 2, "no third attempt");
    assert_eq!(w.watermark("g", 0), 1, "dead-lettered counts as done");
    let key = (group("g"), 0, 0);
    assert_eq!(w.store.dlq[&key].attempts, 2);
    assert_eq!(w.store.dlq[&key].reason, DeadLetterReason::AckTimeout);
    assert_eq!(w.store.dlq_writes[&key], 1);
    // A restart does not dead-letter it again nor redeliver it.
    w.crash_and_restart();
    w.poll("g", "c", 10);
    w.advance(1_000);
    assert_eq!(w.deliveries.len(), 2);
    assert_eq!(w.store.dlq_writes[&key], 1);
}

#[test]
fn dead_letter_and_progress_are_in_the_same_batch() {
    // The seed logged a failed DLQ write and retired the delivery anyway (#5292).
    let mut w = world_with(1);
    let mut spec = w.spec("g", "t");
    spec.max_attempts = 1;
    w.subscribe(spec);
    w.publish("t", 0, "a", None);
    let d = w.poll("g", "c", 1);
    w.auto_persist = false;
    w.nack("g", &[d[0].id], None);
    w.advance(100);
    let (ticket, batch) = w.pending_persists.pop_front().expect("persist");
    assert_eq!(batch.dead_letters.len(), 1);
    assert_eq!(batch.checkpoints[0].checkpoint.progress.watermark(), 1);
    // The write fails: nothing counts, and the retry carries the dead letter again.
    let _ = w.handle(Input::PersistFailed { ticket });
    w.advance(1_000);
    let batch = &w.pending_persists.back().expect("retried").1;
    assert_eq!(batch.dead_letters.len(), 1);
    assert_eq!(batch.checkpoints[0].checkpoint.progress.watermark(), 1);
    w.persist_all();
    assert_eq!(w.store.dlq.len(), 1);
}

#[test]
fn stale_ack_from_a_former_epoch_is_refused() {
    let mut w = world_with(1);
    w.subscribe(w.spec("g", "t"));
    w.publish("t", 0, "a", None);
    let before = w.poll("g", "c", 10);
    w.advance(100);
    w.crash_and_restart();
    let after = w.poll("g", "c", 10);
    assert_eq!(after.len(), 1, "the in-flight record comes again");
    assert_eq!(after[0].record.offset, 0);
    assert_eq!(
        w.ack("g", &[before[0].id]),
        vec![Settle::Rejected(RejectReason::Stale)]
    );
    assert_eq!(w.watermark("g", 0), 0, "a stale ACK changes nothing");
    assert_eq!(w.ack("g", &[after[0].id]), vec![Settle::Accepted]);
}

#[test]
fn restart_resumes_at_the_watermark_and_skips_persisted_ranges() {
    let mut w = world_with(1);
    w.subscribe(w.spec("g", "t"));
    for _ in 0..6 {
        w.publish("t", 0, "a", None);
    }
    let d = w.poll("g", "c", 10);
    // ACK 0, 1, 3, 5: watermark 2, ranges {3}, {5}.
    w.ack("g", &[d[0].id, d[1].id, d[3].id, d[5].id]);
    w.advance(100); // flush
    w.crash_and_restart();
    assert_eq!(w.watermark("g", 0), 2);
    let again = w.poll("g", "c", 10);
    let offsets: Vec<_> = again.iter().map(|d| d.record.offset).collect();
    assert_eq!(
        offsets,
        vec![2, 4],
        "only the un-ACKed records come again (C2)"
    );
}

#[test]
fn acks_not_yet_flushed_may_be_redelivered_after_a_crash() {
    let mut w = world_with(1);
    w.subscribe(w.spec("g", "t"));
    w.publish("t", 0, "a", None);
    let d = w.poll("g", "c", 10);
    w.advance(100);
    w.auto_persist = false;
    w.ack("g", &[d[0].id]);
    w.crash_and_restart();
    w.auto_persist = true;
    w.pump();
    let again = w.poll("g", "c", 10);
    assert_eq!(
        again.len(),
        1,
        "an ACK lost before its flush is a bounded duplicate"
    );
}

#[test]
fn duplicate_and_rewound_fetch_answers_are_ignored() {
    let mut w = world_with(1);
    w.subscribe(w.spec("g", "t"));
    // Take the parked fetch out so the harness does not answer it, then fill the log.
    let (g, _, p, id, from, _) = w.parked.pop().expect("a fetch is parked");
    assert_eq!(from, 0);
    for _ in 0..4 {
        w.publish("t", 0, "a", None);
    }
    // Duplicates inside one answer.
    let recs = vec![
        event(0, "a", None),
        event(0, "a", None),
        event(1, "a", None),
    ];
    let _ = w.mesh.handle(
        w.now,
        Input::Fetched {
            group: g,
            partition: p,
            fetch_id: id,
            result: FetchResult::Records(recs),
        },
    );
    w.pump(); // the next fetch (from 2) is answered by the harness: 2, 3
    let d = w.poll("g", "c", 10);
    assert_eq!(d.len(), 4);
    w.ack("g", &[d[0].id]);
    let (g, _, p, id, from, _) = w.parked.pop().expect("next fetch");
    assert_eq!(from, 4);
    w.publish("t", 0, "a", None);
    // The broker answers from an earlier offset than asked.
    let rewound = vec![
        event(2, "a", None),
        event(3, "a", None),
        event(4, "a", None),
    ];
    let _ = w.mesh.handle(
        w.now,
        Input::Fetched {
            group: g,
            partition: p,
            fetch_id: id,
            result: FetchResult::Records(rewound),
        },
    );
    w.pump();
    let offsets: Vec<_> = w.deliveries.iter().map(|d| d.2.record.offset).collect();
    assert_eq!(offsets, vec![0, 1, 2, 3, 4], "each record delivered once");
    assert_eq!(w.mesh.stats().duplicate_records, 3);
}

#[test]
fn a_fetch_answer_with_an_old_id_is_ignored() {
    let mut w = world_with(1);
    w.subscribe(w.spec("g", "t"));
    let (g, _, p, id, _, _) = w.parked.pop().expect("parked");
    let _ = w.mesh.handle(
        w.now,
        Input::Fetched {
            group: g,
            partition: p,
            fetch_id: id + 1000,
            result: FetchResult::Records(vec![event(0, "a", None)]),
        },
    );
    assert_eq!(w.mesh.stats().stale_fetch_answers, 1);
    assert!(w.poll("g", "c", 10).is_empty());
}

#[test]
fn out_of_range_moves_the_cursor_and_reports_the_skip() {
    let mut w = world_with(1);
    for _ in 0..10 {
        w.publish("t", 0, "a", None);
    }
    w.earliest.insert((topic("t"), 0), 7); // retention removed 0..7
    w.subscribe(w.spec("g", "t"));
    // Earliest groups start at the assignment's earliest (0 here, as the harness says),
    // so the broker answers out-of-range and the core reports what it never saw.
    let skipped = w.skipped.clone();
    assert_eq!(skipped.len(), 1);
    match &skipped[0] {
        Effect::Skipped {
            from,
            to,
            not_done,
            reason,
            ..
        } => {
            assert_eq!((*from, *to, *not_done), (0, 7, 7));
            assert_eq!(*reason, SkipReason::Retention);
        }
        other => panic!("{other:?}"),
    }
    let d = w.poll("g", "c", 10);
    assert_eq!(d.first().map(|d| d.record.offset), Some(7));
}

#[test]
fn broker_truncation_rewinds_the_lane_and_reports_it() {
    let mut w = world_with(1);
    w.subscribe(w.spec("g", "t"));
    for _ in 0..5 {
        w.publish("t", 0, "a", None);
    }
    let d = w.poll("g", "c", 10);
    let ids: Vec<_> = d.iter().map(|d| d.id).collect();
    w.ack("g", &ids[..3]);
    // The broker loses offsets 2.. (its new end is 2).
    w.log.get_mut(&topic("t")).unwrap()[0].truncate(2);
    let (g, _, p, id, _, _) = w.parked.pop().expect("parked");
    let _ = w.mesh.handle(
        w.now,
        Input::Fetched {
            group: g,
            partition: p,
            fetch_id: id,
            result: FetchResult::OutOfRange {
                earliest: 0,
                end: 2,
            },
        },
    );
    w.pump();
    assert!(w.skipped.iter().any(|e| matches!(
        e,
        Effect::Skipped {
            reason: SkipReason::BrokerTruncated,
            from: 2,
            to: 5,
            ..
        }
    )));
    assert_eq!(w.watermark("g", 0), 2);
    let c = w.view("g").clients[0].clone();
    assert_eq!(c.in_flight, 0, "deliveries of lost offsets are withdrawn");
    let before = w.deliveries.len();
    let new = w.publish("t", 0, "b", None);
    assert_eq!(new, 2);
    let d = w.delivered_since(before);
    assert_eq!(d.last().map(|d| (d.record.offset, d.attempt)), Some((2, 1)));
    assert_eq!(
        d.last().map(|d| d.record.meta.clone()),
        Some(event(2, "b", None).meta)
    );
}

#[test]
fn revoked_partition_stops_every_effect_and_late_acks_say_revoked() {
    let mut config = World::small_config();
    config.commit_to_broker = true;
    let mut w = World::new(config);
    w.topic("t", 2);
    w.subscribe(w.spec("g", "t"));
    w.publish("t", 0, "a", None);
    w.publish("t", 1, "a", None);
    let d = w.poll("g", "c", 10);
    assert_eq!(d.len(), 2);
    let on_p0 = d.iter().find(|d| d.id.partition == 0).unwrap().id;
    let commits_before = w.commits.len();
    let _ = w.handle(Input::PartitionsRevoked {
        group: group("g"),
        partitions: vec![0],
    });
    assert_eq!(
        w.ack("g", &[on_p0]),
        vec![Settle::Rejected(RejectReason::Revoked)]
    );
    w.advance(1_000);
    assert!(
        w.commits[commits_before..].iter().all(|c| c.1 != 0),
        "no commit for a revoked partition (#5360)"
    );
    assert_eq!(w.view("g").clients[0].in_flight, 1);
}

/// Goal: an ACK answered while a revocation waits for its flush is durable before the
/// partition leaves, and a partition being revoked hands out nothing more (issue 23: the
/// shell flushed once, then dropped the lane with the ACKs answered meanwhile, and a
/// durability barrier answered after them was a lie).
/// Method: two deliveries on partition 0; the first ACKed and flushed (the persist held
/// back); `PartitionsRevoking`; the second ACKed while that persist is outstanding; a
/// NACK'd record and a new one published must not go out; then the persists answered one
/// by one, `revoke_pending` asked after each.
#[test]
fn an_ack_answered_while_a_revocation_flushes_is_durable_before_the_partition_leaves() {
    let mut w = World::new(World::small_config());
    w.topic("t", 1);
    w.subscribe(w.spec("g", "t"));
    for _ in 0..3 {
        w.publish("t", 0, "a", None);
    }
    let d = w.poll("g", "c", 3);
    assert_eq!(d.len(), 3);
    w.advance(100);
    w.auto_persist = false;
    w.ack("g", &[d[0].id]);
    let _ = w.handle(Input::FlushNow);
    let (first, batch) = w.pending_persists.pop_front().expect("a flush");
    assert_eq!(batch.checkpoints[0].checkpoint.progress.watermark(), 1);
    let revoking = vec![0];
    assert_eq!(
        w.handle(Input::PartitionsRevoking {
            group: group("g"),
            partitions: revoking.clone(),
        }),
        Response::Ok
    );
    assert!(
        w.mesh.revoke_pending(&group("g"), &revoking),
        "the flush is out"
    );
    assert_eq!(w.ack("g", &[d[1].id]), vec![Settle::Accepted]);
    assert_eq!(w.nack("g", &[d[2].id], None), vec![Settle::Accepted]);
    let before = w.deliveries.len();
    w.publish("t", 0, "b", None);
    let _ = w.poll("g", "c2", 10);
    w.advance(1_000);
    assert!(
        w.delivered_since(before).is_empty(),
        "a partition being revoked hands out nothing"
    );
    // The first persist is durable, but the second ACK came after it was written.
    w.store.apply(&batch);
    let _ = w.handle(Input::Persisted { ticket: first });
    assert!(
        w.mesh.revoke_pending(&group("g"), &revoking),
        "an ACK since the last persist is not durable yet"
    );
    w.persist_all();
    assert!(!w.mesh.revoke_pending(&group("g"), &revoking));
    let stored = w.store.checkpoints[&(group("g"), 0)].clone();
    assert_eq!(stored.progress.watermark(), 2, "both ACKs are in the store");
    let _ = w.handle(Input::PartitionsRevoked {
        group: group("g"),
        partitions: revoking,
    });
    assert!(w.view("g").lanes.is_empty());
}

#[test]
fn persist_failure_keeps_progress_unconfirmed_and_retries() {
    let mut config = World::small_config();
    config.commit_to_broker = true;
    let mut w = World::new(config);
    w.topic("t", 1);
    w.subscribe(w.spec("g", "t"));
    w.publish("t", 0, "a", None);
    let d = w.poll("g", "c", 10);
    w.advance(100);
    w.auto_persist = false;
    let commits = w.commits.len();
    w.ack("g", &[d[0].id]);
    w.advance(10);
    let (ticket, _) = w.pending_persists.pop_front().expect("flush");
    let _ = w.handle(Input::PersistFailed { ticket });
    assert_eq!(
        w.commits.len(),
        commits,
        "nothing committed after a failed persist (#5290)"
    );
    assert_eq!(w.view("g").lanes[0].durable_watermark, Some(0));
    w.advance(1_000);
    w.persist_all();
    assert_eq!(w.view("g").lanes[0].durable_watermark, Some(1));
    assert_eq!(w.commits.last(), Some(&(group("g"), 0, 1)));
}

#[test]
fn commits_are_coalesced_one_per_flush() {
    let mut config = World::small_config();
    config.commit_to_broker = true;
    config.flush_interval_ms = 50;
    let mut w = World::new(config);
    w.topic("t", 1);
    w.subscribe(w.spec("g", "t"));
    for _ in 0..20 {
        w.publish("t", 0, "a", None);
    }
    let d = w.poll("g", "c", 100);
    let persists_before = w.mesh.stats().persists;
    let commits_before = w.commits.len();
    for x in &d {
        w.ack("g", &[x.id]);
    }
    w.advance(50);
    assert_eq!(
        w.mesh.stats().persists - persists_before,
        1,
        "20 ACKs, one persist"
    );
    assert_eq!(w.commits.len() - commits_before, 1);
    assert_eq!(w.commits.last(), Some(&(group("g"), 0, 20)));
}

#[test]
fn key_order_one_client_at_a_time_in_offset_order() {
    let mut w = world_with(1);
    let mut spec = w.spec("g", "t");
    spec.ordering = Ordering::Key;
    w.subscribe(spec);
    w.publish("t", 0, "a", Some("k1")); // 0
    w.publish("t", 0, "a", Some("k1")); // 1
    w.publish("t", 0, "a", Some("k2")); // 2
    w.publish("t", 0, "a", None); // 3
    w.publish("t", 0, "a", Some("k1")); // 4
    let a = w.poll("g", "a", 10);
    let b = w.poll("g", "b", 10);
    let mut offsets: Vec<_> = a.iter().chain(&b).map(|d| d.record.offset).collect();
    offsets.sort();
    assert_eq!(
        offsets,
        vec![0, 2, 3],
        "k1's later records wait for offset 0"
    );
    let zero = a
        .iter()
        .chain(&b)
        .find(|d| d.record.offset == 0)
        .unwrap()
        .id;
    // A NACK keeps the key: offset 0 must come again before 1.
    w.nack("g", &[zero], Some(0));
    w.advance(100);
    let next = w.deliveries.last().unwrap().2.clone();
    assert_eq!((next.record.offset, next.attempt), (0, 2));
    w.ack("g", &[next.id]);
    assert_eq!(w.deliveries.last().unwrap().2.record.offset, 1);
    let one = w.deliveries.last().unwrap().2.id;
    w.ack("g", &[one]);
    assert_eq!(w.deliveries.last().unwrap().2.record.offset, 4);
}

#[test]
fn filters_complete_non_matching_records_without_delivery() {
    let mut w = world_with(1);
    let mut spec = w.spec("g", "t");
    spec.filter = Filter {
        type_prefix: Some("order.".into()),
        ..Default::default()
    };
    w.subscribe(spec);
    w.publish("t", 0, "order.created", None);
    w.publish("t", 0, "invoice.sent", None);
    w.publish("t", 0, "order.paid", None);
    let d = w.poll("g", "c", 10);
    let offsets: Vec<_> = d.iter().map(|d| d.record.offset).collect();
    assert_eq!(offsets, vec![0, 2]);
    let ids: Vec<_> = d.iter().map(|d| d.id).collect();
    w.ack("g", &ids);
    assert_eq!(w.watermark("g", 0), 3, "the filtered record counts as done");
    assert_eq!(w.view("g").stats.filtered, 1);
}

#[test]
fn window_cap_pauses_fetching_and_bounds_memory() {
    let mut config = World::small_config();
    config.max_window_per_lane = 8;
    config.fetch_batch = 8;
    let mut w = World::new(config);
    w.topic("t", 1);
    w.subscribe(w.spec("g", "t"));
    for _ in 0..50 {
        w.publish("t", 0, "a", None);
    }
    let lane = &w.view("g").lanes[0];
    assert!(lane.cursor <= 8, "fetched only what fits: {}", lane.cursor);
    assert!(!lane.fetch_outstanding, "paused while the window is full");
    let held = lane.cursor;
    let d = w.poll("g", "c", 100);
    assert_eq!(d.len() as u64, held);
    let ids: Vec<_> = d.iter().map(|d| d.id).collect();
    w.ack("g", &ids);
    let lane = &w.view("g").lanes[0];
    assert!(lane.cursor > held, "room again: fetching resumes");
    assert!(lane.cursor - held <= 8);
}

#[test]
fn ack_range_cap_pauses_fetching_never_drops() {
    let mut config = World::small_config();
    config.max_ack_ranges_per_lane = 2;
    config.max_window_per_lane = 16;
    config.fetch_batch = 16;
    let mut w = World::new(config);
    w.topic("t", 1);
    let mut spec = w.spec("g", "t");
    spec.max_in_flight_per_client = 100;
    w.subscribe(spec);
    for _ in 0..40 {
        w.publish("t", 0, "a", None);
    }
    let d = w.poll("g", "c", 100);
    // ACK every other record: ranges pile up above the un-ACKed offset 0.
    let odd: Vec<_> = d
        .iter()
        .filter(|d| d.record.offset % 2 == 1)
        .map(|d| d.id)
        .collect();
    w.ack("g", &odd);
    let cursor = w.view("g").lanes[0].cursor;
    assert!(w.view("g").lanes[0].ack_ranges.len() >= 2);
    assert_eq!(w.mesh.stats().fetch_pauses_for_ranges, 1);
    for _ in 0..5 {
        w.publish("t", 0, "a", None);
    }
    assert_eq!(w.view("g").lanes[0].cursor, cursor, "paused");
    let even: Vec<_> = d
        .iter()
        .filter(|d| d.record.offset % 2 == 0)
        .map(|d| d.id)
        .collect();
    w.ack("g", &even);
    assert!(
        w.view("g").lanes[0].cursor > cursor,
        "resumes once gaps close"
    );
}

#[test]
fn a_departing_client_hands_back_its_deliveries_at_once() {
    let mut w = world_with(1);
    w.subscribe(w.spec("g", "t"));
    w.publish("t", 0, "a", None);
    let d = w.poll("g", "a", 10);
    w.poll("g", "b", 10);
    let _ = w.handle(Input::ClientGone {
        group: group("g"),
        client: client("a"),
    });
    // No waiting for the ACK timeout (#5282): b gets it once the ledger is durable,
    // one flush interval later.
    w.advance(10);
    let last = &w.deliveries.last().unwrap();
    assert_eq!(last.1, client("b"));
    assert_eq!(last.2.record.offset, d[0].record.offset);
    assert_eq!(last.2.attempt, 2);
    assert_eq!(w.view("g").clients.len(), 1);
}

#[test]
fn idle_clients_are_forgotten() {
    let mut config = World::small_config();
    config.client_idle_timeout_ms = 1_000;
    let mut w = World::new(config);
    w.topic("t", 1);
    w.subscribe(w.spec("g", "t"));
    w.poll("g", "a", 0);
    assert_eq!(w.view("g").clients.len(), 1);
    w.advance(1_000);
    assert!(w.view("g").clients.is_empty());
}

#[test]
fn late_ack_of_an_earlier_attempt_completes_the_record() {
    let mut w = world_with(1);
    let mut spec = w.spec("g", "t");
    spec.ack_timeout_ms = 100;
    spec.backoff.initial_ms = 0;
    w.subscribe(spec);
    w.publish("t", 0, "a", None);
    let first = w.poll("g", "a", 10);
    w.advance(110);
    let second = w.deliveries.last().unwrap().2.clone();
    assert_eq!(second.attempt, 2);
    assert_eq!(w.ack("g", &[first[0].id]), vec![Settle::Accepted]);
    assert_eq!(w.watermark("g", 0), 1);
    assert_eq!(
        w.ack("g", &[second.id]),
        vec![Settle::Rejected(RejectReason::AlreadyDone)]
    );
    assert_eq!(w.view("g").clients[0].in_flight, 0);
}

#[test]
fn extend_moves_the_deadline() {
    let mut w = world_with(1);
    let mut spec = w.spec("g", "t");
    spec.ack_timeout_ms = 100;
    w.subscribe(spec);
    w.publish("t", 0, "a", None);
    let d = w.poll("g", "a", 10);
    w.advance(90);
    let r = w.handle(Input::Extend {
        group: group("g"),
        ids: vec![d[0].id],
        extend_ms: Some(500),
    });
    assert_eq!(r, Response::Settled(vec![Settle::Accepted]));
    w.advance(499);
    assert_eq!(w.view("g").stats.expired, 0);
    w.advance(1);
    assert_eq!(w.view("g").stats.expired, 1);
}

#[test]
fn unknown_and_forged_ids_are_refused_and_change_nothing() {
    let mut w = world_with(1);
    w.subscribe(w.spec("g", "t"));
    w.publish("t", 0, "a", None);
    let d = w.poll("g", "a", 10)[0].id;
    let forged = [
        DeliveryId {
            epoch: d.epoch + 1,
            ..d
        },
        DeliveryId {
            lease: d.lease + 100,
            ..d
        },
        DeliveryId { partition: 9, ..d },
        DeliveryId { offset: 99, ..d },
        DeliveryId { attempt: 7, ..d },
        DeliveryId { attempt: 0, ..d },
    ];
    for f in forged {
        assert_eq!(
            w.ack("g", &[f]),
            vec![Settle::Rejected(RejectReason::Unknown)],
            "{f}"
        );
    }
    assert_eq!(w.watermark("g", 0), 0);
    assert_eq!(w.view("g").clients[0].in_flight, 1);
    assert_eq!(
        w.handle(Input::Ack {
            group: group("nope"),
            ids: vec![d]
        }),
        Response::Refused(Refusal::UnknownGroup)
    );
}

#[test]
fn replay_delivers_to_one_group_only_and_resolves_the_dlq_entry() {
    let mut w = world_with(1);
    let mut spec = w.spec("g", "t");
    spec.max_attempts = 1;
    w.subscribe(spec);
    w.subscribe(w.spec("other", "t"));
    w.publish("t", 0, "a", None);
    let d = w.poll("g", "c", 10);
    w.nack("g", &[d[0].id], None);
    w.advance(100);
    let key = (group("g"), 0, 0);
    let dl = w.store.dlq[&key].clone();
    let other_before = w.view("other").stats.clone();
    let before = w.deliveries.len();
    let r = w.handle(Input::Replay {
        group: group("g"),
        records: vec![(0, dl.record.clone())],
    });
    assert_eq!(r, Response::Ok);
    let again = w.delivered_since(before);
    assert_eq!(again.len(), 1);
    assert_eq!(
        (again[0].partition, again[0].record.offset, again[0].attempt),
        (0, 0, 1)
    );
    assert_eq!(again[0].id.partition, REPLAY_PARTITION);
    w.ack("g", &[again[0].id]);
    w.advance(100);
    assert!(
        !w.store.dlq.contains_key(&key),
        "an ACKed replay leaves the DLQ"
    );
    assert_eq!(
        w.view("other").stats,
        other_before,
        "other groups are not disturbed"
    );
}

#[test]
fn seek_rewinds_the_lane_and_revokes_its_deliveries() {
    let mut w = world_with(1);
    w.subscribe(w.spec("g", "t"));
    for _ in 0..3 {
        w.publish("t", 0, "a", None);
    }
    let d = w.poll("g", "c", 10);
    let ids: Vec<_> = d.iter().map(|d| d.id).collect();
    w.ack("g", &ids[..2]);
    let before = w.deliveries.len();
    let r = w.handle(Input::Seek {
        group: group("g"),
        partition: 0,
        offset: 0,
    });
    assert_eq!(r, Response::Ok);
    assert_eq!(w.watermark("g", 0), 0);
    assert_eq!(
        w.ack("g", &[ids[2]]),
        vec![Settle::Rejected(RejectReason::Revoked)]
    );
    let again = w.delivered_since(before);
    let offsets: Vec<_> = again.iter().map(|d| d.record.offset).collect();
    assert_eq!(
        offsets,
        vec![0, 1, 2],
        "the client's open credit takes them at once"
    );
}

#[test]
fn undecodable_records_are_dead_lettered_not_dropped() {
    let mut w = world_with(1);
    w.subscribe(w.spec("g", "t"));
    w.publish_raw(
        "t",
        0,
        Record {
            offset: 0,
            meta: RecordMeta::Undecodable(Arc::from("bad json")),
            body: Bytes::from_static(b"{"),
            broker_handle: None,
        },
    );
    w.publish("t", 0, "a", None);
    let d = w.poll("g", "c", 10);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].record.offset, 1);
    w.advance(100);
    let dl = &w.store.dlq[&(group("g"), 0, 0)];
    assert_eq!(dl.reason, DeadLetterReason::Undecodable("bad json".into()));
}

#[test]
fn recovered_attempts_at_the_limit_dead_letter_without_delivery() {
    let mut w = world_with(1);
    let mut spec = w.spec("g", "t");
    spec.max_attempts = 2;
    spec.backoff.initial_ms = 0;
    w.subscribe(spec);
    w.publish("t", 0, "a", None);
    let d = w.poll("g", "c", 10);
    w.nack("g", &[d[0].id], None); // ledger: attempt 2 may go out
    w.advance(100);
    assert_eq!(w.deliveries.len(), 2);
    w.crash_and_restart(); // attempt 2 was in flight: it counts
    w.poll("g", "c", 10);
    w.advance(100);
    assert_eq!(
        w.deliveries.len(),
        2,
        "no attempt 3, no repeat of attempt 2"
    );
    assert!(w.store.dlq.contains_key(&(group("g"), 0, 0)));
}

#[test]
fn broker_acks_go_out_only_once_durable() {
    let mut w = world_with(1);
    w.subscribe(w.spec("g", "t"));
    let mut r = event(0, "a", None);
    r.broker_handle = Some(Bytes::from_static(b"receipt-0"));
    w.publish_raw("t", 0, r);
    let d = w.poll("g", "c", 10);
    w.auto_persist = false;
    w.ack("g", &[d[0].id]);
    w.advance(100);
    assert!(w.broker_acks.is_empty(), "not before Persisted (C6, #5295)");
    w.persist_all();
    assert_eq!(w.broker_acks, vec![Bytes::from_static(b"receipt-0")]);
}

/// `check_subscribe` answers what `Subscribe` would, and changes nothing itself.
#[test]
fn check_subscribe_predicts_the_answer_without_changing_anything() {
    let mut config = World::small_config();
    config.max_groups = 2;
    let mut w = World::new(config);
    w.topic("t", 1);
    w.subscribe(w.spec("g", "t"));
    let mut invalid = w.spec("h", "t");
    invalid.max_attempts = 0;
    let mut keyed = w.spec("g", "t");
    keyed.ordering = Ordering::Key;
    let mut update = w.spec("g", "t");
    update.ack_timeout_ms = 7;
    let cases = vec![
        invalid,
        w.spec("g", "u"),
        keyed,
        update,
        w.spec("h", "t"),
        w.spec("i", "t"),
    ];
    for spec in cases {
        let before = (
            w.mesh.subscription(&spec.group).cloned(),
            w.mesh.group_names().count(),
        );
        let predicted = w.mesh.check_subscribe(&spec);
        assert_eq!(
            before,
            (
                w.mesh.subscription(&spec.group).cloned(),
                w.mesh.group_names().count()
            ),
            "checking changed something"
        );
        let answer = w.handle(Input::Subscribe(spec.clone()));
        match predicted {
            Ok(()) => assert_eq!(answer, Response::Ok, "{spec:?}"),
            Err(r) => assert_eq!(answer, Response::Refused(r), "{spec:?}"),
        }
    }
    // The last one hit the group limit (g and h exist).
    assert_eq!(w.mesh.group_names().count(), 2);
}

#[test]
fn subscription_updates_keep_topic_and_ordering() {
    let mut w = world_with(1);
    w.subscribe(w.spec("g", "t"));
    let mut other_topic = w.spec("g", "u");
    other_topic.ack_timeout_ms = 5;
    assert!(matches!(
        w.handle(Input::Subscribe(other_topic)),
        Response::Refused(Refusal::TopicCannotChange { .. })
    ));
    let mut keyed = w.spec("g", "t");
    keyed.ordering = Ordering::Key;
    assert_eq!(
        w.handle(Input::Subscribe(keyed)),
        Response::Refused(Refusal::OrderingCannotChange)
    );
    let mut bad = w.spec("g", "t");
    bad.max_attempts = 0;
    assert!(matches!(
        w.handle(Input::Subscribe(bad)),
        Response::Refused(Refusal::InvalidSpec(_))
    ));
    let mut fine = w.spec("g", "t");
    fine.ack_timeout_ms = 7;
    assert_eq!(w.handle(Input::Subscribe(fine)), Response::Ok);
    assert_eq!(w.mesh.subscription(&group("g")).unwrap().ack_timeout_ms, 7);
    w.advance(100);
    assert_eq!(w.store.subscriptions[&group("g")].ack_timeout_ms, 7);
}

#[test]
fn unsubscribe_forgets_the_group_durably() {
    let mut w = world_with(1);
    w.subscribe(w.spec("g", "t"));
    w.publish("t", 0, "a", None);
    w.poll("g", "c", 10);
    w.advance(100);
    assert!(w.store.checkpoints.contains_key(&(group("g"), 0)));
    let before = w.mesh.group_view(&group("g")).unwrap().stats;
    assert_eq!(before.delivered, 1);
    assert_eq!(w.mesh.stats().removed_group_totals, GroupStats::default());
    assert_eq!(
        w.handle(Input::Unsubscribe { group: group("g") }),
        Response::Ok
    );
    // Its counters stay in the instance's totals, which never go down.
    assert_eq!(w.mesh.stats().removed_group_totals, before);
    w.advance(100);
    assert!(w.store.subscriptions.is_empty());
    assert!(w.store.checkpoints.is_empty());
    assert!(w.mesh.group_view(&group("g")).is_none());
    w.crash_and_restart();
    assert!(w.mesh.group_view(&group("g")).is_none());
}

#[test]
fn limits_refuse_with_a_reason() {
    let mut config = World::small_config();
    config.max_groups = 1;
    config.max_clients_per_group = 1;
    let mut w = World::new(config);
    w.topic("t", 1);
    w.subscribe(w.spec("g", "t"));
    assert_eq!(
        w.handle(Input::Subscribe(w.spec("h", "t"))),
        Response::Refused(Refusal::TooManyGroups { max: 1 })
    );
    w.poll("g", "a", 1);
    assert_eq!(
        w.handle(Input::ClientPoll {
            group: group("g"),
            client: client("b"),
            max: 1
        }),
        Response::Refused(Refusal::TooManyClients { max: 1 })
    );
}

#[test]
fn latest_start_skips_what_was_published_before() {
    let mut w = world_with(1);
    w.publish("t", 0, "old", None);
    w.publish("t", 0, "old", None);
    let mut spec = w.spec("g", "t");
    spec.start_from = StartFrom::Latest(Default::default());
    w.subscribe(spec);
    w.publish("t", 0, "new", None);
    let d = w.poll("g", "c", 10);
    assert_eq!(d.len(), 1);
    assert_eq!(d[0].record.offset, 2);
    // The start position is pinned durably: a restart does not re-resolve "latest".
    w.advance(100);
    w.crash_and_restart();
    let again = w.poll("g", "c", 10);
    assert_eq!(again.first().map(|d| d.record.offset), Some(2));
}

#[test]
fn clock_going_backwards_is_ignored_and_counted() {
    let mut w = world_with(1);
    w.now = 1_000;
    let _ = w.handle(Input::Tick);
    w.now = 500;
    let _ = w.handle(Input::Tick);
    assert_eq!(w.mesh.stats().clock_regressions, 1);
    assert_eq!(w.mesh.now(), 1_000);
}

#[test]
fn watermark_may_pass_the_cursor_over_persisted_ranges_after_restart() {
    // Found by the model test: recovered watermark 0 with offset 1 done; offset 0 is
    // filtered when fetched again, so the watermark folds in offset 1 before the cursor
    // reaches it. Offset 1 must not be delivered again, and nothing else is skipped.
    let mut config = World::small_config();
    config.fetch_batch = 1; // one record per fetch, so the state is visible between fetches
    let mut w = World::new(config);
    w.topic("t", 1);
    w.subscribe(w.spec("g", "t"));
    for _ in 0..3 {
        w.publish("t", 0, "keep", None);
    }
    let d = w.poll("g", "c", 10);
    w.ack("g", &[d[1].id]);
    // The operator narrows the filter so offset 0 will not match when fetched again.
    let mut narrow = w.spec("g", "t");
    narrow.filter = Filter {
        ty: Some("keep".into()),
        ..Default::default()
    };
    let _ = w.handle(Input::Subscribe(narrow));
    w.advance(100);
    w.log.get_mut(&topic("t")).unwrap()[0][0] = event(0, "other", None);
    w.crash_and_restart();
    let again = w.poll("g", "c", 10);
    let offsets: Vec<_> = again.iter().map(|d| d.record.offset).collect();
    assert_eq!(
        offsets,
        vec![2],
        "0 filtered, 1 persisted as done, 2 in flight before"
    );
    assert_eq!(w.watermark("g", 0), 2);
}

#[test]
fn a_lowered_ack_timeout_expires_later_deliveries_first() {
    let mut w = world_with(1);
    let mut spec = w.spec("g", "t");
    spec.ack_timeout_ms = 1_000;
    w.subscribe(spec.clone());
    w.publish("t", 0, "a", None);
    w.publish("t", 0, "a", None);
    let first = w.poll("g", "a", 1);
    spec.ack_timeout_ms = 100;
    assert_eq!(w.handle(Input::Subscribe(spec)), Response::Ok);
    let second = w.poll("g", "b", 1);
    assert_eq!((first[0].id.offset, second[0].id.offset), (0, 1));
    w.advance(99);
    assert_eq!(w.view("g").stats.expired, 0);
    w.advance(1);
    // The later delivery has the earlier deadline: it expires, the first stays out.
    let v = w.view("g");
    assert_eq!(v.stats.expired, 1);
    let in_flight: Vec<(&str, u32)> = v
        .clients
        .iter()
        .map(|c| (c.id.as_str(), c.in_flight))
        .collect();
    assert_eq!(in_flight, vec![("a", 1), ("b", 0)]);
    w.advance(899);
    assert_eq!(w.view("g").stats.expired, 1);
    w.advance(1);
    assert_eq!(w.view("g").stats.expired, 2);
}

#[test]
fn a_departing_client_hands_back_extended_deliveries_too() {
    let mut w = world_with(2);
    w.subscribe(w.spec("g", "t"));
    for p in [1, 0, 1, 0] {
        w.publish("t", p, "a", None);
    }
    let held = w.poll("g", "a", 10);
    assert_eq!(held.len(), 4);
    let r = w.handle(Input::Extend {
        group: group("g"),
        ids: vec![held[1].id],
        extend_ms: Some(10_000),
    });
    assert_eq!(r, Response::Settled(vec![Settle::Accepted]));
    w.poll("g", "b", 10);
    let before = w.deliveries.len();
    let _ = w.handle(Input::ClientGone {
        group: group("g"),
        client: client("a"),
    });
    w.advance(10);
    // All four come back at once, the extended one included.
    let mut again: Vec<(Partition, Offset, u32)> = w
        .delivered_since(before)
        .iter()
        .map(|d| (d.id.partition, d.id.offset, d.attempt))
        .collect();
    again.sort_unstable();
    assert_eq!(again, vec![(0, 0, 2), (0, 1, 2), (1, 0, 2), (1, 1, 2)]);
}

#[test]
fn an_idle_client_is_forgotten_a_full_timeout_after_it_last_went_idle() {
    let mut config = World::small_config();
    config.client_idle_timeout_ms = 1_000;
    let mut w = World::new(config);
    w.topic("t", 1);
    w.subscribe(w.spec("g", "t"));
    w.poll("g", "a", 0);
    w.advance(400);
    // Busy for a while, then idle again at 700: forgotten at 1 700, not at 1 000.
    w.publish("t", 0, "a", None);
    let d = w.poll("g", "a", 1);
    w.advance(300);
    assert_eq!(w.ack("g", &[d[0].id]), vec![Settle::Accepted]);
    w.advance(999);
    assert_eq!(w.view("g").clients.len(), 1);
    w.advance(1);
    assert!(w.view("g").clients.is_empty());
}

#[test]
fn lowering_max_in_flight_revokes_nothing_and_holds_back_new_deliveries() {
    // Found by the optimisation's differential driver: the invariant check refused a
    // client holding more than a limit lowered after its deliveries.
    let mut w = world_with(1);
    let mut spec = w.spec("g", "t");
    spec.max_in_flight_per_client = 4;
    w.subscribe(spec.clone());
    for _ in 0..6 {
        w.publish("t", 0, "a", None);
    }
    let d = w.poll("g", "c", 10);
    assert_eq!(d.len(), 4);
    spec.max_in_flight_per_client = 2;
    assert_eq!(w.handle(Input::Subscribe(spec)), Response::Ok);
    // Two ACKs bring it to the new limit: still nothing new.
    w.ack("g", &[d[0].id, d[1].id]);
    assert_eq!(w.deliveries.len(), 4);
    w.ack("g", &[d[2].id]);
    assert_eq!(w.deliveries.len(), 5, "one slot below the new limit");
    assert_eq!(w.view("g").clients[0].in_flight, 2);
}

#[test]
fn an_id_whose_lease_belongs_to_another_partition_is_unknown_not_revoked() {
    // Found by the black-box tests: leases are numbered across partitions, so a lease of
    // partition 1 named with partition 0 must not look like a revoked lane of partition 0.
    let mut w = world_with(2);
    w.subscribe(w.spec("g", "t"));
    // Partition 1's lease was given after partition 0's: the lower number is the other's.
    w.publish("t", 1, "a", None);
    let d = w.poll("g", "c", 10)[0].id;
    assert_eq!(d.partition, 1);
    let lanes = w.view("g").lanes;
    let other = lanes
        .iter()
        .find(|l| l.partition != d.partition)
        .unwrap()
        .lease;
    let forged = DeliveryId { lease: other, ..d };
    assert_eq!(
        w.ack("g", &[forged]),
        vec![Settle::Rejected(RejectReason::Unknown)]
    );
    // A lease this partition really had, before a seek, is revoked.
    let _ = w.handle(Input::Seek {
        group: group("g"),
        partition: d.partition,
        offset: 0,
    });
    assert_eq!(
        w.ack("g", &[d]),
        vec![Settle::Rejected(RejectReason::Revoked)]
    );
}
