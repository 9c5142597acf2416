//! One Kafka consumer per (instance, subscription group), on a thread of its own.
//!
//! The thread polls the consumer; librdkafka runs the rebalance callback inside that poll,
//! so the callback may block the thread while the engine flushes a revoked partition's
//! progress — exactly what "committed before the callback returns" needs, without blocking
//! an async worker.
//!
//! This file is the librdkafka side only: the callback forwards each rebalance to the
//! decisions of `rules/` (what an assignment resumes from, what a revocation flushes,
//! commits and drops) and carries out their answers; fetches are answered from the
//! partition buffer of `rules/part.rs` (its rule keeps offset gaps safe and pauses a full
//! partition, C8), with a fetch from below the buffer's `base` seeking first.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use madsim_rdkafka::client::{ClientContext, NativeClient};
use madsim_rdkafka::config::RDKafkaLogLevel;
use madsim_rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, RebalanceProtocol,
};
use madsim_rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use madsim_rdkafka::message::BorrowedMessage;
use madsim_rdkafka::types::RDKafkaRespErr;
use madsim_rdkafka::{Message, Offset as KOffset, TopicPartitionList};
use madsim_tokio as tokio;
use tokio::sync::{mpsc, oneshot};
use unimesh_core::{Checkpoint, GroupName, LaneCheckpoint, Offset, Partition, TopicName};

use super::checker::{Checked, Checker, Done, Job, Reads};
use super::client_log::{self, ClientLog, LoggedConsumer};
use super::log::{lock, KafkaLog};
use super::nudge::{self, StuckWatch, Verdict};
use super::probe::leader_epoch;
use super::progress::{Chosen, HOME_PARTITION, SYNC_KEY_PREFIX};
use super::records::decode_message;
use super::ClientRole;
use crate::storage::kafka::rules::part::{self, Span, Validate};
use crate::storage::kafka::rules::revoke::{Ask, Revocation};
use crate::storage::kafka::rules::{assign, Rebalance};
use crate::storage::ports::{GroupEvent, LogRead, StorageError};
use madsim_rdkafka::producer::FutureRecord;

/// How long the consumer thread sleeps in a poll when nothing happens.
const POLL_INTERVAL: Duration = Duration::from_millis(5);
/// How long a revocation waits for the engine to flush before giving the partition up.
const REVOKE_WAIT: Duration = Duration::from_secs(30);
/// How long an assignment reads the progress topic again while it fails.
const PROGRESS_READ_WAIT: Duration = Duration::from_secs(60);
/// Reads of a partition's offsets at an assignment before the lane's first fetch is left
/// to read them.
const OFFSET_READS: u32 = 3;
/// librdkafka's default `session.timeout.ms`.
const LIBRDKAFKA_SESSION: Duration = Duration::from_secs(45);

enum Control {
    Commit {
        partition: Partition,
        offset: Offset,
    },
    Fetch(FetchRequest),
    Stop,
}

struct FetchRequest {
    partition: Partition,
    from: Offset,
    max: usize,
    max_bytes: usize,
    deadline: Instant,
    reply: oneshot::Sender<LogRead>,
}

