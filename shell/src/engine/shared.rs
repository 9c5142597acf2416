//! The engine as the [`SubscriptionSink`] of a backend that shares group definitions
//! between instances (Kafka's subscriptions topic, `storage::kafka::subscriptions`).

use unimesh_core::GroupName;

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
