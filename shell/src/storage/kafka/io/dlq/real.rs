//! Reading a DLQ topic from a real broker: the topic read to its end by librdkafka's
//! consumer ([`crate::storage::kafka::io::whole`]), blocking, off the async workers.

use madsim_tokio as tokio;
use unimesh_core::{GroupName, TopicName};

use super::{dlq_topic, take, Ledger, READER};
use crate::storage::kafka::io::log::KafkaLog;
use crate::storage::kafka::io::whole;
use crate::storage::ports::StorageError;

/// The DLQ ledger of `group` (reading `topic`), read to its end ([`list`]) on a blocking
/// thread.
pub async fn ledger(
    log: KafkaLog,
    group: GroupName,
    topic: TopicName,
) -> Result<Ledger, StorageError> {
    tokio::task::spawn_blocking(move || list(&log, &group, &topic))
        .await
        .map_err(|e| StorageError::failed("DLQ read failed", e))?
}

/// The dead letters of `group` (reading `topic`): the topic read to its end. Blocking:
/// run it off the async workers. A topic the broker does not have: nothing was ever
/// dead-lettered for the group.
fn list(log: &KafkaLog, group: &GroupName, topic: &TopicName) -> Result<Ledger, StorageError> {
    let name = dlq_topic(topic.as_str(), group.as_str());
    let mut ledger = Ledger::default();
    whole::read(log, &name, &READER, &mut |m| {
        take(&mut ledger, m, group, topic)
    })?;
    Ok(ledger)
}
