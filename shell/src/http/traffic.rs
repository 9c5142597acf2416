//! Traffic routes: publish, the subscription resource, long-poll, ACK / NACK / extend.

use std::time::Instant;

use bytes::Bytes;
use http::request::Parts;
use http::{Response, StatusCode};
use hyper::body::Body;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;
use unimesh_core::{ClientId, DeliveryId, GroupName, Settle, TopicName};

use super::body::{parse_json, read_body, read_json_body};
use super::error::{code, ApiError};
use super::query::Query;
use super::router::{Matched, RouteId};
use super::{admin, json, App, ResBody};
use crate::engine::{PublishResult, Settling, SubscriptionInfo};
use crate::event::{delivery_event_json, parse_publish, publish_mode};
use crate::spec_json::{parse_subscription, SubscriptionDoc};

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
        RouteId::Publish => publish(app, TopicName::new(m.param())?, parts, body).await,
        RouteId::PutSubscription => {
            put_subscription(app, GroupName::new(m.param())?, parts, body).await
        }
        RouteId::GetSubscription => {
            let group = GroupName::new(m.param())?;
            no_query(parts)?;
            let info = app.engine.subscription(&group).await?;
            json(StatusCode::OK, &SubscriptionView::new(&info))
        }
        RouteId::DeleteSubscription => {
            let group = GroupName::new(m.param())?;
            no_query(parts)?;
            app.engine.unsubscribe(&group).await?;
            json(
                StatusCode::OK,
                &serde_json::json!({ "group": group.as_str(), "deleted": true }),
            )
        }
        RouteId::Poll => poll(app, GroupName::new(m.param())?, parts).await,
        RouteId::Ack => {
            settle(
                app,
                GroupName::new(m.param())?,
                SettleKind::Ack,
                parts,
                body,
            )
            .await
        }
        RouteId::Nack => {
            settle(
                app,
                GroupName::new(m.param())?,
                SettleKind::Nack,
                parts,
                body,
            )
            .await
        }
        RouteId::Extend => {
            settle(
                app,
                GroupName::new(m.param())?,
                SettleKind::Extend,
                parts,
                body,
            )
            .await
        }
        RouteId::OpenApi => admin::openapi(parts),
        other => Err(ApiError::internal(format!(
            "route {other:?} is in the table but has no traffic handler"
        ))),
    }
}

pub(super) fn no_query(parts: &Parts) -> Result<(), ApiError> {
    Query::parse(parts.uri.query(), &[]).map(|_| ())
}

// ----- publish -----

#[derive(Serialize)]
struct PublishAnswer<'a> {
    results: Vec<PublishResultView<'a>>,
}

#[derive(Serialize)]
struct PublishResultView<'a> {
    id: &'a str,
    partition: u32,
    offset: u64,
}

async fn publish<B>(
    app: &App,
    topic: TopicName,
    parts: &Parts,
    body: B,
) -> Result<Response<ResBody>, ApiError>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: std::fmt::Display,
{
    let started = Instant::now();
    no_query(parts)?;
    // The content type decides the mode: refuse an unreadable one before reading the body.
    publish_mode(&parts.headers)?;
    let bytes = read_body(
        &app.limits,
        body,
        &parts.headers,
        app.publish.max_request_bytes,
    )
    .await?;
    let events = parse_publish(&parts.headers, &bytes, &app.publish)?;
    let count = events.len() as u64;
    let results: Vec<PublishResult> = app.engine.publish(&topic, events).await?;
    app.metrics.published(&topic, count);
    app.metrics.observe_publish(started.elapsed().as_secs_f64());
    let answer = PublishAnswer {
        results: results
            .iter()
            .map(|r| PublishResultView {
                id: &r.id,
                partition: r.partition,
                offset: r.offset,
            })
            .collect(),
    };
    json(StatusCode::OK, &answer)
}

// ----- the subscription resource -----

async fn put_subscription<B>(
    app: &App,
    group: GroupName,
    parts: &Parts,
    body: B,
) -> Result<Response<ResBody>, ApiError>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: std::fmt::Display,
{
    no_query(parts)?;
    let bytes = read_json_body(&app.limits, &parts.headers, body).await?;
    // Broken JSON is `invalid-json` as on every other route; what is wrong inside a
    // well-formed document is `invalid-subscription`, naming the field.
    if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(&bytes) {
        return Err(ApiError::invalid_json(format!(
            "the request body is not JSON: {e}"
        )));
    }
    let spec = parse_subscription(group, &bytes, &app.subscription)?;
    let created = app.engine.subscribe(spec.clone()).await?;
    let view = SubscriptionDocView {
        group: spec.group.as_str(),
        doc: SubscriptionDoc::from_spec(&spec),
    };
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    json(status, &view)
}

#[derive(Serialize)]
struct SubscriptionDocView<'a> {
    group: &'a str,
    #[serde(flatten)]
    doc: SubscriptionDoc,
}

/// A subscription with its progress, as `GET /v1/subscriptions/{group}` and
/// `GET /admin/subscriptions` show it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SubscriptionView<'a> {
    group: &'a str,
    #[serde(flatten)]
    doc: SubscriptionDoc,
    /// Sum of the partitions' lags.
    lag: u64,
    in_flight: u64,
    clients: usize,
    replaying: usize,
    partitions: Vec<admin::OffsetView<'a>>,
    stats: StatsView,
}

