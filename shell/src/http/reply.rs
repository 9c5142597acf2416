//! Request/reply (docs/DESIGN.md §5.1): `POST /v1/topics/{topic}/request?timeoutMs=T`
//! publishes one event with the extensions `emcorrelationid` (generated unless the event
//! has one) and `emreplyto` (the reply topic: `replyTo`, default `{topic}.reply`), and
//! answers with the first event published to the reply topic with that `emcorrelationid`,
//! or 504 after `timeoutMs`. A responder reads both extensions from the request event and
//! publishes its reply to `emreplyto` with the same `emcorrelationid`.
//!
//! Replies are matched where they are published (the publish route offers every event
//! carrying `emcorrelationid` to [`Replies::offer`]), so no subscription is needed. A reply
//! that comes after its request timed out is dropped (it stays in the reply topic like any
//! event) and counted in `unimesh_late_replies_total`. Waiting requests and remembered
//! timeouts are bounded by `limits.max_pending_requests`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use cloudevents::event::ExtensionValue;
use cloudevents::Event;
use http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::sync::oneshot;
use unimesh_core::TopicName;
use utoipa::IntoParams;

use super::body::read_body;
use super::error::{code, ApiError, ErrorBody};
use super::extract::{Name, Params, QueryParams};
use super::schema::{CloudEvent, DeliveredEvent};
use super::App;
use crate::engine::PublishResult;
use crate::event::{delivery_event_json, parse_publish, publish_mode, Published};

/// The extension naming a request and its reply.
pub const CORRELATION_EXTENSION: &str = "emcorrelationid";

/// The extension naming the topic a reply goes to.
pub const REPLY_TO_EXTENSION: &str = "emreplyto";

/// Who waits for which reply: (reply topic, correlation id).
type ReplyKey = (TopicName, String);

/// Requests waiting for their replies, and the requests that timed out lately.
pub struct Replies {
    state: Mutex<State_>,
    max_pending: usize,
    /// Makes generated correlation ids unique in this process; the process start time
    /// makes them unique across restarts.
    next_id: AtomicU64,
    prefix: String,
}

#[derive(Default)]
struct State_ {
    waiting: BTreeMap<ReplyKey, oneshot::Sender<Box<RawValue>>>,
    /// Timed-out keys, oldest first, at most `max_pending`.
    expired: VecDeque<ReplyKey>,
    expired_set: BTreeSet<ReplyKey>,
}

impl Replies {
    pub fn new(max_pending: usize) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        Self {
            state: Mutex::new(State_::default()),
            max_pending,
            next_id: AtomicU64::new(0),
            prefix: format!("{nanos:x}"),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State_> {
        // Plain maps: a panic while the lock was held cannot leave them broken.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn generate(&self) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{}-{n:x}", self.prefix)
    }

    /// Waits for the reply of `key`; refused when `max_pending` requests already wait or
    /// one waits for the same key.
    fn register(&self, key: ReplyKey) -> Result<oneshot::Receiver<Box<RawValue>>, ApiError> {
        let mut s = self.lock();
        if s.waiting.len() >= self.max_pending {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                code::LIMIT,
                format!(
                    "{} requests are waiting for replies, the limit of limits.max_pending_requests",
                    self.max_pending
                ),
            ));
        }
        if s.waiting.contains_key(&key) {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                code::CONFLICT,
                format!(
                    "a request with emcorrelationid {:?} is already waiting on topic {}",
                    key.1, key.0
                ),
            ));
        }
        let (tx, rx) = oneshot::channel();
        s.waiting.insert(key, tx);
        Ok(rx)
    }

    /// The request of `key` gave up: forget it, remembering that it timed out (if asked).
    fn forget(&self, key: &ReplyKey, timed_out: bool) {
        let mut s = self.lock();
        s.waiting.remove(key);
        if timed_out && s.expired_set.insert(key.clone()) {
            s.expired.push_back(key.clone());
            while s.expired.len() > self.max_pending {
                if let Some(old) = s.expired.pop_front() {
                    s.expired_set.remove(&old);
                }
            }
        }
    }

    /// Offers published events of `topic` as replies; answers how many came too late.
    pub fn offer(&self, topic: &TopicName, replies: Vec<(String, Box<RawValue>)>) -> u64 {
        let mut late = 0;
        let mut s = self.lock();
        for (corr, event) in replies {
            let key = (topic.clone(), corr);
            if let Some(tx) = s.waiting.remove(&key) {
                // A requester that went away just now: the reply is dropped like a late one.
                if tx.send(event).is_err() {
                    late += 1;
                }
            } else if s.expired_set.contains(&key) {
                late += 1;
            }
        }
        late
    }

    /// Whether any request waits or timed out lately (else nothing is worth offering).
    pub fn interested(&self) -> bool {
        let s = self.lock();
        !s.waiting.is_empty() || !s.expired.is_empty()
    }
}

