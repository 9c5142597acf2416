//! The OpenAPI documents: one per listener, generated from the handlers (see `routes`),
//! finished with the hand-written schemas (`schema::install`) and the bounds that come from
//! the configuration, and served at `/openapi.json` on the listener it describes (by
//! `traffic::openapi` and `admin::openapi`, from [`Documents`]).
//!
//! The checked-in copies (`shell/openapi-traffic.json`, `shell/openapi-admin.json`) are the
//! documents of the default configuration; a unit test fails when they differ from what the
//! code generates, and `UNIMESH_BLESS=1 cargo test -p unimesh-shell openapi_documents`
//! rewrites them.

use bytes::Bytes;
use serde_json::{json, Value};
use utoipa::openapi::OpenApi;

use super::listener::Listener;
use super::routes::openapi;
use super::schema;
use crate::config::Config;

/// The finished document of `listener` for `config`, as served.
pub fn render(listener: Listener, config: &Config) -> Bytes {
    render_with(listener, Some(config))
}

/// The document with the configured bounds written in, or (`None`) as annotated.
pub(super) fn render_with(listener: Listener, config: Option<&Config>) -> Bytes {
    let mut doc =
        serde_json::to_value(described(listener, openapi(listener))).unwrap_or(Value::Null);
    schema::install(&mut doc);
    link_names(&mut doc);
    security(&mut doc, listener, config.map(|c| &c.auth));
    if let Some(config) = config {
        apply_limits(&mut doc, config);
    }
    // `Value` of a document serialises without failure; pretty, so the checked-in copy diffs.
    let mut text = serde_json::to_vec_pretty(&doc).unwrap_or_default();
    text.push(b'\n');
    Bytes::from(text)
}

/// Title, version, server and tags.
fn described(listener: Listener, mut doc: OpenApi) -> OpenApi {
    let (title, about, port) = match listener {
        Listener::Traffic => (
            "unimesh traffic API",
            "Publish CloudEvents, manage subscription groups, receive deliveries and \
             settle them (docs/DESIGN.md §5.1). Errors are `{\"error\", \"message\"}`.",
            8080,
        ),
        Listener::Admin => (
            "unimesh admin API",
            "Metrics, health and the operator's views and levers. Served on the admin \
             listener only: keep it off public interfaces.",
            8081,
        ),
    };
    doc.info.title = title.to_owned();
    doc.info.description = Some(about.to_owned());
    doc.info.version = env!("CARGO_PKG_VERSION").to_owned();
    doc.info.license = Some(utoipa::openapi::License::new("Apache-2.0"));
    doc.info.contact = None;
    doc.servers = Some(vec![utoipa::openapi::Server::new(format!(
        "http://127.0.0.1:{port}"
    ))]);
    doc
}

/// Writes the configured bounds into the document (the handlers' annotations carry the
/// defaults, so the default configuration changes nothing; a test checks that).
fn apply_limits(doc: &mut Value, config: &Config) {
    let l = &config.limits;
    let m = &config.mesh;
    let poll = "/paths/~1v1~1subscriptions~1{group}~1events/get";
    param_bound(doc, poll, "max", "maximum", json!(l.max_poll_events));
    param_bound(doc, poll, "waitMs", "maximum", json!(l.max_wait_ms));
    let request = "/paths/~1v1~1topics~1{topic}~1request/post";
    param_bound(doc, request, "timeoutMs", "maximum", json!(l.max_wait_ms));
    for op in [
        "/paths/~1admin~1dlq~1{group}/get",
        "/paths/~1admin~1dlq~1{group}~1replay/post",
    ] {
        param_bound(doc, op, "max", "maximum", json!(l.max_dlq_page));
    }
    let schemas = "/components/schemas";
    for body in ["AckBody", "NackBody", "ExtendBody"] {
        set(
            doc,
            &format!("{schemas}/{body}/properties/deliveryIds/maxItems"),
            json!(l.max_ids_per_request),
        );
    }
    set(
        doc,
        &format!("{schemas}/NackBody/properties/delayMs/maximum"),
        json!(m.max_backoff_ms),
    );
    set(
        doc,
        &format!("{schemas}/ExtendBody/properties/extendMs/maximum"),
        json!(m.max_ack_timeout_ms),
    );
    let sub = format!("{schemas}/SubscriptionDoc/properties");
    set(
        doc,
        &format!("{sub}/ackTimeoutMs/maximum"),
        json!(m.max_ack_timeout_ms),
    );
    set(
        doc,
        &format!("{sub}/maxAttempts/maximum"),
        json!(m.max_attempts),
    );
    set(
        doc,
        &format!("{sub}/maxInFlightPerClient/maximum"),
        json!(m.max_in_flight_per_client),
    );
    let backoff = format!("{schemas}/BackoffDoc/properties");
    set(
        doc,
        &format!("{backoff}/initialMs/maximum"),
        json!(m.max_backoff_ms),
    );
    set(
        doc,
        &format!("{backoff}/maxMs/maximum"),
        json!(m.max_backoff_ms),
    );
    set(
        doc,
        &format!("{schemas}/CloudEventBatch/maxItems"),
        json!(l.max_batch_events),
    );
    // With an allow-list, a push URL must name one of its hosts: the document says so, so a
    // generated client (or a fuzzer) never offers another.
    let policy = crate::policy::TargetPolicy::parse(&config.push.allowed_hosts).unwrap_or_default();
    if let Some(hosts) = policy.host_pattern() {
        let pattern = format!("^https?://{hosts}{}", crate::spec_json::PUSH_URL_AFTER_HOST);
        set(
            doc,
            &format!("{schemas}/PushDoc/properties/url/pattern"),
            json!(pattern),
        );
    }
}

