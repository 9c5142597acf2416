//! Schemas the derive cannot write: the CloudEvent (its attributes are read by hand in
//! `event/`, not by serde, so its rules are written down here next to the reader's), and
//! the subscription as answered (every setting spelled out).
//!
//! `CloudEvent` and `DeliveredEvent` register under their names through a placeholder
//! `ToSchema`; [`install`] replaces the placeholders in the finished document with the
//! JSON Schemas below, which use keywords utoipa has no builder for (`patternProperties`,
//! `propertyNames`, `if`/`then`, `not`).

use serde::Serialize;
use serde_json::{json, Value};
use unimesh_core::{Ordering, StartFrom, SubscriptionSpec};
use utoipa::openapi::{ObjectBuilder, RefOr, Schema, Type};
use utoipa::{PartialSchema, ToSchema};

use crate::spec_json::FilterDoc;

/// A CloudEvent 1.0 in the JSON event format, as a publisher sends it.
pub struct CloudEvent;

/// A CloudEvent as delivered: the published event with `emmqpartition` and `emmqoffset`.
pub struct DeliveredEvent;

/// A batch of CloudEvents (batch mode), at most `limits.max_batch_events`.
pub struct CloudEventBatch;

impl PartialSchema for CloudEventBatch {
    fn schema() -> RefOr<Schema> {
        utoipa::openapi::schema::ArrayBuilder::new()
            .items(RefOr::Ref(utoipa::openapi::Ref::from_schema_name(
                "CloudEvent",
            )))
            .max_items(Some(1000))
            .description(Some(
                "A JSON array of CloudEvents (batch mode), at most `limits.max_batch_events`.",
            ))
            .into()
    }
}

impl ToSchema for CloudEventBatch {
    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push(("CloudEvent".to_owned(), CloudEvent::schema()));
    }
}

impl PartialSchema for CloudEvent {
    fn schema() -> RefOr<Schema> {
        placeholder()
    }
}

impl ToSchema for CloudEvent {}

impl PartialSchema for DeliveredEvent {
    fn schema() -> RefOr<Schema> {
        placeholder()
    }
}

impl ToSchema for DeliveredEvent {}

fn placeholder() -> RefOr<Schema> {
    ObjectBuilder::new().schema_type(Type::Object).into()
}

/// One character a URI may hold unescaped, or a percent escape (RFC 3986).
const URI_CHAR: &str = r"(?:[A-Za-z0-9\-._~:/?\[\]@!$&'()*+,;=]|%[0-9A-Fa-f]{2})";

/// The same, without the delimiters that end a first segment (`:`, `/`, `?`).
const SEGMENT_CHAR: &str = r"(?:[A-Za-z0-9\-._~\[\]@!$&'()*+,;=]|%[0-9A-Fa-f]{2})";

/// What `event::attrs::check_uri_reference` accepts: a scheme, or a first segment without a
/// colon; at most one fragment.
fn uri_reference_pattern() -> String {
    format!(
        r"^(?:[A-Za-z][A-Za-z0-9+.-]*:{u}*|{s}*(?:[/?]{u}*)?)(?:#{u}*)?$",
        u = URI_CHAR,
        s = SEGMENT_CHAR
    )
}

/// What `event::attrs::check_media_type` accepts: `type/subtype`, printable ASCII, optional
/// parameters.
const MEDIA_TYPE_PATTERN: &str =
    r"^[ \t]*[!-.0-:<-~][!-.0-:<-~ \t]*/[!-.0-:<-~ \t]*[!-.0-:<-~][ \t]*(?:;[ -~\t]*)?$";

/// Canonical padded base64 (what the reader decodes).
const BASE64_PATTERN: &str =
    "^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)?$";

/// JSON media types: their `data` is any JSON value; every other type's is a string.
const JSON_MEDIA_TYPE_PATTERN: &str = r"^[ \t]*(?:[Aa][Pp][Pp][Ll][Ii][Cc][Aa][Tt][Ii][Oo][Nn]/[Jj][Ss][Oo][Nn]|[Tt][Ee][Xx][Tt]/[Jj][Ss][Oo][Nn]|[!-.0-:<-~][!-.0-:<-~ \t]*/[!-.0-:<-~ \t]*\+[Jj][Ss][Oo][Nn])[ \t]*(?:;[ -~\t]*)?$";

