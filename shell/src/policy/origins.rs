//! The browser origins of `server.cors_allowed_origins` (issue 19), parsed once from the
//! configuration: `config` checks the list with [`Origins::parse`], the traffic listener
//! (`http::cors`) answers CORS for it and checks a stream's `Origin` against it.

use http::header::{HeaderValue, HOST, ORIGIN};
use http::HeaderMap;

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

    /// The origins, as listed.
    pub fn as_slice(&self) -> &[HeaderValue] {
        &self.0
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
        assert!(Origins::parse("").expect("empty").is_empty());
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
}
