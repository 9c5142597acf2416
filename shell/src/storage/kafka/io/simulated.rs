//! The group consumer under the madsim simulator (`--cfg madsim`), in `consumer.rs`'s
//! place. madsim-rdkafka's simulated broker has no consumer groups, so the simulation
//! brings its own group coordinator ([`SimCoordinator`], the harness's) and this file is
//! the I/O side that talks to it; every decision is the one `consumer.rs` ships, from
//! `rules/`: the coordinator's messages are [`Rebalance`]s, the values librdkafka's
//! rebalance callback becomes in `consumer.rs`, and they go through the same
//! `assign::lane_start` (what each partition resumes from), `Revocation` (what a
//! revocation asks the engine, commits and lets go) and `Part` (the partition buffer).
//!
//! What differs is I/O only:
//! - membership: a task of the node heartbeats the coordinator (so a killed or paused node
//!   stops, and its session expires); a heartbeat the coordinator refuses means the
//!   assignment was lost, which becomes `Rebalance::Revoke { lost: true }` of everything
//!   held — what librdkafka does on `UNKNOWN_MEMBER_ID` — and the member joins again;
//! - commits go to the coordinator with the member's generation (it fences a stale one);
//! - reads: each assigned partition has a reader of its own, a consumer assigned to it
//!   alone, made anew at every reposition (the simulated consumer keeps what it fetched in
//!   a buffer an `assign` does not clear); the broker has no leader epochs and never loses
//!   a tail, so a lane's check against the log before its first fetch is against the log's
//!   end only, and the progress reader reads to the broker's end offsets (no sync marker:
//!   its delivery reports carry no offset).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use madsim_rdkafka::{Message, Offset as KOffset, TopicPartitionList};
use madsim_tokio as tokio;
use tokio::sync::mpsc;
use unimesh_core::{GroupName, LaneCheckpoint, Offset, Partition, TopicName};

use super::client_log::{ClientLog, LoggedConsumer};
use super::log::{lock, KafkaLog};
use super::progress::Chosen;
use super::records::decode_message;
use super::ClientRole;
use crate::storage::kafka::rules::epochs::divergence;
use crate::storage::kafka::rules::part::{self, Part};
use crate::storage::kafka::rules::revoke::{Ask, Revocation};
use crate::storage::kafka::rules::{assign, Rebalance};
use crate::storage::ports::{GroupEvent, LogRead, StorageError};

/// How long a fetch at the end of a partition waits before asking the broker again.
const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// How long a revocation waits for the engine to flush before giving the partitions up
/// (`consumer.rs`).
const REVOKE_WAIT: Duration = Duration::from_secs(30);
/// How long an assignment reads the progress topic again while it fails (`consumer.rs`).
const PROGRESS_READ_WAIT: Duration = Duration::from_secs(60);
/// How long the consumer waits before asking the broker again after a failed request.
const RETRY_INTERVAL: Duration = Duration::from_millis(100);
/// Reads of a partition's offsets at an assignment before the lane's first fetch is left
/// to read them (`consumer.rs`).
const OFFSET_READS: u32 = 3;

/// A member of a group at the simulation's coordinator.
pub type MemberId = u64;

/// The group coordinator of a simulation, as a member sees it: Kafka's group protocol cut
/// down to what librdkafka tells its application. Implemented by the harness
/// (`sim/madsim`), which decides membership, generations and assignments.
pub trait SimCoordinator: Send + Sync + 'static {
    /// `client` joins `group_id` as a new member. The coordinator's rebalances for it go
    /// to `callbacks`, in order: `Assign` with the group generation (also with no
    /// partitions: the member's generation moved on), `Revoke` of partitions it takes back
    /// (never lost: the member learns that from a refused heartbeat).
    fn join(
        &self,
        group_id: &str,
        client: &str,
        callbacks: mpsc::UnboundedSender<Rebalance>,
    ) -> MemberId;

    /// How often a member heartbeats.
    fn heartbeat_interval(&self) -> Duration;

    /// The member is alive; false when the coordinator no longer counts it a member (its
    /// session expired, or it was expelled): whatever it held is lost.
    fn heartbeat(&self, member: MemberId) -> bool;

    /// The member's revocation callback returned: the partitions are free for others.
    fn revoked(&self, member: MemberId, partitions: &[Partition]);

    /// Commits `offsets` as `member` in `generation`; the broker's reason when it refuses
    /// (an unknown member, a stale generation).
    fn commit(
        &self,
        member: MemberId,
        generation: Option<i32>,
        offsets: &BTreeMap<Partition, Offset>,
    ) -> Result<(), String>;

    /// The group's committed offsets of `partitions` (those it has).
    fn committed(&self, group_id: &str, partitions: &[Partition]) -> BTreeMap<Partition, Offset>;

    /// The member leaves the group (after it gave up what it held).
    fn leave(&self, member: MemberId);
}

