//! Reading a publish request (`POST /v1/topics/{topic}/events`, docs/DESIGN.md §5.1) into
//! validated events: binary mode (`ce-*` headers and the body), structured mode (one JSON
//! event) and batch mode (a JSON array of them). All or nothing: the first problem refuses
//! the whole request.

use std::cell::Cell;
use std::fmt;

use cloudevents::Data;
use http::header::CONTENT_TYPE;
use http::HeaderMap;
use percent_encoding::percent_decode;
use serde::de::{self, DeserializeSeed, Deserializer, SeqAccess, Visitor};
use serde_json::value::RawValue;

use super::attrs::{
    echo, is_json_media_type, is_text_media_type, AttrValue, Draft, Naming, Origin,
};
use super::error::{Field, PublishError};
use super::json::published_from_json;
use super::published::Published;

pub const STRUCTURED_MEDIA_TYPE: &str = "application/cloudevents+json";
pub const BATCH_MEDIA_TYPE: &str = "application/cloudevents-batch+json";

/// Size and count limits of a publish request, checked before anything is parsed or
/// allocated for the request (upstream #5361 allocated from unchecked sizes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PublishLimits {
    /// One event: its JSON in structured and batch mode; body plus `ce-*` headers in binary
    /// mode. The stored form can be up to a third larger when binary data is kept as
    /// base64, so the log's record limit should leave that room.
    pub max_event_bytes: usize,
    /// The whole request body. The HTTP layer should also stop reading a body at this size
    /// (e.g. `http_body_util::Limited`), so an oversized request is never buffered.
    pub max_request_bytes: usize,
    /// Events in one batch.
    pub max_batch_events: usize,
}

impl Default for PublishLimits {
    fn default() -> Self {
        Self {
            max_event_bytes: 1024 * 1024,
            max_request_bytes: 8 * 1024 * 1024,
            max_batch_events: 1000,
        }
    }
}

/// The three ways to publish over HTTP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum PublishMode {
    /// `application/cloudevents-batch+json`.
    Batch,
    /// `ce-*` headers, the body is the data.
    Binary,
    /// `application/cloudevents+json`.
    Structured,
}

impl fmt::Display for PublishMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PublishMode::Batch => "batch",
            PublishMode::Binary => "binary",
            PublishMode::Structured => "structured",
        })
    }
}

/// Which mode a request uses, from its `content-type`.
pub fn publish_mode(headers: &HeaderMap) -> Result<PublishMode, PublishError> {
    let Some(ct) = content_type(headers)? else {
        return Ok(PublishMode::Binary);
    };
    let essence = ct.split(';').next().unwrap_or("").trim();
    if essence.eq_ignore_ascii_case(STRUCTURED_MEDIA_TYPE) {
        check_charset(ct)?;
        return Ok(PublishMode::Structured);
    }
    if essence.eq_ignore_ascii_case(BATCH_MEDIA_TYPE) {
        check_charset(ct)?;
        return Ok(PublishMode::Batch);
    }
    if essence
        .to_ascii_lowercase()
        .starts_with("application/cloudevents")
    {
        return Err(PublishError::unsupported(format!(
            "content-type {} is an event format this mesh does not read: use \
             {STRUCTURED_MEDIA_TYPE}, {BATCH_MEDIA_TYPE} or binary mode",
            echo(ct)
        )));
    }
    Ok(PublishMode::Binary)
}

/// Reads a publish request into validated CloudEvents 1.0 events, in request order.
pub fn parse_publish(
    headers: &HeaderMap,
    body: &[u8],
    limits: &PublishLimits,
) -> Result<Vec<Published>, PublishError> {
    if body.len() > limits.max_request_bytes {
        return Err(PublishError::too_large(format!(
            "request body is {} bytes, over the limit of {}",
            body.len(),
            limits.max_request_bytes
        )));
    }
    match publish_mode(headers)? {
        PublishMode::Binary => Ok(vec![parse_binary(headers, body, limits)?]),
        PublishMode::Structured => {
            check_event_size(body.len(), limits)?;
            Ok(vec![published_from_json(body, Origin::Publish)?])
        }
        PublishMode::Batch => parse_batch(body, limits),
    }
}

fn check_event_size(len: usize, limits: &PublishLimits) -> Result<(), PublishError> {
    if len > limits.max_event_bytes {
        return Err(PublishError::too_large(format!(
            "event is {len} bytes, over the limit of {}",
            limits.max_event_bytes
        )));
    }
    Ok(())
}

fn content_type(headers: &HeaderMap) -> Result<Option<&str>, PublishError> {
    let mut values = headers.get_all(CONTENT_TYPE).iter();
    let Some(v) = values.next() else {
        return Ok(None);
    };
    let field = || Some(Field::Header("content-type".to_owned()));
    if values.next().is_some() {
        return Err(PublishError::invalid(field(), "appears more than once"));
    }
    v.to_str()
        .map(Some)
        .map_err(|_| PublishError::invalid(field(), "must be printable ASCII"))
}

fn check_charset(ct: &str) -> Result<(), PublishError> {
    for param in ct.split(';').skip(1) {
        let Some((name, value)) = param.split_once('=') else {
            continue;
        };
        if !name.trim().eq_ignore_ascii_case("charset") {
            continue;
        }
        let value = value.trim().trim_matches('"');
        if !(value.eq_ignore_ascii_case("utf-8") || value.eq_ignore_ascii_case("utf8")) {
            return Err(PublishError::unsupported(format!(
                "charset {} is not supported: CloudEvents JSON must be UTF-8",
                echo(value)
            )));
        }
    }
    Ok(())
}