/// The security schemes (issue 19): a bearer token on every operation, and on the two
/// stream routes the `access_token` query parameter instead. Every operation may answer
/// 401 and 403. Without identities (the default, and the checked-in copies) a request
/// without credentials is accepted too (`{}` among the requirements); with them, only
/// health, readiness and metrics with `auth.open_health`.
fn security(doc: &mut Value, listener: Listener, auth: Option<&crate::config::Auth>) {
    let enabled = auth.is_some_and(crate::config::Auth::enabled);
    let open_health = auth.is_none_or(|a| a.open_health);
    let mut schemes = json!({
        "bearerAuth": {
            "type": "http",
            "scheme": "bearer",
            "description": "A static token of an [auth.identities.NAME] (its SHA-256 in the configuration)."
        }
    });
    schemes["accessToken"] = json!({
        "type": "apiKey",
        "in": "query",
        "name": super::auth::ACCESS_TOKEN_PARAM,
        "description": match listener {
            Listener::Traffic => "The same token, on the SSE and WebSocket routes only (a browser's EventSource and WebSocket cannot send headers).",
            Listener::Admin => "The same token, on the console's feed only (a browser's EventSource cannot send headers).",
        }
    });
    if let Some(components) = doc.get_mut("components").and_then(Value::as_object_mut) {
        components.insert("securitySchemes".to_owned(), schemes);
    }
    let error = |description: &str| {
        json!({
            "description": description,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
        })
    };
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    for (path, item) in paths.iter_mut() {
        let Some(item) = item.as_object_mut() else {
            continue;
        };
        let stream = path.ends_with("/stream") || path.ends_with("/ws") || path == "/admin/events";
        let open =
            open_health && matches!(path.as_str(), "/admin/health" | "/admin/ready" | "/metrics");
        for op in item.values_mut().filter_map(Value::as_object_mut) {
            let mut requirements = vec![json!({"bearerAuth": []})];
            if stream {
                requirements.push(json!({"accessToken": []}));
            }
            if !enabled || open {
                requirements.push(json!({}));
            }
            op.insert("security".to_owned(), Value::Array(requirements));
            if let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) {
                responses.insert(
                    "401".to_owned(),
                    error("Credentials missing or not valid (`[auth]` configured); `WWW-Authenticate: Bearer`."),
                );
                responses.insert(
                    "403".to_owned(),
                    error(match listener {
                        Listener::Admin => "The identity does not have the admin right.",
                        Listener::Traffic if stream => "The identity does not have the right this route needs, or the page's `Origin` is not allowed.",
                        Listener::Traffic => "The identity does not have the right this route needs (the message names it).",
                    }),
                );
            }
        }
    }
}

/// utoipa 5 writes the members of a response link in snake case (`operation_id`); OpenAPI
/// names them `operationId`, `operationRef` and `requestBody`.
fn link_names(doc: &mut Value) {
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    for item in paths.values_mut().filter_map(Value::as_object_mut) {
        for op in item.values_mut() {
            let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut) else {
                continue;
            };
            for response in responses.values_mut() {
                let Some(links) = response.get_mut("links").and_then(Value::as_object_mut) else {
                    continue;
                };
                for link in links.values_mut().filter_map(Value::as_object_mut) {
                    for (from, to) in [
                        ("operation_id", "operationId"),
                        ("operation_ref", "operationRef"),
                        ("request_body", "requestBody"),
                    ] {
                        if let Some(v) = link.remove(from) {
                            link.insert(to.to_owned(), v);
                        }
                    }
                }
            }
        }
    }
}

/// Sets a value the document already has (a missing one means the annotations changed
/// shape; the default-configuration test catches that).
fn set(doc: &mut Value, pointer: &str, value: Value) {
    if let Some(slot) = doc.pointer_mut(pointer) {
        *slot = value;
    }
}

/// Sets a bound of one query parameter's schema.
fn param_bound(doc: &mut Value, operation: &str, name: &str, bound: &str, value: Value) {
    let Some(params) = doc
        .pointer_mut(&format!("{operation}/parameters"))
        .and_then(Value::as_array_mut)
    else {
        return;
    };
    for p in params {
        if p["name"] == name {
            if let Some(slot) = p.pointer_mut(&format!("/schema/{bound}")) {
                *slot = value.clone();
            }
        }
    }
}

/// Both finished documents, rendered once at start.
pub struct Documents {
    pub traffic: Bytes,
    pub admin: Bytes,
}

impl Documents {
    pub fn new(config: &Config) -> Self {
        Self {
            traffic: render(Listener::Traffic, config),
            admin: render(Listener::Admin, config),
        }
    }
}

/// The checked-in copy of a listener's document (default configuration).
pub fn checked_in_path(listener: Listener) -> std::path::PathBuf {
    let name = match listener {
        Listener::Admin => "openapi-admin.json",
        Listener::Traffic => "openapi-traffic.json",
    };
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(name)
}
