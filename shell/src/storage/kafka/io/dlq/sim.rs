//! Reading a DLQ topic from madsim-rdkafka's simulated broker: the topic read to its end
//! by the simulated consumer, which polls asynchronously
//! ([`crate::storage::kafka::io::whole`]).

use unimesh_core::{GroupName, TopicName};

use super::{dlq_topic, take, Ledger, READER};
use crate::storage::kafka::io::log::KafkaLog;
use crate::storage::kafka::io::whole;
use crate::storage::ports::StorageError;

/// The DLQ ledger of `group` (reading `topic`), read to its end ([`list`]).
pub async fn ledger(
    log: KafkaLog,
    group: GroupName,
    topic: TopicName,
) -> Result<Ledger, StorageError> {
    list(&log, &group, &topic).await
}

/// The dead letters of `group` (reading `topic`), as `real.rs` reads them, under madsim.
async fn list(
    log: &KafkaLog,
    group: &GroupName,
    topic: &TopicName,
) -> Result<Ledger, StorageError> {
    let name = dlq_topic(topic.as_str(), group.as_str());
    let mut ledger = Ledger::default();
    whole::read(log, &name, &READER, &mut |m| {
        take(&mut ledger, m, group, topic)
    })
    .await?;
    Ok(ledger)
}
