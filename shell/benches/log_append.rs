//! Durable append throughput of the embedded log: 1 KiB events, each `append` awaited (so
//! each returns only after its WAL fsync), with 1 and with 64 concurrent publishers. With
//! group commit, 64 publishers share fsyncs and the rate should be far above the 1-publisher
//! rate, which is bounded by the disk's fsync latency.
//!
//! Run: `CARGO_TARGET_DIR=/work/target cargo bench -p unimesh-shell --bench log_append`
//! (criterion reports `thrpt` in elements/s = appends/s; the records per synced write are
//! printed after each case).

use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use unimesh_core::TopicName;
use unimesh_shell::log::{AppendItem, EmbeddedLog, LogConfig};

const EVENT_BYTES: usize = 1024;

fn append_throughput(c: &mut Criterion) {
    let mut group = c.benchmark_group("log_append_1KiB");
    group.throughput(Throughput::Elements(1));
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(10));
    for publishers in [1u64, 64] {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let dir = tempfile::tempdir().expect("temporary directory");
        let log = EmbeddedLog::open(LogConfig::new(dir.path())).expect("open the log");
        let topic = TopicName::new("bench").expect("topic name");
        let payload = Bytes::from(vec![b'x'; EVENT_BYTES]);
        let before = log.stats();
        group.bench_function(format!("publishers_{publishers}"), |b| {
            b.iter_custom(|iters| {
                runtime.block_on(async {
                    let start = Instant::now();
                    let tasks: Vec<_> = (0..publishers)
                        .map(|p| {
                            // Spread `iters` appends over the publishers exactly.
                            let count = iters / publishers + u64::from(p < iters % publishers);
                            let log = log.clone();
                            let topic = topic.clone();
                            let payload = payload.clone();
                            tokio::spawn(async move {
                                for _ in 0..count {
                                    let item = AppendItem {
                                        key: None,
                                        value: payload.clone(),
                                    };
                                    log.append(&topic, vec![item]).await.expect("append");
                                }
                            })
                        })
                        .collect();
                    for task in tasks {
                        task.await.expect("publisher task");
                    }
                    start.elapsed()
                })
            })
        });
        let after = log.stats();
        let records = after.records_appended - before.records_appended;
        let writes = (after.synced_writes - before.synced_writes).max(1);
        eprintln!(
            "publishers_{publishers}: {records} records in {writes} synced writes ({:.1} per write)",
            records as f64 / writes as f64
        );
        drop(log);
    }
    group.finish();
}

criterion_group!(benches, append_throughput);
criterion_main!(benches);
