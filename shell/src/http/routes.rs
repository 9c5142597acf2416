//! The two APIs — traffic and admin — as axum routers and as OpenAPI documents, built from
//! the same handler list so the documents cannot drift from what is served.
//!
//! Every path is registered through [`on`], which merges the handlers of one path, keeps
//! the order they are listed in for the `Allow` header, and gives the path a 405 answer in
//! the API's error shape. Requests that match no path get a 404 in that shape. Inside,
//! the auth gate (`auth`) and, on the traffic listener, CORS (`cors`). The admin listener
//! also serves the web console's page and files (`ui`), outside its OpenAPI document. One
//! middleware around each router times every request (the `route` label is the matched
//! template, so label values stay bounded), logs refusals, and takes `Connection: close`
//! off HTTP/2 answers.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, MethodRouter};
use axum::Router;
use http::header::CONNECTION;
use http::{Method, Uri, Version};
use tracing::Instrument as _;
use utoipa::openapi::path::Paths;
use utoipa::openapi::{HttpMethod, OpenApi};
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouter};
use utoipa_axum::routes;

use super::error::{ApiError, Logged};
use super::listener::{Listener, UNMATCHED_LABEL};
use super::{admin, console, reply, streams, traffic, ui, App};

/// The traffic API's handlers, path by path.
fn traffic_api() -> OpenApiRouter<Arc<App>> {
    let api = OpenApiRouter::new();
    let api = on(api, vec![routes!(traffic::publish)]);
    let api = on(api, vec![routes!(reply::request)]);
    let api = on(
        api,
        vec![
            routes!(traffic::put_subscription),
            routes!(traffic::get_subscription),
            routes!(traffic::delete_subscription),
        ],
    );
    let api = on(api, vec![routes!(traffic::poll)]);
    let api = on(api, vec![routes!(streams::sse)]);
    let api = on(api, vec![routes!(streams::websocket)]);
    let api = on(api, vec![routes!(traffic::ack)]);
    let api = on(api, vec![routes!(traffic::nack)]);
    let api = on(api, vec![routes!(traffic::extend)]);
    on(api, vec![routes!(traffic::openapi)])
}

/// The admin API's handlers, path by path.
fn admin_api() -> OpenApiRouter<Arc<App>> {
    let api = OpenApiRouter::new();
    let api = on(api, vec![routes!(admin::metrics)]);
    let api = on(api, vec![routes!(admin::health)]);
    let api = on(api, vec![routes!(admin::ready)]);
    let api = on(api, vec![routes!(admin::subscriptions)]);
    let api = on(api, vec![routes!(admin::seek)]);
    let api = on(api, vec![routes!(admin::clients)]);
    let api = on(api, vec![routes!(admin::evict_client)]);
    let api = on(api, vec![routes!(admin::offsets)]);
    let api = on(api, vec![routes!(admin::dlq_browse)]);
    let api = on(api, vec![routes!(admin::dlq_replay)]);
    let api = on(
        api,
        vec![routes!(admin::rate_limits), routes!(admin::rate_limit)],
    );
    let api = on(api, vec![routes!(console::events)]);
    on(api, vec![routes!(admin::openapi)])
}

fn api(listener: Listener) -> OpenApiRouter<Arc<App>> {
    match listener {
        Listener::Admin => admin_api(),
        Listener::Traffic => traffic_api(),
    }
}

/// The OpenAPI document of one listener as the handlers describe it, before
/// [`document::finish`] adds what depends on the configuration.
pub fn openapi(listener: Listener) -> OpenApi {
    api(listener).into_openapi()
}

/// The web console's page and files (`ui`): served by the admin listener beside its API,
/// not part of its OpenAPI document (they are a page, not an API).
fn console_pages() -> Router<Arc<App>> {
    let get_only = |m: MethodRouter<Arc<App>>| {
        m.fallback(|method: Method, uri: Uri| async move {
            ApiError::method_not_allowed(&method, uri.path(), &[Method::GET])
        })
    };
    Router::new()
        .route("/ui", get_only(get(ui::index)))
        .route("/ui/", get_only(get(ui::index)))
        .route("/ui/{asset}", get_only(get(ui::asset)))
}