impl KafkaLog {
    /// The group coordinator this log's group consumers join (the simulated broker has
    /// none). Set once, before the engine joins a group.
    pub fn set_coordinator(&self, coordinator: Arc<dyn SimCoordinator>) {
        let _ = self.inner.side.coordinator.set(coordinator);
    }
}

/// A fetch waiting in a partition's buffer: its bounds (the reply is the fetch's own
/// return value here).
struct Want {
    max: usize,
    max_bytes: usize,
}

impl part::Waiting for Want {
    fn max(&self) -> usize {
        self.max
    }

    fn max_bytes(&self) -> usize {
        self.max_bytes
    }
}

/// One assigned partition: its buffer, and the reader that fills it.
struct Lane {
    part: Part<Want>,
    /// None until the first fetch, and after a failed read or a reposition.
    reader: Option<LoggedConsumer>,
}

/// What the consumer's task hears: the coordinator, its own heartbeat, a stop.
enum Heard {
    Coordinator(MemberId, Rebalance),
    Lost(MemberId),
    Stop,
}

/// The handle the [`KafkaLog`] keeps of a group's consumer.
pub(super) struct GroupConsumer {
    shared: Arc<Shared>,
    heard: mpsc::UnboundedSender<Heard>,
}

struct Shared {
    log: KafkaLog,
    group: GroupName,
    topic: TopicName,
    coordinator: Arc<dyn SimCoordinator>,
    events: mpsc::Sender<GroupEvent>,
    state: Mutex<State>,
    /// The consumer left the group (or is leaving): fetches answer failed.
    stopped: AtomicBool,
    /// Its task ended.
    ended: AtomicBool,
}

#[derive(Default)]
struct State {
    member: Option<MemberId>,
    /// The group generation of the member's last assignment (what its commits carry).
    generation: Option<i32>,
    lanes: BTreeMap<Partition, Arc<tokio::sync::Mutex<Lane>>>,
    /// The revocation waiting for the engine: commits asked meanwhile go into it.
    revoking: Option<Revocation>,
}

impl GroupConsumer {
    /// Joins `group` (reading `topic`) at the coordinator set on `log`; rebalances reach
    /// the engine through `events`.
    pub fn start(
        log: KafkaLog,
        group: GroupName,
        topic: TopicName,
        events: mpsc::Sender<GroupEvent>,
    ) -> Result<Self, StorageError> {
        let coordinator = log.inner.side.coordinator.get().cloned().ok_or_else(|| {
            StorageError::unavailable(
                "no group coordinator: a simulation sets one with KafkaLog::set_coordinator",
            )
        })?;
        let shared = Arc::new(Shared {
            log,
            group,
            topic,
            coordinator,
            events,
            state: Mutex::new(State::default()),
            stopped: AtomicBool::new(false),
            ended: AtomicBool::new(false),
        });
        let (heard, rx) = mpsc::unbounded_channel();
        let s = shared.clone();
        let tx = heard.clone();
        tokio::spawn(async move {
            s.run(rx, tx).await;
            s.ended.store(true, Ordering::Relaxed);
        });
        tracing::info!(group = %shared.group, topic = %shared.topic, "Kafka consumer joining the group");
        Ok(Self { shared, heard })
    }

