//! Traffic routes: publish, the subscription resource, long-poll, ACK / NACK / extend.
//!
//! Each handler is annotated with its OpenAPI operation: the document is generated from
//! these annotations and from the types the handlers read and answer with.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;
use tracing::Instrument as _;
use unimesh_core::{ClientId, DeliveryId, GroupName, RecordMeta, Settle, TopicName};
use utoipa::{IntoParams, ToSchema};

use super::body::read_body;
use super::error::{code, ApiError, ErrorBody};
use super::extract::{JsonBody, JsonBytes, Name, NoParams, Params, QueryParams};
use super::schema::{CloudEvent, CloudEventBatch, DeliveredEvent, SubscriptionDefinition};
use super::views::SubscriptionView;
use super::App;
use crate::engine::{PublishResult, Settling};
use crate::event::{delivery_event_json, delivery_event_json_decoded, parse_publish, publish_mode};
use crate::spec_json::{parse_subscription, SubscriptionDoc};

// ----- publish -----

#[derive(Serialize, ToSchema)]
pub(super) struct PublishAnswer {
    /// One per event, in request order.
    results: Vec<PublishResultView>,
}

#[derive(Serialize, ToSchema)]
struct PublishResultView {
    /// The event's `id`.
    id: String,
    partition: u32,
    offset: u64,
    /// Present (and true) only when the topic's dedup window already held the event's
    /// (`source`, `id`): it was not appended again, and `partition`/`offset` are those of
    /// its first publish.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    #[schema(required = false)]
    duplicate: bool,
}

