//! The CloudEvents **Kafka protocol binding** (binary mode out, binary and structured mode
//! in): how an event is written to a Kafka record and read back from one.
//!
//! Out ([`to_kafka`]): every attribute but `datacontenttype` as a `ce_<name>` header with its
//! value as UTF-8 (no percent-encoding: the Kafka binding has none), `datacontenttype` as
//! the `content-type` header, the data as the value; the key is the caller's (the
//! `partitionkey`). In ([`from_kafka`]): a record with a `ce_specversion` header is binary
//! mode; one whose `content-type` is `application/cloudevents+json` is structured mode;
//! anything else is not a CloudEvent and gets the reason, so the caller dead-letters it
//! (never a silent drop: docs/DESIGN.md §7). A record key with no `partitionkey` in the
//! event becomes its `partitionkey` (the binding's key mapping, read backwards; a key that
//! is not UTF-8 is left out). Both give the stored form
//! ([`super::encode_stored`]), so the engine sees Kafka records exactly as it sees the
//! embedded log's.

use bytes::Bytes;
use cloudevents::event::AttributeValue;

use http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http::HeaderMap;
use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};

use super::attrs::Origin;
use super::error::DecodeError;
use super::json::{format_time, published_from_json};
use super::publish::{parse_binary, PublishLimits, STRUCTURED_MEDIA_TYPE};
use super::stored::PARTITION_KEY_EXTENSION;

/// The prefix of an attribute header in the Kafka binding.
pub const KAFKA_HEADER_PREFIX: &str = "ce_";

/// A Kafka record in binary mode: headers in order, and the value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KafkaRecord {
    pub headers: Vec<(String, Vec<u8>)>,
    pub value: Bytes,
}

/// The binary-mode Kafka record of a stored event.
pub fn to_kafka(stored: &[u8]) -> Result<KafkaRecord, DecodeError> {
    let published = published_from_json(stored, Origin::Stored)
        .map_err(|e| DecodeError::new(format!("stored event cannot be read: {e}")))?;
    let event = published.event();
    let mut headers = Vec::new();
    for (name, value) in event.iter_attributes() {
        if name == "datacontenttype" {
            continue;
        }
        let text = match value {
            AttributeValue::Time(t) => format_time(t),
            other => other.to_string(),
        };
        headers.push((format!("{KAFKA_HEADER_PREFIX}{name}"), text.into_bytes()));
    }
    for (name, value) in event.iter_extensions() {
        headers.push((
            format!("{KAFKA_HEADER_PREFIX}{name}"),
            value.to_string().into_bytes(),
        ));
    }
    // JSON data without a content type is JSON by the event format's default; a binary
    // mode reader has nothing else to go by.
    let (content_type, value) = published.binary_body();
    if let Some(ct) = content_type {
        headers.push(("content-type".to_owned(), ct.into_bytes()));
    }
    Ok(KafkaRecord { headers, value })
}