/// The correlation id of an event, when it has one as a string.
pub fn correlation_of(event: &Event) -> Option<String> {
    match event.extension(CORRELATION_EXTENSION)? {
        ExtensionValue::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

/// The replies among just-published events, as delivered (with their broker position).
pub fn replies_among(
    events: &[Published],
    placed: &[PublishResult],
) -> Vec<(String, Box<RawValue>)> {
    events
        .iter()
        .zip(placed)
        // A repeat answered from the dedup window was offered when it was first published.
        .filter(|(_, r)| !r.duplicate)
        .filter_map(|(e, r)| {
            let corr = correlation_of(e.event())?;
            let json = delivery_event_json(&e.stored(), r.partition, r.offset).ok()?;
            Some((corr, json))
        })
        .collect()
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)] // Documents the parameters; the handler reads them with their bounds.
pub(super) struct RequestQuery {
    /// How long to wait for the reply (default `limits.default_wait_ms`).
    #[param(minimum = 1, maximum = 60000)]
    timeout_ms: Option<u64>,
    /// The reply topic (default `{topic}.reply`).
    #[param(pattern = r"^[A-Za-z0-9._-]{1,200}$")]
    reply_to: Option<String>,
}

impl QueryParams for RequestQuery {
    const NAMES: &'static [&'static str] = &["timeoutMs", "replyTo"];
}

