//! The subscription document of the HTTP API (docs/DESIGN.md §5.1): the body of
//! `PUT /v1/subscriptions/{group}` and the definition part of its `GET` answer.
//!
//! ```json
//! {"topic": "orders",
//!  "filter": {"type": "order.created", "source": "/shop", "subject": "eu/42",
//!             "subjectPrefix": "eu/", "typePrefix": "order.", "extensions": {"tier": "gold"}},
//!  "ackTimeoutMs": 30000, "maxAttempts": 16,
//!  "backoff": {"initialMs": 1000, "maxMs": 60000, "multiplier": 2.0},
//!  "maxInFlightPerClient": 100, "ordering": "none", "startFrom": "earliest",
//!  "push": {"url": "https://example.com/hook"}}
//! ```
//!
//! Only `topic` is required; everything else defaults to [`SubscriptionSpec::new`].
//! User input goes through [`SubscriptionDoc::from_json`], which names the offending field in
//! every error (`{"field": "backoff.multiplier", "message": "..."}`): the derived decoder runs
//! under `serde_path_to_error`, which tracks where serde was when its message arose. The
//! stored codec (`state::codec`) decodes the same type with the same derive.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use unimesh_core::{
    Backoff, Filter, GroupName, Ordering, StartFrom, SubscriptionLimits, SubscriptionSpec,
    TopicName,
};
use utoipa::ToSchema;

/// Longest accepted webhook URL, in bytes.
pub const MAX_PUSH_URL_BYTES: usize = 2_048;

/// What a webhook URL must look like: `http` or `https`, a host name, an IPv4 address or an
/// IPv6 address in brackets, an optional port, path and query, nothing else (no user info,
/// no fragment).
pub const PUSH_URL_PATTERN: &str = r"^https?://(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])(?::(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4}))?(?:/[A-Za-z0-9._~!$&'()*+,;=:@%/-]*)?(?:\?[A-Za-z0-9._~!$&'()*+,;=:@%/?-]*)?$";

/// [`PUSH_URL_PATTERN`] after the host: optional port, path and query.
pub const PUSH_URL_AFTER_HOST: &str = r"(?::(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4}))?(?:/[A-Za-z0-9._~!$&'()*+,;=:@%/-]*)?(?:\?[A-Za-z0-9._~!$&'()*+,;=:@%/?-]*)?$";

/// The members of [`SubscriptionDoc`] that are objects.
const OBJECT_MEMBERS: [&str; 3] = ["filter", "backoff", "push"];

/// Longest accepted filter value (type, source, subject, prefixes, extension values), in bytes.
pub const MAX_FILTER_VALUE_BYTES: usize = 1_024;

/// A subscription as the HTTP API spells it (the body of `PUT /v1/subscriptions/{group}`).
/// Only `topic` is required. The bounds in the schema are those of the default
/// configuration; the served document carries the configured ones.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SubscriptionDoc {
    /// The topic; cannot change once the group exists.
    #[schema(pattern = r"^[A-Za-z0-9._-]{1,200}$")]
    pub topic: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<FilterDoc>,
    /// A delivery not ACKed within this is redelivered (default 30000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 43200000)]
    pub ack_timeout_ms: Option<u64>,
    /// Deliveries of one event before it is dead-lettered (default 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1000)]
    pub max_attempts: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<BackoffDoc>,
    /// Deliveries one client may hold unACKed (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 10000)]
    pub max_in_flight_per_client: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering: Option<OrderingDoc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_from: Option<StartFromDoc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push: Option<PushDoc>,
}

/// CloudEvents attribute conditions; all present ones must hold. Values are at most 1024
/// characters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FilterDoc {
    /// The event's `type` equals this.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 1024)]
    pub ty: Option<String>,
    /// The event's `source` equals this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 1024)]
    pub source: Option<String>,
    /// The event's `subject` equals this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 1024)]
    pub subject: Option<String>,
    /// The event's `subject` starts with this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 1024)]
    pub subject_prefix: Option<String>,
    /// The event's `type` starts with this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 1024)]
    pub type_prefix: Option<String>,
    /// Extension attributes equal to these values (names: 1 to 64 lower-case ASCII letters
    /// or digits; at most 16 conditions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = extension_conditions)]
    pub extensions: Option<BTreeMap<String, String>>,
}