/// The stored form of the event a Kafka record carries, or why it carries none.
/// `max_event_bytes` bounds the event (headers and value) before anything is parsed.
pub fn from_kafka(
    headers: &[(&str, Option<&[u8]>)],
    value: Option<&[u8]>,
    key: Option<&[u8]>,
    max_event_bytes: usize,
) -> Result<Bytes, DecodeError> {
    let value = value.unwrap_or_default();
    let header = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| *v)
    };
    let limits = PublishLimits {
        max_event_bytes,
        max_request_bytes: usize::MAX,
        max_batch_events: 1,
    };
    let content_type = header("content-type").map(String::from_utf8_lossy);
    let structured = content_type.as_deref().is_some_and(|ct| {
        ct.split(';')
            .next()
            .unwrap_or("")
            .trim()
            .eq_ignore_ascii_case(STRUCTURED_MEDIA_TYPE)
    });
    if header("ce_specversion").is_none() {
        if !structured {
            return Err(DecodeError::new(
                "not a CloudEvent: the record has no ce_specversion header (binary mode) and \
                 its content-type is not application/cloudevents+json (structured mode)",
            ));
        }
        if value.len() > max_event_bytes {
            return Err(DecodeError::new(format!(
                "structured event is {} bytes, over the limit of {max_event_bytes}",
                value.len()
            )));
        }
        let mut event = published_from_json(value, Origin::Publish)
            .map_err(|e| DecodeError::new(format!("invalid structured CloudEvent: {e}")))?;
        keyed(event.attributes_mut(), key);
        return Ok(event.stored());
    }
    // Binary mode: the HTTP binding's reader does the validation. Its header values are
    // percent-decoded, so every value is percent-encoded here and comes back byte for byte.
    let mut map = HeaderMap::new();
    for (name, v) in headers {
        let Some(v) = v else { continue };
        let target = if name.eq_ignore_ascii_case("content-type") {
            CONTENT_TYPE
        } else if let Some(attr) = strip_prefix_ignore_case(name, KAFKA_HEADER_PREFIX) {
            HeaderName::from_bytes(format!("ce-{}", attr.to_ascii_lowercase()).as_bytes())
                .map_err(|_| DecodeError::new(format!("header {name:?} is not a valid name")))?
        } else {
            continue;
        };
        let text = std::str::from_utf8(v)
            .map_err(|_| DecodeError::new(format!("header {name:?} is not UTF-8")))?;
        let encoded = if target == CONTENT_TYPE {
            text.to_owned()
        } else {
            utf8_percent_encode(text, NON_ALPHANUMERIC).to_string()
        };
        let v = HeaderValue::from_str(&encoded).map_err(|_| {
            DecodeError::new(format!("header {name:?} cannot be read as a header value"))
        })?;
        map.append(target, v);
    }
    let mut event = parse_binary(&map, value, &limits)
        .map_err(|e| DecodeError::new(format!("invalid binary-mode CloudEvent: {e}")))?;
    keyed(event.attributes_mut(), key);
    Ok(event.stored())
}

/// The record key as the event's `partitionkey` when it has none: the Kafka binding maps
/// `partitionkey` to the key, so a key another producer set is the event's partition key.
fn keyed(event: &mut cloudevents::Event, key: Option<&[u8]>) {
    if event.extension(PARTITION_KEY_EXTENSION).is_some() {
        return;
    }
    if let Some(k) = key
        .filter(|k| !k.is_empty())
        .and_then(|k| std::str::from_utf8(k).ok())
    {
        event.set_extension(PARTITION_KEY_EXTENSION, k.to_owned());
    }
}

