//! Tests of the CloudEvents codec. Goal: whatever a publisher may send is either refused with
//! the right status and a message naming the event/attribute/header, or accepted and then
//! stored, routed and delivered with every attribute and the data intact. Method: table
//! tests per refusal, round trips per mode, the Python SDK's own requests as an outside
//! check, the Rust SDK's JSON reader as a second one, and property tests on arbitrary input.

use base64::prelude::*;
use bytes::Bytes;
use chrono::{DateTime, Utc};
use cloudevents::event::ExtensionValue;
use cloudevents::{AttributesReader, AttributesWriter, Data, Event};
use http::{HeaderMap, HeaderName, HeaderValue};
use proptest::prelude::*;
use serde_json::{json, Value};

use super::json::Members;
use super::*;

// ---------------------------------------------------------------------------------------
// helpers

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        let name = HeaderName::from_bytes(k.as_bytes()).expect("test header name");
        let value = HeaderValue::from_bytes(v.as_bytes()).expect("test header value");
        h.append(name, value);
    }
    h
}

fn structured() -> HeaderMap {
    headers(&[("content-type", STRUCTURED_MEDIA_TYPE)])
}

fn batch() -> HeaderMap {
    headers(&[("content-type", BATCH_MEDIA_TYPE)])
}

/// The events of a publish as the SDK holds them (JSON data as a tree).
fn parse(h: &HeaderMap, body: &[u8]) -> Result<Vec<Event>, PublishError> {
    parse_publish(h, body, &PublishLimits::default())?
        .into_iter()
        .map(Published::into_event)
        .collect()
}

fn one(h: &HeaderMap, body: &[u8]) -> Event {
    match parse(h, body) {
        Ok(mut v) if v.len() == 1 => v.remove(0),
        other => panic!("expected one event, got {other:?}"),
    }
}

fn refused(h: &HeaderMap, body: &[u8]) -> PublishError {
    match parse(h, body) {
        Err(e) => e,
        Ok(v) => panic!("expected a refusal, got {v:?}"),
    }
}

fn base_event() -> Value {
    json!({
        "specversion": "1.0",
        "id": "e-1",
        "source": "https://example.com/shop",
        "type": "com.example.order.created",
    })
}

fn with(mut v: Value, key: &str, value: Value) -> Value {
    v[key] = value;
    v
}

fn without(mut v: Value, key: &str) -> Value {
    if let Some(m) = v.as_object_mut() {
        m.remove(key);
    }
    v
}

fn delivery_value(stored: &[u8], p: u32, o: u64) -> serde_json::Map<String, Value> {
    let raw = delivery_event_json(stored, p, o).expect("delivery JSON");
    let members: Members =
        serde_json::from_str(raw.get()).expect("delivery JSON has no duplicates");
    members.pairs().into_iter().collect()
}

/// Re-reads delivered binary parts through the publish parser, after checking and removing
/// the two delivery extensions (a publisher may not send those).
fn reparse_binary(mut parts: (HeaderMap, Bytes), p: u32, o: u64) -> Event {
    let (h, body) = &mut parts;
    assert_eq!(
        h.remove("ce-emmqpartition").as_ref().map(|v| v.as_bytes()),
        Some(p.to_string().as_bytes())
    );
    assert_eq!(
        h.remove("ce-emmqoffset").as_ref().map(|v| v.as_bytes()),
        Some(o.to_string().as_bytes())
    );
    one(h, body)
}

/// Every path out of the codec gives back `event`: stored → structured delivery → parsed
/// again, and stored → binary delivery → parsed again; and the routing attributes decode.
fn assert_round_trip(event: &Event) {
    let stored = encode_stored(event);
    let meta = decode_stored(&stored).expect("decode_stored");
    assert_eq!(meta.id, event.id());
    assert_eq!(meta.source, event.source().as_str());
    assert_eq!(meta.ty, event.ty());
    assert_eq!(meta.subject.as_deref(), event.subject());
    assert_eq!(
        meta.partition_key,
        event
            .extension(PARTITION_KEY_EXTENSION)
            .map(|v| v.to_string())
    );
    let mut expected_ext: Vec<(String, String)> = event
        .iter_extensions()
        .filter(|(k, _)| *k != PARTITION_KEY_EXTENSION)
        .map(|(k, v)| (k.to_owned(), v.to_string()))
        .collect();
    expected_ext.sort();
    assert_eq!(meta.extensions, expected_ext);

    let mut delivered = delivery_value(&stored, 7, 123_456_789_012);
    assert_eq!(delivered.remove("emmqpartition"), Some(json!("7")));
    assert_eq!(delivered.remove("emmqoffset"), Some(json!("123456789012")));
    let again = one(
        &structured(),
        &serde_json::to_vec(&delivered).expect("re-serialise"),
    );
    assert_eq!(&again, event, "structured delivery changed the event");

    let parts = to_binary_request_parts(&stored, 7, 123_456_789_012).expect("binary parts");
    let again = reparse_binary(parts, 7, 123_456_789_012);
    assert_eq!(
        again,
        as_binary_mode_sees_it(event),
        "binary delivery changed the event"
    );
}

/// What survives the HTTP binary binding by its nature: every extension is a header string,
/// JSON data is labelled `application/json` when it had no content type, an empty body is no
/// data, and bytes under a JSON content type are JSON.
/// What a publish stores — JSON data as written — reads back as the event does with its
/// data as a tree: the same routing attributes, and structured and binary deliveries that
/// parse to the same event; the two delivery renderings agree.
fn assert_published_round_trip(published: &Published) {
    let event = published.clone().into_event().expect("checked JSON data");
    let stored = published.stored();
    assert_eq!(
        decode_stored(&stored).expect("decode_stored"),
        decode_stored(&encode_stored(&event)).expect("decode_stored"),
    );
    let checked = delivery_event_json(&stored, 7, 9).expect("delivery JSON");
    let decoded = delivery_event_json_decoded(&stored, 7, 9).expect("delivery JSON");
    let as_value = |text: &str| serde_json::from_str::<Value>(text).expect("valid JSON");
    assert_eq!(as_value(&decoded), as_value(checked.get()));
    let mut delivered = delivery_value(&stored, 7, 9);
    delivered.remove("emmqpartition");
    delivered.remove("emmqoffset");
    let again = one(
        &structured(),
        &serde_json::to_vec(&delivered).expect("re-serialise"),
    );
    assert_eq!(again, event, "structured delivery of the stored form");
    let parts = to_binary_request_parts(&stored, 0, 1).expect("parts");
    assert_eq!(
        reparse_binary(parts, 0, 1),
        as_binary_mode_sees_it(&event),
        "binary delivery of the stored form"
    );
}