/// The schema of `filter.extensions`: a map with constrained names and values.
fn extension_conditions() -> utoipa::openapi::Object {
    use utoipa::openapi::schema::{AdditionalProperties, ObjectBuilder, Type};
    ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::SchemaType::from_iter([
            Type::Object,
            Type::Null,
        ]))
        .property_names(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some("^[a-z0-9]{1,64}$")),
        ))
        .additional_properties(Some(AdditionalProperties::RefOr(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .max_length(Some(MAX_FILTER_VALUE_BYTES))
                .into(),
        )))
        .max_properties(Some(unimesh_core::filter::MAX_FILTER_EXTENSIONS))
        .build()
}

/// Redelivery backoff; absent members take their defaults (1000, 60000, 2; an absent
/// `initialMs` is at most the given `maxMs`, an absent `maxMs` at least the given
/// `initialMs`). A given `initialMs` must not exceed a given `maxMs` (400 otherwise: a
/// relation JSON Schema cannot state).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BackoffDoc {
    /// The delay before the second attempt (default 1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 86400000)]
    pub initial_ms: Option<u64>,
    /// The longest delay (default 60000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 86400000)]
    pub max_ms: Option<u64>,
    /// Each delay is the previous one times this (default 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 100)]
    pub multiplier: Option<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OrderingDoc {
    None,
    Key,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum StartFromDoc {
    Earliest,
    Latest,
}

/// Webhook push: every delivery is POSTed to `url` as a binary-mode CloudEvent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PushDoc {
    /// An `http://` or `https://` URL with a host name, an IPv4 address or an IPv6 address
    /// in brackets, at most 2048 characters. Where it may point: `push.allowed_hosts`.
    #[schema(
        pattern = r"^https?://(?:[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])(?::(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4}))?(?:/[A-Za-z0-9._~!$&'()*+,;=:@%/-]*)?(?:\?[A-Za-z0-9._~!$&'()*+,;=:@%/?-]*)?$",
        max_length = 2048
    )]
    pub url: String,
    /// Signs every push in the style of Standard Webhooks: `whsec_` and the base64 of 24 to
    /// 64 random bytes (the HMAC-SHA256 key). Each push then carries `webhook-id`,
    /// `webhook-timestamp` and `webhook-signature: v1,<base64 HMAC of "id.timestamp.body">`.
    /// Never shown again: `GET` answers `signed: true` instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        pattern = r"^whsec_(?:[A-Za-z0-9+/]{4}){8,20}(?:[A-Za-z0-9+/]{4}|[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$",
        write_only
    )]
    pub secret: Option<String>,
    /// Most events in one push (default 1). 1: each event is POSTed alone in binary mode;
    /// more: the events at hand, up to this many, are POSTed together as a CloudEvents
    /// batch (`application/cloudevents-batch+json`, structured events with
    /// `emmqpartition`/`emmqoffset`), and the answer settles all of them: 2xx ACKs the
    /// batch, anything else NACKs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 1000)]
    pub batch: Option<u32>,
}

/// Most events in one webhook push (`push.batch`).
pub const MAX_PUSH_BATCH: u32 = 1_000;

/// The smallest and largest signing key, in bytes (Standard Webhooks: 24 to 64).
pub const PUSH_SECRET_BYTES: std::ops::RangeInclusive<usize> = 24..=64;

/// The HMAC key of a push secret (`whsec_` and base64), or why it is none.
pub fn push_secret_key(secret: &str) -> Result<Vec<u8>, &'static str> {
    use base64::Engine as _;
    let Some(b64) = secret.strip_prefix("whsec_") else {
        return Err("must start with whsec_ (then the base64 of 24 to 64 random bytes)");
    };
    // Lenient about the unused bits of the last character, as most decoders are (Python's).
    const LENIENT: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true),
    );
    let key = LENIENT
        .decode(b64)
        .map_err(|_| "is not whsec_ followed by base64")?;
    if !PUSH_SECRET_BYTES.contains(&key.len()) {
        return Err("must hold 24 to 64 bytes (whsec_ and base64)");
    }
    Ok(key)
}

/// A refused document: which field (dotted path, empty for the whole body) and why.
/// Serializes as `{"field": "...", "message": "..."}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.field.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

impl std::error::Error for FieldError {}