/// Request/reply: publish one event and answer with its reply.
#[utoipa::path(
    post,
    path = "/v1/topics/{topic}/request",
    tag = "publish",
    operation_id = "request",
    params(
        ("topic" = String, Path, description = "The topic of the request.", pattern = r"^[A-Za-z0-9._-]{1,200}$"),
        RequestQuery,
    ),
    request_body(
        description = "One event, structured mode (binary mode is accepted too).",
        content((CloudEvent = "application/cloudevents+json")),
    ),
    responses(
        (status = 200, description = "The reply event, as delivered.", body = DeliveredEvent),
        (status = 400, description = "An invalid event, name, query, or a batch.", body = ErrorBody),
        (status = 408, description = "The body did not arrive within the body timeout.", body = ErrorBody),
        (status = 409, description = "A request with this emcorrelationid already waits.", body = ErrorBody),
        (status = 413, description = "The body or event is over its limit.", body = ErrorBody),
        (status = 415, description = "A content type this mesh does not read.", body = ErrorBody),
        (status = 429, description = "The topic's rate limit, or limits.max_pending_requests.", body = ErrorBody),
        (status = 503, description = "The log cannot take writes now.", body = ErrorBody),
        (status = 504, description = "No reply within timeoutMs.", body = ErrorBody),
    ),
)]
pub(super) async fn request(
    State(app): State<Arc<App>>,
    Name(topic): Name<TopicName>,
    Params(q, _): Params<RequestQuery>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let l = &app.limits;
    let timeout_ms = q.bounded("timeoutMs", l.default_wait_ms.max(1), 1, l.max_wait_ms)?;
    let reply_topic = match q.get("replyTo") {
        Some(t) => TopicName::new(t)?,
        None => TopicName::new(&format!("{topic}.reply")).map_err(|_| {
            ApiError::bad_request(
                code::INVALID_QUERY,
                "the default reply topic ({topic}.reply) is too long: give replyTo",
            )
        })?,
    };
    publish_mode(&headers)?;
    let bytes = read_body(&app.limits, body, &headers, app.publish.max_request_bytes).await?;
    let mut events = parse_publish(&headers, &bytes, &app.publish)?;
    if events.len() != 1 {
        return Err(ApiError::bad_request(
            code::INVALID_REQUEST,
            format!("a request is one event, not {}", events.len()),
        ));
    }
    let event = events[0].attributes_mut();
    let corr = match correlation_of(event) {
        Some(c) => c,
        None => {
            let c = app.replies.generate();
            event.set_extension(CORRELATION_EXTENSION, c.clone());
            c
        }
    };
    event.set_extension(REPLY_TO_EXTENSION, reply_topic.as_str().to_owned());
    let key = (reply_topic, corr);
    let waiting = app.replies.register(key.clone())?;
    match app.engine.publish(&topic, events).await {
        // A repeat within the topic's dedup window is not published again (DESIGN §8).
        Ok(results) if results.iter().any(|r| r.duplicate) => {
            app.metrics.publish_duplicates(&topic, 1)
        }
        Ok(_) => app.metrics.published(&topic, 1),
        Err(e) => {
            app.replies.forget(&key, false);
            return Err(e.into());
        }
    }
    match tokio::time::timeout(Duration::from_millis(timeout_ms), waiting).await {
        Ok(Ok(reply)) => Ok((
            [(http::header::CONTENT_TYPE, "application/json")],
            reply.get().to_owned(),
        )
            .into_response()),
        _ => {
            app.replies.forget(&key, true);
            app.metrics.request_timed_out();
            Err(ApiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                "timeout",
                format!(
                    "no reply with emcorrelationid {:?} on topic {} within {timeout_ms} ms",
                    key.1, key.0
                ),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topic(s: &str) -> TopicName {
        TopicName::new(s).expect("valid")
    }

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_owned()).expect("JSON")
    }

    #[tokio::test]
    async fn a_reply_reaches_its_request_and_a_late_one_is_counted() {
        let r = Replies::new(2);
        let key = (topic("t.reply"), "c1".to_owned());
        let rx = r.register(key.clone()).expect("registered");
        assert!(r.register(key.clone()).is_err(), "one waiter per key");
        assert_eq!(
            r.offer(&topic("t.reply"), vec![("c1".into(), raw("{}"))]),
            0
        );
        assert_eq!(rx.await.expect("answered").get(), "{}");
        let key2 = (topic("t.reply"), "c2".to_owned());
        let _rx = r.register(key2.clone()).expect("registered");
        r.forget(&key2, true);
        assert_eq!(
            r.offer(&topic("t.reply"), vec![("c2".into(), raw("1"))]),
            1,
            "late"
        );
        assert_eq!(
            r.offer(&topic("t.reply"), vec![("zz".into(), raw("1"))]),
            0,
            "unknown"
        );
    }

    #[test]
    fn waiting_requests_and_remembered_timeouts_are_bounded() {
        let r = Replies::new(2);
        let _a = r.register((topic("t"), "a".into())).expect("ok");
        let _b = r.register((topic("t"), "b".into())).expect("ok");
        let e = r.register((topic("t"), "c".into())).expect_err("full");
        assert_eq!(e.status, StatusCode::TOO_MANY_REQUESTS);
        for c in ["a", "b", "x", "y"] {
            r.forget(&(topic("t"), c.into()), true);
        }
        assert_eq!(r.lock().expired.len(), 2);
        assert!(r.generate() != r.generate(), "generated ids differ");
    }
}
