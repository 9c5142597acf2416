//! Subscriptions shared by every instance of a cluster: the durable group definitions live
//! in a compacted topic keyed by group name (value: the state store's subscription
//! encoding; a tombstone deletes the group), so a group created on one instance is served
//! by all.
//!
//! The topic is the only store of definitions (docs/DESIGN.md §8, "A state batch on Kafka
//! is durable as one"): the node's local store keeps none. Writes: the state port writes
//! every definition and deletion of a persist batch here (see `progress::KafkaState`).
//! Reads: at start, [`definitions`] reads the topic to its end before the engine is built,
//! so a restart serves what the topic holds, whatever an earlier version kept locally;
//! then a watcher thread tails the topic from its beginning and hands each record to a
//! [`SubscriptionSink`] (the engine, `engine::shared`), which applies what differs from the
//! engine's definition through its own `subscribe`/`unsubscribe`; since applying writes
//! the same bytes back, and equal bytes are not applied again, the instances converge
//! without ping-pong.

use std::collections::BTreeMap;
#[cfg(not(madsim))]
use std::sync::Arc;
#[cfg(not(madsim))]
use std::time::Duration;

#[cfg(not(madsim))]
use madsim_rdkafka::consumer::Consumer;

#[cfg(not(madsim))]
use super::client_log::{ClientLog, LoggedConsumer};
use madsim_rdkafka::Message;
#[cfg(not(madsim))]
use madsim_rdkafka::{Offset as KOffset, TopicPartitionList};
use unimesh_core::{GroupName, SubscriptionSpec};

use super::log::KafkaLog;
use super::whole::Reader;
#[cfg(not(madsim))]
use super::ClientRole;
#[cfg(not(madsim))]
use crate::storage::ports::SubscriptionSink;
use crate::storage::state::codec::decode_subscription;

/// Who reads the topic at start ([`super::whole::read`]).
const READER: Reader<'static> = Reader {
    role: "subscriptions reader",
    group_id: "subscriptions-reader",
    what: "subscriptions topic",
};

/// The newest record of each key, as read: a group's encoded definition, `None` for a
/// deletion.
type Newest = BTreeMap<String, Option<Vec<u8>>>;

fn take_newest(newest: &mut Newest, m: &madsim_rdkafka::message::BorrowedMessage<'_>) {
    if let Some(key) = m.key().and_then(|k| std::str::from_utf8(k).ok()) {
        newest.insert(key.to_owned(), m.payload().map(<[u8]>::to_vec));
    }
}

/// The group definitions the topic holds, read to its end, ordered by group name: the
/// newest record of each key, deletions and records that do not decode left out (logged,
/// as the watcher does). Blocking: run it off the async workers.
#[cfg(not(madsim))]
pub fn definitions(log: &KafkaLog) -> Result<Vec<SubscriptionSpec>, String> {
    let mut newest = Newest::new();
    let name = log.settings().subscriptions_topic.clone();
    super::whole::read(log, &name, &READER, &mut |m| take_newest(&mut newest, m))?;
    Ok(decoded(newest))
}

/// [`definitions`] under madsim.
#[cfg(madsim)]
pub async fn definitions(log: &KafkaLog) -> Result<Vec<SubscriptionSpec>, String> {
    let mut newest = Newest::new();
    let name = log.settings().subscriptions_topic.clone();
    super::whole::read(log, &name, &READER, &mut |m| take_newest(&mut newest, m)).await?;
    Ok(decoded(newest))
}

/// The definitions among the newest records (see [`definitions`]).
fn decoded(newest: Newest) -> Vec<SubscriptionSpec> {
    let mut out = Vec::with_capacity(newest.len());
    for (key, value) in newest {
        let Some(bytes) = value else { continue };
        out.extend(definition(&key, &bytes));
    }
    out
}

/// The definition a record of the topic (key `key`, value `bytes`) holds; `None`, logged,
/// when it does not decode. Public so a simulation can read the topic as a restart does.
pub fn definition(key: &str, bytes: &[u8]) -> Option<SubscriptionSpec> {
    let Ok(group) = GroupName::new(key) else {
        tracing::warn!(%key, "subscriptions record without a group name ignored");
        return None;
    };
    match decode_subscription(group.as_str(), &group, bytes) {
        Ok(spec) => Some(spec),
        Err(e) => {
            tracing::error!(%group, error = %e, "corrupt subscription record ignored");
            None
        }
    }
}

/// Starts the watcher thread; it ends within a poll (100 ms) of the engine's stop. Join it
/// before the process exits: the thread holds the engine's sink and a librdkafka consumer,
/// and one dropped while `exit` runs C++ static destructors aborted the process ("pthread
/// lock: Invalid argument", a SIGTERMed instance in `tests/kafka_failover.rs`).
#[cfg(not(madsim))]
pub fn watch(
    log: &KafkaLog,
    engine: impl SubscriptionSink,
) -> Result<std::thread::JoinHandle<()>, String> {
    let s = log.settings();
    let topic = s.subscriptions_topic.clone();
    let mut c = s.client_config(ClientRole::Consumer);
    c.set(
        "group.id",
        format!("{}subscriptions-reader", s.group_prefix),
    )
    .set("enable.auto.commit", "false")
    .set("enable.partition.eof", "false")
    .set("auto.offset.reset", "earliest");
    let runtime = log.inner.runtime.clone();
    let consumer: LoggedConsumer = super::log::block_on(
        &runtime,
        c.create_with_context(ClientLog::new("subscriptions reader")),
    )
    .map_err(|e| format!("cannot create the subscriptions reader: {e}"))?;
    let meta = super::log::block_on(
        &runtime,
        consumer.fetch_metadata(Some(&topic), s.request_timeout),
    )
    .map_err(|e| format!("subscriptions topic metadata: {e}"))?;
    let n = meta
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .map_or(0, |t| t.partitions().len() as i32);
    if n == 0 {
        return Err(format!("subscriptions topic {topic} has no partitions"));
    }
    let mut tpl = TopicPartitionList::new();
    for p in 0..n {
        let _ = tpl.add_partition_offset(&topic, p, KOffset::Beginning);
    }
    consumer
        .assign(&tpl)
        .map_err(|e| format!("cannot read the subscriptions topic: {e}"))?;
    let consumer = Arc::new(consumer);
    let watcher = std::thread::Builder::new()
        .name("kafka-subscriptions".into())
        .spawn(move || {
            // Until the engine stops; a broker outage only pauses the reads.
            while engine.is_running() {
                let Some(polled) = consumer.poll(Duration::from_millis(100)) else {
                    continue;
                };
                let m = match polled {
                    Ok(m) => m,
                    Err(e) => {
                        tracing::warn!(error = %e, "subscriptions topic read error");
                        continue;
                    }
                };
                let Some(group) = m
                    .key()
                    .and_then(|k| std::str::from_utf8(k).ok())
                    .and_then(|k| GroupName::new(k).ok())
                else {
                    tracing::warn!(
                        offset = m.offset(),
                        "subscriptions record without a group name ignored"
                    );
                    continue;
                };
                let value = m.payload().map(<[u8]>::to_vec);
                runtime.block_on(engine.apply_shared(group, value));
            }
        })
        .map_err(|e| format!("cannot start the subscriptions watcher: {e}"))?;
    Ok(watcher)
}