impl SubscriptionDoc {
    /// Parses a request body. Unknown fields, wrong types and malformed JSON are refused with
    /// the dotted path of the field at fault. Values are not range-checked here: that is
    /// [`SubscriptionDoc::into_spec`]'s job.
    pub fn from_json(body: &[u8]) -> Result<Self, FieldError> {
        let mut value: Value = serde_json::from_slice(body)
            .map_err(|e| FieldError::new("", format!("the body is not valid JSON: {e}")))?;
        if !value.is_object() {
            let message = format!("must be a JSON object, not {}", kind(&value));
            return Err(FieldError::new("", message));
        }
        // The one required member first: a misspelt `topic` is reported as missing, not as
        // an unknown member.
        if value.get("topic").is_none_or(Value::is_null) {
            return Err(FieldError::new("topic", "is required"));
        }
        // serde's derived structs also take an array of their fields in order; the
        // document's nested members are objects only.
        for name in OBJECT_MEMBERS {
            if value.get(name).is_some_and(Value::is_array) {
                return Err(FieldError::new(name, "must be a JSON object, not an array"));
            }
        }
        crate::json_numbers::integral_floats(&mut value);
        serde_path_to_error::deserialize(value).map_err(field_error)
    }

    /// Converts into a spec for `group` and checks it against `limits`. `startFrom: latest`
    /// gives `StartFrom::Latest` with an empty map: the engine fills in the end offsets it
    /// reads from the broker when the group is created.
    pub fn into_spec(
        self,
        group: GroupName,
        limits: &SubscriptionLimits,
    ) -> Result<SubscriptionSpec, FieldError> {
        let spec = self.into_spec_unchecked(group)?;
        spec.validate(limits)
            .map_err(|e| FieldError::new(e.field, e.why))?;
        Ok(spec)
    }

    /// The structural part of the conversion (names, formats), without the limits, so a
    /// stored spec can be read back even when the configured limits changed since; the core
    /// validates recovered specs against the limits in force.
    pub(crate) fn into_spec_unchecked(
        self,
        group: GroupName,
    ) -> Result<SubscriptionSpec, FieldError> {
        let topic = TopicName::new(&self.topic).map_err(|e| FieldError::new("topic", e.reason))?;
        let mut spec = SubscriptionSpec::new(group, topic);
        if let Some(f) = self.filter {
            spec.filter = filter_from_doc(f)?;
        }
        if let Some(v) = self.ack_timeout_ms {
            spec.ack_timeout_ms = v;
        }
        if let Some(v) = self.max_attempts {
            spec.max_attempts = v;
        }
        if let Some(b) = self.backoff {
            let d = Backoff::default();
            // A default never conflicts with what was given: an absent `initialMs` is at
            // most the given `maxMs`, an absent `maxMs` at least the given `initialMs`.
            // Only two given values can disagree (refused by `validate`).
            let (initial_ms, max_ms) = match (b.initial_ms, b.max_ms) {
                (Some(i), Some(m)) => (i, m),
                (Some(i), None) => (i, d.max_ms.max(i)),
                (None, Some(m)) => (d.initial_ms.min(m), m),
                (None, None) => (d.initial_ms, d.max_ms),
            };
            spec.backoff = Backoff {
                initial_ms,
                max_ms,
                multiplier: b.multiplier.unwrap_or(d.multiplier),
            };
        }
        if let Some(v) = self.max_in_flight_per_client {
            spec.max_in_flight_per_client = v;
        }
        spec.ordering = match self.ordering {
            None | Some(OrderingDoc::None) => Ordering::None,
            Some(OrderingDoc::Key) => Ordering::Key,
        };
        spec.start_from = match self.start_from {
            None | Some(StartFromDoc::Earliest) => StartFrom::Earliest,
            Some(StartFromDoc::Latest) => StartFrom::Latest(BTreeMap::new()),
        };
        if let Some(p) = self.push {
            check_push_url(&p.url)?;
            if let Some(secret) = &p.secret {
                push_secret_key(secret).map_err(|why| FieldError::new("push.secret", why))?;
            }
            if let Some(batch) = p.batch {
                if batch == 0 || batch > MAX_PUSH_BATCH {
                    return Err(FieldError::new(
                        "push.batch",
                        format!("must be between 1 and {MAX_PUSH_BATCH}"),
                    ));
                }
                spec.push_batch = batch;
            }
            spec.push_url = Some(p.url);
            spec.push_secret = p.secret;
        }
        Ok(spec)
    }

