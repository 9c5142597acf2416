//! Admin routes: metrics, health and readiness, and the operator's view and levers
//! (subscriptions, clients, offsets, DLQ, rate limits, seek).

use base64::Engine as _;
use bytes::Bytes;
use http::request::Parts;
use http::{Response, StatusCode};
use hyper::body::Body;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use unimesh_core::{ClientId, GroupName, RateRule, TopicName};

use super::body::{parse_json, read_json_body};
use super::error::{code, ApiError};
use super::metrics::CONTENT_TYPE as METRICS_CONTENT_TYPE;
use super::query::Query;
use super::router::{Matched, RouteId};
use super::traffic::{no_query, SubscriptionView};
use super::{json, with_type, App, ResBody, OPENAPI_JSON};
use crate::engine::{DlqItem, OffsetRow};
use crate::event::delivery_event_json;

pub(super) async fn dispatch<B>(
    app: &App,
    m: Matched,
    parts: &Parts,
    body: B,
) -> Result<Response<ResBody>, ApiError>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: std::fmt::Display,
{
    match m.route.id {
        RouteId::Metrics => {
            no_query(parts)?;
            let snapshot = match app.engine.metrics_snapshot().await {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::debug!(error = %e, "metrics without the engine's numbers");
                    None
                }
            };
            let text = app.metrics.render(snapshot);
            Ok(with_type(StatusCode::OK, METRICS_CONTENT_TYPE, text))
        }
        RouteId::Health => {
            no_query(parts)?;
            match app.engine.health() {
                Ok(()) => json(StatusCode::OK, &serde_json::json!({ "status": "ok" })),
                Err(why) => Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    code::UNAVAILABLE,
                    format!("unhealthy: {why}"),
                )),
            }
        }
        RouteId::Ready => {
            no_query(parts)?;
            if app.engine.is_ready() {
                json(StatusCode::OK, &serde_json::json!({ "status": "ready" }))
            } else {
                Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    code::UNAVAILABLE,
                    "not ready: the engine is still recovering, or is shutting down",
                ))
            }
        }
        RouteId::AdminSubscriptions => {
            no_query(parts)?;
            let infos = app.engine.subscriptions().await?;
            let views: Vec<SubscriptionView> = infos.iter().map(SubscriptionView::new).collect();
            json(
                StatusCode::OK,
                &serde_json::json!({ "subscriptions": views }),
            )
        }
        RouteId::AdminClients => {
            no_query(parts)?;
            let clients = app.engine.clients().await?;
            let views: Vec<ClientView> = clients
                .iter()
                .map(|c| ClientView {
                    group: c.group.as_str(),
                    client: c.id.as_str(),
                    credit: c.credit,
                    in_flight: c.in_flight,
                    last_active_ms: c.last_active_ms,
                })
                .collect();
            json(StatusCode::OK, &serde_json::json!({ "clients": views }))
        }
        RouteId::EvictClient => {
            let client = ClientId::new(m.param())?;
            no_query(parts)?;
            let groups = app.engine.evict(&client).await?;
            json(
                StatusCode::OK,
                &serde_json::json!({ "client": client.as_str(), "groups": groups }),
            )
        }
        RouteId::Offsets => {
            let q = Query::parse(parts.uri.query(), &["topic"])?;
            let topic = TopicName::new(q.required("topic")?)?;
            let rows = app.engine.offsets(&topic).await?;
            let views: Vec<OffsetView> = rows.iter().map(OffsetView::new).collect();
            json(
                StatusCode::OK,
                &serde_json::json!({ "topic": topic.as_str(), "offsets": views }),
            )
        }
        RouteId::DlqBrowse => {
            let group = GroupName::new(m.param())?;
            let max = dlq_max(app, parts)?;
            let items = app.engine.dlq(&group, max).await?;
            let entries: Vec<DlqView> = items.iter().map(DlqView::new).collect();
            json(
                StatusCode::OK,
                &serde_json::json!({ "group": group.as_str(), "entries": entries }),
            )
        }
        RouteId::DlqReplay => {
            let group = GroupName::new(m.param())?;
            let max = dlq_max(app, parts)?;
            let replayed = app.engine.dlq_replay(&group, max).await?;
            json(
                StatusCode::OK,
                &serde_json::json!({ "group": group.as_str(), "replayed": replayed }),
            )
        }
        RouteId::RateLimit => {
            no_query(parts)?;
            let bytes = read_json_body(&app.limits, &parts.headers, body).await?;
            let b: RateLimitBody = parse_json(&bytes)?;
            let topic = TopicName::new(&b.topic)?;
            let rule = RateRule {
                events_per_second: b.events_per_second,
                burst: b.burst,
            };
            app.engine.set_rate_limit(&topic, rule).await?;
            json(
                StatusCode::OK,
                &serde_json::json!({
                    "topic": topic.as_str(),
                    "eventsPerSecond": rule.events_per_second,
                    "burst": rule.burst,
                }),
            )
        }
        RouteId::Seek => {
            let group = GroupName::new(m.param())?;
            no_query(parts)?;
            let bytes = read_json_body(&app.limits, &parts.headers, body).await?;
            let b: SeekBody = parse_json(&bytes)?;
            app.engine.seek(&group, b.partition, b.offset).await?;
            json(
                StatusCode::OK,
                &serde_json::json!({
                    "group": group.as_str(),
                    "partition": b.partition,
                    "offset": b.offset,
                }),
            )
        }
        RouteId::OpenApi => openapi(parts),
        other => Err(ApiError::internal(format!(
            "route {other:?} is in the table but has no admin handler"
        ))),
    }
}