/// The attributes shared by both schemas.
fn attributes(publish: bool) -> Value {
    let mut p = json!({
        "specversion": {"type": "string", "enum": ["1.0"]},
        "id": {"type": "string", "minLength": 1},
        "source": {"type": "string", "minLength": 1, "pattern": uri_reference_pattern(),
            "description": "A URI-reference (RFC 3986)."},
        "type": {"type": "string", "minLength": 1},
        "subject": {"type": ["string", "null"], "minLength": 1},
        "time": {"type": ["string", "null"], "format": "date-time", "description": "RFC 3339."},
        "datacontenttype": {"type": ["string", "null"], "pattern": MEDIA_TYPE_PATTERN,
            "description": "The media type of `data`; absent means JSON."},
        "dataschema": {"type": ["string", "null"], "format": "uri",
            "description": "An absolute URI."},
        "data": {"description": "Any JSON value when `datacontenttype` is JSON or absent; a \
            string otherwise (binary data goes in `data_base64`)."},
        "data_base64": {"type": ["string", "null"], "contentEncoding": "base64",
            "pattern": BASE64_PATTERN},
    });
    if !publish {
        p["emmqpartition"] = json!({"type": "string", "pattern": "^[0-9]+$",
            "description": "The partition the event is stored in."});
        p["emmqoffset"] = json!({"type": "string", "pattern": "^[0-9]+$",
            "description": "The event's offset in its partition."});
    }
    p
}

/// The JSON Schema of a CloudEvent as a publisher sends it (`publish`) or as it is
/// delivered.
fn cloudevent_schema(publish: bool) -> Value {
    let mut names = json!({
        "pattern": "^(?:[a-z0-9]{1,20}|data_base64)$",
        "description": "Extension names are 1 to 20 lower-case ASCII letters or digits."
    });
    if publish {
        names["not"] = json!({"enum": ["emmqoffset", "emmqpartition"]});
    }
    let mut required = vec!["specversion", "id", "source", "type"];
    if !publish {
        required.extend(["emmqpartition", "emmqoffset"]);
    }
    json!({
        "type": "object",
        "description": if publish {
            "A CloudEvent 1.0 (JSON event format). Extension attributes are strings, booleans \
             or 32-bit integers; `emmqoffset` and `emmqpartition` are set by the mesh on \
             delivery and refused here. A null attribute counts as absent."
        } else {
            "A CloudEvent 1.0 as delivered: the published event with the broker position \
             added as the extensions `emmqpartition` and `emmqoffset`."
        },
        "required": required,
        "properties": attributes(publish),
        "propertyNames": names,
        "additionalProperties": {
            "type": ["string", "integer", "boolean", "null"],
            "minimum": -2147483648i64,
            "maximum": 2147483647i64
        },
        "not": {
            "required": ["data", "data_base64"],
            "properties": {"data": {"not": {"type": "null"}}, "data_base64": {"type": "string"}}
        },
        "if": {
            "required": ["datacontenttype"],
            "properties": {"datacontenttype": {"type": "string",
                "not": {"pattern": JSON_MEDIA_TYPE_PATTERN}}}
        },
        "then": {"properties": {"data": {"type": ["string", "null"]}}}
    })
}

/// Replaces the placeholder schemas in a finished document.
pub fn install(doc: &mut Value) {
    let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    if schemas.contains_key("CloudEvent") {
        schemas.insert("CloudEvent".to_owned(), cloudevent_schema(true));
    }
    if schemas.contains_key("DeliveredEvent") {
        schemas.insert("DeliveredEvent".to_owned(), cloudevent_schema(false));
    }
}

/// A subscription as answered: the group and every setting, defaults spelled out.
#[derive(Clone, Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SubscriptionDefinition {
    group: String,
    topic: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    filter: Option<FilterDoc>,
    ack_timeout_ms: u64,
    max_attempts: u32,
    backoff: BackoffView,
    max_in_flight_per_client: u32,
    /// `none` or `key`.
    #[schema(pattern = "^(none|key)$")]
    ordering: &'static str,
    /// `earliest` or `latest`.
    #[schema(pattern = "^(earliest|latest)$")]
    start_from: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    push: Option<PushView>,
}

/// A group's webhook as `GET` shows it: the secret is never shown.
#[derive(Clone, Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct PushView {
    url: String,
    /// Whether pushes are signed (a `push.secret` was given).
    signed: bool,
    /// Most events per push (1: binary mode, one event per request).
    batch: u32,
}

#[derive(Clone, Copy, Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct BackoffView {
    initial_ms: u64,
    max_ms: u64,
    multiplier: f64,
}

impl SubscriptionDefinition {
    pub fn new(spec: &SubscriptionSpec) -> Self {
        let doc = crate::spec_json::SubscriptionDoc::from_spec(spec);
        Self {
            group: spec.group.as_str().to_owned(),
            topic: spec.topic.as_str().to_owned(),
            filter: doc.filter,
            ack_timeout_ms: spec.ack_timeout_ms,
            max_attempts: spec.max_attempts,
            backoff: BackoffView {
                initial_ms: spec.backoff.initial_ms,
                max_ms: spec.backoff.max_ms,
                multiplier: spec.backoff.multiplier,
            },
            max_in_flight_per_client: spec.max_in_flight_per_client,
            ordering: match spec.ordering {
                Ordering::None => "none",
                Ordering::Key => "key",
            },
            start_from: match spec.start_from {
                StartFrom::Earliest => "earliest",
                StartFrom::Latest(_) => "latest",
            },
            push: doc.push.map(|p| PushView {
                url: p.url,
                signed: p.secret.is_some(),
                batch: p.batch.unwrap_or(1),
            }),
        }
    }
}