    /// The document of a spec, every setting spelled out (for `GET`). The end offsets of
    /// `StartFrom::Latest` are not part of the API document.
    pub fn from_spec(spec: &SubscriptionSpec) -> Self {
        let f = &spec.filter;
        let filter = (!f.is_empty()).then(|| FilterDoc {
            ty: f.ty.clone(),
            source: f.source.clone(),
            subject: f.subject.clone(),
            subject_prefix: f.subject_prefix.clone(),
            type_prefix: f.type_prefix.clone(),
            extensions: (!f.extensions.is_empty())
                .then(|| f.extensions.iter().cloned().collect::<BTreeMap<_, _>>()),
        });
        SubscriptionDoc {
            topic: spec.topic.as_str().to_owned(),
            filter,
            ack_timeout_ms: Some(spec.ack_timeout_ms),
            max_attempts: Some(spec.max_attempts),
            backoff: Some(BackoffDoc {
                initial_ms: Some(spec.backoff.initial_ms),
                max_ms: Some(spec.backoff.max_ms),
                multiplier: Some(spec.backoff.multiplier),
            }),
            max_in_flight_per_client: Some(spec.max_in_flight_per_client),
            ordering: Some(match spec.ordering {
                Ordering::None => OrderingDoc::None,
                Ordering::Key => OrderingDoc::Key,
            }),
            start_from: Some(match spec.start_from {
                StartFrom::Earliest => StartFromDoc::Earliest,
                StartFrom::Latest(_) => StartFromDoc::Latest,
            }),
            push: spec.push_url.as_ref().map(|url| PushDoc {
                url: url.clone(),
                secret: spec.push_secret.clone(),
                batch: (spec.push_batch > 1).then_some(spec.push_batch),
            }),
        }
    }
}

/// Parses and validates a `PUT /v1/subscriptions/{group}` body in one step.
pub fn parse_subscription(
    group: GroupName,
    body: &[u8],
    limits: &SubscriptionLimits,
) -> Result<SubscriptionSpec, FieldError> {
    SubscriptionDoc::from_json(body)?.into_spec(group, limits)
}

fn filter_from_doc(doc: FilterDoc) -> Result<Filter, FieldError> {
    let value = |name: &str, v: Option<String>| -> Result<Option<String>, FieldError> {
        match v {
            Some(s) if s.chars().count() > MAX_FILTER_VALUE_BYTES => Err(FieldError::new(
                format!("filter.{name}"),
                format!("longer than {MAX_FILTER_VALUE_BYTES} characters"),
            )),
            other => Ok(other),
        }
    };
    let mut extensions = Vec::new();
    for (name, v) in doc.extensions.unwrap_or_default() {
        // CloudEvents 1.0 attribute names: lower-case ASCII letters and digits. A condition
        // on any other name could never match, so it is refused rather than kept silently.
        if name.is_empty()
            || name.len() > 64
            || !name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        {
            return Err(FieldError::new(
                format!("filter.extensions.{name}"),
                "an extension name is 1 to 64 lower-case ASCII letters or digits",
            ));
        }
        if v.chars().count() > MAX_FILTER_VALUE_BYTES {
            return Err(FieldError::new(
                format!("filter.extensions.{name}"),
                format!("longer than {MAX_FILTER_VALUE_BYTES} characters"),
            ));
        }
        extensions.push((name, v));
    }
    // BTreeMap iteration already sorted the names, as `Filter::extensions` requires.
    Ok(Filter {
        ty: value("type", doc.ty)?,
        type_prefix: value("typePrefix", doc.type_prefix)?,
        source: value("source", doc.source)?,
        subject: value("subject", doc.subject)?,
        subject_prefix: value("subjectPrefix", doc.subject_prefix)?,
        extensions,
    })
}

