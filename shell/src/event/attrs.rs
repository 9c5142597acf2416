//! Validation of CloudEvents 1.0 context attributes, shared by the binary (headers) and the
//! structured (JSON members) readings of an event, so both modes accept exactly the same
//! events and refuse the rest with the same reasons.

use chrono::{DateTime, Utc};
use cloudevents::event::ExtensionValue;
use cloudevents::{AttributesWriter, Data, Event, EventBuilder, EventBuilderV10};
use url::Url;

use super::error::{Field, PublishError};
use super::trace_context::{TraceParent, TRACEPARENT, TRACESTATE};

/// Extension names the mesh sets itself on every delivery (docs/DESIGN.md §2). A publisher that
/// sets them would be asking the mesh to lie about the broker position, so they are refused.
pub const RESERVED_EXTENSIONS: [&str; 2] = ["emmqoffset", "emmqpartition"];

/// Longest extension name. The spec says SHOULD NOT exceed 20; the mesh makes it a MUST so
/// names stay usable as header suffixes and filter keys everywhere.
pub const EXTENSION_NAME_MAX: usize = 20;

/// Longest piece of publisher input echoed back in an error message.
const ECHO_MAX: usize = 64;

/// Where an event comes from: what a publisher sent, or what the mesh itself stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Origin {
    Publish,
    /// A stored record being rendered for delivery. Reserved extensions in it (only possible
    /// when something other than the mesh wrote the log) are dropped rather than refused,
    /// because the delivery sets them anyway.
    Stored,
}

/// How fields are named in errors: by attribute (JSON) or by HTTP header (binary mode).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Naming {
    Attribute,
    Header,
}

impl Naming {
    pub(crate) fn field(self, attribute: &str) -> Field {
        match self {
            Naming::Attribute => Field::Attribute(attribute.to_owned()),
            Naming::Header if attribute == "datacontenttype" => {
                Field::Header("content-type".to_owned())
            }
            Naming::Header => Field::Header(format!("ce-{attribute}")),
        }
    }
}

/// An attribute value as the wire gave it. Binary mode only has strings; JSON also has
/// booleans and numbers, and anything else is kept only to be refused by name.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum AttrValue {
    Str(String),
    Bool(bool),
    Int(i64),
    /// A value of another JSON type; the text says which ("a fractional number", "an array").
    Other(&'static str),
}

impl AttrValue {
    pub(crate) fn from_json(v: serde_json::Value) -> Option<AttrValue> {
        use serde_json::Value;
        Some(match v {
            // The JSON event format treats null as "absent".
            Value::Null => return None,
            Value::String(s) => AttrValue::Str(s),
            Value::Bool(b) => AttrValue::Bool(b),
            // `5.0` is the integer 5 (as in JSON Schema); a fraction is not an integer.
            Value::Number(n) => match n.as_i64().or_else(|| {
                n.as_f64()
                    .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
                    .map(|f| f as i64)
            }) {
                Some(i) => AttrValue::Int(i),
                None => AttrValue::Other("a non-integer or out-of-range number"),
            },
            Value::Array(_) => AttrValue::Other("an array"),
            Value::Object(_) => AttrValue::Other("an object"),
        })
    }
}

/// The attributes of one event while it is being read; `finish` turns it into an [`Event`].
#[derive(Debug)]
pub(crate) struct Draft {
    origin: Origin,
    naming: Naming,
    specversion: Option<String>,
    id: Option<String>,
    source: Option<String>,
    ty: Option<String>,
    subject: Option<String>,
    time: Option<DateTime<Utc>>,
    datacontenttype: Option<String>,
    dataschema: Option<Url>,
    extensions: Vec<(String, ExtensionValue)>,
}

impl Draft {
    pub(crate) fn new(origin: Origin, naming: Naming) -> Self {
        Self {
            origin,
            naming,
            specversion: None,
            id: None,
            source: None,
            ty: None,
            subject: None,
            time: None,
            datacontenttype: None,
            dataschema: None,
            extensions: Vec::new(),
        }
    }

    pub(crate) fn datacontenttype(&self) -> Option<&str> {
        self.datacontenttype.as_deref()
    }

    fn err(&self, attribute: &str, why: impl Into<String>) -> PublishError {
        PublishError::invalid(Some(self.naming.field(attribute)), why)
    }

