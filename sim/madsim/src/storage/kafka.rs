//! The Kafka shape: the shell's own Kafka port (`unimesh_shell::kafka`: `KafkaLog`, the
//! progress topic, `KafkaState`) against madsim-rdkafka's simulated broker, which runs on
//! a node of its own and outlives every kill of the mesh node. That broker has no consumer
//! groups, so the port runs its explicit-assignment mode: one instance owns every
//! partition and resumes each from its progress record.
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
//!   without checkpoints is durable when `KafkaState::apply` answers. Known gap:
//!   `KafkaState` writes a batch to two stores (the topics, then the node's local store for
//!   definitions and rate rules), so a kill between the two leaves its local part lost
//!   although the world counts the batch durable.

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
use madsim_rdkafka::producer::{FutureProducer, FutureRecord};
use madsim_rdkafka::{ClientConfig, Message, Offset as KOffset, SimBroker, TopicPartitionList};
use madsim_tokio as tokio;
use unimesh_core::{
    DlqKey, GroupName, Offset, Partition, PersistBatch, RateRule, RecordMeta, TopicName,
};
use unimesh_shell::config::Config;
use unimesh_shell::engine::{
    AppendError, BoxFut, GroupEvent, LogMetrics, LogPort, LogRead, StatePort, StoreAdapter,
    TopicFacts,
};
use unimesh_shell::kafka::{decode_message, KafkaLog, KafkaSettings, KafkaState};
use unimesh_shell::log::AppendItem;
use unimesh_shell::state::{DlqEntry, Loaded, MemoryDisk, MemoryStore};
use unimesh_sim::rng::Rng;
use unimesh_sim::Clause;

use super::{Backend, Ports};
use crate::options::Options;
use crate::world::{violation, World};

const BROKER: ([u8; 4], u16) = ([10, 0, 9, 1], 9092);
const TAP_IP: [u8; 4] = [10, 0, 9, 2];
/// How long the log port waits for the tap before the run fails (simulated time; the tap
/// polls every few milliseconds, so this is a harness fault, not a slow broker).
const TAP_WAIT: Duration = Duration::from_secs(30);
const TAP_POLL: Duration = Duration::from_millis(5);

fn broker_addr() -> SocketAddr {
    SocketAddr::from(BROKER)
}

/// The shell's Kafka port on the simulated broker (see the module documentation).
pub struct KafkaBackend {
    settings: KafkaSettings,
    /// The local part of the state port (epoch, definitions, rate rules): the node's disk.
    disk: MemoryDisk,
    tap: Arc<Tap>,
    tap_node: NodeHandle,
    tap_started: AtomicBool,
}

