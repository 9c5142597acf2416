//! What progress costs per event (issue 21), no I/O:
//! - **merge**: ACKs marked done in a window of 8 192 offsets (so at most 4 096 fragments,
//!   the default `max_ack_ranges_per_lane`): in order; every other offset first and then
//!   the gaps (4 096 ranges, then each gap closing two into one); and in a seeded random
//!   order. Throughput = ACKs.
//! - **recovery** of a lane whose progress spans 1 M offsets above its watermark: the
//!   checkpoint decoded (as the state store hands it over at start) with 4 096 ranges (the
//!   default limit) and with 500 000 (every other offset done, as a lane with a raised limit
//!   could hold), and a mesh built from the 4 096-range one and assigned its partition
//!   (restart alignment included; the first fetch must start at the recovered watermark).
//!
//! Run: `cargo bench -p unimesh-benches --bench progress`.

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use unimesh_core::*;

const WINDOW: u64 = 8_192;
const SPAN: u64 = 1_000_000;
/// The recovered watermark: where the lane must resume fetching (not the group's start, 0).
const BASE: u64 = 1_000;

/// The offsets of a window in the order each scenario ACKs them.
fn orders() -> [(&'static str, Vec<u64>); 3] {
    let in_order: Vec<u64> = (0..WINDOW).collect();
    let odd_then_even: Vec<u64> = (0..WINDOW)
        .filter(|o| o % 2 == 1)
        .chain((0..WINDOW).filter(|o| o % 2 == 0))
        .collect();
    // Fisher-Yates with a fixed xorshift: the same order every run.
    let mut shuffled = in_order.clone();
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    for i in (1..shuffled.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        shuffled.swap(i, (x % (i as u64 + 1)) as usize);
    }
    [
        ("in_order", in_order),
        ("odd_then_even", odd_then_even),
        ("random", shuffled),
    ]
}

fn merge(c: &mut Criterion) {
    let mut g = c.benchmark_group("progress_merge");
    g.throughput(Throughput::Elements(WINDOW));
    for (name, order) in orders() {
        g.bench_function(name, |b| {
            b.iter_batched(
                || Progress::new(0),
                |mut p| {
                    for &o in &order {
                        p.mark_done(o);
                    }
                    assert_eq!(p.watermark(), WINDOW, "every offset of the window done");
                    p
                },
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

/// A checkpoint at watermark [`BASE`] with `ranges` one-offset ranges spread evenly over
/// the 1 M offsets above it, and a few recorded attempts.
fn checkpoint(ranges: u64) -> Checkpoint {
    let step = SPAN / ranges;
    let progress = Progress::from_parts(
        BASE,
        (0..ranges).map(|i| (BASE + 1 + i * step, BASE + 2 + i * step)),
    )
    .unwrap_or_else(|e| panic!("a well-formed progress is refused: {e:?}"));
    Checkpoint {
        progress,
        attempts: (0..100)
            .map(|i| (BASE + i * 2 * step + step / 2, 2))
            .collect(),
    }
}

fn recovery(c: &mut Criterion) {
    let mut g = c.benchmark_group("recovery_1M_offsets");
    for ranges in [4_096u64, 500_000] {
        let bytes = checkpoint(ranges).encode();
        g.throughput(Throughput::Elements(ranges));
        g.bench_function(format!("decode_{ranges}_ranges"), |b| {
            b.iter(|| Checkpoint::decode(black_box(&bytes)).map(|cp| cp.progress.range_count()))
        });
    }
    let cp = checkpoint(4_096);
    let group = GroupName::new("bench").unwrap_or_else(|e| panic!("a group name: {e:?}"));
    let topic = TopicName::new("t").unwrap_or_else(|e| panic!("a topic name: {e:?}"));
    let spec = SubscriptionSpec::new(group.clone(), topic);
    g.throughput(Throughput::Elements(1));
    g.bench_function("mesh_recover_and_assign_4096_ranges", |b| {
        b.iter_batched(
            || Recovered {
                epoch: 1,
                subscriptions: vec![spec.clone()],
                checkpoints: vec![(group.clone(), 0, cp.clone())],
            },
            |recovered| {
                let mut mesh = Mesh::new(MeshConfig::default(), recovered, 0)
                    .unwrap_or_else(|e| panic!("recovery refused: {e:?}"));
                let answer = mesh.handle(
                    0,
                    Input::PartitionsAssigned {
                        group: group.clone(),
                        partitions: vec![Assignment {
                            partition: 0,
                            earliest: 0,
                            end: BASE + SPAN + 1,
                            checkpoint: None,
                        }],
                    },
                );
                assert!(
                    matches!(answer, Response::Ok),
                    "assignment refused: {answer:?}"
                );
                // The lane resumes at the recovered watermark: the checkpoint was taken.
                let mut from = None;
                while let Some(effect) = mesh.poll_effect() {
                    if let Effect::Fetch { from: f, .. } = effect {
                        from.get_or_insert(f);
                    }
                }
                assert_eq!(from, Some(BASE), "the first fetch starts at the checkpoint");
                mesh
            },
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, merge, recovery);
criterion_main!(benches);
