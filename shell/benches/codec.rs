//! What the CloudEvents codec costs per event, with 1 KiB of JSON data (issue 21): a
//! publish parsed in each mode (binary: headers and body; structured: one JSON event;
//! batch: 50 events in one array), the stored form written and its routing attributes
//! read back, and a stored event rendered for each transport (the delivery JSON of
//! long-poll, SSE and WebSocket; the structured event of a batched webhook push; the
//! headers and body of a binary-mode push). No I/O.
//!
//! Run: `cargo bench -p unimesh-shell --bench codec` (criterion's `thrpt` is events/s).

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use http::{HeaderMap, HeaderName, HeaderValue};
use unimesh_shell::event::{
    decode_stored, delivery_event_json, delivery_event_json_decoded, parse_publish,
    to_binary_request_parts, PublishLimits, BATCH_MEDIA_TYPE, STRUCTURED_MEDIA_TYPE,
};

const DATA_BYTES: usize = 1024;
const BATCH: usize = 50;

fn data(i: usize) -> String {
    let head = format!(r#"{{"t":{i},"p":""#);
    let pad = DATA_BYTES.saturating_sub(head.len() + 2);
    format!("{head}{}\"}}", "x".repeat(pad))
}

fn structured(i: usize) -> String {
    format!(
        r#"{{"specversion":"1.0","id":"e{i}","source":"/bench","type":"bench.event","datacontenttype":"application/json","data":{}}}"#,
        data(i)
    )
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(v),
        ) else {
            panic!("a constant header that is not one: {k}: {v}");
        };
        h.insert(name, value);
    }
    h
}

fn parse(c: &mut Criterion) {
    let limits = PublishLimits::default();
    let mut g = c.benchmark_group("publish_parse_1KiB");
    g.throughput(Throughput::Elements(1));
    let binary = headers(&[
        ("ce-specversion", "1.0"),
        ("ce-id", "e1"),
        ("ce-source", "/bench"),
        ("ce-type", "bench.event"),
        ("content-type", "application/json"),
    ]);
    let body = data(1);
    g.bench_function("binary", |b| {
        b.iter(|| parse_publish(&binary, black_box(body.as_bytes()), &limits).map(|e| e.len()))
    });
    let one = headers(&[("content-type", STRUCTURED_MEDIA_TYPE)]);
    let body = structured(1);
    g.bench_function("structured", |b| {
        b.iter(|| parse_publish(&one, black_box(body.as_bytes()), &limits).map(|e| e.len()))
    });
    g.throughput(Throughput::Elements(BATCH as u64));
    let many = headers(&[("content-type", BATCH_MEDIA_TYPE)]);
    let body = format!(
        "[{}]",
        (0..BATCH).map(structured).collect::<Vec<_>>().join(",")
    );
    g.bench_function(format!("batch_of_{BATCH}"), |b| {
        b.iter(|| parse_publish(&many, black_box(body.as_bytes()), &limits).map(|e| e.len()))
    });
    g.finish();
}

fn store_and_render(c: &mut Criterion) {
    let limits = PublishLimits::default();
    let one = headers(&[("content-type", STRUCTURED_MEDIA_TYPE)]);
    let events = match parse_publish(&one, structured(7).as_bytes(), &limits) {
        Ok(e) => e,
        Err(e) => panic!("the bench's event is refused: {e}"),
    };
    let event = &events[0];
    let stored = event.stored();
    let mut g = c.benchmark_group("event_1KiB");
    g.throughput(Throughput::Elements(1));
    g.bench_function("encode_stored", |b| b.iter(|| black_box(event).stored()));
    g.bench_function("decode_stored", |b| {
        b.iter(|| decode_stored(black_box(&stored)).map(|m| m.id.len()))
    });
    g.bench_function("render_delivery_json", |b| {
        b.iter(|| delivery_event_json_decoded(black_box(&stored), 3, 1_000_000).map(|s| s.len()))
    });
    g.bench_function("render_push_batch_member", |b| {
        b.iter(|| delivery_event_json(black_box(&stored), 3, 1_000_000).map(|r| r.get().len()))
    });
    g.bench_function("render_push_binary", |b| {
        b.iter(|| to_binary_request_parts(black_box(&stored), 3, 1_000_000).map(|(h, _)| h.len()))
    });
    g.finish();
}

criterion_group!(benches, parse, store_and_render);
criterion_main!(benches);
