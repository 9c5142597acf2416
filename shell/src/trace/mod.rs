//! Traces (DESIGN.md §5.2): spans for publish, fetch, deliver, ACK and push, each per-event
//! span parented on the trace its event carries (the CloudEvents distributed-tracing
//! extension), so one trace shows an event's publish, deliveries and ACK; exported over OTLP
//! when configured (`otlp`, the `[otel]` section).
//!
//! The per-event spans are at DEBUG under the target [`TARGET`]: the default log filter
//! (`info`) turns them off at their call sites, so without an exporter (or a log filter
//! naming the target) they cost one cached interest check each. The exporter's layer enables
//! them for itself alone.

/// The W3C trace context the events carry; parsed where events are (`event` imports no
/// tracing, so the two modules do not import each other).
pub use crate::event::trace_context as context;
#[cfg(all(feature = "otlp", not(madsim)))]
pub mod otlp;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use tracing::Span;
use unimesh_core::{Delivery, DeliveryId, GroupName, RecordMeta, TopicName};

use crate::event::Published;

use self::context::{TraceParent, TRACEPARENT, TRACESTATE};

/// The target of the per-event spans (`publish`, `deliver`, `ack`, `nack`, `extend`,
/// `push`).
pub const TARGET: &str = "unimesh::trace";

/// Set once an exporter is installed: only then are spans given remote parents and the
/// ACK parents remembered.
static EXPORTING: AtomicBool = AtomicBool::new(false);

/// Whether spans are being exported (the parent bookkeeping is skipped otherwise).
pub fn exporting() -> bool {
    EXPORTING.load(Ordering::Relaxed)
}

/// The trace context an event carries, when it carries a valid one (records written by
/// something other than the mesh may carry any string: then there is none).
pub fn event_context(meta: &RecordMeta) -> Option<(TraceParent, Option<&str>)> {
    match meta {
        RecordMeta::Event(m) => {
            let parent = TraceParent::parse(m.extension(TRACEPARENT)?).ok()?;
            Some((parent, m.extension(TRACESTATE)))
        }
        RecordMeta::Undecodable(_) => None,
    }
}

/// Makes the event's trace the parent of `span` (when exporting and the span is on).
pub fn set_parent(span: &Span, parent: Option<(TraceParent, Option<&str>)>) {
    if span.is_disabled() || !exporting() {
        return;
    }
    #[cfg(all(feature = "otlp", not(madsim)))]
    if let Some((p, state)) = parent {
        otlp::set_parent(span, p, state);
    }
    #[cfg(not(all(feature = "otlp", not(madsim))))]
    let _ = parent;
}

/// The `traceparent` header of an outgoing push of one event: the push span's own context
/// (the event's trace id, the push span as parent) while exporting, else the event's as
/// published.
pub fn outgoing(span: &Span, event: Option<TraceParent>) -> Option<String> {
    #[cfg(all(feature = "otlp", not(madsim)))]
    if exporting() && !span.is_disabled() {
        if let Some(own) = otlp::span_parent(span) {
            return Some(own.to_string());
        }
    }
    let _ = span;
    event.map(|p| p.to_string())
}

/// A span for one delivery handed to a client (`via`: poll, sse, websocket).
pub fn deliver_span(group: &GroupName, d: &Delivery, via: &'static str) -> Span {
    let span = tracing::debug_span!(
        target: TARGET,
        "deliver",
        group = %group,
        topic = %d.topic,
        partition = d.partition,
        offset = d.record.offset,
        attempt = d.attempt,
        via,
    );
    if !span.is_disabled() && exporting() {
        set_parent(&span, event_context(&d.record.meta));
        // Its ACK becomes its child: publish and deliver under the producer's span, the ACK
        // under the delivery it settles.
        #[cfg(all(feature = "otlp", not(madsim)))]
        remember(group, &d.id, otlp::span_parent(&span));
    }
    span
}

