//! Admin routes: metrics, health and readiness, and the operator's view and levers
//! (subscriptions, clients, offsets, DLQ, rate limits, seek).

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use http::header::CONTENT_TYPE;
use http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use unimesh_core::{ClientId, GroupName, RateRule, TopicName};
use utoipa::{IntoParams, ToSchema};

use super::error::{code, ApiError, ErrorBody};
use super::extract::{JsonBody, Name, NoParams, Params, QueryParams};
use super::metrics::CONTENT_TYPE as METRICS_CONTENT_TYPE;
use super::schema::DeliveredEvent;
use super::views::{OffsetView, SubscriptionView};
use super::App;
use crate::engine::{ClientInfo, DlqItem};
use crate::event::delivery_event_json;

/// Prometheus metrics (OpenMetrics text).
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "operate",
    operation_id = "metrics",
    responses(
        (status = 200, description = "Every `unimesh_*` metric family.", body = String,
            content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8"),
        (status = 400, description = "A query parameter (this route takes none).", body = ErrorBody),
    ),
)]
pub(super) async fn metrics(State(app): State<Arc<App>>, _: Params<NoParams>) -> Response {
    let snapshot = match app.engine.metrics_snapshot().await {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::debug!(error = %e, "metrics without the engine's numbers");
            None
        }
    };
    let text = app.metrics.render(snapshot);
    ([(CONTENT_TYPE, METRICS_CONTENT_TYPE)], text).into_response()
}

/// This document (the admin API's).
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "operate",
    operation_id = "adminOpenapi",
    responses(
        (status = 200, description = "The OpenAPI document of the admin listener.", body = Object, content_type = "application/json"),
        (status = 400, description = "A query parameter (this route takes none).", body = ErrorBody),
    ),
)]
pub(super) async fn openapi(State(app): State<Arc<App>>, _: Params<NoParams>) -> Response {
    let doc = app.documents.admin.clone();
    ([(CONTENT_TYPE, "application/json")], doc).into_response()
}

#[derive(Serialize, ToSchema)]
pub(super) struct StatusAnswer {
    /// `ok` (health) or `ready` (readiness).
    #[schema(pattern = "^(ok|ready)$")]
    status: &'static str,
}

/// Health: 503 naming the reason while the process cannot serve fully (the engine
/// stopped, the log refuses writes, the Kafka broker is unreachable or a Kafka client is
/// in a fatal state); 200 again once that is over.
#[utoipa::path(
    get,
    path = "/admin/health",
    tag = "operate",
    operation_id = "health",
    responses(
        (status = 200, description = "Healthy.", body = StatusAnswer),
        (status = 400, description = "A query parameter (this route takes none).", body = ErrorBody),
        (status = 503, description = "Unhealthy, and why: the engine stopped, the log refuses writes, or the Kafka broker is unreachable or a Kafka client of it is in a fatal state (200 again once it is back).", body = ErrorBody),
    ),
)]
pub(super) async fn health(
    State(app): State<Arc<App>>,
    _: Params<NoParams>,
) -> Result<Json<StatusAnswer>, ApiError> {
    match app.engine.health() {
        Ok(()) => Ok(Json(StatusAnswer { status: "ok" })),
        Err(why) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            code::UNAVAILABLE,
            format!("unhealthy: {why}"),
        )),
    }
}

/// Readiness: 200 once recovery is done, 503 naming the reason while recovering, shutting
/// down or unhealthy (see health).
#[utoipa::path(
    get,
    path = "/admin/ready",
    tag = "operate",
    operation_id = "ready",
    responses(
        (status = 200, description = "Ready.", body = StatusAnswer),
        (status = 400, description = "A query parameter (this route takes none).", body = ErrorBody),
        (status = 503, description = "Still recovering, shutting down, or unhealthy (the reason health gives).", body = ErrorBody),
    ),
)]
pub(super) async fn ready(
    State(app): State<Arc<App>>,
    _: Params<NoParams>,
) -> Result<Json<StatusAnswer>, ApiError> {
    match app.engine.readiness() {
        Ok(()) => Ok(Json(StatusAnswer { status: "ready" })),
        Err(why) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            code::UNAVAILABLE,
            format!("not ready: {why}"),
        )),
    }
}

#[derive(Serialize, ToSchema)]
pub(super) struct SubscriptionsAnswer {
    subscriptions: Vec<SubscriptionView>,
}