/// Publish events (binary, structured or batch mode); answered once they are durable.
///
/// Binary mode: the `ce-*` headers carry the attributes (`ce-specversion`, `ce-id`,
/// `ce-source` and `ce-type` are required) and the body is the data, of any content type.
/// Structured mode: one event as `application/cloudevents+json`. Batch mode: an array of
/// them as `application/cloudevents-batch+json`. All or nothing: one bad event refuses
/// the whole request.
#[utoipa::path(
    post,
    path = "/v1/topics/{topic}/events",
    tag = "publish",
    operation_id = "publish",
    params(
        ("topic" = String, Path, description = "The topic; created by its first publish or subscription.",
            pattern = r"^[A-Za-z0-9._-]{1,200}$"),
    ),
    request_body(
        description = "One event (structured mode) or an array of events (batch mode). \
            Binary mode (any other content type with `ce-*` headers) is accepted too.",
        content(
            (CloudEvent = "application/cloudevents+json"),
            (CloudEventBatch = "application/cloudevents-batch+json"),
        ),
    ),
    responses(
        (status = 200, description = "Every event is durable.", body = PublishAnswer),
        (status = 400, description = "An invalid event (the message names the attribute and the event's index), name or query.", body = ErrorBody),
        (status = 408, description = "The body did not arrive within the body timeout.", body = ErrorBody),
        (status = 413, description = "The body, an event or the batch is over its limit.", body = ErrorBody),
        (status = 415, description = "A content type this mesh does not read.", body = ErrorBody),
        (status = 429, description = "The topic's rate limit.", body = ErrorBody,
            headers(("retry-after" = u64, description = "Seconds to wait."))),
        (status = 503, description = "The log cannot take writes now.", body = ErrorBody,
            headers(("retry-after" = u64, description = "Seconds to wait."))),
    ),
)]
pub(super) async fn publish(
    State(app): State<Arc<App>>,
    Name(topic): Name<TopicName>,
    _: Params<NoParams>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<PublishAnswer>, ApiError> {
    let started = Instant::now();
    // The content type decides the mode: refuse an unreadable one before reading the body.
    publish_mode(&headers)?;
    let bytes = read_body(&app.limits, body, &headers, app.publish.max_request_bytes).await?;
    let events = parse_publish(&headers, &bytes, &app.publish)?;
    // Only while a request/reply request waits (or timed out lately) are the events kept
    // to be offered as replies.
    let offered = app.replies.interested().then(|| events.clone());
    let spans = crate::trace::publish_spans(&topic, &events);
    let results: Vec<PublishResult> = app.engine.publish(&topic, events).await?;
    for (span, r) in spans.iter().zip(&results) {
        span.record("partition", r.partition);
        span.record("offset", r.offset);
        span.record("duplicate", r.duplicate);
    }
    drop(spans);
    let duplicates = results.iter().filter(|r| r.duplicate).count() as u64;
    app.metrics
        .published(&topic, results.len() as u64 - duplicates);
    if duplicates > 0 {
        app.metrics.publish_duplicates(&topic, duplicates);
    }
    if let Some(events) = offered {
        let replies = super::reply::replies_among(&events, &results);
        if !replies.is_empty() {
            let late = app.replies.offer(&topic, replies);
            app.metrics.late_replies(late);
        }
    }
    app.metrics.observe_publish(started.elapsed().as_secs_f64());
    Ok(Json(PublishAnswer {
        results: results
            .into_iter()
            .map(|r| PublishResultView {
                id: r.id,
                partition: r.partition,
                offset: r.offset,
                duplicate: r.duplicate,
            })
            .collect(),
    }))
}

// ----- the subscription resource -----

/// Create or update a durable subscription group.
///
/// Clients attached to one group compete for its events (clustering); one group per client
/// is broadcast. An update keeps the group's progress; its topic and ordering cannot change.
#[utoipa::path(
    put,
    path = "/v1/subscriptions/{group}",
    tag = "subscriptions",
    operation_id = "putSubscription",
    params(("group" = String, Path, description = "The group.", pattern = r"^[A-Za-z0-9._-]{1,200}$")),
    request_body(content = SubscriptionDoc, content_type = "application/json"),
    responses(
        (status = 200, description = "Updated; every setting spelled out.", body = SubscriptionDefinition,
            links(
                ("getSubscription" = (operation_id = "getSubscription", parameters(("group" = "$request.path.group")))),
                ("poll" = (operation_id = "poll", parameters(("group" = "$request.path.group")))),
                ("ack" = (operation_id = "ack", parameters(("group" = "$request.path.group")))),
                ("deleteSubscription" = (operation_id = "deleteSubscription", parameters(("group" = "$request.path.group")))),
            )),
        (status = 201, description = "Created; every setting spelled out.", body = SubscriptionDefinition,
            links(
                ("getSubscription" = (operation_id = "getSubscription", parameters(("group" = "$request.path.group")))),
                ("poll" = (operation_id = "poll", parameters(("group" = "$request.path.group")))),
                ("ack" = (operation_id = "ack", parameters(("group" = "$request.path.group")))),
                ("deleteSubscription" = (operation_id = "deleteSubscription", parameters(("group" = "$request.path.group")))),
            )),
        (status = 400, description = "Invalid JSON, name or setting (the message names the field), or the topic limit.", body = ErrorBody),
        (status = 408, description = "The body did not arrive within the body timeout.", body = ErrorBody),
        (status = 409, description = "The topic or ordering of an existing group cannot change.", body = ErrorBody),
        (status = 413, description = "The body is over `limits.max_json_bytes`.", body = ErrorBody),
        (status = 415, description = "Not a JSON content type.", body = ErrorBody),
        (status = 429, description = "The group or partition limit.", body = ErrorBody),
        (status = 503, description = "The state store cannot take writes now.", body = ErrorBody),
    ),
)]
pub(super) async fn put_subscription(
    State(app): State<Arc<App>>,
    Name(group): Name<GroupName>,
    _: Params<NoParams>,
    JsonBytes(bytes): JsonBytes,
) -> Result<Response, ApiError> {
    // Broken JSON is `invalid-json` as on every other route; what is wrong inside a
    // well-formed document is `invalid-subscription`, naming the field.
    if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(&bytes) {
        return Err(ApiError::invalid_json(format!(
            "the request body is not JSON: {e}"
        )));
    }
    let spec = parse_subscription(group, &bytes, &app.subscription)?;
    if let Some(url) = &spec.push_url {
        if let Err(why) = app.push_targets.check_url(url) {
            return Err(ApiError::bad_request(
                code::INVALID_SUBSCRIPTION,
                format!("push.url: {url} is refused: {why} (see push.allowed_hosts)"),
            ));
        }
    }
    let created = app.engine.subscribe(spec.clone()).await?;
    app.push_wake.notify_one();
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(SubscriptionDefinition::new(&spec))).into_response())
}

