//! Rendering a stored event for a subscriber: structured JSON (long-poll, SSE, WebSocket)
//! and binary-mode HTTP parts (webhook push), both carrying the broker position as the
//! extensions `emmqpartition` and `emmqoffset`.
//!
//! Both are written as JSON/header **strings** ("3", "1024"), not numbers: a CloudEvents
//! Integer is 32-bit signed and an offset is a u64, and in binary mode every attribute is a
//! string anyway, so a string is the one representation that is exact in every mode and
//! SDK. Subscribers parse it with `u64::from_str`.

use std::fmt::Write as _;

use bytes::Bytes;
use cloudevents::event::AttributeValue;

use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::HeaderMap;
use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::attrs::Origin;
use super::error::DecodeError;
use super::json::{format_time, published_from_json};

pub const OFFSET_EXTENSION: &str = "emmqoffset";
pub const PARTITION_EXTENSION: &str = "emmqpartition";

/// Characters the HTTP binding (§3.1.3.2) requires percent-encoded in `ce-*` header values:
/// everything outside printable ASCII, plus space, `"` and `%`. (Non-ASCII is always
/// encoded by `utf8_percent_encode`.)
const HEADER_ESCAPES: &AsciiSet = &CONTROLS.add(b' ').add(b'"').add(b'%');

/// JSON whitespace (RFC 8259), not Unicode's.
const JSON_WS: [char; 4] = [' ', '\t', '\n', '\r'];

/// The structured CloudEvent delivered to subscribers: the stored event with `emmqpartition`
/// and `emmqoffset` added. The result is always one valid JSON object (checked as it is
/// built), ready to embed in a larger JSON document.
///
/// Fast path: the two members are spliced in after the opening brace of the stored object,
/// with no parse tree. It is taken only when the stored bytes cannot already hold either
/// member at the top level (no `"emmq` and no `\u` escape that could spell it); otherwise
/// the object is parsed, the members replaced and written again.
pub fn delivery_event_json(
    stored: &[u8],
    partition: u32,
    offset: u64,
) -> Result<Box<RawValue>, DecodeError> {
    if let Some(out) = splice(stored, stored, partition, offset) {
        // Validation is what makes the splice safe: a stored record that is not one
        // complete JSON object fails here instead of producing broken output.
        if let Ok(raw) = RawValue::from_string(out) {
            return Ok(raw);
        }
    }
    parsed_delivery_event_json(stored, partition, offset)
}

/// [`delivery_event_json`] as text, for stored bytes already known to be one complete JSON
/// object: those of a record whose routing attributes decoded (`decode_stored` read every
/// byte of it, data included, and refused trailing text). The splice is not checked again —
/// that check was a second parse of every delivered event. Where the splice cannot be taken
/// (the event may already hold `emmq*` members), the members are replaced as in
/// [`delivery_event_json`].
pub fn delivery_event_json_decoded(
    stored: &[u8],
    partition: u32,
    offset: u64,
) -> Result<String, DecodeError> {
    match splice(stored, members_before_data(stored), partition, offset) {
        Some(out) => Ok(out),
        None => {
            parsed_delivery_event_json(stored, partition, offset).map(|raw| raw.get().to_owned())
        }
    }
}

/// The fast path of [`delivery_event_json`]: the two members written after the opening
/// brace of the stored object, with no parse tree; `None` when the stored bytes are not
/// UTF-8 text of an object or `names` (the part of them where top-level member names may
/// be) could already hold either member (an `"emmq`, or a `\u` escape that could spell
/// it). Not checked: see the callers.
fn splice(stored: &[u8], names: &[u8], partition: u32, offset: u64) -> Option<String> {
    let text = std::str::from_utf8(stored).ok()?;
    let rest = text.trim_start_matches(JSON_WS).strip_prefix('{')?;
    if memchr::memmem::find(names, b"\"emmq").is_some()
        || memchr::memmem::find(names, b"\\u").is_some()
    {
        return None;
    }
    let mut out = String::with_capacity(text.len() + 64);
    // Writing to a String cannot fail.
    let _ = write!(
        out,
        "{{\"{PARTITION_EXTENSION}\":\"{partition}\",\"{OFFSET_EXTENSION}\":\"{offset}\""
    );
    if !rest.trim_start_matches(JSON_WS).starts_with('}') {
        out.push(',');
    }
    // Trailing whitespace goes, as in a `RawValue`.
    out.push_str(rest.trim_end_matches(JSON_WS));
    Some(out)
}

