//! The Kafka shapes: the shell's own Kafka port (`unimesh_shell::kafka`: `KafkaLog`, the
//! progress topic, `KafkaState`, and the group consumer's `rules/`) against madsim-rdkafka's
//! simulated broker, which runs on a node of its own and outlives every kill of a mesh
//! node. That broker has no consumer groups: the harness's group coordinator
//! (`coordinator`) takes their place, on the broker's node, and every mesh node's consumer
//! joins it (`KafkaLog::set_coordinator`). One mesh node (the Kafka shape) or several (the
//! group shape) share the broker; each has its own local store.
//!
//! What the harness needs and the simulated broker does not say, and how it is learnt:
//! - where a record landed. Its delivery reports carry no partition or offset (and it
//!   places records round robin, keys ignored). A tap — a consumer on a node of the
//!   harness reading every partition of the data topic from 0 — reports each record to the
//!   [`World`] in offset order, decoded by the shell's own reader
//!   (`kafka::decode_message`), and learns each event's position; the log port answers a
//!   publish with the positions the tap saw (C9 checks them against what the broker holds).
//! - that a record is reported before anyone reads it: the log port holds a fetch answer,
//!   and a publish answer, until the tap has reported every record in it.
//! - when a state batch is durable. A batch with checkpoints is durable when the broker
//!   holds its last progress record (`KafkaState::progress_record`, written last, to the
//!   progress topic's one partition): the tap reads the progress topic too and reports the
//!   batch at that record, also when the node died before the broker's answer came back (a
//!   kill reads the progress topic to its end before the world hears of the crash). A batch
//!   without checkpoints is durable when `KafkaState::apply` answers.
//! - which checkpoints count. The progress topic fences at read: a lane's records are keyed
//!   by the writer's ownership generation, and a reader takes the highest. So the tap keeps,
//!   per lane, the generations the topic holds (records and deletions, as it reads them),
//!   and a checkpoint whose record lands below a higher generation of its lane is reported
//!   *outranked*: durable, never read (`World::persist_durable_outranked`). That is the
//!   harness's own statement of the fence, not the shell's code.
//! - the parts of a batch that land apart. `KafkaState` writes a batch to two stores: its
//!   local part (the epoch alone) to the node's store first, then the topics
//!   (docs/DESIGN.md §8, "A state batch on Kafka is durable as one"). The node's store
//!   tells the world of an epoch the moment it commits it (`ReportingStore::epochs`), so a kill
//!   after it and before the batch counts leaves the world knowing the epoch moved on;
//!   with the old order (epoch last) a kill between made the world count an epoch the
//!   store never had, and the next incarnation's epoch failed C4. A restart takes its
//!   definitions from the subscriptions topic, so the tap reads that topic too and tells
//!   the world of each definition when its record lands (`World::spec_durable`), whether
//!   or not the rest of its batch does.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use madsim::runtime::{Handle, NodeHandle};
use madsim_rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use madsim_rdkafka::client::DefaultClientContext;
use madsim_rdkafka::consumer::BaseConsumer;
use madsim_rdkafka::message::OwnedMessage;
use madsim_rdkafka::producer::{FutureProducer, FutureRecord};
use madsim_rdkafka::{ClientConfig, Message, Offset as KOffset, SimBroker, TopicPartitionList};
use madsim_tokio as tokio;
use unimesh_core::{
    DlqKey, GroupName, Offset, Partition, PersistBatch, RateRule, RecordMeta, TopicName,
};
use unimesh_shell::config::Config;
use unimesh_shell::engine::{
    BoxFut, EngineConfig, GroupEvent, GroupLog, LogMetrics, LogPort, LogRead, StatePort,
    StorageError, TopicFacts,
};
use unimesh_shell::kafka::{
    decode_message, definition, dlq_topic, unframed, KafkaLog, KafkaSettings, KafkaState,
};
use unimesh_shell::storage;

use super::coordinator::{Coordinator, Timing};
use unimesh_shell::log::AppendItem;
use unimesh_shell::state::{DlqEntry, Loaded, MemoryDisk, MemoryStore};
use unimesh_sim::rng::Rng;
use unimesh_sim::Clause;

use super::state::ReportingStore;
use super::{Backend, Ports};
use crate::options::Options;
use crate::world::{violation, World};

const BROKER: ([u8; 4], u16) = ([10, 0, 9, 1], 9092);
const TAP_IP: [u8; 4] = [10, 0, 9, 2];
/// How long the log port waits for the tap before the run fails (simulated time; the tap
/// polls every few milliseconds, so this is a harness fault, not a slow broker).
const TAP_WAIT: Duration = Duration::from_secs(30);
const TAP_POLL: Duration = Duration::from_millis(5);
/// Longer than a message can be on madsim's network (its latency is 1–10 ms), so what a
/// killed node had sent has arrived.
const IN_FLIGHT: Duration = Duration::from_millis(50);

