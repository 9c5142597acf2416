//! Errors of the CloudEvents codec: what the publish parser refuses (mapped to HTTP 400, 413
//! or 415 by the HTTP layer) and why a stored record cannot be read back.

use std::fmt;

/// Which family of refusal: decides the HTTP status and the `error` code of the JSON body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PublishErrorKind {
    /// The request is not a valid CloudEvent (or batch of them): 400.
    InvalidEvent,
    /// An event or the whole request is over its configured size limit: 413.
    TooLarge,
    /// A structured or batch content type this mesh does not read (another event format,
    /// another charset): 415.
    UnsupportedMediaType,
}

/// Where the problem is: an attribute of the event (structured and batch mode) or an HTTP
/// header (binary mode), so the publisher can find it without guessing.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Field {
    Attribute(String),
    Header(String),
}

impl Field {
    pub fn name(&self) -> &str {
        match self {
            Field::Attribute(n) | Field::Header(n) => n,
        }
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Field::Attribute(n) => write!(f, "attribute '{n}'"),
            Field::Header(n) => write!(f, "header '{n}'"),
        }
    }
}

/// A refused publish request. Nothing of a refused request is accepted: a batch with one bad
/// event is refused as a whole, and the error names that event by its index in the array
/// (0-based, like a JSON pointer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishError {
    kind: PublishErrorKind,
    index: Option<usize>,
    field: Option<Field>,
    why: String,
}

impl PublishError {
    pub(crate) fn new(
        kind: PublishErrorKind,
        field: Option<Field>,
        why: impl Into<String>,
    ) -> Self {
        Self {
            kind,
            index: None,
            field,
            why: why.into(),
        }
    }

    pub(crate) fn invalid(field: Option<Field>, why: impl Into<String>) -> Self {
        Self::new(PublishErrorKind::InvalidEvent, field, why)
    }

    pub(crate) fn too_large(why: impl Into<String>) -> Self {
        Self::new(PublishErrorKind::TooLarge, None, why)
    }

    pub(crate) fn unsupported(why: impl Into<String>) -> Self {
        Self::new(PublishErrorKind::UnsupportedMediaType, None, why)
    }

    pub(crate) fn at_index(mut self, index: usize) -> Self {
        self.index = Some(index);
        self
    }

    pub fn kind(&self) -> PublishErrorKind {
        self.kind
    }

    /// The `error` code of the JSON error body.
    pub fn code(&self) -> &'static str {
        match self.kind {
            PublishErrorKind::InvalidEvent => "invalid-cloudevent",
            PublishErrorKind::TooLarge => "too-large",
            PublishErrorKind::UnsupportedMediaType => "unsupported-media-type",
        }
    }

    /// The HTTP status this error answers with.
    pub fn status(&self) -> u16 {
        match self.kind {
            PublishErrorKind::InvalidEvent => 400,
            PublishErrorKind::TooLarge => 413,
            PublishErrorKind::UnsupportedMediaType => 415,
        }
    }

    /// Index of the offending event in a batch; `None` for a single event or a problem of the
    /// request as a whole.
    pub fn index(&self) -> Option<usize> {
        self.index
    }

    /// The attribute or header at fault, when there is one.
    pub fn field(&self) -> Option<&Field> {
        self.field.as_ref()
    }

    /// Human text, e.g. `event 3: attribute 'source' is missing`.
    pub fn message(&self) -> String {
        self.to_string()
    }

    /// The error body of docs/DESIGN.md §5.1: `{"error": code, "message": text}`.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({ "error": self.code(), "message": self.message() })
    }
}

impl fmt::Display for PublishError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(i) = self.index {
            write!(f, "event {i}: ")?;
        }
        match &self.field {
            Some(field) => write!(f, "{field} {}", self.why),
            None => f.write_str(&self.why),
        }
    }
}

impl std::error::Error for PublishError {}

/// A stored record that cannot be read back as an event. The text is the dead-letter reason
/// (`RecordMeta::Undecodable`), so it says what is wrong without echoing the record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeError {
    why: String,
}

impl DecodeError {
    pub(crate) fn new(why: impl Into<String>) -> Self {
        Self { why: why.into() }
    }

    pub fn message(&self) -> &str {
        &self.why
    }
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "stored event is not decodable: {}", self.why)
    }
}

impl std::error::Error for DecodeError {}

impl From<PublishError> for DecodeError {
    fn from(e: PublishError) -> Self {
        DecodeError::new(e.to_string())
    }
}
