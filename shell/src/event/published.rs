//! An event as the mesh reads it from JSON or a publish: the SDK's [`Event`] for its
//! attributes, and JSON data kept as the publisher wrote it (checked to be one JSON value)
//! instead of as a tree. The stored form and every delivery embed that text as it is, so
//! the data of an event is parsed once on its way through the mesh, not built into a tree
//! and written out again (a profile of the publish path found that to be most of its cost).
//! The data keeps its exact text, numbers and escapes included.

use bytes::Bytes;
use cloudevents::{Data, Event};
use serde_json::value::RawValue;

use super::error::PublishError;
use super::json::StructuredJson;

/// Bytes reserved for the attributes of a stored event beyond its data.
const STORED_ATTRIBUTES_ROOM: usize = 512;

/// A validated event. Invariant: when `json_data` is set, the event itself holds no data.
#[derive(Clone, Debug)]
pub struct Published {
    event: Event,
    json_data: Option<Box<RawValue>>,
}

impl Published {
    /// An event whose data (if any) is in the event itself.
    pub fn new(event: Event) -> Self {
        Self {
            event,
            json_data: None,
        }
    }

    /// An event with JSON data kept as written; `event` must hold no data.
    pub(crate) fn with_json_data(event: Event, data: Box<RawValue>) -> Self {
        debug_assert!(event.data().is_none(), "the data is in one place");
        Self {
            event,
            json_data: Some(data),
        }
    }

    /// The attributes and extensions (and the data when it is not JSON kept as written).
    pub fn event(&self) -> &Event {
        &self.event
    }

    /// The attributes and extensions, to change; the data is not changed through it.
    pub fn attributes_mut(&mut self) -> &mut Event {
        &mut self.event
    }

    /// The JSON data as written, when the data is JSON.
    pub fn json_data(&self) -> Option<&RawValue> {
        self.json_data.as_deref()
    }

    pub fn id(&self) -> &str {
        use cloudevents::AttributesReader as _;
        self.event.id()
    }

    /// The bytes to append to the log (the structured-mode JSON, data last).
    pub fn stored(&self) -> Bytes {
        // Sized once: the data, plus room for the attributes (growing from empty took
        // eight reallocations per event).
        let data_len = self.json_data.as_ref().map_or(0, |d| d.get().len());
        let mut bytes = Vec::with_capacity(data_len + STORED_ATTRIBUTES_ROOM);
        // Serialising cannot fail: every key is a `&str` and every value a string, a bool,
        // an integer, a `serde_json::Value` or checked raw JSON; a Vec takes every write.
        serde_json::to_writer(
            &mut bytes,
            &StructuredJson {
                event: &self.event,
                json_data: self.json_data.as_deref(),
            },
        )
        .expect("serialising an event to JSON is infallible");
        Bytes::from(bytes)
    }

    /// The content type and body of the event in a binary mode (HTTP, Kafka): the
    /// `datacontenttype`, or for JSON data without one `application/json` (the event
    /// format's default, which a binary-mode reader cannot know), and the data as bytes —
    /// JSON data as written.
    pub fn binary_body(&self) -> (Option<String>, Bytes) {
        use cloudevents::AttributesReader as _;
        let json = self.json_data.is_some() || matches!(self.event.data(), Some(Data::Json(_)));
        let content_type = match self.event.datacontenttype() {
            Some(ct) => Some(ct.to_owned()),
            None if json => Some("application/json".to_owned()),
            None => None,
        };
        let body = match (&self.json_data, self.event.data()) {
            (Some(raw), _) => Bytes::copy_from_slice(raw.get().as_bytes()),
            (None, None) => Bytes::new(),
            (None, Some(Data::Binary(b))) => Bytes::from(b.clone()),
            (None, Some(Data::String(s))) => Bytes::from(s.clone().into_bytes()),
            // A tree writes without failure (no non-finite numbers, string keys only).
            (None, Some(Data::Json(v))) => Bytes::from(v.to_string().into_bytes()),
        };
        (content_type, body)
    }

    /// The whole event as the SDK holds it, JSON data as a tree.
    pub fn into_event(self) -> Result<Event, PublishError> {
        let Published {
            mut event,
            json_data,
        } = self;
        if let Some(raw) = json_data {
            let tree = serde_json::from_str(raw.get()).map_err(|e| {
                PublishError::invalid(None, format!("the data cannot be read as JSON: {e}"))
            })?;
            event.set_data_unchecked(Data::Json(tree));
        }
        Ok(event)
    }
}