fn broker_addr() -> SocketAddr {
    SocketAddr::from(BROKER)
}

/// The shell's Kafka port on the simulated broker (see the module documentation).
pub struct KafkaBackend {
    settings: KafkaSettings,
    /// The local part of each mesh node's state port (epoch, definitions, rate rules): the
    /// node's disk.
    disks: Vec<MemoryDisk>,
    tap: Arc<Tap>,
    tap_node: NodeHandle,
    tap_started: AtomicBool,
    broker_node: NodeHandle,
    timing: Timing,
    /// Made with the world, at the first start of a mesh node.
    coordinator: OnceLock<Arc<Coordinator>>,
}

impl KafkaBackend {
    /// Starts the broker on a node of its own (inside the run's runtime).
    pub fn new(opts: &Options) -> Self {
        let handle = Handle::current();
        let addr = broker_addr();
        let broker_node = handle.create_node().name("kafka").ip(addr.ip()).build();
        broker_node.spawn(async move {
            if let Err(e) = SimBroker::default().serve(addr).await {
                tracing::error!(error = %e, "the simulated broker stopped");
            }
        });
        let tap_node = handle
            .create_node()
            .name("kafka-tap")
            .ip(TAP_IP.into())
            .build();
        let mut cfg = Config::default();
        cfg.kafka.brokers = addr.to_string();
        cfg.kafka.instance = "mesh".to_owned();
        cfg.storage.default_partitions = opts.partitions.max(1);
        let settings = cfg.kafka_settings(0);
        let tap = Arc::new(Tap::new(&settings, opts.partitions.max(1)));
        Self {
            settings,
            disks: (0..opts.nodes.max(1)).map(|_| MemoryDisk::new()).collect(),
            tap,
            tap_node,
            tap_started: AtomicBool::new(false),
            broker_node,
            timing: Timing::of(&opts.cluster),
            coordinator: OnceLock::new(),
        }
    }

    /// The run's group coordinator (made, and started on the broker's node, once).
    fn coordinator(&self, world: &Arc<World>) -> Arc<Coordinator> {
        self.coordinator
            .get_or_init(|| {
                let c = Arc::new(Coordinator::new(
                    world.clone(),
                    self.timing,
                    world.opts.partitions.max(1),
                    self.settings.group_prefix.clone(),
                ));
                c.start(&self.broker_node);
                let weak = Arc::downgrade(&c);
                world.set_ownership(Box::new(move |node, group, partition| {
                    weak.upgrade()
                        .is_some_and(|c| c.overtaken(node, group, partition))
                }));
                c
            })
            .clone()
    }
}

