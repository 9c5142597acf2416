//! Reading request bodies within a limit, and the JSON content-type rule.
//!
//! A body is never buffered beyond its limit: a `Content-Length` over it is refused before
//! a byte is read, and a body without one is counted frame by frame while it is read. An
//! oversized body that the client is already sending is then read and thrown away (up to
//! `drain_bytes`, for a bounded time) so the client gets to read the 413 instead of a
//! connection reset; the connection is closed after the answer.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, EXPECT};
use http::HeaderMap;
use http_body_util::BodyExt;
use hyper::body::Body;
use serde::de::DeserializeOwned;

use super::error::ApiError;
use crate::config::Limits;

/// The longest time spent throwing away an oversized body.
const DRAIN_TIME: Duration = Duration::from_secs(5);

/// Reads the whole body if it is at most `limit` bytes and arrives within
/// `limits.body_read_timeout_ms` (a client trickling its body cannot hold a connection slot
/// forever).
pub async fn read_body<B>(
    limits: &Limits,
    body: B,
    headers: &HeaderMap,
    limit: usize,
) -> Result<Bytes, ApiError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let timeout = Duration::from_millis(limits.body_read_timeout_ms.get());
    match tokio::time::timeout(
        timeout,
        read_limited(body, headers, limit, limits.drain_bytes),
    )
    .await
    {
        Ok(read) => read,
        Err(_) => {
            let mut e = ApiError::new(
                http::StatusCode::REQUEST_TIMEOUT,
                super::error::code::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {} ms",
                    limits.body_read_timeout_ms
                ),
            );
            e.close = true;
            Err(e)
        }
    }
}

/// Reads the whole body if it is at most `limit` bytes.
pub async fn read_limited<B>(
    body: B,
    headers: &HeaderMap,
    limit: usize,
    drain_bytes: u64,
) -> Result<Bytes, ApiError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let declared = match headers.get(CONTENT_LENGTH) {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    ApiError::bad_request(
                        super::error::code::INVALID_REQUEST,
                        "content-length is not a number",
                    )
                })?,
        ),
    };
    if let Some(len) = declared {
        if len > limit as u64 {
            let mut e = too_large(limit, Some(len));
            e.close = true;
            // A client waiting for `100 Continue` has not sent the body: nothing to drain.
            let waiting = headers
                .get(EXPECT)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
            if !waiting && len <= drain_bytes {
                drain(body, drain_bytes).await;
            }
            return Err(e);
        }
    }
    let mut body = body;
    let mut buf = BytesMut::with_capacity(declared.map_or(0, |n| n as usize).min(limit));
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            ApiError::bad_request(
                super::error::code::INVALID_REQUEST,
                format!("could not read the request body: {e}"),
            )
        })?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers carry nothing we read
        };
        if buf.len() + data.len() > limit {
            let seen = (buf.len() + data.len()) as u64;
            drop(buf);
            drain(body, drain_bytes.saturating_sub(seen)).await;
            let mut e = too_large(limit, None);
            e.close = true;
            return Err(e);
        }
        buf.extend_from_slice(&data);
    }
    Ok(buf.freeze())
}

fn too_large(limit: usize, declared: Option<u64>) -> ApiError {
    match declared {
        Some(len) => ApiError::too_large(format!(
            "request body is {len} bytes, over the limit of {limit}"
        )),
        None => ApiError::too_large(format!("request body is over the limit of {limit} bytes")),
    }
}

/// Reads and discards up to `max` bytes of what is left of a body, for at most `DRAIN_TIME`.
async fn drain<B>(mut body: B, max: u64)
where
    B: Body<Data = Bytes> + Unpin,
{
    let work = async {
        let mut seen = 0u64;
        while seen <= max {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        seen += data.len() as u64;
                    }
                }
                _ => break,
            }
        }
    };
    let _ = tokio::time::timeout(DRAIN_TIME, work).await;
}

/// JSON request bodies must say so: `application/json` (any `+json` type too), charset
/// UTF-8 if given. A request without a content type is read as JSON, so a bare
/// `curl --data-binary` works; any other type is 415.
pub fn require_json(headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(ct) = headers.get(CONTENT_TYPE) else {
        return Ok(());
    };
    let text = ct
        .to_str()
        .map_err(|_| ApiError::unsupported_media_type("content-type is not printable ASCII"))?;
    let mut parts = text.split(';');
    let essence = parts.next().unwrap_or("").trim().to_ascii_lowercase();
    let json = essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"));
    if !json {
        return Err(ApiError::unsupported_media_type(format!(
            "content-type {essence:?} is not accepted here: send application/json"
        )));
    }
    for param in parts {
        if let Some((name, value)) = param.split_once('=') {
            let value = value.trim().trim_matches('"');
            if name.trim().eq_ignore_ascii_case("charset")
                && !(value.eq_ignore_ascii_case("utf-8") || value.eq_ignore_ascii_case("utf8"))
            {
                return Err(ApiError::unsupported_media_type(format!(
                    "charset {value:?} is not accepted: JSON bodies are UTF-8"
                )));
            }
        }
    }
    Ok(())
}

/// Parses a JSON body into `T` (whose type refuses unknown fields). serde_json's message
/// names the field and position (`unknown field `x`, expected one of ...`).
/// The body of a JSON request (any route but publish): JSON content type, at most
/// `limits.max_json_bytes`.
pub async fn read_json_body<B>(
    limits: &Limits,
    headers: &HeaderMap,
    body: B,
) -> Result<Bytes, ApiError>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: std::fmt::Display,
{
    require_json(headers)?;
    read_body(limits, body, headers, limits.max_json_bytes.get()).await
}

pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::invalid_json(
            "the request body is empty; a JSON object is expected",
        ));
    }
    let mut value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid_json(format!("the request body is not accepted: {e}")))?;
    crate::json_numbers::integral_floats(&mut value);
    // The path names a nested member (`seek.partition`); serde's message alone does not.
    serde_path_to_error::deserialize(value).map_err(|e| {
        let at = e.path().to_string();
        let why = e.into_inner();
        if at == "." {
            ApiError::invalid_json(format!("the request body is not accepted: {why}"))
        } else {
            ApiError::invalid_json(format!("the request body is not accepted at `{at}`: {why}"))
        }
    })
}

#[cfg(test)]
mod tests {
    use http::StatusCode;
    use http_body_util::Full;
    use hyper::body::Frame;

    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().expect("header value"));
        }
        h
    }

    #[tokio::test]
    async fn reads_a_body_within_the_limit() {
        let body = Full::new(Bytes::from_static(b"{\"a\":1}"));
        let got = read_limited(body, &HeaderMap::new(), 7, 0)
            .await
            .expect("fits");
        assert_eq!(&got[..], b"{\"a\":1}");
    }

    #[tokio::test]
    async fn declared_length_over_the_limit_is_413_before_reading() {
        let body = Full::new(Bytes::from(vec![b'x'; 100]));
        let e = read_limited(body, &headers(&[("content-length", "100")]), 10, 1000)
            .await
            .expect_err("too large");
        assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(
            e.message.contains("100 bytes") && e.message.contains("10"),
            "{}",
            e.message
        );
        assert!(e.close);
    }

    #[tokio::test]
    async fn undeclared_length_is_counted_while_reading() {
        // Many small frames, no content-length: refused once the count passes the limit.
        let frames = vec![Bytes::from_static(b"0123456789"); 100];
        let e = read_limited(Frames(frames.into_iter()), &HeaderMap::new(), 55, 1 << 20)
            .await
            .expect_err("too large");
        assert_eq!(e.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(e.close);
        let frames = vec![Bytes::from_static(b"0123456789"); 5];
        let got = read_limited(Frames(frames.into_iter()), &HeaderMap::new(), 55, 0)
            .await
            .expect("fits");
        assert_eq!(got.len(), 50);
    }

    #[tokio::test]
    async fn a_body_that_never_ends_is_408() {
        let limits = Limits {
            body_read_timeout_ms: std::num::NonZeroU64::MIN.saturating_add(19),
            ..Limits::default()
        };
        let e = read_body(&limits, Pending, &HeaderMap::new(), 1024)
            .await
            .expect_err("times out");
        assert_eq!(e.status, StatusCode::REQUEST_TIMEOUT);
        assert_eq!(e.code, "request-timeout");
        assert!(e.close);
    }

    /// A client that sent its headers and then nothing.
    struct Pending;

    impl Body for Pending {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            self: std::pin::Pin<&mut Self>,
            _cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            std::task::Poll::Pending
        }
    }

    /// A body of data frames, like a chunked request.
    struct Frames(std::vec::IntoIter<Bytes>);

    impl Body for Frames {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: std::pin::Pin<&mut Self>,
            _cx: &mut std::task::Context<'_>,
        ) -> std::task::Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            std::task::Poll::Ready(self.0.next().map(|b| Ok(Frame::data(b))))
        }
    }

    #[test]
    fn json_content_types() {
        assert!(require_json(&HeaderMap::new()).is_ok());
        assert!(require_json(&headers(&[("content-type", "application/json")])).is_ok());
        assert!(require_json(&headers(&[(
            "content-type",
            "application/json; charset=UTF-8"
        )]))
        .is_ok());
        assert!(require_json(&headers(&[(
            "content-type",
            "application/merge-patch+json"
        )]))
        .is_ok());
        for bad in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "application/json; charset=latin1",
        ] {
            let e = require_json(&headers(&[("content-type", bad)])).expect_err(bad);
            assert_eq!(e.status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{bad}");
            assert_eq!(e.code, "unsupported-media-type");
        }
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    #[allow(dead_code)]
    struct Doc {
        delivery_ids: Vec<String>,
    }

    #[test]
    fn json_errors_name_the_problem() {
        let e = parse_json::<Doc>(b"{\"deliveryIds\":[],\"bogus\":1}").expect_err("unknown field");
        assert_eq!(e.code, "invalid-json");
        assert!(e.message.contains("bogus"), "{}", e.message);
        let e = parse_json::<Doc>(b"{\"deliveryIds\":").expect_err("truncated");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        let e = parse_json::<Doc>(b"{}").expect_err("missing field");
        assert!(e.message.contains("deliveryIds"), "{}", e.message);
        let e = parse_json::<Doc>(b"  ").expect_err("empty");
        assert!(e.message.contains("empty"), "{}", e.message);
    }

    #[derive(Debug, serde::Deserialize, PartialEq)]
    struct Numbers {
        a: u64,
        b: i32,
        c: f64,
    }

    #[test]
    fn integral_floats_are_integers() {
        let n: Numbers = parse_json(br#"{"a": 382.0, "b": -2e3, "c": 1.5}"#).expect("accepted");
        assert_eq!(
            n,
            Numbers {
                a: 382,
                b: -2000,
                c: 1.5
            }
        );
        let e = parse_json::<Numbers>(br#"{"a": 1.5, "b": 0, "c": 0}"#).expect_err("fraction");
        assert!(e.message.contains("floating point"), "{}", e.message);
        let e = parse_json::<Numbers>(br#"{"a": 1e30, "b": 0, "c": 0}"#).expect_err("too big");
        assert!(e.message.contains("floating point"), "{}", e.message);
    }
}