fn as_binary_mode_sees_it(event: &Event) -> Event {
    let mut e = event.clone();
    match e.data() {
        Some(Data::Binary(b)) if b.is_empty() => {
            e.take_data();
            e.set_datacontenttype(event.datacontenttype());
        }
        Some(Data::String(s)) if s.is_empty() => {
            e.take_data();
            e.set_datacontenttype(event.datacontenttype());
        }
        Some(Data::Binary(b))
            if event
                .datacontenttype()
                .is_some_and(|ct| ct.contains("json")) =>
        {
            let v: Value = serde_json::from_slice(b).expect("JSON bytes under a JSON type");
            e.set_data_unchecked(Data::Json(v));
        }
        _ => {}
    }
    let extensions: Vec<(String, String)> = e
        .iter_extensions()
        .map(|(k, v)| (k.to_owned(), v.to_string()))
        .collect();
    for (k, v) in extensions {
        e.set_extension(&k, ExtensionValue::String(v));
    }
    if e.datacontenttype().is_none() && matches!(e.data(), Some(Data::Json(_))) {
        e.set_datacontenttype(Some("application/json"));
    }
    e
}

// ---------------------------------------------------------------------------------------
// binary mode

#[test]
fn binary_json_event_keeps_every_attribute() {
    let h = headers(&[
        ("ce-specversion", "1.0"),
        ("ce-id", "e-42"),
        ("ce-source", "https://example.com/shop?x=1#frag"),
        ("ce-type", "com.example.order.created"),
        ("ce-subject", "order-42"),
        ("ce-time", "2024-05-17T10:30:15.25+02:00"),
        ("ce-dataschema", "https://example.com/schema/order.json"),
        ("ce-partitionkey", "cust-7"),
        (
            "ce-traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ),
        ("content-type", "application/json"),
    ]);
    let body = br#"{"amount": 12.5, "items": [1, 2, {"x": null}], "big": 9007199254740993}"#;
    let e = one(&h, body);
    assert_eq!(e.id(), "e-42");
    assert_eq!(e.source().as_str(), "https://example.com/shop?x=1#frag");
    assert_eq!(e.ty(), "com.example.order.created");
    assert_eq!(e.subject(), Some("order-42"));
    let t: DateTime<Utc> = "2024-05-17T08:30:15.250Z".parse().expect("time");
    assert_eq!(e.time(), Some(&t));
    assert_eq!(e.datacontenttype(), Some("application/json"));
    assert_eq!(
        e.dataschema().map(|u| u.as_str()),
        Some("https://example.com/schema/order.json")
    );
    assert_eq!(
        e.extension("partitionkey"),
        Some(&ExtensionValue::from("cust-7"))
    );
    assert_eq!(
        e.data(),
        Some(&Data::Json(
            json!({"amount": 12.5, "items": [1, 2, {"x": null}], "big": 9007199254740993u64})
        ))
    );
    assert_round_trip(&e);

    let stored = encode_stored(&e);
    let meta = decode_stored(&stored).expect("meta");
    assert_eq!(meta.partition_key.as_deref(), Some("cust-7"));
    assert_eq!(
        meta.extensions,
        vec![(
            "traceparent".to_owned(),
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01".to_owned()
        )]
    );
    let d = delivery_value(&stored, 3, 99);
    assert_eq!(d["time"], json!("2024-05-17T08:30:15.250Z"));
    assert_eq!(d["data"]["big"], json!(9007199254740993u64));
}

#[test]
fn binary_octet_stream_travels_as_base64_and_back_as_bytes() {
    let body: Vec<u8> = (0..=255u8).rev().collect();
    let h = headers(&[
        ("ce-specversion", "1.0"),
        ("ce-id", "b-1"),
        ("ce-source", "urn:example:blob"),
        ("ce-type", "blob"),
        ("content-type", "application/octet-stream"),
    ]);
    let e = one(&h, &body);
    assert_eq!(e.data(), Some(&Data::Binary(body.clone())));
    let stored = encode_stored(&e);
    let d = delivery_value(&stored, 0, 0);
    assert_eq!(d["data_base64"], json!(BASE64_STANDARD.encode(&body)));
    assert!(!d.contains_key("data"));
    let (h2, b2) = to_binary_request_parts(&stored, 0, 0).expect("parts");
    assert_eq!(&b2[..], &body[..]);
    assert_eq!(
        h2.get("content-type").map(|v| v.as_bytes()),
        Some(&b"application/octet-stream"[..])
    );
    assert_round_trip(&e);
}

#[test]
fn binary_json_content_type_with_binary_body_is_refused() {
    let h = headers(&[
        ("ce-specversion", "1.0"),
        ("ce-id", "b-1"),
        ("ce-source", "/s"),
        ("ce-type", "t"),
        ("content-type", "application/json"),
    ]);
    let e = refused(&h, b"\xff\x00not json");
    assert_eq!(e.status(), 400);
    assert!(e.message().contains("not valid JSON"), "{}", e.message());
}

#[test]
fn binary_unicode_headers_are_percent_decoded_and_encoded() {
    let h = headers(&[
        ("ce-specversion", "1.0"),
        ("ce-id", "e-uni-%C3%A9"),
        ("ce-source", "/shop/eu"),
        ("ce-type", "com.example.%C3%BCnicode"),
        (
            "ce-subject",
            "na%C3%AFve%20%22quoted%22%20100%25%20%E6%97%A5%E6%9C%AC",
        ),
        ("ce-comment", "\u{2615} raw UTF-8 as older SDKs send it"),
        ("content-type", "text/plain; charset=utf-8"),
    ]);
    let body = "h\u{e9}llo w\u{f6}rld \u{65e5}\u{672c}";
    let e = one(&h, body.as_bytes());
    assert_eq!(e.id(), "e-uni-\u{e9}");
    assert_eq!(e.ty(), "com.example.\u{fc}nicode");
    assert_eq!(
        e.subject(),
        Some("na\u{ef}ve \"quoted\" 100% \u{65e5}\u{672c}")
    );
    assert_eq!(
        e.extension("comment").map(|v| v.to_string()).as_deref(),
        Some("\u{2615} raw UTF-8 as older SDKs send it")
    );
    assert_eq!(e.data(), Some(&Data::String(body.to_owned())));

    let stored = encode_stored(&e);
    let (h2, _) = to_binary_request_parts(&stored, 1, 2).expect("parts");
    assert_eq!(
        h2.get("ce-subject").map(|v| v.as_bytes()),
        Some(&b"na%C3%AFve%20%22quoted%22%20100%25%20%E6%97%A5%E6%9C%AC"[..])
    );
    let d = delivery_value(&stored, 1, 2);
    assert_eq!(d["data"], json!(body));
    assert_eq!(
        d["subject"],
        json!("na\u{ef}ve \"quoted\" 100% \u{65e5}\u{672c}")
    );
    assert_round_trip(&e);
}

#[test]
fn binary_without_body_has_no_data_and_without_content_type_is_opaque() {
    let base = [
        ("ce-specversion", "1.0"),
        ("ce-id", "x"),
        ("ce-source", "/s"),
        ("ce-type", "t"),
    ];
    let e = one(&headers(&base), b"");
    assert_eq!(e.data(), None);
    assert_eq!(e.datacontenttype(), None);
    assert_round_trip(&e);

    let e = one(&headers(&base), b"{\"looks\":\"like json\"}");
    assert_eq!(
        e.data(),
        Some(&Data::Binary(b"{\"looks\":\"like json\"}".to_vec()))
    );
    assert_round_trip(&e);
}

#[test]
fn binary_mode_refusals_name_the_header() {
    let base = [
        ("ce-specversion", "1.0"),
        ("ce-id", "x"),
        ("ce-source", "/s"),
        ("ce-type", "t"),
    ];
    // (request headers, header named in the refusal, words of the reason)
    type Case<'a> = (Vec<(&'a str, &'a str)>, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        (
            vec![("ce-id", "x"), ("ce-source", "/s"), ("ce-type", "t")],
            "ce-specversion",
            "is missing",
        ),
        (
            base[..1].iter().chain(&base[2..]).copied().collect(),
            "ce-id",
            "is missing",
        ),
        (
            base[..2].iter().chain(&base[3..]).copied().collect(),
            "ce-source",
            "is missing",
        ),
        (base[..3].to_vec(), "ce-type", "is missing"),
        (
            vec![
                ("ce-specversion", "0.3"),
                ("ce-id", "x"),
                ("ce-source", "/s"),
                ("ce-type", "t"),
            ],
            "ce-specversion",
            "must be \"1.0\"",
        ),
        (
            [&base[..], &[("ce-id", "y")]].concat(),
            "ce-id",
            "more than once",
        ),
        (
            [&base[..], &[("ce-datacontenttype", "text/plain")]].concat(),
            "ce-datacontenttype",
            "content-type header",
        ),
        (
            [&base[..], &[("ce-data", "x")]].concat(),
            "ce-data",
            "body carries the data",
        ),
        (
            [&base[..], &[("ce-emmqoffset", "5")]].concat(),
            "ce-emmqoffset",
            "reserved",
        ),
        (
            [&base[..], &[("ce-emmqpartition", "5")]].concat(),
            "ce-emmqpartition",
            "reserved",
        ),
        (
            [&base[..], &[("ce-bad_name", "5")]].concat(),
            "ce-bad_name",
            "not a valid extension name",
        ),
        (
            [&base[..], &[("ce-abcdefghijklmnopqrstu", "5")]].concat(),
            "ce-abcdefghijklmnopqrstu",
            "longer than 20",
        ),
        (
            [&base[..], &[("ce-ext", "%FF%FE")]].concat(),
            "ce-ext",
            "not UTF-8",
        ),
        (
            [&base[..], &[("ce-time", "yesterday")]].concat(),
            "ce-time",
            "RFC 3339",
        ),
        (
            [&base[..], &[("ce-subject", "")]].concat(),
            "ce-subject",
            "must not be empty",
        ),
        (
            [&base[..], &[("content-type", "nonsense")]].concat(),
            "content-type",
            "media type",
        ),
        (
            [
                &base[..],
                &[
                    ("content-type", "text/plain"),
                    ("content-type", "text/html"),
                ],
            ]
            .concat(),
            "content-type",
            "more than once",
        ),
    ];
    for (pairs, header, why) in cases {
        let e = refused(&headers(&pairs), b"");
        assert_eq!(e.status(), 400, "{pairs:?}");
        assert_eq!(e.code(), "invalid-cloudevent");
        assert_eq!(
            e.field(),
            Some(&Field::Header(header.to_owned())),
            "{pairs:?}: {e}"
        );
        assert!(e.message().contains(why), "{pairs:?}: {e}");
        assert!(
            e.message().starts_with(&format!("header '{header}' ")),
            "{e}"
        );
    }
}

