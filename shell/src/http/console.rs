//! The web console's live feed (issue 22): `GET /admin/events`, Server-Sent Events carrying
//! a snapshot of what the console shows — health, every group with its partitions, lag, in
//! flight and counters, every client, every rate rule — when something changed, at most
//! every `server.console_interval_ms`.
//!
//! One producer builds the snapshots for every watcher, and only while someone watches: it
//! waits for the engine to say that something may have changed (`EngineHandle::changed`:
//! an input of the core, a publish, a rate rule), at least every [`IDLE_REFRESH`] (what
//! moves without an input here: on Kafka, a partition's end that another instance
//! published to), builds a snapshot, and publishes it into a `watch` channel when it
//! differs from the last one. A watcher's stream takes the newest snapshot each time the
//! connection asks for the next event, so a slow browser skips snapshots and never queues
//! them: one snapshot in memory, whatever the number of watchers and their speed. When
//! the engine has stopped (shutdown), the producer publishes a last snapshot (unhealthy)
//! and ends, and every watcher's stream ends after sending it, so an open console does not
//! hold a graceful shutdown for its whole grace period.
//!
//! A browser's `EventSource` cannot send `Authorization`: with `[auth]`, the token may come
//! as the `access_token` query parameter, as on the traffic listener's stream routes (never
//! logged: the request log has the path only).

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::stream::{self, Stream, StreamExt as _};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use utoipa::{IntoParams, ToSchema};

use super::admin::{ClientView, RateLimitBody};
use super::error::{ApiError, ErrorBody};
use super::extract::{Params, QueryParams};
use super::views::SubscriptionView;
use super::App;

/// A snapshot is built at least this often while someone watches, changed or not (it is
/// sent only when it differs from the last).
pub const IDLE_REFRESH: Duration = Duration::from_secs(5);

/// The feed: the newest snapshot, and whether its producer runs.
pub struct Console {
    feed: watch::Sender<Option<Arc<Snapshot>>>,
    running: AtomicBool,
    /// The version of the last snapshot published (kept across producer restarts, so an
    /// SSE `id` never goes back).
    version: AtomicU64,
    interval: Duration,
    idle_refresh: Duration,
}

/// One snapshot as sent: its version (the SSE `id`) and its JSON (the `data`).
pub struct Snapshot {
    version: u64,
    json: String,
    /// The engine has stopped: the streams end after this one.
    last: bool,
}

impl Console {
    pub fn new(interval_ms: u64) -> Self {
        Self {
            feed: watch::Sender::new(None),
            running: AtomicBool::new(false),
            version: AtomicU64::new(0),
            interval: Duration::from_millis(interval_ms.max(1)),
            idle_refresh: IDLE_REFRESH,
        }
    }

    /// The same feed, refreshed while idle this often instead of [`IDLE_REFRESH`].
    #[must_use]
    pub fn with_idle_refresh(mut self, every: Duration) -> Self {
        self.idle_refresh = every;
        self
    }

    /// A watcher of the feed; starts the producer if none runs.
    fn watch(app: &Arc<App>) -> watch::Receiver<Option<Arc<Snapshot>>> {
        let console = &app.console;
        let rx = console.feed.subscribe();
        if !console.running.swap(true, Ordering::SeqCst) {
            tokio::spawn(produce(app.clone()));
        }
        rx
    }

    /// Called by the producer when nobody watches: whether it should end (false when a
    /// watcher came meanwhile and no other producer was started for it).
    fn stop(&self) -> bool {
        self.running.store(false, Ordering::SeqCst);
        // A watcher that came after the check saw `running` true and started no producer:
        // this one goes on, unless that watcher already started another (the swap says).
        self.feed.receiver_count() == 0 || self.running.swap(true, Ordering::SeqCst)
    }
}

/// Builds snapshots while anyone watches (see the module documentation).
async fn produce(app: Arc<App>) {
    let console = &app.console;
    let mut last: Option<String> = console.feed.borrow().as_ref().map(|s| s.json.clone());
    loop {
        let built_at = tokio::time::Instant::now();
        let json = snapshot(&app).await;
        let stopped = !app.engine.is_running();
        if stopped || last.as_deref() != Some(json.as_str()) {
            let version = console.version.fetch_add(1, Ordering::SeqCst) + 1;
            console.feed.send_replace(Some(Arc::new(Snapshot {
                version,
                json: json.clone(),
                last: stopped,
            })));
            last = Some(json);
        }
        if stopped {
            // For good (`running` stays set: a later watcher gets this last snapshot, and
            // its stream ends, with no producer started for a stopped engine).
            return;
        }
        tokio::select! {
            () = app.engine.changed() => {}
            () = tokio::time::sleep(console.idle_refresh) => {}
            () = console.feed.closed() => {}
        }
        if console.feed.receiver_count() == 0 && console.stop() {
            return;
        }
        tokio::time::sleep_until(built_at + console.interval).await;
    }
}