/// Every subscription group with its progress.
#[utoipa::path(
    get,
    path = "/admin/subscriptions",
    tag = "operate",
    operation_id = "subscriptions",
    responses(
        (status = 200, description = "Every group.", body = SubscriptionsAnswer),
        (status = 400, description = "A query parameter (this route takes none).", body = ErrorBody),
        (status = 503, description = "The engine has stopped.", body = ErrorBody),
    ),
)]
pub(super) async fn subscriptions(
    State(app): State<Arc<App>>,
    _: Params<NoParams>,
) -> Result<Json<SubscriptionsAnswer>, ApiError> {
    let infos = app.engine.subscriptions().await?;
    Ok(Json(SubscriptionsAnswer {
        subscriptions: infos.iter().map(SubscriptionView::new).collect(),
    }))
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(super) struct ClientView {
    group: String,
    client: String,
    /// Deliveries it asked for and has not received yet.
    credit: u32,
    in_flight: u32,
    last_active_ms: u64,
}

impl ClientView {
    pub(super) fn new(c: &ClientInfo) -> Self {
        Self {
            group: c.group.as_str().to_owned(),
            client: c.id.as_str().to_owned(),
            credit: c.credit,
            in_flight: c.in_flight,
            last_active_ms: c.last_active_ms,
        }
    }
}

#[derive(Serialize, ToSchema)]
pub(super) struct ClientsAnswer {
    clients: Vec<ClientView>,
}

/// Every client of every group.
#[utoipa::path(
    get,
    path = "/admin/clients",
    tag = "operate",
    operation_id = "clients",
    responses(
        (status = 200, description = "Every client.", body = ClientsAnswer),
        (status = 400, description = "A query parameter (this route takes none).", body = ErrorBody),
        (status = 503, description = "The engine has stopped.", body = ErrorBody),
    ),
)]
pub(super) async fn clients(
    State(app): State<Arc<App>>,
    _: Params<NoParams>,
) -> Result<Json<ClientsAnswer>, ApiError> {
    let clients = app.engine.clients().await?;
    Ok(Json(ClientsAnswer {
        clients: clients.iter().map(ClientView::new).collect(),
    }))
}

#[derive(Serialize, ToSchema)]
pub(super) struct EvictAnswer {
    client: String,
    /// Groups the client was removed from.
    groups: usize,
}

/// Disconnect a client from every group: what it holds is redelivered at once.
#[utoipa::path(
    post,
    path = "/admin/clients/{client}/evict",
    tag = "operate",
    operation_id = "evictClient",
    params(("client" = String, Path, description = "The client.", pattern = r"^[A-Za-z0-9._-]{1,200}$")),
    responses(
        (status = 200, description = "Evicted (from no group if it was in none).", body = EvictAnswer),
        (status = 400, description = "An invalid name or query.", body = ErrorBody),
        (status = 503, description = "The engine has stopped.", body = ErrorBody),
    ),
)]
pub(super) async fn evict_client(
    State(app): State<Arc<App>>,
    Name(client): Name<ClientId>,
    _: Params<NoParams>,
) -> Result<Json<EvictAnswer>, ApiError> {
    let groups = app.engine.evict(&client).await?;
    Ok(Json(EvictAnswer {
        client: client.as_str().to_owned(),
        groups,
    }))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)] // Documents the parameter; the handler reads it.
pub(super) struct OffsetsQuery {
    /// The topic.
    #[param(pattern = r"^[A-Za-z0-9._-]{1,200}$")]
    topic: String,
}

impl QueryParams for OffsetsQuery {
    const NAMES: &'static [&'static str] = &["topic"];
}

#[derive(Serialize, ToSchema)]
pub(super) struct OffsetsAnswer {
    topic: String,
    offsets: Vec<OffsetView>,
}