#[test]
fn binary_without_ce_headers_hints_at_structured_mode() {
    let e = refused(&headers(&[("content-type", "application/json")]), b"{}");
    assert_eq!(e.status(), 400);
    assert!(e.message().contains(STRUCTURED_MEDIA_TYPE), "{e}");
}

// ---------------------------------------------------------------------------------------
// structured mode

#[test]
fn structured_event_round_trips_with_every_kind_of_data() {
    let datas = [
        with(
            with(base_event(), "data", json!({"a": [1, "two", 3.5, null]})),
            "datacontenttype",
            json!("application/vnd.example+JSON; charset=utf-8"),
        ),
        with(
            base_event(),
            "data",
            json!("a JSON string, no content type"),
        ),
        with(
            with(base_event(), "data", json!("<p>caf\u{e9}</p>")),
            "datacontenttype",
            json!("text/html"),
        ),
        with(
            with(base_event(), "data_base64", json!("AAEC//57Ig==")),
            "datacontenttype",
            json!("image/png"),
        ),
        // Base64 data with a JSON content type stays bytes: they may not even be JSON.
        with(
            with(base_event(), "data_base64", json!("eyJhIjogMX0=")),
            "datacontenttype",
            json!("application/json"),
        ),
        with(base_event(), "data", json!(null)),
    ];
    for v in datas {
        let e = one(&structured(), &serde_json::to_vec(&v).expect("json"));
        if let Some(b64) = v.get("data_base64") {
            let bytes = BASE64_STANDARD
                .decode(b64.as_str().expect("str"))
                .expect("b64");
            assert_eq!(e.data(), Some(&Data::Binary(bytes)));
        }
        assert_round_trip(&e);
    }
}

