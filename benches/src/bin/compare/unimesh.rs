//! The unimesh side: `unimesh serve` (embedded log on a temporary data directory, or Kafka),
//! driven by the load loops of `unimesh_tests::load` (shared with the load example): P
//! publisher threads sending batch-mode requests (one binary-mode event per request with a
//! batch of 1), consumers of one transport ACKing as a client of it does.

use unimesh_tests::load::{self, Outcome, Spec, Transport};
use unimesh_tests::{Options, Server};

use super::sample::{Hists, Sample};
use super::{Args, Workload};

/// Where unimesh keeps its events.
#[derive(Clone, Debug)]
pub enum Storage {
    /// The embedded log with `storage.sync = "always"` (`None`) or every this many ms.
    Embedded { sync_interval_ms: Option<u64> },
    /// A Kafka broker at `HOST:PORT`, whose process (if started here) is `pid`.
    Kafka { brokers: String, pid: Option<u32> },
}

/// A server of this storage, with `[push]` open to a receiver on this machine.
pub fn start(partitions: u64, storage: &Storage, instance: &str) -> Server {
    let mut toml = format!(
        "log = \"warn\"\n[push]\nallowed_hosts = \"127.0.0.1\"\n[storage]\ndefault_partitions = {}\n",
        partitions
    );
    match storage {
        Storage::Embedded {
            sync_interval_ms: None,
        } => {}
        Storage::Embedded {
            sync_interval_ms: Some(ms),
        } => toml.push_str(&format!("sync = \"interval\"\nsync_interval_ms = {ms}\n")),
        Storage::Kafka { brokers, .. } => toml.push_str(&format!(
            "backend = \"kafka\"\n[kafka]\nbrokers = \"{brokers}\"\ninstance = \"{instance}\"\n"
        )),
    }
    Server::start(Options::new().toml(&toml))
}

/// One run: a fresh server, one group on topic `topic`, the workload by `transport`.
pub fn run(a: &Args, w: &Workload, storage: &Storage, transport: Transport, topic: &str) -> Sample {
    let s = start(a.partitions, storage, topic);
    let mut spec = Spec::new(w.events, a.size);
    spec.topic = topic.to_owned();
    spec.transport = transport;
    spec.publishers = a.publishers;
    spec.consumers = a.consumers;
    spec.batch = w.batch;
    spec.poll = a.poll;
    spec.rate = w.rate;
    if let Storage::Kafka { pid, .. } = storage {
        spec.kafka_partitions = Some(a.partitions as u32);
        spec.watch_pids.extend(pid);
    }
    sample(w.events, load::run(&s, &spec))
}

/// What a run of the load loops measured, as a sample.
pub fn sample(events: u64, o: Outcome<Hists>) -> Sample {
    let h = Hists::merged(o.recorders);
    Sample {
        events,
        publish_wall: o.publish_wall,
        total_wall: o.total_wall,
        deliver_us: h.deliver,
        ack_us: h.ack,
        redelivered: o.redelivered,
        server_cpu_s: o.server_cpu_s,
        client_cpu_s: o.client_cpu_s,
        broker_cpu_s: o.watched_cpu_s.first().copied().unwrap_or(f64::NAN),
    }
}