impl Backend for KafkaBackend {
    fn name(&self) -> &'static str {
        "kafka"
    }

    fn ports(&self, world: &Arc<World>, node: usize, _rng: Rng) -> BoxFut<Result<Ports, String>> {
        if !self.tap_started.swap(true, AtomicOrdering::Relaxed) {
            self.tap_node.spawn(self.tap.clone().run(world.clone()));
        }
        // Commits go to the coordinator, which judges them when it takes them; a resume
        // point is judged by the record it came from, as the tap saw it land.
        world.fences_at_broker();
        let weak = Arc::downgrade(&self.tap);
        world.set_sources(Box::new(move |group, partition, checkpoint| {
            weak.upgrade()?.source(group, partition, checkpoint)
        }));
        let coordinator = self.coordinator(world).for_node(node);
        let (tap, world) = (self.tap.clone(), world.clone());
        let mut settings = self.settings.clone();
        if node > 0 {
            settings.instance = format!("mesh-{node}");
        }
        let disk = self.disks.get(node).cloned();
        Box::pin(async move {
            let disk = disk.ok_or_else(|| format!("no mesh node {node}"))?;
            tap.wait(&world, "the data topic", |t| t.ready).await?;
            // Through the shell's factory, as `serve` opens Kafka: no health probe (a
            // thread), the broker's topics created once.
            let backend = storage::Backend::Kafka(storage::KafkaStart {
                settings,
                watch_every: None,
                offsets_refresh: Duration::from_millis(200),
            });
            let local = ReportingStore::epochs(MemoryStore::open(disk), world.clone(), node);
            let opened = backend.open(Box::new(local), None).await?;
            let Some(storage::Opened::Kafka { log, state }) = opened else {
                return Err("the storage factory opened no Kafka ports".to_owned());
            };
            log.set_coordinator(coordinator);
            tap.lock().opened = true;
            let state: Arc<dyn StatePort> = Arc::new(ReportingState {
                inner: state,
                tap: tap.clone(),
                world: world.clone(),
                node,
            });
            let log: Arc<dyn LogPort> = Arc::new(TappedLog {
                inner: log,
                tap,
                world,
            });
            Ok((log, state))
        })
    }

    fn configure(&self, config: &mut EngineConfig) {
        // What `serve` does on Kafka: the watermark is committed to the group.
        config.mesh.commit_to_broker = true;
    }

    fn killed(&self, world: &Arc<World>, node: usize) -> BoxFut<()> {
        let (tap, world) = (self.tap.clone(), world.clone());
        // On the tap's node: the caller's may have no address to reach the broker from.
        let read = self.tap_node.spawn(async move {
            // A request the node sent before it died still reaches the broker (the network
            // delivers what was on the wire): its records land up to the network's latency
            // after the kill, and are durable all the same.
            tokio::time::sleep(IN_FLIGHT).await;
            tap.read_progress_to_end(&world).await;
            // What had not reached the broker by now died with the node.
            tap.lock().pending.remove(&node);
        });
        Box::pin(async move {
            let _ = read.await;
        })
    }

    fn nodes(&self) -> Vec<madsim::task::NodeId> {
        vec![self.broker_node.id(), self.tap_node.id()]
    }

    fn lose_heartbeats(&self, world: &Arc<World>, node: usize, for_ms: u64) -> bool {
        self.coordinator(world).lose_heartbeats(node, for_ms);
        true
    }

    fn write_foreign(&self, _world: &Arc<World>, topic: &TopicName, body: Bytes) -> bool {
        // No headers: not a CloudEvent in either mode, so the mesh dead-letters it.
        let Some(producer) = self.tap.producer.get() else {
            return false;
        };
        let record: FutureRecord<'_, str, [u8]> = FutureRecord::to(topic.as_str()).payload(&body);
        // The tap reports the record when the broker has it; the report is not awaited.
        producer.send_result(record).is_ok()
    }
}

/// What the tap has seen of the data topic.
#[derive(Default)]
struct TapState {
    ready: bool,
    /// The next offset the tap will report, per partition.
    next: BTreeMap<Partition, Offset>,
    /// Where each event id was seen, in the order seen.
    positions: BTreeMap<String, Vec<(Partition, Offset)>>,
    /// The next offset of the progress topic (one partition) the tap will read.
    progress_next: i64,
    /// Below this, every progress record read is reported (the batch it completes
    /// reported durable); it trails `progress_next` while the tap catches up on the data.
    progress_reported: i64,
    /// Per mesh node, batches being written, in ticket order, each waiting for its last
    /// progress record.
    pending: BTreeMap<usize, VecDeque<Pending>>,
    /// Per mesh node, the id of the last batch reported durable (ids count from 1).
    reported: BTreeMap<usize, u64>,
    /// Per mesh node, the id of the last batch registered.
    registered: BTreeMap<usize, u64>,
    /// Per lane (the key's `<group>\n<topic>\n<partition>`) and ownership generation, the
    /// last records of that key, oldest first (a reader that read the topic a moment ago
    /// took one of them; a deletion clears them).
    landed: BTreeMap<String, BTreeMap<Option<i32>, VecDeque<Landed>>>,
    /// A mesh node opened the backend: the subscriptions topic exists.
    opened: bool,
}

/// Records kept per key ([`TapState::landed`]).
const LANDED_PER_KEY: usize = 8;

/// A progress record the topic holds: its value, and the batch checkpoint that wrote it
/// (mesh node, batch, position), when the tap knew of the write.
struct Landed {
    value: Vec<u8>,
    writer: Option<(usize, Arc<PersistBatch>, usize)>,
}

/// A state batch with checkpoints, durable once the broker holds its last progress record.
struct Pending {
    id: u64,
    batch: Arc<PersistBatch>,
    /// The lane, generation and value of each checkpoint's record, in batch order.
    lanes: Vec<(String, Option<i32>, Vec<u8>)>,
    key: Vec<u8>,
    value: Vec<u8>,
    /// The record is at or above this offset of the progress topic (the tap had read
    /// everything below when the batch was registered; earlier writes were reported).
    from: i64,
}

/// A progress record's key as the lane it is of and the generation it was written under
/// (the harness's own reading of the key format; `None` for a key of another kind).
fn lane_of(key: &str) -> Option<(String, Option<i32>)> {
    match key.matches('\n').count() {
        2 => Some((key.to_owned(), None)),
        3 => {
            let (lane, gen) = key.rsplit_once('\n')?;
            Some((lane.to_owned(), Some(gen.parse().ok()?)))
        }
        _ => None,
    }
}

