//! The engine's front door: a cloneable handle the HTTP layer calls. Requests that touch
//! the mesh go through the engine task's bounded channel; publishing goes straight to the
//! log (the core has no part in it beyond the rate limit).

use std::sync::atomic::Ordering as AtomicOrdering;
use std::sync::{Arc, Mutex};

use madsim_tokio as tokio;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use unimesh_core::{
    ClientId, DeadLetterReason, Delivery, DeliveryId, DlqKey, GroupName, Offset, Partition,
    RateLimiter, RateRule, RecordMeta, Settle, SubscriptionSpec, TopicName,
};

use super::api::{
    ClientInfo, DlqItem, EngineError, MetricsSnapshot, OffsetRow, PublishResult, Settling, Shared,
    SubscriptionInfo,
};
use super::command::{Command, Reply};
use super::decode_record;
use super::dedup::{Dedup, Identity, Slot, WindowRule};
use super::ports::{LogPort, StatePort};
use super::stream::Stream;
use crate::storage::log::AppendItem;

/// The handle the HTTP front uses. Cheap to clone.
#[derive(Clone)]
pub struct EngineHandle {
    pub(crate) commands: mpsc::Sender<Command>,
    pub(crate) log: Arc<dyn LogPort>,
    pub(crate) state: Arc<dyn StatePort>,
    pub(crate) limiter: Arc<Mutex<RateLimiter>>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) start: Instant,
    /// The publish dedup windows; `None` when no topic has one (the publish path then
    /// never looks).
    pub(crate) dedup: Option<Arc<Dedup>>,
}

impl EngineHandle {
    async fn ask<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, EngineError> {
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(make(tx))
            .await
            .map_err(|_| EngineError::Unavailable("the engine has stopped".into()))?;
        rx.await
            .map_err(|_| EngineError::Unavailable("the engine has stopped".into()))?
    }

    pub fn is_ready(&self) -> bool {
        self.shared.ready.load(AtomicOrdering::Relaxed)
    }

    /// Whether the engine task still runs (it stops at shutdown, for good). Loops that
    /// serve the engine end when this is false; a log fault does not stop them.
    pub fn is_running(&self) -> bool {
        self.shared.healthy.load(AtomicOrdering::Relaxed) && !self.commands.is_closed()
    }

    /// `Err(why)` when the process cannot serve fully: the engine task stopped, or the
    /// log reports a fault (the embedded log refuses appends after a failed write, for
    /// good; the Kafka backend while its broker is unreachable or a client of it is in a
    /// fatal state, until it is back).
    pub fn health(&self) -> Result<(), String> {
        if !self.is_running() {
            return Err("the engine task has stopped".to_owned());
        }
        if let Some(fault) = self.log.fault() {
            return Err(fault);
        }
        Ok(())
    }

    /// `Err(why)` while the instance should get no traffic: still recovering, shutting
    /// down, or the log reports a fault (see [`EngineHandle::health`]).
    pub fn readiness(&self) -> Result<(), String> {
        if !self.is_ready() {
            return Err("the engine is still recovering, or is shutting down".to_owned());
        }
        if let Some(fault) = self.log.fault() {
            return Err(fault);
        }
        Ok(())
    }

    // ----- traffic -----

    /// Appends validated events durably; answers after every one is synced. Nothing is
    /// appended when the request is refused.
    pub async fn publish(
        &self,
        topic: &TopicName,
        events: Vec<crate::event::Published>,
    ) -> Result<Vec<PublishResult>, EngineError> {
        if events.is_empty() {
            return Ok(Vec::new());
        }
        {
            let now = Instant::now().duration_since(self.start).as_millis() as u64;
            let mut limiter = self.limiter.lock().unwrap_or_else(|p| p.into_inner());
            match limiter.try_acquire(now, topic, events.len() as u64) {
                Ok(()) => {}
                Err(Some(retry_after_ms)) => {
                    return Err(EngineError::RateLimited { retry_after_ms })
                }
                Err(None) => {
                    return Err(EngineError::TooLarge(format!(
                        "a batch of {} events exceeds the rate-limit burst of topic {topic}",
                        events.len()
                    )))
                }
            }
        }
        if let Some(dedup) = &self.dedup {
            if let Some(rule) = dedup.config().rule(topic) {
                return self.publish_deduplicated(dedup, rule, topic, events).await;
            }
        }
        let ids: Vec<String> = events.iter().map(|e| e.id().to_owned()).collect();
        let placed = self.append(topic, events.iter()).await?;
        Ok(ids
            .into_iter()
            .zip(placed)
            .map(|(id, (partition, offset))| PublishResult {
                id,
                partition,
                offset,
                duplicate: false,
            })
            .collect())
    }