#[test]
fn structured_extensions_of_every_type_and_null_attributes() {
    let v = with(
        with(
            with(
                with(base_event(), "flag", json!(true)),
                "count",
                json!(-2147483648i64),
            ),
            "partitionkey",
            json!("k"),
        ),
        "subject",
        json!(null),
    );
    let e = one(&structured(), &serde_json::to_vec(&v).expect("json"));
    assert_eq!(e.subject(), None, "null means absent");
    assert_eq!(e.extension("flag"), Some(&ExtensionValue::Boolean(true)));
    assert_eq!(
        e.extension("count"),
        Some(&ExtensionValue::Integer(-2147483648))
    );
    let meta = decode_stored(&encode_stored(&e)).expect("meta");
    assert_eq!(
        meta.extensions,
        vec![
            ("count".to_owned(), "-2147483648".to_owned()),
            ("flag".to_owned(), "true".to_owned())
        ]
    );
    assert_eq!(meta.extension("flag"), Some("true"));
    assert_round_trip(&e);
}

#[test]
fn structured_refusals_name_the_attribute() {
    let b = base_event;
    let cases: Vec<(Value, &str, &str)> = vec![
        (without(b(), "id"), "id", "is missing"),
        (without(b(), "source"), "source", "is missing"),
        (without(b(), "type"), "type", "is missing"),
        (without(b(), "specversion"), "specversion", "is missing"),
        (with(b(), "id", json!(null)), "id", "is missing"),
        (with(b(), "id", json!("")), "id", "must not be empty"),
        (with(b(), "id", json!(17)), "id", "must be a string"),
        (
            with(b(), "type", json!(["a"])),
            "type",
            "must be a string, not an array",
        ),
        (
            with(b(), "specversion", json!("0.3")),
            "specversion",
            "must be \"1.0\"",
        ),
        (
            with(b(), "source", json!("")),
            "source",
            "must not be empty",
        ),
        (
            with(b(), "source", json!("/has space")),
            "source",
            "URI-reference",
        ),
        (
            with(b(), "source", json!("/caf\u{e9}")),
            "source",
            "URI-reference",
        ),
        (
            with(b(), "source", json!("1abc:x")),
            "source",
            "not a valid scheme",
        ),
        (
            with(b(), "source", json!("/a%zz")),
            "source",
            "percent escape",
        ),
        (
            with(b(), "source", json!("/a#b#c")),
            "source",
            "more than one '#'",
        ),
        (
            with(b(), "subject", json!("")),
            "subject",
            "must not be empty",
        ),
        (
            with(b(), "time", json!("2024-13-01T00:00:00Z")),
            "time",
            "RFC 3339",
        ),
        (
            with(b(), "time", json!("2024-05-17 10:00:00")),
            "time",
            "RFC 3339",
        ),
        (
            with(b(), "dataschema", json!("relative/path")),
            "dataschema",
            "absolute URI",
        ),
        (
            with(b(), "datacontenttype", json!("caf\u{e9}/x")),
            "datacontenttype",
            "printable ASCII",
        ),
        (
            with(b(), "Upper", json!("x")),
            "Upper",
            "not a valid extension name",
        ),
        (
            with(b(), "with-dash", json!("x")),
            "with-dash",
            "not a valid extension name",
        ),
        (
            with(b(), "abcdefghijklmnopqrstu", json!("x")),
            "abcdefghijklmnopqrstu",
            "longer than 20",
        ),
        (
            with(b(), "ratio", json!(1.5)),
            "ratio",
            "string, a boolean or an integer",
        ),
        (
            with(b(), "nested", json!({"a": 1})),
            "nested",
            "not an object",
        ),
        (with(b(), "big", json!(1i64 << 40)), "big", "32-bit"),
        (
            with(b(), "emmqoffset", json!("5")),
            "emmqoffset",
            "reserved",
        ),
        (
            with(b(), "emmqpartition", json!(1)),
            "emmqpartition",
            "reserved",
        ),
        (
            with(with(b(), "data", json!(1)), "data_base64", json!("AA==")),
            "data",
            "both present",
        ),
        (
            with(b(), "data_base64", json!("not base64!")),
            "data_base64",
            "not valid base64",
        ),
        (
            with(b(), "data_base64", json!(12)),
            "data_base64",
            "string of base64",
        ),
        (
            with(
                with(b(), "data", json!({"a": 1})),
                "datacontenttype",
                json!("text/plain"),
            ),
            "data",
            "must be a JSON string",
        ),
    ];
    for (v, attribute, why) in cases {
        let e = refused(&structured(), &serde_json::to_vec(&v).expect("json"));
        assert_eq!(e.status(), 400, "{v}: {e}");
        assert_eq!(e.code(), "invalid-cloudevent");
        assert_eq!(
            e.field(),
            Some(&Field::Attribute(attribute.to_owned())),
            "{v}: {e}"
        );
        assert!(e.message().contains(why), "{v}: {e}");
        assert_eq!(e.index(), None);
    }
}

#[test]
fn structured_refuses_duplicate_members_and_non_objects() {
    let body = br#"{"specversion":"1.0","id":"a","id":"b","source":"/s","type":"t"}"#;
    let e = refused(&structured(), body);
    assert_eq!(e.status(), 400);
    assert!(e.message().contains("\"id\" appears more than once"), "{e}");

    for body in [&b"[]"[..], b"\"x\"", b"", b"{", b"{} trailing", b"\xff"] {
        let e = refused(&structured(), body);
        assert_eq!(e.status(), 400, "{body:?}");
        assert!(e.message().contains("not a valid JSON object"), "{e}");
    }
}

#[test]
fn structured_content_type_parameters() {
    let body = serde_json::to_vec(&base_event()).expect("json");
    for ct in [
        "application/cloudevents+json; charset=utf-8",
        "Application/CloudEvents+JSON;charset=\"UTF-8\"",
        "application/cloudevents+json ; foo=bar",
    ] {
        let e = one(&headers(&[("content-type", ct)]), &body);
        assert_eq!(e.id(), "e-1", "{ct}");
    }
    for ct in [
        "application/cloudevents+json; charset=iso-8859-1",
        "application/cloudevents-batch+json; charset=utf-16",
        "application/cloudevents+avro",
        "application/cloudevents-batch+protobuf",
    ] {
        let e = refused(&headers(&[("content-type", ct)]), &body);
        assert_eq!(e.status(), 415, "{ct}: {e}");
        assert_eq!(e.code(), "unsupported-media-type");
    }
}

// ---------------------------------------------------------------------------------------
// batch mode