pub(super) fn openapi(parts: &Parts) -> Result<Response<ResBody>, ApiError> {
    no_query(parts)?;
    Ok(with_type(StatusCode::OK, "application/json", OPENAPI_JSON))
}

fn dlq_max(app: &App, parts: &Parts) -> Result<usize, ApiError> {
    let l = &app.limits;
    let q = Query::parse(parts.uri.query(), &["max"])?;
    let max = q.bounded("max", l.default_dlq_page as u64, 1, l.max_dlq_page as u64)?;
    Ok(usize::try_from(max).unwrap_or(l.max_dlq_page))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RateLimitBody {
    topic: String,
    events_per_second: u64,
    burst: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SeekBody {
    partition: u32,
    offset: u64,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ClientView<'a> {
    group: &'a str,
    client: &'a str,
    credit: u32,
    in_flight: u32,
    last_active_ms: u64,
}

/// One (group, partition) with its four offsets.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct OffsetView<'a> {
    group: &'a str,
    topic: &'a str,
    partition: u32,
    end: u64,
    cursor: u64,
    push: u64,
    watermark: u64,
    durable_watermark: Option<u64>,
    ack_ranges: &'a [(u64, u64)],
    lag: u64,
    in_flight: u64,
    /// Which instance serves the partition (Kafka backend: Kafka's group coordinator
    /// decided); absent when one instance owns the log whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    owner: Option<&'a str>,
}

impl<'a> OffsetView<'a> {
    pub(super) fn new(r: &'a OffsetRow) -> Self {
        Self {
            group: r.group.as_str(),
            topic: r.topic.as_str(),
            partition: r.partition,
            end: r.end,
            cursor: r.cursor,
            push: r.push,
            watermark: r.watermark,
            durable_watermark: r.durable_watermark,
            ack_ranges: &r.ack_ranges,
            lag: r.lag,
            in_flight: r.in_flight,
            owner: r.owner.as_deref(),
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct DlqView<'a> {
    topic: &'a str,
    partition: u32,
    offset: u64,
    attempts: u32,
    reason: &'a str,
    dead_lettered_at_ms: u64,
    /// The event as it would be delivered; `null` when the stored bytes are not an event
    /// (then `eventBase64` holds them).
    event: Option<Box<RawValue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    event_base64: Option<String>,
}

impl<'a> DlqView<'a> {
    fn new(d: &'a DlqItem) -> Self {
        let (event, event_base64) = match delivery_event_json(&d.body, d.partition, d.offset) {
            Ok(e) => (Some(e), None),
            Err(_) => (
                None,
                Some(base64::engine::general_purpose::STANDARD.encode(&d.body)),
            ),
        };
        Self {
            topic: d.topic.as_str(),
            partition: d.partition,
            offset: d.offset,
            attempts: d.attempts,
            reason: &d.reason,
            dead_lettered_at_ms: d.dead_lettered_at_ms,
            event,
            event_base64,
        }
    }
}
