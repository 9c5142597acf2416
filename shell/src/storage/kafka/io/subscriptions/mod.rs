//! Subscriptions shared by every instance of a cluster: the durable group definitions live
//! in a compacted topic keyed by group name (value: the state store's subscription
//! encoding; a tombstone deletes the group), so a group created on one instance is served
//! by all.
//!
//! The topic is the only store of definitions (docs/DESIGN.md §8, "A state batch on Kafka
//! is durable as one"): the node's local store keeps none. Writes: the state port writes
//! every definition and deletion of a persist batch here (see `progress::KafkaState`).
//! Reads: at start, [`definitions`] reads the topic to its end before the engine is built,
//! so a restart serves what the topic holds, whatever an earlier version kept locally;
//! then a watcher thread tails the topic from its beginning and hands each record to a
//! [`SubscriptionSink`] (the engine, `engine::shared`), which applies what differs from the
//! engine's definition through its own `subscribe`/`unsubscribe`; since applying writes
//! the same bytes back, and equal bytes are not applied again, the instances converge
//! without ping-pong.

//!
//! `cfg(madsim)` chooses whole files: `real.rs` reads the topic at start off the async
//! workers and runs the watcher (librdkafka's blocking consumer); `sim.rs` reads it at
//! start with the simulated consumer (the simulation has no watcher).

use std::collections::BTreeMap;

use madsim_rdkafka::Message;
use unimesh_core::{GroupName, SubscriptionSpec};

use super::whole::{Reader, Unclaimed};
use crate::storage::state::codec::decode_subscription;

#[cfg(not(madsim))]
mod real;
#[cfg(madsim)]
mod sim;

#[cfg(not(madsim))]
pub use real::{definitions, watch};
#[cfg(madsim)]
pub use sim::definitions;

/// Who reads the topic at start ([`super::whole::read`]).
const READER: Reader<'static> = Reader {
    role: "subscriptions reader",
    group_id: "subscriptions-reader",
    what: "subscriptions topic",
    unclaimed: Unclaimed::ReadsToItsEnd,
};

/// The newest record of each key, as read: a group's encoded definition, `None` for a
/// deletion.
type Newest = BTreeMap<String, Option<Vec<u8>>>;

fn take_newest(newest: &mut Newest, m: &madsim_rdkafka::message::BorrowedMessage<'_>) {
    if let Some(key) = m.key().and_then(|k| std::str::from_utf8(k).ok()) {
        newest.insert(key.to_owned(), m.payload().map(<[u8]>::to_vec));
    }
}

/// The definitions among the newest records (see [`definitions`]).
fn decoded(newest: Newest) -> Vec<SubscriptionSpec> {
    let mut out = Vec::with_capacity(newest.len());
    for (key, value) in newest {
        let Some(bytes) = value else { continue };
        out.extend(definition(&key, &bytes));
    }
    out
}

/// The definition a record of the topic (key `key`, value `bytes`) holds; `None`, logged,
/// when it does not decode. Public so a simulation can read the topic as a restart does.
pub fn definition(key: &str, bytes: &[u8]) -> Option<SubscriptionSpec> {
    let Ok(group) = GroupName::new(key) else {
        tracing::warn!(%key, "subscriptions record without a group name ignored");
        return None;
    };
    match decode_subscription(group.as_str(), &group, bytes) {
        Ok(spec) => Some(spec),
        Err(e) => {
            tracing::error!(%group, error = %e, "corrupt subscription record ignored");
            None
        }
    }
}