#[test]
fn batch_keeps_order_and_every_event() {
    let events: Vec<Value> = (0..5)
        .map(|i| {
            with(
                with(base_event(), "id", json!(format!("e-{i}"))),
                "data",
                json!({"i": i}),
            )
        })
        .collect();
    let got = parse(&batch(), &serde_json::to_vec(&events).expect("json")).expect("batch");
    assert_eq!(got.len(), 5);
    for (i, e) in got.iter().enumerate() {
        assert_eq!(e.id(), format!("e-{i}"));
        assert_eq!(e.data(), Some(&Data::Json(json!({"i": i}))));
        assert_round_trip(e);
    }
    assert_eq!(parse(&batch(), b" [ ] ").expect("empty batch").len(), 0);
}

#[test]
fn batch_with_one_bad_event_is_refused_whole_and_names_it() {
    let events = vec![
        base_event(),
        with(base_event(), "id", json!("e-2")),
        without(base_event(), "source"),
        with(base_event(), "id", json!("e-4")),
    ];
    let e = refused(&batch(), &serde_json::to_vec(&events).expect("json"));
    assert_eq!(e.index(), Some(2));
    assert_eq!(e.message(), "event 2: attribute 'source' is missing");
    assert_eq!(
        e.to_json(),
        json!({"error": "invalid-cloudevent", "message": "event 2: attribute 'source' is missing"})
    );

    let e = refused(
        &batch(),
        br#"[{"specversion":"1.0","id":"a","source":"/s","type":"t"}, 5]"#,
    );
    assert_eq!(e.index(), Some(1));
    assert!(e.message().starts_with("event 1: "), "{e}");

    for body in [&b"{}"[..], b"[", b"[1,]", b"", b"[] []"] {
        let e = refused(&batch(), body);
        assert_eq!(e.status(), 400, "{body:?}");
        assert!(e.message().contains("not a JSON array"), "{e}");
    }
}

// ---------------------------------------------------------------------------------------
// size limits

#[test]
fn size_limits_are_413_and_checked_before_parsing() {
    let limits = PublishLimits {
        max_event_bytes: 200,
        max_request_bytes: 1000,
        max_batch_events: 3,
    };
    let small = serde_json::to_vec(&base_event()).expect("json");
    assert!(small.len() < 200);
    assert!(parse_publish(&structured(), &small, &limits).is_ok());

    // Not even JSON: refused for its size, which proves the size is looked at first.
    let garbage = vec![b'x'; 201];
    let e = parse_publish(&structured(), &garbage, &limits).expect_err("too large");
    assert_eq!((e.status(), e.code()), (413, "too-large"), "{e}");

    let garbage = vec![b'x'; 1001];
    for h in [structured(), batch(), HeaderMap::new()] {
        let e = parse_publish(&h, &garbage, &limits).expect_err("too large");
        assert_eq!(e.status(), 413, "{e}");
        assert!(e.message().contains("request body"), "{e}");
    }

    // Binary: body and ce-* headers count.
    let h = headers(&[
        ("ce-specversion", "1.0"),
        ("ce-id", "x"),
        ("ce-source", "/s"),
        ("ce-type", "t"),
        ("ce-padding", &"p".repeat(120)),
    ]);
    assert!(parse_publish(&h, &[0u8; 10], &limits).is_ok());
    let e = parse_publish(&h, &[0u8; 60], &limits).expect_err("too large");
    assert_eq!(e.status(), 413, "{e}");

    // Batch: each event against the event limit, with its index; the count against the
    // batch limit.
    let big = with(base_event(), "data", json!("d".repeat(200)));
    let body = serde_json::to_vec(&vec![base_event(), big]).expect("json");
    let e = parse_publish(&batch(), &body, &limits).expect_err("too large");
    assert_eq!((e.status(), e.index()), (413, Some(1)), "{e}");

    let four = serde_json::to_vec(&vec![base_event(); 4]).expect("json");
    let e = parse_publish(&batch(), &four, &limits).expect_err("too many");
    assert_eq!(e.status(), 413, "{e}");
    assert!(e.message().contains("more than 3 events"), "{e}");
    let three = serde_json::to_vec(&vec![base_event(); 3]).expect("json");
    assert_eq!(
        parse_publish(&batch(), &three, &limits)
            .expect("three")
            .len(),
        3
    );
}

// ---------------------------------------------------------------------------------------
// stored form

#[test]
fn decode_stored_refuses_what_cannot_be_routed() {
    let cases: Vec<(&[u8], &str)> = vec![
        (b"", "EOF"),
        (b"not json", "expected"),
        (b"[1,2]", "CloudEvent JSON object"),
        (
            br#"{"id":"a","source":"/s","type":"t"}"#,
            "'specversion' is missing",
        ),
        (
            br#"{"specversion":"0.3","id":"a","source":"/s","type":"t"}"#,
            "not \"1.0\"",
        ),
        (
            br#"{"specversion":"1.0","source":"/s","type":"t"}"#,
            "'id' is missing",
        ),
        (
            br#"{"specversion":"1.0","id":"","source":"/s","type":"t"}"#,
            "'id' is empty",
        ),
        (
            br#"{"specversion":"1.0","id":"a","source":"/s"}"#,
            "'type' is missing",
        ),
        (
            br#"{"specversion":"1.0","id":"a","id":"b","source":"/s","type":"t"}"#,
            "'id' appears more than once",
        ),
        (
            br#"{"specversion":"1.0","id":"a","source":"/s","type":"t","x":1,"x":2}"#,
            "'x' appears more than once",
        ),
        (
            br#"{"specversion":"1.0","id":"a","source":"/s","type":"t","x":[1]}"#,
            "extension value",
        ),
        (
            br#"{"specversion":"1.0","id":"a","source":"/s","type":"t"} x"#,
            "trailing",
        ),
        (
            br#"{"specversion":"1.0","id":7,"source":"/s","type":"t"}"#,
            "invalid type",
        ),
    ];
    for (bytes, why) in cases {
        let e = decode_stored(bytes).expect_err("refused");
        assert!(
            e.to_string().contains(why),
            "{}: {e}",
            String::from_utf8_lossy(bytes)
        );
    }
}

#[test]
fn decode_stored_skips_data_and_delivery_extensions() {
    let stored = br#"{"specversion":"1.0","id":"a","source":"/s","type":"t",
        "data":{"id":"not me","deep":[[[{"type":"no"}]]]},"emmqoffset":"9","zz":false,
        "partitionkey":12,"datacontenttype":"application/json","aa":"\u00e9"}"#;
    let meta = decode_stored(stored).expect("meta");
    assert_eq!(meta.id, "a");
    assert_eq!(meta.ty, "t");
    assert_eq!(meta.partition_key.as_deref(), Some("12"));
    assert_eq!(
        meta.extensions,
        vec![
            ("aa".to_owned(), "\u{e9}".to_owned()),
            ("zz".to_owned(), "false".to_owned())
        ]
    );
}

