//! The HTTP front of `unimesh serve` (docs/DESIGN.md §5.1): two listeners on hyper 1.x — traffic
//! (publish, subscriptions, long-poll, ACK/NACK/extend) and admin (metrics, health,
//! operator endpoints) — over one [`EngineHandle`].
//!
//! A request goes: [`router::route`] (404/405) → the route's handler, which validates
//! names, query and body before it asks the engine anything (so a refused request changes
//! nothing) → a JSON answer, or an [`ApiError`] rendered as
//! `{"error": "<code>", "message": "<text>"}`.
//!
//! The OpenAPI document (`shell/openapi.json`) describes exactly the route table; a unit
//! test keeps the two in step.

mod admin;
mod body;
pub mod error;
pub mod metrics;
mod query;
pub mod router;
mod server;
mod traffic;

#[cfg(test)]
mod tests;

use std::convert::Infallible;
use std::time::Instant;

use bytes::Bytes;
use http::header::{HeaderValue, ALLOW, CONNECTION, CONTENT_TYPE, RETRY_AFTER};
use http::{Request, Response, StatusCode, Version};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Body;
use serde::Serialize;
use unimesh_core::SubscriptionLimits;

pub use error::ApiError;
pub use metrics::Metrics;
pub use router::{Listener, RouteId, ROUTES};
pub use server::{Draining, Server};

use crate::config::{Config, Limits};
use crate::engine::EngineHandle;
use crate::event::PublishLimits;

/// The OpenAPI 3 document of this API, as kept in the repository.
pub const OPENAPI_JSON: &str = include_str!("../../openapi.json");

/// Response bodies: boxed, so streaming routes (SSE, later) fit the same type.
pub type ResBody = BoxBody<Bytes, Infallible>;

/// What every handler needs: the engine, the limits, the metrics.
pub struct App {
    pub engine: EngineHandle,
    pub limits: Limits,
    pub publish: PublishLimits,
    pub subscription: SubscriptionLimits,
    pub metrics: Metrics,
}

impl App {
    pub fn new(engine: EngineHandle, config: &Config) -> Self {
        Self {
            engine,
            limits: config.limits.clone(),
            publish: config.publish_limits(),
            subscription: config.subscription_limits(),
            metrics: Metrics::new(),
        }
    }
}

/// Answers one request that arrived on `listener`. Never fails: every problem is an
/// answer.
pub async fn handle<B>(app: &App, listener: Listener, req: Request<B>) -> Response<ResBody>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: std::fmt::Display,
{
    let started = Instant::now();
    let (parts, body) = req.into_parts();
    let version = parts.version;
    let (label, result) = match router::route(listener, &parts.method, parts.uri.path()) {
        Err(e) => (router::UNMATCHED_LABEL.to_owned(), Err(e)),
        Ok(matched) => {
            let label = matched.route.label();
            let result = match listener {
                Listener::Traffic => traffic::dispatch(app, matched, &parts, body).await,
                Listener::Admin => admin::dispatch(app, matched, &parts, body).await,
            };
            (label, result)
        }
    };
    let response = match result {
        Ok(r) => r,
        Err(e) => {
            if e.status.is_server_error() {
                tracing::warn!(method = %parts.method, path = %parts.uri.path(), error = %e, "request failed");
            } else {
                tracing::debug!(method = %parts.method, path = %parts.uri.path(), error = %e, "request refused");
            }
            error_response(&e, version)
        }
    };
    app.metrics
        .observe_request(&label, started.elapsed().as_secs_f64());
    response
}

fn full(bytes: impl Into<Bytes>) -> ResBody {
    Full::new(bytes.into()).boxed()
}

/// A JSON answer.
pub(crate) fn json<T: Serialize + ?Sized>(
    status: StatusCode,
    value: &T,
) -> Result<Response<ResBody>, ApiError> {
    let bytes = serde_json::to_vec(value)
        .map_err(|e| ApiError::internal(format!("cannot write the answer: {e}")))?;
    Ok(with_type(status, "application/json", bytes))
}

pub(crate) fn with_type(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<ResBody> {
    let mut r = Response::new(full(body));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

pub(crate) fn error_response(e: &ApiError, version: Version) -> Response<ResBody> {
    // `ApiError::body` is a JSON object of two strings: serialising it cannot fail.
    let bytes = serde_json::to_vec(&e.body()).unwrap_or_default();
    let mut r = with_type(e.status, "application/json", bytes);
    let h = r.headers_mut();
    if let Some(s) = e.retry_after_s {
        h.insert(RETRY_AFTER, HeaderValue::from(s));
    }
    if let Some(allow) = &e.allow {
        if let Ok(v) = HeaderValue::from_str(allow) {
            h.insert(ALLOW, v);
        }
    }
    // HTTP/2 has no connection header (and does not need one: streams are independent).
    if e.close && version <= Version::HTTP_11 {
        h.insert(CONNECTION, HeaderValue::from_static("close"));
    }
    r
}