/// A span for one settled delivery id (`ack`, `nack` or `extend`), parented on the trace
/// of the event it was delivered with (remembered by [`deliver_span`]).
pub fn settle_span(group: &GroupName, id: &DeliveryId, how: &'static str) -> Span {
    let span = match how {
        "nack" => tracing::debug_span!(target: TARGET, "nack", group = %group,
            partition = id.partition, offset = id.offset, attempt = id.attempt,
            outcome = tracing::field::Empty),
        "extend" => tracing::debug_span!(target: TARGET, "extend", group = %group,
            partition = id.partition, offset = id.offset, attempt = id.attempt,
            outcome = tracing::field::Empty),
        _ => tracing::debug_span!(target: TARGET, "ack", group = %group,
            partition = id.partition, offset = id.offset, attempt = id.attempt,
            outcome = tracing::field::Empty),
    };
    if !span.is_disabled() && exporting() {
        let parent = recall(group, id, how == "extend");
        set_parent(&span, parent.map(|p| (p, None)));
    }
    span
}

/// The span of one HTTP request on either listener: method, route (the matched path
/// template), the group or topic its path names, and the answer's status (recorded by the
/// caller). Parented on the request's own `traceparent` header while exporting.
pub fn request_span(req: &http::Request<axum::body::Body>) -> Span {
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map_or("unmatched", |p| p.as_str());
    let (group, topic) = named_in(req.uri().path());
    let span = tracing::info_span!(
        "request",
        method = %req.method(),
        route,
        group,
        topic,
        status = tracing::field::Empty,
    );
    if exporting() && !span.is_disabled() {
        let parent = req
            .headers()
            .get(TRACEPARENT)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| TraceParent::parse(v).ok());
        let state = req.headers().get(TRACESTATE).and_then(|v| v.to_str().ok());
        set_parent(&span, parent.map(|p| (p, state)));
    }
    span
}

/// The group (`/v1/subscriptions/G/..`, `/admin/subscriptions/G/..`) or topic
/// (`/v1/topics/T/..`) a request path names.
fn named_in(path: &str) -> (Option<&str>, Option<&str>) {
    let mut parts = path.trim_start_matches('/').split('/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some("v1" | "admin"), Some("subscriptions"), Some(g)) if !g.is_empty() => (Some(g), None),
        (Some("v1" | "admin"), Some("topics"), Some(t)) if !t.is_empty() => (None, Some(t)),
        _ => (None, None),
    }
}

/// Whether the per-event spans are on (an exporter, or a log filter naming [`TARGET`]):
/// callers skip building them otherwise.
pub fn event_spans_on() -> bool {
    tracing::enabled!(target: TARGET, tracing::Level::DEBUG)
}

/// One `publish` span per event of a publish request, parented on each event's
/// `traceparent`; empty when the spans are off. The caller records `partition`, `offset`
/// and `duplicate` from the answer.
pub fn publish_spans(topic: &TopicName, events: &[Published]) -> Vec<Span> {
    if !event_spans_on() {
        return Vec::new();
    }
    events
        .iter()
        .map(|e| {
            let span = tracing::debug_span!(
                target: TARGET,
                "publish",
                topic = %topic,
                id = e.id(),
                partition = tracing::field::Empty,
                offset = tracing::field::Empty,
                duplicate = tracing::field::Empty,
            );
            let parent = string_extension(e, TRACEPARENT).and_then(|v| TraceParent::parse(v).ok());
            set_parent(&span, parent.map(|p| (p, string_extension(e, TRACESTATE))));
            span
        })
        .collect()
}

fn string_extension<'a>(e: &'a Published, name: &str) -> Option<&'a str> {
    match e.event().extension(name) {
        Some(cloudevents::event::ExtensionValue::String(s)) => Some(s.as_str()),
        _ => None,
    }
}

