//! Delivery streams over HTTP: Server-Sent Events and WebSocket (docs/DESIGN.md §5.1). Both
//! are transports of one engine [`Stream`] session: they take its deliveries, write them,
//! and report `written` (the credit comes back) or `failed` (handed back at once); when the
//! connection goes, the stream is dropped and what was still queued goes back at once.
//!
//! A stream takes one of `server.max_streams` slots, and an HTTP/1.1 connection that
//! becomes a stream gives its connection slot back, so idle streams never starve publishers.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Extension, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::sink::SinkExt;
use futures_util::stream::{self, Stream as FutStream};
use http::{HeaderMap, StatusCode, Version};
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::OwnedSemaphorePermit;
use unimesh_core::{ClientId, GroupName};
use utoipa::IntoParams;

use super::error::{code, ApiError, ErrorBody};
use super::extract::{Name, Params, QueryParams};
use super::listener::ConnSlot;
use super::traffic::{settle, DeliveryView};
use super::App;
use crate::engine::{Settling, Stream};

/// Deliveries written to a stream per batch.
const BATCH: usize = 64;

/// Malformed WebSocket frames in a row before the connection is closed (1008).
const MAX_BAD_FRAMES: u32 = 3;

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)] // Documents the parameter; the handler reads it.
pub(super) struct StreamQuery {
    /// The client. Opening a stream again with the same client (a reconnect) hands back at
    /// once everything it had not ACKed, to be delivered again.
    #[param(pattern = r"^[A-Za-z0-9._-]{1,200}$")]
    client: String,
    /// The bearer token, for clients that cannot send `Authorization` (a browser's
    /// `EventSource` and `WebSocket`); read on the two stream routes only, never logged.
    #[serde(default)]
    access_token: Option<String>,
}

impl QueryParams for StreamQuery {
    const NAMES: &'static [&'static str] = &["client", "access_token"];
}

/// Takes a stream slot and opens the engine session; the connection slot of an HTTP/1.1
/// connection is given back (an HTTP/2 connection keeps it: it still carries requests).
async fn open(
    app: &App,
    group: &GroupName,
    q: &super::query::Query,
    slot: Option<&Arc<ConnSlot>>,
    version: Version,
) -> Result<(Stream, OwnedSemaphorePermit), ApiError> {
    let client = ClientId::new(q.required("client")?)?;
    let permit = app.streams.clone().try_acquire_owned().map_err(|_| {
        let mut e = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            code::UNAVAILABLE,
            format!(
                "{} delivery streams are open, the limit of server.max_streams",
                app.server.max_streams
            ),
        );
        e.retry_after_s = Some(1);
        e
    })?;
    let stream = app
        .engine
        .open_stream(group, &client, app.server.stream_window.get())
        .await?;
    if version <= Version::HTTP_11 {
        if let Some(slot) = slot {
            slot.release();
        }
    }
    Ok((stream, permit))
}

/// Server-Sent Events: one event per delivery (`id:` the delivery id, `data:` the delivery
/// JSON), heartbeat comments while idle, `retry:` first. ACK, NACK and extend through
/// their routes. A client that reconnects (with `Last-Event-ID`, as SSE clients do, or
/// without) gets everything it had not ACKed again at once.
#[utoipa::path(
    get,
    path = "/v1/subscriptions/{group}/stream",
    tag = "delivery",
    operation_id = "stream",
    params(
        ("group" = String, Path, description = "The group.", pattern = r"^[A-Za-z0-9._-]{1,200}$"),
        StreamQuery,
        ("last-event-id" = Option<String>, Header, description = "The last delivery id the client saw (sent by SSE clients on reconnect)."),
    ),
    responses(
        (status = 200, description = "The stream (`text/event-stream`); it ends when the group is deleted or the mesh stops.", content_type = "text/event-stream", body = String),
        (status = 400, description = "An invalid name or query.", body = ErrorBody),
        (status = 404, description = "No such group.", body = ErrorBody),
        (status = 429, description = "The group's client limit.", body = ErrorBody),
        (status = 503, description = "`server.max_streams` streams are open, or the engine has stopped.", body = ErrorBody),
    ),
)]
pub(super) async fn sse(
    State(app): State<Arc<App>>,
    Name(group): Name<GroupName>,
    Params(q, _): Params<StreamQuery>,
    slot: Option<Extension<Arc<ConnSlot>>>,
    headers: HeaderMap,
    version: Version,
) -> Result<Response, ApiError> {
    // CORS would only hide the stream from a page on another origin after the mesh had
    // leased it deliveries: such a page is refused before a client is attached.
    check_origin(&app, &headers)?;
    if let Some(last) = headers.get("last-event-id") {
        tracing::debug!(%group, last = ?last, "SSE reconnect");
    }
    let (stream, permit) = open(&app, &group, &q, slot.as_deref(), version).await?;
    let retry = Duration::from_millis(app.server.stream_retry_ms);
    let heartbeat = Duration::from_millis(app.server.stream_heartbeat_ms.get());
    let events = sse_events(group, stream, permit, retry);
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::new().interval(heartbeat).text("heartbeat"))
        .into_response())
}