    pub async fn fetch(
        &self,
        partition: Partition,
        from: Offset,
        max: usize,
        max_bytes: usize,
        wait_ms: u64,
    ) -> LogRead {
        self.shared
            .fetch(partition, from, max.max(1), max_bytes, wait_ms)
            .await
    }

    /// Commits at once, or with the revocation under way (`consumer.rs` takes commits off
    /// its channel into the revocation the same way).
    pub fn commit(&self, partition: Partition, offset: Offset) {
        let (member, generation) = {
            let mut st = lock(&self.shared.state);
            if let Some(r) = st.revoking.as_mut() {
                r.commit_asked(partition, offset);
                return;
            }
            (st.member, st.generation)
        };
        if let Some(member) = member {
            self.shared
                .commit(member, generation, &BTreeMap::from([(partition, offset)]));
        }
    }

    /// Leaves the group: what it holds is revoked (flushed and committed), then it leaves.
    pub fn stop(&self) {
        let _ = self.heard.send(Heard::Stop);
    }

    /// Waits until the consumer left (bounded by its revocation's wait).
    pub async fn stopped(&self) {
        while !self.shared.ended.load(Ordering::Relaxed) {
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }
}

impl Shared {
    fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    /// Joins; then, in order, each rebalance the coordinator sends and each loss the
    /// heartbeat finds, until stopped.
    async fn run(
        self: &Arc<Self>,
        mut heard: mpsc::UnboundedReceiver<Heard>,
        tx: mpsc::UnboundedSender<Heard>,
    ) {
        let group_id = self.log.settings().group_id(self.group.as_str());
        let client = format!("{}-{}", self.log.settings().instance, self.group);
        let mut member = self.join(&group_id, &client, &tx);
        while let Some(h) = heard.recv().await {
            match h {
                Heard::Coordinator(m, rebalance) if m == member && !self.stopped() => {
                    self.log
                        .counters()
                        .rebalances
                        .fetch_add(1, Ordering::Relaxed);
                    match rebalance {
                        Rebalance::Assign {
                            partitions,
                            generation,
                        } => self.on_assign(&partitions, generation).await,
                        Rebalance::Revoke { partitions, lost } => {
                            self.on_revoke(Revocation::new(partitions.clone(), lost))
                                .await;
                            if !lost {
                                self.coordinator.revoked(member, &partitions);
                            }
                        }
                    }
                }
                Heard::Lost(m) if m == member && !self.stopped() => {
                    self.log
                        .counters()
                        .rebalances
                        .fetch_add(1, Ordering::Relaxed);
                    let held: Vec<Partition> = lock(&self.state).lanes.keys().copied().collect();
                    tracing::warn!(group = %self.group, ?held, "the coordinator no longer counts this member: assignment lost");
                    self.on_revoke(Revocation::new(held, true)).await;
                    member = self.join(&group_id, &client, &tx);
                }
                Heard::Stop => {
                    self.stopped.store(true, Ordering::Relaxed);
                    let held: Vec<Partition> = lock(&self.state).lanes.keys().copied().collect();
                    self.on_revoke(Revocation::new(held.clone(), false)).await;
                    self.coordinator.revoked(member, &held);
                    self.coordinator.leave(member);
                    lock(&self.state).member = None;
                    tracing::info!(group = %self.group, "Kafka consumer left the group");
                    return;
                }
                // A former member's message, or one after the stop.
                Heard::Coordinator(..) | Heard::Lost(_) => {}
            }
        }
    }