/// The harness's view of the data topic: every record, in offset order per partition.
struct Tap {
    brokers: String,
    topic: TopicName,
    progress_topic: String,
    /// The data topic's reader (set once the topic exists).
    data: tokio::sync::Mutex<Option<BaseConsumer>>,
    /// The progress topic's reader (created with the first batch, once the topic exists).
    progress: tokio::sync::Mutex<Option<BaseConsumer>>,
    subscriptions_topic: String,
    /// The subscriptions topic's reader (created once a node opened the backend).
    subscriptions: tokio::sync::Mutex<Option<BaseConsumer>>,
    partitions: u32,
    max_event_bytes: usize,
    state: Mutex<TapState>,
    changed: tokio::sync::Notify,
    /// A producer of foreign records (set once the broker is up).
    producer: OnceLock<FutureProducer>,
}

impl Tap {
    fn new(settings: &KafkaSettings, partitions: u32) -> Self {
        Self {
            brokers: settings.brokers.clone(),
            topic: crate::run::topic(),
            progress_topic: settings.progress_topic.clone(),
            data: tokio::sync::Mutex::new(None),
            progress: tokio::sync::Mutex::new(None),
            subscriptions_topic: settings.subscriptions_topic.clone(),
            subscriptions: tokio::sync::Mutex::new(None),
            partitions,
            max_event_bytes: settings.max_event_bytes,
            state: Mutex::new(TapState::default()),
            changed: tokio::sync::Notify::new(),
            producer: OnceLock::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, TapState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers)
            .set("enable.auto.commit", "false");
        c
    }

