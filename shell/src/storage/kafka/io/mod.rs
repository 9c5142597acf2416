//! The librdkafka side of the Kafka backend (madsim-rdkafka's simulated broker under
//! `--cfg madsim`): clients, the log port, the progress topic and the state port, the group
//! consumer whose rebalance callbacks forward to `rules/` and carry out its answers. No
//! decision is taken here that `rules/` could take without a client.
//!
//! `cfg(madsim)` chooses whole files: `checker`, `consumer`, `nudge`, `probe` and `times`
//! need librdkafka's consumer groups, committed offsets and leader epochs, which the
//! simulated broker does not have; `simulated` takes `consumer`'s place there.
//! `subscriptions` is built in both (its start-time read, through `whole`, runs on the
//! simulated broker), its watcher only outside madsim.

#[cfg(not(madsim))]
mod checker;
mod client_log;
#[cfg(not(madsim))]
mod consumer;
mod dlq;
mod log;
#[cfg(not(madsim))]
mod nudge;
#[cfg(not(madsim))]
mod probe;
mod progress;
mod properties;
mod records;
#[cfg(madsim)]
mod simulated;
mod subscriptions;
#[cfg(not(madsim))]
mod times;
mod whole;

pub use dlq::dlq_topic;
pub use log::KafkaLog;
pub use progress::KafkaState;
pub use properties::{check_properties, ClientRole, PropertyTables, FIXED_PROPERTIES};
pub use records::{decode_message, unframed};
#[cfg(madsim)]
pub use simulated::{MemberId, SimCoordinator};
#[cfg(not(madsim))]
pub use subscriptions::watch as watch_subscriptions;
pub use subscriptions::{definition, definitions};
