//! Persisted progress from arbitrary bytes: decode it, recover a `Mesh` from it, and run the
//! recovered lanes to the end of a log. Decoding must refuse bad bytes with an error (never
//! a panic) and accept only canonical encodings; a mesh recovered from whatever decoded must
//! hold its invariants at every step (`check_every_step`), never deliver an offset the
//! checkpoint says is done (C2), hand out a redelivery only above the recovered attempt
//! count (C5), and never persist a checkpoint that forgets an offset the recovered one had
//! done (C3).
//!
//! Input: a mode byte (bit 0: append a valid CRC to each chunk so the fuzzer reaches the
//! semantic checks behind the checksum), a little-endian epoch, then up to four chunks
//! `len: u16 LE, bytes`, one per partition, then bytes that shape the log.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use unimesh_core::{
    Assignment, Checkpoint, ClientId, Effect, EventMeta, FetchResult, GroupName, Input, Mesh,
    MeshConfig, Partition, Record, Recovered, RecoveryError, SubscriptionSpec, TopicName,
};

fn take<'a>(data: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if data.len() < n {
        return None;
    }
    let (head, tail) = data.split_at(n);
    *data = tail;
    Some(head)
}

fuzz_target!(|input: &[u8]| {
    let mut data = input;
    let Some(&[mode]) = take(&mut data, 1) else {
        return;
    };
    let Some(e) = take(&mut data, 4) else { return };
    let epoch = u32::from_le_bytes([e[0], e[1], e[2], e[3]]);
    let group = GroupName::new("g").unwrap();
    let topic = TopicName::new("t").unwrap();
    let mut checkpoints: Vec<(GroupName, Partition, Checkpoint)> = Vec::new();
    for p in 0..4u32 {
        let Some(l) = take(&mut data, 2) else { break };
        let len = usize::from(u16::from_le_bytes([l[0], l[1]])) % 512;
        let Some(chunk) = take(&mut data, len) else {
            break;
        };
        let mut bytes = chunk.to_vec();
        if mode & 1 == 1 {
            let crc = crc32fast::hash(&bytes);
            bytes.extend_from_slice(&crc.to_le_bytes());
        }
        match Checkpoint::decode(&bytes) {
            Ok(c) => {
                assert_eq!(c.encode(), bytes, "only canonical encodings decode");
                // Keep logs small: a watermark far out only costs time, not coverage.
                if c.progress.done_end() < 1_024 {
                    checkpoints.push((group.clone(), p, c));
                }
            }
            Err(err) => assert!(!err.to_string().is_empty()),
        }
    }
    let mut spec = SubscriptionSpec::new(group.clone(), topic.clone());
    spec.max_attempts = 3;
    spec.ack_timeout_ms = 100;
    let config = MeshConfig {
        max_window_per_lane: 64,
        fetch_batch: 32,
        ..MeshConfig::default()
    };
    let recovered = Recovered {
        epoch,
        subscriptions: vec![spec],
        checkpoints: checkpoints.clone(),
    };
    let mut mesh = match Mesh::new(config, recovered, 0) {
        Ok(m) => m,
        Err(e) => {
            assert_eq!(
                e,
                RecoveryError::EpochExhausted,
                "only the epoch can be refused here"
            );
            return;
        }
    };
    mesh.check_every_step = true;
    let shape = data;
    let cp_of = |p: Partition| {
        checkpoints
            .iter()
            .find(|(_, q, _)| *q == p)
            .map(|(_, _, c)| c)
    };
    let assignments: Vec<Assignment> = (0..4u32)
        .map(|p| {
            let done_end = cp_of(p).map_or(0, |c| c.progress.done_end());
            let extra = u64::from(shape.get(p as usize).copied().unwrap_or(8) % 64);
            Assignment {
                partition: p,
                earliest: 0,
                end: done_end + extra,
                checkpoint: None,
            }
        })
        .collect();
    let ends: Vec<u64> = assignments.iter().map(|a| a.end).collect();
    let client = ClientId::new("c").unwrap();
    let _ = mesh.handle(
        0,
        Input::PartitionsAssigned {
            group: group.clone(),
            partitions: assignments,
        },
    );
    let _ = mesh.handle(
        0,
        Input::ClientPoll {
            group: group.clone(),
            client: client.clone(),
            max: 16,
        },
    );
    let mut now = 0;
    let mut pending = std::collections::VecDeque::new();
    for _round in 0..400 {
        // Stop once nothing moves: every lane is at the end of its log and all is durable.
        let mut busy = false;
        let mut acks = Vec::new();
        let mut inputs = Vec::new();
        while let Some(effect) = mesh.poll_effect() {
            match effect {
                Effect::Fetch {
                    partition,
                    fetch_id,
                    from,
                    max,
                    ..
                } => {
                    let end = ends[partition as usize];
                    busy |= from < end;
                    let to = end.min(from + max as u64);
                    let records = (from..to)
                        .map(|o| {
                            Record::event(
                                o,
                                EventMeta {
                                    id: format!("{partition}-{o}"),
                                    ..EventMeta::default()
                                },
                                Bytes::new(),
                            )
                        })
                        .collect();
                    inputs.push(Input::Fetched {
                        group: group.clone(),
                        partition,
                        fetch_id,
                        result: if from >= end {
                            FetchResult::Records(Vec::new())
                        } else {
                            FetchResult::Records(records)
                        },
                    });
                }
                Effect::Deliver { delivery, .. } => {
                    let cp = cp_of(delivery.partition);
                    if let Some(c) = cp {
                        assert!(
                            !c.progress.is_done(delivery.record.offset),
                            "C2: a done offset was delivered"
                        );
                        let before = c.attempts_of(delivery.record.offset);
                        assert!(
                            delivery.attempt == 1 && before == 0 || delivery.attempt > before,
                            "C5: attempt {} after {before} recovered",
                            delivery.attempt
                        );
                    }
                    busy = true;
                    acks.push(delivery.id);
                }
                Effect::Persist { ticket, batch } => {
                    for lc in &batch.checkpoints {
                        if let Some(c) = cp_of(lc.partition) {
                            let wm = c.progress.watermark();
                            assert!(
                                lc.checkpoint.progress.watermark() >= wm,
                                "C3: watermark went back"
                            );
                            for (s, e) in c.progress.ranges() {
                                for o in s..e {
                                    assert!(
                                        lc.checkpoint.progress.is_done(o),
                                        "C3: done offset {o} forgotten"
                                    );
                                }
                            }
                        }
                    }
                    busy = true;
                    pending.push_back(ticket);
                }
                _ => {}
            }
        }
        if !busy && pending.is_empty() {
            break;
        }
        for i in inputs {
            let _ = mesh.handle(now, i);
        }
        if !acks.is_empty() {
            let _ = mesh.handle(
                now,
                Input::Ack {
                    group: group.clone(),
                    ids: acks,
                },
            );
        }
        if let Some(t) = pending.pop_front() {
            let _ = mesh.handle(now, Input::Persisted { ticket: t });
        }
        let _ = mesh.handle(
            now,
            Input::ClientPoll {
                group: group.clone(),
                client: client.clone(),
                max: 16,
            },
        );
        now += 10;
        let _ = mesh.handle(now, Input::Tick);
    }
});