    /// Joins as a new member and starts its heartbeat.
    fn join(
        self: &Arc<Self>,
        group_id: &str,
        client: &str,
        tx: &mpsc::UnboundedSender<Heard>,
    ) -> MemberId {
        let (callbacks, mut from_coordinator) = mpsc::unbounded_channel();
        let member = self.coordinator.join(group_id, client, callbacks);
        {
            let mut st = lock(&self.state);
            st.member = Some(member);
            st.generation = None;
        }
        let forward = tx.clone();
        tokio::spawn(async move {
            while let Some(r) = from_coordinator.recv().await {
                if forward.send(Heard::Coordinator(member, r)).is_err() {
                    return;
                }
            }
        });
        let (s, lost) = (self.clone(), tx.clone());
        tokio::spawn(async move {
            let every = s.coordinator.heartbeat_interval();
            loop {
                tokio::time::sleep(every).await;
                if s.stopped() || lock(&s.state).member != Some(member) {
                    return;
                }
                if !s.coordinator.heartbeat(member) {
                    let _ = lost.send(Heard::Lost(member));
                    return;
                }
            }
        });
        tracing::info!(group = %self.group, member, "Kafka consumer joined the group");
        member
    }

    /// Commits `offsets` as `member`; a refusal is counted (the next commit carries it).
    fn commit(
        &self,
        member: MemberId,
        generation: Option<i32>,
        offsets: &BTreeMap<Partition, Offset>,
    ) {
        if offsets.is_empty() {
            return;
        }
        if let Err(e) = self.coordinator.commit(member, generation, offsets) {
            self.log
                .counters()
                .commit_failures
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(group = %self.group, error = %e, "offset commit failed; the next one carries it");
        }
    }

    /// Reads each new partition's progress (the progress topic, the committed offset),
    /// starts its lane as `assign::lane_start` says, and tells the engine.
    async fn on_assign(&self, partitions: &[Partition], gen: Option<i32>) {
        lock(&self.state).generation = gen;
        let log = &self.log;
        let group_id = log.settings().group_id(self.group.as_str());
        let committed = if partitions.is_empty() {
            BTreeMap::new()
        } else {
            self.coordinator.committed(&group_id, partitions)
        };
        let stored = if partitions.is_empty() {
            BTreeMap::new()
        } else {
            self.read_progress(partitions, gen, &committed).await
        };
        let mut assignments = Vec::with_capacity(partitions.len());
        let mut claims = Vec::new();
        for &p in partitions {
            let mut range = None;
            for attempt in 0..OFFSET_READS {
                if attempt > 0 {
                    tokio::time::sleep(RETRY_INTERVAL).await;
                }
                match log.watermarks(&self.topic, p).await {
                    Ok(r) => {
                        range = Some(r);
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(group = %self.group, partition = p, error = %e, "cannot read offsets at assignment")
                    }
                }
            }
            let found = assign::Found {
                chosen: stored.get(&p).cloned().unwrap_or_default(),
                committed: committed.get(&p).copied(),
                range,
                cached: log.cached_offsets(&self.topic, p),
            };
            let lane = assign::lane_start(p, found);
            if let Some((c, epoch)) = assign::claim(&lane) {
                let lane_checkpoint = LaneCheckpoint {
                    group: self.group.clone(),
                    topic: self.topic.clone(),
                    partition: p,
                    checkpoint: c.clone(),
                };
                claims.push((lane_checkpoint, epoch));
            }
            log.inner
                .progress
                .own(&self.group, p, gen, lane.stamp, lane.stale, lane.reached);
            lock(&self.state).lanes.insert(
                p,
                Arc::new(tokio::sync::Mutex::new(Lane {
                    part: lane.part,
                    reader: None,
                })),
            );
            assignments.push(lane.assignment);
        }
        self.claim(&claims, gen).await;
        tracing::info!(group = %self.group, instance = %log.settings().instance, ?partitions, generation = ?gen, "Kafka assigned partitions");
        let _ = self
            .events
            .send(GroupEvent::Assigned {
                group: self.group.clone(),
                partitions: assignments,
            })
            .await;
    }

    /// Writes the lanes' claims under generation `gen` (`consumer.rs`).
    async fn claim(&self, claims: &[(LaneCheckpoint, Option<i32>)], gen: Option<i32>) {
        if claims.is_empty() {
            return;
        }
        let mut last = None;
        for attempt in 0..OFFSET_READS {
            if attempt > 0 {
                tokio::time::sleep(RETRY_INTERVAL).await;
            }
            match super::progress::claim(&self.log, claims, gen).await {
                Ok(()) => return,
                Err(e) => last = Some(e),
            }
        }
        let Some(last) = last else { return };
        tracing::error!(group = %self.group, error = %last, "cannot claim the assigned partitions in the progress topic");
    }