/// What the console shows, as one JSON document (the `data` of each event).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(super) struct ConsoleSnapshot {
    health: ConsoleHealth,
    /// Every group with its partitions, counters and DLQ change count; absent when the
    /// engine could not be asked (see `error`).
    #[serde(skip_serializing_if = "Option::is_none")]
    groups: Option<Vec<ConsoleGroup>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    clients: Option<Vec<ClientView>>,
    rate_limits: Vec<RateLimitBody>,
    /// Why a view is missing.
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(Serialize, ToSchema)]
pub(super) struct ConsoleHealth {
    ok: bool,
    /// Why not, when not ok (as `/admin/health` says it).
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub(super) struct ConsoleGroup {
    #[serde(flatten)]
    view: SubscriptionView,
    /// How many durable writes changed the group's DLQ since the process started: a
    /// browse made before the last change may differ now.
    dlq_changes: u64,
}

/// The snapshot now, as JSON.
async fn snapshot(app: &App) -> String {
    let health = match app.engine.health() {
        Ok(()) => ConsoleHealth {
            ok: true,
            reason: None,
        },
        Err(reason) => ConsoleHealth {
            ok: false,
            reason: Some(reason),
        },
    };
    let mut error = None;
    let groups = match app.engine.subscriptions().await {
        Ok(infos) => Some(
            infos
                .iter()
                .map(|info| ConsoleGroup {
                    view: SubscriptionView::new(info),
                    dlq_changes: info.dlq_changes,
                })
                .collect(),
        ),
        Err(e) => {
            error = Some(e.to_string());
            None
        }
    };
    let clients = match app.engine.clients().await {
        Ok(c) => Some(c.iter().map(ClientView::new).collect()),
        Err(e) => {
            error.get_or_insert(e.to_string());
            None
        }
    };
    let rate_limits = app
        .engine
        .rate_rules()
        .iter()
        .map(|(topic, rule)| RateLimitBody::new(topic, *rule))
        .collect();
    let snapshot = ConsoleSnapshot {
        health,
        groups,
        clients,
        rate_limits,
        error,
    };
    // A view of strings and numbers serialises without failure.
    serde_json::to_string(&snapshot).unwrap_or_default()
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)] // Documents the parameter; the auth gate reads it.
pub(super) struct EventsQuery {
    /// The bearer token, for a browser's `EventSource` (which cannot send
    /// `Authorization`); never logged.
    #[serde(default)]
    access_token: Option<String>,
}

impl QueryParams for EventsQuery {
    const NAMES: &'static [&'static str] = &["access_token"];
}

/// The web console's live feed (Server-Sent Events).
///
/// `event: snapshot`, `id:` the snapshot's version, `data:` a `ConsoleSnapshot` (health; every group with its partitions — end,
/// watermark, ACK ranges, lag, in flight, owner — counters and DLQ change count; every
/// client; every rate rule). The current snapshot first, then a new one whenever what it
/// shows changed, at most every `server.console_interval_ms`; a slow reader gets the
/// newest, never a queue. Heartbeat comments while idle.
#[utoipa::path(
    get,
    path = "/admin/events",
    tag = "operate",
    operation_id = "consoleEvents",
    params(EventsQuery),
    responses(
        (status = 200, description = "The stream (`text/event-stream`) of `ConsoleSnapshot`s; it ends when the mesh stops.", content_type = "text/event-stream", body = String),
        (status = 400, description = "A query parameter other than `access_token`.", body = ErrorBody),
    ),
)]
pub(super) async fn events(
    State(app): State<Arc<App>>,
    _: Params<EventsQuery>,
) -> Result<Response, ApiError> {
    let rx = Console::watch(&app);
    let retry = Duration::from_millis(app.server.stream_retry_ms);
    let heartbeat = Duration::from_millis(app.server.stream_heartbeat_ms.get());
    Ok(Sse::new(snapshots(rx, retry))
        .keep_alive(KeepAlive::new().interval(heartbeat).text("heartbeat"))
        .into_response())
}

/// `retry:`, then the newest snapshot each time the connection takes the next event and
/// there is one it has not sent; ends after the last one (the engine stopped).
fn snapshots(
    rx: watch::Receiver<Option<Arc<Snapshot>>>,
    retry: Duration,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let first = Event::default().retry(retry);
    stream::once(async move { Ok(first) }).chain(stream::unfold(
        (rx, 0u64, false),
        |(mut rx, sent, ended)| async move {
            if ended {
                return None;
            }
            loop {
                let newest = rx.borrow_and_update().clone();
                if let Some(s) = newest.filter(|s| s.version > sent) {
                    let event = Event::default()
                        .event("snapshot")
                        .id(s.version.to_string())
                        .data(s.json.as_str());
                    return Some((Ok(event), (rx, s.version, s.last)));
                }
                // The sender lives as long as the app.
                rx.changed().await.ok()?;
            }
        },
    ))
}
