//! The subscriptions topic on madsim-rdkafka's simulated broker: read to its end at start.

use unimesh_core::SubscriptionSpec;

use super::{decoded, take_newest, Newest, READER};
use crate::storage::kafka::io::log::KafkaLog;
use crate::storage::kafka::io::whole;
use crate::storage::ports::StorageError;

/// The group definitions the topic holds, read to its end as `real.rs` reads them, under
/// madsim.
pub async fn definitions(log: &KafkaLog) -> Result<Vec<SubscriptionSpec>, StorageError> {
    let mut newest = Newest::new();
    let name = log.settings().subscriptions_topic.clone();
    whole::read(log, &name, &READER, &mut |m| take_newest(&mut newest, m)).await?;
    Ok(decoded(newest))
}
