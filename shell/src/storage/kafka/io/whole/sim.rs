//! A whole topic read to its end from madsim-rdkafka's simulated broker.

use std::collections::BTreeMap;
use std::time::Duration;

use madsim_rdkafka::message::BorrowedMessage;
use madsim_rdkafka::{Message, Offset as KOffset, TopicPartitionList};
use madsim_tokio as tokio;

use super::Reader;
use crate::storage::kafka::io::client_log::{ClientLog, LoggedConsumer};
use crate::storage::kafka::io::log::KafkaLog;
use crate::storage::kafka::io::ClientRole;
use crate::storage::ports::StorageError;

/// `real.rs`'s `read` under madsim: the simulated consumer polls asynchronously and has no
/// `position` (the offsets of what it returned tell how far it read).
pub async fn read(
    log: &KafkaLog,
    name: &str,
    who: &Reader<'_>,
    visit: &mut (dyn FnMut(&BorrowedMessage<'_>) + Send),
) -> Result<(), StorageError> {
    let s = log.settings();
    let what = who.what;
    // The simulated broker takes no `group.id`, and always answers an end offset: the
    // reader's id and what it does without a claimed end go unused here.
    let _ = (who.group_id, who.unclaimed);
    let mut c = s.client_config(ClientRole::Consumer);
    c.set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("auto.offset.reset", "earliest");
    let consumer: LoggedConsumer = c
        .create_with_context(ClientLog::new(who.role))
        .await
        .map_err(|e| StorageError::failed(&format!("cannot create the {}", who.role), e))?;
    let n = match consumer.fetch_metadata(Some(name), s.request_timeout).await {
        Ok(meta) => meta
            .topics()
            .iter()
            .find(|t| t.name() == name)
            .map_or(0, |t| t.partitions().len() as i32),
        // The broker has no such topic.
        Err(_) => 0,
    };
    if n == 0 {
        return Ok(());
    }
    let mut tpl = TopicPartitionList::new();
    let mut highs = BTreeMap::new();
    for p in 0..n {
        let _ = tpl.add_partition_offset(name, p, KOffset::Beginning);
        let (_, hi) = consumer
            .fetch_watermarks(name, p, s.request_timeout)
            .await
            .map_err(|e| StorageError::failed(&format!("{what} offsets"), e))?;
        highs.insert(p, hi);
    }
    consumer
        .assign(&tpl)
        .map_err(|e| StorageError::failed(&format!("cannot read the {what}"), e))?;
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + s.request_timeout;
    loop {
        let done = highs
            .iter()
            .all(|(p, &hi)| hi <= 0 || next.get(p).is_some_and(|&o| o >= hi));
        if done {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(StorageError::unavailable(format!(
                "the {what} {name} could not be read to its end"
            )));
        }
        let Some(polled) = consumer.poll(Duration::from_millis(20)).await else {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        };
        let m = polled.map_err(|e| StorageError::failed(&format!("{what} read"), e))?;
        next.insert(m.partition(), m.offset() + 1);
        visit(&m);
    }
}
