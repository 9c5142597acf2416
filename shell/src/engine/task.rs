//! The engine task: the only owner of the core `Mesh`. It turns commands (from the HTTP
//! front) and I/O completions (fetches, persists) into inputs, and carries out the effects.
//! No lock guards the mesh: everything reaches it through this task's channels, which are
//! bounded, so a flood of requests becomes back-pressure instead of memory.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering as AtomicOrdering;
use std::sync::Arc;
use std::time::Duration;

use madsim_tokio as tokio;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use unimesh_core::{
    Assignment, ClientId, Delivery, DeliveryId, Effect, FetchId, FetchResult, GroupName, GroupView,
    Input, Mesh, Millis, Offset, Partition, Record, RecordMeta, Refusal, Response, Settle,
    SkipReason, StartFrom, SubscriptionSpec, Ticket, TopicName,
};

use super::handle::{
    ClientInfo, EngineError, MetricsSnapshot, OffsetRow, Settling, Shared, SubscriptionInfo,
};
use super::ports::{AppendError, LogPort, LogRead, StatePort};

pub(crate) type Reply<T> = oneshot::Sender<Result<T, EngineError>>;

/// Requests from the HTTP front.
pub(crate) enum Command {
    Subscribe {
        spec: Box<SubscriptionSpec>,
        reply: Reply<bool>,
    },
    Unsubscribe {
        group: GroupName,
        reply: Reply<()>,
    },
    Subscription {
        group: GroupName,
        reply: Reply<SubscriptionInfo>,
    },
    Subscriptions {
        reply: Reply<Vec<SubscriptionInfo>>,
    },
    Poll {
        group: GroupName,
        client: ClientId,
        max: u32,
        wait_ms: u64,
        reply: Reply<Vec<Delivery>>,
    },
    Settle {
        group: GroupName,
        how: Settling,
        ids: Vec<DeliveryId>,
        reply: Reply<Vec<Settle>>,
    },
    Clients {
        reply: Reply<Vec<ClientInfo>>,
    },
    Evict {
        client: ClientId,
        reply: Reply<usize>,
    },
    Offsets {
        topic: TopicName,
        reply: Reply<Vec<OffsetRow>>,
    },
    Replay {
        group: GroupName,
        records: Vec<(Partition, Record)>,
        reply: Reply<usize>,
    },
    Seek {
        group: GroupName,
        partition: Partition,
        offset: Offset,
        reply: Reply<()>,
    },
    Metrics {
        reply: Reply<MetricsSnapshot>,
    },
    Shutdown {
        reply: Reply<()>,
    },
}

/// Completions of I/O the engine started.
pub(crate) enum Event {
    Fetched {
        group: GroupName,
        partition: Partition,
        fetch_id: FetchId,
        result: FetchResult,
    },
    Persisted {
        ticket: Ticket,
        result: Result<(), String>,
    },
}

/// A long-poll waiting for deliveries.
struct Waiter {
    id: u64,
    got: Vec<Delivery>,
    reply: Reply<Vec<Delivery>>,
    deadline: Option<Instant>,
}

pub(crate) struct EngineTask {
    pub mesh: Mesh,
    pub start: Instant,
    pub log: Arc<dyn LogPort>,
    pub shared: Arc<Shared>,
    pub commands: mpsc::Receiver<Command>,
    pub events_tx: mpsc::Sender<Event>,
    pub events_rx: mpsc::Receiver<Event>,
    pub persist_tx: mpsc::Sender<(Ticket, Arc<unimesh_core::PersistBatch>)>,
    pub fetch_wait_ms: u64,
    pub fetch_max_bytes: usize,
    waiters: BTreeMap<(GroupName, ClientId), Waiter>,
    poll_deadlines: BTreeSet<(Instant, u64)>,
    poll_index: BTreeMap<u64, (GroupName, ClientId)>,
    next_poll_id: u64,
    /// Waiters finished with deliveries, to answer once the current effects are drained.
    to_finish: Vec<(GroupName, ClientId)>,
    /// Replies waiting for "the next persist" to be durable (subscription changes, seeks).
    flush_waiters: Vec<Reply<()>>,
    ticket_waiters: BTreeMap<Ticket, Vec<Reply<()>>>,
    /// DLQ records currently in a group's replay lane, so a second replay does not repeat them.
    replaying: BTreeMap<GroupName, BTreeSet<(Partition, Offset)>>,
    shutdown: Option<Reply<()>>,
    last_closed_scan: Instant,
}