/// A `push` span per delivery of one webhook push, parented on each event's trace; the
/// caller records `outcome` (ack or nack).
pub fn push_spans(group: &GroupName, batch: &[Delivery]) -> Vec<Span> {
    if !event_spans_on() {
        return Vec::new();
    }
    batch
        .iter()
        .map(|d| {
            let span = tracing::debug_span!(
                target: TARGET,
                "push",
                group = %group,
                topic = %d.topic,
                partition = d.partition,
                offset = d.record.offset,
                attempt = d.attempt,
                events = batch.len(),
                outcome = tracing::field::Empty,
            );
            set_parent(&span, event_context(&d.record.meta));
            span
        })
        .collect()
}

// ----- the parents of ACKs -----

/// The most deliveries whose trace is remembered for their ACK; the oldest go first.
const BOOK_MAX: usize = 65_536;

type BookKey = (GroupName, u32, u64);

/// Delivery → its event's trace, so an ACK (which names only the delivery id) joins the
/// event's trace. Bounded: a delivery never ACKed is forgotten after `BOOK_MAX` newer ones.
#[derive(Default)]
struct Book {
    parents: HashMap<BookKey, (u64, TraceParent)>,
    order: VecDeque<(BookKey, u64)>,
    next: u64,
}

static BOOK: Mutex<Option<Book>> = Mutex::new(None);

#[cfg_attr(not(all(feature = "otlp", not(madsim))), allow(dead_code))]
fn remember(group: &GroupName, id: &DeliveryId, parent: Option<TraceParent>) {
    let Some(parent) = parent else { return };
    let key = (group.clone(), id.partition, id.offset);
    let mut guard = BOOK.lock().unwrap_or_else(|p| p.into_inner());
    let book = guard.get_or_insert_with(Book::default);
    book.next += 1;
    let seq = book.next;
    book.parents.insert(key.clone(), (seq, parent));
    book.order.push_back((key, seq));
    while book.order.len() > BOOK_MAX {
        if let Some((old, old_seq)) = book.order.pop_front() {
            if book.parents.get(&old).is_some_and(|(s, _)| *s == old_seq) {
                book.parents.remove(&old);
            }
        }
    }
}

/// The remembered trace of a delivery; forgotten unless `keep` (an extend leaves the
/// delivery in flight).
fn recall(group: &GroupName, id: &DeliveryId, keep: bool) -> Option<TraceParent> {
    let key = (group.clone(), id.partition, id.offset);
    let mut guard = BOOK.lock().unwrap_or_else(|p| p.into_inner());
    let book = guard.as_mut()?;
    if keep {
        book.parents.get(&key).map(|(_, p)| *p)
    } else {
        book.parents.remove(&key).map(|(_, p)| p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(partition: u32, offset: u64) -> DeliveryId {
        DeliveryId {
            epoch: Default::default(),
            lease: 1,
            partition,
            offset,
            attempt: 1,
        }
    }

    #[test]
    fn the_book_recalls_a_delivery_once_and_stays_bounded() {
        let g = GroupName::new("book-test").expect("name");
        let p = TraceParent::parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
            .expect("valid");
        remember(&g, &id(0, 7), Some(p));
        assert_eq!(recall(&g, &id(0, 7), true), Some(p), "an extend keeps it");
        assert_eq!(recall(&g, &id(0, 7), false), Some(p));
        assert_eq!(recall(&g, &id(0, 7), false), None, "an ACK takes it");
        for offset in 0..(BOOK_MAX as u64 + 10) {
            remember(&g, &id(1, offset), Some(p));
        }
        let guard = BOOK.lock().expect("lock");
        let book = guard.as_ref().expect("book");
        assert!(book.parents.len() <= BOOK_MAX && book.order.len() <= BOOK_MAX);
        assert!(
            !book.parents.contains_key(&(g.clone(), 1, 0)),
            "the oldest went"
        );
        assert!(book.parents.contains_key(&(g, 1, BOOK_MAX as u64 + 9)));
    }
}
