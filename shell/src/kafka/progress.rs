//! The progress topic: each (group, topic, partition)'s ACK ranges and attempt counts above
//! its committed offset, where any instance can read them.
//!
//! A compacted topic keyed by `<group>\n<topic>\n<partition>`, each value a whole
//! [`Checkpoint`] in its own versioned, checksummed encoding, so the newest record of a key
//! is the lane's state. Commit metadata would be the obvious place, but some
//! Kafka-protocol brokers store it and never return it; a topic works on all of them.
//!
//! Order of writes (the core's): a lane's checkpoint is written here, acknowledged by every
//! in-sync replica, and only then does the core commit its watermark to the group. So the
//! newest progress record's watermark is never below the committed offset, and an instance
//! that takes the partition over resumes exactly: no record below the watermark or inside
//! a persisted range is delivered again.
//!
//! Bounded: a checkpoint with more than `kafka.max_progress_ranges` ranges (or attempt
//! counts) keeps its watermark exact and drops the excess above it: more duplicates after
//! a takeover, never loss; counted as `progress_ranges_dropped`.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
#[cfg(not(madsim))]
use std::time::Instant;

use madsim_rdkafka::consumer::BaseConsumer;
#[cfg(not(madsim))]
use madsim_rdkafka::consumer::Consumer;
use madsim_rdkafka::producer::FutureRecord;
use madsim_rdkafka::{Message, Offset as KOffset, TopicPartitionList};
use madsim_tokio as tokio;
use unimesh_core::{
    Checkpoint, DlqKey, GroupName, LaneCheckpoint, Partition, PersistBatch, Progress, RateRule,
    TopicName,
};

use super::log::{lock, KafkaLog};
use super::KafkaSettings;
use crate::engine::{BoxFut, StatePort, StoreAdapter};
use crate::state::codec::encode_subscription;
use crate::state::{DlqEntry, Loaded};

/// The key of a lane's progress record.
pub(super) fn progress_key(group: &str, topic: &str, partition: Partition) -> String {
    format!("{group}\n{topic}\n{partition}")
}

/// The key and value of the progress record `KafkaState` writes for `lane` (with at most
/// `max_ranges` ranges), and how many ranges and attempt counts the bound dropped. Public
/// so a simulation can recognise the record at the broker.
pub fn progress_record(lane: &LaneCheckpoint, max_ranges: usize) -> (String, Vec<u8>, u64) {
    let (cp, dropped) = bounded(&lane.checkpoint, max_ranges);
    let key = progress_key(lane.group.as_str(), lane.topic.as_str(), lane.partition);
    (key, cp.encode(), dropped)
}

/// `cp` with at most `max` ranges and `max` attempt counts, and how many were dropped.
pub(super) fn bounded(cp: &Checkpoint, max: usize) -> (Checkpoint, u64) {
    let ranges = cp.progress.range_count();
    if ranges <= max && cp.attempts.len() <= max {
        return (cp.clone(), 0);
    }
    let kept: Vec<(u64, u64)> = cp.progress.ranges().take(max).collect();
    // The ranges kept are a prefix of valid ranges, so they are valid too.
    let progress = Progress::from_parts(cp.progress.watermark(), kept)
        .unwrap_or_else(|_| Progress::new(cp.progress.watermark()));
    let attempts: Vec<(u64, u32)> = cp.attempts.iter().copied().take(max).collect();
    let dropped = (ranges.saturating_sub(max) + cp.attempts.len().saturating_sub(max)) as u64;
    (Checkpoint { progress, attempts }, dropped)
}

/// Reads the progress topic into memory, up to its end offsets on demand.
pub(super) struct ProgressReader {
    consumer: BaseConsumer,
    topic: String,
    timeout: Duration,
    state: tokio::sync::Mutex<ReaderState>,
}

#[derive(Default)]
struct ReaderState {
    assigned: Option<i32>,
    view: BTreeMap<String, Checkpoint>,
    /// Under madsim (whose consumer has no `position`): the next offset to read, per
    /// partition.
    #[cfg(madsim)]
    next: BTreeMap<i32, i64>,
}