/// A subscription group with its progress.
#[utoipa::path(
    get,
    path = "/v1/subscriptions/{group}",
    tag = "subscriptions",
    operation_id = "getSubscription",
    params(("group" = String, Path, description = "The group.", pattern = r"^[A-Za-z0-9._-]{1,200}$")),
    responses(
        (status = 200, description = "The group, its lag and counters.", body = SubscriptionView),
        (status = 400, description = "An invalid name or query.", body = ErrorBody),
        (status = 404, description = "No such group.", body = ErrorBody),
        (status = 503, description = "The engine has stopped.", body = ErrorBody),
    ),
)]
pub(super) async fn get_subscription(
    State(app): State<Arc<App>>,
    Name(group): Name<GroupName>,
    _: Params<NoParams>,
) -> Result<Json<SubscriptionView>, ApiError> {
    let info = app.engine.subscription(&group).await?;
    Ok(Json(SubscriptionView::new(&info)))
}

#[derive(Serialize, ToSchema)]
pub(super) struct DeleteAnswer {
    group: String,
    /// Always true.
    deleted: bool,
}

/// Delete a subscription group with its progress and dead letters.
#[utoipa::path(
    delete,
    path = "/v1/subscriptions/{group}",
    tag = "subscriptions",
    operation_id = "deleteSubscription",
    params(("group" = String, Path, description = "The group.", pattern = r"^[A-Za-z0-9._-]{1,200}$")),
    responses(
        (status = 200, description = "Deleted, durably.", body = DeleteAnswer),
        (status = 400, description = "An invalid name or query.", body = ErrorBody),
        (status = 404, description = "No such group.", body = ErrorBody),
        (status = 503, description = "The state store cannot take writes now.", body = ErrorBody),
    ),
)]
pub(super) async fn delete_subscription(
    State(app): State<Arc<App>>,
    Name(group): Name<GroupName>,
    _: Params<NoParams>,
) -> Result<Json<DeleteAnswer>, ApiError> {
    app.engine.unsubscribe(&group).await?;
    app.push_wake.notify_one();
    Ok(Json(DeleteAnswer {
        group: group.as_str().to_owned(),
        deleted: true,
    }))
}

// ----- long-poll -----

// The schema of what `DeliveryView::json` writes (a test holds the two to the same text).
/// One delivery: an attempt to hand one event to this client.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(not(test), allow(dead_code))]
pub(super) struct DeliveryView {
    /// Names this delivery in ACK, NACK and extend requests.
    delivery_id: String,
    /// 1 for the first delivery of the event to the group, then 2, 3, ...
    attempt: u32,
    /// The event in structured mode, with `emmqpartition` and `emmqoffset` set.
    #[schema(value_type = DeliveredEvent)]
    event: Box<RawValue>,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)] // Documents the parameters; the handler reads them with their bounds.
pub(super) struct PollQuery {
    /// The client: deliveries it holds are its own until ACKed.
    #[param(pattern = r"^[A-Za-z0-9._-]{1,200}$")]
    client: String,
    /// Most deliveries in the answer (default `limits.default_poll_events`).
    #[param(minimum = 1, maximum = 1000)]
    max: Option<u32>,
    /// How long to wait for the first delivery (default `limits.default_wait_ms`).
    #[param(minimum = 0, maximum = 60000)]
    wait_ms: Option<u64>,
}

impl QueryParams for PollQuery {
    const NAMES: &'static [&'static str] = &["client", "max", "waitMs"];
}