pub(super) fn parse_binary(
    headers: &HeaderMap,
    body: &[u8],
    limits: &PublishLimits,
) -> Result<Published, PublishError> {
    let header_bytes: usize = headers
        .iter()
        .filter(|(k, _)| k.as_str().starts_with("ce-"))
        .map(|(k, v)| k.as_str().len() + v.len())
        .sum();
    check_event_size(body.len().saturating_add(header_bytes), limits)?;
    if !headers.contains_key("ce-specversion") {
        return Err(PublishError::invalid(
            Some(Field::Header("ce-specversion".to_owned())),
            format!(
                "is missing: a binary-mode event needs ce-* headers (for structured mode send \
                 content-type {STRUCTURED_MEDIA_TYPE})"
            ),
        ));
    }
    let mut draft = Draft::new(Origin::Publish, Naming::Header);
    for name in headers.keys() {
        let Some(attribute) = name.as_str().strip_prefix("ce-") else {
            continue;
        };
        let field = || Some(Field::Header(name.as_str().to_owned()));
        match attribute {
            "datacontenttype" => {
                return Err(PublishError::invalid(
                    field(),
                    "is not used in binary mode: the content-type header carries datacontenttype",
                ))
            }
            "data" | "data_base64" => {
                return Err(PublishError::invalid(
                    field(),
                    "is not an attribute: in binary mode the body carries the data",
                ))
            }
            _ => {}
        }
        let mut values = headers.get_all(name).iter();
        let Some(raw) = values.next() else {
            continue;
        };
        if values.next().is_some() {
            return Err(PublishError::invalid(field(), "appears more than once"));
        }
        // The HTTP binding percent-encodes values; raw UTF-8 (older SDKs send it) decodes
        // to itself.
        let value = percent_decode(raw.as_bytes())
            .decode_utf8()
            .map_err(|_| PublishError::invalid(field(), "is not UTF-8 once percent-decoded"))?;
        draft.set(attribute, AttrValue::Str(value.into_owned()))?;
    }
    let ct = content_type(headers)?;
    if let Some(ct) = ct {
        draft.set("datacontenttype", AttrValue::Str(ct.to_owned()))?;
    }
    let data = match ct {
        _ if body.is_empty() => None,
        // Without a content type the body is opaque: no guessing that it is JSON.
        None => Some(Data::Binary(body.to_vec())),
        Some(ct) if is_json_media_type(Some(ct)) => {
            // Kept as written (checked to be one JSON value), not as a tree.
            match serde_json::from_slice::<Box<RawValue>>(body) {
                // JSON null is how the event format writes "no data"; keeping it as data
                // would not survive the stored form.
                Ok(raw) if raw.get() == "null" => None,
                Ok(raw) => return Ok(Published::with_json_data(draft.finish(None)?, raw)),
                Err(e) => {
                    return Err(PublishError::invalid(
                        None,
                        format!(
                            "the body is not valid JSON although content-type is {}: {e}",
                            echo(ct)
                        ),
                    ))
                }
            }
        }
        Some(ct) => match std::str::from_utf8(body) {
            Ok(text) if is_text_media_type(ct) => Some(Data::String(text.to_owned())),
            _ => Some(Data::Binary(body.to_vec())),
        },
    };
    Ok(Published::new(draft.finish(data)?))
}

fn parse_batch(body: &[u8], limits: &PublishLimits) -> Result<Vec<Published>, PublishError> {
    let overflow = Cell::new(false);
    let mut de = serde_json::Deserializer::from_slice(body);
    let items = BatchSeed {
        max: limits.max_batch_events,
        overflow: &overflow,
    }
    .deserialize(&mut de)
    .and_then(|items| de.end().map(|()| items));
    let items = match items {
        Ok(items) => items,
        Err(_) if overflow.get() => {
            return Err(PublishError::too_large(format!(
                "batch has more than {} events",
                limits.max_batch_events
            )))
        }
        Err(e) => {
            return Err(PublishError::invalid(
                None,
                format!("the body is not a JSON array of events: {e}"),
            ))
        }
    };
    for (i, raw) in items.iter().enumerate() {
        check_event_size(raw.get().len(), limits).map_err(|e| e.at_index(i))?;
    }
    items
        .iter()
        .enumerate()
        .map(|(i, raw)| {
            published_from_json(raw.get().as_bytes(), Origin::Publish).map_err(|e| e.at_index(i))
        })
        .collect()
}

/// Reads a JSON array as borrowed raw elements, refusing more than `max` of them as soon as
/// the next one starts, so a huge batch costs neither memory nor parsing.
struct BatchSeed<'a> {
    max: usize,
    overflow: &'a Cell<bool>,
}

impl<'de> DeserializeSeed<'de> for BatchSeed<'_> {
    type Value = Vec<&'de RawValue>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for BatchSeed<'_> {
    type Value = Vec<&'de RawValue>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON array of CloudEvents")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<&'de RawValue>()? {
            if items.len() == self.max {
                self.overflow.set(true);
                return Err(de::Error::custom("too many events"));
            }
            items.push(item);
        }
        Ok(items)
    }
}