impl EngineTask {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        mesh: Mesh,
        log: Arc<dyn LogPort>,
        shared: Arc<Shared>,
        commands: mpsc::Receiver<Command>,
        persist_tx: mpsc::Sender<(Ticket, Arc<unimesh_core::PersistBatch>)>,
        events: (mpsc::Sender<Event>, mpsc::Receiver<Event>),
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
            persist_tx,
            fetch_wait_ms,
            fetch_max_bytes,
            waiters: BTreeMap::new(),
            poll_deadlines: BTreeSet::new(),
            poll_index: BTreeMap::new(),
            next_poll_id: 1,
            to_finish: Vec::new(),
            flush_waiters: Vec::new(),
            ticket_waiters: BTreeMap::new(),
            replaying: BTreeMap::new(),
            shutdown: None,
            last_closed_scan: Instant::now(),
        }
    }

    fn now_ms(&self) -> Millis {
        Instant::now().duration_since(self.start).as_millis() as Millis
    }

    fn handle(&mut self, input: Input) -> Response {
        let now = self.now_ms();
        let response = self.mesh.handle(now, input);
        self.drain();
        response
    }

    /// Assigns every partition of `topic` to `group` (the embedded log is owned whole by
    /// this instance).
    fn assign_all(&mut self, group: &GroupName, topic: &TopicName) -> Result<(), EngineError> {
        let partitions = self.log.ensure_topic(topic).map_err(topic_error)?;
        let mut assignments = Vec::with_capacity(partitions as usize);
        for p in 0..partitions {
            let (earliest, end) = self
                .log
                .offsets(topic, p)
                .map_err(EngineError::Unavailable)?;
            assignments.push(Assignment {
                partition: p,
                earliest,
                end,
                checkpoint: None,
            });
        }
        match self.handle(Input::PartitionsAssigned {
            group: group.clone(),
            partitions: assignments,
        }) {
            Response::Refused(r) => Err(EngineError::Refused(r)),
            _ => Ok(()),
        }
    }

    /// Assigns the partitions of every recovered group; called once at start.
    pub fn assign_recovered(&mut self) -> Result<(), EngineError> {
        let groups: Vec<(GroupName, TopicName)> = self
            .mesh
            .group_names()
            .filter_map(|g| {
                self.mesh
                    .subscription(g)
                    .map(|s| (g.clone(), s.topic.clone()))
            })
            .collect();
        for (group, topic) in groups {
            self.assign_all(&group, &topic)?;
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
        for (_, w) in std::mem::take(&mut self.waiters) {
            let _ = w.reply.send(Ok(w.got));
        }
    }

    fn next_deadline(&self) -> Option<Instant> {
        let mesh = self
            .mesh
            .poll_timeout()
            .map(|ms| self.start + Duration::from_millis(ms));
        let poll = self.poll_deadlines.first().map(|&(t, _)| t);
        match (mesh, poll) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn on_tick(&mut self) {
        let _ = self.handle(Input::Tick);
        let now = Instant::now();
        if now.duration_since(self.last_closed_scan) >= Duration::from_millis(50) {
            self.last_closed_scan = now;
            // A poll whose HTTP request went away (client disconnected) must lose its credit
            // before the core hands it deliveries that could only come back as NACKs.
            let closed: Vec<_> = self
                .waiters
                .iter()
                .filter(|(_, w)| w.reply.is_closed())
                .map(|(k, _)| k.clone())
                .collect();
            for key in closed {
                self.finish_waiter(&key);
            }
        }
        while let Some(&(t, id)) = self.poll_deadlines.first() {
            if t > now {
                break;
            }
            self.poll_deadlines.pop_first();
            if let Some(key) = self.poll_index.get(&id).cloned() {
                self.finish_waiter(&key);
            }
        }
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
                    let batch: Arc<unimesh_core::PersistBatch> = Arc::from(batch);
                    if self.persist_tx.try_send((ticket, batch)).is_err() {
                        // The core bounds outstanding persists far below the channel size,
                        // so this only happens when the writer is gone.
                        tracing::error!(ticket, "the persist writer is gone; persist failed");
                        let _ = self.events_tx.try_send(Event::Persisted {
                            ticket,
                            result: Err("the persist writer is gone".into()),
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
                // The embedded log keeps no broker-side group offsets and is not a POP broker.
                Effect::Commit { .. } | Effect::BrokerAck { .. } => {}
                other => tracing::warn!(?other, "effect not handled by this shell"),
            }
        }
    }

    fn deliver(&mut self, group: GroupName, client: ClientId, delivery: Delivery) {
        let key = (group, client);
        match self.waiters.get_mut(&key) {
            Some(w) => {
                if w.got.is_empty() {
                    self.to_finish.push(key.clone());
                }
                w.got.push(delivery);
            }
            None => {
                // Credit is withdrawn whenever a poll ends, so this is a race we lost: give
                // the delivery back at once rather than let it wait out its ACK timeout.
                tracing::debug!(group = %key.0, client = %key.1, "delivery without a waiting poll");
                let _ = self.handle(Input::Nack {
                    group: key.0,
                    ids: vec![delivery.id],
                    delay_ms: Some(0),
                });
            }
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
                .fetch(topic, partition, from, max, max_bytes, wait_ms)
                .await;
            let result = match read {
                LogRead::Records(records) => {
                    FetchResult::Records(records.into_iter().map(decode_record).collect())
                }
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
    fn note_replays(&mut self, batch: &unimesh_core::PersistBatch) {
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

    // ----- polls -----

    /// Removes a waiting poll with its index and deadline entries.
    fn take_waiter(&mut self, key: &(GroupName, ClientId)) -> Option<Waiter> {
        let w = self.waiters.remove(key)?;
        self.poll_index.remove(&w.id);
        if let Some(t) = w.deadline {
            self.poll_deadlines.remove(&(t, w.id));
        }
        Some(w)
    }

    fn finish_waiter(&mut self, key: &(GroupName, ClientId)) {
        let Some(w) = self.take_waiter(key) else {
            return;
        };
        // Withdraw what is left of the credit: nothing may be handed to a client that is
        // no longer waiting.
        let _ = self.handle(Input::ClientPoll {
            group: key.0.clone(),
            client: key.1.clone(),
            max: 0,
        });
        if let Err(Ok(got)) = w.reply.send(Ok(w.got)) {
            // The HTTP request went away (client disconnected): hand the deliveries back.
            if !got.is_empty() {
                let ids = got.iter().map(|d| d.id).collect();
                let _ = self.handle(Input::Nack {
                    group: key.0.clone(),
                    ids,
                    delay_ms: Some(0),
                });
            }
        }
    }

    fn finish_pending(&mut self) {
        while let Some(key) = self.to_finish.pop() {
            self.finish_waiter(&key);
        }
    }

    fn poll(
        &mut self,
        group: GroupName,
        client: ClientId,
        max: u32,
        wait_ms: u64,
        reply: Reply<Vec<Delivery>>,
    ) {
        let key = (group.clone(), client.clone());
        // A second poll from the same client ends the first with what it has.
        self.finish_waiter(&key);
        let id = self.next_poll_id;
        self.next_poll_id += 1;
        let deadline = (wait_ms > 0).then(|| Instant::now() + Duration::from_millis(wait_ms));
        self.waiters.insert(
            key.clone(),
            Waiter {
                id,
                got: Vec::new(),
                reply,
                deadline,
            },
        );
        self.poll_index.insert(id, key.clone());
        if let Some(t) = deadline {
            self.poll_deadlines.insert((t, id));
        }
        match self.handle(Input::ClientPoll { group, client, max }) {
            Response::Refused(r) => {
                if let Some(w) = self.take_waiter(&key) {
                    let _ = w.reply.send(Err(refusal(r, &key.0)));
                }
                self.to_finish.retain(|k| *k != key);
            }
            _ => {
                if deadline.is_none() && !self.to_finish.contains(&key) {
                    self.to_finish.push(key);
                }
            }
        }
        self.finish_pending();
    }

    // ----- commands -----

    fn on_command(&mut self, command: Command) {
        if self.shutdown.is_some() {
            if let Command::Shutdown { reply } = command {
                let _ = reply.send(Ok(()));
            } else {
                // Dropping the reply answers the caller `Unavailable` (see `ask`).
                drop(command);
            }
            return;
        }
        match command {
            Command::Subscribe { spec, reply } => {
                let r = self.subscribe(*spec);
                match r {
                    Ok(created) => {
                        // Answer once the definition is durable.
                        let (tx, rx) = oneshot::channel();
                        self.flush_after(tx);
                        tokio::spawn(async move {
                            let r = rx.await.unwrap_or_else(|_| {
                                Err(EngineError::Unavailable("the engine stopped".into()))
                            });
                            let _ = reply.send(r.map(|()| created));
                        });
                    }
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            Command::Unsubscribe { group, reply } => {
                match self.handle(Input::Unsubscribe {
                    group: group.clone(),
                }) {
                    Response::Refused(r) => {
                        let _ = reply.send(Err(refusal(r, &group)));
                    }
                    _ => {
                        let waiting: Vec<_> = self
                            .waiters
                            .keys()
                            .filter(|(g, _)| *g == group)
                            .cloned()
                            .collect();
                        for key in waiting {
                            if let Some(w) = self.take_waiter(&key) {
                                let _ = w.reply.send(Err(EngineError::UnknownGroup(group.clone())));
                            }
                        }
                        self.flush_after(reply);
                    }
                }
            }
            Command::Subscription { group, reply } => {
                let r = self
                    .info(&group)
                    .ok_or_else(|| EngineError::UnknownGroup(group.clone()));
                let _ = reply.send(r);
            }
            Command::Subscriptions { reply } => {
                let groups: Vec<GroupName> = self.mesh.group_names().cloned().collect();
                let infos = groups.iter().filter_map(|g| self.info(g)).collect();
                let _ = reply.send(Ok(infos));
            }
            Command::Poll {
                group,
                client,
                max,
                wait_ms,
                reply,
            } => self.poll(group, client, max, wait_ms, reply),
            Command::Settle {
                group,
                how,
                ids,
                reply,
            } => {
                let input = match how {
                    Settling::Ack => Input::Ack {
                        group: group.clone(),
                        ids,
                    },
                    Settling::Nack { delay_ms } => Input::Nack {
                        group: group.clone(),
                        ids,
                        delay_ms,
                    },
                    Settling::Extend { extend_ms } => Input::Extend {
                        group: group.clone(),
                        ids,
                        extend_ms,
                    },
                };
                let r = match self.handle(input) {
                    Response::Settled(s) => Ok(s),
                    Response::Refused(r) => Err(refusal(r, &group)),
                    Response::Ok => Ok(Vec::new()),
                };
                self.finish_pending();
                let _ = reply.send(r);
            }
            Command::Clients { reply } => {
                let groups: Vec<GroupName> = self.mesh.group_names().cloned().collect();
                let mut out = Vec::new();
                for g in groups {
                    if let Some(v) = self.mesh.group_view(&g) {
                        out.extend(v.clients.into_iter().map(|c| ClientInfo {
                            group: g.clone(),
                            id: c.id,
                            credit: c.credit,
                            in_flight: c.in_flight,
                            last_active_ms: c.last_active_ms,
                        }));
                    }
                }
                let _ = reply.send(Ok(out));
            }
            Command::Evict { client, reply } => {
                let groups: Vec<GroupName> = self.mesh.group_names().cloned().collect();
                let mut n = 0;
                for g in groups {
                    let present = self
                        .mesh
                        .group_view(&g)
                        .is_some_and(|v| v.clients.iter().any(|c| c.id == client));
                    let key = (g.clone(), client.clone());
                    if self.waiters.contains_key(&key) {
                        self.finish_waiter(&key);
                    }
                    if present {
                        let _ = self.handle(Input::ClientGone {
                            group: g,
                            client: client.clone(),
                        });
                        n += 1;
                    }
                }
                self.finish_pending();
                let _ = reply.send(Ok(n));
            }
            Command::Offsets { topic, reply } => {
                let r = self.offsets(&topic);
                let _ = reply.send(r);
            }
            Command::Replay {
                group,
                records,
                reply,
            } => {
                let set = self.replaying.entry(group.clone()).or_default();
                let fresh: Vec<(Partition, Record)> = records
                    .into_iter()
                    .filter(|(p, r)| !set.contains(&(*p, r.offset)))
                    .collect();
                let keys: Vec<(Partition, Offset)> =
                    fresh.iter().map(|(p, r)| (*p, r.offset)).collect();
                let n = fresh.len();
                match self.handle(Input::Replay {
                    group: group.clone(),
                    records: fresh,
                }) {
                    Response::Refused(r) => {
                        let _ = reply.send(Err(refusal(r, &group)));
                    }
                    _ => {
                        self.replaying.entry(group).or_default().extend(keys);
                        self.finish_pending();
                        let _ = reply.send(Ok(n));
                    }
                }
            }
            Command::Seek {
                group,
                partition,
                offset,
                reply,
            } => {
                // A seek outside what the log holds would read as a broker truncation (past
                // the end) or as retention (below the earliest): refuse it instead.
                if let Some(topic) = self.mesh.subscription(&group).map(|s| s.topic.clone()) {
                    match self.log.offsets(&topic, partition) {
                        Ok((earliest, end)) if offset < earliest || offset > end => {
                            let _ = reply.send(Err(EngineError::BadRequest(format!(
                                "offset {offset} is outside partition {partition} of topic \
                                 {topic}, which holds {earliest}..{end}"
                            ))));
                            return;
                        }
                        Ok(_) => {}
                        Err(_) => {
                            let _ = reply.send(Err(EngineError::BadRequest(format!(
                                "topic {topic} has no partition {partition}"
                            ))));
                            return;
                        }
                    }
                }
                self.seek(group, partition, offset, reply);
            }
            Command::Metrics { reply } => {
                let _ = reply.send(Ok(self.metrics()));
            }
            Command::Shutdown { reply } => {
                tracing::info!("engine: flushing progress before shutdown");
                let _ = self.handle(Input::FlushNow);
                self.shutdown = Some(reply);
                let waiting: Vec<_> = self.waiters.keys().cloned().collect();
                for key in waiting {
                    self.finish_waiter(&key);
                }
            }
        }
    }

    fn seek(&mut self, group: GroupName, partition: Partition, offset: Offset, reply: Reply<()>) {
        match self.handle(Input::Seek {
            group: group.clone(),
            partition,
            offset,
        }) {
            Response::Refused(r) => {
                let _ = reply.send(Err(refusal(r, &group)));
            }
            _ => {
                self.finish_pending();
                self.flush_after(reply);
            }
        }
    }

    fn subscribe(&mut self, mut spec: SubscriptionSpec) -> Result<bool, EngineError> {
        let existed = self.mesh.subscription(&spec.group).is_some();
        // A refused subscription must leave no topic behind (nothing half-applied).
        self.mesh
            .check_subscribe(&spec)
            .map_err(|r| refusal(r, &spec.group))?;
        let partitions = self.log.ensure_topic(&spec.topic).map_err(topic_error)?;
        if let StartFrom::Latest(ends) = &mut spec.start_from {
            if ends.is_empty() && !existed {
                for p in 0..partitions {
                    let (_, end) = self
                        .log
                        .offsets(&spec.topic, p)
                        .map_err(EngineError::Unavailable)?;
                    ends.insert(p, end);
                }
            }
        }
        let group = spec.group.clone();
        let topic = spec.topic.clone();
        if let Response::Refused(r) = self.handle(Input::Subscribe(spec)) {
            return Err(refusal(r, &group));
        }
        if !existed {
            self.assign_all(&group, &topic)?;
        }
        self.finish_pending();
        Ok(!existed)
    }

    /// Answers `reply` once the next persist (which carries everything pending now) is
    /// durable.
    fn flush_after(&mut self, reply: Reply<()>) {
        self.flush_waiters.push(reply);
        let _ = self.handle(Input::FlushNow);
        if !self.flush_waiters.is_empty() && self.mesh.outstanding_persists() == 0 {
            // Nothing was pending and nothing is in flight: already durable.
            for r in std::mem::take(&mut self.flush_waiters) {
                let _ = r.send(Ok(()));
            }
        }
    }

    fn on_event(&mut self, event: Event) {
        match event {
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
                    }
                }
            }
        }
        self.finish_pending();
    }

    // ----- views -----

    fn rows(&self, view: &GroupView) -> Vec<OffsetRow> {
        let group = &view.spec.group;
        view.lanes
            .iter()
            .map(|l| {
                let end = self
                    .log
                    .offsets(&view.spec.topic, l.partition)
                    .map_or(l.cursor, |(_, end)| end);
                OffsetRow {
                    group: group.clone(),
                    topic: view.spec.topic.clone(),
                    partition: l.partition,
                    end,
                    cursor: l.cursor,
                    push: l.push_end,
                    watermark: l.watermark,
                    durable_watermark: l.durable_watermark,
                    ack_ranges: l.ack_ranges.clone(),
                    lag: end.saturating_sub(l.watermark),
                    in_flight: l.in_flight as u64,
                }
            })
            .collect()
    }

    fn info(&self, group: &GroupName) -> Option<SubscriptionInfo> {
        let view = self.mesh.group_view(group)?;
        Some(SubscriptionInfo {
            lanes: self.rows(&view),
            clients: view.clients.len(),
            replaying: view
                .replay
                .as_ref()
                .map_or(0, |r| r.in_flight + r.queued + r.backoff),
            stats: view.stats,
            spec: view.spec,
        })
    }

    fn offsets(&self, topic: &TopicName) -> Result<Vec<OffsetRow>, EngineError> {
        if self.log.partitions(topic).is_none() {
            return Err(EngineError::UnknownTopic(topic.clone()));
        }
        let groups: Vec<GroupName> = self
            .mesh
            .group_names()
            .filter(|g| self.mesh.subscription(g).is_some_and(|s| s.topic == *topic))
            .cloned()
            .collect();
        Ok(groups
            .iter()
            .filter_map(|g| self.mesh.group_view(g))
            .flat_map(|view| self.rows(&view))
            .collect())
    }

    fn metrics(&self) -> MetricsSnapshot {
        let groups: Vec<GroupName> = self.mesh.group_names().cloned().collect();
        MetricsSnapshot {
            groups: groups.iter().filter_map(|g| self.info(g)).collect(),
            mesh: self.mesh.stats().clone(),
            epoch: self.mesh.epoch(),
            log: None,
        }
    }
}

/// A topic the log would not create: over its limit (the caller's doing) or a storage fault.
fn topic_error(e: AppendError) -> EngineError {
    match e {
        AppendError::Invalid(m) | AppendError::TooLarge(m) => EngineError::BadRequest(m),
        AppendError::Unavailable(m) => EngineError::Unavailable(m),
    }
}

pub(crate) fn refusal(r: Refusal, group: &GroupName) -> EngineError {
    match r {
        Refusal::UnknownGroup => EngineError::UnknownGroup(group.clone()),
        other => EngineError::Refused(other),
    }
}

/// Stored bytes → a core record. What cannot be decoded becomes an `Undecodable` record,
/// which the core dead-letters with the reason (never a silent drop).
pub(crate) fn decode_record((offset, body): (Offset, bytes::Bytes)) -> Record {
    let meta = match crate::event::decode_stored(&body) {
        Ok(meta) => RecordMeta::Event(Arc::new(meta)),
        Err(e) => RecordMeta::Undecodable(Arc::from(e.to_string())),
    };
    Record {
        offset,
        meta,
        body,
        broker_handle: None,
    }
}

async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// Writes persists one at a time, in the order the core issued them.
pub(crate) async fn persist_writer(
    state: Arc<dyn StatePort>,
    mut batches: mpsc::Receiver<(Ticket, Arc<unimesh_core::PersistBatch>)>,
    events: mpsc::Sender<Event>,
) {
    while let Some((ticket, batch)) = batches.recv().await {
        let result = state.apply(batch, wall_ms()).await;
        if events
            .send(Event::Persisted { ticket, result })
            .await
            .is_err()
        {
            break;
        }
    }
}

pub(crate) fn wall_ms() -> u64 {
    crate::log::WallClock::now_ms(&crate::log::SystemClock)
}
