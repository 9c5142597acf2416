//! A record as the core sees it: its position, the CloudEvent attributes that filtering and
//! key ordering need, and the stored bytes, which the core never looks into.

use std::sync::Arc;

use bytes::Bytes;

use crate::types::Offset;

/// The CloudEvent attributes the core routes on. The shell fills it when it decodes a
/// stored event; the body stays opaque.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct EventMeta {
    pub id: String,
    pub source: String,
    pub ty: String,
    pub subject: Option<String>,
    /// The `partitionkey` extension: the unit of key order.
    pub partition_key: Option<String>,
    /// Other extension attributes as strings, sorted by name.
    pub extensions: Vec<(String, String)>,
}

impl EventMeta {
    /// An extension attribute by name. `partitionkey` is kept apart (it drives key order)
    /// but is an extension like any other to a filter.
    pub fn extension(&self, name: &str) -> Option<&str> {
        if name == "partitionkey" {
            return self.partition_key.as_deref();
        }
        self.extensions
            .binary_search_by(|(k, _)| k.as_str().cmp(name))
            .ok()
            .map(|i| self.extensions[i].1.as_str())
    }
}

/// What the shell could make of the stored bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RecordMeta {
    Event(Arc<EventMeta>),
    /// The bytes are not a decodable event. The record is dead-lettered with this reason for
    /// every group, never silently dropped (the seed's catch-all turned such records into
    /// silent drops: upstream #5387).
    Undecodable(Arc<str>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub offset: Offset,
    pub meta: RecordMeta,
    pub body: Bytes,
    /// A POP broker's receipt handle, ACKed to the broker once the record is durably done.
    pub broker_handle: Option<Bytes>,
}

impl Record {
    pub fn event(offset: Offset, meta: EventMeta, body: Bytes) -> Self {
        Self {
            offset,
            meta: RecordMeta::Event(Arc::new(meta)),
            body,
            broker_handle: None,
        }
    }

    pub fn partition_key(&self) -> Option<&str> {
        match &self.meta {
            RecordMeta::Event(m) => m.partition_key.as_deref(),
            RecordMeta::Undecodable(_) => None,
        }
    }
}
