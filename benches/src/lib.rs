//! The rig of the core benchmarks, shared by the criterion bench (`benches/core.rs`) and
//! the instruction-count runner (`src/bin/cycles.rs`).
//!
//! One group, one partition, one client. A cycle is: ACK the oldest delivery, then give
//! the client credit for one more, which the core hands out at once. Fetches are answered
//! from pre-built records (cloning a record is two reference-count bumps, as in the shell),
//! persists are acknowledged as they appear, and time advances 1 ms every 1 000 cycles so
//! flushes happen at a realistic rate.

use std::collections::VecDeque;

use bytes::Bytes;
use unimesh_core::*;

/// The scenarios measured: (deliveries in flight, ACKs per input).
pub const SCENARIOS: [(u32, usize); 3] = [(1, 1), (100_000, 1), (100_000, 64)];

pub struct Rig {
    pub mesh: Mesh,
    now: Millis,
    template: Record,
    group: GroupName,
    client: ClientId,
    out: VecDeque<DeliveryId>,
    cycles: u64,
}

impl Rig {
    pub fn new(in_flight: u32) -> Self {
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
    pub fn cycle(&mut self, n: usize) {
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

impl Rig {
    /// Runs `rounds` cycles of `batch` deliveries each: the span the instruction-count runner
    /// measures (kept out of line so callgrind's `--toggle-collect` can find it).
    #[inline(never)]
    pub fn measured_rounds(&mut self, rounds: u64, batch: usize) {
        for _ in 0..rounds {
            self.cycle(batch);
        }
    }
}
