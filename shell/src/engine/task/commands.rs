//! The engine task's answers to commands from the handle: one function per command.
//! Requests that change durable state (subscriptions, removals, seeks) answer once the
//! persist that carries the change is durable (`flush_after`).

use futures_util::FutureExt;
use madsim_tokio as tokio;
use tokio::sync::oneshot;
use unimesh_core::{
    ClientId, DeliveryId, GroupName, Input, Offset, Partition, Record, Response, StartFrom,
    SubscriptionSpec,
};

use super::EngineTask;
use crate::engine::api::{refusal, topic_error, ClientInfo, EngineError, Settling};
use crate::engine::command::{Command, Event, Reply, Seek};
use crate::engine::ports::{StorageError, TopicFacts};

impl EngineTask {
    pub(super) fn on_command(&mut self, command: Command) {
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
            Command::Clients { reply } => {
                let _ = reply.send(Ok(self.clients()));
            }
            Command::Evict { client, reply } => self.on_evict(client, reply),
            Command::Metrics { reply } => self.answer_with_ends(
                Ok(self.metrics()),
                |m| m.groups.iter_mut().flat_map(|g| &mut g.lanes).collect(),
                reply,
            ),
            Command::Offsets { topic, reply } => self.on_offsets(topic, reply),
            Command::OpenStream {
                group,
                client,
                window,
                reply,
            } => self.open_stream(group, client, window, reply),
            Command::Poll {
                group,
                client,
                max,
                wait_ms,
                reply,
            } => self.poll(group, client, max, wait_ms, reply),
            Command::PushTargets { reply } => {
                let targets = self
                    .mesh
                    .group_names()
                    .filter_map(|g| {
                        let spec = self.mesh.subscription(g)?;
                        Some(crate::engine::PushTarget {
                            group: g.clone(),
                            url: spec.push_url.clone()?,
                            secret: spec.push_secret.clone(),
                            backoff_max_ms: spec.backoff.max_ms,
                            batch: spec.push_batch.max(1),
                        })
                    })
                    .collect();
                let _ = reply.send(Ok(targets));
            }
            Command::Replay {
                group,
                records,
                reply,
            } => self.on_replay(group, records, reply),
            Command::Seek {
                group,
                partition,
                offset,
                clamp,
                reply,
            } => self.on_seek(group, partition, offset, clamp, reply),
            Command::Settle {
                group,
                how,
                ids,
                reply,
            } => self.on_settle(group, how, ids, reply),
            Command::Shutdown { reply } => self.on_shutdown(reply),
            Command::Subscribe { spec, reply } => self.on_subscribe(spec, reply),
            Command::Subscription { group, reply } => {
                let info = self
                    .info(&group)
                    .ok_or_else(|| EngineError::UnknownGroup(group.clone()));
                self.answer_with_ends(info, |i| i.lanes.iter_mut().collect(), reply)
            }
            Command::Subscriptions { reply } => self.answer_with_ends(
                Ok(self.subscriptions()),
                |all| all.iter_mut().flat_map(|i| &mut i.lanes).collect(),
                reply,
            ),
            Command::Unsubscribe { group, reply } => self.on_unsubscribe(group, reply),
        }
    }

    /// Disconnects a client from every group it is in: what it holds is redelivered at once.
    fn on_evict(&mut self, client: ClientId, reply: Reply<usize>) {
        let groups: Vec<GroupName> = self.mesh.group_names().cloned().collect();
        let mut n = 0;
        for g in groups {
            let present = self
                .mesh
                .group_view(&g)
                .is_some_and(|v| v.clients.iter().any(|c| c.id == client));
            let key = (g.clone(), client.clone());
            if self.polls.contains(&key) {
                self.finish_waiter(&key);
            }
            if self.streams.contains(&key) {
                self.end_stream(&key);
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

    /// Every client of every group, as `/admin/clients` shows them.
    fn clients(&self) -> Vec<ClientInfo> {
        let mut out = Vec::new();
        for g in self.mesh.group_names() {
            if let Some(v) = self.mesh.group_view(g) {
                out.extend(v.clients.into_iter().map(|c| ClientInfo {
                    group: g.clone(),
                    id: c.id,
                    credit: c.credit,
                    in_flight: c.in_flight,
                    last_active_ms: c.last_active_ms,
                }));
            }
        }
        out
    }

    /// Starts the replay of dead letters into the group's replay lane; records already in
    /// replay are left out, so a second replay does not repeat them.
    fn on_replay(
        &mut self,
        group: GroupName,
        records: Vec<(Partition, Record)>,
        reply: Reply<usize>,
    ) {
        let set = self.replaying.entry(group.clone()).or_default();
        let fresh: Vec<(Partition, Record)> = records
            .into_iter()
            .filter(|(p, r)| !set.contains(&(*p, r.offset)))
            .collect();
        let keys: Vec<(Partition, Offset)> = fresh.iter().map(|(p, r)| (*p, r.offset)).collect();
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

    /// Operator rewind or skip of one partition; answers the offset once durable. A seek
    /// outside what the log holds would read as a broker truncation (past the end) or as
    /// retention (below the earliest): the log is asked for the partition's range (when
    /// it does not answer at once, off the task: `Event::SeekRange`), and the seek is
    /// refused, or with `clamp` (an offset resolved from a time) moved to the nearest
    /// offset the log holds.
    fn on_seek(
        &mut self,
        group: GroupName,
        partition: Partition,
        offset: Offset,
        clamp: bool,
        reply: Reply<Offset>,
    ) {
        let Some(topic) = self.mesh.subscription(&group).map(|s| s.topic.clone()) else {
            // No such group: the core refuses it.
            self.seek(group, partition, offset, reply);
            return;
        };
        let mut range = self.log.offsets(topic.clone(), partition);
        let seek = Box::new(Seek {
            group,
            topic,
            partition,
            offset,
            clamp,
            reply,
        });
        if let Some(range) = (&mut range).now_or_never() {
            self.on_seek_range(*seek, range);
            return;
        }
        let events = self.events_tx.clone();
        tokio::spawn(async move {
            let range = range.await;
            let _ = events.send(Event::SeekRange { seek, range }).await;
        });
    }

    /// The log answered the range of a seek's partition: the seek applies, moved or refused.
    pub(super) fn on_seek_range(
        &mut self,
        seek: Seek,
        range: Result<(Offset, Offset), StorageError>,
    ) {
        let Seek {
            group,
            topic,
            partition,
            mut offset,
            clamp,
            reply,
        } = seek;
        if self.shutdown.is_some() {
            let _ = reply.send(Err(EngineError::Unavailable(
                "the engine is stopping".into(),
            )));
            return;
        }
        let refused = match range {
            Ok((earliest, end)) if clamp => {
                offset = offset.clamp(earliest, end.max(earliest));
                None
            }
            Ok((earliest, end)) if offset < earliest || offset > end => {
                Some(EngineError::BadRequest(format!(
                    "offset {offset} is outside partition {partition} of topic {topic}, which \
                     holds {earliest}..{end}"
                )))
            }
            Ok(_) => None,
            Err(StorageError::Invalid(_)) => Some(EngineError::BadRequest(format!(
                "topic {topic} has no partition {partition}"
            ))),
            Err(e) => Some(EngineError::from(e)),
        };
        match refused {
            Some(e) => {
                let _ = reply.send(Err(e));
            }
            None => self.seek(group, partition, offset, reply),
        }
    }

    /// Applies a seek; answers the offset once durable.
    fn seek(
        &mut self,
        group: GroupName,
        partition: Partition,
        offset: Offset,
        reply: Reply<Offset>,
    ) {
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
                let (durable, done) = oneshot::channel();
                self.flush_after(durable);
                // The flush answers `()`; the caller wants the offset.
                tokio::spawn(async move {
                    let answer = done.await.unwrap_or_else(|_| {
                        Err(EngineError::Unavailable("the engine has stopped".into()))
                    });
                    let _ = reply.send(answer.map(|()| offset));
                });
            }
        }
    }

    /// ACK, NACK or extend: one outcome per id, in order.
    fn on_settle(
        &mut self,
        group: GroupName,
        how: Settling,
        ids: Vec<DeliveryId>,
        reply: Reply<Vec<unimesh_core::Settle>>,
    ) {
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

    /// Flushes progress, answers every open poll, and answers `reply` once nothing is
    /// left to persist (see `shutdown_complete`).
    fn on_shutdown(&mut self, reply: Reply<()>) {
        tracing::info!("engine: flushing progress before shutdown");
        let _ = self.handle(Input::FlushNow);
        self.shutdown = Some(reply);
        for key in self.polls.keys(None) {
            self.finish_waiter(&key);
        }
        for key in self.streams.keys(None) {
            self.end_stream(&key);
        }
    }

    /// Creates or updates a group; answers (created?) once its definition is durable. A
    /// definition the core refuses is answered at once; the others wait their turn for the
    /// log to prepare their topic (off the task: a topic's creation is a synced write, on
    /// Kafka a round trip to the broker), then apply in the order they came.
    fn on_subscribe(&mut self, spec: Box<SubscriptionSpec>, reply: Reply<bool>) {
        // A refused subscription must leave no topic behind (nothing half-applied).
        if let Err(r) = self.mesh.check_subscribe(&spec) {
            let _ = reply.send(Err(refusal(r, &spec.group)));
            return;
        }
        self.subscribes.push_back((spec, reply));
        self.prepare_next_topic();
    }

    /// Sends the first waiting subscription's topic to the log, unless one is out already.
    pub(super) fn prepare_next_topic(&mut self) {
        if self.subscribing {
            return;
        }
        let Some((spec, reply)) = self.subscribes.pop_front() else {
            return;
        };
        self.subscribing = true;
        let latest_unknown = matches!(&spec.start_from, StartFrom::Latest(ends) if ends.is_empty());
        let with_offsets = self.placing_needs_offsets() || latest_unknown;
        let (log, events) = (self.log.clone(), self.events_tx.clone());
        tokio::spawn(async move {
            let facts = log.prepare_topic(spec.topic.clone(), with_offsets).await;
            let _ = events
                .send(Event::TopicPrepared { spec, reply, facts })
                .await;
        });
    }

    /// The log prepared a subscription's topic: the subscription applies, and the next one
    /// waiting goes to the log.
    pub(super) fn on_topic_prepared(
        &mut self,
        spec: Box<SubscriptionSpec>,
        reply: Reply<bool>,
        facts: Result<TopicFacts, StorageError>,
    ) {
        self.subscribing = false;
        if self.shutdown.is_some() {
            let _ = reply.send(Err(EngineError::Unavailable(
                "the engine is stopping".into(),
            )));
            return;
        }
        let applied = facts
            .map_err(topic_error)
            .and_then(|facts| self.subscribe(*spec, &facts));
        match applied {
            Ok(created) => {
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
        self.prepare_next_topic();
    }

    fn subscribe(
        &mut self,
        mut spec: SubscriptionSpec,
        facts: &TopicFacts,
    ) -> Result<bool, EngineError> {
        let existed = self.mesh.subscription(&spec.group).is_some();
        if let StartFrom::Latest(ends) = &mut spec.start_from {
            if ends.is_empty() && !existed {
                if facts.offsets.len() != facts.partitions as usize {
                    return Err(EngineError::Unavailable(format!(
                        "the ends of {} are not known",
                        spec.topic
                    )));
                }
                for (p, &(_, end)) in (0..facts.partitions).zip(&facts.offsets) {
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
            self.place_group(&group, &topic, facts)?;
        }
        self.finish_pending();
        Ok(!existed)
    }

    /// Removes a group; its open polls are answered `UnknownGroup`; answers once durable.
    fn on_unsubscribe(&mut self, group: GroupName, reply: Reply<()>) {
        if let Response::Refused(r) = self.handle(Input::Unsubscribe {
            group: group.clone(),
        }) {
            let _ = reply.send(Err(refusal(r, &group)));
            return;
        }
        if let Some(groups) = self.log.group() {
            groups.leave(&group);
        }
        for key in self.polls.keys(Some(&group)) {
            if let Some(w) = self.polls.take(&key) {
                let _ = w.reply.send(Err(EngineError::UnknownGroup(group.clone())));
            }
        }
        // The group is gone: its streams end (their transports see the end).
        for key in self.streams.keys(Some(&group)) {
            self.end_stream(&key);
        }
        self.flush_after(reply);
    }

    /// Answers `reply` once everything pending now, and everything handed to a persist
    /// before, is durable: a durability barrier (docs/DESIGN.md §8).
    pub(super) fn flush_after(&mut self, reply: Reply<()>) {
        self.flush_waiters.push(reply);
        let _ = self.handle(Input::FlushNow);
        self.place_flush_waiters();
    }

    /// Waiters the last flush handed to no persist (nothing was pending, or too many
    /// persists were out): with nothing pending they wait for the newest persist out
    /// (persists are answered in order), or are answered now when none is out; with
    /// something pending they stay for the persist that will carry it. Before, a waiter
    /// with nothing pending but a persist out waited for whatever persist came next — up
    /// to a revocation's whole wait on an idle lane.
    pub(super) fn place_flush_waiters(&mut self) {
        if self.flush_waiters.is_empty() || self.mesh.flush_pending() {
            return;
        }
        let waiters = std::mem::take(&mut self.flush_waiters);
        match self.mesh.newest_outstanding_ticket() {
            Some(ticket) => self
                .ticket_waiters
                .entry(ticket)
                .or_default()
                .extend(waiters),
            None => {
                for r in waiters {
                    let _ = r.send(Ok(()));
                }
            }
        }
    }
}