/// Long-poll: up to `max` deliveries, waiting up to `waitMs` for the first.
#[utoipa::path(
    get,
    path = "/v1/subscriptions/{group}/events",
    tag = "delivery",
    operation_id = "poll",
    params(("group" = String, Path, description = "The group.", pattern = r"^[A-Za-z0-9._-]{1,200}$"), PollQuery),
    responses(
        (status = 200, description = "The deliveries; empty when none came within `waitMs`.", body = Vec<DeliveryView>),
        (status = 400, description = "An invalid name or query parameter.", body = ErrorBody),
        (status = 404, description = "No such group.", body = ErrorBody),
        (status = 429, description = "The group's client limit.", body = ErrorBody),
        (status = 503, description = "The engine has stopped.", body = ErrorBody),
    ),
)]
pub(super) async fn poll(
    State(app): State<Arc<App>>,
    Name(group): Name<GroupName>,
    Params(q, _): Params<PollQuery>,
) -> Result<Response, ApiError> {
    let l = &app.limits;
    let client = ClientId::new(q.required("client")?)?;
    let max = q.bounded(
        "max",
        u64::from(l.default_poll_events.get()),
        1,
        u64::from(l.max_poll_events.get()),
    )?;
    let wait_ms = q.bounded("waitMs", l.default_wait_ms, 0, l.max_wait_ms)?;
    // `max` is at most `max_poll_events`, a u32.
    let max = u32::try_from(max).unwrap_or(l.max_poll_events.get());
    let fetch = tracing::debug_span!(
        target: crate::trace::TARGET,
        "fetch",
        group = %group,
        client = %client,
        max,
        wait_ms,
        events = tracing::field::Empty,
    );
    let deliveries = app
        .engine
        .poll(&group, &client, max, wait_ms)
        .instrument(fetch.clone())
        .await?;
    fetch.record("events", deliveries.len());
    let mut body = String::with_capacity(
        2 + deliveries
            .iter()
            .map(|d| d.record.body.len() + 96)
            .sum::<usize>(),
    );
    body.push('[');
    for d in &deliveries {
        let _deliver = crate::trace::deliver_span(&group, d, "poll").entered();
        if let Some(json) = DeliveryView::json(&group, d) {
            if body.len() > 1 {
                body.push(',');
            }
            body.push_str(&json);
        }
    }
    body.push(']');
    Ok(([(http::header::CONTENT_TYPE, "application/json")], body).into_response())
}

impl DeliveryView {
    /// The delivery as a client receives it, as JSON text: `{"deliveryId","attempt",
    /// "event"}`, written directly (what serialising a `DeliveryView` gives, without a
    /// second parse of the event). `None` (logged) for a stored event that decoded but
    /// cannot be rendered: the core dead-letters records it cannot decode before
    /// delivering them, so this is rare, and leaving it out lets its ACK timeout redeliver
    /// it and `maxAttempts` dead-letter it.
    pub(super) fn json(group: &GroupName, d: &unimesh_core::Delivery) -> Option<String> {
        let event = match &d.record.meta {
            // Decoded: the stored bytes are one complete JSON object (read whole then).
            RecordMeta::Event(_) => {
                delivery_event_json_decoded(&d.record.body, d.partition, d.record.offset)
            }
            RecordMeta::Undecodable(_) => {
                delivery_event_json(&d.record.body, d.partition, d.record.offset)
                    .map(|raw| raw.get().to_owned())
            }
        };
        match event {
            Ok(event) => {
                let mut out = String::with_capacity(event.len() + 64);
                // A delivery id is digits and dots: nothing to escape. Writing to a String
                // cannot fail.
                let _ = write!(
                    out,
                    "{{\"deliveryId\":\"{}\",\"attempt\":{},\"event\":",
                    d.id, d.attempt
                );
                out.push_str(&event);
                out.push('}');
                Some(out)
            }
            Err(e) => {
                tracing::error!(
                    %group, id = %d.id, error = %e,
                    "a delivery could not be rendered; it is left to its ACK timeout"
                );
                None
            }
        }
    }
}