/// The four offsets of every group and partition of a topic.
#[utoipa::path(
    get,
    path = "/admin/offsets",
    tag = "operate",
    operation_id = "offsets",
    params(OffsetsQuery),
    responses(
        (status = 200, description = "One row per group and partition.", body = OffsetsAnswer),
        (status = 400, description = "A missing or invalid `topic`, or another parameter.", body = ErrorBody),
        (status = 404, description = "No such topic.", body = ErrorBody),
        (status = 503, description = "The engine has stopped.", body = ErrorBody),
    ),
)]
pub(super) async fn offsets(
    State(app): State<Arc<App>>,
    Params(q, _): Params<OffsetsQuery>,
) -> Result<Json<OffsetsAnswer>, ApiError> {
    let topic = TopicName::new(q.required("topic")?)?;
    let rows = app.engine.offsets(&topic).await?;
    Ok(Json(OffsetsAnswer {
        topic: topic.as_str().to_owned(),
        offsets: rows.iter().map(OffsetView::new).collect(),
    }))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)] // Documents the parameter; the handler reads it with its bounds.
pub(super) struct DlqQuery {
    /// Most entries (default `limits.default_dlq_page`).
    #[param(minimum = 1, maximum = 1000)]
    max: Option<u64>,
}

impl QueryParams for DlqQuery {
    const NAMES: &'static [&'static str] = &["max"];
}

#[derive(Serialize, ToSchema)]
pub(super) struct DlqAnswer {
    group: String,
    /// By (partition, offset).
    entries: Vec<DlqView>,
}

/// The first dead letters of a group.
#[utoipa::path(
    get,
    path = "/admin/dlq/{group}",
    tag = "operate",
    operation_id = "dlqBrowse",
    params(("group" = String, Path, description = "The group.", pattern = r"^[A-Za-z0-9._-]{1,200}$"), DlqQuery),
    responses(
        (status = 200, description = "The entries.", body = DlqAnswer),
        (status = 400, description = "An invalid name or query.", body = ErrorBody),
        (status = 404, description = "No such group.", body = ErrorBody),
        (status = 503, description = "The state store or engine is unavailable.", body = ErrorBody),
    ),
)]
pub(super) async fn dlq_browse(
    State(app): State<Arc<App>>,
    Name(group): Name<GroupName>,
    Params(q, _): Params<DlqQuery>,
) -> Result<Json<DlqAnswer>, ApiError> {
    let max = dlq_max(&app, &q)?;
    let items = app.engine.dlq(&group, max).await?;
    Ok(Json(DlqAnswer {
        group: group.as_str().to_owned(),
        entries: items.iter().map(DlqView::new).collect(),
    }))
}

#[derive(Serialize, ToSchema)]
pub(super) struct ReplayAnswer {
    group: String,
    /// Dead letters whose replay started (those already in replay are not counted).
    replayed: usize,
}

/// Deliver dead letters again, to this group only, with fresh attempt counts.
#[utoipa::path(
    post,
    path = "/admin/dlq/{group}/replay",
    tag = "operate",
    operation_id = "dlqReplay",
    params(("group" = String, Path, description = "The group.", pattern = r"^[A-Za-z0-9._-]{1,200}$"), DlqQuery),
    responses(
        (status = 200, description = "The replay started.", body = ReplayAnswer),
        (status = 400, description = "An invalid name or query.", body = ErrorBody),
        (status = 404, description = "No such group.", body = ErrorBody),
        (status = 429, description = "The group's replay limit.", body = ErrorBody),
        (status = 503, description = "The state store or engine is unavailable.", body = ErrorBody),
    ),
)]
pub(super) async fn dlq_replay(
    State(app): State<Arc<App>>,
    Name(group): Name<GroupName>,
    Params(q, _): Params<DlqQuery>,
) -> Result<Json<ReplayAnswer>, ApiError> {
    let max = dlq_max(&app, &q)?;
    let replayed = app.engine.dlq_replay(&group, max).await?;
    Ok(Json(ReplayAnswer {
        group: group.as_str().to_owned(),
        replayed,
    }))
}

fn dlq_max(app: &App, q: &super::query::Query) -> Result<usize, ApiError> {
    let l = &app.limits;
    let max = q.bounded(
        "max",
        l.default_dlq_page.get() as u64,
        1,
        l.max_dlq_page.get() as u64,
    )?;
    Ok(usize::try_from(max).unwrap_or(l.max_dlq_page.get()))
}

#[derive(Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RateLimitBody {
    #[schema(pattern = r"^[A-Za-z0-9._-]{1,200}$")]
    topic: String,
    #[schema(minimum = 1, maximum = 1000000000)]
    events_per_second: u64,
    #[schema(minimum = 1, maximum = 1000000000)]
    burst: u64,
}