/// The handle the [`KafkaLog`] keeps of a group's consumer thread.
pub(super) struct GroupConsumer {
    control: std_mpsc::Sender<Control>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl GroupConsumer {
    /// Creates the consumer, subscribes it to `topic` and starts its thread.
    pub fn start(
        log: KafkaLog,
        group: GroupName,
        topic: TopicName,
        events: mpsc::Sender<GroupEvent>,
    ) -> Result<Self, StorageError> {
        let (control, rx) = std_mpsc::channel();
        let (jobs, jobs_rx) = std_mpsc::channel();
        let (done, done_rx) = std_mpsc::channel();
        Checker::new(log.clone(), group.clone(), topic.clone())
            .spawn(jobs_rx, done)
            .map_err(|e| StorageError::failed("cannot start the checker thread", e))?;
        let s = log.settings();
        let mut config = s.client_config(ClientRole::Consumer);
        config
            .set("group.id", s.group_id(group.as_str()))
            .set("client.id", format!("{}-{}", s.instance, group))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("isolation.level", "read_committed")
            // An offset the log no longer has is the core's to handle (`OutOfRange`),
            // never a silent jump.
            .set("auto.offset.reset", "error")
            .set("enable.partition.eof", "false");
        if !s
            .properties
            .sets(ClientRole::Consumer, "partition.assignment.strategy")
        {
            config.set("partition.assignment.strategy", "cooperative-sticky");
        }
        if !s
            .properties
            .sets(ClientRole::Consumer, "queued.max.messages.kbytes")
        {
            config.set("queued.max.messages.kbytes", "8192");
        }
        if let Some(id) = &s.group_instance_id {
            config.set("group.instance.id", id);
        }
        // The join state, for the stuck-rebalance nudge (`nudge.rs`); a user's own
        // interval is kept (0 turns the nudge off).
        if !s
            .properties
            .sets(ClientRole::Consumer, "statistics.interval.ms")
        {
            config.set(
                "statistics.interval.ms",
                nudge::STATS_INTERVAL_MS.to_string(),
            );
        }
        let session = s
            .properties
            .for_role(ClientRole::Consumer)
            .get("session.timeout.ms")
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(LIBRDKAFKA_SESSION, Duration::from_millis);
        let ctx = GroupContext {
            log: log.clone(),
            group: group.clone(),
            topic: topic.clone(),
            events,
            me: OnceLock::new(),
            parts: Mutex::new(BTreeMap::new()),
            control: Mutex::new(rx),
            held: Mutex::new(Vec::new()),
            checking: Mutex::new(Checking::default()),
            jobs: Mutex::new(Some(jobs)),
            done: Mutex::new(done_rx),
            stuck: Mutex::new(StuckWatch::new(nudge::stuck_after(session))),
            nudge_due: Mutex::new(None),
            nudger: Mutex::new(None),
        };
        // No broker round trip: librdkafka's `rd_kafka_new` only sets the client up (its
        // threads connect later), so the engine's task creating it does not wait on the broker.
        let consumer: BaseConsumer<GroupContext> = run_now(config.create_with_context(ctx))
            .ok_or_else(|| {
                StorageError::unavailable(format!(
                    "the Kafka consumer of group {group} was not created at once"
                ))
            })?
            .map_err(|e| {
                StorageError::failed(
                    &format!("cannot create the Kafka consumer of group {group}"),
                    e,
                )
            })?;
        let consumer = Arc::new(consumer);
        let _ = consumer.context().me.set(Arc::downgrade(&consumer));
        consumer.subscribe(&[topic.as_str()]).map_err(|e| {
            StorageError::failed(&format!("cannot subscribe group {group} to {topic}"), e)
        })?;
        // Every line the thread logs (rebalances included) carries its group and topic.
        let (g, t) = (group.clone(), topic.clone());
        let thread = std::thread::Builder::new()
            .name(format!("kafka-{group}"))
            .spawn(move || {
                let span = tracing::info_span!("kafka_consumer", group = %g, topic = %t);
                span.in_scope(|| run(consumer))
            })
            .map_err(|e| StorageError::failed("cannot start the consumer thread", e))?;
        tracing::info!(%group, %topic, "Kafka consumer joined the group");
        Ok(Self {
            control,
            thread: Mutex::new(Some(thread)),
        })
    }

    pub async fn fetch(
        &self,
        partition: Partition,
        from: Offset,
        max: usize,
        max_bytes: usize,
        wait_ms: u64,
    ) -> LogRead {
        let (reply, rx) = oneshot::channel();
        let req = FetchRequest {
            partition,
            from,
            max: max.max(1),
            max_bytes,
            deadline: Instant::now() + Duration::from_millis(wait_ms),
            reply,
        };
        if self.control.send(Control::Fetch(req)).is_err() {
            return LogRead::Failed("the group's Kafka consumer has stopped".into());
        }
        rx.await
            .unwrap_or_else(|_| LogRead::Failed("the group's Kafka consumer has stopped".into()))
    }

    pub fn commit(&self, partition: Partition, offset: Offset) {
        let _ = self.control.send(Control::Commit { partition, offset });
    }

    /// Asks the thread to close the consumer (which revokes what it holds).
    pub fn stop(&self) {
        let _ = self.control.send(Control::Stop);
    }

    /// Waits for the thread to end.
    pub fn join(&self) {
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }
}

/// Polls a future that completes without waiting (the std build of madsim-rdkafka wraps
/// blocking librdkafka calls such as seek and commit in `async fn`s that never yield).
fn run_now<F: Future>(f: F) -> Option<F::Output> {
    let mut f = std::pin::pin!(f);
    let mut cx = Context::from_waker(Waker::noop());
    match f.as_mut().poll(&mut cx) {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}

/// What the thread knows of one assigned partition: the buffer rule of `rules/part.rs`,
/// with this thread's fetch requests waiting in it.
type Part = part::Part<FetchRequest>;

impl part::Waiting for FetchRequest {
    fn max(&self) -> usize {
        self.max
    }

    fn max_bytes(&self) -> usize {
        self.max_bytes
    }
}

/// Fetches waiting on the checker thread, by partition (at most one each: a later fetch
/// takes the place of the one waiting, [`overtake`]).
#[derive(Default)]
struct Checking {
    /// The number of the last job handed out.
    next: u64,
    waiting: BTreeMap<Partition, OnCheck>,
}

/// A fetch waiting on the checker's reads ([`submit`]).
struct OnCheck {
    number: u64,
    req: FetchRequest,
    /// What earlier round trips of this fetch found.
    checked: Checked,
    /// The fetch waited its time; only the range decides its answer ([`on_expired`]).
    expired: bool,
}

/// The consumer's context: the rebalance callback, and the state it shares with the
/// thread (both run on the consumer thread; the locks are never contended).
pub(super) struct GroupContext {
    log: KafkaLog,
    group: GroupName,
    topic: TopicName,
    events: mpsc::Sender<GroupEvent>,
    me: OnceLock<Weak<BaseConsumer<GroupContext>>>,
    parts: Mutex<BTreeMap<Partition, Part>>,
    control: Mutex<std_mpsc::Receiver<Control>>,
    /// Fetches taken off the control channel during a revocation, handled after it.
    held: Mutex<Vec<FetchRequest>>,
    /// Fetches waiting on the checker thread's reads of the log (`checker.rs`).
    checking: Mutex<Checking>,
    /// The checker thread's jobs (`None` once the consumer thread ended).
    jobs: Mutex<Option<std_mpsc::Sender<Job>>>,
    /// The checker thread's answers.
    done: Mutex<std_mpsc::Receiver<Done>>,
    /// Whether the group's rebalance is stuck on the broker (`nudge.rs`), from the
    /// statistics reports.
    stuck: Mutex<StuckWatch>,
    /// What the last statistics report asked for, acted on by the thread after the poll.
    nudge_due: Mutex<Option<Verdict>>,
    /// The client that nudges the coordinator, while a rebalance is stuck.
    nudger: Mutex<Option<LoggedConsumer>>,
}

impl ClientContext for GroupContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        client_log::emit(&format!("group {}", self.group), level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        client_log::emit(
            &format!("group {}", self.group),
            RDKafkaLogLevel::Error,
            "ERROR",
            &format!("{error}: {reason}"),
        );
    }

    /// librdkafka's statistics (every `statistics.interval.ms`, on the consumer thread
    /// inside its poll): only the join state is read, for the stuck-rebalance nudge.
    fn stats_raw(&self, statistics: &[u8]) {
        let Some(state) = nudge::join_state(statistics) else {
            return;
        };
        let verdict = lock(&self.stuck).observe(&state, Instant::now());
        if verdict != Verdict::Wait {
            *lock(&self.nudge_due) = Some(verdict);
        }
    }
}

impl ConsumerContext for GroupContext {
    fn rebalance(&self, _native: &NativeClient, err: RDKafkaRespErr, tpl: &mut TopicPartitionList) {
        let Some(consumer) = self.me.get().and_then(Weak::upgrade) else {
            return;
        };
        let partitions = partitions_of(tpl, &self.topic);
        let _span = tracing::info_span!(
            "rebalance",
            group = %self.group,
            topic = %self.topic,
            event = ?err,
            partitions = ?partitions,
        )
        .entered();
        self.log
            .counters()
            .rebalances
            .fetch_add(1, Ordering::Relaxed);
        let rebalance = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => Rebalance::Assign {
                partitions,
                // The generation of this ownership: every progress record written for
                // these partitions carries it, and outranks those of their earlier owners.
                generation: group_generation(consumer.client().native_client()),
            },
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => Rebalance::Revoke {
                partitions,
                lost: consumer.assignment_lost(),
            },
            other => {
                tracing::error!(group = %self.group, error = ?other, "rebalance failed");
                let _ = consumer.unassign();
                return;
            }
        };
        match rebalance {
            Rebalance::Assign {
                partitions,
                generation,
            } => self.on_assign(&consumer, &partitions, generation),
            Rebalance::Revoke { partitions, lost } => {
                self.on_revoke(&consumer, tpl, Revocation::new(partitions, lost))
            }
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, _offsets: &TopicPartitionList) {
        if let Err(e) = result {
            self.log
                .counters()
                .commit_failures
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(group = %self.group, error = %e, "offset commit failed; the next one carries it");
        }
    }
}

impl GroupContext {
    /// Reads each new partition's progress (the progress topic, else the committed
    /// offset), assigns it at exactly that offset, and tells the engine.
    fn on_assign(
        &self,
        consumer: &BaseConsumer<GroupContext>,
        partitions: &[Partition],
        gen: Option<i32>,
    ) {
        let log = &self.log;
        let timeout = log.settings().request_timeout;
        let mut committed = BTreeMap::new();
        let mut ask = TopicPartitionList::new();
        for &p in partitions {
            ask.add_partition(self.topic.as_str(), p as i32);
        }
        let asked = if partitions.is_empty() {
            None
        } else {
            run_now(consumer.committed_offsets(ask, timeout))
        };
        match asked {
            Some(Ok(tpl)) if tpl.count() > 0 => {
                for e in tpl.elements_for_topic(self.topic.as_str()) {
                    if let KOffset::Offset(o) = e.offset() {
                        committed.insert(e.partition().max(0) as Partition, o.max(0) as Offset);
                    }
                }
            }
            Some(Err(e)) => {
                tracing::warn!(group = %self.group, error = %e, "cannot read committed offsets")
            }
            Some(Ok(_)) | None => {}
        }
        if gen.is_none() && !partitions.is_empty() {
            tracing::warn!(group = %self.group, "the client reports no group generation; progress writes are not fenced");
        }
        let stored = if partitions.is_empty() {
            BTreeMap::new()
        } else {
            self.read_progress(partitions, gen, &committed)
        };
        let mut assignments = Vec::with_capacity(partitions.len());
        let mut claims = Vec::new();
        let mut tpl = TopicPartitionList::new();
        let mut parts = lock(&self.parts);
        for &p in partitions {
            // Offsets that could not be read are unknown (`assign::lane_start`): the check
            // before the first fetch reads them then.
            let read = read_offsets(log, &self.topic, p);
            if let Err(e) = &read {
                tracing::warn!(group = %self.group, partition = p, error = %e, "cannot read offsets at assignment; the lane's first fetch reads them");
            }
            let found = assign::Found {
                chosen: stored.get(&p).cloned().unwrap_or_default(),
                committed: committed.get(&p).copied(),
                range: read.ok(),
                cached: log.cached_offsets(&self.topic, p),
            };
            tracing::debug!(group = %self.group, partition = p, generation = ?gen, progress = ?found.chosen.checkpoint.as_ref().map(|c| c.progress.watermark()), leader_epoch = ?found.chosen.leader_epoch, committed = ?found.committed, range = ?found.range, "progress read at assignment");
            let lane = assign::lane_start(p, found);
            if let Some((c, epoch)) = assign::claim(&lane) {
                claims.push((self.lane_checkpoint(p, c.clone()), epoch));
            }
            log.inner
                .progress
                .own(&self.group, p, gen, lane.stamp, lane.stale, lane.reached);
            // From the lane's start; whether the broker answers a read from there with
            // every record from it on is read by the first fetch, off this thread, before
            // anything is answered (`Part::start_unchecked`).
            let _ = tpl.add_partition_offset(
                self.topic.as_str(),
                p as i32,
                KOffset::Offset(lane.part.base as i64),
            );
            parts.insert(p, lane.part);
            assignments.push(lane.assignment);
        }
        drop(parts);
        // Reads done for an earlier assignment of these partitions are stale.
        recheck(self, Some(partitions), false);
        self.claim(&claims, gen);
        let assigned = match consumer.rebalance_protocol() {
            RebalanceProtocol::Cooperative => consumer.incremental_assign(&tpl),
            _ => consumer.assign(&tpl),
        };
        if let Err(e) = assigned {
            tracing::error!(group = %self.group, error = %e, "cannot take the assignment");
            return;
        }
        tracing::info!(group = %self.group, instance = %log.settings().instance, ?partitions, generation = ?gen, "Kafka assigned partitions");
        let _ = self.events.blocking_send(GroupEvent::Assigned {
            group: self.group.clone(),
            partitions: assignments,
        });
    }

