//! The one error shape of the HTTP API (docs/DESIGN.md §5.1): a 4xx or 5xx status and
//! `{"error": "<code>", "message": "<human text>"}`, the code machine-readable and stable, the
//! message naming what was wrong (the field, header, parameter or limit).
//!
//! Every refusal of the HTTP layer and every [`EngineError`] becomes an [`ApiError`] here, so
//! the mapping from cause to status lives in one place.

use std::fmt;

use axum::response::{IntoResponse, Response};
use http::header::{HeaderValue, ALLOW, CONNECTION, RETRY_AFTER};
use http::StatusCode;
use serde::Serialize;
use unimesh_core::{NameError, Refusal};
use utoipa::ToSchema;

use crate::engine::EngineError;
use crate::event::PublishError;
use crate::spec_json::FieldError;

/// Error codes, as they appear in the `error` member.
pub mod code {
    pub const CONFLICT: &str = "conflict";
    pub const FORBIDDEN: &str = "forbidden";
    pub const INTERNAL: &str = "internal";
    pub const INVALID_JSON: &str = "invalid-json";
    pub const INVALID_NAME: &str = "invalid-name";
    pub const INVALID_QUERY: &str = "invalid-query";
    pub const INVALID_REQUEST: &str = "invalid-request";
    pub const INVALID_SUBSCRIPTION: &str = "invalid-subscription";
    pub const LIMIT: &str = "limit";
    pub const METHOD_NOT_ALLOWED: &str = "method-not-allowed";
    pub const NOT_FOUND: &str = "not-found";
    pub const ORIGIN_NOT_ALLOWED: &str = "origin-not-allowed";
    pub const RATE_LIMITED: &str = "rate-limited";
    pub const REQUEST_TIMEOUT: &str = "request-timeout";
    pub const TLS_REQUIRED: &str = "tls-required";
    pub const TOO_LARGE: &str = "too-large";
    pub const UNAUTHORIZED: &str = "unauthorized";
    pub const UNAVAILABLE: &str = "unavailable";
    pub const UNKNOWN_GROUP: &str = "unknown-group";
    pub const UNKNOWN_TOPIC: &str = "unknown-topic";
    pub const UNSUPPORTED_MEDIA_TYPE: &str = "unsupported-media-type";

    /// Every code above: each is named in [`super::ErrorBody`]'s documentation (a test
    /// holds it to that, so the OpenAPI documents list every code a client can meet).
    pub const ALL: &[&str] = &[
        CONFLICT,
        FORBIDDEN,
        INTERNAL,
        INVALID_JSON,
        INVALID_NAME,
        INVALID_QUERY,
        INVALID_REQUEST,
        INVALID_SUBSCRIPTION,
        LIMIT,
        METHOD_NOT_ALLOWED,
        NOT_FOUND,
        ORIGIN_NOT_ALLOWED,
        RATE_LIMITED,
        REQUEST_TIMEOUT,
        TLS_REQUIRED,
        TOO_LARGE,
        UNAUTHORIZED,
        UNAVAILABLE,
        UNKNOWN_GROUP,
        UNKNOWN_TOPIC,
        UNSUPPORTED_MEDIA_TYPE,
    ];
}

/// The body of every error answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, ToSchema)]
#[schema(title = "Error")]
pub struct ErrorBody {
    /// Machine-readable and stable: `invalid-name`, `invalid-query`, `invalid-json`,
    /// `invalid-request`, `invalid-subscription`, `invalid-cloudevent`, `not-found`,
    /// `method-not-allowed`, `unknown-group`, `unknown-topic`, `conflict`, `limit`,
    /// `rate-limited`, `too-large`, `unsupported-media-type`, `request-timeout`,
    /// `unavailable`, `internal`, `unauthorized`, `forbidden`, `origin-not-allowed`,
    /// `tls-required` (plain HTTP to a TLS port; the connection is closed after it).
    pub error: String,
    /// What was wrong, naming the field, header, parameter or limit.
    pub message: String,
}