#[test]
fn stored_form_is_deterministic_and_puts_data_last() {
    let mut v = base_event();
    for name in ["zeta", "alpha", "mid", "beta", "omega", "kappa"] {
        v = with(v, name, json!(name));
    }
    let v = with(v, "data", json!({"k": 1}));
    let e = one(&structured(), &serde_json::to_vec(&v).expect("json"));
    let first = encode_stored(&e);
    for _ in 0..10 {
        let again = one(&structured(), &first);
        assert_eq!(encode_stored(&again), first);
    }
    let members: Members = serde_json::from_slice(&first).expect("members");
    let pairs = members.pairs();
    let names: Vec<&str> = pairs.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        names,
        [
            "specversion",
            "id",
            "type",
            "source",
            "alpha",
            "beta",
            "kappa",
            "mid",
            "omega",
            "zeta",
            "data"
        ]
    );
}

#[test]
fn partition_key_prefers_the_extension_then_the_subject() {
    let e = one(
        &structured(),
        &serde_json::to_vec(&with(
            with(base_event(), "subject", json!("sub")),
            "partitionkey",
            json!("pk"),
        ))
        .expect("json"),
    );
    assert_eq!(partition_key(&e).as_deref(), Some("pk"));
    let e = one(
        &structured(),
        &serde_json::to_vec(&with(base_event(), "subject", json!("sub"))).expect("json"),
    );
    assert_eq!(partition_key(&e).as_deref(), Some("sub"));
    let e = one(
        &structured(),
        &serde_json::to_vec(&base_event()).expect("json"),
    );
    assert_eq!(partition_key(&e), None);
}

// ---------------------------------------------------------------------------------------
// delivery

#[test]
fn delivery_json_splices_position_as_strings() {
    let e = one(
        &structured(),
        &serde_json::to_vec(&with(base_event(), "data", json!([1, 2]))).expect("json"),
    );
    let stored = encode_stored(&e);
    let raw = delivery_event_json(&stored, u32::MAX, u64::MAX).expect("json");
    let d: serde_json::Map<String, Value> = serde_json::from_str(raw.get()).expect("valid");
    assert_eq!(d["emmqpartition"], json!(u32::MAX.to_string()));
    assert_eq!(d["emmqoffset"], json!(u64::MAX.to_string()));
    let stored_map: serde_json::Map<String, Value> =
        serde_json::from_slice(&stored).expect("stored");
    for (k, v) in &stored_map {
        assert_eq!(d.get(k), Some(v), "{k}");
    }
    assert_eq!(d.len(), stored_map.len() + 2);
    // Embeds as JSON, not as a string.
    let envelope = json!({ "deliveryId": "d", "event": raw });
    assert_eq!(envelope["event"]["id"], json!("e-1"));
}

#[test]
fn delivery_json_overrides_stored_position_members_even_when_escaped() {
    // Only a record not written by the mesh can look like this; the delivery must still
    // carry exactly one, true, position.
    let cases: [&[u8]; 4] = [
        br#"{"specversion":"1.0","id":"a","source":"/s","type":"t","emmqoffset":"1"}"#,
        br#"{"specversion":"1.0","id":"a","source":"/s","type":"t","\u0065mmqoffset":"1"}"#,
        br#"{"specversion":"1.0","id":"a","source":"/s","type":"t","data":{"emmqoffset":1}}"#,
        b" \n{ } ",
    ];
    for stored in cases {
        let raw = delivery_event_json(stored, 4, 77).expect("json");
        let members: Members = serde_json::from_str(raw.get()).expect("no duplicate members");
        let pairs = members.pairs();
        let offsets: Vec<&Value> = pairs
            .iter()
            .filter(|(k, _)| k == "emmqoffset")
            .map(|(_, v)| v)
            .collect();
        assert_eq!(offsets, vec![&json!("77")], "{}", raw.get());
    }
}