fn check_push_url(url: &str) -> Result<(), FieldError> {
    let bad = |why: &str| Err(FieldError::new("push.url", why));
    if url.len() > MAX_PUSH_URL_BYTES {
        return bad("longer than 2048 bytes");
    }
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return bad("must be an http:// or https:// URL");
    }
    if !push_url_regex().is_match(url) {
        return bad(
            "is not a valid URL: a host name, an IPv4 address or an IPv6 address in \
             brackets, an optional port, path and query; no user info, no fragment",
        );
    }
    if let Some(rest) = url.split_once("://[").map(|(_, r)| r) {
        let literal = rest.split(']').next().unwrap_or("");
        if literal.parse::<std::net::Ipv6Addr>().is_err() {
            return bad("is not a valid URL: the part in brackets is not an IPv6 address");
        }
    }
    // The pattern admits only what `http::Uri` reads; checked anyway, since the pusher
    // parses it again.
    match url.parse::<http::Uri>() {
        Ok(u) if u.host().is_some_and(|h| !h.is_empty()) => Ok(()),
        _ => bad("is not a valid URL"),
    }
}

fn push_url_regex() -> &'static regex::Regex {
    static RE: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    // A constant pattern, compiled by a unit test on every run: it cannot fail here.
    RE.get_or_init(|| regex::Regex::new(PUSH_URL_PATTERN).expect("PUSH_URL_PATTERN compiles"))
}

fn path(parent: &str, name: &str) -> String {
    if parent.is_empty() {
        name.to_owned()
    } else {
        format!("{parent}.{name}")
    }
}