// ----- ACK / NACK / extend -----

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct AckBody {
    /// Delivery ids. An element that is not a delivery id (or not a string) is answered
    /// `malformed` on its own; the others still count.
    #[schema(max_items = 1000)]
    delivery_ids: Vec<Value>,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct NackBody {
    /// Delivery ids, as in an ACK.
    #[schema(max_items = 1000)]
    delivery_ids: Vec<Value>,
    /// Redeliver after this long instead of the group's backoff.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 86400000)]
    delay_ms: Option<u64>,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct ExtendBody {
    /// Delivery ids, as in an ACK.
    #[schema(max_items = 1000)]
    delivery_ids: Vec<Value>,
    /// The new ACK deadline is now + this (default: the group's `ackTimeoutMs`).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 43200000)]
    extend_ms: Option<u64>,
}

/// An id that was not settled, and why.
#[derive(Serialize, ToSchema, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub(super) struct Rejected {
    /// The id as sent (at most 128 characters of it).
    delivery_id: String,
    /// `unknown`, `stale`, `already-done`, `revoked` or `malformed`.
    reason: &'static str,
}

#[derive(Serialize, ToSchema)]
pub(super) struct AckAnswer {
    /// Ids accepted.
    acked: u64,
    /// The others, in request order.
    rejected: Vec<Rejected>,
}

#[derive(Serialize, ToSchema)]
pub(super) struct NackAnswer {
    /// Ids accepted (the same number as `nacked`: every settle answer has `acked`).
    acked: u64,
    nacked: u64,
    rejected: Vec<Rejected>,
}

#[derive(Serialize, ToSchema)]
pub(super) struct ExtendAnswer {
    /// Ids accepted (the same number as `extended`: every settle answer has `acked`).
    acked: u64,
    extended: u64,
    rejected: Vec<Rejected>,
}

/// ACK deliveries: their events are done for the group.
#[utoipa::path(
    post,
    path = "/v1/subscriptions/{group}/ack",
    tag = "delivery",
    operation_id = "ack",
    params(("group" = String, Path, description = "The group.", pattern = r"^[A-Za-z0-9._-]{1,200}$")),
    request_body(content = AckBody, content_type = "application/json"),
    responses(
        (status = 200, description = "One outcome per id.", body = AckAnswer),
        (status = 400, description = "Invalid JSON, name or query.", body = ErrorBody),
        (status = 404, description = "No such group.", body = ErrorBody),
        (status = 408, description = "The body did not arrive within the body timeout.", body = ErrorBody),
        (status = 413, description = "Over `limits.max_json_bytes` or `limits.max_ids_per_request`.", body = ErrorBody),
        (status = 415, description = "Not a JSON content type.", body = ErrorBody),
        (status = 503, description = "The engine has stopped.", body = ErrorBody),
    ),
)]
pub(super) async fn ack(
    State(app): State<Arc<App>>,
    Name(group): Name<GroupName>,
    _: Params<NoParams>,
    JsonBody(b): JsonBody<AckBody>,
) -> Result<Json<AckAnswer>, ApiError> {
    let (accepted, rejected) = settle(&app, &group, Settling::Ack, b.delivery_ids).await?;
    Ok(Json(AckAnswer {
        acked: accepted,
        rejected,
    }))
}

/// NACK deliveries: redelivered after `delayMs` or the group's backoff.
#[utoipa::path(
    post,
    path = "/v1/subscriptions/{group}/nack",
    tag = "delivery",
    operation_id = "nack",
    params(("group" = String, Path, description = "The group.", pattern = r"^[A-Za-z0-9._-]{1,200}$")),
    request_body(content = NackBody, content_type = "application/json"),
    responses(
        (status = 200, description = "One outcome per id.", body = NackAnswer),
        (status = 400, description = "Invalid JSON, name, query or `delayMs`.", body = ErrorBody),
        (status = 404, description = "No such group.", body = ErrorBody),
        (status = 408, description = "The body did not arrive within the body timeout.", body = ErrorBody),
        (status = 413, description = "Over `limits.max_json_bytes` or `limits.max_ids_per_request`.", body = ErrorBody),
        (status = 415, description = "Not a JSON content type.", body = ErrorBody),
        (status = 503, description = "The engine has stopped.", body = ErrorBody),
    ),
)]
pub(super) async fn nack(
    State(app): State<Arc<App>>,
    Name(group): Name<GroupName>,
    _: Params<NoParams>,
    JsonBody(b): JsonBody<NackBody>,
) -> Result<Json<NackAnswer>, ApiError> {
    let limits = &app.subscription;
    if let Some(d) = b.delay_ms {
        if d > limits.max_backoff_ms {
            return Err(ApiError::bad_request(
                code::INVALID_REQUEST,
                format!("delayMs must be at most {}, not {d}", limits.max_backoff_ms),
            ));
        }
    }
    let how = Settling::Nack {
        delay_ms: b.delay_ms,
    };
    let (accepted, rejected) = settle(&app, &group, how, b.delivery_ids).await?;
    Ok(Json(NackAnswer {
        acked: accepted,
        nacked: accepted,
        rejected,
    }))
}

