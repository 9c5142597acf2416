//! The CloudEvents JSON event format (structured mode): reading one JSON object into a
//! validated [`Event`], and writing an event as a JSON object.
//!
//! The reading is done here rather than by the SDK's `Deserialize` for three reasons: every
//! refusal names its attribute (the SDK reports serde's "missing field"), duplicate members
//! are refused (serde_json keeps the last one silently), and media types with parameters or
//! upper case (`application/vnd.x+JSON; charset=utf-8`) are recognised as JSON. The writing
//! is done here so the output is deterministic (the SDK writes extensions in `HashMap`
//! order) and puts `data` last, after every attribute a reader may want first.

use std::fmt;

use base64::prelude::*;
use chrono::{DateTime, SecondsFormat, Utc};
use cloudevents::event::AttributeValue;
use cloudevents::{Data, Event};
use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::value::RawValue;
use serde_json::Value;

use super::attrs::{echo, is_json_media_type, AttrValue, Draft, Naming, Origin};
use super::error::{Field, PublishError};
use super::published::Published;

/// Reads one structured-mode event (a JSON object), JSON data kept as written.
pub(crate) fn published_from_json(bytes: &[u8], origin: Origin) -> Result<Published, PublishError> {
    let members: Members = serde_json::from_slice(bytes).map_err(|e| {
        PublishError::invalid(None, format!("the event is not a valid JSON object: {e}"))
    })?;
    published_from_members(members, origin)
}

fn published_from_members(members: Members, origin: Origin) -> Result<Published, PublishError> {
    let mut draft = Draft::new(origin, Naming::Attribute);
    let mut data_base64 = None;
    for (name, value) in members.attributes {
        match name.as_str() {
            "data_base64" if !value.is_null() => data_base64 = Some(value),
            "data_base64" => {}
            _ => {
                if let Some(v) = AttrValue::from_json(value) {
                    draft.set(&name, v)?;
                }
            }
        }
    }
    // JSON null is how the event format writes "no data".
    let data = members.data.filter(|raw| raw.get() != "null");
    let attr = |n: &str| Some(Field::Attribute(n.to_owned()));
    let data = match (data, data_base64) {
        (Some(_), Some(_)) => {
            return Err(PublishError::invalid(
                attr("data"),
                "and 'data_base64' are both present: an event has one or the other",
            ))
        }
        (None, Some(Value::String(b64))) => Some(Data::Binary(
            BASE64_STANDARD.decode(b64.as_bytes()).map_err(|e| {
                PublishError::invalid(attr("data_base64"), format!("is not valid base64: {e}"))
            })?,
        )),
        (None, Some(_)) => {
            return Err(PublishError::invalid(
                attr("data_base64"),
                "must be a string of base64",
            ))
        }
        (Some(raw), None) if is_json_media_type(draft.datacontenttype()) => {
            return Ok(Published::with_json_data(draft.finish(None)?, raw));
        }
        (Some(raw), None) => match serde_json::from_str::<String>(raw.get()) {
            Ok(text) => Some(Data::String(text)),
            Err(_) => {
                return Err(PublishError::invalid(
                    attr("data"),
                    format!(
                        "must be a JSON string because datacontenttype {} is not JSON \
                         (binary data goes in 'data_base64')",
                        echo(draft.datacontenttype().unwrap_or(""))
                    ),
                ))
            }
        },
        (None, None) => None,
    };
    Ok(Published::new(draft.finish(data)?))
}

/// The members of a JSON object in document order, refusing duplicates: `data` kept as
/// written (checked JSON), the others as trees (attributes are small).
pub(crate) struct Members {
    attributes: Vec<(String, Value)>,
    data: Option<Box<RawValue>>,
    /// How many attributes came before `data` (for the tests' view of the order).
    #[cfg_attr(not(test), allow(dead_code))]
    data_at: usize,
}

#[cfg(test)]
impl Members {
    /// Every member in document order, `data` as a tree.
    pub(crate) fn pairs(&self) -> Vec<(String, Value)> {
        let mut out = self.attributes.clone();
        if let Some(raw) = &self.data {
            let tree = serde_json::from_str(raw.get()).expect("checked JSON");
            out.insert(self.data_at, ("data".to_owned(), tree));
        }
        out
    }
}

impl<'de> Deserialize<'de> for Members {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(MembersVisitor)
    }
}

struct MembersVisitor;

impl<'de> Visitor<'de> for MembersVisitor {
    type Value = Members;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members, A::Error> {
        let mut attributes: Vec<(String, Value)> = Vec::new();
        let mut data: Option<Box<RawValue>> = None;
        let mut data_seen = false;
        let mut data_at = 0;
        while let Some(k) = map.next_key::<String>()? {
            if k == "data" {
                if data_seen {
                    return Err(de::Error::custom("member \"data\" appears more than once"));
                }
                data_seen = true;
                data_at = attributes.len();
                data = Some(map.next_value::<Box<RawValue>>()?);
            } else {
                let v = map.next_value::<Value>()?;
                attributes.push((k, v));
            }
        }
        // Sorting indices keeps document order for the error message and costs O(n log n)
        // however many members a hostile event carries.
        let mut names: Vec<&str> = attributes.iter().map(|(k, _)| k.as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(de::Error::custom(format_args!(
                "member {} appears more than once",
                echo(w[0])
            )));
        }
        Ok(Members {
            attributes,
            data,
            data_at,
        })
    }
}

/// An event as a structured-mode JSON object: the attributes in spec order, the extensions
/// sorted by name, the data last — `json_data` as written when given, else the event's own.
pub(crate) struct StructuredJson<'a> {
    pub(crate) event: &'a Event,
    pub(crate) json_data: Option<&'a RawValue>,
}

impl Serialize for StructuredJson<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let event = self.event;
        let mut map = s.serialize_map(None)?;
        for (name, value) in event.iter_attributes() {
            match value {
                AttributeValue::Time(t) => map.serialize_entry(name, &format_time(t))?,
                AttributeValue::Boolean(b) => map.serialize_entry(name, b)?,
                AttributeValue::Integer(i) => map.serialize_entry(name, i)?,
                other => map.serialize_entry(name, &DisplayStr(&other))?,
            }
        }
        let mut extensions: Vec<_> = event.iter_extensions().collect();
        extensions.sort_unstable_by(|a, b| a.0.cmp(b.0));
        for (name, value) in extensions {
            map.serialize_entry(name, value)?;
        }
        if let Some(raw) = self.json_data {
            map.serialize_entry("data", raw)?;
            return map.end();
        }
        match event.data() {
            Some(Data::Json(v)) => map.serialize_entry("data", v)?,
            Some(Data::String(v)) => map.serialize_entry("data", v)?,
            Some(Data::Binary(v)) => {
                map.serialize_entry("data_base64", &BASE64_STANDARD.encode(v))?
            }
            None => {}
        }
        map.end()
    }
}

/// Serialises a `Display` value as a JSON string without an intermediate `String`.
struct DisplayStr<'a, T: fmt::Display>(&'a T);

impl<T: fmt::Display> Serialize for DisplayStr<'_, T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self.0)
    }
}

/// RFC 3339 in UTC with `Z` and only as many fraction digits as needed, the form most
/// readers expect.
pub(crate) fn format_time(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}