impl<'a> SubscriptionView<'a> {
    pub(super) fn new(info: &'a SubscriptionInfo) -> Self {
        let s = &info.stats;
        Self {
            group: info.spec.group.as_str(),
            doc: SubscriptionDoc::from_spec(&info.spec),
            lag: info.lanes.iter().map(|l| l.lag).sum(),
            in_flight: info.lanes.iter().map(|l| l.in_flight).sum(),
            clients: info.clients,
            replaying: info.replaying,
            partitions: info.lanes.iter().map(admin::OffsetView::new).collect(),
            stats: StatsView {
                delivered: s.delivered,
                redelivered: s.redelivered,
                acked: s.acked,
                late_acked: s.late_acked,
                nacked: s.nacked,
                expired: s.expired,
                dead_lettered: s.dead_lettered,
                filtered: s.filtered,
                rejected: s.rejected,
                skipped_retention: s.skipped_retention,
            },
        }
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StatsView {
    delivered: u64,
    redelivered: u64,
    acked: u64,
    late_acked: u64,
    nacked: u64,
    expired: u64,
    dead_lettered: u64,
    filtered: u64,
    rejected: u64,
    skipped_retention: u64,
}

// ----- long-poll -----

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct DeliveryView {
    delivery_id: String,
    attempt: u32,
    event: Box<RawValue>,
}

async fn poll(app: &App, group: GroupName, parts: &Parts) -> Result<Response<ResBody>, ApiError> {
    let l = &app.limits;
    let q = Query::parse(parts.uri.query(), &["client", "max", "waitMs"])?;
    let client = ClientId::new(q.required("client")?)?;
    let max = q.bounded(
        "max",
        u64::from(l.default_poll_events),
        1,
        u64::from(l.max_poll_events),
    )?;
    let wait_ms = q.bounded("waitMs", l.default_wait_ms, 0, l.max_wait_ms)?;
    // `max` is at most `max_poll_events`, a u32.
    let max = u32::try_from(max).unwrap_or(l.max_poll_events);
    let deliveries = app.engine.poll(&group, &client, max, wait_ms).await?;
    let mut out = Vec::with_capacity(deliveries.len());
    for d in deliveries {
        match delivery_event_json(&d.record.body, d.partition, d.record.offset) {
            Ok(event) => out.push(DeliveryView {
                delivery_id: d.id.to_string(),
                attempt: d.attempt,
                event,
            }),
            // The core dead-letters records it cannot decode before delivering them, so
            // this is a stored event that decoded but cannot be rendered. Leaving it out
            // lets its ACK timeout redeliver it and `maxAttempts` dead-letter it.
            Err(e) => tracing::error!(
                %group, id = %d.id, error = %e,
                "a delivery could not be rendered; it is left to its ACK timeout"
            ),
        }
    }
    json(StatusCode::OK, &out)
}

// ----- ACK / NACK / extend -----

#[derive(Clone, Copy)]
enum SettleKind {
    Ack,
    Nack,
    Extend,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct AckBody {
    delivery_ids: Vec<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct NackBody {
    delivery_ids: Vec<Value>,
    #[serde(default)]
    delay_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ExtendBody {
    delivery_ids: Vec<Value>,
    #[serde(default)]
    extend_ms: Option<u64>,
}

#[derive(Serialize, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub(super) struct Rejected {
    delivery_id: String,
    reason: &'static str,
}

async fn settle<B>(
    app: &App,
    group: GroupName,
    kind: SettleKind,
    parts: &Parts,
    body: B,
) -> Result<Response<ResBody>, ApiError>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: std::fmt::Display,
{
    no_query(parts)?;
    let bytes = read_json_body(&app.limits, &parts.headers, body).await?;
    let limits = &app.subscription;
    let (raw_ids, how, counted) = match kind {
        SettleKind::Ack => {
            let b: AckBody = parse_json(&bytes)?;
            (b.delivery_ids, Settling::Ack, "acked")
        }
        SettleKind::Nack => {
            let b: NackBody = parse_json(&bytes)?;
            if let Some(d) = b.delay_ms {
                if d > limits.max_backoff_ms {
                    return Err(ApiError::bad_request(
                        code::INVALID_REQUEST,
                        format!("delayMs must be at most {}, not {d}", limits.max_backoff_ms),
                    ));
                }
            }
            (
                b.delivery_ids,
                Settling::Nack {
                    delay_ms: b.delay_ms,
                },
                "nacked",
            )
        }
        SettleKind::Extend => {
            let b: ExtendBody = parse_json(&bytes)?;
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
            (
                b.delivery_ids,
                Settling::Extend {
                    extend_ms: b.extend_ms,
                },
                "extended",
            )
        }
    };
    if raw_ids.len() > app.limits.max_ids_per_request {
        return Err(ApiError::too_large(format!(
            "deliveryIds has {} ids, over the limit of {}",
            raw_ids.len(),
            app.limits.max_ids_per_request
        )));
    }
    let (ids, mut rejected) = parse_ids(raw_ids);
    let outcomes = app
        .engine
        .settle(&group, how, ids.iter().map(|(_, id)| *id).collect())
        .await?;
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
    let rejected: Vec<Rejected> = rejected.into_iter().map(|(_, r)| r).collect();
    let mut answer = serde_json::Map::new();
    // docs/DESIGN.md §5.1 gives NACK and extend "the same answer" as ACK: `acked` counts the ids
    // accepted for every kind, and `nacked` / `extended` say the same in the verb's words.
    answer.insert("acked".to_owned(), Value::from(accepted));
    answer.insert(counted.to_owned(), Value::from(accepted));
    answer.insert(
        "rejected".to_owned(),
        serde_json::to_value(&rejected)
            .map_err(|e| ApiError::internal(format!("cannot write the answer: {e}")))?,
    );
    json(StatusCode::OK, &answer)
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

#[cfg(test)]
mod tests {
    use super::*;

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