    /// A publish to a topic with a dedup window (DESIGN §8): the events whose identity the
    /// window holds are answered with the first one's place, the others appended (waiting
    /// first while another request appends one of the same identities).
    async fn publish_deduplicated(
        &self,
        dedup: &Arc<Dedup>,
        rule: WindowRule,
        topic: &TopicName,
        events: Vec<crate::event::Published>,
    ) -> Result<Vec<PublishResult>, EngineError> {
        use cloudevents::AttributesReader as _;
        let identities: Vec<Identity> = events
            .iter()
            .map(|e| Identity::of(e.event().source().as_str(), e.id()))
            .collect();
        let (slots, reserved) = dedup
            .plan(topic, rule, &identities, super::persist::wall_ms)
            .await;
        let fresh = events
            .iter()
            .zip(&slots)
            .filter(|(_, slot)| matches!(slot, Slot::Fresh(_)))
            .map(|(e, _)| e);
        // On failure `reserved` is dropped, and the window forgets the fresh identities.
        let placed = if slots.iter().any(|s| matches!(s, Slot::Fresh(_))) {
            self.append(topic, fresh).await?
        } else {
            Vec::new()
        };
        reserved.appended(&placed);
        let mut placed = placed.into_iter();
        let mut results: Vec<PublishResult> = Vec::with_capacity(events.len());
        for (event, slot) in events.iter().zip(slots) {
            let (partition, offset, duplicate) = match slot {
                Slot::Fresh(_) => {
                    let (p, o) = placed.next().ok_or_else(|| {
                        EngineError::Unavailable("the log answered fewer places than events".into())
                    })?;
                    (p, o, false)
                }
                Slot::Duplicate(p, o) => (p, o, true),
                Slot::SameAs(earlier) => {
                    let first = results.get(earlier).ok_or_else(|| {
                        EngineError::Unavailable("a repeat names no earlier event".into())
                    })?;
                    (first.partition, first.offset, true)
                }
            };
            results.push(PublishResult {
                id: event.id().to_owned(),
                partition,
                offset,
                duplicate,
            });
        }
        Ok(results)
    }

