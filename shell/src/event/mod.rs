//! The CloudEvents codec of the mesh: what a publisher sends, what the log stores, what a
//! subscriber receives.
//!
//! - **Publish** ([`parse_publish`]): an HTTP request in binary, structured or batch mode
//!   becomes validated CloudEvents 1.0 events (`cloudevents-sdk` [`Event`]s), or one
//!   [`PublishError`] that names the event, the attribute or header, and why, with the HTTP
//!   status (400, 413, 415) and error code to answer with. Sizes are checked before parsing.
//! - **Store** ([`encode_stored`], [`decode_stored`], [`partition_key`]): the log holds the
//!   structured JSON of the event; [`decode_stored`] reads only the routing attributes the
//!   core needs ([`unimesh_core::EventMeta`]), skipping the data.
//! - **Deliver** ([`delivery_event_json`], [`to_binary_request_parts`]): the stored event
//!   with the extensions `emmqpartition` and `emmqoffset` (as strings), as structured JSON
//!   or as a binary-mode HTTP request for webhook push.
//!
//! Round trip: what [`parse_publish`] accepts ([`Published`]: JSON data kept as the
//! publisher wrote it, checked, never built into a tree), [`Published::stored`] writes and
//! [`delivery_event_json`] delivers with every attribute, extension and the data intact
//! (times are normalised to UTC; JSON data keeps its exact text).

mod attrs;
mod delivery;
mod error;
mod json;
mod kafka;
mod publish;
mod published;
mod stored;
pub mod trace_context;

pub use attrs::{EXTENSION_NAME_MAX, RESERVED_EXTENSIONS};
pub use cloudevents::Event;
pub use delivery::{
    delivery_event_json, delivery_event_json_decoded, to_binary_request_parts, OFFSET_EXTENSION,
    PARTITION_EXTENSION,
};
pub use error::{DecodeError, Field, PublishError, PublishErrorKind};
pub use kafka::{from_kafka, to_kafka, KafkaRecord, KAFKA_HEADER_PREFIX};
pub use publish::{
    parse_publish, publish_mode, PublishLimits, PublishMode, BATCH_MEDIA_TYPE,
    STRUCTURED_MEDIA_TYPE,
};
pub use published::Published;
pub use stored::{decode_stored, encode_stored, partition_key, PARTITION_KEY_EXTENSION};

#[cfg(test)]
mod tests;