/// Goal: JSON data is stored and delivered as the publisher wrote it, escapes included,
/// and its text does not send a decoded record's delivery down the slow path: only the
/// members before the data can be top-level names. Method: data with `\u` escapes and a
/// nested `emmqoffset`, published, stored, delivered: one top-level position, the data's
/// text intact.
#[test]
fn json_data_is_kept_as_written_and_its_text_is_no_member_name() {
    let body = br#"{"specversion":"1.0","id":"u","source":"/s","type":"t",
        "data": {"name":"caf\u00e9","emmqoffset":1,  "n": 1e3}}"#;
    let published = parse_publish(&structured(), body, &PublishLimits::default())
        .expect("accepted")
        .remove(0);
    let stored = published.stored();
    let text = std::str::from_utf8(&stored).expect("UTF-8");
    assert!(
        text.ends_with(r#","data":{"name":"caf\u00e9","emmqoffset":1,  "n": 1e3}}"#),
        "{text}"
    );
    assert_eq!(
        members_before_data_len(&stored),
        text.find(r#""data":"#).expect("data")
    );
    let delivered = delivery_event_json_decoded(&stored, 3, 44).expect("delivery");
    assert!(
        delivered.starts_with(r#"{"emmqpartition":"3","emmqoffset":"44","specversion""#),
        "the splice, not the parse: {delivered}"
    );
    let v: Value = serde_json::from_str(&delivered).expect("valid JSON");
    assert_eq!(v["emmqoffset"], json!("44"));
    assert_eq!(v["data"]["name"], json!("café"));
    assert_eq!(v["data"]["emmqoffset"], json!(1));
    // An attribute spelled with an escape still takes the checked path.
    let escaped = br#"{"specversion":"1.0","id":"a","source":"/s","type":"t","\u0065mmqoffset":"1","data":1}"#;
    let members: Members =
        serde_json::from_str(&delivery_event_json_decoded(escaped, 4, 77).expect("json"))
            .expect("no duplicate members");
    let pairs = members.pairs();
    let offsets: Vec<&Value> = pairs
        .iter()
        .filter(|(k, _)| k == "emmqoffset")
        .map(|(_, v)| v)
        .collect();
    assert_eq!(offsets, vec![&json!("77")]);
}

/// The length of the part of a stored event before its data member (test hook).
fn members_before_data_len(stored: &[u8]) -> usize {
    super::delivery::members_before_data(stored).len()
}

#[test]
fn delivery_refuses_broken_stored_records() {
    for stored in [
        &b""[..],
        b"{",
        b"{\"a\":1",
        b"[1]",
        b"\"s\"",
        b"{} {}",
        b"\xff{}",
        b"{\"a\":1}}",
    ] {
        assert!(
            delivery_event_json(stored, 0, 0).is_err(),
            "{}",
            String::from_utf8_lossy(stored)
        );
    }
}

#[test]
fn binary_parts_name_json_data_without_content_type() {
    let e = one(
        &structured(),
        &serde_json::to_vec(&with(base_event(), "data", json!({"x": 1}))).expect("json"),
    );
    let (h, body) = to_binary_request_parts(&encode_stored(&e), 2, 3).expect("parts");
    assert_eq!(
        h.get("content-type").map(|v| v.as_bytes()),
        Some(&b"application/json"[..])
    );
    assert_eq!(
        serde_json::from_slice::<Value>(&body).expect("json"),
        json!({"x": 1})
    );
    assert_eq!(
        h.get("ce-specversion").map(|v| v.as_bytes()),
        Some(&b"1.0"[..])
    );
    assert_eq!(
        h.get("ce-source").map(|v| v.as_bytes()),
        Some(&b"https://example.com/shop"[..])
    );
}

// ---------------------------------------------------------------------------------------
// outside checks: the Rust SDK's JSON format and the Python SDK's requests

#[test]
fn rust_sdk_reads_our_stored_form_and_we_read_its_output() {
    let bodies = [
        with(
            with(base_event(), "data", json!({"a": 1})),
            "datacontenttype",
            json!("application/json"),
        ),
        with(
            with(
                with(base_event(), "data_base64", json!("AAEC")),
                "datacontenttype",
                json!("application/octet-stream"),
            ),
            "ext",
            json!(5),
        ),
        with(
            with(
                with(base_event(), "data", json!("plain")),
                "datacontenttype",
                json!("text/plain"),
            ),
            "time",
            json!("2024-01-02T03:04:05.123456789Z"),
        ),
    ];
    for v in bodies {
        let ours = one(&structured(), &serde_json::to_vec(&v).expect("json"));
        let sdk: Event = serde_json::from_slice(&encode_stored(&ours)).expect("SDK reads stored");
        assert_eq!(sdk, ours);
        let sdk_json = serde_json::to_vec(&sdk).expect("SDK writes");
        assert_eq!(one(&structured(), &sdk_json), ours);
    }
}

#[test]
fn python_sdk_fixtures() {
    let fixtures: Vec<Value> =
        serde_json::from_str(include_str!("testdata/python_sdk.json")).expect("fixture file");
    assert!(fixtures.len() >= 12, "fixtures: {}", fixtures.len());
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    for f in &fixtures {
        let name = text(&f["name"]);
        let mut h = HeaderMap::new();
        for pair in f["headers"].as_array().expect("headers") {
            let k = HeaderName::from_bytes(text(&pair[0]).as_bytes()).expect("name");
            let v = HeaderValue::from_bytes(text(&pair[1]).as_bytes()).expect("value");
            h.append(k, v);
        }
        let body = BASE64_STANDARD
            .decode(text(&f["body_base64"]))
            .expect("body");
        let e = match parse(&h, &body) {
            Ok(mut v) if v.len() == 1 => v.remove(0),
            other => panic!("{name}: {other:?}"),
        };
        let expect = &f["expect"];
        let attrs = expect["attributes"].as_object().expect("attributes");
        for (k, v) in attrs {
            let v = text(v);
            match k.as_str() {
                "specversion" => assert_eq!(e.specversion().to_string(), v, "{name}"),
                "id" => assert_eq!(e.id(), v, "{name}"),
                "source" => assert_eq!(e.source().as_str(), v, "{name}"),
                "type" => assert_eq!(e.ty(), v, "{name}"),
                "subject" => assert_eq!(e.subject(), Some(v.as_str()), "{name}"),
                "datacontenttype" => assert_eq!(e.datacontenttype(), Some(v.as_str()), "{name}"),
                "time" => {
                    let t: DateTime<Utc> = DateTime::parse_from_rfc3339(&v)
                        .expect("fixture time")
                        .with_timezone(&Utc);
                    assert_eq!(e.time(), Some(&t), "{name}");
                }
                ext => assert_eq!(
                    e.extension(ext).map(|x| x.to_string()),
                    Some(v),
                    "{name}: {ext}"
                ),
            }
        }
        assert_eq!(e.iter().count(), attrs.len(), "{name}: extra attributes");
        let data = if let Some(j) = expect.get("data_json") {
            Data::Json(j.clone())
        } else if let Some(t) = expect.get("data_text") {
            Data::String(text(t))
        } else {
            Data::Binary(
                BASE64_STANDARD
                    .decode(text(&expect["data_bytes_base64"]))
                    .expect("data"),
            )
        };
        assert_eq!(e.data(), Some(&data), "{name}");
        assert_round_trip(&e);
    }

    // The SDK has no batch writer: a batch of its structured bodies must be read as well.
    let structured_bodies: Vec<Value> = fixtures
        .iter()
        .filter(|f| text(&f["name"]).contains("structured"))
        .map(|f| {
            let body = BASE64_STANDARD
                .decode(text(&f["body_base64"]))
                .expect("body");
            serde_json::from_slice(&body).expect("structured body")
        })
        .collect();
    let got = parse(
        &batch(),
        &serde_json::to_vec(&structured_bodies).expect("json"),
    )
    .expect("batch of SDK events");
    assert_eq!(got.len(), structured_bodies.len());
}

// ---------------------------------------------------------------------------------------
// properties

fn header_strategy() -> impl Strategy<Value = (String, Vec<u8>)> {
    let names = prop_oneof![
        Just("content-type".to_owned()),
        Just("ce-specversion".to_owned()),
        Just("ce-id".to_owned()),
        Just("ce-source".to_owned()),
        Just("ce-type".to_owned()),
        Just("ce-time".to_owned()),
        Just("ce-subject".to_owned()),
        Just("ce-emmqoffset".to_owned()),
        "ce-[a-z0-9_]{0,24}",
        "[a-z-]{1,12}",
    ];
    let values = prop_oneof![
        Just(b"1.0".to_vec()),
        Just(STRUCTURED_MEDIA_TYPE.as_bytes().to_vec()),
        Just(BATCH_MEDIA_TYPE.as_bytes().to_vec()),
        Just(b"application/json".to_vec()),
        Just(b"text/plain; charset=utf-8".to_vec()),
        Just(b"2024-01-01T00:00:00Z".to_vec()),
        "[ -~]{0,30}".prop_map(String::into_bytes),
        proptest::collection::vec(32u8..=255, 0..30),
    ];
    (names, values)
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|i| json!(i)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        "\\PC{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map("[a-z]{1,4}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A valid structured event with random attributes, extensions and data.
fn valid_event_json() -> impl Strategy<Value = Value> {
    (
        "\\PC{1,16}",
        "(/|urn:|https://ex\\.com/)[a-z0-9/._~-]{0,12}",
        "\\PC{1,16}",
        proptest::option::of("\\PC{1,16}"),
        proptest::collection::btree_map(
            "[a-z0-9]{1,20}",
            prop_oneof![
                "\\PC{0,12}".prop_map(Value::String),
                any::<bool>().prop_map(Value::Bool),
                any::<i32>().prop_map(|i| json!(i)),
            ],
            0..5,
        ),
        prop_oneof![
            Just(None),
            json_value().prop_map(|v| Some(("data", v, None))),
            "\\PC{0,20}".prop_map(|s| Some(("data", Value::String(s), Some("text/plain")))),
            proptest::collection::vec(any::<u8>(), 0..40).prop_map(|b| Some((
                "data_base64",
                Value::String(BASE64_STANDARD.encode(b)),
                Some("application/octet-stream")
            ))),
        ],
        proptest::option::of((0i64..4_000_000_000, 0u32..1_000_000_000)),
    )
        .prop_map(|(id, source, ty, subject, exts, data, time)| {
            let mut v = json!({"specversion": "1.0", "id": id, "source": source, "type": ty});
            if let Some(s) = subject {
                v["subject"] = json!(s);
            }
            for (k, x) in exts {
                if !matches!(
                    k.as_str(),
                    "specversion"
                        | "id"
                        | "source"
                        | "type"
                        | "subject"
                        | "time"
                        | "data"
                        | "datacontenttype"
                        | "dataschema"
                        | "emmqoffset"
                        | "emmqpartition"
                ) {
                    v[k] = x;
                }
            }
            if let Some((name, d, ct)) = data {
                v[name] = d;
                if let Some(ct) = ct {
                    v["datacontenttype"] = json!(ct);
                }
            }
            if let Some((secs, nanos)) = time {
                if let Some(t) = DateTime::<Utc>::from_timestamp(secs, nanos) {
                    v["time"] = json!(t.to_rfc3339());
                }
            }
            v
        })
}

proptest! {
    #[test]
    fn decoders_never_panic_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = decode_stored(&bytes);
        let _ = to_binary_request_parts(&bytes, 1, 2);
        if let Ok(raw) = delivery_event_json(&bytes, 1, 2) {
            let v: serde_json::Map<String, Value> = serde_json::from_str(raw.get())
                .expect("delivery JSON is a valid object");
            prop_assert_eq!(&v["emmqoffset"], &json!("2"));
            prop_assert_eq!(&v["emmqpartition"], &json!("1"));
        }
    }

    #[test]
    fn decoders_never_panic_on_json_shaped_bytes(v in json_value(), cut in 0usize..200) {
        let bytes = serde_json::to_vec(&v).expect("json");
        let bytes = &bytes[..cut.min(bytes.len())];
        let _ = decode_stored(bytes);
        let _ = to_binary_request_parts(bytes, 1, 2);
        if let Ok(raw) = delivery_event_json(bytes, 1, 2) {
            let v: serde_json::Map<String, Value> = serde_json::from_str(raw.get())
                .expect("delivery JSON is a valid object");
            prop_assert_eq!(&v["emmqoffset"], &json!("2"));
        }
    }

    #[test]
    fn publish_parser_never_panics_and_what_it_accepts_round_trips(
        hs in proptest::collection::vec(header_strategy(), 0..8),
        body in prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..200),
            json_value().prop_map(|v| serde_json::to_vec(&v).expect("json")),
            valid_event_json().prop_map(|v| serde_json::to_vec(&v).expect("json")),
            proptest::collection::vec(valid_event_json(), 0..3)
                .prop_map(|v| serde_json::to_vec(&v).expect("json")),
        ],
    ) {
        let mut h = HeaderMap::new();
        for (k, v) in hs {
            if let (Ok(k), Ok(v)) = (HeaderName::from_bytes(k.as_bytes()), HeaderValue::from_bytes(&v)) {
                h.append(k, v);
            }
        }
        match parse(&h, &body) {
            Ok(events) => {
                for e in &events {
                    assert_round_trip(e);
                }
                let published = parse_publish(&h, &body, &PublishLimits::default())
                    .expect("accepted above");
                for p in &published {
                    assert_published_round_trip(p);
                }
            }
            Err(e) => {
                prop_assert!([400, 413, 415].contains(&e.status()));
                prop_assert!(!e.message().is_empty());
            }
        }
    }

    #[test]
    fn valid_events_round_trip_in_every_mode(v in valid_event_json()) {
        let body = serde_json::to_vec(&v).expect("json");
        let e = match parse(&structured(), &body) {
            Ok(mut events) => events.remove(0),
            Err(err) => return Err(TestCaseError::fail(format!("{v}: {err}"))),
        };
        assert_round_trip(&e);
        let stored = encode_stored(&e);
        let (h, b) = to_binary_request_parts(&stored, 0, 1).expect("parts");
        let binary = reparse_binary((h, b), 0, 1);
        prop_assert_eq!(binary, as_binary_mode_sees_it(&e));
        for p in parse_publish(&structured(), &body, &PublishLimits::default()).expect("accepted") {
            assert_published_round_trip(&p);
        }
        let batch_body = serde_json::to_vec(&vec![v.clone(), v]).expect("json");
        let both = parse(&batch(), &batch_body).expect("batch");
        prop_assert_eq!(both.len(), 2);
        prop_assert_eq!(&both[1], &e);
    }
}

#[test]
fn json_numbers_keep_their_exact_value() {
    // Found by the round-trip property: without exact float parsing this number came back
    // as 3.4103832870519525e227.
    let text = r#"{"specversion":"1.0","id":"n","source":"/s","type":"t",
        "data":[3.4103832870519516e227,-0.0,9007199254740993,-9223372036854775808,1e-320]}"#;
    let e = one(&structured(), text.as_bytes());
    let d = delivery_value(&encode_stored(&e), 0, 0);
    let expected: Value = serde_json::from_str(
        "[3.4103832870519516e227,-0.0,9007199254740993,-9223372036854775808,1e-320]",
    )
    .expect("json");
    assert_eq!(d["data"], expected);
    assert_eq!(
        d["data"][0].as_f64().map(f64::to_bits),
        Some(3.4103832870519516e227f64.to_bits())
    );
}