/// A refused request: what to answer. Nothing was changed by the request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
    /// `Retry-After` in whole seconds (429, 503).
    pub retry_after_s: Option<u64>,
    /// `Allow` (405).
    pub allow: Option<String>,
    /// Close the connection after answering: the request body was not read to its end.
    pub close: bool,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            retry_after_s: None,
            allow: None,
            close: false,
        }
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    pub fn not_found(path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            code::NOT_FOUND,
            format!("no such route: {path} (see /openapi.json)"),
        )
    }

    pub fn method_not_allowed(method: &http::Method, path: &str, allow: &[http::Method]) -> Self {
        let allow: Vec<&str> = allow.iter().map(http::Method::as_str).collect();
        let mut e = Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            code::METHOD_NOT_ALLOWED,
            format!(
                "{method} is not allowed on {path}; allowed: {}",
                allow.join(", ")
            ),
        );
        e.allow = Some(allow.join(", "));
        e
    }

    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, code::TOO_LARGE, message)
    }

    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            code::UNSUPPORTED_MEDIA_TYPE,
            message,
        )
    }

    pub fn invalid_query(message: impl Into<String>) -> Self {
        Self::bad_request(code::INVALID_QUERY, message)
    }

    pub fn invalid_json(message: impl Into<String>) -> Self {
        Self::bad_request(code::INVALID_JSON, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, code::INTERNAL, message)
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({ "error": self.code, "message": self.message })
    }
}

/// The answer: the status, `{"error","message"}`, `Retry-After` and `Allow` when set, and
/// `Connection: close` when the body was not read to its end (the traffic middleware takes
/// that header off HTTP/2 answers, where it has no meaning). The error also rides in the
/// response's extensions so the middleware can log it.
impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: self.code.to_owned(),
            message: self.message.clone(),
        };
        // A struct of two strings: serialising it cannot fail.
        let bytes = serde_json::to_vec(&body).unwrap_or_default();
        let mut r = (
            self.status,
            [(http::header::CONTENT_TYPE, "application/json")],
            bytes,
        )
            .into_response();
        let h = r.headers_mut();
        if let Some(s) = self.retry_after_s {
            h.insert(RETRY_AFTER, HeaderValue::from(s));
        }
        if let Some(allow) = &self.allow {
            if let Ok(v) = HeaderValue::from_str(allow) {
                h.insert(ALLOW, v);
            }
        }
        if self.close {
            h.insert(CONNECTION, HeaderValue::from_static("close"));
        }
        r.extensions_mut().insert(Logged(self));
        r
    }
}

/// An error answer's cause, for the request log.
#[derive(Clone, Debug)]
pub struct Logged(pub ApiError);

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}: {}",
            self.status.as_u16(),
            self.code,
            self.message
        )
    }
}

impl From<NameError> for ApiError {
    fn from(e: NameError) -> Self {
        Self::bad_request(code::INVALID_NAME, e.to_string())
    }
}

impl From<PublishError> for ApiError {
    fn from(e: PublishError) -> Self {
        let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::BAD_REQUEST);
        Self::new(status, e.code(), e.message())
    }
}

impl From<FieldError> for ApiError {
    fn from(e: FieldError) -> Self {
        Self::bad_request(code::INVALID_SUBSCRIPTION, e.to_string())
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        let message = e.to_string();
        match e {
            EngineError::UnknownGroup(_) => {
                Self::new(StatusCode::NOT_FOUND, code::UNKNOWN_GROUP, message)
            }
            EngineError::UnknownTopic(_) => {
                Self::new(StatusCode::NOT_FOUND, code::UNKNOWN_TOPIC, message)
            }
            EngineError::Refused(r) => refusal(&r, message),
            EngineError::BadRequest(_) => Self::bad_request(code::INVALID_REQUEST, message),
            EngineError::RateLimited { retry_after_ms } => {
                let mut e = Self::new(StatusCode::TOO_MANY_REQUESTS, code::RATE_LIMITED, message);
                // Rounded up, and at least one second: `Retry-After: 0` invites a hot loop.
                e.retry_after_s = Some(retry_after_ms.div_ceil(1000).max(1));
                e
            }
            EngineError::TooLarge(_) => Self::too_large(message),
            EngineError::Unavailable(_) => {
                let mut e = Self::new(StatusCode::SERVICE_UNAVAILABLE, code::UNAVAILABLE, message);
                e.retry_after_s = Some(1);
                e
            }
        }
    }
}