impl ProgressReader {
    pub async fn new(settings: &KafkaSettings) -> Result<Self, String> {
        let mut c = settings.client_config();
        c.set(
            "group.id",
            format!("{}progress-reader", settings.group_prefix),
        )
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("auto.offset.reset", "earliest");
        let consumer: BaseConsumer = c
            .create()
            .await
            .map_err(|e| format!("cannot create the progress reader: {e}"))?;
        Ok(Self {
            consumer,
            topic: settings.progress_topic.clone(),
            timeout: settings.request_timeout,
            state: tokio::sync::Mutex::new(ReaderState::default()),
        })
    }

    /// The newest progress of each of `partitions` of (group, topic) that has any, read
    /// after catching up with the topic's end (so a write acknowledged before this call,
    /// by any instance, is seen). Blocks its thread while polling: call it from a thread
    /// of its own (the consumer thread).
    pub async fn latest(
        &self,
        group: &GroupName,
        topic: &TopicName,
        partitions: &[Partition],
    ) -> Result<BTreeMap<Partition, Checkpoint>, String> {
        let mut st = self.state.lock().await;
        self.catch_up(&mut st).await?;
        Ok(partitions
            .iter()
            .filter_map(|&p| {
                st.view
                    .get(&progress_key(group.as_str(), topic.as_str(), p))
                    .map(|cp| (p, cp.clone()))
            })
            .collect())
    }

    async fn catch_up(&self, st: &mut ReaderState) -> Result<(), String> {
        let count = match st.assigned {
            Some(n) => n,
            None => {
                let meta = self
                    .consumer
                    .fetch_metadata(Some(&self.topic), self.timeout)
                    .await
                    .map_err(|e| format!("progress topic metadata: {e}"))?;
                let n = meta
                    .topics()
                    .iter()
                    .find(|t| t.name() == self.topic)
                    .map_or(0, |t| t.partitions().len() as i32);
                if n == 0 {
                    return Err(format!("progress topic {} has no partitions", self.topic));
                }
                let mut tpl = TopicPartitionList::new();
                for p in 0..n {
                    let _ = tpl.add_partition_offset(&self.topic, p, KOffset::Beginning);
                }
                self.consumer
                    .assign(&tpl)
                    .map_err(|e| format!("cannot read the progress topic: {e}"))?;
                st.assigned = Some(n);
                n
            }
        };
        let mut highs = BTreeMap::new();
        for p in 0..count {
            let (_, hi) = self
                .consumer
                .fetch_watermarks(&self.topic, p, self.timeout)
                .await
                .map_err(|e| format!("progress topic offsets: {e}"))?;
            highs.insert(p, hi);
        }
        self.read_up_to(st, &highs).await
    }

    /// Reads until every partition's position reaches `highs`.
    #[cfg(not(madsim))]
    async fn read_up_to(
        &self,
        st: &mut ReaderState,
        highs: &BTreeMap<i32, i64>,
    ) -> Result<(), String> {
        let deadline = Instant::now() + self.timeout;
        loop {
            let caught_up = match self.consumer.position() {
                Ok(pos) => highs.iter().all(|(&p, &hi)| {
                    hi <= 0
                        || pos
                            .find_partition(&self.topic, p)
                            .is_some_and(|e| matches!(e.offset(), KOffset::Offset(o) if o >= hi))
                }),
                Err(_) => false,
            };
            if caught_up {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "the progress topic could not be read to its end within {:?}",
                    self.timeout
                ));
            }
            match self.consumer.poll(Duration::from_millis(20)) {
                None => {}
                Some(Err(e)) => tracing::warn!(error = %e, "progress topic read error"),
                Some(Ok(m)) => st.take(&m),
            }
        }
    }

    /// Reads until every partition's next offset reaches `highs` (the simulated consumer
    /// has no `position`: the offsets of what it returned tell it).
    #[cfg(madsim)]
    async fn read_up_to(
        &self,
        st: &mut ReaderState,
        highs: &BTreeMap<i32, i64>,
    ) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        loop {
            let caught_up = highs
                .iter()
                .all(|(p, &hi)| hi <= 0 || st.next.get(p).is_some_and(|&n| n >= hi));
            if caught_up {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                return Err(format!(
                    "the progress topic could not be read to its end within {:?}",
                    self.timeout
                ));
            }
            match self.consumer.poll(Duration::from_millis(20)).await {
                None => tokio::time::sleep(Duration::from_millis(5)).await,
                Some(Err(e)) => tracing::warn!(error = %e, "progress topic read error"),
                Some(Ok(m)) => {
                    st.next.insert(m.partition(), m.offset() + 1);
                    st.take(&m);
                }
            }
        }
    }
}