fn strip_prefix_ignore_case<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::decode_stored;

    fn stored(json: &str) -> Bytes {
        published_from_json(json.as_bytes(), Origin::Publish)
            .expect("valid event")
            .stored()
    }

    fn borrowed(r: &KafkaRecord) -> Vec<(&str, Option<&[u8]>)> {
        r.headers
            .iter()
            .map(|(k, v)| (k.as_str(), Some(v.as_slice())))
            .collect()
    }

    fn header<'a>(r: &'a KafkaRecord, name: &str) -> Option<&'a str> {
        r.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| std::str::from_utf8(v).expect("UTF-8 header"))
    }

    #[test]
    fn binary_mode_out_carries_every_attribute_as_a_ce_header() {
        let s = stored(
            r#"{"specversion":"1.0","id":"e-1","source":"/src","type":"t.created",
                "subject":"sub","time":"2024-01-02T03:04:05Z","datacontenttype":"application/json",
                "partitionkey":"k-9","tenant":"acme","data":{"n":1}}"#,
        );
        let r = to_kafka(&s).expect("encodes");
        assert_eq!(header(&r, "ce_specversion"), Some("1.0"));
        assert_eq!(header(&r, "ce_id"), Some("e-1"));
        assert_eq!(header(&r, "ce_source"), Some("/src"));
        assert_eq!(header(&r, "ce_type"), Some("t.created"));
        assert_eq!(header(&r, "ce_subject"), Some("sub"));
        assert_eq!(header(&r, "ce_time"), Some("2024-01-02T03:04:05Z"));
        assert_eq!(header(&r, "ce_partitionkey"), Some("k-9"));
        assert_eq!(header(&r, "ce_tenant"), Some("acme"));
        assert_eq!(header(&r, "content-type"), Some("application/json"));
        assert_eq!(header(&r, "ce_datacontenttype"), None);
        assert_eq!(&r.value[..], br#"{"n":1}"#);
    }

    #[test]
    fn binary_mode_round_trips_to_the_same_stored_event() {
        let s = stored(
            r#"{"specversion":"1.0","id":"e-2","source":"/s","type":"t",
                "subject":"caf\u00e9 100% \"q\"","datacontenttype":"text/plain","data":"hello"}"#,
        );
        let r = to_kafka(&s).expect("encodes");
        // The Kafka binding has no percent-encoding: the header is the raw UTF-8.
        assert_eq!(header(&r, "ce_subject"), Some("café 100% \"q\""));
        let back = from_kafka(&borrowed(&r), Some(&r.value), None, 1 << 20).expect("decodes");
        assert_eq!(back, s);
    }

    #[test]
    fn binary_data_without_content_type_stays_binary() {
        let s = stored(
            r#"{"specversion":"1.0","id":"e-3","source":"/s","type":"t","data_base64":"AAEC/w=="}"#,
        );
        let r = to_kafka(&s).expect("encodes");
        assert_eq!(&r.value[..], &[0u8, 1, 2, 255]);
        assert_eq!(header(&r, "content-type"), None);
        let back = from_kafka(&borrowed(&r), Some(&r.value), None, 1 << 20).expect("decodes");
        assert_eq!(back, s);
    }

    /// Goal (issue 18): a record another producer keyed, with no `ce_partitionkey`, keeps
    /// its key as the event's `partitionkey`; an event's own `partitionkey` wins; a key
    /// that is not UTF-8 is left out. Method: the same binary-mode headers read with each
    /// key.
    #[test]
    fn a_record_key_without_a_partitionkey_becomes_it() {
        let headers = [
            ("ce_specversion", Some(&b"1.0"[..])),
            ("ce_id", Some(&b"k-1"[..])),
            ("ce_source", Some(&b"/s"[..])),
            ("ce_type", Some(&b"t"[..])),
        ];
        let key_of = |h: &[(&str, Option<&[u8]>)], key: Option<&[u8]>| {
            let back = from_kafka(h, Some(b"x"), key, 1 << 20).expect("decodes");
            let json: serde_json::Value = serde_json::from_slice(&back).expect("stored form");
            json.get("partitionkey")
                .and_then(|v| v.as_str())
                .map(str::to_owned)
        };
        assert_eq!(
            key_of(&headers, Some(b"order-7")),
            Some("order-7".to_owned())
        );
        assert_eq!(key_of(&headers, None), None);
        assert_eq!(key_of(&headers, Some(&[0xff, 0xfe])), None);
        let mut own = headers.to_vec();
        own.push(("ce_partitionkey", Some(&b"mine"[..])));
        assert_eq!(key_of(&own, Some(b"order-7")), Some("mine".to_owned()));
    }

    #[test]
    fn structured_mode_records_are_accepted() {
        let json =
            br#"{"specversion":"1.0","id":"s-1","source":"/s","type":"t","data":{"a":true}}"#;
        let headers = [(
            "content-type",
            Some(&b"application/cloudevents+json; charset=utf-8"[..]),
        )];
        let back = from_kafka(&headers, Some(json), None, 1 << 20).expect("decodes");
        let meta = decode_stored(&back).expect("stored form");
        assert_eq!(meta.id, "s-1");
    }

    #[test]
    fn a_record_that_is_no_cloudevent_gets_its_reason() {
        let err = from_kafka(&[], Some(b"plain bytes"), None, 1 << 20).unwrap_err();
        assert!(
            err.message().contains("not a CloudEvent"),
            "{}",
            err.message()
        );
        let headers = [("content-type", Some(&b"application/cloudevents+json"[..]))];
        let err = from_kafka(&headers, Some(b"{not json"), None, 1 << 20).unwrap_err();
        assert!(
            err.message().contains("invalid structured"),
            "{}",
            err.message()
        );
        let headers = [
            ("ce_specversion", Some(&b"1.0"[..])),
            ("ce_id", Some(&b"x"[..])),
        ];
        let err = from_kafka(&headers, Some(b""), None, 1 << 20).unwrap_err();
        assert!(err.message().contains("binary-mode"), "{}", err.message());
    }

    #[test]
    fn an_oversized_record_is_refused_before_parsing() {
        let headers = [("content-type", Some(&b"application/cloudevents+json"[..]))];
        let big = vec![b' '; 100];
        let err = from_kafka(&headers, Some(&big), None, 50).unwrap_err();
        assert!(
            err.message().contains("over the limit"),
            "{}",
            err.message()
        );
    }
}
