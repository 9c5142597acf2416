//! Read-only views of the mesh, for admin endpoints, metrics and the simulation. Each
//! structure renders its own part (`Group::view`, `Lane::view`, `Client::view`).

use super::Mesh;
use crate::config::SubscriptionSpec;
use crate::group::GroupStats;
use crate::types::{ClientId, GroupName, Millis, Offset, Partition};

/// Read-only view of one lane, for admin and metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaneView {
    pub partition: Partition,
    pub lease: u64,
    pub cursor: Offset,
    pub push_end: Offset,
    pub watermark: Offset,
    pub durable_watermark: Option<Offset>,
    pub ack_ranges: Vec<(Offset, Offset)>,
    pub in_flight: usize,
    pub queued: usize,
    pub backoff: usize,
    pub fetch_outstanding: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientView {
    pub id: ClientId,
    pub credit: u32,
    pub in_flight: u32,
    pub last_active_ms: Millis,
}

#[derive(Clone, Debug)]
pub struct GroupView {
    pub spec: SubscriptionSpec,
    pub lanes: Vec<LaneView>,
    pub replay: Option<LaneView>,
    pub clients: Vec<ClientView>,
    pub stats: GroupStats,
}

impl Mesh {
    pub fn group_names(&self) -> impl Iterator<Item = &GroupName> {
        self.groups.ids().map(|(name, _)| name)
    }

    pub fn subscription(&self, name: &GroupName) -> Option<&SubscriptionSpec> {
        self.groups.named(name).map(|g| g.spec())
    }

    pub fn group_view(&self, name: &GroupName) -> Option<GroupView> {
        self.groups.named(name).map(|g| g.view())
    }
}
