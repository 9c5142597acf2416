//! The HTTP front of `unimesh serve` (docs/DESIGN.md §5.1): two listeners — traffic
//! (publish, subscriptions, long-poll, ACK/NACK/extend) and admin (metrics, health,
//! operator endpoints) — each an axum `Router` over one [`EngineHandle`], served by the
//! accept loop of `server` (connection limits, header timeout, graceful drain).
//!
//! A request goes: the router (404 / 405 in the API's error shape) → the handler's
//! extractors, which check the path name, the query and the body before the engine is
//! asked anything (so a refused request changes nothing) → a JSON answer, or an
//! [`ApiError`] rendered as `{"error": "<code>", "message": "<text>"}`.
//!
//! The OpenAPI documents are generated from the handlers and their types (`routes`,
//! `document`); a unit test keeps the checked-in copies equal to what the code generates.

mod admin;
pub mod auth;
mod body;
pub mod console;
pub mod cors;
mod document;
pub mod error;
mod extract;
#[cfg(not(madsim))]
pub mod jwt;
pub mod listener;
pub mod metrics;
pub mod push;
mod query;
pub mod reply;
pub mod routes;
mod schema;
mod server;
mod streams;
pub mod target;
#[cfg(not(madsim))]
pub mod tls;
mod traffic;
mod ui;
mod views;

#[cfg(test)]
mod tests;

pub use document::{checked_in_path, render as render_openapi, Documents};
pub use error::ApiError;
pub use listener::Listener;
pub use metrics::Metrics;
pub use routes::router;
pub use server::{Draining, Server};

use std::sync::Arc;

use tokio::sync::Semaphore;
use unimesh_core::SubscriptionLimits;

use crate::config::{self, Config, Limits};
use crate::engine::EngineHandle;
use crate::event::PublishLimits;
use crate::policy::{Origins, TargetPolicy};

/// What every handler needs: the engine, the limits, the metrics, the documents.
pub struct App {
    pub engine: EngineHandle,
    pub limits: Limits,
    pub publish: PublishLimits,
    pub subscription: SubscriptionLimits,
    pub metrics: Metrics,
    pub documents: Documents,
    pub server: config::Server,
    pub push: config::Push,
    /// The identities of `[auth]`; `None`: auth is off.
    pub auth: Option<auth::Gate>,
    /// Origins of `server.cors_allowed_origins` (CORS and WebSocket `Origin`).
    pub cors: Origins,
    /// Where webhooks may push (`push.allowed_hosts` and the mesh's own listeners).
    pub push_targets: Arc<TargetPolicy>,
    /// Slots of open delivery streams (`server.max_streams`).
    pub streams: Arc<Semaphore>,
    /// Request/reply requests waiting for their replies.
    pub replies: reply::Replies,
    /// The web console's live feed (`/admin/events`).
    pub console: console::Console,
    /// Told when a subscription is written or deleted here: the webhook supervisor looks
    /// at once ([`push::supervise`]).
    pub push_wake: Arc<tokio::sync::Notify>,
}

impl App {
    pub fn new(engine: EngineHandle, config: &Config) -> Self {
        Self {
            engine,
            limits: config.limits.clone(),
            publish: config.publish_limits(),
            subscription: config.subscription_limits(),
            metrics: Metrics::new(),
            documents: Documents::new(config),
            server: config.server.clone(),
            push: config.push.clone(),
            // Parsed by `Config::validate` already, like the push targets below.
            auth: auth::Gate::new(config),
            cors: Origins::parse(&config.server.cors_allowed_origins).unwrap_or_default(),
            // `Config::validate` parsed the list already; a list it refused allows nothing
            // non-public here.
            push_targets: Arc::new(
                TargetPolicy::parse(&config.push.allowed_hosts).unwrap_or_default(),
            ),
            streams: Arc::new(Semaphore::new(config.server.max_streams.get())),
            replies: reply::Replies::new(config.limits.max_pending_requests.get()),
            console: console::Console::new(config.server.console_interval_ms),
            push_wake: Arc::new(tokio::sync::Notify::new()),
        }
    }

    /// The same app, checking JWTs with these keys (`jwt::Verifier::load`).
    #[cfg(not(madsim))]
    #[must_use]
    pub fn with_jwt(mut self, jwt: Option<Arc<jwt::Verifier>>) -> Self {
        self.auth = self.auth.map(|g| g.with_jwt(jwt));
        self
    }

    /// The same app, knowing the addresses its listeners are bound to (never push targets).
    #[must_use]
    pub fn listening_on(mut self, own: impl IntoIterator<Item = std::net::SocketAddr>) -> Self {
        self.push_targets = Arc::new((*self.push_targets).clone().with_own(own));
        self
    }
}
