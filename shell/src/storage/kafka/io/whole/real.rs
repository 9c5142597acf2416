//! A whole topic read to its end from a real broker: librdkafka's consumer, blocking.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use madsim_rdkafka::consumer::Consumer;
use madsim_rdkafka::error::KafkaError;
use madsim_rdkafka::message::BorrowedMessage;
use madsim_rdkafka::{Message, Offset as KOffset, TopicPartitionList};

use super::{Reader, Unclaimed};
use crate::storage::kafka::io::client_log::{ClientLog, LoggedConsumer};
use crate::storage::kafka::io::log::KafkaLog;
use crate::storage::kafka::io::ClientRole;
use crate::storage::ports::StorageError;

/// Hands every record of topic `name` to `visit`, in offset order per partition, until
/// the end (see the module documentation). A topic the broker does not have reads as
/// empty. Blocking: run it off the async workers.
pub fn read(
    log: &KafkaLog,
    name: &str,
    who: &Reader<'_>,
    visit: &mut dyn FnMut(&BorrowedMessage<'_>),
) -> Result<(), StorageError> {
    let s = log.settings();
    let what = who.what;
    let runtime = &log.inner.side.runtime;
    let mut c = s.client_config(ClientRole::Consumer);
    c.set("group.id", format!("{}{}", s.group_prefix, who.group_id))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest");
    let consumer: LoggedConsumer = runtime
        .block_on(c.create_with_context(ClientLog::new(who.role)))
        .map_err(|e| StorageError::failed(&format!("cannot create the {}", who.role), e))?;
    let meta = runtime
        .block_on(consumer.fetch_metadata(Some(name), s.request_timeout))
        .map_err(|e| StorageError::failed(&format!("{what} metadata"), e))?;
    let n = meta
        .topics()
        .iter()
        .find(|t| t.name() == name && t.error().is_none())
        .map_or(0, |t| t.partitions().len() as i32);
    if n == 0 {
        return Ok(());
    }
    let mut tpl = TopicPartitionList::new();
    let mut highs = BTreeMap::new();
    for p in 0..n {
        // An offset, not `Beginning`: a logical offset is resolved by an offsets query.
        let _ = tpl.add_partition_offset(name, p, KOffset::Offset(0));
        let hi = match runtime.block_on(consumer.fetch_watermarks(name, p, s.request_timeout)) {
            Ok((_, hi)) => hi,
            Err(e) if who.unclaimed == Unclaimed::ReadsToItsEnd => {
                tracing::warn!(topic = %name, partition = p, error = %e, "the broker did not say where the {what} ends; reading until this reader's own fetches reach its end");
                0
            }
            Err(e) => return Err(StorageError::failed(&format!("{what} offsets"), e)),
        };
        highs.insert(p, hi);
    }
    consumer
        .assign(&tpl)
        .map_err(|e| StorageError::failed(&format!("cannot read the {what}"), e))?;
    let mut at_end = std::collections::BTreeSet::new();
    let deadline = Instant::now() + s.request_timeout;
    loop {
        let past_claims = consumer.position().is_ok_and(|pos| {
            highs.iter().all(|(&p, &hi)| {
                hi <= 0
                    || pos
                        .find_partition(name, p)
                        .is_some_and(|e| matches!(e.offset(), KOffset::Offset(o) if o >= hi))
            })
        });
        if past_claims && at_end.len() == highs.len() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(StorageError::unavailable(format!(
                "the {what} {name} could not be read to its end"
            )));
        }
        match consumer.poll(Duration::from_millis(20)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(e)) => return Err(StorageError::failed(&format!("{what} read"), e)),
            Some(Ok(m)) => {
                at_end.remove(&m.partition());
                visit(&m);
            }
        }
    }
}
