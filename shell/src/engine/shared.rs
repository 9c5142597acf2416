//! The engine as the [`SubscriptionSink`] of a backend that shares group definitions
//! between instances (Kafka's subscriptions topic, `storage::kafka::io::subscriptions`):
//! the watcher applies each record it reads, and [`admitted`] chooses, at start, among the
//! definitions read before the engine was built.

use unimesh_core::{GroupName, MeshConfig, Refusal, SubscriptionSpec};

use super::{BoxFut, EngineError, EngineHandle, SubscriptionSink};
use crate::storage::state::codec::{decode_subscription, encode_subscription};

impl SubscriptionSink for EngineHandle {
    fn is_running(&self) -> bool {
        EngineHandle::is_running(self)
    }

    fn apply_shared(&self, group: GroupName, value: Option<Vec<u8>>) -> BoxFut<()> {
        let engine = self.clone();
        Box::pin(async move { apply(&engine, group, value).await })
    }
}

/// The shared definitions read at start (ordered by group name) that this node takes.
/// Another instance, configured otherwise, may have written one that this node's limits
/// refuse, and one instance's configuration must not stop another's start: what
/// `Mesh::new` would refuse — a definition invalid under this node's limits, or one past
/// its `max_groups` — is logged and skipped, as [`apply`] does with a record it cannot
/// apply (and will do again when the watcher reads the record).
pub(super) fn admitted(config: &MeshConfig, read: Vec<SubscriptionSpec>) -> Vec<SubscriptionSpec> {
    let mut taken = Vec::with_capacity(read.len().min(config.max_groups));
    for spec in read {
        let refused = match spec.validate(&config.limits) {
            Err(e) => Some(Refusal::InvalidSpec(e)),
            Ok(()) if taken.len() >= config.max_groups => Some(Refusal::TooManyGroups {
                max: config.max_groups,
            }),
            Ok(()) => None,
        };
        match refused {
            Some(r) => tracing::warn!(
                group = %spec.group,
                error = %r,
                "cannot apply the shared group definition: skipped at start"
            ),
            None => taken.push(spec),
        }
    }
    taken
}

/// Applies one record of the topic unless the local definition already equals it.
async fn apply(engine: &EngineHandle, group: GroupName, value: Option<Vec<u8>>) {
    let local = match engine.subscription(&group).await {
        Ok(info) => encode_subscription(&info.spec).ok(),
        Err(_) => None,
    };
    match value {
        None => {
            if local.is_some() {
                match engine.unsubscribe(&group).await {
                    Ok(()) | Err(EngineError::UnknownGroup(_)) => {
                        tracing::info!(%group, "group deleted by another instance")
                    }
                    Err(e) => tracing::warn!(%group, error = %e, "cannot delete the group"),
                }
            }
        }
        Some(bytes) => {
            if local.as_deref() == Some(bytes.as_slice()) {
                return;
            }
            let spec = match decode_subscription(group.as_str(), &group, &bytes) {
                Ok(spec) => spec,
                Err(e) => {
                    tracing::error!(%group, error = %e, "corrupt subscription record ignored");
                    return;
                }
            };
            match engine.subscribe(spec).await {
                Ok(_) => tracing::info!(%group, "group defined by another instance"),
                Err(e) => {
                    tracing::warn!(%group, error = %e, "cannot apply the shared group definition")
                }
            }
        }
    }
}
