//! Browsers on the traffic listener (issue 19): CORS for the origins of
//! `server.cors_allowed_origins` (none by default: no CORS answer at all), by tower-http's
//! `CorsLayer`, and the same list for the `Origin` of a WebSocket upgrade (which CORS does
//! not cover: a page on any origin may open a WebSocket, so the mesh checks it).
//!
//! A preflight from an allowed origin is answered with the methods of the API and the
//! request headers it asked for, as far as they are `content-type`, `authorization`,
//! `last-event-id` or `ce-*` (binary-mode CloudEvents attributes, extensions included —
//! too many to list, so the asked-for list is filtered and mirrored); any other header is
//! left out, so the browser refuses the request. An origin not in the list gets no
//! `Access-Control-Allow-Origin` and no allowed headers.

use std::time::Duration;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use http::header::{
    HeaderValue, ACCESS_CONTROL_REQUEST_HEADERS, LOCATION, ORIGIN, RETRY_AFTER, WWW_AUTHENTICATE,
};
use http::Method;
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

use crate::policy::Origins;

/// The request headers a page may send (besides the CORS-safelisted ones), `ce-*` aside.
const ALLOWED_HEADERS: [&str; 3] = ["authorization", "content-type", "last-event-id"];

/// The CORS layer of the traffic listener, or `None` without origins.
pub fn layer(origins: &Origins) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    Some(
        CorsLayer::new()
            .allow_origin(AllowOrigin::list(origins.as_slice().to_vec()))
            .allow_methods([Method::GET, Method::POST, Method::PUT, Method::DELETE])
            .allow_headers(AllowHeaders::mirror_request())
            .expose_headers([RETRY_AFTER, LOCATION, WWW_AUTHENTICATE])
            .max_age(Duration::from_secs(600)),
    )
}

/// Whether a page may send request header `name` to the traffic listener.
fn header_allowed(name: &str) -> bool {
    let name = name.trim().to_ascii_lowercase();
    ALLOWED_HEADERS.contains(&name.as_str()) || (name.starts_with("ce-") && name.len() > 3)
}

/// Runs before the CORS layer: a preflight's `Access-Control-Request-Headers` keeps only
/// the headers a page may send (the layer mirrors what is left), and nothing at all for an
/// origin not in the list.
pub async fn filter_preflight(origins: Origins, mut req: Request, next: Next) -> Response {
    if req.method() == Method::OPTIONS {
        let allowed_origin = req
            .headers()
            .get(ORIGIN)
            .is_some_and(|o| origins.contains(o));
        let asked = req
            .headers()
            .get(ACCESS_CONTROL_REQUEST_HEADERS)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        req.headers_mut().remove(ACCESS_CONTROL_REQUEST_HEADERS);
        if let (true, Some(asked)) = (allowed_origin, asked) {
            let kept: Vec<&str> = asked
                .split(',')
                .map(str::trim)
                .filter(|h| header_allowed(h))
                .collect();
            if let Ok(v) = HeaderValue::from_str(&kept.join(",")) {
                if !kept.is_empty() {
                    req.headers_mut().insert(ACCESS_CONTROL_REQUEST_HEADERS, v);
                }
            }
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_origins_no_cors_layer() {
        assert!(layer(&Origins::parse("").expect("empty")).is_none());
        assert!(layer(&Origins::parse("https://app.example.com").expect("an origin")).is_some());
    }

    #[test]
    fn pages_may_send_cloudevents_and_auth_headers_only() {
        for ok in [
            "content-type",
            "Authorization",
            "last-event-id",
            "ce-id",
            "ce-partitionkey",
        ] {
            assert!(header_allowed(ok), "{ok}");
        }
        for no in ["x-forwarded-for", "ce-", "cookie"] {
            assert!(!header_allowed(no), "{no}");
        }
    }
}