impl ReaderState {
    /// One record of the progress topic: the newest of a key wins; a tombstone deletes it.
    fn take<M: Message>(&mut self, m: &M) {
        let Some(key) = m.key().and_then(|k| std::str::from_utf8(k).ok()) else {
            return;
        };
        match m.payload() {
            None => {
                self.view.remove(key);
            }
            Some(v) => match Checkpoint::decode(v) {
                Ok(cp) => {
                    self.view.insert(key.to_owned(), cp);
                }
                Err(e) => {
                    tracing::error!(%key, error = %e, "corrupt progress record ignored")
                }
            },
        }
    }
}

/// The state port of the Kafka backend. Shared by every instance, in Kafka: lane
/// checkpoints (the progress topic), subscription definitions (the subscriptions topic)
/// and the DLQ ledger (`<topic>.dlq.<group>`). Local: the epoch, a copy of the
/// definitions (for the restart before the topic is read) and the rate rules.
pub struct KafkaState {
    local: StoreAdapter,
    log: KafkaLog,
    /// The topic of each group, for the DLQ topic's name.
    topics: Mutex<BTreeMap<GroupName, TopicName>>,
}

impl KafkaState {
    pub fn new(local: StoreAdapter, log: KafkaLog) -> Self {
        Self {
            local,
            log,
            topics: Mutex::new(BTreeMap::new()),
        }
    }
}

impl StatePort for KafkaState {
    fn load(&self) -> Result<Loaded, String> {
        let mut loaded = self.local.load()?;
        // Progress comes with each assignment, from the progress topic.
        loaded.recovered.checkpoints.clear();
        let mut topics = lock(&self.topics);
        for s in &loaded.recovered.subscriptions {
            topics.insert(s.group.clone(), s.topic.clone());
        }
        Ok(loaded)
    }

    fn apply(&self, batch: Arc<PersistBatch>, now_wall_ms: u64) -> BoxFut<Result<(), String>> {
        let log = self.log.clone();
        let local = self.local.apply(
            Arc::new(PersistBatch {
                checkpoints: Vec::new(),
                dead_letters: Vec::new(),
                dlq_resolved: Vec::new(),
                ..(*batch).clone()
            }),
            now_wall_ms,
        );
        let resolved: Vec<(TopicName, DlqKey)> = {
            let mut topics = lock(&self.topics);
            for s in &batch.subscriptions {
                topics.insert(s.group.clone(), s.topic.clone());
            }
            let out = batch
                .dlq_resolved
                .iter()
                .filter_map(|k| topics.get(&k.group).map(|t| (t.clone(), k.clone())))
                .collect();
            for g in &batch.removed_groups {
                topics.remove(g);
            }
            out
        };
        Box::pin(async move {
            let inner = &log.inner;
            let s = &inner.settings;
            let mut pending = Vec::with_capacity(batch.checkpoints.len());
            // Shared definitions first: a group's definition is in the topic before any of
            // its progress.
            let mut definitions = Vec::new();
            for spec in &batch.subscriptions {
                let value = encode_subscription(spec).map_err(|e| e.to_string())?;
                definitions.push((spec.group.as_str().to_owned(), Some(value)));
            }
            for g in &batch.removed_groups {
                definitions.push((g.as_str().to_owned(), None));
            }
            for (key, value) in &definitions {
                let mut record = FutureRecord::to(&s.subscriptions_topic).key(key.as_str());
                if let Some(v) = value {
                    record = record.payload(v.as_slice());
                }
                match inner.producer.send_result(record) {
                    Ok(f) => pending.push(f),
                    Err((e, _)) => {
                        return Err(format!("cannot write the subscriptions topic: {e}"))
                    }
                }
            }
            // Dead letters and resolutions before the progress that counts them done.
            for d in &batch.dead_letters {
                pending.push(super::dlq::write(&log, d, now_wall_ms).await?);
            }
            for (topic, key) in &resolved {
                pending.push(super::dlq::resolve(&log, topic, key)?);
            }
            for lane in &batch.checkpoints {
                let (key, value, dropped) = progress_record(lane, s.max_progress_ranges);
                if dropped > 0 {
                    inner
                        .counters
                        .progress_ranges_dropped
                        .fetch_add(dropped, Ordering::Relaxed);
                }
                let record = FutureRecord::to(&s.progress_topic)
                    .key(&key)
                    .payload(&value);
                match inner.producer.send_result(record) {
                    Ok(f) => pending.push(f),
                    Err((e, _)) => return Err(format!("cannot write the progress topic: {e}")),
                }
            }
            for f in pending {
                match f.await {
                    Ok(Ok(_)) => {}
                    Ok(Err((e, _))) => {
                        return Err(format!("the progress topic refused a write: {e}"))
                    }
                    Err(_) => return Err("the producer dropped a progress write".into()),
                }
            }
            local.await
        })
    }