impl KafkaBackend {
    /// Starts the broker on a node of its own (inside the run's runtime).
    pub fn new(opts: &Options) -> Self {
        let handle = Handle::current();
        let addr = broker_addr();
        handle
            .create_node()
            .name("kafka")
            .ip(addr.ip())
            .build()
            .spawn(async move {
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
        let settings = KafkaSettings::from_config(&cfg, 0);
        let tap = Arc::new(Tap::new(&settings, opts.partitions.max(1)));
        Self {
            settings,
            disk: MemoryDisk::new(),
            tap,
            tap_node,
            tap_started: AtomicBool::new(false),
        }
    }
}

impl Backend for KafkaBackend {
    fn name(&self) -> &'static str {
        "kafka"
    }

    fn ports(&self, world: &Arc<World>, _rng: Rng) -> BoxFut<Result<Ports, String>> {
        if !self.tap_started.swap(true, AtomicOrdering::Relaxed) {
            self.tap_node.spawn(self.tap.clone().run(world.clone()));
        }
        let (tap, world) = (self.tap.clone(), world.clone());
        let (settings, disk) = (self.settings.clone(), self.disk.clone());
        Box::pin(async move {
            tap.wait(&world, "the data topic", |t| t.ready).await?;
            let log = KafkaLog::open(settings).await?;
            log.spawn_offsets_refresh(Duration::from_millis(200));
            let local = StoreAdapter::new(Box::new(MemoryStore::open(disk)));
            let state: Arc<dyn StatePort> = Arc::new(ReportingState {
                inner: KafkaState::new(local, log.clone()),
                tap: tap.clone(),
                world: world.clone(),
            });
            let log: Arc<dyn LogPort> = Arc::new(TappedLog {
                inner: log,
                tap,
                world,
            });
            Ok((log, state))
        })
    }

    fn killed(&self, world: &Arc<World>) -> BoxFut<()> {
        let (tap, world) = (self.tap.clone(), world.clone());
        // On the tap's node: the caller's may have no address to reach the broker from.
        let read = self.tap_node.spawn(async move {
            tap.read_progress_to_end(&world).await;
            // What had not reached the broker by now died with the node.
            tap.lock().pending.clear();
        });
        Box::pin(async move {
            let _ = read.await;
        })
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
    /// Batches being written, in ticket order, each waiting for its last progress record.
    pending: VecDeque<Pending>,
    /// The id of the last batch reported durable (ids count from 1).
    reported: u64,
    registered: u64,
}

/// A state batch with checkpoints, durable once the broker holds its last progress record.
struct Pending {
    id: u64,
    batch: Arc<PersistBatch>,
    key: Vec<u8>,
    value: Vec<u8>,
    /// The record is at or above this offset of the progress topic (the tap had read
    /// everything below when the batch was registered; earlier writes were reported).
    from: i64,
}

/// The harness's view of the data topic: every record, in offset order per partition.
struct Tap {
    brokers: String,
    topic: TopicName,
    progress_topic: String,
    /// The progress topic's reader (created with the first batch, once the topic exists).
    progress: tokio::sync::Mutex<Option<BaseConsumer>>,
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
            progress: tokio::sync::Mutex::new(None),
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

    /// Creates the data topic (once: the simulated broker's "create" wipes a topic that
    /// exists), then reports every record of it until the run ends.
    async fn run(self: Arc<Self>, world: Arc<World>) {
        let admin: AdminClient<DefaultClientContext> = loop {
            match self.config().create().await {
                Ok(a) => break a,
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        };
        let topic = NewTopic::new(
            self.topic.as_str(),
            self.partitions as i32,
            TopicReplication::Fixed(1),
        );
        // The broker may not listen yet: try again until it answers.
        while admin
            .create_topics([&topic], &AdminOptions::new())
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
        if let Ok(p) = self.config().create::<FutureProducer>().await {
            let _ = self.producer.set(p);
        }
        self.lock().ready = true;
        self.changed.notify_waiters();
        while !world.is_done() {
            let data = match consumer.poll(Duration::ZERO).await {
                Some(Ok(m)) => {
                    self.report(&world, &m);
                    true
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "the tap could not read");
                    false
                }
                None => false,
            };
            let progress = self.poll_progress(&world).await;
            if !data && !progress {
                tokio::time::sleep(TAP_POLL).await;
            }
        }
    }

    /// One record of the progress topic, if the reader has one: reports the pending batch
    /// it completes. False when there was nothing to read.
    async fn poll_progress(&self, world: &World) -> bool {
        if self.lock().registered == 0 {
            return false;
        }
        let mut reader = self.progress.lock().await;
        if reader.is_none() {
            let Ok(c) = self.config().create::<BaseConsumer>().await else {
                return false;
            };
            let mut tpl = TopicPartitionList::new();
            let _ = tpl.add_partition_offset(&self.progress_topic, 0, KOffset::Offset(0));
            if c.assign(&tpl).is_err() {
                return false;
            }
            *reader = Some(c);
        }
        let Some(c) = reader.as_ref() else {
            return false;
        };
        let Some(Ok(m)) = c.poll(Duration::ZERO).await else {
            return false;
        };
        let done = {
            let mut st = self.lock();
            st.progress_next = m.offset() + 1;
            let completes = st.pending.front().is_some_and(|p| {
                m.offset() >= p.from
                    && m.key() == Some(p.key.as_slice())
                    && m.payload() == Some(p.value.as_slice())
            });
            if completes {
                st.pending.pop_front().map(|p| {
                    st.reported = p.id;
                    p.batch
                })
            } else {
                None
            }
        };
        if let Some(batch) = done {
            world.persist_durable(&batch);
            self.changed.notify_waiters();
        }
        true
    }

    /// Reads the progress topic to its end, reporting every batch that became durable.
    async fn read_progress_to_end(&self, world: &World) {
        if self.lock().registered == 0 {
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
        let deadline = tokio::time::Instant::now() + TAP_WAIT;
        while self.lock().progress_next < hi && tokio::time::Instant::now() < deadline {
            if !self.poll_progress(world).await {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    }

    /// Registers a batch with checkpoints being written; its id, to wait for.
    fn register(&self, batch: Arc<PersistBatch>, key: String, value: Vec<u8>) -> u64 {
        let mut st = self.lock();
        st.registered += 1;
        let id = st.registered;
        let from = st.progress_next;
        st.pending.push_back(Pending {
            id,
            batch,
            key: key.into_bytes(),
            value,
            from,
        });
        id
    }

    /// Forgets a batch whose write failed (what of it reached the broker is not reported).
    fn unregister(&self, id: u64) {
        self.lock().pending.retain(|p| p.id != id);
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
    ) -> BoxFut<Result<Vec<(Partition, Offset)>, AppendError>> {
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
                return Err(AppendError::Invalid("an item is not a stored event".into()));
            };
            tap.wait(&world, "a published event", |t| {
                ids.iter().all(|id| t.positions.contains_key(id))
            })
            .await
            .map_err(AppendError::Unavailable)?;
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
    ) -> BoxFut<Result<TopicFacts, AppendError>> {
        self.inner.prepare_topic(topic, with_offsets)
    }

    fn partitions(&self, topic: &TopicName) -> Option<u32> {
        self.inner.partitions(topic)
    }

    fn offsets(&self, topic: &TopicName, partition: Partition) -> Result<(Offset, Offset), String> {
        self.inner.offsets(topic, partition)
    }

    fn enforce_retention(&self) -> Result<usize, String> {
        self.inner.enforce_retention()
    }

    fn metrics(&self) -> Option<LogMetrics> {
        self.inner.metrics()
    }

    fn assigns_partitions(&self) -> bool {
        self.inner.assigns_partitions()
    }

    fn attach(&self, events: tokio::sync::mpsc::Sender<GroupEvent>) {
        self.inner.attach(events)
    }

    fn join(&self, group: &GroupName, topic: &TopicName) -> Result<(), String> {
        self.inner.join(group, topic)
    }

    fn leave(&self, group: &GroupName) {
        self.inner.leave(group)
    }

    fn commit(&self, group: &GroupName, topic: &TopicName, partition: Partition, offset: Offset) {
        self.inner.commit(group, topic, partition, offset)
    }

    fn instance(&self) -> Option<String> {
        self.inner.instance()
    }

    fn close(&self) -> BoxFut<()> {
        self.inner.close()
    }
}

/// The Kafka state port, with each batch reported durable when it is (see the module
/// documentation).
struct ReportingState {
    inner: KafkaState,
    tap: Arc<Tap>,
    world: Arc<World>,
}

impl StatePort for ReportingState {
    fn load(&self) -> Result<Loaded, String> {
        self.inner.load()
    }

    fn apply(&self, batch: Arc<PersistBatch>, now_wall_ms: u64) -> BoxFut<Result<(), String>> {
        let last = batch
            .checkpoints
            .last()
            .and_then(|lane| self.inner.progress_record(lane).ok());
        let registered = last.map(|(key, value, _)| self.tap.register(batch.clone(), key, value));
        let write = self.inner.apply(batch.clone(), now_wall_ms);
        let (tap, world) = (self.tap.clone(), self.world.clone());
        Box::pin(async move {
            let written = write.await;
            let Some(id) = registered else {
                written?;
                world.persist_durable(&batch);
                return Ok(());
            };
            if let Err(e) = written {
                tap.unregister(id);
                return Err(e);
            }
            tap.wait(&world, "a batch's last progress record", |t| {
                t.reported >= id
            })
            .await
        })
    }

    fn dlq_list(&self, group: GroupName, max: usize) -> BoxFut<Result<Vec<DlqEntry>, String>> {
        self.inner.dlq_list(group, max)
    }

    fn dlq_list_for_replay(
        &self,
        group: GroupName,
        max: usize,
    ) -> BoxFut<Result<Vec<DlqEntry>, String>> {
        self.inner.dlq_list_for_replay(group, max)
    }

    fn dlq_replay_refused(&self, group: &GroupName, keys: &[DlqKey]) {
        self.inner.dlq_replay_refused(group, keys)
    }

    fn put_rate_rule(
        &self,
        topic: TopicName,
        rule: Option<RateRule>,
    ) -> BoxFut<Result<(), String>> {
        self.inner.put_rate_rule(topic, rule)
    }
}