fn refusal(r: &Refusal, message: String) -> ApiError {
    match r {
        Refusal::TopicCannotChange { .. } | Refusal::OrderingCannotChange => {
            ApiError::new(StatusCode::CONFLICT, code::CONFLICT, message)
        }
        Refusal::TooManyGroups { .. }
        | Refusal::TooManyClients { .. }
        | Refusal::TooManyPartitions { .. }
        | Refusal::ReplayFull { .. } => {
            ApiError::new(StatusCode::TOO_MANY_REQUESTS, code::LIMIT, message)
        }
        Refusal::InvalidSpec(_) => ApiError::bad_request(code::INVALID_SUBSCRIPTION, message),
        Refusal::UnknownGroup => ApiError::new(StatusCode::NOT_FOUND, code::UNKNOWN_GROUP, message),
        Refusal::NotAssigned(_) | Refusal::InvalidPartition(_) => {
            ApiError::bad_request(code::INVALID_REQUEST, message)
        }
    }
}

#[cfg(test)]
mod tests {
    use unimesh_core::{GroupName, TopicName};

    use super::*;

    /// Goal: the OpenAPI documents name every error code a client can meet. Method: the
    /// schema utoipa generates for the error body, against every constant in `code`.
    #[test]
    fn the_error_schema_names_every_code() {
        let schema = serde_json::to_string(&<ErrorBody as utoipa::PartialSchema>::schema())
            .expect("a schema serializes");
        let missing: Vec<&str> = code::ALL
            .iter()
            .copied()
            .filter(|c| !schema.contains(&format!("`{c}`")))
            .collect();
        assert!(
            missing.is_empty(),
            "not in ErrorBody's documentation: {missing:?}"
        );
    }

    #[test]
    fn engine_errors_map_to_the_documented_statuses() {
        let g = GroupName::new("g").expect("valid");
        let t = TopicName::new("t").expect("valid");
        let cases: Vec<(EngineError, u16, &str)> = vec![
            (EngineError::UnknownGroup(g), 404, code::UNKNOWN_GROUP),
            (
                EngineError::UnknownTopic(t.clone()),
                404,
                code::UNKNOWN_TOPIC,
            ),
            (
                EngineError::BadRequest("x".into()),
                400,
                code::INVALID_REQUEST,
            ),
            (EngineError::TooLarge("x".into()), 413, code::TOO_LARGE),
            (
                EngineError::Unavailable("disk".into()),
                503,
                code::UNAVAILABLE,
            ),
            (
                EngineError::Refused(Refusal::TopicCannotChange { topic: t }),
                409,
                code::CONFLICT,
            ),
            (
                EngineError::Refused(Refusal::OrderingCannotChange),
                409,
                code::CONFLICT,
            ),
            (
                EngineError::Refused(Refusal::TooManyGroups { max: 1 }),
                429,
                code::LIMIT,
            ),
            (
                EngineError::Refused(Refusal::ReplayFull { max: 1 }),
                429,
                code::LIMIT,
            ),
            (
                EngineError::Refused(Refusal::UnknownGroup),
                404,
                code::UNKNOWN_GROUP,
            ),
            (
                EngineError::Refused(Refusal::NotAssigned(3)),
                400,
                code::INVALID_REQUEST,
            ),
        ];
        for (e, status, c) in cases {
            let text = e.to_string();
            let api = ApiError::from(e);
            assert_eq!(api.status.as_u16(), status, "{text}");
            assert_eq!(api.code, c, "{text}");
            assert_eq!(api.message, text, "the message is the engine's text");
        }
    }

    #[test]
    fn retry_after_is_whole_seconds_rounded_up() {
        for (ms, s) in [(0, 1), (1, 1), (1000, 1), (1001, 2), (2500, 3)] {
            let api = ApiError::from(EngineError::RateLimited { retry_after_ms: ms });
            assert_eq!(api.status, StatusCode::TOO_MANY_REQUESTS);
            assert_eq!(api.retry_after_s, Some(s), "{ms} ms");
        }
    }

    #[test]
    fn body_has_exactly_error_and_message() {
        let api = ApiError::invalid_query("max must be between 1 and 1000");
        let body = api.body();
        let obj = body.as_object().expect("an object");
        assert_eq!(obj.len(), 2);
        assert_eq!(obj["error"], "invalid-query");
        assert_eq!(obj["message"], "max must be between 1 and 1000");
    }
}
