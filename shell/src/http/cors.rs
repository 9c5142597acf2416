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
    HeaderValue, ACCESS_CONTROL_REQUEST_HEADERS, HOST, LOCATION, ORIGIN, RETRY_AFTER,
    WWW_AUTHENTICATE,
};
use http::{HeaderMap, Method};
use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};

/// The request headers a page may send (besides the CORS-safelisted ones), `ce-*` aside.
const ALLOWED_HEADERS: [&str; 3] = ["authorization", "content-type", "last-event-id"];

/// The checked form of `server.cors_allowed_origins`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Origins(Vec<HeaderValue>);

impl Origins {
    /// Parses the comma-separated list: each entry `scheme://host[:port]`, as a browser
    /// sends it in `Origin` (no path, no trailing slash). The error names the entry.
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut out = Vec::new();
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let bad = || {
                format!(
                    "{entry:?} is not an origin: scheme://host[:port], as a browser sends it \
                     (https://app.example.com, http://localhost:3000)"
                )
            };
            let (scheme, rest) = entry.split_once("://").ok_or_else(bad)?;
            let uri: http::Uri = entry.parse().map_err(|_| bad())?;
            let plain = uri.authority().is_some_and(|a| a.as_str() == rest)
                && !rest.contains('@')
                && matches!(scheme, "http" | "https");
            if !plain {
                return Err(bad());
            }
            out.push(HeaderValue::from_str(entry).map_err(|_| bad())?);
        }
        Ok(Self(out))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `origin` is in the list (origins compare as ASCII case-insensitive).
    pub fn contains(&self, origin: &HeaderValue) -> bool {
        let Ok(origin) = origin.to_str() else {
            return false;
        };
        self.0
            .iter()
            .any(|o| o.to_str().is_ok_and(|o| o.eq_ignore_ascii_case(origin)))
    }

    /// The CORS layer of the traffic listener, or `None` without origins.
    pub fn layer(&self) -> Option<CorsLayer> {
        if self.is_empty() {
            return None;
        }
        Some(
            CorsLayer::new()
                .allow_origin(AllowOrigin::list(self.0.clone()))
                .allow_methods([Method::GET, Method::POST, Method::PUT, Method::DELETE])
                .allow_headers(AllowHeaders::mirror_request())
                .expose_headers([RETRY_AFTER, LOCATION, WWW_AUTHENTICATE])
                .max_age(Duration::from_secs(600)),
        )
    }

    /// The rule of the two stream routes (WebSocket, which CORS does not cover, and SSE,
    /// whose GET a page on any origin may send with a token in its query): a request without
    /// `Origin` (not from a browser) or from its own origin (`Origin` naming the `Host` it
    /// was sent to) passes; any other `Origin` must be in the list. `Err` carries the
    /// refused origin.
    pub fn check_stream_origin(&self, headers: &HeaderMap) -> Result<(), String> {
        let Some(origin) = headers.get(ORIGIN) else {
            return Ok(());
        };
        if self.contains(origin) {
            return Ok(());
        }
        let text = origin.to_str().unwrap_or("");
        let same = headers
            .get(HOST)
            .and_then(|h| h.to_str().ok())
            .zip(text.split_once("://").map(|(_, authority)| authority))
            .is_some_and(|(host, authority)| host.eq_ignore_ascii_case(authority));
        if same {
            return Ok(());
        }
        Err(String::from_utf8_lossy(origin.as_bytes()).into_owned())
    }
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
    fn origins_are_scheme_host_and_port_only() {
        let o = Origins::parse(" https://app.example.com , http://localhost:3000")
            .expect("two origins");
        assert!(o.contains(&HeaderValue::from_static("https://APP.example.com")));
        assert!(!o.contains(&HeaderValue::from_static("https://app.example.com:8443")));
        for bad in [
            "app.example.com",
            "https://app.example.com/",
            "https://u@app.example.com",
            "ftp://x",
            "*",
        ] {
            assert!(Origins::parse(bad).is_err(), "{bad}");
        }
        assert!(Origins::parse("").expect("empty").layer().is_none());
    }

    #[test]
    fn websocket_origins_are_the_list_or_the_same_origin() {
        let o = Origins::parse("https://app.example.com").expect("an origin");
        let mut h = HeaderMap::new();
        h.insert(HOST, HeaderValue::from_static("127.0.0.1:8080"));
        assert_eq!(
            o.check_stream_origin(&h),
            Ok(()),
            "no Origin: not a browser"
        );
        h.insert(ORIGIN, HeaderValue::from_static("http://127.0.0.1:8080"));
        assert_eq!(o.check_stream_origin(&h), Ok(()), "same origin");
        h.insert(ORIGIN, HeaderValue::from_static("https://app.example.com"));
        assert_eq!(o.check_stream_origin(&h), Ok(()));
        h.insert(ORIGIN, HeaderValue::from_static("https://evil.example"));
        assert_eq!(
            o.check_stream_origin(&h),
            Err("https://evil.example".to_owned())
        );
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
