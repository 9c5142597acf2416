//! The engine task: the only owner of the core `Mesh`. It turns commands (from the HTTP
//! front) and I/O completions (fetches, persists) into inputs, and carries out the effects.
//! No lock guards the mesh: everything reaches it through this task's channels, which are
//! bounded, so a flood of requests becomes back-pressure instead of memory.
//!
//! The rooms: this file holds the task, its run loop and the carrying-out of effects;
//! `polls` the long-poll waiters, `commands` one function per command of the handle,
//! `views` what the task shows of the mesh, `invariants` the debug builds' sampled check of
//! the core's invariants.

mod commands;
mod invariants;
mod polls;
mod sessions;
mod views;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::Ordering as AtomicOrdering;
use std::sync::Arc;
use std::time::Duration;

use madsim_tokio as tokio;
use tokio::sync::mpsc;
use tokio::time::Instant;
use unimesh_core::{
    Assignment, ClientId, Delivery, DeliveryId, Effect, FetchId, FetchResult, GroupName, Input,
    Mesh, Millis, Offset, Partition, PersistBatch, Response, SkipReason, SubscriptionSpec, Ticket,
    TopicName,
};

use super::api::{topic_error, EngineError, Shared};
use super::command::{Command, Event, Reply};
use super::decode_record;
use super::persist::Fences;
use super::ports::{GroupEvent, LogPort, LogRead, StorageError, TopicFacts};
use super::stream::Notice;
use super::tap::EngineTap;
use invariants::InvariantSampler;
use polls::{PollKey, Polls};
use sessions::Streams;

/// Flush rounds a revocation waits for at most before its partitions leave with what is
/// still not durable (redelivered by the next owner, as in flight): each round carries the
/// settlements of deliveries that were in flight when it began.
const MAX_REVOKE_FLUSH_ROUNDS: u32 = 16;

pub(crate) struct EngineTask {
    pub mesh: Mesh,
    pub start: Instant,
    pub log: Arc<dyn LogPort>,
    pub shared: Arc<Shared>,
    pub commands: mpsc::Receiver<Command>,
    pub events_tx: mpsc::Sender<Event>,
    pub events_rx: mpsc::Receiver<Event>,
    pub notices_tx: mpsc::UnboundedSender<Notice>,
    pub notices_rx: mpsc::UnboundedReceiver<Notice>,
    pub persist_tx: mpsc::Sender<(Ticket, Arc<PersistBatch>)>,
    /// Assignments and revocations from a broker that assigns partitions itself.
    pub group_events: Option<mpsc::Receiver<GroupEvent>>,
    pub fetch_wait_ms: u64,
    pub fetch_max_bytes: usize,
    polls: Polls,
    streams: Streams,
    /// Polls that received deliveries, to answer once the current effects are drained.
    to_finish: Vec<PollKey>,
    /// Deliveries the core handed to a client with no session (a race with its end), to
    /// give back once the current effects are drained — never from inside the drain, where
    /// the core's answer (another delivery to the same client) would recurse.
    orphans: Vec<(PollKey, DeliveryId)>,
    /// Subscriptions waiting for their topic to be prepared at the log (off the task), in
    /// the order they came; the first is out at the log when `subscribing`. One at a time,
    /// so they apply in the order they were asked.
    subscribes: VecDeque<(Box<SubscriptionSpec>, Reply<bool>)>,
    subscribing: bool,
    /// Replies waiting for "the next persist" to be durable (subscription changes, seeks).
    flush_waiters: Vec<Reply<()>>,
    ticket_waiters: BTreeMap<Ticket, Vec<Reply<()>>>,
    /// DLQ records currently in a group's replay lane, so a second replay does not repeat them.
    replaying: BTreeMap<GroupName, BTreeSet<(Partition, Offset)>>,
    /// Groups whose DLQ a persist out will change (dead letters, resolutions), by ticket.
    dlq_pending: BTreeMap<Ticket, BTreeSet<GroupName>>,
    /// Per group, how many durable persists changed its DLQ (a browse then may differ).
    dlq_changes: BTreeMap<GroupName, u64>,
    shutdown: Option<Reply<()>>,
    last_closed_scan: Instant,
    /// Debug builds: when the core's invariants are checked next.
    invariants: InvariantSampler,
    /// Told every input and effect, when set (the madsim harness).
    pub tap: Option<Arc<dyn EngineTap>>,
    /// What the persist writer must not write (a lost revocation's lanes), shared with it.
    pub(crate) fences: Fences,
    /// The ticket of the newest persist issued.
    last_ticket: Option<Ticket>,
}

