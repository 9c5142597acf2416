//! Deliver+ACK cycles per second through `Mesh::handle` + `poll_effect`, no I/O.
//!
//! One group, one partition, one client. A cycle is: ACK the oldest delivery, then give
//! the client credit for one more, which the core hands out at once. Fetches are answered
//! from pre-built records (cloning a record is two reference-count bumps, as in the shell),
//! persists are acknowledged as they appear, and time advances 1 ms every 1 000 cycles so
//! flushes happen at a realistic rate.
//!
//! Run: `cargo bench -p unimesh-benches --bench core`

use std::collections::VecDeque;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use unimesh_core::*;

struct Rig {
    mesh: Mesh,
    now: Millis,
    template: Record,
    group: GroupName,
    client: ClientId,
    out: VecDeque<DeliveryId>,
    cycles: u64,
}

impl Rig {
    fn new(in_flight: u32) -> Self {
        let mut config = MeshConfig {
            max_window_per_lane: in_flight as usize + 8_192,
            fetch_batch: 4_096,
            ..MeshConfig::default()
        };
        config.limits.max_in_flight_per_client = in_flight.max(1);
        let mut mesh = Mesh::new(config, Recovered::default(), 0).expect("fresh mesh");
        mesh.check_every_step = false;
        let group = GroupName::new("bench").expect("valid name");
        let topic = TopicName::new("t").expect("valid name");
        let mut spec = SubscriptionSpec::new(group.clone(), topic);
        spec.max_in_flight_per_client = in_flight.max(1);
        spec.ack_timeout_ms = 3_600_000;
        let template = Record::event(
            0,
            EventMeta {
                id: "e".into(),
                source: "/bench".into(),
                ty: "bench.event".into(),
                ..EventMeta::default()
            },
            Bytes::from(vec![b'x'; 256]),
        );
        let mut rig = Rig {
            mesh,
            now: 0,
            template,
            group: group.clone(),
            client: ClientId::new("c").expect("valid name"),
            out: VecDeque::new(),
            cycles: 0,
        };
        rig.input(Input::Subscribe(spec));
        rig.input(Input::PartitionsAssigned {
            group,
            partitions: vec![Assignment {
                partition: 0,
                earliest: 0,
                end: 0,
                checkpoint: None,
            }],
        });
        rig.input(Input::ClientPoll {
            group: rig.group.clone(),
            client: rig.client.clone(),
            max: in_flight,
        });
        assert_eq!(rig.out.len(), in_flight as usize, "window filled");
        rig
    }

    fn input(&mut self, input: Input) {
        let _ = self.mesh.handle(self.now, input);
        self.drain();
    }

    fn drain(&mut self) {
        while let Some(effect) = self.mesh.poll_effect() {
            match effect {
                Effect::Deliver { delivery, .. } => self.out.push_back(delivery.id),
                Effect::Persist { ticket, .. } => {
                    let _ = self.mesh.handle(self.now, Input::Persisted { ticket });
                }
                Effect::Fetch {
                    group,
                    partition,
                    fetch_id,
                    from,
                    max,
                    ..
                } => {
                    let records = (from..from + max as u64)
                        .map(|offset| Record {
                            offset,
                            ..self.template.clone()
                        })
                        .collect();
                    let _ = self.mesh.handle(
                        self.now,
                        Input::Fetched {
                            group,
                            partition,
                            fetch_id,
                            result: FetchResult::Records(records),
                        },
                    );
                }
                _ => {}
            }
        }
    }

    /// ACK `n` oldest deliveries in one input, then ask for `n` more.
    fn cycle(&mut self, n: usize) {
        let ids: Vec<DeliveryId> = self.out.drain(..n).collect();
        self.input(Input::Ack {
            group: self.group.clone(),
            ids,
        });
        self.input(Input::ClientPoll {
            group: self.group.clone(),
            client: self.client.clone(),
            max: n as u32,
        });
        self.cycles += n as u64;
        if self.cycles % 1_000 < n as u64 {
            self.now += 1;
        }
    }
}

fn deliver_ack(c: &mut Criterion) {
    let mut g = c.benchmark_group("deliver_ack");
    for (in_flight, batch) in [(1u32, 1usize), (100_000, 1), (100_000, 64)] {
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