/// The event stream of a session: `retry:` first, then the deliveries. Each batch is
/// reported written when the body asks for the next one (hyper took the previous).
fn sse_events(
    group: GroupName,
    stream: Stream,
    permit: OwnedSemaphorePermit,
    retry: Duration,
) -> impl FutStream<Item = Result<Event, Infallible>> {
    struct St {
        group: GroupName,
        stream: Stream,
        _permit: OwnedSemaphorePermit,
        pending: std::vec::IntoIter<Event>,
        unreported: usize,
    }
    let first = vec![Event::default().retry(retry)].into_iter();
    let st = St {
        group,
        stream,
        _permit: permit,
        pending: first,
        unreported: 0,
    };
    stream::unfold(st, |mut st| async move {
        loop {
            if let Some(e) = st.pending.next() {
                return Some((Ok(e), st));
            }
            if st.unreported > 0 {
                st.stream.written(st.unreported);
                st.unreported = 0;
            }
            let batch = st.stream.next(BATCH).await?;
            st.unreported = batch.len();
            let mut events = Vec::with_capacity(batch.len());
            for d in &batch {
                let _deliver = crate::trace::deliver_span(&st.group, d, "sse").entered();
                if let Some(json) = DeliveryView::json(&st.group, d) {
                    events.push(Event::default().id(d.id.to_string()).data(json));
                }
            }
            st.pending = events.into_iter();
        }
    })
}

/// WebSocket: delivery frames out (the delivery JSON); in, `{"ack":[ids]}`,
/// `{"nack":[ids],"delayMs":N}` and `{"extend":[ids],"extendMs":N}`, each answered with a
/// frame carrying the HTTP route's answer and `"result"` naming the verb. A malformed frame
/// is answered `{"error","message"}`; three in a row close the connection (1008). Pings
/// while idle; close 1001 when the mesh stops or the group is deleted.
#[utoipa::path(
    get,
    path = "/v1/subscriptions/{group}/ws",
    tag = "delivery",
    operation_id = "websocket",
    params(
        ("group" = String, Path, description = "The group.", pattern = r"^[A-Za-z0-9._-]{1,200}$"),
        StreamQuery,
    ),
    responses(
        (status = 101, description = "Switching to the WebSocket protocol."),
        (status = 400, description = "An invalid name or query, or not a WebSocket upgrade request.", body = ErrorBody),
        (status = 404, description = "No such group.", body = ErrorBody),
        (status = 429, description = "The group's client limit.", body = ErrorBody),
        (status = 503, description = "`server.max_streams` streams are open, or the engine has stopped.", body = ErrorBody),
    ),
)]
pub(super) async fn websocket(
    State(app): State<Arc<App>>,
    Name(group): Name<GroupName>,
    Params(q, _): Params<StreamQuery>,
    slot: Option<Extension<Arc<ConnSlot>>>,
    version: Version,
    headers: HeaderMap,
    upgrade: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    // CORS does not cover WebSocket: a page on any origin may open one, so the origin is
    // checked here, before anything else (nothing is opened for a refused page).
    check_origin(&app, &headers)?;
    let upgrade = upgrade.map_err(|e| {
        ApiError::bad_request(
            code::INVALID_REQUEST,
            format!("not a WebSocket upgrade request: {e}"),
        )
    })?;
    let (stream, permit) = open(&app, &group, &q, slot.as_deref(), version).await?;
    let heartbeat = Duration::from_millis(app.server.stream_heartbeat_ms.get());
    Ok(upgrade.on_upgrade(move |socket| async move {
        ws_session(app, group, socket, stream, heartbeat).await;
        drop(permit);
    }))
}

/// 403 `origin-not-allowed` for a page on an origin that may not open a stream.
fn check_origin(app: &App, headers: &HeaderMap) -> Result<(), ApiError> {
    app.cors.check_stream_origin(headers).map_err(|origin| {
        ApiError::new(
            StatusCode::FORBIDDEN,
            code::ORIGIN_NOT_ALLOWED,
            format!("origin {origin} is not in server.cors_allowed_origins"),
        )
    })
}

