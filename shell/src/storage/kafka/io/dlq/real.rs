//! Reading a DLQ topic from a real broker: librdkafka's consumer, blocking, off the async
//! workers.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use madsim_rdkafka::consumer::Consumer;
use madsim_rdkafka::error::KafkaError;
use madsim_rdkafka::{Message, Offset as KOffset, TopicPartitionList};
use madsim_tokio as tokio;
use unimesh_core::{GroupName, TopicName};

use super::{dlq_topic, take, Ledger};
use crate::storage::kafka::io::client_log::{ClientLog, LoggedConsumer};
use crate::storage::kafka::io::log::KafkaLog;
use crate::storage::kafka::io::ClientRole;
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
        .map_err(StorageError::unavailable)
}

/// The dead letters of `group` (reading `topic`): the topic read to its end. Blocking:
/// run it off the async workers.
///
/// "Its end" is where this reader's own fetches reached the end of every partition
/// (librdkafka's partition EOF, from the high watermark of a fetch answer this reader,
/// made for this read, asked for), and at least the end the broker claims: a claimed end
/// alone is not evidence (tansu 0.6.0 claims the start of a partition's last batch plus
/// one, and a browse stopped there showed 6 of 10 entries; issue 18).
fn list(log: &KafkaLog, group: &GroupName, topic: &TopicName) -> Result<Ledger, String> {
    let s = log.settings();
    let name = dlq_topic(topic.as_str(), group.as_str());
    let runtime = &log.inner.side.runtime;
    let mut c = s.client_config(ClientRole::Consumer);
    c.set("group.id", format!("{}dlq-reader", s.group_prefix))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest");
    let consumer: LoggedConsumer = runtime
        .block_on(c.create_with_context(ClientLog::new("DLQ reader")))
        .map_err(|e| format!("cannot create the DLQ reader: {e}"))?;
    let meta = runtime
        .block_on(consumer.fetch_metadata(Some(&name), s.request_timeout))
        .map_err(|e| format!("DLQ topic metadata: {e}"))?;
    let n = meta
        .topics()
        .iter()
        .find(|t| t.name() == name && t.error().is_none())
        .map_or(0, |t| t.partitions().len() as i32);
    if n == 0 {
        // Nothing was ever dead-lettered for the group.
        return Ok(Ledger::default());
    }
    let mut tpl = TopicPartitionList::new();
    let mut highs = BTreeMap::new();
    for p in 0..n {
        let _ = tpl.add_partition_offset(&name, p, KOffset::Beginning);
        let (_, hi) = runtime
            .block_on(consumer.fetch_watermarks(&name, p, s.request_timeout))
            .map_err(|e| format!("DLQ topic offsets: {e}"))?;
        highs.insert(p, hi);
    }
    consumer
        .assign(&tpl)
        .map_err(|e| format!("cannot read the DLQ topic: {e}"))?;
    let mut ledger = Ledger::default();
    let mut at_end = std::collections::BTreeSet::new();
    let deadline = Instant::now() + s.request_timeout;
    loop {
        let past_claims = consumer.position().is_ok_and(|pos| {
            highs.iter().all(|(&p, &hi)| {
                hi <= 0
                    || pos
                        .find_partition(&name, p)
                        .is_some_and(|e| matches!(e.offset(), KOffset::Offset(o) if o >= hi))
            })
        });
        if past_claims && at_end.len() == highs.len() {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!("the DLQ topic {name} could not be read to its end"));
        }
        match consumer.poll(Duration::from_millis(20)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(e)) => return Err(format!("DLQ topic read: {e}")),
            Some(Ok(m)) => {
                at_end.remove(&m.partition());
                take(&mut ledger, &m, group, topic);
            }
        }
    }
    Ok(ledger)
}
