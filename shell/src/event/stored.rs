//! The stored form of an event (what goes into the log) and the fast reading of its routing
//! attributes, which runs for every record every group fetches.
//!
//! The stored form is the structured-mode JSON of the event (see [`super::json`]): readable
//! by any CloudEvents consumer of the underlying broker, self-describing through
//! `specversion`, and the delivery JSON is a two-member splice of it.

use std::borrow::Cow;
use std::fmt;

use bytes::Bytes;
use cloudevents::{AttributesReader, Event};
use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};
use unimesh_core::EventMeta;

use super::attrs::RESERVED_EXTENSIONS;
use super::error::DecodeError;
use super::json::StructuredJson;

/// The extension that names the unit of key order and of partition choice.
pub const PARTITION_KEY_EXTENSION: &str = "partitionkey";

/// The bytes to append to the log for `event`.
pub fn encode_stored(event: &Event) -> Bytes {
    // Serialising cannot fail: every key is a `&str` and every value a string, a bool, an
    // integer or a `serde_json::Value`, which holds no non-finite floats.
    let bytes = serde_json::to_vec(&StructuredJson {
        event,
        json_data: None,
    })
    .expect("serialising an event to JSON is infallible");
    Bytes::from(bytes)
}

/// The routing attributes of a stored event, without reading its data: id, source, type,
/// subject, the `partitionkey` extension, and every other extension as a string (booleans
/// as `true`/`false`, integers in decimal), sorted by name. `emmqoffset`/`emmqpartition`
/// are left out: they describe a delivery, not the event.
///
/// Checks what routing relies on (a JSON object, `specversion` "1.0", non-empty `id`,
/// `source`, `type`, no duplicate members), not everything the publish parser checked: a
/// record written to the broker by something else than the mesh is still routed when it can
/// be, and refused with a reason (for the dead-letter queue) when it cannot.
pub fn decode_stored(stored: &[u8]) -> Result<EventMeta, DecodeError> {
    let mut de = serde_json::Deserializer::from_slice(stored);
    let attrs = StoredAttrs::deserialize(&mut de).map_err(|e| DecodeError::new(e.to_string()))?;
    de.end().map_err(|e| DecodeError::new(e.to_string()))?;
    attrs.into_meta()
}

/// The key that keeps events in order and on one partition: the `partitionkey` extension,
/// else the `subject`, else none (the event may go anywhere).
pub fn partition_key(event: &Event) -> Option<String> {
    match event.extension(PARTITION_KEY_EXTENSION) {
        Some(v) => Some(v.to_string()),
        None => event.subject().map(str::to_owned),
    }
}

#[derive(Default)]
struct StoredAttrs {
    specversion: bool,
    id: Option<String>,
    source: Option<String>,
    ty: Option<String>,
    subject: Option<String>,
    partition_key: Option<String>,
    extensions: Vec<(String, String)>,
}

impl StoredAttrs {
    fn into_meta(mut self) -> Result<EventMeta, DecodeError> {
        if !self.specversion {
            return Err(DecodeError::new("attribute 'specversion' is missing"));
        }
        let required = |slot: &mut Option<String>, name: &str| match slot.take() {
            Some(v) if !v.is_empty() => Ok(v),
            Some(_) => Err(DecodeError::new(format!("attribute '{name}' is empty"))),
            None => Err(DecodeError::new(format!("attribute '{name}' is missing"))),
        };
        let id = required(&mut self.id, "id")?;
        let source = required(&mut self.source, "source")?;
        let ty = required(&mut self.ty, "type")?;
        // Already sorted when the mesh wrote the record, so this is a linear check then.
        self.extensions.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        if let Some(w) = self.extensions.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(DecodeError::new(format!(
                "attribute '{}' appears more than once",
                w[0].0
            )));
        }
        Ok(EventMeta {
            id,
            source,
            ty,
            subject: self.subject,
            partition_key: self.partition_key,
            extensions: self.extensions,
        })
    }
}

impl<'de> Deserialize<'de> for StoredAttrs {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(StoredVisitor)
    }
}

struct StoredVisitor;

impl<'de> Visitor<'de> for StoredVisitor {
    type Value = StoredAttrs;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a CloudEvent JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<StoredAttrs, A::Error> {
        let mut a = StoredAttrs::default();
        let mut seen_specversion = false;
        while let Some(Name(key)) = map.next_key::<Name<'de>>()? {
            match &*key {
                "specversion" => {
                    if seen_specversion {
                        return Err(duplicate("specversion"));
                    }
                    seen_specversion = true;
                    match map.next_value::<Option<Name<'de>>>()? {
                        Some(Name(v)) if v == "1.0" => a.specversion = true,
                        Some(Name(v)) => {
                            return Err(de::Error::custom(format_args!(
                                "attribute 'specversion' is {v:?}, not \"1.0\""
                            )))
                        }
                        None => {}
                    }
                }
                "id" => once(&mut a.id, map.next_value()?, "id")?,
                "source" => once(&mut a.source, map.next_value()?, "source")?,
                "type" => once(&mut a.ty, map.next_value()?, "type")?,
                "subject" => once(&mut a.subject, map.next_value()?, "subject")?,
                PARTITION_KEY_EXTENSION => once(
                    &mut a.partition_key,
                    map.next_value::<Option<Scalar>>()?.map(|s| s.0),
                    PARTITION_KEY_EXTENSION,
                )?,
                // Skipped without building values: this is where the time goes for large
                // events, and routing does not need them.
                "data" | "data_base64" | "datacontenttype" | "dataschema" | "time" => {
                    map.next_value::<IgnoredAny>()?;
                }
                k if RESERVED_EXTENSIONS.contains(&k) => {
                    map.next_value::<IgnoredAny>()?;
                }
                _ => {
                    if let Some(Scalar(v)) = map.next_value::<Option<Scalar>>()? {
                        a.extensions.push((key.into_owned(), v));
                    }
                }
            }
        }
        Ok(a)
    }
}

fn once<E: de::Error>(slot: &mut Option<String>, v: Option<String>, name: &str) -> Result<(), E> {
    // Null means absent in the JSON event format; only a second real value is a duplicate.
    let Some(v) = v else {
        return Ok(());
    };
    if slot.is_some() {
        return Err(duplicate(name));
    }
    *slot = Some(v);
    Ok(())
}

fn duplicate<E: de::Error>(name: &str) -> E {
    E::custom(format_args!("attribute '{name}' appears more than once"))
}

/// A member name, borrowed from the record when it has no escapes.
struct Name<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Name<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_str(NameVisitor)
    }
}

struct NameVisitor;

impl<'de> Visitor<'de> for NameVisitor {
    type Value = Name<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Name<'de>, E> {
        Ok(Name(Cow::Borrowed(v)))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Name<'de>, E> {
        Ok(Name(Cow::Owned(v.to_owned())))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Name<'de>, E> {
        Ok(Name(Cow::Owned(v)))
    }
}

/// An extension value as the string filters compare against.
struct Scalar(String);

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ScalarVisitor)
    }
}

struct ScalarVisitor;

impl Visitor<'_> for ScalarVisitor {
    type Value = Scalar;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an extension value (string, boolean or integer)")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
        Ok(Scalar(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Scalar, E> {
        Ok(Scalar(v))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Scalar, E> {
        Ok(Scalar(v.to_string()))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
        Ok(Scalar(v.to_string()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
        Ok(Scalar(v.to_string()))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Scalar, E> {
        Ok(Scalar(v.to_string()))
    }
}