    /// Takes one context attribute or extension. `data` and `data_base64` are not
    /// attributes: the caller handles them.
    pub(crate) fn set(&mut self, name: &str, value: AttrValue) -> Result<(), PublishError> {
        match name {
            "specversion" => {
                let v = self.string(name, value)?;
                if v != "1.0" {
                    return Err(self.err(
                        name,
                        format!(
                            "must be \"1.0\" (got {}): only CloudEvents 1.0 is accepted",
                            echo(&v)
                        ),
                    ));
                }
                put(self.naming, &mut self.specversion, name, v)
            }
            "id" => {
                let v = self.non_empty(name, value)?;
                put(self.naming, &mut self.id, name, v)
            }
            "type" => {
                let v = self.non_empty(name, value)?;
                put(self.naming, &mut self.ty, name, v)
            }
            "subject" => {
                let v = self.non_empty(name, value)?;
                put(self.naming, &mut self.subject, name, v)
            }
            "source" => {
                let v = self.non_empty(name, value)?;
                check_uri_reference(&v).map_err(|why| self.err(name, why))?;
                put(self.naming, &mut self.source, name, v)
            }
            "datacontenttype" => {
                let v = self.non_empty(name, value)?;
                check_media_type(&v).map_err(|why| self.err(name, why))?;
                put(self.naming, &mut self.datacontenttype, name, v)
            }
            "dataschema" => {
                let v = self.non_empty(name, value)?;
                let url = Url::parse(&v).map_err(|e| {
                    self.err(name, format!("must be an absolute URI ({e}): {}", echo(&v)))
                })?;
                put(self.naming, &mut self.dataschema, name, url)
            }
            "time" => {
                let v = self.non_empty(name, value)?;
                let t = DateTime::parse_from_rfc3339(&v).map_err(|e| {
                    self.err(
                        name,
                        format!("must be an RFC 3339 timestamp ({e}): {}", echo(&v)),
                    )
                })?;
                put(self.naming, &mut self.time, name, t.with_timezone(&Utc))
            }
            _ => self.set_extension(name, value),
        }
    }

    fn set_extension(&mut self, name: &str, value: AttrValue) -> Result<(), PublishError> {
        check_extension_name(name).map_err(|why| self.err(name, why))?;
        if RESERVED_EXTENSIONS.contains(&name) {
            return match self.origin {
                Origin::Stored => Ok(()),
                Origin::Publish => Err(self.err(
                    name,
                    "is reserved: the mesh sets it on delivery to the broker position",
                )),
            };
        }
        if self.origin == Origin::Publish && matches!(name, TRACEPARENT | TRACESTATE) {
            // The distributed-tracing extension: strings; a `traceparent` that is not W3C
            // trace context is refused (DESIGN.md §8), `tracestate` is kept as written.
            let v = self.string(name, value)?;
            if name == TRACEPARENT {
                TraceParent::parse(&v).map_err(|why| self.err(name, why))?;
            }
            self.extensions
                .push((name.to_owned(), ExtensionValue::String(v)));
            return Ok(());
        }
        let v = match value {
            AttrValue::Str(s) => ExtensionValue::String(s),
            AttrValue::Bool(b) => ExtensionValue::Boolean(b),
            // CloudEvents Integer is 32-bit signed; a wider number would not survive other
            // SDKs and brokers.
            AttrValue::Int(i) if i32::try_from(i).is_ok() => ExtensionValue::Integer(i),
            AttrValue::Int(i) => {
                return Err(self.err(
                    name,
                    format!("is out of the CloudEvents Integer range (32-bit signed): {i}"),
                ))
            }
            AttrValue::Other(what) => {
                return Err(self.err(
                    name,
                    format!("must be a string, a boolean or an integer, not {what}"),
                ))
            }
        };
        // No duplicate check here: callers hand each name once (JSON members are refused
        // when repeated, `HeaderMap::keys` yields a name once), and a scan per extension
        // would be quadratic in a hostile event with thousands of them.
        self.extensions.push((name.to_owned(), v));
        Ok(())
    }

    fn string(&self, name: &str, value: AttrValue) -> Result<String, PublishError> {
        match value {
            AttrValue::Str(s) => Ok(s),
            AttrValue::Bool(_) => Err(self.err(name, "must be a string, not a boolean")),
            AttrValue::Int(_) => Err(self.err(name, "must be a string, not a number")),
            AttrValue::Other(what) => Err(self.err(name, format!("must be a string, not {what}"))),
        }
    }

    fn non_empty(&self, name: &str, value: AttrValue) -> Result<String, PublishError> {
        let s = self.string(name, value)?;
        if s.is_empty() {
            return Err(self.err(name, "must not be empty"));
        }
        Ok(s)
    }

    /// Checks that the required attributes are there and builds the event.
    pub(crate) fn finish(self, data: Option<Data>) -> Result<Event, PublishError> {
        for (name, present) in [
            ("specversion", self.specversion.is_some()),
            ("id", self.id.is_some()),
            ("source", self.source.is_some()),
            ("type", self.ty.is_some()),
        ] {
            if !present {
                return Err(self.err(name, "is missing"));
            }
        }
        let mut builder = EventBuilderV10::new();
        if let (Some(id), Some(source), Some(ty)) = (self.id, self.source, self.ty) {
            builder = builder.id(id).source(source).ty(ty);
        }
        let mut event = builder
            .build()
            .map_err(|e| PublishError::invalid(None, format!("is not a valid event: {e}")))?;
        event.set_subject(self.subject);
        event.set_time(self.time);
        event.set_datacontenttype(self.datacontenttype);
        event.set_dataschema(self.dataschema);
        if let Some(d) = data {
            event.set_data_unchecked(d);
        }
        for (k, v) in self.extensions {
            event.set_extension(&k, v);
        }
        Ok(event)
    }
}