    fn dlq_list(&self, group: GroupName, max: usize) -> BoxFut<Result<Vec<DlqEntry>, String>> {
        let topic = lock(&self.topics).get(&group).cloned();
        let log = self.log.clone();
        Box::pin(async move {
            let Some(topic) = topic else {
                return Ok(Vec::new());
            };
            #[cfg(madsim)]
            return super::dlq::list(&log, &group, &topic, max).await;
            #[cfg(not(madsim))]
            tokio::task::spawn_blocking(move || super::dlq::list(&log, &group, &topic, max))
                .await
                .map_err(|e| format!("DLQ read failed: {e}"))?
        })
    }

    fn put_rate_rule(
        &self,
        topic: TopicName,
        rule: Option<RateRule>,
    ) -> BoxFut<Result<(), String>> {
        self.local.put_rate_rule(topic, rule)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checkpoint(watermark: u64, ranges: &[(u64, u64)], attempts: &[(u64, u32)]) -> Checkpoint {
        Checkpoint {
            progress: Progress::from_parts(watermark, ranges.iter().copied()).expect("valid"),
            attempts: attempts.to_vec(),
        }
    }

    /// Goal: a progress record stays bounded without ever losing a record. Method: a
    /// checkpoint over the bound keeps its watermark exactly and a prefix of its ranges;
    /// what it no longer marks done is only redelivered (not skipped), and the drop is
    /// counted.
    #[test]
    fn bounded_keeps_the_watermark_and_drops_excess_ranges() {
        let cp = checkpoint(10, &[(12, 13), (15, 17), (20, 21)], &[(11, 2), (14, 3)]);
        let (same, dropped) = bounded(&cp, 3);
        assert_eq!((same, dropped), (cp.clone(), 0));

        let (b, dropped) = bounded(&cp, 1);
        assert_eq!(b.progress.watermark(), 10);
        assert_eq!(b.progress.ranges().collect::<Vec<_>>(), vec![(12, 13)]);
        assert_eq!(b.attempts, vec![(11, 2)]);
        assert_eq!(dropped, 2 + 1);
        // Everything done in the bounded record was done in the original: no loss.
        for o in 0..25 {
            if b.progress.is_done(o) {
                assert!(
                    cp.progress.is_done(o),
                    "offset {o} marked done by the bound"
                );
            }
        }
        let decoded = Checkpoint::decode(&b.encode()).expect("round trip");
        assert_eq!(decoded, b);
    }

    #[test]
    fn progress_keys_are_unambiguous() {
        // Names cannot hold a newline, so the key splits back into its parts.
        assert_eq!(progress_key("g", "t.x", 3), "g\nt.x\n3");
        assert_ne!(progress_key("g", "t", 12), progress_key("g", "t1", 2));
    }
}