impl EngineTask {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        mesh: Mesh,
        log: Arc<dyn LogPort>,
        shared: Arc<Shared>,
        commands: mpsc::Receiver<Command>,
        persist_tx: mpsc::Sender<(Ticket, Arc<PersistBatch>)>,
        events: (mpsc::Sender<Event>, mpsc::Receiver<Event>),
        notices: (
            mpsc::UnboundedSender<Notice>,
            mpsc::UnboundedReceiver<Notice>,
        ),
        fetch_wait_ms: u64,
        fetch_max_bytes: usize,
    ) -> Self {
        Self {
            mesh,
            start: Instant::now(),
            log,
            shared,
            commands,
            events_tx: events.0,
            events_rx: events.1,
            notices_tx: notices.0,
            notices_rx: notices.1,
            persist_tx,
            group_events: None,
            fetch_wait_ms,
            fetch_max_bytes,
            polls: Polls::default(),
            streams: Streams::default(),
            to_finish: Vec::new(),
            orphans: Vec::new(),
            subscribes: VecDeque::new(),
            subscribing: false,
            flush_waiters: Vec::new(),
            ticket_waiters: BTreeMap::new(),
            replaying: BTreeMap::new(),
            dlq_pending: BTreeMap::new(),
            dlq_changes: BTreeMap::new(),
            shutdown: None,
            last_closed_scan: Instant::now(),
            invariants: InvariantSampler::default(),
            tap: None,
            fences: Fences::default(),
            last_ticket: None,
        }
    }

    fn now_ms(&self) -> Millis {
        Instant::now().duration_since(self.start).as_millis() as Millis
    }

    /// Feeds one input and carries out its effects. Due timers fire first, in a `Tick` of
    /// their own (the core would fire them at the start of `handle` anyway): so every
    /// input's effects are its own, which is what a tap needs to attribute them.
    fn handle(&mut self, input: Input) -> Response {
        let now = self.now_ms();
        let due = self.mesh.poll_timeout().is_some_and(|t| t <= now);
        if due && !matches!(input, Input::Tick) {
            let _ = self.feed(now, Input::Tick);
        }
        let response = self.feed(now, input);
        self.give_back_orphans(now);
        response
    }

    /// Gives back what was handed to clients without a session: first the client's credit
    /// is withdrawn (so the core cannot hand the same record straight back to it), then the
    /// deliveries are NACKed without delay. Each round withdraws the credit of every client
    /// it names, and the core hands nothing to a client without credit, so this ends.
    fn give_back_orphans(&mut self, now: Millis) {
        while !self.orphans.is_empty() {
            let mut by_client: BTreeMap<PollKey, Vec<DeliveryId>> = BTreeMap::new();
            for (key, id) in std::mem::take(&mut self.orphans) {
                by_client.entry(key).or_default().push(id);
            }
            for ((group, client), ids) in by_client {
                let _ = self.feed(
                    now,
                    Input::ClientPoll {
                        group: group.clone(),
                        client,
                        max: 0,
                    },
                );
                let _ = self.feed(
                    now,
                    Input::Nack {
                        group,
                        ids,
                        delay_ms: Some(0),
                    },
                );
            }
        }
    }

    fn feed(&mut self, now: Millis, input: Input) -> Response {
        // Anything but a tick with nothing due may change what the views show: tell the
        // console's feed (a stored permit when nobody waits, so nothing is lost or queued).
        if !matches!(input, Input::Tick) || self.mesh.poll_timeout().is_some_and(|t| t <= now) {
            self.shared.changed.notify_one();
        }
        let response = match self.tap.clone() {
            None => self.mesh.handle(now, input),
            Some(tap) => {
                let seen = input.clone();
                let response = self.mesh.handle(now, input);
                tap.input(self.mesh.now(), &seen, &response);
                response
            }
        };
        self.invariants.after_input(&self.mesh);
        self.drain();
        response
    }

    /// Gives `group` its partitions: every partition of `topic` when this instance owns the
    /// log whole (their offsets are in `facts`), else whatever the broker's group
    /// coordinator assigns (later, as [`GroupEvent`]s).
    fn place_group(
        &mut self,
        group: &GroupName,
        topic: &TopicName,
        facts: &TopicFacts,
    ) -> Result<(), EngineError> {
        if let Some(groups) = self.log.group() {
            return groups.join(group, topic).map_err(EngineError::from);
        }
        self.assign_all(group, facts)
    }

    /// Whether [`Self::place_group`] needs each partition's offsets.
    fn placing_needs_offsets(&self) -> bool {
        self.log.group().is_none()
    }

    /// Assigns every partition of the topic whose `facts` are given to `group` (the
    /// embedded log is owned whole by this instance).
    fn assign_all(&mut self, group: &GroupName, facts: &TopicFacts) -> Result<(), EngineError> {
        if facts.offsets.len() != facts.partitions as usize {
            return Err(EngineError::Unavailable(format!(
                "the log answered {} partition offsets for {} partitions",
                facts.offsets.len(),
                facts.partitions
            )));
        }
        let assignments = (0..facts.partitions)
            .zip(&facts.offsets)
            .map(|(partition, &(earliest, end))| Assignment {
                partition,
                earliest,
                end,
                checkpoint: None,
            })
            .collect();
        match self.handle(Input::PartitionsAssigned {
            group: group.clone(),
            partitions: assignments,
        }) {
            Response::Refused(r) => Err(EngineError::Refused(r)),
            _ => Ok(()),
        }
    }

    /// Assigns the partitions of every recovered group; called once at start, before the
    /// task serves.
    pub async fn assign_recovered(&mut self) -> Result<(), EngineError> {
        let groups: Vec<(GroupName, TopicName)> = self
            .mesh
            .group_names()
            .filter_map(|g| {
                self.mesh
                    .subscription(g)
                    .map(|s| (g.clone(), s.topic.clone()))
            })
            .collect();
        let with_offsets = self.placing_needs_offsets();
        for (group, topic) in groups {
            let facts = self
                .log
                .prepare_topic(topic.clone(), with_offsets)
                .await
                .map_err(topic_error)?;
            self.place_group(&group, &topic, &facts)?;
        }
        self.drain();
        Ok(())
    }

    pub async fn run(mut self) {
        self.drain();
        loop {
            let deadline = self.next_deadline();
            tokio::select! {
                biased;
                Some(event) = self.events_rx.recv() => self.on_event(event),
                Some(notice) = self.notices_rx.recv() => self.on_notice(notice),
                Some(event) = recv_opt(&mut self.group_events) => self.on_group_event(event),
                command = self.commands.recv() => match command {
                    Some(c) => self.on_command(c),
                    None => break,
                },
                // Timers are handled by the `on_tick` below, after the batch.
                _ = sleep_until_opt(deadline) => {}
            }
            // Take what else is already waiting before going back to sleep: one wake-up,
            // many inputs.
            for _ in 0..256 {
                if let Ok(event) = self.events_rx.try_recv() {
                    self.on_event(event);
                } else if let Ok(notice) = self.notices_rx.try_recv() {
                    self.on_notice(notice);
                } else if let Ok(command) = self.commands.try_recv() {
                    self.on_command(command);
                } else {
                    break;
                }
            }
            self.on_tick();
            // Readiness is the core's to decide (the new epoch is durable); say when reached.
            let ready = self.mesh.is_ready();
            let was_ready = self.shared.ready.swap(ready, AtomicOrdering::Relaxed);
            if ready && !was_ready {
                tracing::info!("ready");
            }
            if self.shutdown_complete() {
                break;
            }
        }
        self.shared.healthy.store(false, AtomicOrdering::Relaxed);
        self.shared.ready.store(false, AtomicOrdering::Relaxed);
        // The console's feed sends its last snapshot (the engine stopped) and ends.
        self.shared.changed.notify_one();
        for w in self.polls.take_all() {
            let _ = w.reply.send(Ok(w.got));
        }
        for key in self.streams.keys(None) {
            self.end_stream(&key);
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        let mesh = self
            .mesh
            .poll_timeout()
            .map(|ms| self.start + Duration::from_millis(ms));
        let poll = self.polls.next_deadline();
        match (mesh, poll) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn on_tick(&mut self) {
        let _ = self.handle(Input::Tick);
        self.expire_polls();
        self.finish_pending();
    }

    fn shutdown_complete(&mut self) -> bool {
        if self.shutdown.is_none() {
            return false;
        }
        if self.mesh.outstanding_persists() > 0 || !self.flush_waiters.is_empty() {
            return false;
        }
        if let Some(reply) = self.shutdown.take() {
            let _ = reply.send(Ok(()));
        }
        true
    }
    // ----- effects -----

    fn drain(&mut self) {
        while let Some(effect) = self.mesh.poll_effect() {
            if let Some(tap) = &self.tap {
                if !matches!(effect, Effect::Persist { .. }) {
                    tap.effect(self.mesh.now(), &effect);
                }
            }
            match effect {
                Effect::Deliver {
                    group,
                    client,
                    delivery,
                } => self.deliver(group, client, delivery),
                Effect::Fetch {
                    group,
                    topic,
                    partition,
                    fetch_id,
                    from,
                    max,
                } => self.fetch(group, topic, partition, fetch_id, from, max),
                Effect::Persist { ticket, batch } => {
                    let waiters = std::mem::take(&mut self.flush_waiters);
                    if !waiters.is_empty() {
                        self.ticket_waiters
                            .entry(ticket)
                            .or_default()
                            .extend(waiters);
                    }
                    self.note_replays(&batch);
                    self.note_dlq_changes(ticket, &batch);
                    let batch: Arc<PersistBatch> = Arc::from(batch);
                    if let Some(tap) = &self.tap {
                        tap.persist(self.mesh.now(), ticket, &batch);
                    }
                    self.last_ticket = Some(ticket);
                    if self.persist_tx.try_send((ticket, batch)).is_err() {
                        // The core bounds outstanding persists far below the channel size,
                        // so this only happens when the writer is gone.
                        tracing::error!(ticket, "the persist writer is gone; persist failed");
                        let _ = self.events_tx.try_send(Event::Persisted {
                            ticket,
                            result: Err(StorageError::unavailable("the persist writer is gone")),
                        });
                    }
                }
                Effect::Skipped {
                    group,
                    topic,
                    partition,
                    from,
                    to,
                    not_done,
                    reason,
                } => match reason {
                    SkipReason::Retention => tracing::warn!(
                        %group, %topic, partition, from, to, not_done,
                        "records deleted by retention before the group fetched them"
                    ),
                    SkipReason::BrokerTruncated => tracing::error!(
                        %group, %topic, partition, from, to, not_done,
                        "the log lost its tail; the group restarts at its new end"
                    ),
                },
                Effect::Commit {
                    group,
                    topic,
                    partition,
                    offset,
                } => {
                    if let Some(groups) = self.log.group() {
                        groups.commit(&group, &topic, partition, offset);
                    }
                }
                // No log of this shell is a POP broker.
                Effect::BrokerAck { .. } => {}
                other => tracing::warn!(?other, "effect not handled by this shell"),
            }
        }
    }

    /// Hands a delivery to the one session of its client: a waiting long-poll or a stream.
    fn deliver(&mut self, group: GroupName, client: ClientId, delivery: Delivery) {
        let key = (group, client);
        if let Some(w) = self.polls.get_mut(&key) {
            if w.got.is_empty() {
                self.to_finish.push(key.clone());
            }
            w.got.push(delivery);
            return;
        }
        if let Some(delivery) = self.streams.push(&key, delivery) {
            // Credit is withdrawn whenever a session ends, so this is a race we lost: give
            // the delivery back at once rather than let it wait out its ACK timeout.
            tracing::debug!(group = %key.0, client = %key.1, "delivery without a session");
            self.orphans.push((key, delivery.id));
        }
    }

    fn fetch(
        &mut self,
        group: GroupName,
        topic: TopicName,
        partition: Partition,
        fetch_id: FetchId,
        from: Offset,
        max: usize,
    ) {
        let log = self.log.clone();
        let events = self.events_tx.clone();
        let (wait_ms, max_bytes) = (self.fetch_wait_ms, self.fetch_max_bytes);
        tokio::spawn(async move {
            let read = log
                .fetch(
                    group.clone(),
                    topic,
                    partition,
                    from,
                    max,
                    max_bytes,
                    wait_ms,
                )
                .await;
            let result = match read {
                LogRead::Records(records) => {
                    FetchResult::Records(records.into_iter().map(decode_record).collect())
                }
                LogRead::Decoded(records) => FetchResult::Records(records),
                LogRead::OutOfRange { earliest, end } => FetchResult::OutOfRange { earliest, end },
                LogRead::Failed(reason) => {
                    tracing::warn!(%reason, "fetch failed; the core retries");
                    FetchResult::Failed { reason }
                }
            };
            let _ = events
                .send(Event::Fetched {
                    group,
                    partition,
                    fetch_id,
                    result,
                })
                .await;
        });
    }

    /// Keeps the set of records in replay lanes current from what is being persisted:
    /// an ACKed replay is resolved, a failed one is dead-lettered again.
    fn note_replays(&mut self, batch: &PersistBatch) {
        for k in &batch.dlq_resolved {
            if let Some(set) = self.replaying.get_mut(&k.group) {
                set.remove(&(k.partition, k.offset));
            }
        }
        for d in &batch.dead_letters {
            if let Some(set) = self.replaying.get_mut(&d.key.group) {
                set.remove(&(d.key.partition, d.key.offset));
            }
        }
        for g in &batch.removed_groups {
            self.replaying.remove(g);
        }
    }

    /// Remembers which groups' DLQ this persist changes, to count once it is durable.
    fn note_dlq_changes(&mut self, ticket: Ticket, batch: &PersistBatch) {
        let groups: BTreeSet<GroupName> = batch
            .dead_letters
            .iter()
            .map(|d| &d.key.group)
            .chain(batch.dlq_resolved.iter().map(|k| &k.group))
            .cloned()
            .collect();
        for g in &batch.removed_groups {
            self.dlq_changes.remove(g);
        }
        if !groups.is_empty() {
            self.dlq_pending.insert(ticket, groups);
        }
    }

    /// A persist is durable (`Ok`) or failed (its content is carried again by a later
    /// one, which is noted when it goes out).
    fn dlq_persisted(&mut self, ticket: Ticket, durable: bool) {
        let Some(groups) = self.dlq_pending.remove(&ticket) else {
            return;
        };
        if durable {
            for g in groups {
                if self.mesh.subscription(&g).is_some() {
                    let n = self.dlq_changes.entry(g).or_default();
                    *n = n.saturating_add(1);
                }
            }
        }
    }

    // ----- completions -----

    /// The broker moved partitions of a group. A revocation first makes the group's
    /// progress durable (the persist commits it), then drops the lanes, then answers the
    /// broker: so the next owner reads exactly this progress, and nothing of this instance
    /// touches the partitions afterwards.
    fn on_group_event(&mut self, event: GroupEvent) {
        match event {
            GroupEvent::Assigned { group, partitions } => {
                let listed: Vec<Partition> = partitions.iter().map(|a| a.partition).collect();
                match self.handle(Input::PartitionsAssigned {
                    group: group.clone(),
                    partitions,
                }) {
                    Response::Refused(r) => {
                        tracing::error!(%group, ?listed, reason = %r, "assignment refused")
                    }
                    _ => tracing::info!(%group, partitions = ?listed, "partitions assigned"),
                }
            }
            GroupEvent::Revoking {
                group,
                partitions,
                lost: true,
                done,
            } => {
                // Dropped at once: what this instance did not persist yet is redelivered by
                // the new owner (in flight, C2), and nothing of it reaches the stores — not
                // even a persist already issued and still waiting for the writer.
                if let Some(t) = self.last_ticket {
                    self.fences.fence(&group, &partitions, t + 1);
                }
                let _ = self.handle(Input::PartitionsRevoked {
                    group: group.clone(),
                    partitions: partitions.clone(),
                });
                tracing::warn!(%group, ?partitions, "partitions lost to another instance");
                let _ = done.try_send(());
            }
            GroupEvent::Revoking {
                group,
                partitions,
                lost: false,
                done,
            } => {
                // Nothing more goes out of them; what is in flight can still be settled,
                // and is flushed before they leave (issue 23).
                let _ = self.handle(Input::PartitionsRevoking {
                    group: group.clone(),
                    partitions: partitions.clone(),
                });
                self.flush_revocation(group, partitions, done, 1);
            }
        }
        self.finish_pending();
    }

    /// Flush round `round` of a revocation: `Event::RevokeFlushed` once it is durable.
    fn flush_revocation(
        &mut self,
        group: GroupName,
        partitions: Vec<Partition>,
        done: std::sync::mpsc::SyncSender<()>,
        round: u32,
    ) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.flush_after(tx);
        let events = self.events_tx.clone();
        tokio::spawn(async move {
            let flushed = rx.await.map_err(|_| "the engine stopped".to_owned());
            let flushed = flushed.and_then(|r| r.map_err(|e| e.to_string()));
            let _ = events
                .send(Event::RevokeFlushed {
                    group,
                    partitions,
                    flushed,
                    done,
                    round,
                })
                .await;
        });
    }

    fn on_event(&mut self, event: Event) {
        match event {
            Event::RevokeFlushed {
                group,
                partitions,
                flushed,
                done,
                round,
            } => {
                // Settled since the round began (an ACK of a delivery in flight), or a
                // persist that carries them still out: another round, so no ACK answered
                // before the partitions leave is lost, and nothing of them is written after
                // they left. Also after a failed flush: its content is pending again, and a
                // persist issued behind it (a timed flush of what was settled meanwhile)
                // may be on its way to the store — handed back now, it landed after the
                // next owner read the progress topic, and that owner's claim then outranked
                // an ACK this instance had made durable (madsim group shape, seed 534).
                // Nothing new goes out of them, so the rounds end; the bound is for a
                // client that keeps NACKing or a store that keeps failing, and the
                // consumer's own wait bounds the time.
                if round < MAX_REVOKE_FLUSH_ROUNDS && self.mesh.revoke_pending(&group, &partitions)
                {
                    self.flush_revocation(group, partitions, done, round + 1);
                    self.finish_pending();
                    return;
                }
                if let Err(reason) = flushed {
                    // The rounds ran out: the next owner resumes from the last durable
                    // progress (duplicates of what was ACKed since).
                    tracing::warn!(%group, ?partitions, %reason, "progress not flushed before the revocation");
                }
                let _ = self.handle(Input::PartitionsRevoked {
                    group: group.clone(),
                    partitions: partitions.clone(),
                });
                tracing::info!(%group, ?partitions, "partitions revoked");
                let _ = done.try_send(());
            }
            Event::TopicPrepared { spec, reply, facts } => {
                self.on_topic_prepared(spec, reply, facts)
            }
            Event::SeekRange { seek, range } => self.on_seek_range(*seek, range),
            Event::Fetched {
                group,
                partition,
                fetch_id,
                result,
            } => {
                let _ = self.handle(Input::Fetched {
                    group,
                    partition,
                    fetch_id,
                    result,
                });
            }
            Event::Persisted { ticket, result } => {
                let waiters = self.ticket_waiters.remove(&ticket).unwrap_or_default();
                self.dlq_persisted(ticket, result.is_ok());
                match result {
                    Ok(()) => {
                        let _ = self.handle(Input::Persisted { ticket });
                        for w in waiters {
                            let _ = w.send(Ok(()));
                        }
                    }
                    Err(reason) => {
                        tracing::error!(ticket, %reason, "persist failed; progress stays where it was and is retried");
                        let _ = self.handle(Input::PersistFailed { ticket });
                        for w in waiters {
                            let _ = w.send(Err(EngineError::Unavailable(format!(
                                "the state store failed: {reason}"
                            ))));
                        }
                        // A later persist's durability says nothing of this one's content,
                        // which is pending again: who waits for a later one waits for the
                        // persist that carries it again.
                        let later: Vec<Ticket> = self
                            .ticket_waiters
                            .range(ticket..)
                            .map(|(&t, _)| t)
                            .collect();
                        for t in later {
                            if let Some(w) = self.ticket_waiters.remove(&t) {
                                self.flush_waiters.extend(w);
                            }
                        }
                    }
                }
                self.place_flush_waiters();
            }
        }
        self.finish_pending();
    }
}

async fn recv_opt<T>(rx: &mut Option<mpsc::Receiver<T>>) -> Option<T> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}