/// The field a decoding error is about: the path serde_path_to_error tracked (an unknown
/// member's own name included), and for a missing member its name too (serde gives it only
/// in its message; the path ends at the object that lacks it).
fn field_error(e: serde_path_to_error::Error<serde_json::Error>) -> FieldError {
    let at = e.path().to_string();
    let at = if at == "." { String::new() } else { at };
    let message = e.into_inner().to_string();
    let member = message
        .strip_prefix("missing field `")
        .and_then(|rest| rest.split('`').next());
    let field = match member {
        Some(name) => path(&at, name),
        None => at,
    };
    FieldError::new(field, message)
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group() -> GroupName {
        GroupName::new("g1").unwrap()
    }

    fn parse(json: &str) -> Result<SubscriptionSpec, FieldError> {
        parse_subscription(group(), json.as_bytes(), &SubscriptionLimits::default())
    }

    fn field_of(json: &str) -> String {
        match parse(json) {
            Ok(spec) => panic!("accepted {json}: {spec:?}"),
            Err(e) => e.field,
        }
    }

    #[test]
    fn topic_alone_gives_the_defaults() {
        let spec = parse(r#"{"topic":"orders"}"#).unwrap();
        let want = SubscriptionSpec::new(group(), TopicName::new("orders").unwrap());
        assert_eq!(spec, want);
    }

    #[test]
    fn every_field_is_carried_over() {
        let spec = parse(
            r#"{"topic":"orders",
                "filter":{"type":"order.created","source":"/shop","subject":"eu/42",
                          "subjectPrefix":"eu/","typePrefix":"order.",
                          "extensions":{"tier":"gold","region":"eu"}},
                "ackTimeoutMs":5000,"maxAttempts":3,
                "backoff":{"initialMs":10,"maxMs":500,"multiplier":1.5},
                "maxInFlightPerClient":7,"ordering":"key","startFrom":"latest",
                "push":{"url":"https://hooks.example.com/in?x=1"}}"#,
        )
        .unwrap();
        assert_eq!(spec.filter.ty.as_deref(), Some("order.created"));
        assert_eq!(spec.filter.source.as_deref(), Some("/shop"));
        assert_eq!(spec.filter.subject.as_deref(), Some("eu/42"));
        assert_eq!(spec.filter.subject_prefix.as_deref(), Some("eu/"));
        assert_eq!(spec.filter.type_prefix.as_deref(), Some("order."));
        assert_eq!(
            spec.filter.extensions,
            vec![
                ("region".to_owned(), "eu".to_owned()),
                ("tier".to_owned(), "gold".to_owned())
            ]
        );
        assert_eq!(spec.ack_timeout_ms, 5000);
        assert_eq!(spec.max_attempts, 3);
        assert_eq!(
            spec.backoff,
            Backoff {
                initial_ms: 10,
                max_ms: 500,
                multiplier: 1.5
            }
        );
        assert_eq!(spec.max_in_flight_per_client, 7);
        assert_eq!(spec.ordering, Ordering::Key);
        assert_eq!(spec.start_from, StartFrom::Latest(BTreeMap::new()));
        assert_eq!(
            spec.push_url.as_deref(),
            Some("https://hooks.example.com/in?x=1")
        );
    }

    #[test]
    fn the_push_url_pattern_ends_with_the_after_host_part() {
        assert!(PUSH_URL_PATTERN.ends_with(PUSH_URL_AFTER_HOST));
    }

    #[test]
    fn push_secrets_are_standard_webhooks_keys() {
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        let spec = parse(&format!(
            r#"{{"topic":"t","push":{{"url":"http://h/x","secret":"{secret}"}}}}"#
        ))
        .expect("a valid secret");
        assert_eq!(spec.push_secret.as_deref(), Some(secret));
        assert_eq!(push_secret_key(secret).map(|k| k.len()), Ok(24));
        // Stored and read back with the definition.
        let doc = SubscriptionDoc::from_spec(&spec);
        assert_eq!(doc.push.and_then(|p| p.secret).as_deref(), Some(secret));
        for bad in [
            "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "whsec_!!",
            "whsec_c2hvcnQ=",
        ] {
            let e = parse(&format!(
                r#"{{"topic":"t","push":{{"url":"http://h/x","secret":"{bad}"}}}}"#
            ))
            .expect_err(bad);
            assert_eq!(e.field, "push.secret", "{bad}");
        }
    }

    #[test]
    fn ipv6_literals_are_push_urls() {
        for url in ["http://[::1]:9000/", "https://[2001:db8::7]/in?x=1"] {
            let spec = parse(&format!(r#"{{"topic":"t","push":{{"url":"{url}"}}}}"#))
                .unwrap_or_else(|e| panic!("{url}: {e:?}"));
            assert_eq!(spec.push_url.as_deref(), Some(url));
        }
        for url in ["http://[zz::1]/", "http://[::1/", "http://[1.2.3.4]/"] {
            assert!(
                parse(&format!(r#"{{"topic":"t","push":{{"url":"{url}"}}}}"#)).is_err(),
                "{url}"
            );
        }
    }

    #[test]
    fn an_absent_backoff_bound_never_conflicts_with_the_given_one() {
        let spec = parse(r#"{"topic":"t","backoff":{"maxMs":0}}"#).unwrap();
        assert_eq!((spec.backoff.initial_ms, spec.backoff.max_ms), (0, 0));
        let spec = parse(r#"{"topic":"t","backoff":{"initialMs":90000}}"#).unwrap();
        assert_eq!(
            (spec.backoff.initial_ms, spec.backoff.max_ms),
            (90_000, 90_000)
        );
        assert!(parse(r#"{"topic":"t","backoff":{"initialMs":10,"maxMs":5}}"#).is_err());
    }

    #[test]
    fn partial_backoff_takes_defaults_for_the_rest() {
        let spec = parse(r#"{"topic":"t","backoff":{"initialMs":5}}"#).unwrap();
        let d = Backoff::default();
        assert_eq!(spec.backoff.initial_ms, 5);
        assert_eq!(spec.backoff.max_ms, d.max_ms);
        assert_eq!(spec.backoff.multiplier, d.multiplier);
    }

    #[test]
    fn nulls_count_as_absent() {
        let spec = parse(r#"{"topic":"t","filter":null,"ordering":null}"#).unwrap();
        assert_eq!(spec.filter, Filter::default());
        assert_eq!(spec.ordering, Ordering::None);
    }

    #[test]
    fn errors_name_the_field() {
        let cases = [
            (r#"{}"#, "topic"),
            (r#"{"topc":"t"}"#, "topic"),
            (r#"{"topic":null}"#, "topic"),
            (r#"{"topic":"a/b"}"#, "topic"),
            (r#"{"topic":7}"#, "topic"),
            (r#"{"topic":"t","tpoic":"x"}"#, "tpoic"),
            (r#"{"topic":"t","ackTimeoutMs":0}"#, "ackTimeoutMs"),
            (r#"{"topic":"t","ackTimeoutMs":-5}"#, "ackTimeoutMs"),
            (r#"{"topic":"t","ackTimeoutMs":"5"}"#, "ackTimeoutMs"),
            (r#"{"topic":"t","maxAttempts":0}"#, "maxAttempts"),
            (r#"{"topic":"t","maxAttempts":4294967296}"#, "maxAttempts"),
            (
                r#"{"topic":"t","maxInFlightPerClient":0}"#,
                "maxInFlightPerClient",
            ),
            (
                r#"{"topic":"t","backoff":{"multiplier":"x"}}"#,
                "backoff.multiplier",
            ),
            (
                r#"{"topic":"t","backoff":{"multiplier":0.5}}"#,
                "backoff.multiplier",
            ),
            (
                r#"{"topic":"t","backoff":{"initialMs":10,"maxMs":5}}"#,
                "backoff.initialMs",
            ),
            (r#"{"topic":"t","backoff":{"jitter":1}}"#, "backoff.jitter"),
            (r#"{"topic":"t","backoff":[]}"#, "backoff"),
            (r#"{"topic":"t","backoff":[1000,60000,2.0]}"#, "backoff"),
            (r#"{"topic":"t","filter":["x"]}"#, "filter"),
            (r#"{"topic":"t","push":["https://h/"]}"#, "push"),
            (r#"{"topic":"t","filter":{"tyep":"x"}}"#, "filter.tyep"),
            (r#"{"topic":"t","filter":{"type":1}}"#, "filter.type"),
            (
                r#"{"topic":"t","filter":{"extensions":{"Tier":"x"}}}"#,
                "filter.extensions.Tier",
            ),
            (
                r#"{"topic":"t","filter":{"extensions":{"tier":1}}}"#,
                "filter.extensions.tier",
            ),
            (r#"{"topic":"t","ordering":"fifo"}"#, "ordering"),
            (r#"{"topic":"t","startFrom":"middle"}"#, "startFrom"),
            (r#"{"topic":"t","push":{}}"#, "push.url"),
            (r#"{"topic":"t","push":{"url":"ftp://x/y"}}"#, "push.url"),
            (r#"{"topic":"t","push":{"url":"not a url"}}"#, "push.url"),
            (
                r#"{"topic":"t","push":{"url":"https://h/","secret":"s"}}"#,
                "push.secret",
            ),
            (r#"[]"#, ""),
            (r#"{"topic":"t""#, ""),
        ];
        for (json, field) in cases {
            assert_eq!(field_of(json), field, "{json}");
        }
    }

    #[test]
    fn too_many_extension_conditions_are_refused() {
        let ext: Vec<String> = (0..17).map(|i| format!("\"e{i}\":\"v\"")).collect();
        let json = format!(
            r#"{{"topic":"t","filter":{{"extensions":{{{}}}}}}}"#,
            ext.join(",")
        );
        assert_eq!(field_of(&json), "filter.extensions");
    }

    #[test]
    fn field_errors_serialize_as_the_api_says() {
        let err = parse(r#"{"topic":"t","ackTimeoutMs":0}"#).unwrap_err();
        let v: Value = serde_json::to_value(&err).unwrap();
        assert_eq!(v["field"], "ackTimeoutMs");
        assert!(v["message"].as_str().unwrap().contains("between"));
    }

    #[test]
    fn spec_to_document_and_back_is_identity() {
        let spec = parse(
            r#"{"topic":"orders","filter":{"typePrefix":"order.","extensions":{"tier":"gold"}},
                "ackTimeoutMs":5000,"backoff":{"initialMs":10,"maxMs":500,"multiplier":1.5},
                "ordering":"key","push":{"url":"http://localhost:9000/hook"}}"#,
        )
        .unwrap();
        let doc = SubscriptionDoc::from_spec(&spec);
        let json = serde_json::to_vec(&doc).unwrap();
        // Both readers (the field-naming one and serde's derive) agree on the output.
        let derived: SubscriptionDoc = serde_json::from_slice(&json).unwrap();
        assert_eq!(derived, doc);
        let back = parse(std::str::from_utf8(&json).unwrap()).unwrap();
        assert_eq!(back, spec);
    }

    #[test]
    fn latest_is_spelled_latest_whatever_the_offsets() {
        let mut spec = SubscriptionSpec::new(group(), TopicName::new("t").unwrap());
        spec.start_from = StartFrom::Latest(BTreeMap::from([(0, 17), (3, 4)]));
        let v = serde_json::to_value(SubscriptionDoc::from_spec(&spec)).unwrap();
        assert_eq!(v["startFrom"], "latest");
        assert_eq!(v["ordering"], "none");
        assert!(v.get("filter").is_none());
        assert!(v.get("push").is_none());
    }
}
