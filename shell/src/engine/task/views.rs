//! What the engine task shows of the mesh: offsets rows (with the log's end offsets),
//! subscription summaries and the metrics snapshot. The task takes what the core knows
//! and asks the log for the end offsets; what the log does not answer at once (a broker
//! round trip) is waited for off the task ([`EngineTask::answer_with_ends`]), which then
//! answers the caller.

use std::collections::{BTreeMap, BTreeSet};

use futures_util::FutureExt;
use madsim_tokio as tokio;
use unimesh_core::{GroupName, GroupView, Offset, Partition, TopicName};

use super::EngineTask;
use crate::engine::api::{EngineError, MetricsSnapshot, OffsetRow, SubscriptionInfo};
use crate::engine::command::Reply;
use crate::engine::ports::{BoxFut, LogPort, StorageError};

/// The rows an answer holds, to be given the log's end offsets.
pub(super) type RowsOf<T> = fn(&mut T) -> Vec<&mut OffsetRow>;

impl EngineTask {
    /// Answers `value` once the log told the end offset of each of its rows (`rows`): at
    /// once when the log answers at once (a log in memory, a broker's cached ends), else
    /// off the task, so a log that asks a broker never holds the engine. A row whose end
    /// the log cannot tell shows the lane's cursor.
    pub(super) fn answer_with_ends<T: Send + 'static>(
        &self,
        value: Result<T, EngineError>,
        rows: RowsOf<T>,
        reply: Reply<T>,
    ) {
        let mut value = match value {
            Ok(v) => v,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let keys: BTreeSet<(TopicName, Partition)> = rows(&mut value)
            .iter()
            .map(|r| (r.topic.clone(), r.partition))
            .collect();
        let ends = Ends::ask(&*self.log, keys);
        if ends.pending.is_empty() {
            ends.set(rows(&mut value));
            let _ = reply.send(Ok(value));
            return;
        }
        tokio::spawn(async move {
            ends.wait().await.set(rows(&mut value));
            let _ = reply.send(Ok(value));
        });
    }

    /// The rows of a group's lanes, each end at the lane's cursor until the log tells it
    /// ([`Self::answer_with_ends`]).
    fn rows(&self, view: &GroupView) -> Vec<OffsetRow> {
        let group = &view.spec.group;
        let owner = self.log.group().and_then(|g| g.instance());
        view.lanes
            .iter()
            .map(|l| {
                let end = l.cursor;
                OffsetRow {
                    group: group.clone(),
                    topic: view.spec.topic.clone(),
                    partition: l.partition,
                    end,
                    cursor: l.cursor,
                    push: l.push_end,
                    watermark: l.watermark,
                    durable_watermark: l.durable_watermark,
                    ack_ranges: l.ack_ranges.clone(),
                    lag: end.saturating_sub(l.watermark),
                    in_flight: l.in_flight as u64,
                    owner: owner.clone(),
                }
            })
            .collect()
    }

    pub(super) fn info(&self, group: &GroupName) -> Option<SubscriptionInfo> {
        let view = self.mesh.group_view(group)?;
        Some(SubscriptionInfo {
            lanes: self.rows(&view),
            clients: view.clients.len(),
            replaying: view
                .replay
                .as_ref()
                .map_or(0, |r| r.in_flight + r.queued + r.backoff),
            stats: view.stats,
            dlq_changes: self.dlq_changes.get(group).copied().unwrap_or(0),
            spec: view.spec,
        })
    }

    /// The rows of every group reading `topic`; answered once the log said it has the
    /// topic (else `UnknownTopic`) and told the end offsets (off the task when the log
    /// does not answer at once).
    pub(super) fn on_offsets(&self, topic: TopicName, reply: Reply<Vec<OffsetRow>>) {
        let mut rows = self.offsets(&topic);
        let mut known = self.log.partitions(topic.clone());
        match (&mut known).now_or_never() {
            Some(None) => {
                let _ = reply.send(Err(EngineError::UnknownTopic(topic)));
            }
            Some(Some(_)) => {
                self.answer_with_ends(Ok(rows), |r| r.iter_mut().collect(), reply);
            }
            None => {
                let log = self.log.clone();
                tokio::spawn(async move {
                    if known.await.is_none() {
                        let _ = reply.send(Err(EngineError::UnknownTopic(topic)));
                        return;
                    }
                    let keys = rows.iter().map(|r| (r.topic.clone(), r.partition));
                    let ends = Ends::ask(&*log, keys.collect());
                    ends.wait().await.set(rows.iter_mut().collect());
                    let _ = reply.send(Ok(rows));
                });
            }
        }
    }

    fn offsets(&self, topic: &TopicName) -> Vec<OffsetRow> {
        let groups: Vec<GroupName> = self
            .mesh
            .group_names()
            .filter(|g| self.mesh.subscription(g).is_some_and(|s| s.topic == *topic))
            .cloned()
            .collect();
        groups
            .iter()
            .filter_map(|g| self.mesh.group_view(g))
            .flat_map(|view| self.rows(&view))
            .collect()
    }

    pub(super) fn metrics(&self) -> MetricsSnapshot {
        let groups: Vec<GroupName> = self.mesh.group_names().cloned().collect();
        MetricsSnapshot {
            groups: groups.iter().filter_map(|g| self.info(g)).collect(),
            mesh: self.mesh.stats().clone(),
            epoch: self.mesh.epoch(),
            log: None,
        }
    }

    /// Every group's summary, by name.
    pub(super) fn subscriptions(&self) -> Vec<SubscriptionInfo> {
        self.mesh
            .group_names()
            .filter_map(|g| self.info(g))
            .collect()
    }
}

/// The log's end offsets of some partitions: those it answered at once, and the
/// answers still to come (`None`: the log could not tell).
struct Ends {
    known: BTreeMap<(TopicName, Partition), Option<Offset>>,
    pending: Vec<((TopicName, Partition), RangeAnswer)>,
}

/// A log's answer to [`LogPort::offsets`].
type RangeAnswer = BoxFut<Result<(Offset, Offset), StorageError>>;

impl Ends {
    /// Asks the log for the end of each partition, taking at once what it answers at once
    /// (polling a port's future never blocks).
    fn ask(log: &dyn LogPort, keys: BTreeSet<(TopicName, Partition)>) -> Ends {
        let mut ends = Ends {
            known: BTreeMap::new(),
            pending: Vec::new(),
        };
        for key in keys {
            let mut answer = log.offsets(key.0.clone(), key.1);
            match (&mut answer).now_or_never() {
                Some(r) => {
                    ends.known.insert(key, r.ok().map(|(_, end)| end));
                }
                None => ends.pending.push((key, answer)),
            }
        }
        ends
    }

    /// Waits for the answers still to come.
    async fn wait(mut self) -> Ends {
        for (key, answer) in std::mem::take(&mut self.pending) {
            self.known
                .insert(key, answer.await.ok().map(|(_, end)| end));
        }
        self
    }

    /// Sets each row's end to its partition's, and its lag from it; a row whose end the
    /// log could not tell keeps its own.
    fn set(&self, rows: Vec<&mut OffsetRow>) {
        for row in rows {
            let key = (row.topic.clone(), row.partition);
            if let Some(&Some(end)) = self.known.get(&key) {
                row.end = end;
                row.lag = end.saturating_sub(row.watermark);
            }
        }
    }
}
