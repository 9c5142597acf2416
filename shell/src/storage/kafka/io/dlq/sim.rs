//! Reading a DLQ topic from madsim-rdkafka's simulated broker: the simulated consumer
//! polls asynchronously.

use std::collections::BTreeMap;
use std::time::Duration;

use madsim_rdkafka::{Message, Offset as KOffset, TopicPartitionList};
use madsim_tokio as tokio;
use unimesh_core::{GroupName, TopicName};

use super::{dlq_topic, take, Ledger};
use crate::storage::kafka::io::client_log::{ClientLog, LoggedConsumer};
use crate::storage::kafka::io::log::KafkaLog;
use crate::storage::kafka::io::ClientRole;
use crate::storage::ports::StorageError;

/// The DLQ ledger of `group` (reading `topic`), read to its end ([`list`]).
pub async fn ledger(
    log: KafkaLog,
    group: GroupName,
    topic: TopicName,
) -> Result<Ledger, StorageError> {
    list(&log, &group, &topic)
        .await
        .map_err(StorageError::unavailable)
}

/// The dead letters of `group` (reading `topic`), as `real.rs` reads them, under madsim:
/// the simulated consumer polls asynchronously and has no `position` (the offsets of what
/// it returned tell how far it read).
async fn list(log: &KafkaLog, group: &GroupName, topic: &TopicName) -> Result<Ledger, String> {
    let s = log.settings();
    let name = dlq_topic(topic.as_str(), group.as_str());
    let mut c = s.client_config(ClientRole::Consumer);
    c.set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("auto.offset.reset", "earliest");
    let consumer: LoggedConsumer = c
        .create_with_context(ClientLog::new("DLQ reader"))
        .await
        .map_err(|e| format!("cannot create the DLQ reader: {e}"))?;
    let n = match consumer
        .fetch_metadata(Some(&name), s.request_timeout)
        .await
    {
        Ok(meta) => meta
            .topics()
            .iter()
            .find(|t| t.name() == name)
            .map_or(0, |t| t.partitions().len() as i32),
        // Nothing was ever dead-lettered for the group: the broker has no such topic.
        Err(_) => 0,
    };
    if n == 0 {
        return Ok(Ledger::default());
    }
    let mut tpl = TopicPartitionList::new();
    let mut highs = BTreeMap::new();
    for p in 0..n {
        let _ = tpl.add_partition_offset(&name, p, KOffset::Beginning);
        let (_, hi) = consumer
            .fetch_watermarks(&name, p, s.request_timeout)
            .await
            .map_err(|e| format!("DLQ topic offsets: {e}"))?;
        highs.insert(p, hi);
    }
    consumer
        .assign(&tpl)
        .map_err(|e| format!("cannot read the DLQ topic: {e}"))?;
    let mut ledger = Ledger::default();
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + s.request_timeout;
    loop {
        let done = highs
            .iter()
            .all(|(p, &hi)| hi <= 0 || next.get(p).is_some_and(|&o| o >= hi));
        if done {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            return Err(format!("the DLQ topic {name} could not be read to its end"));
        }
        let Some(polled) = consumer.poll(Duration::from_millis(20)).await else {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        };
        let m = polled.map_err(|e| format!("DLQ topic read: {e}"))?;
        next.insert(m.partition(), m.offset() + 1);
        take(&mut ledger, &m, group, topic);
    }
    Ok(ledger)
}