    /// Creates the data topic and the mesh's own topics (once: the simulated broker's
    /// "create" wipes a topic that exists), then reports every record of the data topic
    /// until the run ends.
    async fn run(self: Arc<Self>, world: Arc<World>) {
        let admin: AdminClient<DefaultClientContext> = loop {
            match self.config().create().await {
                Ok(a) => break a,
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        };
        // The mesh's own topics too (one partition each, as the mesh makes its compacted
        // topics here), before any node looks: a node that asked for a topic's metadata
        // before it existed, and was paused until another node had written to it, creates
        // it — which on a real broker answers "already exists", and on the simulated one
        // wipes the topic (group seed 1495 lost four progress records that way).
        let dlqs: Vec<String> = world
            .opts
            .groups
            .iter()
            .map(|g| dlq_topic(self.topic.as_str(), &g.name))
            .collect();
        let own = [&self.progress_topic, &self.subscriptions_topic]
            .into_iter()
            .chain(&dlqs);
        let topics: Vec<NewTopic<'_>> = std::iter::once(NewTopic::new(
            self.topic.as_str(),
            self.partitions as i32,
            TopicReplication::Fixed(1),
        ))
        .chain(own.map(|name| NewTopic::new(name, 1, TopicReplication::Fixed(1))))
        .collect();
        // The broker may not listen yet: try again until it answers.
        while admin
            .create_topics(&topics, &AdminOptions::new())
            .await
            .is_err()
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let consumer: BaseConsumer = match self.config().create().await {
            Ok(c) => c,
            Err(e) => {
                world.fail(violation(
                    Clause::Core,
                    format!("the tap did not start: {e}"),
                ));
                return;
            }
        };
        let mut tpl = TopicPartitionList::new();
        for p in 0..self.partitions {
            let _ = tpl.add_partition_offset(self.topic.as_str(), p as i32, KOffset::Offset(0));
        }
        if let Err(e) = consumer.assign(&tpl) {
            world.fail(violation(Clause::Core, format!("the tap cannot read: {e}")));
            return;
        }
        *self.data.lock().await = Some(consumer);
        if let Ok(p) = self.config().create::<FutureProducer>().await {
            let _ = self.producer.set(p);
        }
        self.lock().ready = true;
        self.changed.notify_waiters();
        while !world.is_done() {
            let data = self.poll_data(&world).await;
            let progress = self.poll_progress(&world).await;
            let definition = self.poll_subscriptions(&world).await;
            if !data && !progress && !definition {
                tokio::time::sleep(TAP_POLL).await;
            }
        }
    }

    /// One record of the progress topic, if the reader has one: reports the pending batch
    /// it completes. False when there was nothing to read.
    async fn poll_progress(&self, world: &World) -> bool {
        if self.lock().registered.is_empty() {
            return false;
        }
        let Some(m) = self.next_record(&self.progress, &self.progress_topic).await else {
            return false;
        };
        let completes = {
            let mut st = self.lock();
            st.progress_next = m.offset() + 1;
            if let Some((lane, gen)) = m
                .key()
                .and_then(|k| std::str::from_utf8(k).ok())
                .and_then(lane_of)
            {
                match m.payload() {
                    Some(value) => {
                        // The first batch still being written (any node's, in queue order)
                        // that writes exactly this record.
                        let writer = st.pending.iter().find_map(|(&n, q)| {
                            q.iter().find_map(|p| {
                                let i = p.lanes.iter().position(|(l, g, v)| {
                                    *l == lane && *g == gen && v.as_slice() == value
                                })?;
                                Some((n, p.batch.clone(), i))
                            })
                        });
                        // No batch writes it: a claim, the checkpoint an assignment resumed
                        // from written again under the new generation. Its source is the
                        // record it copied, whose own generation's record may be deleted
                        // (a tombstone) before a later reader takes the claim (group seed
                        // 7 on the catch-up: a zombie's base went unnamed).
                        let writer = writer.or_else(|| Self::claimed_writer(&st, &lane, value));
                        let kept = st.landed.entry(lane).or_default().entry(gen).or_default();
                        if kept.len() >= LANDED_PER_KEY {
                            kept.pop_front();
                        }
                        kept.push_back(Landed {
                            value: value.to_vec(),
                            writer,
                        });
                    }
                    None => {
                        if let Some(gens) = st.landed.get_mut(&lane) {
                            gens.remove(&gen);
                        }
                    }
                }
            }
            Self::completed_by(&st, &m).is_some()
        };
        if !completes {
            self.lock().progress_reported = m.offset() + 1;
            return true;
        }
        // What the batch names must be in the harness's log first: a checkpoint may name
        // records the tap has not read yet (after a clock jump everything fires at once;
        // group seeds 8391, 13036, 15558, 15807, 18351 judged a checkpoint against a log
        // the tap had read only in part).
        self.catch_up(world).await;
        let done = {
            let mut st = self.lock();
            Self::completed_by(&st, &m).and_then(|node| {
                let p = st.pending.get_mut(&node)?.pop_front()?;
                st.reported.insert(node, p.id);
                let outranked: Vec<bool> = p
                    .lanes
                    .iter()
                    .map(|(lane, gen, _)| {
                        st.landed
                            .get(lane)
                            .and_then(|g| g.keys().next_back())
                            .is_some_and(|top| top > gen)
                    })
                    .collect();
                Some((node, p.batch, outranked))
            })
        };
        if let Some((node, batch, outranked)) = done {
            world.persist_durable_outranked(node, &batch, &outranked);
        }
        self.lock().progress_reported = m.offset() + 1;
        self.changed.notify_waiters();
        true
    }

    /// One record of the subscriptions topic, if the reader has one: the definition it
    /// holds is what a restart takes. False when there was nothing to read.
    async fn poll_subscriptions(&self, world: &World) -> bool {
        if !self.lock().opened {
            return false;
        }
        let Some(m) = self
            .next_record(&self.subscriptions, &self.subscriptions_topic)
            .await
        else {
            return false;
        };
        let key = m.key().and_then(|k| std::str::from_utf8(k).ok());
        if let Some(spec) = key.zip(m.payload()).and_then(|(k, v)| definition(k, v)) {
            world.spec_durable(&spec);
        }
        true
    }

    /// The next record of partition 0 of `topic` (the progress and subscriptions topics
    /// have one), read by the reader in `slot` (made at the first call), if it has one.
    async fn next_record(
        &self,
        slot: &tokio::sync::Mutex<Option<BaseConsumer>>,
        topic: &str,
    ) -> Option<OwnedMessage> {
        let mut reader = slot.lock().await;
        if reader.is_none() {
            let c = self.config().create::<BaseConsumer>().await.ok()?;
            let mut tpl = TopicPartitionList::new();
            let _ = tpl.add_partition_offset(topic, 0, KOffset::Offset(0));
            c.assign(&tpl).ok()?;
            *reader = Some(c);
        }
        match reader.as_ref()?.poll(Duration::ZERO).await {
            Some(Ok(m)) => Some(m.detach()),
            _ => None,
        }
    }

    /// The writer of the newest record of `lane` that holds the checkpoint `value` holds
    /// and names one.
    fn claimed_writer(
        st: &TapState,
        lane: &str,
        value: &[u8],
    ) -> Option<(usize, Arc<PersistBatch>, usize)> {
        let checkpoint = unimesh_core::Checkpoint::decode(unframed(value)).ok()?;
        Self::writer_of(st, lane, &checkpoint)
    }

    /// The writer named by the newest record of `lane` that holds `checkpoint` and names
    /// one.
    fn writer_of(
        st: &TapState,
        lane: &str,
        checkpoint: &unimesh_core::Checkpoint,
    ) -> Option<(usize, Arc<PersistBatch>, usize)> {
        st.landed
            .get(lane)?
            .values()
            .rev()
            .flat_map(|kept| kept.iter().rev())
            .find_map(|l| {
                let writer = l.writer.as_ref()?;
                let read = unimesh_core::Checkpoint::decode(unframed(&l.value)).ok()?;
                (read == *checkpoint).then(|| writer.clone())
            })
    }

    /// The node whose first pending batch progress record `m` completes.
    fn completed_by(st: &TapState, m: &OwnedMessage) -> Option<usize> {
        st.pending.iter().find_map(|(&node, q)| {
            q.front()
                .is_some_and(|p| {
                    m.offset() >= p.from
                        && m.key() == Some(p.key.as_slice())
                        && m.payload() == Some(p.value.as_slice())
                })
                .then_some(node)
        })
    }

    /// One record of the data topic, reported, if the reader has one. False when there
    /// was nothing to read.
    async fn poll_data(&self, world: &World) -> bool {
        let reader = self.data.lock().await;
        let Some(consumer) = reader.as_ref() else {
            return false;
        };
        match consumer.poll(Duration::ZERO).await {
            Some(Ok(m)) => {
                self.report(world, &m);
                true
            }
            Some(Err(e)) => {
                tracing::warn!(error = %e, "the tap could not read");
                false
            }
            None => false,
        }
    }

    /// Reads the data topic up to the end the broker has now, in every partition; a
    /// catch-up this long fails the run.
    async fn catch_up(&self, world: &World) {
        let mut ends = Vec::with_capacity(self.partitions as usize);
        {
            let reader = self.data.lock().await;
            let Some(consumer) = reader.as_ref() else {
                return;
            };
            for p in 0..self.partitions {
                let read = consumer
                    .fetch_watermarks(self.topic.as_str(), p as i32, Duration::from_secs(1))
                    .await;
                match read {
                    Ok((_, hi)) => ends.push((p, hi.max(0) as Offset)),
                    Err(e) => {
                        let message = format!("the tap cannot read the data topic's end: {e}");
                        world.fail(violation(Clause::Core, message));
                        return;
                    }
                }
            }
        }
        let behind = |tap: &Self| {
            let st = tap.lock();
            ends.iter()
                .any(|&(p, hi)| st.next.get(&p).copied().unwrap_or(0) < hi)
        };
        let deadline = tokio::time::Instant::now() + TAP_WAIT;
        while behind(self) {
            if tokio::time::Instant::now() >= deadline {
                let message =
                    format!("the tap did not read the data topic to {ends:?} within {TAP_WAIT:?}");
                world.fail(violation(Clause::Core, message));
                return;
            }
            if !self.poll_data(world).await {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }

    /// Waits until the tap has read the progress topic to its end, reporting every batch
    /// that became durable.
    async fn read_progress_to_end(&self, world: &World) {
        if self.lock().registered.is_empty() {
            return;
        }
        let hi = match self.config().create::<BaseConsumer>().await {
            Ok(meta) => {
                meta.fetch_watermarks(&self.progress_topic, 0, Duration::from_secs(1))
                    .await
            }
            Err(e) => Err(e),
        };
        let hi = match hi {
            Ok((_, hi)) => hi,
            Err(e) => {
                let message = format!("the tap cannot read the progress topic's end: {e}");
                world.fail(violation(Clause::Core, message));
                return;
            }
        };
        // The tap's own loop reads it (only that loop reads and reports progress records,
        // so they are reported in the topic's order, each after the data it names).
        let deadline = tokio::time::Instant::now() + TAP_WAIT;
        while self.lock().progress_reported < hi && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Registers a batch with checkpoints being written by mesh node `node`, with the
    /// lane and generation of each checkpoint's record and the key and value of the last;
    /// its id, to wait for.
    fn register(
        &self,
        node: usize,
        batch: Arc<PersistBatch>,
        lanes: Vec<(String, Option<i32>, Vec<u8>)>,
        key: String,
        value: Vec<u8>,
    ) -> u64 {
        let mut st = self.lock();
        let registered = st.registered.entry(node).or_insert(0);
        *registered += 1;
        let id = *registered;
        let from = st.progress_next;
        st.pending.entry(node).or_default().push_back(Pending {
            id,
            batch,
            lanes,
            key: key.into_bytes(),
            value,
            from,
        });
        id
    }

    /// The batch checkpoint that wrote the record a reader of `partition` of `group` took
    /// when it resumed from `checkpoint`: of the lane's records with that value, the one of
    /// the highest generation (a reader takes the highest); `None` when the topic holds no
    /// such record, or the tap did not know of its write.
    fn source(
        &self,
        group: &GroupName,
        partition: Partition,
        checkpoint: &unimesh_core::Checkpoint,
    ) -> Option<(usize, Arc<PersistBatch>, usize)> {
        let lane = format!("{group}\n{}\n{partition}", self.topic);
        Self::writer_of(&self.lock(), &lane, checkpoint)
    }

    /// Forgets a batch of mesh node `node` whose write failed (what of it reached the
    /// broker is not reported).
    fn unregister(&self, node: usize, id: u64) {
        if let Some(q) = self.lock().pending.get_mut(&node) {
            q.retain(|p| p.id != id);
        }
    }

    /// One record of the data topic, reported in offset order.
    fn report<M: Message>(&self, world: &World, m: &M) {
        let partition = m.partition().max(0) as Partition;
        let record = decode_message(m, self.max_event_bytes);
        {
            let mut st = self.lock();
            let next = st.next.entry(partition).or_insert(0);
            if record.offset != *next {
                let expected = *next;
                drop(st);
                world.fail(violation(
                    Clause::C9,
                    format!(
                        "the broker's {}/{partition} went from offset {expected} to {}",
                        self.topic, record.offset
                    ),
                ));
                return;
            }
            *next = record.offset + 1;
            if let RecordMeta::Event(meta) = &record.meta {
                st.positions
                    .entry(meta.id.clone())
                    .or_default()
                    .push((partition, record.offset));
            }
        }
        world.published_record(&self.topic, partition, &record);
        self.changed.notify_waiters();
    }

    /// Waits until `seen` holds of what the tap saw; a wait this long fails the run.
    async fn wait(
        &self,
        world: &World,
        what: &str,
        seen: impl Fn(&TapState) -> bool,
    ) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + TAP_WAIT;
        loop {
            let changed = self.changed.notified();
            if seen(&self.lock()) {
                return Ok(());
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                let message = format!("the tap did not see {what} within {TAP_WAIT:?}");
                world.fail(violation(Clause::Core, message.clone()));
                return Err(message);
            }
            let _ = tokio::time::timeout(deadline - now, changed).await;
        }
    }
}

/// The Kafka log port, with publish answers and fetch answers held until the tap has
/// reported what they name (see the module documentation).
struct TappedLog {
    inner: KafkaLog,
    tap: Arc<Tap>,
    world: Arc<World>,
}

impl LogPort for TappedLog {
    fn fetch(
        &self,
        group: GroupName,
        topic: TopicName,
        partition: Partition,
        from: Offset,
        max: usize,
        max_bytes: usize,
        wait_ms: u64,
    ) -> BoxFut<LogRead> {
        let read = self
            .inner
            .fetch(group, topic, partition, from, max, max_bytes, wait_ms);
        let (tap, world) = (self.tap.clone(), self.world.clone());
        Box::pin(async move {
            let read = read.await;
            if let LogRead::Decoded(records) = &read {
                if let Some(last) = records.last().map(|r| r.offset) {
                    let reported = tap
                        .wait(&world, "a fetched record", |t| {
                            t.next.get(&partition).is_some_and(|&n| n > last)
                        })
                        .await;
                    if let Err(e) = reported {
                        return LogRead::Failed(e);
                    }
                }
            }
            read
        })
    }

    fn append(
        &self,
        topic: TopicName,
        items: Vec<AppendItem>,
    ) -> BoxFut<Result<Vec<(Partition, Offset)>, StorageError>> {
        let ids: Vec<Option<String>> = items
            .iter()
            .map(|i| {
                unimesh_shell::event::decode_stored(&i.value)
                    .ok()
                    .map(|m| m.id)
            })
            .collect();
        let append = self.inner.append(topic, items);
        let (tap, world) = (self.tap.clone(), self.world.clone());
        Box::pin(async move {
            append.await?;
            // The delivery reports say nothing of where: the tap's positions do.
            let Some(ids) = ids.into_iter().collect::<Option<Vec<String>>>() else {
                return Err(StorageError::Invalid(
                    "an item is not a stored event".into(),
                ));
            };
            tap.wait(&world, "a published event", |t| {
                ids.iter().all(|id| t.positions.contains_key(id))
            })
            .await
            .map_err(StorageError::unavailable)?;
            let st = tap.lock();
            Ok(ids
                .iter()
                .filter_map(|id| st.positions.get(id).and_then(|v| v.last().copied()))
                .collect())
        })
    }

    fn prepare_topic(
        &self,
        topic: TopicName,
        with_offsets: bool,
    ) -> BoxFut<Result<TopicFacts, StorageError>> {
        self.inner.prepare_topic(topic, with_offsets)
    }

    fn partitions(&self, topic: TopicName) -> BoxFut<Option<u32>> {
        LogPort::partitions(&self.inner, topic)
    }

    fn offsets(
        &self,
        topic: TopicName,
        partition: Partition,
    ) -> BoxFut<Result<(Offset, Offset), StorageError>> {
        LogPort::offsets(&self.inner, topic, partition)
    }

    fn enforce_retention(&self) -> BoxFut<Result<usize, StorageError>> {
        LogPort::enforce_retention(&self.inner)
    }

    fn metrics(&self) -> Option<LogMetrics> {
        self.inner.metrics()
    }

    fn group(&self) -> Option<&dyn GroupLog> {
        Some(self)
    }

    fn close(&self) -> BoxFut<()> {
        self.inner.close()
    }
}

impl GroupLog for TappedLog {
    fn attach(&self, events: tokio::sync::mpsc::Sender<GroupEvent>) {
        // An assignment reaches the engine once the tap has read the progress topic as far
        // as the consumer did (to its end now), so the world knows the record each lane
        // resumes from when the engine takes it.
        let (tx, mut rx) = tokio::sync::mpsc::channel(1_024);
        GroupLog::attach(&self.inner, tx);
        let (tap, world) = (self.tap.clone(), self.world.clone());
        tokio::spawn(async move {
            while let Some(event) = rx.recv().await {
                if matches!(event, GroupEvent::Assigned { .. }) {
                    tap.read_progress_to_end(&world).await;
                }
                if events.send(event).await.is_err() {
                    return;
                }
            }
        });
    }

    fn join(&self, group: &GroupName, topic: &TopicName) -> Result<(), StorageError> {
        GroupLog::join(&self.inner, group, topic)
    }

    fn leave(&self, group: &GroupName) {
        GroupLog::leave(&self.inner, group)
    }

    fn commit(&self, group: &GroupName, topic: &TopicName, partition: Partition, offset: Offset) {
        GroupLog::commit(&self.inner, group, topic, partition, offset)
    }

    fn instance(&self) -> Option<String> {
        GroupLog::instance(&self.inner)
    }
}

/// The Kafka state port of mesh node `node`, with each batch reported durable when it is
/// (see the module documentation).
struct ReportingState {
    inner: KafkaState,
    tap: Arc<Tap>,
    world: Arc<World>,
    node: usize,
}

impl StatePort for ReportingState {
    fn load(&self) -> BoxFut<Result<Loaded, StorageError>> {
        self.inner.load()
    }

    fn apply(
        &self,
        batch: Arc<PersistBatch>,
        now_wall_ms: u64,
    ) -> BoxFut<Result<(), StorageError>> {
        // The record of each checkpoint, as the port writes it now (a lane not owned here
        // fences the whole batch, which then writes nothing).
        let records: Option<Vec<(String, Vec<u8>)>> = batch
            .checkpoints
            .iter()
            .map(|lane| {
                self.inner
                    .progress_record(lane)
                    .ok()
                    .map(|(k, v, _)| (k, v))
            })
            .collect();
        let node = self.node;
        let registered = records.and_then(|records| {
            let lanes = records
                .iter()
                .filter_map(|(k, v)| lane_of(k).map(|(lane, gen)| (lane, gen, v.clone())))
                .collect();
            let (key, value) = records.last()?.clone();
            Some(self.tap.register(node, batch.clone(), lanes, key, value))
        });
        let write = self.inner.apply(batch.clone(), now_wall_ms);
        let (tap, world) = (self.tap.clone(), self.world.clone());
        Box::pin(async move {
            let written = write.await;
            let Some(id) = registered else {
                written?;
                world.persist_durable(node, &batch);
                return Ok(());
            };
            if let Err(e) = written {
                tap.unregister(node, id);
                return Err(e);
            }
            tap.wait(&world, "a batch's last progress record", |t| {
                t.reported.get(&node).is_some_and(|&r| r >= id)
            })
            .await
            .map_err(StorageError::unavailable)
        })
    }

    fn dlq_list(
        &self,
        group: GroupName,
        max: usize,
    ) -> BoxFut<Result<Vec<DlqEntry>, StorageError>> {
        self.inner.dlq_list(group, max)
    }

    fn dlq_list_for_replay(
        &self,
        group: GroupName,
        max: usize,
    ) -> BoxFut<Result<Vec<DlqEntry>, StorageError>> {
        self.inner.dlq_list_for_replay(group, max)
    }

    fn dlq_replay_refused(&self, group: &GroupName, keys: &[DlqKey]) {
        self.inner.dlq_replay_refused(group, keys)
    }

    fn put_rate_rule(
        &self,
        topic: TopicName,
        rule: Option<RateRule>,
    ) -> BoxFut<Result<(), StorageError>> {
        self.inner.put_rate_rule(topic, rule)
    }
}
