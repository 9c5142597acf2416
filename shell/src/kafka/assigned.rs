//! Explicit assignment: the consumer of a group where the broker has no consumer groups
//! (madsim-rdkafka's simulated broker, `--cfg madsim`). One instance owns every partition
//! of the group; nothing rebalances, so nothing is ever revoked.
//!
//! At `join` a task reads the partition count, each partition's newest progress record
//! (the progress topic, read to its end) and its offsets, and hands the engine every
//! partition at once as `GroupEvent::Assigned`, each with its checkpoint: the same exact
//! resume as after a rebalance. The simulated broker keeps no committed offsets, so the
//! watermark lives in the progress topic only (the checkpoint's watermark; `commit` is a
//! no-op): no record below it or inside a persisted range is delivered again.
//!
//! Fetches: one reader per partition, each a consumer assigned to that partition alone, and
//! the rule of the group consumer: a reader's `next` is an offset from which every record
//! of the partition is still to come from its consumer, in order. A fetch from `next` reads
//! on; any other fetch repositions (a consumer assigned at `from` afresh, since the
//! simulated consumer keeps what it fetched in a buffer an `assign` does not clear). So the
//! offsets a read skips are really absent, never records lost to a seek.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::client_log::{ClientLog, LoggedConsumer};
use madsim_rdkafka::{Offset as KOffset, TopicPartitionList};
use madsim_tokio as tokio;
use tokio::sync::mpsc;
use unimesh_core::{Assignment, GroupName, Offset, Partition, Record, TopicName};

use super::log::{lock, KafkaLog};
use super::records::decode_message;
use super::ClientRole;
use crate::engine::{GroupEvent, LogRead};

/// How long a fetch at the end of a partition waits before asking the broker again.
const POLL_INTERVAL: Duration = Duration::from_millis(10);
/// How long the assignment task waits before trying a failed broker request again.
const RETRY_INTERVAL: Duration = Duration::from_millis(100);
/// The ownership generation of every lane here: the simulated broker has no group
/// coordinator, so its progress records are unstamped (the lane's three-part key) and
/// the fence's choice among a lane's records ([`super::progress::choose`]) takes the
/// unstamped record, the only kind this mode writes.
const NO_GENERATION: Option<i32> = None;

/// The handle the [`KafkaLog`] keeps of a group's explicit assignment.
pub(super) struct AssignedConsumer {
    shared: Arc<Shared>,
}

struct Shared {
    log: KafkaLog,
    group: GroupName,
    topic: TopicName,
    /// Filled by the assignment task, before the engine hears of the partitions.
    readers: Mutex<BTreeMap<Partition, Arc<tokio::sync::Mutex<Reader>>>>,
    stopped: AtomicBool,
}

/// What one partition's fetches read through.
struct Reader {
    /// None until the first fetch, and after a reposition that could not create one.
    consumer: Option<LoggedConsumer>,
    /// Every record at or above `next` is still to come from `consumer` (or is `peeked`).
    next: Offset,
    /// A record taken from the consumer that did not fit the last answer.
    peeked: Option<Record>,
}

impl AssignedConsumer {
    /// Starts the assignment task of `group` (reading `topic`); the partitions reach the
    /// engine through `events`.
    pub fn start(
        log: KafkaLog,
        group: GroupName,
        topic: TopicName,
        events: mpsc::Sender<GroupEvent>,
    ) -> Result<Self, String> {
        let shared = Arc::new(Shared {
            log,
            group,
            topic,
            readers: Mutex::new(BTreeMap::new()),
            stopped: AtomicBool::new(false),
        });
        let s = shared.clone();
        tokio::spawn(async move { s.assign_all(events).await });
        tracing::info!(group = %shared.group, topic = %shared.topic, "Kafka partitions assigned explicitly (no consumer groups)");
        Ok(Self { shared })
    }

    pub async fn fetch(
        &self,
        partition: Partition,
        from: Offset,
        max: usize,
        max_bytes: usize,
        wait_ms: u64,
    ) -> LogRead {
        self.shared
            .fetch(partition, from, max.max(1), max_bytes, wait_ms)
            .await
    }

    /// The simulated broker keeps no committed offsets: the watermark is the progress
    /// record's, written before the core commits.
    pub fn commit(&self, _partition: Partition, _offset: Offset) {}

    /// Ends the group here: fetches answer failed from now on, and a checkpoint of its
    /// partitions is no longer this instance's to write.
    pub fn stop(&self) {
        self.shared.stopped.store(true, Ordering::Relaxed);
        let partitions: Vec<Partition> = lock(&self.shared.readers).keys().copied().collect();
        self.shared
            .log
            .inner
            .progress
            .release(&self.shared.group, &partitions);
    }
}

impl Shared {
    fn stopped(&self) -> bool {
        self.stopped.load(Ordering::Relaxed)
    }

