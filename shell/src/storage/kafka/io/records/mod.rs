//! Kafka records in and out: the headers and value of a record as this build's broker
//! carries them, and a data record as the core's record — the one conversion every reader
//! of a data topic uses (the group consumer, the explicit-assignment consumer, and a
//! simulation's view of what the broker holds), so they cannot disagree about a record.
//!
//! madsim-rdkafka's simulated broker (`--cfg madsim`) carries no headers: its
//! `OwnedHeaders` has no constructor. There the headers travel in front of the value in a
//! frame of this module's own (`SIM_FRAME`, `sim_frame.rs`), written and read only here, so
//! the CloudEvents binding (`event::to_kafka` / `from_kafka`) still runs whole under the
//! simulator. A value without the frame is a record without headers (what a foreign
//! producer writes).
//!
//! `cfg(madsim)` chooses whole files: `real.rs` carries the headers as Kafka headers,
//! `sim.rs` in the frame.

use std::sync::Arc;

use bytes::Bytes;
use madsim_rdkafka::Message;
use unimesh_core::{Offset, Record, RecordMeta};

#[cfg(not(madsim))]
mod real;
#[cfg(madsim)]
mod sim;
#[cfg(any(madsim, test))]
mod sim_frame;

#[cfg(not(madsim))]
pub use real::unframed;
#[cfg(not(madsim))]
pub(super) use real::{incoming, stored_value, Outgoing};
#[cfg(madsim)]
pub use sim::unframed;
#[cfg(madsim)]
pub(super) use sim::{incoming, stored_value, Outgoing};

/// A record's headers, in order, as name and value.
pub(super) type HeaderList<'a> = Vec<(&'a str, Option<&'a [u8]>)>;

/// The value of the first header named `name` (as this mesh writes its own headers:
/// exactly), if it has one.
pub(super) fn header<'a>(headers: &HeaderList<'a>, name: &str) -> Option<&'a [u8]> {
    headers
        .iter()
        .find(|(k, _)| *k == name)
        .and_then(|(_, v)| *v)
}

/// A Kafka record as the core's record: its CloudEvent in the stored form, or the reason
/// it carries none (the core dead-letters it).
pub fn decode_message<M: Message>(m: &M, max_event_bytes: usize) -> Record {
    let offset = m.offset().max(0) as Offset;
    let (headers, payload) = incoming(m);
    match crate::event::from_kafka(&headers, payload, m.key(), max_event_bytes) {
        Ok(stored) => crate::storage::decode_record((offset, stored)),
        Err(e) => Record {
            offset,
            meta: RecordMeta::Undecodable(Arc::from(e.to_string())),
            body: Bytes::copy_from_slice(payload.unwrap_or_default()),
            broker_handle: None,
        },
    }
}