impl RateLimitBody {
    pub(super) fn new(topic: &TopicName, rule: RateRule) -> Self {
        Self {
            topic: topic.as_str().to_owned(),
            events_per_second: rule.events_per_second,
            burst: rule.burst,
        }
    }
}

#[derive(Serialize, ToSchema)]
pub(super) struct RateLimitsAnswer {
    /// By topic.
    rules: Vec<RateLimitBody>,
}

/// Every topic's publish rate limit.
#[utoipa::path(
    get,
    path = "/admin/ratelimit",
    tag = "operate",
    operation_id = "rateLimits",
    responses(
        (status = 200, description = "Every rule, by topic.", body = RateLimitsAnswer),
        (status = 400, description = "A query parameter (this route takes none).", body = ErrorBody),
    ),
)]
pub(super) async fn rate_limits(
    State(app): State<Arc<App>>,
    _: Params<NoParams>,
) -> Json<RateLimitsAnswer> {
    Json(RateLimitsAnswer {
        rules: app
            .engine
            .rate_rules()
            .iter()
            .map(|(topic, rule)| RateLimitBody::new(topic, *rule))
            .collect(),
    })
}

/// Set a topic's publish rate limit, durably.
#[utoipa::path(
    put,
    path = "/admin/ratelimit",
    tag = "operate",
    operation_id = "setRateLimit",
    request_body(content = RateLimitBody, content_type = "application/json"),
    responses(
        (status = 200, description = "The rule in force.", body = RateLimitBody),
        (status = 400, description = "Invalid JSON, topic or rule, or the rule limit.", body = ErrorBody),
        (status = 408, description = "The body did not arrive within the body timeout.", body = ErrorBody),
        (status = 413, description = "The body is over `limits.max_json_bytes`.", body = ErrorBody),
        (status = 415, description = "Not a JSON content type.", body = ErrorBody),
        (status = 503, description = "The state store cannot take writes now.", body = ErrorBody),
    ),
)]
pub(super) async fn rate_limit(
    State(app): State<Arc<App>>,
    _: Params<NoParams>,
    JsonBody(b): JsonBody<RateLimitBody>,
) -> Result<Json<RateLimitBody>, ApiError> {
    let topic = TopicName::new(&b.topic)?;
    let rule = RateRule {
        events_per_second: b.events_per_second,
        burst: b.burst,
    };
    app.engine.set_rate_limit(&topic, rule).await?;
    Ok(Json(b))
}

/// A seek's body as read: its members' types are checked by [`SeekBody::checked`], which
/// names the member at fault (serde's type errors name none).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SeekBody {
    partition: serde_json::Value,
    #[serde(default)]
    offset: Option<serde_json::Value>,
    #[serde(default)]
    time: Option<serde_json::Value>,
}

impl SeekBody {
    /// (partition, offset, time), each of its type.
    fn checked(self) -> Result<(u32, Option<u64>, Option<String>), ApiError> {
        let wrong = |what: &str| {
            ApiError::invalid_json(format!("the request body is not accepted: {what}"))
        };
        let partition = self
            .partition
            .as_u64()
            .and_then(|p| u32::try_from(p).ok())
            .ok_or_else(|| wrong("\"partition\" must be an integer from 0 to 4294967295"))?;
        let offset = match self.offset {
            None => None,
            Some(v) => Some(v.as_u64().ok_or_else(|| {
                wrong("\"offset\" must be an integer from 0 to 18446744073709551615")
            })?),
        };
        let time = match self.time {
            None => None,
            Some(serde_json::Value::String(t)) => Some(t),
            Some(_) => return Err(wrong("\"time\" must be a string (an RFC 3339 time)")),
        };
        Ok((partition, offset, time))
    }
}

/// Where a seek goes: an offset, or the first record appended at or after a time.
#[derive(ToSchema)]
#[serde(untagged)]
#[allow(dead_code)] // Documents the body; the handler reads `SeekBody`.
pub(super) enum SeekRequest {
    Offset(SeekToOffset),
    Time(SeekToTime),
}

#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub(super) struct SeekToOffset {
    partition: u32,
    /// The offset the partition restarts at: from `earliest` to `end` of what the log holds.
    offset: u64,
}

#[derive(ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub(super) struct SeekToTime {
    partition: u32,
    /// An RFC 3339 time: the partition restarts at the first record appended at or after
    /// it (on Kafka: the first whose timestamp is), at the earliest record for a time
    /// before every record, at the end for one after them all.
    #[schema(format = DateTime)]
    time: String,
}