/// Extend deliveries' ACK deadlines.
#[utoipa::path(
    post,
    path = "/v1/subscriptions/{group}/extend",
    tag = "delivery",
    operation_id = "extend",
    params(("group" = String, Path, description = "The group.", pattern = r"^[A-Za-z0-9._-]{1,200}$")),
    request_body(content = ExtendBody, content_type = "application/json"),
    responses(
        (status = 200, description = "One outcome per id.", body = ExtendAnswer),
        (status = 400, description = "Invalid JSON, name, query or `extendMs`.", body = ErrorBody),
        (status = 404, description = "No such group.", body = ErrorBody),
        (status = 408, description = "The body did not arrive within the body timeout.", body = ErrorBody),
        (status = 413, description = "Over `limits.max_json_bytes` or `limits.max_ids_per_request`.", body = ErrorBody),
        (status = 415, description = "Not a JSON content type.", body = ErrorBody),
        (status = 503, description = "The engine has stopped.", body = ErrorBody),
    ),
)]
pub(super) async fn extend(
    State(app): State<Arc<App>>,
    Name(group): Name<GroupName>,
    _: Params<NoParams>,
    JsonBody(b): JsonBody<ExtendBody>,
) -> Result<Json<ExtendAnswer>, ApiError> {
    let limits = &app.subscription;
    if let Some(e) = b.extend_ms {
        if e == 0 || e > limits.max_ack_timeout_ms {
            return Err(ApiError::bad_request(
                code::INVALID_REQUEST,
                format!(
                    "extendMs must be between 1 and {}, not {e}",
                    limits.max_ack_timeout_ms
                ),
            ));
        }
    }
    let how = Settling::Extend {
        extend_ms: b.extend_ms,
    };
    let (accepted, rejected) = settle(&app, &group, how, b.delivery_ids).await?;
    Ok(Json(ExtendAnswer {
        acked: accepted,
        extended: accepted,
        rejected,
    }))
}

/// Settles the ids that parse; answers how many were accepted and, in request order, the
/// ids refused (malformed ones included).
pub(super) async fn settle(
    app: &App,
    group: &GroupName,
    how: Settling,
    raw_ids: Vec<Value>,
) -> Result<(u64, Vec<Rejected>), ApiError> {
    if raw_ids.len() > app.limits.max_ids_per_request.get() {
        return Err(ApiError::too_large(format!(
            "deliveryIds has {} ids, over the limit of {}",
            raw_ids.len(),
            app.limits.max_ids_per_request
        )));
    }
    let (ids, mut rejected) = parse_ids(raw_ids);
    let spans: Vec<tracing::Span> = if crate::trace::event_spans_on() {
        let name = match &how {
            Settling::Ack => "ack",
            Settling::Nack { .. } => "nack",
            Settling::Extend { .. } => "extend",
        };
        ids.iter()
            .map(|(_, id)| crate::trace::settle_span(group, id, name))
            .collect()
    } else {
        Vec::new()
    };
    let outcomes = app
        .engine
        .settle(group, how, ids.iter().map(|(_, id)| *id).collect())
        .await?;
    for (span, outcome) in spans.iter().zip(&outcomes) {
        let said = match outcome {
            Settle::Accepted => "accepted",
            Settle::Rejected(reason) => reason.as_str(),
        };
        span.record("outcome", said);
    }
    drop(spans);
    if outcomes.len() != ids.len() {
        // Every id must get an answer; a short answer would silently drop some.
        return Err(ApiError::internal(format!(
            "the engine answered {} outcomes for {} delivery ids",
            outcomes.len(),
            ids.len()
        )));
    }
    let mut accepted = 0u64;
    for ((index, id), outcome) in ids.iter().zip(outcomes) {
        match outcome {
            Settle::Accepted => accepted += 1,
            Settle::Rejected(reason) => rejected.push((
                *index,
                Rejected {
                    delivery_id: id.to_string(),
                    reason: reason.as_str(),
                },
            )),
        }
    }
    rejected.sort_by_key(|(i, _)| *i);
    Ok((accepted, rejected.into_iter().map(|(_, r)| r).collect()))
}

/// An item with its index in the request.
pub(super) type Positioned<T> = (usize, T);