    /// `checkpoint` as a checkpoint of `partition` of this group's lane.
    fn lane_checkpoint(&self, partition: Partition, checkpoint: Checkpoint) -> LaneCheckpoint {
        LaneCheckpoint {
            group: self.group.clone(),
            topic: self.topic.clone(),
            partition,
            checkpoint,
        }
    }

    /// Writes the lanes' claims under generation `gen` ([`assign::claim`]), tried
    /// [`OFFSET_READS`] times; when it cannot, the lanes go on unclaimed (logged: a late
    /// write of an earlier owner may then rank above what they resumed from).
    fn claim(&self, claims: &[(LaneCheckpoint, Option<i32>)], gen: Option<i32>) {
        if claims.is_empty() {
            return;
        }
        let log = &self.log;
        let mut last = None;
        for attempt in 0..OFFSET_READS {
            if attempt > 0 {
                std::thread::sleep(Duration::from_millis(100 << attempt));
            }
            match log
                .inner
                .side
                .runtime
                .block_on(super::progress::claim(log, claims, gen))
            {
                Ok(()) => return,
                Err(e) => last = Some(e),
            }
        }
        let Some(last) = last else { return };
        tracing::error!(group = %self.group, error = %last, "cannot claim the assigned partitions in the progress topic; a late write of their earlier owner may rank above what they resumed from");
    }