#[derive(Serialize, ToSchema)]
pub(super) struct SeekAnswer {
    group: String,
    partition: u32,
    /// Where the partition restarts.
    offset: u64,
    /// The time asked for, when the seek was by time.
    #[serde(skip_serializing_if = "Option::is_none")]
    time: Option<String>,
}

/// Operator rewind (or skip) of one partition of a group: it restarts at `offset`, or at
/// the first record appended at or after `time`, with nothing done from there on.
#[utoipa::path(
    post,
    path = "/admin/subscriptions/{group}/seek",
    tag = "operate",
    operation_id = "seek",
    params(("group" = String, Path, description = "The group.", pattern = r"^[A-Za-z0-9._-]{1,200}$")),
    request_body(content = SeekRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "Done, durably.", body = SeekAnswer),
        (status = 400, description = "Invalid JSON or name, both or neither of `offset` and `time`, a `time` that is not RFC 3339, a partition the group does not have, or an offset outside what the log holds.", body = ErrorBody),
        (status = 404, description = "No such group.", body = ErrorBody),
        (status = 408, description = "The body did not arrive within the body timeout.", body = ErrorBody),
        (status = 413, description = "The body is over `limits.max_json_bytes`.", body = ErrorBody),
        (status = 415, description = "Not a JSON content type.", body = ErrorBody),
        (status = 503, description = "The state store or the broker cannot answer now.", body = ErrorBody),
    ),
)]
pub(super) async fn seek(
    State(app): State<Arc<App>>,
    Name(group): Name<GroupName>,
    _: Params<NoParams>,
    JsonBody(b): JsonBody<SeekBody>,
) -> Result<Json<SeekAnswer>, ApiError> {
    let (partition, offset, time) = b.checked()?;
    let offset = match (offset, &time) {
        (Some(offset), None) => {
            app.engine.seek(&group, partition, offset).await?;
            offset
        }
        (None, Some(time)) => {
            let ms = time_ms(time)?;
            app.engine.seek_to_time(&group, partition, ms).await?
        }
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid_json(
                "the request body is not accepted: give \"offset\" or \"time\", not both",
            ))
        }
        (None, None) => {
            return Err(ApiError::invalid_json(
                "the request body is not accepted: it needs \"offset\" (an offset) or \
                 \"time\" (an RFC 3339 time)",
            ))
        }
    };
    Ok(Json(SeekAnswer {
        group: group.as_str().to_owned(),
        partition,
        offset,
        time,
    }))
}

/// An RFC 3339 time as milliseconds since the Unix epoch; a time before 1970 is 0 (before
/// every record).
fn time_ms(text: &str) -> Result<u64, ApiError> {
    let t = chrono::DateTime::parse_from_rfc3339(text).map_err(|e| {
        ApiError::bad_request(
            code::INVALID_REQUEST,
            format!(
                "\"time\" is not an RFC 3339 time such as 2024-05-17T08:30:00Z ({e}): {text:?}"
            ),
        )
    })?;
    Ok(u64::try_from(t.timestamp_millis()).unwrap_or(0))
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
struct DlqView {
    topic: String,
    partition: u32,
    offset: u64,
    attempts: u32,
    /// Why it was dead-lettered (`nacked`, `expired`, `undecodable`, ...).
    reason: String,
    dead_lettered_at_ms: u64,
    /// The event as it would be delivered; `null` when the stored bytes are not an event
    /// (then `eventBase64` holds them).
    #[schema(value_type = Option<DeliveredEvent>)]
    event: Option<Box<RawValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    event_base64: Option<String>,
}

impl DlqView {
    fn new(d: &DlqItem) -> Self {
        let (event, event_base64) = match delivery_event_json(&d.body, d.partition, d.offset) {
            Ok(e) => (Some(e), None),
            Err(_) => (
                None,
                Some(base64::engine::general_purpose::STANDARD.encode(&d.body)),
            ),
        };
        Self {
            topic: d.topic.as_str().to_owned(),
            partition: d.partition,
            offset: d.offset,
            attempts: d.attempts,
            reason: d.reason.clone(),
            dead_lettered_at_ms: d.dead_lettered_at_ms,
            event,
            event_base64,
        }
    }
}