/// The stored bytes before the top-level `data` (or `data_base64`) member, which the
/// mesh's stored form writes last, after every attribute: the data's own text (its
/// escapes, its nested members) holds no top-level member name. Found as `"data":` or
/// `"data_base64":` right after `{` or `,` — inside a string every `"` is escaped, so there
/// the sequence cannot occur. The whole when there is no data.
pub(super) fn members_before_data(stored: &[u8]) -> &[u8] {
    let mut from = 0;
    while let Some(at) = memchr::memmem::find(&stored[from..], b"\"data").map(|i| from + i) {
        let name = &stored[at..];
        let structural = at > 0 && matches!(stored[at - 1], b',' | b'{');
        if structural && (name.starts_with(b"\"data\":") || name.starts_with(b"\"data_base64\":")) {
            return &stored[..at];
        }
        from = at + 1;
    }
    stored
}

/// The slow path of [`delivery_event_json`]: the stored object parsed, the two members
/// replaced, written again.
fn parsed_delivery_event_json(
    stored: &[u8],
    partition: u32,
    offset: u64,
) -> Result<Box<RawValue>, DecodeError> {
    let mut map: Map<String, Value> = serde_json::from_slice(stored)
        .map_err(|e| DecodeError::new(format!("stored event is not a JSON object: {e}")))?;
    map.insert(
        PARTITION_EXTENSION.to_owned(),
        Value::String(partition.to_string()),
    );
    map.insert(
        OFFSET_EXTENSION.to_owned(),
        Value::String(offset.to_string()),
    );
    let out = serde_json::to_string(&map)
        .map_err(|e| DecodeError::new(format!("cannot write delivery JSON: {e}")))?;
    RawValue::from_string(out)
        .map_err(|e| DecodeError::new(format!("cannot write delivery JSON: {e}")))
}

/// The headers and body of a binary-mode HTTP request carrying the stored event (webhook
/// push): every attribute as a percent-encoded `ce-*` header, `datacontenttype` as
/// `content-type`, the data as the body, and `ce-emmqpartition`/`ce-emmqoffset`.
pub fn to_binary_request_parts(
    stored: &[u8],
    partition: u32,
    offset: u64,
) -> Result<(HeaderMap, Bytes), DecodeError> {
    let published = published_from_json(stored, Origin::Stored)?;
    let event = published.event();
    let mut headers = HeaderMap::new();
    for (name, value) in event.iter_attributes() {
        if name == "datacontenttype" {
            continue;
        }
        let text = match value {
            AttributeValue::Time(t) => format_time(t),
            other => other.to_string(),
        };
        insert_ce_header(&mut headers, name, &text)?;
    }
    for (name, value) in event.iter_extensions() {
        insert_ce_header(&mut headers, name, &value.to_string())?;
    }
    insert_ce_header(&mut headers, PARTITION_EXTENSION, &partition.to_string())?;
    insert_ce_header(&mut headers, OFFSET_EXTENSION, &offset.to_string())?;

    let (content_type, body) = published.binary_body();
    if let Some(ct) = content_type {
        let v = HeaderValue::from_str(&ct).map_err(|_| {
            DecodeError::new(format!(
                "datacontenttype {ct:?} cannot be a content-type header"
            ))
        })?;
        headers.insert(CONTENT_TYPE, v);
    }
    Ok((headers, body))
}

fn insert_ce_header(headers: &mut HeaderMap, name: &str, value: &str) -> Result<(), DecodeError> {
    let header = HeaderName::from_bytes(format!("ce-{name}").as_bytes())
        .map_err(|_| DecodeError::new(format!("attribute {name:?} cannot be a header name")))?;
    let encoded = utf8_percent_encode(value, HEADER_ESCAPES).to_string();
    // Percent-encoding leaves only printable ASCII, which is always a valid header value.
    let value = HeaderValue::from_str(&encoded)
        .map_err(|_| DecodeError::new(format!("attribute {name:?} cannot be a header value")))?;
    headers.insert(header, value);
    Ok(())
}