    /// The progress each of `partitions` resumes from, read again while it fails, for at
    /// most [`PROGRESS_READ_WAIT`] (`consumer.rs`).
    async fn read_progress(
        &self,
        partitions: &[Partition],
        gen: Option<i32>,
        committed: &BTreeMap<Partition, Offset>,
    ) -> BTreeMap<Partition, Chosen> {
        let started = tokio::time::Instant::now();
        loop {
            let read = self
                .log
                .inner
                .progress
                .latest(&self.group, &self.topic, partitions, gen, committed, None)
                .await;
            match read {
                Ok(m) => return m,
                Err(e) if started.elapsed() < PROGRESS_READ_WAIT => {
                    self.log
                        .counters()
                        .progress_read_retries
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(group = %self.group, error = %e, "cannot read the progress topic at an assignment; reading it again");
                    tokio::time::sleep(RETRY_INTERVAL).await;
                }
                Err(e) => {
                    tracing::error!(group = %self.group, error = %e, "cannot read the progress topic; resuming from committed offsets");
                    return BTreeMap::new();
                }
            }
        }
    }

    /// Asks the engine what the revocation says, waits for its answer (bounded), then hands
    /// the partitions over as the revocation says: ownership released, commits made,
    /// lanes dropped.
    async fn on_revoke(&self, revocation: Revocation) {
        let partitions = revocation.partitions().to_vec();
        let lost = revocation.ask() == Ask::DropNow;
        lock(&self.state).revoking = Some(revocation);
        let (done, wait) = std_mpsc::sync_channel(1);
        let sent = self
            .events
            .send(GroupEvent::Revoking {
                group: self.group.clone(),
                partitions: partitions.clone(),
                lost,
                done,
            })
            .await;
        let started = tokio::time::Instant::now();
        if sent.is_ok() {
            loop {
                match wait.try_recv() {
                    Ok(()) | Err(std_mpsc::TryRecvError::Disconnected) => break,
                    Err(std_mpsc::TryRecvError::Empty) => {}
                }
                if started.elapsed() > REVOKE_WAIT {
                    tracing::error!(group = %self.group, ?partitions, "the engine did not flush in time; giving the partitions up");
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        let (revocation, member, generation) = {
            let mut st = lock(&self.state);
            (st.revoking.take(), st.member, st.generation)
        };
        let Some(revocation) = revocation else {
            return;
        };
        let handover = self.log.inner.progress.hand_over(&self.group, revocation);
        if let Some(member) = member {
            self.commit(member, generation, &handover.commit);
        }
        {
            let mut st = lock(&self.state);
            for p in &handover.drop {
                st.lanes.remove(p);
            }
        }
        tracing::info!(group = %self.group, instance = %self.log.settings().instance, ?partitions, "Kafka revoked partitions");
    }

    /// Whether `lane` is still the lane of `partition` (not revoked meanwhile).
    fn holds(&self, partition: Partition, lane: &Arc<tokio::sync::Mutex<Lane>>) -> bool {
        lock(&self.state)
            .lanes
            .get(&partition)
            .is_some_and(|l| Arc::ptr_eq(l, lane))
    }

    async fn fetch(
        &self,
        partition: Partition,
        from: Offset,
        max: usize,
        max_bytes: usize,
        wait_ms: u64,
    ) -> LogRead {
        let lane = lock(&self.state).lanes.get(&partition).cloned();
        let Some(lane) = lane.filter(|_| !self.stopped()) else {
            return LogRead::Failed(format!(
                "partition {partition} of {} is not assigned to this instance",
                self.topic
            ));
        };
        let mut guard = lane.lock().await;
        let l = &mut *guard;
        if let Some(v) = l.part.validate {
            // What the lane knows, against the log's end (no leader epochs here).
            let range = match v.range {
                Some(r) => r,
                None => match self.log.watermarks(&self.topic, partition).await {
                    Ok(r) => r,
                    Err(e) => return LogRead::Failed(e.to_string()),
                },
            };
            l.part.validate = None;
            let (earliest, end) = range;
            let no_read =
                |_| -> Result<crate::storage::kafka::rules::epochs::FirstRecord, ()> { Err(()) };
            if let Ok(Some(d)) = divergence(None, earliest, end, v.known_end, no_read) {
                l.part.base = Offset::MAX;
                l.part.known_end = l.part.known_end.min(end);
                l.reader = None;
                self.log
                    .counters()
                    .out_of_range
                    .fetch_add(1, Ordering::Relaxed);
                return LogRead::OutOfRange {
                    earliest: earliest.min(from),
                    end: d,
                };
            }
        }
        if l.reader.is_none() || from < l.part.base {
            match self.reader(partition, from).await {
                Ok(r) => l.reader = Some(r),
                Err(e) => return LogRead::Failed(e.to_string()),
            }
            l.part.reposition(from);
        }
        l.part.discard_below(from);
        l.part.fetch = Some(Want { max, max_bytes });
        let max_event_bytes = self.log.settings().max_event_bytes;
        let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms);
        loop {
            while l.part.buffer.len() < max {
                let Some(reader) = l.reader.as_ref() else {
                    break;
                };
                match reader.poll(Duration::ZERO).await {
                    Some(Ok(m)) => {
                        let offset = m.offset().max(0) as Offset;
                        if l.part.wants(offset) {
                            l.part.push(decode_message(&m, max_event_bytes), None);
                        }
                    }
                    Some(Err(e)) => {
                        // The reader's position is unknown after an error: start afresh.
                        l.reader = None;
                        if l.part.buffer.is_empty() {
                            l.part.fetch = None;
                            return LogRead::Failed(format!(
                                "cannot read {}/{partition}: {e}",
                                self.topic
                            ));
                        }
                        break;
                    }
                    None => break,
                }
            }
            if let Some(answered) = l.part.answer_if_ready() {
                self.log
                    .show_end(&self.topic, partition, answered.end, false);
                return LogRead::Decoded(answered.records);
            }
            let now = tokio::time::Instant::now();
            if now >= deadline || !self.holds(partition, &lane) || self.stopped() {
                break;
            }
            tokio::time::sleep(POLL_INTERVAL.min(deadline - now)).await;
        }
        l.part.fetch = None;
        // A fetch outside the log answers "out of range", so the core repositions instead
        // of waiting forever.
        if let Ok((earliest, end)) = self.log.watermarks(&self.topic, partition).await {
            if from < earliest || from > end {
                self.log
                    .counters()
                    .out_of_range
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(group = %self.group, partition, from, earliest, end, "offset outside the log; the core repositions");
                l.reader = None;
                l.part.base = Offset::MAX;
                return LogRead::OutOfRange { earliest, end };
            }
        }
        LogRead::Decoded(Vec::new())
    }

    /// A consumer of `partition` alone, assigned at `from`.
    async fn reader(
        &self,
        partition: Partition,
        from: Offset,
    ) -> Result<LoggedConsumer, StorageError> {
        let mut config = self.log.settings().client_config(ClientRole::Consumer);
        config
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "error");
        let consumer: LoggedConsumer = config
            .create_with_context(ClientLog::new(format!("reader of {}", self.topic)))
            .await
            .map_err(|e| {
                StorageError::failed(
                    &format!("cannot create a reader of {}/{partition}", self.topic),
                    e,
                )
            })?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(
            self.topic.as_str(),
            partition as i32,
            KOffset::Offset(from as i64),
        )
        .map_err(|e| {
            StorageError::failed(&format!("cannot assign {}/{partition}", self.topic), e)
        })?;
        consumer.assign(&tpl).map_err(|e| {
            StorageError::failed(&format!("cannot assign {}/{partition}", self.topic), e)
        })?;
        Ok(consumer)
    }
}