/// Splits the ids of a settle request into those that parse (with their position) and
/// those answered `malformed` at once (with theirs). A non-string element is malformed too,
/// echoed as its JSON text.
pub(super) fn parse_ids(
    raw: Vec<Value>,
) -> (Vec<Positioned<DeliveryId>>, Vec<Positioned<Rejected>>) {
    let mut ids = Vec::with_capacity(raw.len());
    let mut malformed = Vec::new();
    for (i, v) in raw.into_iter().enumerate() {
        let parsed = match &v {
            Value::String(s) => s.parse::<DeliveryId>().ok(),
            _ => None,
        };
        match parsed {
            Some(id) => ids.push((i, id)),
            None => {
                let text = match v {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
                // Echo a bounded prefix: the answer must not grow with garbage input.
                let delivery_id: String = text.chars().take(128).collect();
                malformed.push((
                    i,
                    Rejected {
                        delivery_id,
                        reason: "malformed",
                    },
                ));
            }
        }
    }
    (ids, malformed)
}

// ----- this document -----

/// This document (the traffic API's).
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "operate",
    operation_id = "trafficOpenapi",
    responses(
        (status = 200, description = "The OpenAPI document of the traffic listener.", body = Object, content_type = "application/json"),
        (status = 400, description = "A query parameter (this route takes none).", body = ErrorBody),
    ),
)]
pub(super) async fn openapi(State(app): State<Arc<App>>, _: Params<NoParams>) -> Response {
    let doc = app.documents.traffic.clone();
    ([(CONTENT_TYPE, "application/json")], doc).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: the delivery JSON written by hand is exactly what serialising a
    /// `DeliveryView` (the type the OpenAPI documents describe) gives, on both paths — the
    /// splice, and the parse for an event that already holds `emmq*` members or `\u`
    /// escapes. Method: stored events in the mesh's stored form, each rendered both ways.
    #[test]
    fn the_written_delivery_json_is_what_the_view_serialises_to() {
        let group = GroupName::new("g").expect("valid");
        let stored = [
            r#"{"specversion":"1.0","id":"1","source":"/s","type":"t","data":{"n":1}}"#,
            r#"{"specversion":"1.0","id":"2","source":"/s","type":"t","emmqoffset":"9","data":"x"}"#,
            r#"{"specversion":"1.0","id":"\u0033","source":"/s","type":"t"}"#,
            r#"  {"specversion":"1.0","id":"4","source":"/s","type":"t","data":[1,2,{"a":"\"}"}]}  "#,
        ];
        for (i, body) in stored.iter().enumerate() {
            let record = crate::engine::decode_record((7, bytes::Bytes::from(*body)));
            assert!(matches!(record.meta, RecordMeta::Event(_)), "{body}");
            let d = unimesh_core::Delivery {
                id: DeliveryId {
                    epoch: 3,
                    lease: 1,
                    partition: 2,
                    offset: 7,
                    attempt: 4,
                },
                attempt: 4,
                topic: TopicName::new("t").expect("valid"),
                partition: 2,
                record,
            };
            let written = DeliveryView::json(&group, &d).expect("rendered");
            let view = DeliveryView {
                delivery_id: d.id.to_string(),
                attempt: d.attempt,
                event: delivery_event_json(body.as_bytes(), 2, 7).expect("checked"),
            };
            let serialised = serde_json::to_string(&view).expect("serialised");
            assert_eq!(written, serialised, "stored event {i}");
            let v: Value = serde_json::from_str(&written).expect("valid JSON");
            assert_eq!(v["event"]["emmqoffset"], "7");
            assert_eq!(v["event"]["emmqpartition"], "2");
        }
    }

    #[test]
    fn ids_are_split_keeping_their_positions() {
        let raw = vec![
            Value::from("1.2.3.4.5"),
            Value::from("nope"),
            Value::from(42),
            Value::from("1.2.3.4.6"),
            Value::from("x".repeat(500)),
        ];
        let (ids, bad) = parse_ids(raw);
        assert_eq!(
            ids.iter()
                .map(|(i, id)| (*i, id.to_string()))
                .collect::<Vec<_>>(),
            vec![(0, "1.2.3.4.5".to_owned()), (3, "1.2.3.4.6".to_owned())]
        );
        let bad: Vec<(usize, String, &str)> = bad
            .into_iter()
            .map(|(i, r)| (i, r.delivery_id, r.reason))
            .collect();
        assert_eq!(bad[0], (1, "nope".to_owned(), "malformed"));
        assert_eq!(bad[1], (2, "42".to_owned(), "malformed"));
        assert_eq!(bad[2].1.len(), 128, "echo is bounded");
    }
}
