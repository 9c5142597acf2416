//! A whole topic read to its end, once: the DLQ ledger of a group (`dlq`) and, at start,
//! the subscription definitions (`subscriptions`).
//!
//! "Its end" is where this reader's own fetches reached the end of every partition
//! (librdkafka's partition EOF, from the high watermark of a fetch answer this reader,
//! made for this read, asked for), and at least the end the broker claims: a claimed end
//! alone is not evidence (tansu 0.6.0 claims the start of a partition's last batch plus
//! one, and a DLQ browse stopped there showed 6 of 10 entries; issue 18).

use std::collections::BTreeMap;
use std::time::Duration;
#[cfg(not(madsim))]
use std::time::Instant;

#[cfg(not(madsim))]
use madsim_rdkafka::consumer::Consumer;
#[cfg(not(madsim))]
use madsim_rdkafka::error::KafkaError;
use madsim_rdkafka::message::BorrowedMessage;
use madsim_rdkafka::{Message, Offset as KOffset, TopicPartitionList};

use super::client_log::{ClientLog, LoggedConsumer};
use super::log::KafkaLog;
use super::ClientRole;

/// Who reads: the consumer's role in the logs (`DLQ reader`), its `group.id` suffix (it
/// joins no group; the id names it to the broker) and what the topic is, for errors.
pub(super) struct Reader<'a> {
    pub role: &'static str,
    // The simulated broker takes no `group.id`.
    #[cfg_attr(madsim, allow(dead_code))]
    pub group_id: &'static str,
    pub what: &'a str,
}

/// Hands every record of topic `name` to `visit`, in offset order per partition, until
/// the end (see the module documentation). A topic the broker does not have reads as
/// empty. Blocking: run it off the async workers.
#[cfg(not(madsim))]
pub(super) fn read(
    log: &KafkaLog,
    name: &str,
    who: &Reader<'_>,
    visit: &mut dyn FnMut(&BorrowedMessage<'_>),
) -> Result<(), String> {
    let s = log.settings();
    let what = who.what;
    let runtime = &log.inner.runtime;
    let mut c = s.client_config(ClientRole::Consumer);
    c.set("group.id", format!("{}{}", s.group_prefix, who.group_id))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("auto.offset.reset", "earliest");
    let consumer: LoggedConsumer = runtime
        .block_on(c.create_with_context(ClientLog::new(who.role)))
        .map_err(|e| format!("cannot create the {}: {e}", who.role))?;
    let meta = runtime
        .block_on(consumer.fetch_metadata(Some(name), s.request_timeout))
        .map_err(|e| format!("{what} metadata: {e}"))?;
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
        let _ = tpl.add_partition_offset(name, p, KOffset::Beginning);
        let (_, hi) = runtime
            .block_on(consumer.fetch_watermarks(name, p, s.request_timeout))
            .map_err(|e| format!("{what} offsets: {e}"))?;
        highs.insert(p, hi);
    }
    consumer
        .assign(&tpl)
        .map_err(|e| format!("cannot read the {what}: {e}"))?;
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
            return Err(format!("the {what} {name} could not be read to its end"));
        }
        match consumer.poll(Duration::from_millis(20)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p);
            }
            Some(Err(e)) => return Err(format!("{what} read: {e}")),
            Some(Ok(m)) => {
                at_end.remove(&m.partition());
                visit(&m);
            }
        }
    }
}

/// [`read`] under madsim: the simulated consumer polls asynchronously and has no
/// `position` (the offsets of what it returned tell how far it read).
#[cfg(madsim)]
pub(super) async fn read(
    log: &KafkaLog,
    name: &str,
    who: &Reader<'_>,
    visit: &mut (dyn FnMut(&BorrowedMessage<'_>) + Send),
) -> Result<(), String> {
    use madsim_tokio as tokio;
    let s = log.settings();
    let what = who.what;
    let mut c = s.client_config(ClientRole::Consumer);
    c.set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("auto.offset.reset", "earliest");
    let consumer: LoggedConsumer = c
        .create_with_context(ClientLog::new(who.role))
        .await
        .map_err(|e| format!("cannot create the {}: {e}", who.role))?;
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
            .map_err(|e| format!("{what} offsets: {e}"))?;
        highs.insert(p, hi);
    }
    consumer
        .assign(&tpl)
        .map_err(|e| format!("cannot read the {what}: {e}"))?;
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
            return Err(format!("the {what} {name} could not be read to its end"));
        }
        let Some(polled) = consumer.poll(Duration::from_millis(20)).await else {
            tokio::time::sleep(Duration::from_millis(5)).await;
            continue;
        };
        let m = polled.map_err(|e| format!("{what} read: {e}"))?;
        next.insert(m.partition(), m.offset() + 1);
        visit(&m);
    }
}
