//! Deliver+ACK cycles per second through `Mesh::handle` + `poll_effect`, no I/O (the rig
//! is in `src/lib.rs`).
//!
//! Run: `cargo bench -p unimesh-benches --bench core`; instruction counts per cycle:
//! `src/bin/cycles.rs`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use unimesh_benches::{Rig, SCENARIOS};

fn deliver_ack(c: &mut Criterion) {
    let mut g = c.benchmark_group("deliver_ack");
    for (in_flight, batch) in SCENARIOS {
        g.throughput(Throughput::Elements(batch as u64));
        let id = format!("in_flight={in_flight}/ack_batch={batch}");
        g.bench_function(BenchmarkId::from_parameter(id), |b| {
            let mut rig = Rig::new(in_flight);
            b.iter(|| rig.cycle(batch));
            assert!(rig.mesh.check_invariants().is_ok());
        });
    }
    g.finish();
}

criterion_group!(benches, deliver_ack);
criterion_main!(benches);
