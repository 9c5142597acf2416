//! What the engine task shows of the mesh: offsets rows (with the log's end offsets),
//! subscription summaries and the metrics snapshot.

use unimesh_core::{GroupName, GroupView, TopicName};

use super::EngineTask;
use crate::engine::api::{EngineError, MetricsSnapshot, OffsetRow, SubscriptionInfo};

impl EngineTask {
    fn rows(&self, view: &GroupView) -> Vec<OffsetRow> {
        let group = &view.spec.group;
        let owner = self.log.group().and_then(|g| g.instance());
        view.lanes
            .iter()
            .map(|l| {
                let end = self
                    .log
                    .offsets(&view.spec.topic, l.partition)
                    .map_or(l.cursor, |(_, end)| end);
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

    pub(super) fn offsets(&self, topic: &TopicName) -> Result<Vec<OffsetRow>, EngineError> {
        if self.log.partitions(topic).is_none() {
            return Err(EngineError::UnknownTopic(topic.clone()));
        }
        let groups: Vec<GroupName> = self
            .mesh
            .group_names()
            .filter(|g| self.mesh.subscription(g).is_some_and(|s| s.topic == *topic))
            .cloned()
            .collect();
        Ok(groups
            .iter()
            .filter_map(|g| self.mesh.group_view(g))
            .flat_map(|view| self.rows(&view))
            .collect())
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