    /// Reads what every partition resumes from and hands them all to the engine. Each read
    /// is retried until it succeeds: without the progress record a partition would resume
    /// from its earliest offset (no loss, but every persisted ACK delivered again).
    async fn assign_all(self: Arc<Self>, events: mpsc::Sender<GroupEvent>) {
        let log = &self.log;
        let count = loop {
            match log.topic_partitions(&self.topic, false).await {
                Ok(n) => break n,
                Err(e) => {
                    tracing::warn!(group = %self.group, error = ?e, "cannot read the partitions; retrying")
                }
            }
            if self.stopped() {
                return;
            }
            tokio::time::sleep(RETRY_INTERVAL).await;
        };
        let partitions: Vec<Partition> = (0..count).collect();
        // The simulated broker keeps no committed offsets: no floor under the records.
        let no_commits = BTreeMap::new();
        let stored = loop {
            match log
                .inner
                .progress
                .latest(
                    &self.group,
                    &self.topic,
                    &partitions,
                    NO_GENERATION,
                    &no_commits,
                    None,
                )
                .await
            {
                Ok(m) => break m,
                Err(e) => {
                    tracing::warn!(group = %self.group, error = %e, "cannot read the progress topic; retrying")
                }
            }
            if self.stopped() {
                return;
            }
            tokio::time::sleep(RETRY_INTERVAL).await;
        };
        let mut assignments = Vec::with_capacity(partitions.len());
        let mut stale = Vec::with_capacity(partitions.len());
        for &p in &partitions {
            let (earliest, end) = loop {
                match log.watermarks(&self.topic, p).await {
                    Ok(pair) => break pair,
                    Err(e) => {
                        tracing::warn!(group = %self.group, partition = p, error = %e, "cannot read offsets at assignment; retrying")
                    }
                }
                if self.stopped() {
                    return;
                }
                tokio::time::sleep(RETRY_INTERVAL).await;
            };
            let chosen = stored.get(&p).cloned().unwrap_or_default();
            stale.push((p, chosen.stale));
            let checkpoint = chosen.checkpoint;
            let start = checkpoint
                .as_ref()
                .map_or(earliest, |c| c.progress.watermark());
            lock(&self.readers).insert(
                p,
                Arc::new(tokio::sync::Mutex::new(Reader {
                    consumer: None,
                    next: start,
                    peeked: None,
                })),
            );
            assignments.push(Assignment {
                partition: p,
                earliest,
                end,
                checkpoint,
            });
        }
        if self.stopped() {
            return;
        }
        // Owned from here (no await since the check above, so a `stop` cannot come in
        // between): this instance's progress writes of the lanes are accepted, unstamped,
        // and the first of each deletes the lane's other records.
        for (p, keys) in stale {
            log.inner
                .progress
                .own(&self.group, p, NO_GENERATION, None, keys);
        }
        tracing::info!(group = %self.group, instance = %log.settings().instance, ?partitions, "Kafka assigned partitions");
        let _ = events
            .send(GroupEvent::Assigned {
                group: self.group.clone(),
                partitions: assignments,
            })
            .await;
    }

    async fn fetch(
        &self,
        partition: Partition,
        from: Offset,
        max: usize,
        max_bytes: usize,
        wait_ms: u64,
    ) -> LogRead {
        let reader = lock(&self.readers).get(&partition).cloned();
        let Some(reader) = reader.filter(|_| !self.stopped()) else {
            return LogRead::Failed(format!(
                "partition {partition} of {} is not assigned to this instance",
                self.topic
            ));
        };
        let mut guard = reader.lock().await;
        let r = &mut *guard;
        if r.consumer.is_none() || r.next != from {
            if let Err(e) = self.reposition(r, partition, from).await {
                return LogRead::Failed(e);
            }
        }
        let Some(consumer) = r.consumer.as_ref() else {
            return LogRead::Failed("the partition's reader is gone".into());
        };
        let max_event_bytes = self.log.settings().max_event_bytes;
        let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms);
        let mut out: Vec<Record> = Vec::new();
        let mut bytes = 0usize;
        while out.len() < max {
            let record = match r.peeked.take() {
                Some(record) => Some(record),
                None => match consumer.poll(Duration::ZERO).await {
                    Some(Ok(m)) => Some(decode_message(&m, max_event_bytes)),
                    Some(Err(e)) if out.is_empty() => {
                        // The consumer's position is unknown after an error: start afresh.
                        r.consumer = None;
                        return LogRead::Failed(format!(
                            "cannot read {}/{partition}: {e}",
                            self.topic
                        ));
                    }
                    Some(Err(_)) => break,
                    None => None,
                },
            };
            match record {
                Some(record) if record.offset < r.next => {}
                Some(record) => {
                    if !out.is_empty() && bytes + record.body.len() > max_bytes {
                        r.peeked = Some(record);
                        break;
                    }
                    r.next = record.offset + 1;
                    bytes += record.body.len();
                    out.push(record);
                }
                None => {
                    let now = tokio::time::Instant::now();
                    if !out.is_empty() || now >= deadline {
                        break;
                    }
                    tokio::time::sleep(POLL_INTERVAL.min(deadline - now)).await;
                }
            }
        }
        if out.is_empty() {
            // A fetch outside the log answers "out of range", so the core repositions
            // instead of waiting forever.
            if let Ok((earliest, end)) = self.log.watermarks(&self.topic, partition).await {
                if from < earliest || from > end {
                    self.log
                        .counters()
                        .out_of_range
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(group = %self.group, partition, from, earliest, end, "offset outside the log; the core repositions");
                    r.consumer = None;
                    return LogRead::OutOfRange { earliest, end };
                }
            }
        }
        LogRead::Decoded(out)
    }

    /// A consumer of `partition` alone, assigned at `from`.
    async fn reposition(
        &self,
        r: &mut Reader,
        partition: Partition,
        from: Offset,
    ) -> Result<(), String> {
        r.consumer = None;
        r.peeked = None;
        let mut config = self.log.settings().client_config(ClientRole::Consumer);
        config
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "error");
        let consumer: LoggedConsumer = config
            .create_with_context(ClientLog::new(format!("reader of {}", self.topic)))
            .await
            .map_err(|e| format!("cannot create a reader of {}/{partition}: {e}", self.topic))?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(
            self.topic.as_str(),
            partition as i32,
            KOffset::Offset(from as i64),
        )
        .map_err(|e| format!("cannot assign {}/{partition}: {e}", self.topic))?;
        consumer
            .assign(&tpl)
            .map_err(|e| format!("cannot assign {}/{partition}: {e}", self.topic))?;
        r.consumer = Some(consumer);
        r.next = from;
        Ok(())
    }
}