    /// Appends the events durably; (partition, offset) of each, in order.
    async fn append<'a>(
        &self,
        topic: &TopicName,
        events: impl Iterator<Item = &'a crate::event::Published>,
    ) -> Result<Vec<(Partition, Offset)>, EngineError> {
        let items = events
            .map(|e| AppendItem {
                key: crate::event::partition_key(e.event()),
                value: e.stored(),
            })
            .collect();
        let placed = self
            .log
            .append(topic.clone(), items)
            .await
            .map_err(EngineError::from)?;
        // The end offsets (lag) moved: the console's feed may send a snapshot.
        self.shared.changed.notify_one();
        Ok(placed)
    }

    /// Creates (true) or updates (false) a group; answers once its definition is durable.
    /// `StartFrom::Latest` with an empty map means "from the end offsets as of now".
    pub async fn subscribe(&self, spec: SubscriptionSpec) -> Result<bool, EngineError> {
        self.ask(|reply| Command::Subscribe {
            spec: Box::new(spec),
            reply,
        })
        .await
    }

    pub async fn subscription(&self, group: &GroupName) -> Result<SubscriptionInfo, EngineError> {
        let group = group.clone();
        self.ask(|reply| Command::Subscription { group, reply })
            .await
    }

    /// Removes a group; answers once the removal is durable.
    pub async fn unsubscribe(&self, group: &GroupName) -> Result<(), EngineError> {
        let group = group.clone();
        self.ask(|reply| Command::Unsubscribe { group, reply })
            .await
    }

    /// Long-poll: up to `max` deliveries, waiting up to `wait_ms` for the first.
    pub async fn poll(
        &self,
        group: &GroupName,
        client: &ClientId,
        max: u32,
        wait_ms: u64,
    ) -> Result<Vec<Delivery>, EngineError> {
        let (group, client) = (group.clone(), client.clone());
        self.ask(|reply| Command::Poll {
            group,
            client,
            max,
            wait_ms,
            reply,
        })
        .await
    }

    /// Opens a stream session for one client of a group: deliveries arrive in the stream's
    /// queue, up to `window` at a time, until the stream is dropped. A session the client
    /// had (stream or long-poll) ends, and what it held comes again on this one.
    pub async fn open_stream(
        &self,
        group: &GroupName,
        client: &ClientId,
        window: u32,
    ) -> Result<Stream, EngineError> {
        let (group, client) = (group.clone(), client.clone());
        self.ask(|reply| Command::OpenStream {
            group,
            client,
            window,
            reply,
        })
        .await
    }

    pub async fn settle(
        &self,
        group: &GroupName,
        how: Settling,
        ids: Vec<DeliveryId>,
    ) -> Result<Vec<Settle>, EngineError> {
        let group = group.clone();
        self.ask(|reply| Command::Settle {
            group,
            how,
            ids,
            reply,
        })
        .await
    }

    // ----- admin -----

    pub async fn subscriptions(&self) -> Result<Vec<SubscriptionInfo>, EngineError> {
        self.ask(|reply| Command::Subscriptions { reply }).await
    }

    pub async fn clients(&self) -> Result<Vec<ClientInfo>, EngineError> {
        self.ask(|reply| Command::Clients { reply }).await
    }

    /// Disconnects a client from every group: what it holds is redelivered at once.
    pub async fn evict(&self, client: &ClientId) -> Result<usize, EngineError> {
        let client = client.clone();
        self.ask(|reply| Command::Evict { client, reply }).await
    }

    pub async fn offsets(&self, topic: &TopicName) -> Result<Vec<OffsetRow>, EngineError> {
        let topic = topic.clone();
        self.ask(|reply| Command::Offsets { topic, reply }).await
    }

    /// The first `max` dead letters of a group, by (partition, offset).
    pub async fn dlq(&self, group: &GroupName, max: usize) -> Result<Vec<DlqItem>, EngineError> {
        self.subscription(group).await?;
        let entries = self
            .state
            .dlq_list(group.clone(), max)
            .await
            .map_err(EngineError::from)?;
        Ok(entries
            .into_iter()
            .map(|e| DlqItem {
                topic: e.topic,
                partition: e.key.partition,
                offset: e.key.offset,
                attempts: e.attempts,
                reason: e.reason,
                dead_lettered_at_ms: e.dead_lettered_at_ms,
                body: e.body,
            })
            .collect())
    }

    /// Delivers up to `max` dead letters again to this group only, with fresh attempt
    /// counts. An entry leaves the DLQ when its replay is ACKed. Answers how many started.
    pub async fn dlq_replay(&self, group: &GroupName, max: usize) -> Result<usize, EngineError> {
        self.subscription(group).await?;
        let entries = self
            .state
            .dlq_list_for_replay(group.clone(), max)
            .await
            .map_err(EngineError::from)?;
        let keys: Vec<DlqKey> = entries.iter().map(|e| e.key.clone()).collect();
        let records = entries
            .into_iter()
            .map(|e| {
                let mut record = decode_record((e.key.offset, e.body));
                // A record that never decoded keeps the reason it was dead-lettered with: a
                // broker record that is not a CloudEvent (Kafka) is kept as its raw value,
                // which the stored-form decoder would describe differently.
                if let (RecordMeta::Undecodable(_), Some(why)) = (
                    &record.meta,
                    e.reason.strip_prefix(DeadLetterReason::UNDECODABLE_PREFIX),
                ) {
                    record.meta = RecordMeta::Undecodable(Arc::from(why));
                }
                (e.key.partition, record)
            })
            .collect();
        let replay_group = group.clone();
        let started = self
            .ask(|reply| Command::Replay {
                group: replay_group,
                records,
                reply,
            })
            .await;
        if started.is_err() {
            self.state.dlq_replay_refused(group, &keys);
        }
        started
    }

    /// Operator rewind (or skip) of one partition of a group; answers once durable. An
    /// offset outside what the log holds is refused.
    pub async fn seek(
        &self,
        group: &GroupName,
        partition: Partition,
        offset: Offset,
    ) -> Result<(), EngineError> {
        let group = group.clone();
        self.ask(|reply| Command::Seek {
            group,
            partition,
            offset,
            clamp: false,
            reply,
        })
        .await
        .map(|_| ())
    }

    /// Seek by time: one partition of a group restarts at the first offset appended (on
    /// Kafka: timestamped) at or after `time_ms` (ms since the Unix epoch) — the earliest
    /// offset for a time before every record, the end for one after them all. The log
    /// resolves the time; the core's `Seek` takes the offset. Answers the offset, once
    /// durable.
    pub async fn seek_to_time(
        &self,
        group: &GroupName,
        partition: Partition,
        time_ms: u64,
    ) -> Result<Offset, EngineError> {
        let topic = self.subscription(group).await?.spec.topic;
        let offset = self
            .log
            .offset_for_time(topic, partition, time_ms)
            .await
            .map_err(super::api::topic_error)?;
        let group = group.clone();
        self.ask(|reply| Command::Seek {
            group,
            partition,
            offset,
            clamp: true,
            reply,
        })
        .await
    }

    /// Sets a topic's publish rate limit, durably.
    pub async fn set_rate_limit(
        &self,
        topic: &TopicName,
        rule: RateRule,
    ) -> Result<(), EngineError> {
        let now = Instant::now().duration_since(self.start).as_millis() as u64;
        // Validate on a scratch limiter first so a bad rule changes nothing anywhere.
        {
            let limiter = self.limiter.lock().unwrap_or_else(|p| p.into_inner());
            let mut scratch = limiter.clone();
            scratch
                .set_rule(now, topic.clone(), rule)
                .map_err(|e| EngineError::BadRequest(e.to_string()))?;
        }
        self.state
            .put_rate_rule(topic.clone(), Some(rule))
            .await
            .map_err(EngineError::from)?;
        let mut limiter = self.limiter.lock().unwrap_or_else(|p| p.into_inner());
        limiter
            .set_rule(now, topic.clone(), rule)
            .map_err(|e| EngineError::BadRequest(e.to_string()))?;
        self.shared.changed.notify_one();
        Ok(())
    }

    /// Every topic's publish rate rule, by topic.
    pub fn rate_rules(&self) -> Vec<(TopicName, RateRule)> {
        let limiter = self.limiter.lock().unwrap_or_else(|p| p.into_inner());
        let mut rules: Vec<(TopicName, RateRule)> =
            limiter.rules().map(|(t, r)| (t.clone(), r)).collect();
        rules.sort_by(|a, b| a.0.cmp(&b.0));
        rules
    }

    /// Waits until what the views show may have changed since the last call returned (a
    /// change in between is not lost: it returns at once). One waiter: the console's feed.
    pub async fn changed(&self) {
        self.shared.changed.notified().await;
    }

    /// The groups that push to a webhook. Cheap (definitions only, no progress views), so
    /// pushers can be matched often.
    pub async fn push_targets(&self) -> Result<Vec<super::PushTarget>, EngineError> {
        self.ask(|reply| Command::PushTargets { reply }).await
    }

    pub async fn metrics_snapshot(&self) -> Result<MetricsSnapshot, EngineError> {
        let mut snapshot = self.ask(|reply| Command::Metrics { reply }).await?;
        snapshot.log = self.log.metrics();
        Ok(snapshot)
    }

    /// Stops taking requests, flushes progress, and waits until it is durable.
    pub async fn shutdown(&self) -> Result<(), EngineError> {
        self.ask(|reply| Command::Shutdown { reply }).await
    }
}
