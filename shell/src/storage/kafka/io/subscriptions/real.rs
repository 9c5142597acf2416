//! The subscriptions topic on a real broker: read to its end at start (off the async
//! workers), then tailed by the watcher thread.

use std::sync::Arc;
use std::time::Duration;

use madsim_rdkafka::consumer::Consumer;
use madsim_rdkafka::Message;
use madsim_rdkafka::{Offset as KOffset, TopicPartitionList};
use madsim_tokio as tokio;
use unimesh_core::{GroupName, SubscriptionSpec};

use super::{decoded, take_newest, Newest, READER};
use crate::storage::kafka::io::client_log::{ClientLog, LoggedConsumer};
use crate::storage::kafka::io::log::{block_on, KafkaLog};
use crate::storage::kafka::io::whole;
use crate::storage::kafka::io::ClientRole;
use crate::storage::ports::{StorageError, SubscriptionSink};

/// The group definitions the topic holds, read to its end, ordered by group name: the
/// newest record of each key, deletions and records that do not decode left out (logged,
/// as the watcher does), read on a blocking thread.
pub async fn definitions(log: &KafkaLog) -> Result<Vec<SubscriptionSpec>, StorageError> {
    let log = log.clone();
    tokio::task::spawn_blocking(move || read_definitions(&log))
        .await
        .map_err(|e| StorageError::failed("the read failed", e))?
}

/// [`definitions`], blocking.
fn read_definitions(log: &KafkaLog) -> Result<Vec<SubscriptionSpec>, StorageError> {
    let mut newest = Newest::new();
    let name = log.settings().subscriptions_topic.clone();
    whole::read(log, &name, &READER, &mut |m| take_newest(&mut newest, m))?;
    Ok(decoded(newest))
}

/// Starts the watcher thread; it ends within a poll (100 ms) of the engine's stop. Join it
/// before the process exits: the thread holds the engine's sink and a librdkafka consumer,
/// and one dropped while `exit` runs C++ static destructors aborted the process ("pthread
/// lock: Invalid argument", a SIGTERMed instance in `tests/kafka_failover.rs`).
pub fn watch(
    log: &KafkaLog,
    engine: impl SubscriptionSink,
) -> Result<std::thread::JoinHandle<()>, StorageError> {
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
    let runtime = log.inner.side.runtime.clone();
    let consumer: LoggedConsumer = block_on(
        &runtime,
        c.create_with_context(ClientLog::new("subscriptions reader")),
    )
    .map_err(|e| StorageError::failed("cannot create the subscriptions reader", e))?;
    let meta = block_on(
        &runtime,
        consumer.fetch_metadata(Some(&topic), s.request_timeout),
    )
    .map_err(|e| StorageError::failed("subscriptions topic metadata", e))?;
    let n = meta
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .map_or(0, |t| t.partitions().len() as i32);
    if n == 0 {
        return Err(StorageError::unavailable(format!(
            "subscriptions topic {topic} has no partitions"
        )));
    }
    let mut tpl = TopicPartitionList::new();
    for p in 0..n {
        let _ = tpl.add_partition_offset(&topic, p, KOffset::Beginning);
    }
    consumer
        .assign(&tpl)
        .map_err(|e| StorageError::failed("cannot read the subscriptions topic", e))?;
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
        .map_err(|e| StorageError::failed("cannot start the subscriptions watcher", e))?;
    Ok(watcher)
}
