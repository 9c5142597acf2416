//! Stored bytes as the core sees them.

use std::sync::Arc;

use unimesh_core::{Offset, Record, RecordMeta};

/// Stored bytes → a core record. What cannot be decoded becomes an `Undecodable` record,
/// which the core dead-letters with the reason (never a silent drop).
pub(crate) fn decode_record((offset, body): (Offset, bytes::Bytes)) -> Record {
    let meta = match crate::event::decode_stored(&body) {
        Ok(meta) => RecordMeta::Event(Arc::new(meta)),
        Err(e) => RecordMeta::Undecodable(Arc::from(e.to_string())),
    };
    Record {
        offset,
        meta,
        body,
        broker_handle: None,
    }
}