    /// The progress each of `partitions` resumes from ([`ProgressReader::latest`]), read
    /// again while it fails, for at most [`PROGRESS_READ_WAIT`]: resuming from the
    /// committed offsets alone would deliver again every ACK range above them, records
    /// whose ACKs were made durable (C2; issue 23). Only after that long is the committed
    /// offset all a lane resumes from (logged as an error, and the retries counted).
    fn read_progress(
        &self,
        partitions: &[Partition],
        gen: Option<i32>,
        committed: &BTreeMap<Partition, Offset>,
    ) -> BTreeMap<Partition, Chosen> {
        let log = &self.log;
        let started = Instant::now();
        let mut backoff = Duration::from_millis(50);
        loop {
            let read = log.inner.side.runtime.block_on(async {
                let marker = sync_marker(log).await?;
                log.inner
                    .progress
                    .latest(
                        &self.group,
                        &self.topic,
                        partitions,
                        gen,
                        committed,
                        Some(marker),
                    )
                    .await
            });
            match read {
                Ok(m) => return m,
                Err(e) if started.elapsed() < PROGRESS_READ_WAIT => {
                    log.counters()
                        .progress_read_retries
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(group = %self.group, error = %e, retry_in_ms = backoff.as_millis() as u64, "cannot read the progress topic at an assignment; reading it again");
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                Err(e) => {
                    tracing::error!(group = %self.group, error = %e, waited_s = started.elapsed().as_secs(), "cannot read the progress topic; resuming from committed offsets (ACK ranges above them are delivered again)");
                    return BTreeMap::new();
                }
            }
        }
    }

    /// Waits until the engine made the group's progress durable and dropped the lanes,
    /// commits what it asked to commit, then gives the partitions up.
    fn on_revoke(
        &self,
        consumer: &BaseConsumer<GroupContext>,
        tpl: &TopicPartitionList,
        mut revocation: Revocation,
    ) {
        let partitions = revocation.partitions().to_vec();
        let (done, wait) = std_mpsc::sync_channel(1);
        let sent = self.events.blocking_send(GroupEvent::Revoking {
            group: self.group.clone(),
            partitions: partitions.clone(),
            lost: revocation.ask() == Ask::DropNow,
            done,
        });
        let started = Instant::now();
        if sent.is_ok() {
            loop {
                match wait.recv_timeout(Duration::from_millis(5)) {
                    Ok(()) | Err(std_mpsc::RecvTimeoutError::Disconnected) => break,
                    Err(std_mpsc::RecvTimeoutError::Timeout) => {}
                }
                self.take_control(&mut revocation);
                if started.elapsed() > REVOKE_WAIT {
                    tracing::error!(group = %self.group, ?partitions, "the engine did not flush in time; giving the partitions up");
                    break;
                }
            }
        }
        // Commits the engine issued before it answered.
        self.take_control(&mut revocation);
        let handover = self.log.inner.progress.hand_over(&self.group, revocation);
        commit_now(
            consumer,
            &self.topic,
            &handover.commit,
            CommitMode::Sync,
            &self.group,
        );
        {
            recheck(self, Some(&handover.drop), true);
            let mut parts = lock(&self.parts);
            for p in &handover.drop {
                if let Some(mut part) = parts.remove(p) {
                    if let Some(req) = part.fetch.take() {
                        // The engine dropped the lane already; the answer is only stale.
                        let _ = req.reply.send(LogRead::Decoded(Vec::new()));
                    }
                }
            }
        }
        let given_up = match consumer.rebalance_protocol() {
            RebalanceProtocol::Cooperative => consumer.incremental_unassign(tpl),
            _ => consumer.unassign(),
        };
        if let Err(e) = given_up {
            tracing::warn!(group = %self.group, error = %e, "unassign failed");
        }
        tracing::info!(group = %self.group, instance = %self.log.settings().instance, ?partitions, "Kafka revoked partitions");
    }

    /// Takes commits off the control channel into the revocation (newest offset per
    /// partition wins); fetches are held for after the revocation, a stop is put back as a
    /// held marker.
    fn take_control(&self, revocation: &mut Revocation) {
        let rx = lock(&self.control);
        while let Ok(c) = rx.try_recv() {
            match c {
                Control::Commit { partition, offset } => {
                    revocation.commit_asked(partition, offset);
                }
                Control::Fetch(req) => lock(&self.held).push(req),
                Control::Stop => STOP_REQUESTED.with(|s| s.set(true)),
            }
        }
    }
}

thread_local! {
    /// A stop seen inside a rebalance callback, acted on by the loop afterwards.
    static STOP_REQUESTED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn commit_now(
    consumer: &BaseConsumer<GroupContext>,
    topic: &TopicName,
    commits: &BTreeMap<Partition, Offset>,
    mode: CommitMode,
    group: &GroupName,
) {
    if commits.is_empty() {
        return;
    }
    let mut tpl = TopicPartitionList::new();
    for (&p, &o) in commits {
        let _ = tpl.add_partition_offset(topic.as_str(), p as i32, KOffset::Offset(o as i64));
    }
    tracing::debug!(%group, ?commits, ?mode, "committing");
    match run_now(consumer.commit(&tpl, mode)) {
        Some(Ok(())) | None => {}
        Some(Err(e)) => {
            consumer
                .context()
                .log
                .counters()
                .commit_failures
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(%group, error = %e, "offset commit failed; the next one carries it");
        }
    }
}

/// The consumer thread: control messages, the stream, deadlines, until stopped.
fn run(consumer: Arc<BaseConsumer<GroupContext>>) {
    let ctx = consumer.context().clone();
    loop {
        let mut commits = BTreeMap::new();
        let mut fetches: Vec<FetchRequest> = std::mem::take(&mut *lock(&ctx.held));
        let mut stop = STOP_REQUESTED.with(|s| s.replace(false));
        {
            let rx = lock(&ctx.control);
            while let Ok(c) = rx.try_recv() {
                match c {
                    Control::Commit { partition, offset } => {
                        commits.insert(partition, offset);
                    }
                    Control::Fetch(req) => fetches.push(req),
                    Control::Stop => stop = true,
                }
            }
        }
        commit_now(
            &consumer,
            &ctx.topic,
            &commits,
            CommitMode::Async,
            &ctx.group,
        );
        for req in fetches {
            on_fetch(&consumer, &ctx, req, None);
        }
        on_checked(&consumer, &ctx);
        if stop {
            break;
        }
        match consumer.poll(POLL_INTERVAL) {
            None => {}
            Some(Ok(m)) => on_message(&consumer, &ctx, &m),
            Some(Err(e)) => on_error(&ctx, &e),
        }
        expire_fetches(&ctx);
        let due = lock(&ctx.nudge_due).take();
        if let Some(verdict) = due {
            nudge_or_settle(&ctx, verdict);
        }
    }
    lock(&ctx.nudger).take();
    // The checker thread ends after its job in hand (its answer goes nowhere).
    lock(&ctx.jobs).take();
    // Leaving the group revokes every partition (the callback flushes and commits).
    consumer.unsubscribe();
    let until = Instant::now() + REVOKE_WAIT;
    while !lock(&ctx.parts).is_empty() && Instant::now() < until {
        let _ = consumer.poll(POLL_INTERVAL);
    }
    tracing::info!(group = %ctx.group, "Kafka consumer left the group");
}

/// Acts on the stuck-rebalance watch (`nudge.rs`): a group request from a second client
/// while the rebalance is stuck, and that client closed once it is not.
fn nudge_or_settle(ctx: &GroupContext, verdict: Verdict) {
    let group = &ctx.group;
    match verdict {
        Verdict::Wait => {}
        Verdict::Settled { nudges } => {
            lock(&ctx.nudger).take();
            tracing::info!(%group, nudges, "the group's rebalance went on after the coordinator was nudged");
        }
        Verdict::Nudge { first, waited } => {
            if first {
                tracing::warn!(
                    %group,
                    waited_ms = waited.as_millis() as u64,
                    "the group's rebalance has waited on the broker too long; nudging its \
                     coordinator once a second until it goes on (a broker that keeps a dead \
                     member as leader: tansu 0.6.0, docs/DESIGN.md §8)"
                );
            }
            let mut slot = lock(&ctx.nudger);
            if slot.is_none() {
                let s = ctx.log.settings();
                let mut config = s.client_config(ClientRole::Consumer);
                config
                    .set("group.id", s.group_id(group.as_str()))
                    .set("client.id", format!("{}-{group}-nudge", s.instance))
                    .set("enable.auto.commit", "false")
                    .set("statistics.interval.ms", "0");
                match run_now(config.create_with_context(ClientLog::new(format!("nudge {group}"))))
                    .unwrap_or_else(|| {
                        Err(KafkaError::ClientCreation("not created at once".into()))
                    }) {
                    Ok(c) => *slot = Some(c),
                    Err(e) => {
                        tracing::warn!(%group, error = %e, "cannot create the client that nudges the group's coordinator");
                        return;
                    }
                }
            }
            if let Some(nudger) = slot.as_ref() {
                let mut tpl = TopicPartitionList::new();
                let _ = tpl.add_partition_offset(nudge::NUDGE_TOPIC, 0, KOffset::Offset(0));
                // Only the request matters (`nudge.rs`); its answer, a refusal, is
                // drained by the poll unread.
                let _ = run_now(nudger.commit(&tpl, CommitMode::Async));
                let _ = nudger.poll(Duration::ZERO);
                ctx.log
                    .counters()
                    .group_nudges
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// A fetch from the engine (`checked` `None`), or one back from the checker thread with
/// the reads it needed (`checker.rs`): a read of the log is never done on this thread,
/// which serves the group's rebalance callbacks; a fetch that needs one waits for it
/// while the thread polls on.
fn on_fetch(
    consumer: &BaseConsumer<GroupContext>,
    ctx: &GroupContext,
    req: FetchRequest,
    checked: Option<Checked>,
) {
    let (req, mut checked) = match checked {
        Some(c) => (req, c),
        None => match overtake(ctx, req) {
            Some(req) => (req, Checked::default()),
            None => return,
        },
    };
    let Some((due, check, known, base, unchecked)) =
        lock(&ctx.parts).get(&req.partition).map(|p| {
            (
                p.validate,
                p.check_range,
                p.known_end,
                p.base,
                p.start_unchecked,
            )
        })
    else {
        return not_assigned(ctx, req);
    };
    // Where the stream must start is read for a fetch that moves it (or may, after a
    // range check), unless read for this position already; the log's earliest is looked
    // up only then, off the fetch's usual path.
    let start = |c: &Checked, may_move: bool| {
        if !may_move || c.start.is_some_and(|(f, _)| f == req.from) {
            return None;
        }
        let earliest = cached_earliest(ctx, req.partition);
        (req.from > earliest).then_some(earliest)
    };
    // Every read this fetch may need, asked at once (one round trip in the usual case).
    if due.is_some() && checked.validated.is_none() {
        let reads = Reads {
            validate: due,
            range: check.then_some(req.from.max(known)),
            start: start(&checked, req.from < base || unchecked || check),
        };
        return submit(ctx, req, checked, reads, false);
    }
    let fresh = match checked.validated.take() {
        None => None,
        Some(Err(e)) => {
            // Never read on from what was not checked: the core fetches again later, and
            // the check then reads the log's offsets afresh (retention may have moved its
            // start past the offsets read at assignment).
            if let Some(v) = lock(&ctx.parts)
                .get_mut(&req.partition)
                .and_then(|p| p.validate.as_mut())
            {
                v.range = None;
            }
            let _ = req.reply.send(LogRead::Failed(e.to_string()));
            return;
        }
        Some(Ok((Some((earliest, end)), _))) => return diverged(ctx, req, earliest, end),
        Some(Ok((None, fresh))) => {
            if let Some(p) = lock(&ctx.parts).get_mut(&req.partition) {
                p.validate = None;
            }
            // Kept for a later round trip of this fetch (the check is done).
            checked.validated = Some(Ok((None, fresh)));
            fresh
        }
    };
    // The offsets the check just read, when it read them, serve the range check too.
    let range = match (check, fresh, checked.range) {
        (false, _, _) => None,
        (true, Some(r), _) => Some(r),
        (true, None, Some(r)) => r,
        (true, None, None) => {
            let reads = Reads {
                range: Some(req.from.max(known)),
                start: start(&checked, true),
                ..Reads::default()
            };
            return submit(ctx, req, checked, reads, false);
        }
    };
    let mut parts = lock(&ctx.parts);
    let Some(part) = overtaken_in(&mut parts, req.partition) else {
        drop(parts);
        return not_assigned(ctx, req);
    };
    if let Some((earliest, end)) = range {
        part.check_range = false;
        // The partition's fetcher may have stopped at the error: restart it where asked.
        part.stalled = true;
        part.base = Offset::MAX;
        if req.from < earliest || req.from > end {
            ctx.log
                .counters()
                .out_of_range
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(group = %ctx.group, partition = req.partition, from = req.from, earliest, end, "offset out of range; the core repositions");
            let _ = req.reply.send(LogRead::OutOfRange { earliest, end });
            return;
        }
    }
    let reposition = req.from < part.base || part.start_unchecked;
    if reposition {
        let at = match (checked.start, start(&checked, true)) {
            (Some((from, at)), _) if from == req.from => at,
            // At or below the log's earliest: nothing to skip.
            (_, None) => req.from,
            (_, Some(earliest)) => {
                drop(parts);
                let reads = Reads {
                    start: Some(earliest),
                    ..Reads::default()
                };
                return submit(ctx, req, checked, reads, false);
            }
        };
        if part.start_unchecked && !part.stalled && req.from == part.base && at == req.from {
            // The stream started at the lane's start answers from there: it stays.
            part.start_unchecked = false;
        } else {
            let moved = if part.stalled {
                restart_fetcher(consumer, ctx, &mut parts, req.partition, at)
            } else {
                run_now(consumer.seek(
                    ctx.topic.as_str(),
                    req.partition as i32,
                    KOffset::Offset(at as i64),
                    Duration::from_millis(0),
                ))
            };
            if !matches!(moved, Some(Ok(()))) {
                // Never answer past a failed seek: that would skip records as a "gap".
                let why = match moved {
                    Some(Err(e)) => e.to_string(),
                    _ => "seek did not complete".to_owned(),
                };
                let _ = req.reply.send(LogRead::Failed(format!(
                    "cannot seek {}/{} to {}: {why}",
                    ctx.topic, req.partition, req.from
                )));
                return;
            }
            // Still there: the lock is held, and nothing above removes a partition.
            if let Some(part) = parts.get_mut(&req.partition) {
                part.reposition(req.from);
            }
        }
    }
    let Some(part) = parts.get_mut(&req.partition) else {
        drop(parts);
        return not_assigned(ctx, req);
    };
    part.discard_below(req.from);
    let partition = req.partition;
    part.fetch = Some(req);
    answer(ctx, partition, part);
    if part.should_resume() {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(ctx.topic.as_str(), partition as i32);
        if consumer.resume(&tpl).is_ok() {
            part.paused = false;
        }
    }
}

/// The log diverged from what the lane knows (its tail was lost): the next fetch
/// repositions, restarting the fetcher (librdkafka may stop it at the broker's own
/// out-of-range answer), and the core forgets from `end`.
fn diverged(ctx: &GroupContext, req: FetchRequest, earliest: Offset, end: Offset) {
    let mut parts = lock(&ctx.parts);
    let Some(part) = overtaken_in(&mut parts, req.partition) else {
        drop(parts);
        return not_assigned(ctx, req);
    };
    part.validate = None;
    part.stalled = true;
    part.base = Offset::MAX;
    part.known_end = part.known_end.min(end);
    let counters = ctx.log.counters();
    counters.out_of_range.fetch_add(1, Ordering::Relaxed);
    counters.log_divergences.fetch_add(1, Ordering::Relaxed);
    // An earliest not above the asked offset, so it cannot read as retention.
    let earliest = earliest.min(req.from);
    tracing::warn!(group = %ctx.group, partition = req.partition, from = req.from, end, "the log diverged from what the lane knows (its tail was lost); the core forgets from there");
    let _ = req.reply.send(LogRead::OutOfRange { earliest, end });
}

/// `partition`'s part, the fetch waiting in it answered empty: the fetch now handled
/// overtakes it (the core ignores the answer to an old fetch id anyway).
fn overtaken_in(parts: &mut BTreeMap<Partition, Part>, partition: Partition) -> Option<&mut Part> {
    let part = parts.get_mut(&partition)?;
    if let Some(old) = part.fetch.take() {
        let _ = old.reply.send(LogRead::Decoded(Vec::new()));
    }
    Some(part)
}

fn not_assigned(ctx: &GroupContext, req: FetchRequest) {
    let _ = req.reply.send(LogRead::Failed(format!(
        "partition {} of {} is not assigned to this instance",
        req.partition, ctx.topic
    )));
}

/// The log's earliest offset as last read (0 when never read).
fn cached_earliest(ctx: &GroupContext, partition: Partition) -> Offset {
    ctx.log
        .cached_offsets(&ctx.topic, partition)
        .map_or(0, |(e, _)| e)
}

/// A new fetch for a partition whose earlier fetch waits on the checker takes its place
/// (the earlier one is answered empty, as any overtaken fetch; the reads go on for the
/// new one, which asks again what they did not cover). `Some(req)` when none waits.
fn overtake(ctx: &GroupContext, req: FetchRequest) -> Option<FetchRequest> {
    let mut checking = lock(&ctx.checking);
    let Some(w) = checking.waiting.get_mut(&req.partition) else {
        return Some(req);
    };
    let old = std::mem::replace(&mut w.req, req);
    w.expired = false;
    let _ = old.reply.send(LogRead::Decoded(Vec::new()));
    None
}

/// Hands `reads` to the checker thread; `req` waits for them with what earlier round
/// trips found (`checked`). `expired`: the fetch waited its time and only the range
/// decides its answer ([`on_expired`]).
fn submit(ctx: &GroupContext, req: FetchRequest, checked: Checked, reads: Reads, expired: bool) {
    let mut checking = lock(&ctx.checking);
    checking.next += 1;
    let (number, partition) = (checking.next, req.partition);
    let job = Job {
        partition,
        number,
        from: req.from,
        reads,
    };
    let sent = lock(&ctx.jobs).as_ref().map(|jobs| jobs.send(job));
    if !matches!(sent, Some(Ok(()))) {
        let _ = req.reply.send(LogRead::Failed(
            "the group's checker thread has stopped".into(),
        ));
        return;
    }
    let waiting = OnCheck {
        number,
        req,
        checked,
        expired,
    };
    if let Some(old) = checking.waiting.insert(partition, waiting) {
        let _ = old.req.reply.send(LogRead::Decoded(Vec::new()));
    }
}

/// The checker's answers: each goes on with the fetch that waits on it, unless that
/// fetch was handed back since (a rebalance, a consumer error: [`recheck`]).
fn on_checked(consumer: &BaseConsumer<GroupContext>, ctx: &GroupContext) {
    let finished: Vec<Done> = lock(&ctx.done).try_iter().collect();
    for d in finished {
        let waiting = {
            let mut checking = lock(&ctx.checking);
            match checking.waiting.get(&d.partition) {
                Some(w) if w.number == d.number => checking.waiting.remove(&d.partition),
                _ => None,
            }
        };
        let Some(w) = waiting else {
            continue;
        };
        let checked = w.checked.and(d.checked);
        if w.expired {
            on_expired(ctx, w.req, checked);
        } else {
            on_fetch(consumer, ctx, w.req, Some(checked));
        }
    }
}

/// Hands the fetches waiting on the checker for `partitions` (every partition: `None`)
/// back to be handled afresh after what changed them (what the reads answer is stale):
/// held for the loop, or, for `dropped` partitions, answered empty (the engine dropped
/// their lanes already).
fn recheck(ctx: &GroupContext, partitions: Option<&[Partition]>, dropped: bool) {
    let waiting: Vec<OnCheck> = {
        let mut checking = lock(&ctx.checking);
        let keys: Vec<Partition> = match partitions {
            None => checking.waiting.keys().copied().collect(),
            Some(ps) => ps.to_vec(),
        };
        keys.iter()
            .filter_map(|p| checking.waiting.remove(p))
            .collect()
    };
    for w in waiting {
        if dropped {
            let _ = w.req.reply.send(LogRead::Decoded(Vec::new()));
        } else {
            lock(&ctx.held).push(w.req);
        }
    }
}

/// Writes this instance's sync marker to the progress topic's home partition and answers
/// its offset: the reader reads at least past it, so every progress record acknowledged
/// before it is read, whatever end the broker claims ([`SYNC_KEY_PREFIX`]).
async fn sync_marker(log: &KafkaLog) -> Result<i64, StorageError> {
    let s = log.settings();
    let key = format!("{SYNC_KEY_PREFIX}{}", s.instance);
    let record = FutureRecord::to(&s.progress_topic)
        .partition(HOME_PARTITION)
        .key(&key)
        .payload("sync");
    match log.inner.producer.send_result(record) {
        Ok(f) => match f.await {
            Ok(Ok((_, offset))) => Ok(offset),
            Ok(Err((e, _))) => Err(StorageError::failed(
                "cannot write the progress topic's sync marker",
                e,
            )),
            Err(_) => Err(StorageError::unavailable(
                "the producer dropped the progress topic's sync marker",
            )),
        },
        Err((e, _)) => Err(StorageError::failed(
            "cannot write the progress topic's sync marker",
            e,
        )),
    }
}

/// A partition's (earliest, end) from the broker, read up to [`OFFSET_READS`] times.
fn read_offsets(log: &KafkaLog, topic: &TopicName, p: Partition) -> Result<Span, StorageError> {
    let mut attempt = 0;
    loop {
        match log.inner.side.runtime.block_on(log.watermarks(topic, p)) {
            Ok(pair) => return Ok(pair),
            Err(e) if attempt + 1 >= OFFSET_READS => return Err(e),
            Err(_) => {}
        }
        attempt += 1;
        std::thread::sleep(Duration::from_millis(100 << attempt));
    }
}

/// Starts fetching `partition` at `from` again after the consumer may have stopped it (a
/// seek cannot: librdkafka refuses to seek a stopped partition, silently when not waited
/// for). Cooperative: the partition alone is given up and taken again at `from`. Eager:
/// the whole assignment is taken again, every other partition at its `base` with its
/// buffer dropped (everything at or above `base` comes again from the stream).
fn restart_fetcher(
    consumer: &BaseConsumer<GroupContext>,
    ctx: &GroupContext,
    parts: &mut BTreeMap<Partition, Part>,
    partition: Partition,
    from: Offset,
) -> Option<KafkaResult<()>> {
    let topic = ctx.topic.as_str();
    let mut tpl = TopicPartitionList::new();
    // The partitions whose fetchers start again.
    let mut resumed = TopicPartitionList::new();
    let restarted = match consumer.rebalance_protocol() {
        RebalanceProtocol::Cooperative => {
            tpl.add_partition(topic, partition as i32);
            resumed.add_partition(topic, partition as i32);
            if let Err(e) = consumer.incremental_unassign(&tpl) {
                return Some(Err(e));
            }
            let mut again = TopicPartitionList::new();
            if let Err(e) =
                again.add_partition_offset(topic, partition as i32, KOffset::Offset(from as i64))
            {
                return Some(Err(e));
            }
            consumer.incremental_assign(&again)
        }
        _ => {
            for (&p, part) in parts.iter_mut() {
                let at = if p == partition {
                    from
                } else {
                    part.clear();
                    part.base
                };
                resumed.add_partition(topic, p as i32);
                if let Err(e) =
                    tpl.add_partition_offset(topic, p as i32, KOffset::Offset(at as i64))
                {
                    return Some(Err(e));
                }
            }
            consumer.assign(&tpl)
        }
    };
    if restarted.is_ok() {
        // A partition paused before it stopped fetches again (resuming a running one is a
        // no-op); the buffers are empty, so none is over its pause mark.
        let _ = consumer.resume(&resumed);
        let eager = !matches!(
            consumer.rebalance_protocol(),
            RebalanceProtocol::Cooperative
        );
        for (&p, part) in parts.iter_mut() {
            if eager || p == partition {
                part.paused = false;
            }
        }
        tracing::info!(group = %ctx.group, partition, from, "partition fetcher restarted");
    }
    Some(restarted)
}

/// Answers the partition's waiting fetch if it can, and stamps the lane's later progress
/// records with the leader epoch the records handed over raised it to.
fn answer(ctx: &GroupContext, partition: Partition, part: &mut Part) {
    let Some(answered) = part.answer_if_ready() else {
        return;
    };
    let _ = answered
        .fetch
        .reply
        .send(LogRead::Decoded(answered.records));
    // The log holds records up to here, whatever end the broker claims.
    ctx.log.show_end(&ctx.topic, partition, answered.end, false);
    if let Some(e) = answered.raised {
        ctx.log
            .inner
            .progress
            .observe_epoch(&ctx.group, partition, e);
    }
}

fn on_message(consumer: &BaseConsumer<GroupContext>, ctx: &GroupContext, m: &BorrowedMessage<'_>) {
    let partition = m.partition().max(0) as Partition;
    let offset = m.offset().max(0) as Offset;
    let mut parts = lock(&ctx.parts);
    let Some(part) = parts.get_mut(&partition) else {
        return;
    };
    if !part.wants(offset) {
        // Fetched before a seek or already answered.
        return;
    }
    let record = decode_message(m, ctx.log.settings().max_event_bytes);
    part.push(record, leader_epoch(m));
    answer(ctx, partition, part);
    if part.should_pause() {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(ctx.topic.as_str(), partition as i32);
        if consumer.pause(&tpl).is_ok() {
            part.paused = true;
        }
    }
}

/// A consume error. An offset the log does not have (librdkafka does not say for which
/// partition) marks every partition to check its range at its next fetch — outside the
/// log it answers `OutOfRange`, so the core repositions (and reports it) — and to restart
/// its fetcher, which librdkafka stopped; waiting fetches are handled again right away.
/// librdkafka reports a truncation it detected (its own leader-epoch validation of the
/// fetch position) as the same error, so every partition also checks what it knows
/// against the log again before it reads on.
fn on_error(ctx: &GroupContext, e: &KafkaError) {
    let out_of_range = matches!(
        e.rdkafka_error_code(),
        Some(RDKafkaErrorCode::AutoOffsetReset | RDKafkaErrorCode::OffsetOutOfRange)
    );
    if !out_of_range {
        tracing::warn!(group = %ctx.group, error = %e, "Kafka consumer error");
        return;
    }
    // Every partition is checked at its next fetch; a waiting fetch is handled again now.
    let waiting: Vec<FetchRequest> = {
        let mut parts = lock(&ctx.parts);
        parts
            .values_mut()
            .filter_map(|part| {
                part.check_range = true;
                part.validate = Some(Validate {
                    stamp: part.epoch,
                    known_end: part.known_end,
                    range: None,
                });
                part.fetch.take()
            })
            .collect()
    };
    lock(&ctx.held).extend(waiting);
    // What the checker reads for a waiting fetch predates the error: read again.
    recheck(ctx, None, false);
}

/// Fetches that waited their time at the end of a partition answer empty — unless the
/// broker's offsets say the fetch is outside the log (some brokers answer such a fetch
/// empty instead of "out of range"): then `OutOfRange`, so the core repositions instead of
/// waiting forever. The cached offsets only preselect; a fresh read decides.
fn expire_fetches(ctx: &GroupContext) {
    let now = Instant::now();
    let expired: Vec<FetchRequest> = {
        let mut parts = lock(&ctx.parts);
        parts
            .values_mut()
            .filter(|part| part.fetch.as_ref().is_some_and(|f| f.deadline <= now))
            .filter_map(|part| part.fetch.take())
            .collect()
    };
    for req in expired {
        let suspect = ctx
            .log
            .claimed_offsets(&ctx.topic, req.partition)
            .is_some_and(|(earliest, end)| req.from < earliest || req.from > end);
        if suspect {
            // A fetch past the claimed end asks from where records were handed over: the
            // claim is checked against the log (off this thread) before it repositions
            // anything.
            let reads = Reads {
                range: Some(req.from),
                ..Reads::default()
            };
            submit(ctx, req, Checked::default(), reads, true);
        } else {
            let _ = req.reply.send(LogRead::Decoded(Vec::new()));
        }
    }
}

/// An expired fetch whose position the broker's offsets placed outside the log, back
/// from the checker: `OutOfRange` when the log's range, its end read, says so, else empty.
fn on_expired(ctx: &GroupContext, req: FetchRequest, checked: Checked) {
    if let Some(Some((earliest, end))) = checked.range {
        if req.from < earliest || req.from > end {
            if let Some(part) = lock(&ctx.parts).get_mut(&req.partition) {
                part.base = Offset::MAX;
            }
            ctx.log
                .counters()
                .out_of_range
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(group = %ctx.group, partition = req.partition, from = req.from, earliest, end, "offset outside the log; the core repositions");
            let _ = req.reply.send(LogRead::OutOfRange { earliest, end });
            return;
        }
    }
    let _ = req.reply.send(LogRead::Decoded(Vec::new()));
}

/// The group generation the consumer is in, as librdkafka's group metadata reports it
/// (madsim-rdkafka exposes the metadata only as an opaque handle for transactions, so its
/// one getter is called directly). `None` when there is no group or no generation yet.
/// (This module is not built under madsim, whose broker has no groups: there the
/// simulation's coordinator tells `simulated.rs` the generation with each assignment.)
fn group_generation(native: &NativeClient) -> Option<i32> {
    use madsim_rdkafka::bindings as rd;
    // SAFETY: `native.ptr()` is the live handle of the consumer that `native` borrows.
    // `rd_kafka_consumer_group_metadata` returns a new object owned by the caller (or
    // null), which is read once and destroyed once, here.
    let gen = unsafe {
        let md = rd::rd_kafka_consumer_group_metadata(native.ptr());
        if md.is_null() {
            return None;
        }
        let gen = rd::rd_kafka_consumer_group_metadata_generation_id(md);
        rd::rd_kafka_consumer_group_metadata_destroy(md);
        gen
    };
    (gen >= 0).then_some(gen)
}

/// The partitions of `topic` in a list. (madsim-rdkafka's `elements_for_topic` builds a
/// slice from the list's element pointer, which is null in an empty list: not called then.)
fn partitions_of(tpl: &TopicPartitionList, topic: &TopicName) -> Vec<Partition> {
    if tpl.count() == 0 {
        return Vec::new();
    }
    tpl.elements_for_topic(topic.as_str())
        .iter()
        .map(|e| e.partition().max(0) as Partition)
        .collect()
}

#[cfg(test)]
mod tests {
    use unimesh_core::{Checkpoint, Progress};

    use super::*;
    use crate::storage::kafka::rules::epochs::{divergence, known_end};

    fn checkpoint(
        watermark: Offset,
        ranges: &[(Offset, Offset)],
        attempts: &[(Offset, u32)],
    ) -> Checkpoint {
        Checkpoint {
            progress: Progress::from_parts(watermark, ranges.iter().copied()).expect("valid"),
            attempts: attempts.to_vec(),
        }
    }

    /// What the check of a lane without a leader epoch finds (`validate`).
    fn diverged_at(c: Option<&Checkpoint>, end: Offset) -> Option<Offset> {
        let c = c?;
        divergence(None, 0, end, known_end(c), |_| Err("read")).expect("no read without a stamp")
    }

    /// Goal: a lane whose checkpoint predates a lost tail is told so at its first fetch,
    /// and only then. Method: checkpoints knowing done offsets, or attempt counts, at or
    /// above the broker's end diverge there; one knowing nothing at or above it does not.
    #[test]
    fn a_checkpoint_knowing_offsets_past_the_end_diverges_there() {
        assert_eq!(diverged_at(None, 5), None);
        assert_eq!(diverged_at(Some(&checkpoint(5, &[], &[])), 5), None);
        assert_eq!(
            diverged_at(Some(&checkpoint(3, &[(4, 5)], &[(3, 2)])), 5),
            None
        );
        // A range above the end: the tail holding it was lost.
        assert_eq!(
            diverged_at(Some(&checkpoint(3, &[(6, 9)], &[])), 7),
            Some(7)
        );
        assert_eq!(
            diverged_at(Some(&checkpoint(3, &[(4, 6)], &[])), 5),
            Some(5)
        );
        // The watermark itself past the end.
        assert_eq!(diverged_at(Some(&checkpoint(9, &[], &[])), 7), Some(7));
        // Only an attempt count at the end.
        assert_eq!(
            diverged_at(Some(&checkpoint(3, &[], &[(5, 2)])), 5),
            Some(5)
        );
    }
}