/// The router of one listener, with its 404, its middleware and the app as state.
pub fn router(listener: Listener, app: Arc<App>) -> Router {
    let (mut router, _) = api(listener).split_for_parts();
    if listener == Listener::Admin {
        router = router.merge(console_pages());
    }
    let mut router = router
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(
            (app.clone(), listener),
            super::auth::gate,
        ));
    // CORS on the traffic listener only (outside the auth gate: a preflight carries no
    // credentials, and a page must be able to read a 401), for the configured origins (none: no layer).
    if let (Listener::Traffic, Some(cors)) = (listener, super::cors::layer(&app.cors)) {
        let origins = app.cors.clone();
        router = router
            .layer(cors)
            .layer(middleware::from_fn(move |req: Request, next: Next| {
                super::cors::filter_preflight(origins.clone(), req, next)
            }));
    }
    router
        .layer(middleware::from_fn_with_state(app.clone(), observe))
        .with_state(app)
}

/// Registers the handlers of one path (one method each) as one route. The `Allow` header of
/// its 405 lists their methods in the order given.
fn on(
    api: OpenApiRouter<Arc<App>>,
    handlers: Vec<UtoipaMethodRouter<Arc<App>>>,
) -> OpenApiRouter<Arc<App>> {
    let mut schemas = Vec::new();
    let mut paths = Paths::new();
    let mut methods = MethodRouter::new();
    let mut allow: Vec<Method> = Vec::new();
    for (s, p, m) in handlers {
        schemas.extend(s);
        for item in p.paths.values() {
            allow.extend(methods_of(item));
        }
        paths.merge(p);
        methods = methods.merge(m);
    }
    let methods = methods.fallback(move |method: Method, uri: Uri| {
        let allow = allow.clone();
        async move { ApiError::method_not_allowed(&method, uri.path(), &allow) }
    });
    api.routes((schemas, paths, methods))
}

/// The methods a path item has operations for.
fn methods_of(item: &utoipa::openapi::PathItem) -> Vec<Method> {
    let all = [
        (HttpMethod::Get, &item.get, Method::GET),
        (HttpMethod::Put, &item.put, Method::PUT),
        (HttpMethod::Post, &item.post, Method::POST),
        (HttpMethod::Delete, &item.delete, Method::DELETE),
        (HttpMethod::Patch, &item.patch, Method::PATCH),
    ];
    all.into_iter()
        .filter(|(_, op, _)| op.is_some())
        .map(|(_, _, m)| m)
        .collect()
}

async fn not_found(uri: Uri) -> ApiError {
    ApiError::not_found(uri.path())
}

/// Times and logs every request of a listener.
async fn observe(State(app): State<Arc<App>>, req: Request, next: Next) -> Response {
    let started = Instant::now();
    let version = req.version();
    let label = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| format!("{} {}", req.method(), p.as_str()));
    let (method, uri) = (req.method().clone(), req.uri().clone());
    let span = crate::trace::request_span(&req);
    let mut response = next.run(req).instrument(span.clone()).await;
    span.record("status", response.status().as_u16());
    if let Some(Logged(e)) = response.extensions_mut().remove::<Logged>() {
        if e.status.is_server_error() {
            tracing::warn!(%method, path = %uri.path(), error = %e, "request failed");
        } else {
            tracing::debug!(%method, path = %uri.path(), error = %e, "request refused");
        }
    }
    // HTTP/2 has no connection header (and does not need one: streams are independent).
    if version >= Version::HTTP_2 {
        response.headers_mut().remove(CONNECTION);
    }
    app.metrics.observe_request(
        label.as_deref().unwrap_or(UNMATCHED_LABEL),
        started.elapsed().as_secs_f64(),
    );
    response
}

/// Every (method, path template) of a listener, from its document: what the router serves.
pub fn operations(listener: Listener) -> Vec<(Method, String)> {
    let doc = openapi(listener);
    let mut out = Vec::new();
    for (path, item) in &doc.paths.paths {
        for m in methods_of(item) {
            out.push((m, path.clone()));
        }
    }
    out
}
