//! The embedded log as the engine's [`LogPort`].

use std::time::Duration;

use madsim_tokio as tokio;
use unimesh_core::{GroupName, Offset, Partition, TopicName};

use super::{AppendItem, EmbeddedLog, LogError, ReadResult};
use crate::storage::ports::{
    BoxFut, LogMetrics, LogPort, LogRead, RecentAppends, StorageError, TopicFacts,
};

/// One read of the embedded log on the blocking pool (RocksDB calls block).
async fn read_blocking(
    log: EmbeddedLog,
    topic: TopicName,
    partition: Partition,
    from: Offset,
    max: usize,
    max_bytes: usize,
) -> LogRead {
    // What memory can answer (a group that keeps up reads the newest records) needs no
    // RocksDB read and no trip to the blocking pool.
    if let Some(read) = log.read_recent(&topic, partition, from, max, max_bytes) {
        return log_read(read);
    }
    let read =
        crate::storage::spawn_blocking(move || log.read(&topic, partition, from, max, max_bytes))
            .await;
    match read {
        Ok(Ok(read)) => log_read(read),
        Ok(Err(e)) => LogRead::Failed(e.to_string()),
        Err(e) => LogRead::Failed(format!("read task failed: {e}")),
    }
}

fn log_read(read: ReadResult) -> LogRead {
    match read {
        ReadResult::Records { records, .. } => LogRead::Records(records),
        ReadResult::OutOfRange { earliest, end } => LogRead::OutOfRange { earliest, end },
    }
}

/// Sorts the embedded log's errors into what the caller did wrong and what failed.
fn append_error(e: LogError) -> StorageError {
    match e {
        LogError::RecordTooLarge { .. }
        | LogError::AppendTooLarge { .. }
        | LogError::TooManyRecords { .. } => StorageError::TooLarge(e.to_string()),
        e if e.is_caller_error() => StorageError::Invalid(e.to_string()),
        e => StorageError::from_source(e),
    }
}

impl LogPort for EmbeddedLog {
    fn fetch(
        &self,
        _group: GroupName,
        topic: TopicName,
        partition: Partition,
        from: Offset,
        max: usize,
        max_bytes: usize,
        wait_ms: u64,
    ) -> BoxFut<LogRead> {
        let log = self.clone();
        Box::pin(async move {
            let first =
                read_blocking(log.clone(), topic.clone(), partition, from, max, max_bytes).await;
            if !first.at_end() {
                return first;
            }
            // At the end: park until the writer publishes a new end, or the wait is over.
            // The watch holds the current end, so an append since the read is not missed.
            let Ok(mut end) = log.watch_end(&topic, partition) else {
                return first;
            };
            let waited = tokio::time::timeout(Duration::from_millis(wait_ms), async {
                while *end.borrow_and_update() <= from {
                    if end.changed().await.is_err() {
                        break;
                    }
                }
            })
            .await;
            if waited.is_err() {
                return first;
            }
            read_blocking(log, topic, partition, from, max, max_bytes).await
        })
    }

    fn append(
        &self,
        topic: TopicName,
        items: Vec<AppendItem>,
    ) -> BoxFut<Result<Vec<(Partition, Offset)>, StorageError>> {
        let log = self.clone();
        Box::pin(async move { log.append(&topic, items).await.map_err(append_error) })
    }

    fn prepare_topic(
        &self,
        topic: TopicName,
        with_offsets: bool,
    ) -> BoxFut<Result<TopicFacts, StorageError>> {
        let log = self.clone();
        Box::pin(async move {
            // Creating a topic is a synced RocksDB write: the blocking pool's.
            crate::storage::spawn_blocking(move || {
                let info = EmbeddedLog::ensure_topic(&log, &topic).map_err(append_error)?;
                TopicFacts::read(info.partitions, with_offsets, |p| {
                    EmbeddedLog::offsets(&log, &topic, p).map_err(append_error)
                })
            })
            .await
            .unwrap_or_else(|e| Err(StorageError::unavailable(format!("topic task failed: {e}"))))
        })
    }

    fn partitions(&self, topic: TopicName) -> BoxFut<Option<u32>> {
        // In memory: the topics are loaded at open.
        let n = self.topic(&topic).map(|t| t.partitions);
        Box::pin(async move { n })
    }

    fn offset_for_time(
        &self,
        topic: TopicName,
        partition: Partition,
        time_ms: u64,
    ) -> BoxFut<Result<Offset, StorageError>> {
        let log = self.clone();
        Box::pin(async move {
            // A few RocksDB point reads: the blocking pool's.
            crate::storage::spawn_blocking(move || {
                EmbeddedLog::offset_for_time(&log, &topic, partition, time_ms).map_err(append_error)
            })
            .await
            .unwrap_or_else(|e| {
                Err(StorageError::unavailable(format!(
                    "lookup task failed: {e}"
                )))
            })
        })
    }

    fn offsets(
        &self,
        topic: TopicName,
        partition: Partition,
    ) -> BoxFut<Result<(Offset, Offset), StorageError>> {
        // In memory: no read of the disk.
        let range = EmbeddedLog::offsets(self, &topic, partition).map_err(append_error);
        Box::pin(async move { range })
    }

    fn enforce_retention(&self) -> BoxFut<Result<usize, StorageError>> {
        let log = self.clone();
        Box::pin(async move {
            // Retention deletes through RocksDB: the blocking pool's.
            crate::storage::spawn_blocking(move || {
                let now_wall_ms = log.config().clock.now_ms();
                let report =
                    EmbeddedLog::enforce_retention(&log, now_wall_ms).map_err(append_error)?;
                for (topic, partition, error) in &report.failed {
                    tracing::warn!(%topic, partition, %error, "retention failed for a partition");
                }
                Ok(report.truncated.len())
            })
            .await
            .unwrap_or_else(|e| Err(StorageError::failed("retention task failed", e)))
        })
    }

    fn recent_appends(
        &self,
        window_of: &dyn Fn(&TopicName) -> Option<(u64, usize)>,
    ) -> RecentAppends {
        let mut out = Vec::new();
        for info in self.topics() {
            let Some((since_ms, max)) = window_of(&info.name) else {
                continue;
            };
            let mut records = Vec::new();
            for partition in 0..info.partitions {
                match self.appended_since(&info.name, partition, since_ms, max) {
                    Ok(found) => records.extend(
                        found
                            .into_iter()
                            .map(|(at, offset, bytes)| (at, partition, offset, bytes)),
                    ),
                    Err(e) => {
                        return Some(Err(StorageError::failed(
                            &format!("{}/{partition}", info.name),
                            e,
                        )))
                    }
                }
            }
            out.push((info.name, records));
        }
        Some(Ok(out))
    }

    fn fault(&self) -> Option<String> {
        EmbeddedLog::fault(self)
    }

    fn metrics(&self) -> Option<LogMetrics> {
        let stats = self.stats();
        Some(LogMetrics {
            records_appended: stats.records_appended,
            synced_writes: stats.synced_writes,
            write_failures: stats.write_failures,
            disk_bytes: self.disk_bytes().ok(),
            broker: None,
        })
    }
}