fn put<T>(naming: Naming, slot: &mut Option<T>, name: &str, v: T) -> Result<(), PublishError> {
    if slot.is_some() {
        return Err(PublishError::invalid(
            Some(naming.field(name)),
            "appears more than once",
        ));
    }
    *slot = Some(v);
    Ok(())
}

/// Whether data of this media type is JSON, so the `data` member holds it as a JSON value.
/// An absent content type means JSON (CloudEvents JSON format §3.1). Parameters and letter
/// case are ignored: `application/vnd.x+json; charset=utf-8` is JSON.
pub(crate) fn is_json_media_type(content_type: Option<&str>) -> bool {
    let Some(ct) = content_type else {
        return true;
    };
    let essence = ct.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("application/json")
        || essence.eq_ignore_ascii_case("text/json")
        || (essence.len() > 5
            && essence.is_char_boundary(essence.len() - 5)
            && essence[essence.len() - 5..].eq_ignore_ascii_case("+json"))
}

/// Whether data of this media type is text that reads well as a JSON string.
pub(crate) fn is_text_media_type(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim();
    let lower = essence.to_ascii_lowercase();
    lower.starts_with("text/") || lower == "application/xml" || lower.ends_with("+xml")
}

/// `[a-z0-9]{1,20}`.
pub(crate) fn check_extension_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("is not a valid extension name: it is empty".to_owned());
    }
    if name.len() > EXTENSION_NAME_MAX {
        return Err(format!(
            "is not a valid extension name: longer than {EXTENSION_NAME_MAX} characters"
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit()))
    {
        return Err(format!(
            "is not a valid extension name: {c:?} is not a lower-case letter or digit"
        ));
    }
    Ok(())
}

/// A media type that can also travel as the `content-type` header of a webhook push:
/// `type/subtype` with optional parameters, printable ASCII only.
fn check_media_type(v: &str) -> Result<(), String> {
    if let Some(c) = v
        .chars()
        .find(|c| !(c.is_ascii_graphic() || *c == ' ' || *c == '\t'))
    {
        return Err(format!(
            "must be a media type of printable ASCII (RFC 2046), found {c:?}: {}",
            echo(v)
        ));
    }
    let essence = v.split(';').next().unwrap_or("").trim();
    match essence.split_once('/') {
        Some((t, s)) if !t.is_empty() && !s.is_empty() && !s.contains('/') => Ok(()),
        _ => Err(format!(
            "must be a media type like 'type/subtype': {}",
            echo(v)
        )),
    }
}

/// RFC 3986 URI-reference: only the characters a URI may hold, well-formed percent escapes,
/// at most one fragment, and a valid scheme when a colon comes before any `/`, `?` or `#`
/// (a relative reference cannot have a colon in its first segment).
pub(crate) fn check_uri_reference(v: &str) -> Result<(), String> {
    let bytes = v.as_bytes();
    let mut i = 0;
    let mut fragments = 0;
    while i < bytes.len() {
        let b = bytes[i];
        match b {
            b'%' => {
                let ok = bytes.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                    && bytes.get(i + 2).is_some_and(u8::is_ascii_hexdigit);
                if !ok {
                    return Err(format!(
                        "must be a URI-reference (RFC 3986): bad percent escape at byte {i}: {}",
                        echo(v)
                    ));
                }
                i += 3;
                continue;
            }
            b'#' => fragments += 1,
            b if b.is_ascii_alphanumeric() || b"-._~:/?[]@!$&'()*+,;=".contains(&b) => {}
            _ => {
                let c = v[i..].chars().next().unwrap_or('\u{FFFD}');
                return Err(format!(
                    "must be a URI-reference (RFC 3986): {c:?} at byte {i} must be percent-encoded: {}",
                    echo(v)
                ));
            }
        }
        i += 1;
    }
    if fragments > 1 {
        return Err(format!(
            "must be a URI-reference (RFC 3986): more than one '#': {}",
            echo(v)
        ));
    }
    let first_delim = v.find(['/', '?', '#']).unwrap_or(v.len());
    if let Some(colon) = v[..first_delim].find(':') {
        let scheme = &v[..colon];
        let valid = scheme
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
        if !valid {
            return Err(format!(
                "must be a URI-reference (RFC 3986): {} is not a valid scheme: {}",
                echo(scheme),
                echo(v)
            ));
        }
    }
    Ok(())
}

/// Publisher text quoted for an error message, cut to a bounded length.
pub(crate) fn echo(s: &str) -> String {
    if s.chars().count() <= ECHO_MAX {
        return format!("{s:?}");
    }
    let cut: String = s.chars().take(ECHO_MAX).collect();
    format!("{cut:?}…")
}