/// A WebSocket client's frame.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ClientFrame {
    #[serde(default)]
    ack: Option<Vec<Value>>,
    #[serde(default)]
    nack: Option<Vec<Value>>,
    #[serde(default)]
    extend: Option<Vec<Value>>,
    #[serde(default)]
    delay_ms: Option<u64>,
    #[serde(default)]
    extend_ms: Option<u64>,
}

async fn ws_session(
    app: Arc<App>,
    group: GroupName,
    mut socket: WebSocket,
    stream: Stream,
    heartbeat: Duration,
) {
    let mut bad_frames = 0u32;
    let mut ticker = tokio::time::interval(heartbeat);
    ticker.tick().await;
    loop {
        tokio::select! {
            batch = stream.next(BATCH) => {
                let Some(batch) = batch else {
                    // The engine ended the session: the mesh is stopping or the group is gone.
                    let _ = socket.send(Message::Close(Some(CloseFrame {
                        code: 1001,
                        reason: "the mesh is going away".into(),
                    }))).await;
                    return;
                };
                // The batch's frames go out in one flush (a write per batch, not per
                // delivery); a frame counts as written only once the flush succeeded.
                let mut fed = Vec::new();
                let mut failed = Vec::new();
                for d in &batch {
                    // Spans the write; not entered across the await.
                    let _deliver = crate::trace::deliver_span(&group, d, "websocket");
                    let Some(text) = DeliveryView::json(&group, d) else { continue };
                    if failed.is_empty() && socket.feed(Message::Text(text.into())).await.is_ok() {
                        fed.push(d.id);
                    } else {
                        failed.push(d.id);
                    }
                }
                if !fed.is_empty() && socket.flush().await.is_err() {
                    fed.append(&mut failed);
                    failed = std::mem::take(&mut fed);
                }
                stream.written(fed.len());
                if !failed.is_empty() {
                    stream.failed(failed);
                    return;
                }
            }
            frame = socket.recv() => {
                let text = match frame {
                    None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                    Some(Ok(Message::Text(t))) => t.to_string(),
                    Some(Ok(Message::Binary(b))) => String::from_utf8_lossy(&b).into_owned(),
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                };
                let answer = answer_frame(&app, &group, &text).await;
                if answer.get("error").is_some() {
                    bad_frames += 1;
                } else {
                    bad_frames = 0;
                }
                if socket.send(Message::Text(answer.to_string().into())).await.is_err() {
                    return;
                }
                if bad_frames >= MAX_BAD_FRAMES {
                    let _ = socket.send(Message::Close(Some(CloseFrame {
                        code: 1008,
                        reason: "too many malformed frames".into(),
                    }))).await;
                    return;
                }
            }
            _ = ticker.tick() => {
                if socket.send(Message::Ping(Vec::new().into())).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// The answer to one client frame: the HTTP route's answer with `"result"`, or an error.
async fn answer_frame(app: &App, group: &GroupName, text: &str) -> Value {
    let error = |message: String| serde_json::json!({"error": "invalid-frame", "message": message});
    let frame: ClientFrame = match serde_json::from_str(text) {
        Ok(f) => f,
        Err(e) => return error(format!("the frame is not accepted: {e}")),
    };
    let limits = &app.subscription;
    let (verb, ids, how) = match (frame.ack, frame.nack, frame.extend) {
        (Some(ids), None, None) => ("ack", ids, Settling::Ack),
        (None, Some(ids), None) => {
            if frame.delay_ms.is_some_and(|d| d > limits.max_backoff_ms) {
                return error(format!("delayMs must be at most {}", limits.max_backoff_ms));
            }
            let how = Settling::Nack {
                delay_ms: frame.delay_ms,
            };
            ("nack", ids, how)
        }
        (None, None, Some(ids)) => {
            if frame
                .extend_ms
                .is_some_and(|e| e == 0 || e > limits.max_ack_timeout_ms)
            {
                return error(format!(
                    "extendMs must be between 1 and {}",
                    limits.max_ack_timeout_ms
                ));
            }
            let how = Settling::Extend {
                extend_ms: frame.extend_ms,
            };
            ("extend", ids, how)
        }
        _ => {
            return error(
                "a frame has exactly one of \"ack\", \"nack\" or \"extend\" (an array of \
                 delivery ids)"
                    .to_owned(),
            )
        }
    };
    match settle(app, group, how, ids).await {
        Ok((accepted, rejected)) => {
            let mut answer = serde_json::json!({
                "result": verb,
                "acked": accepted,
                "rejected": rejected,
            });
            match verb {
                "nack" => answer["nacked"] = accepted.into(),
                "extend" => answer["extended"] = accepted.into(),
                _ => {}
            }
            answer
        }
        Err(e) => serde_json::json!({"error": e.code, "message": e.message}),
    }
}
