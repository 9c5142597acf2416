//! The HTTP front in process: requests handed to the listeners' routers directly, against
//! the real engine on in-memory ports, plus one loopback test of the listeners themselves.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::ServiceExt as _;

use super::*;
use crate::config::Config;
use crate::engine::{self, EngineConfig, MemoryLog, StoreAdapter};
use crate::storage::state::{MemoryDisk, MemoryStore};

struct Rig {
    app: Arc<App>,
    log: Arc<MemoryLog>,
}

fn test_config() -> Config {
    let mut c = Config::default();
    c.limits.max_request_bytes = (64 * 1024_usize).try_into().expect("not 0");
    c.limits.max_event_bytes = (16 * 1024_usize).try_into().expect("not 0");
    c.limits.max_json_bytes = (4 * 1024_usize).try_into().expect("not 0");
    c.limits.max_ids_per_request = 8.try_into().expect("not 0");
    c
}

async fn rig() -> Rig {
    rig_with(test_config()).await
}

async fn rig_with(config: Config) -> Rig {
    rig_built(config, |_| {}).await
}

/// A rig whose app `build` may change before it serves.
async fn rig_built(config: Config, build: impl FnOnce(&mut App)) -> Rig {
    let mut ecfg = EngineConfig {
        mesh: config.mesh_config(),
        fetch_wait_ms: 50,
        retention_interval_ms: 0,
        ..EngineConfig::default()
    };
    ecfg.mesh.flush_interval_ms = 5;
    let log = Arc::new(MemoryLog::new(2));
    let state = Arc::new(StoreAdapter::new(Box::new(MemoryStore::open(
        MemoryDisk::new(),
    ))));
    let (handle, _join) = engine::start(ecfg, Arc::new(log.clone()), state)
        .await
        .expect("engine starts");
    for _ in 0..400 {
        if handle.is_ready() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(handle.is_ready(), "engine never became ready");
    let mut app = App::new(handle, &config);
    build(&mut app);
    Rig {
        app: Arc::new(app),
        log,
    }
}

/// A rig whose console feed builds snapshots only when told of a change (no refresh while
/// idle within a test), every 50 ms at most.
async fn console_rig() -> Rig {
    rig_built(test_config(), |app| {
        app.console = console::Console::new(50).with_idle_refresh(Duration::from_secs(3_600));
    })
    .await
}

struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: Bytes,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    /// Asserts an error answer: status, code, and that the message mentions `needle`.
    fn error(&self, status: u16, code: &str, needle: &str) {
        let body = self.json();
        assert_eq!(self.status.as_u16(), status, "{body}");
        assert_eq!(body["error"], code, "{body}");
        let message = body["message"].as_str().expect("message is a string");
        assert!(
            message.contains(needle),
            "{message:?} should mention {needle:?}"
        );
        assert_eq!(body.as_object().map(|o| o.len()), Some(2), "{body}");
    }
}

impl Rig {
    async fn call(
        &self,
        listener: Listener,
        method: Method,
        uri: &str,
        headers: &[(&str, &str)],
        body: impl Into<Bytes>,
    ) -> Answer {
        let mut req = Request::builder().method(method).uri(uri);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(body.into())).expect("request");
        let res = router(listener, self.app.clone())
            .oneshot(req)
            .await
            .unwrap_or_else(|e| match e {});
        let (parts, body) = res.into_parts();
        let streaming = parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
        let body = if streaming {
            // A stream never ends: its first event is the answer here.
            let mut feed = Feed {
                body,
                text: String::new(),
                ended: false,
            };
            Bytes::from(feed.next_event().await.unwrap_or_default())
        } else {
            body.collect().await.expect("infallible").to_bytes()
        };
        Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    /// Opens the console's feed (`/admin/events`).
    async fn feed(&self, headers: &[(&str, &str)]) -> Feed {
        let mut req = Request::builder().method(Method::GET).uri("/admin/events");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(Bytes::new())).expect("request");
        let res = router(Listener::Admin, self.app.clone())
            .oneshot(req)
            .await
            .unwrap_or_else(|e| match e {});
        assert_eq!(res.status(), StatusCode::OK);
        Feed {
            body: res.into_body(),
            text: String::new(),
            ended: false,
        }
    }

    async fn traffic(&self, method: Method, uri: &str, body: Value) -> Answer {
        let body = if body.is_null() {
            Bytes::new()
        } else {
            Bytes::from(body.to_string())
        };
        self.call(
            Listener::Traffic,
            method,
            uri,
            &[("content-type", "application/json")],
            body,
        )
        .await
    }

    async fn admin(&self, method: Method, uri: &str, body: Value) -> Answer {
        let body = if body.is_null() {
            Bytes::new()
        } else {
            Bytes::from(body.to_string())
        };
        self.call(
            Listener::Admin,
            method,
            uri,
            &[("content-type", "application/json")],
            body,
        )
        .await
    }

    async fn subscribe(&self, group: &str, doc: Value) -> Answer {
        self.traffic(Method::PUT, &format!("/v1/subscriptions/{group}"), doc)
            .await
    }

    async fn publish_structured(&self, topic: &str, id: &str) -> Answer {
        let event = json!({"specversion": "1.0", "id": id, "source": "/test", "type": "t.e", "data": {"id": id}});
        self.call(
            Listener::Traffic,
            Method::POST,
            &format!("/v1/topics/{topic}/events"),
            &[("content-type", "application/cloudevents+json")],
            event.to_string(),
        )
        .await
    }

    /// Polls until `n` deliveries came (bounded number of polls, each waiting at the engine).
    async fn take(&self, group: &str, client: &str, n: usize) -> Vec<Value> {
        let mut got = Vec::new();
        for _ in 0..50 {
            let a = self
                .traffic(
                    Method::GET,
                    &format!(
                        "/v1/subscriptions/{group}/events?client={client}&max={}&waitMs=200",
                        n - got.len()
                    ),
                    Value::Null,
                )
                .await;
            assert_eq!(a.status, StatusCode::OK, "{}", a.json());
            got.extend(a.json().as_array().expect("array").iter().cloned());
            if got.len() >= n {
                break;
            }
        }
        got
    }

    async fn settle(&self, group: &str, verb: &str, body: Value) -> Answer {
        self.traffic(
            Method::POST,
            &format!("/v1/subscriptions/{group}/{verb}"),
            body,
        )
        .await
    }
}

/// An open Server-Sent Events body, read event by event.
struct Feed {
    body: axum::body::Body,
    text: String,
    /// The stream ended (rather than being quiet).
    ended: bool,
}

impl Feed {
    /// The next event's `data` (events without data, such as `retry:`, are skipped);
    /// `None` when the stream ends or nothing comes within 10 s.
    async fn next_event(&mut self) -> Option<String> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            while let Some(end) = self.text.find("\n\n") {
                let block: String = self.text.drain(..end + 2).collect();
                let data: Vec<&str> = block
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(str::trim_start)
                    .collect();
                if !data.is_empty() {
                    return Some(data.join("\n"));
                }
            }
            let Some(frame) = tokio::time::timeout_at(deadline, self.body.frame())
                .await
                .ok()?
            else {
                self.ended = true;
                return None;
            };
            let frame = frame.ok()?;
            if let Ok(bytes) = frame.into_data() {
                self.text.push_str(&String::from_utf8_lossy(&bytes));
            }
        }
    }

    /// The next snapshot, as JSON.
    async fn snapshot(&mut self) -> Value {
        let data = self.next_event().await.expect("a snapshot within 10 s");
        serde_json::from_str(&data).expect("a snapshot is JSON")
    }

    /// Snapshots until one satisfies `want` (at most 20).
    async fn until(&mut self, what: &str, want: impl Fn(&Value) -> bool) -> Value {
        for _ in 0..20 {
            let s = self.snapshot().await;
            if want(&s) {
                return s;
            }
        }
        panic!("no snapshot showed {what}");
    }
}

fn ids(deliveries: &[Value]) -> Vec<String> {
    deliveries
        .iter()
        .map(|d| d["deliveryId"].as_str().expect("deliveryId").to_owned())
        .collect()
}

// ----- the OpenAPI documents and the routers -----

/// Goal: the checked-in documents are what the code generates for the default
/// configuration, so they cannot drift. `UNIMESH_BLESS=1` rewrites them.
#[test]
fn openapi_documents_match_the_checked_in_copies() {
    let config = Config::default();
    for listener in [Listener::Traffic, Listener::Admin] {
        let generated = render_openapi(listener, &config);
        let path = checked_in_path(listener);
        if std::env::var_os("UNIMESH_BLESS").is_some() {
            std::fs::write(&path, &generated).expect("write the document");
            continue;
        }
        let stored = std::fs::read(&path).unwrap_or_default();
        assert!(
            stored == generated,
            "{} differs from what the code generates; run \
             `UNIMESH_BLESS=1 cargo test -p unimesh-shell openapi_documents` and review the diff",
            path.display()
        );
    }
}

/// Goal: the annotations carry the default bounds, so the checked-in document (default
/// configuration) is exactly what the handlers declare.
#[test]
fn the_annotated_bounds_are_the_defaults() {
    for listener in [Listener::Traffic, Listener::Admin] {
        let annotated: Value =
            serde_json::from_slice(&document::render_with(listener, None)).expect("JSON");
        let configured: Value =
            serde_json::from_slice(&render_openapi(listener, &Config::default())).expect("JSON");
        assert_eq!(annotated, configured, "{listener:?}");
    }
}

/// Goal: the bounds written from the configuration are where the annotations put the
/// defaults, so the served document of a changed configuration says what it enforces.
/// Method: render with every bound changed and find each new value in place.
#[test]
fn configured_bounds_reach_the_served_document() {
    let mut config = Config::default();
    config.limits.max_poll_events = 77.try_into().expect("not 0");
    config.limits.max_wait_ms = 7_001;
    config.limits.max_dlq_page = 55.try_into().expect("not 0");
    config.limits.max_ids_per_request = 33.try_into().expect("not 0");
    config.limits.max_batch_events = 22.try_into().expect("not 0");
    config.mesh.max_backoff_ms = 9_009;
    config.mesh.max_ack_timeout_ms = std::num::NonZeroU64::new(8_008).expect("not zero");
    config.mesh.max_attempts = std::num::NonZeroU32::new(44).expect("not zero");
    config.mesh.max_in_flight_per_client = std::num::NonZeroU32::new(66).expect("not zero");
    let t: Value =
        serde_json::from_slice(&render_openapi(Listener::Traffic, &config)).expect("JSON");
    let a: Value = serde_json::from_slice(&render_openapi(Listener::Admin, &config)).expect("JSON");
    let poll = &t["paths"]["/v1/subscriptions/{group}/events"]["get"]["parameters"];
    let param = |name: &str| {
        poll.as_array()
            .and_then(|ps| ps.iter().find(|p| p["name"] == name))
            .map(|p| p["schema"]["maximum"].clone())
    };
    assert_eq!(param("max"), Some(json!(77)));
    assert_eq!(param("waitMs"), Some(json!(7_001)));
    let dlq = &a["paths"]["/admin/dlq/{group}"]["get"]["parameters"][1]["schema"]["maximum"];
    assert_eq!(dlq, &json!(55));
    let s = &t["components"]["schemas"];
    assert_eq!(s["AckBody"]["properties"]["deliveryIds"]["maxItems"], 33);
    assert_eq!(s["NackBody"]["properties"]["delayMs"]["maximum"], 9_009);
    assert_eq!(s["ExtendBody"]["properties"]["extendMs"]["maximum"], 8_008);
    assert_eq!(
        s["SubscriptionDoc"]["properties"]["ackTimeoutMs"]["maximum"],
        8_008
    );
    assert_eq!(
        s["SubscriptionDoc"]["properties"]["maxAttempts"]["maximum"],
        44
    );
    assert_eq!(
        s["SubscriptionDoc"]["properties"]["maxInFlightPerClient"]["maximum"],
        66
    );
    assert_eq!(s["BackoffDoc"]["properties"]["maxMs"]["maximum"], 9_009);
    assert_eq!(s["CloudEventBatch"]["maxItems"], 22);
    let mut config = Config::default();
    config.push.allowed_hosts = "127.0.0.1, hooks.example".to_owned();
    let t: Value =
        serde_json::from_slice(&render_openapi(Listener::Traffic, &config)).expect("JSON");
    let pattern = t["components"]["schemas"]["PushDoc"]["properties"]["url"]["pattern"]
        .as_str()
        .expect("a pattern");
    let re = regex::Regex::new(pattern).expect("compiles");
    assert!(re.is_match("http://127.0.0.1:9000/in?x=1"));
    assert!(re.is_match("https://hooks.example/in"));
    assert!(!re.is_match("http://127.0.0.2/in"), "{pattern}");
    assert!(!re.is_match("http://evil.example/in"));
}

/// Goal: response links name their target as OpenAPI spells it, and the target exists.
#[test]
fn links_name_existing_operations() {
    let doc: Value = serde_json::from_slice(&render_openapi(Listener::Traffic, &Config::default()))
        .expect("JSON");
    let ids: Vec<String> = doc["paths"]
        .as_object()
        .expect("paths")
        .values()
        .flat_map(|item| item.as_object().into_iter().flat_map(|o| o.values()))
        .filter_map(|op| op["operationId"].as_str().map(str::to_owned))
        .collect();
    let links = doc["paths"]["/v1/subscriptions/{group}"]["put"]["responses"]["201"]["links"]
        .as_object()
        .expect("links");
    assert!(!links.is_empty());
    for (name, link) in links {
        let target = link["operationId"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: {link}"));
        assert!(ids.iter().any(|id| id == target), "{name} -> {target}");
        assert!(link.get("operation_id").is_none());
    }
}

/// Goal: the two APIs are apart: no admin operation in the traffic document, no traffic
/// operation in the admin one, and each operation describes its answers.
#[test]
fn each_listener_documents_its_own_routes() {
    let traffic = routes::operations(Listener::Traffic);
    let admin = routes::operations(Listener::Admin);
    assert!(
        traffic
            .iter()
            .all(|(_, p)| !p.starts_with("/admin") && p != "/metrics"),
        "{traffic:?}"
    );
    assert!(
        admin.iter().all(|(_, p)| !p.starts_with("/v1/")),
        "{admin:?}"
    );
    for listener in [Listener::Traffic, Listener::Admin] {
        let doc: Value =
            serde_json::from_slice(&render_openapi(listener, &Config::default())).expect("JSON");
        assert!(doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")));
        for (method, path) in routes::operations(listener) {
            let op = &doc["paths"][&path][method.as_str().to_ascii_lowercase()];
            let responses = op["responses"].as_object().expect("responses");
            assert!(
                ["200", "201", "101"]
                    .iter()
                    .any(|s| responses.contains_key(*s)),
                "{method} {path} documents no success"
            );
            assert!(
                responses.keys().any(|s| s.starts_with('4')),
                "{method} {path} documents no refusal"
            );
        }
    }
}

/// Goal: no documented route falls through to the 404 or 405 of the router on its
/// listener, and none answers the internal error. Method: call each with placeholder
/// names and no body.
#[tokio::test]
async fn every_documented_route_reaches_its_handler() {
    let rig = rig().await;
    for listener in [Listener::Traffic, Listener::Admin] {
        for (method, path) in routes::operations(listener) {
            let uri = path
                .split('/')
                .map(|seg| if seg.starts_with('{') { "x" } else { seg })
                .collect::<Vec<_>>()
                .join("/");
            let a = rig
                .call(listener, method.clone(), &uri, &[], Bytes::new())
                .await;
            assert_ne!(
                a.status,
                StatusCode::INTERNAL_SERVER_ERROR,
                "{method} {path} on {listener:?}: {}",
                String::from_utf8_lossy(&a.body)
            );
            let code = serde_json::from_slice::<Value>(&a.body)
                .ok()
                .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_owned));
            assert!(
                a.status != StatusCode::METHOD_NOT_ALLOWED && code.as_deref() != Some("not-found"),
                "{method} {path} on {listener:?} did not reach its handler: {code:?}"
            );
        }
    }
}

/// Goal: each listener serves its own document at `/openapi.json`.
#[tokio::test]
async fn openapi_is_served_on_both_listeners() {
    let rig = rig().await;
    for (listener, title) in [
        (Listener::Traffic, "unimesh traffic API"),
        (Listener::Admin, "unimesh admin API"),
    ] {
        let a = rig
            .call(listener, Method::GET, "/openapi.json", &[], Bytes::new())
            .await;
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.json()["info"]["title"], title);
    }
}

/// Goal: every query type lists exactly the parameters it documents.
#[test]
fn query_types_name_their_documented_parameters() {
    use utoipa::IntoParams;
    fn names<T: IntoParams>() -> Vec<String> {
        T::into_params(|| None)
            .into_iter()
            .map(|p| p.name)
            .collect()
    }
    use super::extract::QueryParams;
    assert_eq!(names::<traffic::PollQuery>(), traffic::PollQuery::NAMES);
    assert_eq!(names::<admin::OffsetsQuery>(), admin::OffsetsQuery::NAMES);
    assert_eq!(names::<admin::DlqQuery>(), admin::DlqQuery::NAMES);
}

// ----- traffic -----

/// Goal: the three publish modes, long-poll and ACK work end to end through HTTP.
#[tokio::test]
async fn publish_in_each_mode_poll_and_ack() {
    let rig = rig().await;
    let a = rig.subscribe("g", json!({"topic": "orders"})).await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.json());
    assert_eq!(a.json()["group"], "g");
    assert_eq!(a.json()["topic"], "orders");
    assert_eq!(a.json()["maxAttempts"], 16, "defaults are spelled out");

    let binary = rig
        .call(
            Listener::Traffic,
            Method::POST,
            "/v1/topics/orders/events",
            &[
                ("ce-specversion", "1.0"),
                ("ce-id", "b1"),
                ("ce-source", "/test"),
                ("ce-type", "t.e"),
                ("content-type", "text/plain"),
            ],
            "hello",
        )
        .await;
    assert_eq!(binary.status, StatusCode::OK, "{}", binary.json());
    let r = &binary.json()["results"][0];
    assert_eq!(r["id"], "b1");
    assert!(r["partition"].is_u64() && r["offset"].is_u64(), "{r}");

    let structured = rig.publish_structured("orders", "s1").await;
    assert_eq!(structured.status, StatusCode::OK, "{}", structured.json());

    let batch = json!([
        {"specversion": "1.0", "id": "k1", "source": "/test", "type": "t.e"},
        {"specversion": "1.0", "id": "k2", "source": "/test", "type": "t.e"},
    ]);
    let a = rig
        .call(
            Listener::Traffic,
            Method::POST,
            "/v1/topics/orders/events",
            &[("content-type", "application/cloudevents-batch+json")],
            batch.to_string(),
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.json());
    let results = a.json()["results"].as_array().expect("results").clone();
    assert_eq!(
        results.iter().map(|r| r["id"].clone()).collect::<Vec<_>>(),
        vec![json!("k1"), json!("k2")]
    );

    let got = rig.take("g", "c1", 4).await;
    assert_eq!(got.len(), 4);
    let mut seen: Vec<String> = got
        .iter()
        .map(|d| d["event"]["id"].as_str().expect("event id").to_owned())
        .collect();
    seen.sort();
    assert_eq!(seen, vec!["b1", "k1", "k2", "s1"]);
    for d in &got {
        assert_eq!(d["attempt"], 1);
        let e = &d["event"];
        let partition: u64 = e["emmqpartition"]
            .as_str()
            .expect("string")
            .parse()
            .expect("number");
        let offset: u64 = e["emmqoffset"]
            .as_str()
            .expect("string")
            .parse()
            .expect("number");
        assert!(partition < 2, "{e}");
        assert!(offset < 4, "{e}");
    }
    let binary_event = got.iter().find(|d| d["event"]["id"] == "b1").expect("b1");
    assert_eq!(binary_event["event"]["data"], "hello");

    let all = ids(&got);
    let a = rig.settle("g", "ack", json!({"deliveryIds": all})).await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.json());
    assert_eq!(a.json(), json!({"acked": 4, "rejected": []}));

    // ACK again, mixed with garbage: per-id answers, the rest still settled.
    let a = rig
        .settle("g", "ack", json!({"deliveryIds": [all[0], "not-an-id", 7]}))
        .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(
        a.json(),
        json!({"acked": 0, "rejected": [
            {"deliveryId": all[0], "reason": "already-done"},
            {"deliveryId": "not-an-id", "reason": "malformed"},
            {"deliveryId": "7", "reason": "malformed"},
        ]})
    );

    let a = rig
        .traffic(Method::GET, "/v1/subscriptions/g", Value::Null)
        .await;
    assert_eq!(a.status, StatusCode::OK);
    let info = a.json();
    assert_eq!(info["lag"], 0, "{info}");
    assert_eq!(info["stats"]["acked"], 4, "{info}");
    assert_eq!(
        info["partitions"].as_array().map(Vec::len),
        Some(2),
        "{info}"
    );
}

#[tokio::test]
async fn nack_and_extend_answer_per_id() {
    let rig = rig().await;
    rig.subscribe(
        "g",
        json!({"topic": "t", "backoff": {"initialMs": 0, "maxMs": 0, "multiplier": 1.0}}),
    )
    .await;
    rig.publish_structured("t", "e1").await;
    let got = rig.take("g", "c", 1).await;
    let id = ids(&got).remove(0);

    let a = rig
        .settle(
            "g",
            "extend",
            json!({"deliveryIds": [id], "extendMs": 60000}),
        )
        .await;
    assert_eq!(a.json(), json!({"acked": 1, "extended": 1, "rejected": []}));
    let a = rig
        .settle(
            "g",
            "nack",
            json!({"deliveryIds": [id, "1.2"], "delayMs": 0}),
        )
        .await;
    assert_eq!(
        a.json(),
        json!({"acked": 1, "nacked": 1, "rejected": [{"deliveryId": "1.2", "reason": "malformed"}]})
    );
    let again = rig.take("g", "c", 1).await;
    assert_eq!(again[0]["attempt"], 2, "a NACKed delivery comes again");
    assert_eq!(again[0]["event"]["id"], "e1");
}

#[tokio::test]
async fn subscription_update_delete_and_conflict() {
    let rig = rig().await;
    assert_eq!(
        rig.subscribe("g", json!({"topic": "a"})).await.status,
        StatusCode::CREATED
    );
    let a = rig
        .subscribe("g", json!({"topic": "a", "maxAttempts": 3}))
        .await;
    assert_eq!(a.status, StatusCode::OK, "an update is 200");
    assert_eq!(a.json()["maxAttempts"], 3);
    let a = rig.subscribe("g", json!({"topic": "b"})).await;
    a.error(409, "conflict", "topic");
    let b = unimesh_core::TopicName::new("b").expect("valid");
    assert_eq!(
        engine::LogPort::partitions(&rig.log, b).await,
        None,
        "a refused subscription creates no topic"
    );
    let a = rig
        .traffic(Method::DELETE, "/v1/subscriptions/g", Value::Null)
        .await;
    assert_eq!(a.status, StatusCode::OK);
    assert_eq!(a.json(), json!({"group": "g", "deleted": true}));
    let a = rig
        .traffic(Method::GET, "/v1/subscriptions/g", Value::Null)
        .await;
    a.error(404, "unknown-group", "g");
}

// ----- bad input -----

#[tokio::test]
async fn bad_routes_methods_and_names() {
    let rig = rig().await;
    let a = rig.traffic(Method::GET, "/v1/nothing", Value::Null).await;
    a.error(404, "not-found", "/v1/nothing");
    let a = rig.traffic(Method::GET, "/metrics", Value::Null).await;
    a.error(404, "not-found", "/metrics");
    let a = rig
        .traffic(Method::POST, "/v1/subscriptions/g", Value::Null)
        .await;
    a.error(405, "method-not-allowed", "POST");
    assert_eq!(a.headers["allow"], "PUT, GET, DELETE");
    let a = rig.subscribe("bad%20name", json!({"topic": "t"})).await;
    a.error(400, "invalid-name", "group");
    let a = rig.publish_structured("a:b", "x").await;
    a.error(400, "invalid-name", "topic");
    let long = "x".repeat(201);
    let a = rig
        .traffic(
            Method::GET,
            &format!("/v1/subscriptions/{long}"),
            Value::Null,
        )
        .await;
    a.error(400, "invalid-name", "200");
}

#[tokio::test]
async fn bad_poll_parameters_are_named() {
    let rig = rig().await;
    rig.subscribe("g", json!({"topic": "t"})).await;
    let cases = [
        ("?max=1", "client is required"),
        (
            "?client=c&max=0",
            "max must be an integer between 1 and 1000",
        ),
        (
            "?client=c&max=1001",
            "max must be an integer between 1 and 1000",
        ),
        (
            "?client=c&waitMs=60001",
            "waitMs must be an integer between 0 and 60000",
        ),
        ("?client=c&waitMs=soon", "waitMs"),
        ("?client=c&colour=red", "colour"),
        ("?client=c&client=d", "more than once"),
    ];
    for (query, needle) in cases {
        let a = rig
            .traffic(
                Method::GET,
                &format!("/v1/subscriptions/g/events{query}"),
                Value::Null,
            )
            .await;
        a.error(400, "invalid-query", needle);
    }
    let a = rig
        .traffic(
            Method::GET,
            "/v1/subscriptions/g/events?client=a%2Fb",
            Value::Null,
        )
        .await;
    a.error(400, "invalid-name", "client");
    let a = rig
        .traffic(
            Method::GET,
            "/v1/subscriptions/nope/events?client=c&waitMs=0",
            Value::Null,
        )
        .await;
    a.error(404, "unknown-group", "nope");
}

#[tokio::test]
async fn bad_json_bodies_change_nothing() {
    let rig = rig().await;
    let a = rig
        .call(
            Listener::Traffic,
            Method::PUT,
            "/v1/subscriptions/g",
            &[("content-type", "application/json")],
            "{\"topic\": ",
        )
        .await;
    a.error(400, "invalid-json", "JSON");
    let a = rig
        .subscribe("g", json!({"topic": "t", "colour": "red"}))
        .await;
    a.error(400, "invalid-subscription", "colour");
    let a = rig
        .subscribe("g", json!({"topic": "t", "backoff": {"multiplier": 0.5}}))
        .await;
    a.error(400, "invalid-subscription", "backoff.multiplier");
    let a = rig
        .call(
            Listener::Traffic,
            Method::PUT,
            "/v1/subscriptions/g",
            &[("content-type", "text/plain")],
            "{\"topic\":\"t\"}",
        )
        .await;
    a.error(415, "unsupported-media-type", "text/plain");
    let a = rig
        .traffic(Method::GET, "/v1/subscriptions/g", Value::Null)
        .await;
    a.error(404, "unknown-group", "g");

    rig.subscribe("g", json!({"topic": "t"})).await;
    let a = rig
        .settle("g", "ack", json!({"deliveryIds": [], "delayMs": 5}))
        .await;
    a.error(400, "invalid-json", "delayMs");
    let a = rig.settle("g", "ack", json!({"ids": []})).await;
    a.error(400, "invalid-json", "ids");
    let a = rig
        .settle("g", "ack", json!({"deliveryIds": "1.1.1.1.1"}))
        .await;
    a.error(400, "invalid-json", "sequence");
    let a = rig.settle("g", "ack", Value::Null).await;
    a.error(400, "invalid-json", "empty");
    let many: Vec<String> = (0..9).map(|i| format!("1.1.0.{i}.1")).collect();
    let a = rig.settle("g", "ack", json!({ "deliveryIds": many })).await;
    a.error(413, "too-large", "limit of 8");
    let a = rig
        .settle("g", "extend", json!({"deliveryIds": [], "extendMs": 0}))
        .await;
    a.error(400, "invalid-request", "extendMs");
    let a = rig
        .settle("nope", "ack", json!({"deliveryIds": ["1.1.0.0.1"]}))
        .await;
    a.error(404, "unknown-group", "nope");
}

#[tokio::test]
async fn bad_publishes_are_refused_whole() {
    let rig = rig().await;
    rig.subscribe("g", json!({"topic": "t"})).await;
    let a = rig
        .call(
            Listener::Traffic,
            Method::POST,
            "/v1/topics/t/events",
            &[("content-type", "application/cloudevents+json")],
            json!({"specversion": "1.0", "id": "x", "type": "t.e"}).to_string(),
        )
        .await;
    a.error(400, "invalid-cloudevent", "source");
    let a = rig
        .call(
            Listener::Traffic,
            Method::POST,
            "/v1/topics/t/events",
            &[("content-type", "application/cloudevents-batch+json")],
            json!([
                {"specversion": "1.0", "id": "ok", "source": "/s", "type": "t.e"},
                {"specversion": "0.3", "id": "bad", "source": "/s", "type": "t.e"},
            ])
            .to_string(),
        )
        .await;
    a.error(400, "invalid-cloudevent", "event 1");
    let a = rig
        .call(
            Listener::Traffic,
            Method::POST,
            "/v1/topics/t/events",
            &[("content-type", "application/cloudevents+xml")],
            "<event/>",
        )
        .await;
    a.error(415, "unsupported-media-type", "cloudevents+xml");
    let big = "x".repeat(70 * 1024);
    let a = rig
        .call(
            Listener::Traffic,
            Method::POST,
            "/v1/topics/t/events",
            &[
                ("content-type", "application/cloudevents+json"),
                ("content-length", &big.len().to_string()),
            ],
            big,
        )
        .await;
    a.error(413, "too-large", "65536");
    assert_eq!(a.headers["connection"], "close");
    // Nothing of the refused requests was stored.
    let a = rig
        .traffic(
            Method::GET,
            "/v1/subscriptions/g/events?client=c&waitMs=100",
            Value::Null,
        )
        .await;
    assert_eq!(a.json(), json!([]));
}

// ----- admin -----

#[tokio::test]
async fn admin_views_and_levers() {
    let rig = rig().await;
    let a = rig.admin(Method::GET, "/admin/health", Value::Null).await;
    assert_eq!(
        (a.status, a.json()),
        (StatusCode::OK, json!({"status": "ok"}))
    );
    let a = rig.admin(Method::GET, "/admin/ready", Value::Null).await;
    assert_eq!(
        (a.status, a.json()),
        (StatusCode::OK, json!({"status": "ready"}))
    );

    rig.subscribe("g", json!({"topic": "t", "maxAttempts": 1}))
        .await;
    rig.publish_structured("t", "e1").await;
    rig.publish_structured("t", "e2").await;
    let got = rig.take("g", "c", 2).await;
    assert_eq!(got.len(), 2);

    let a = rig
        .admin(Method::GET, "/admin/subscriptions", Value::Null)
        .await;
    let subs = a.json();
    assert_eq!(subs["subscriptions"][0]["group"], "g", "{subs}");
    assert_eq!(subs["subscriptions"][0]["inFlight"], 2, "{subs}");

    let a = rig.admin(Method::GET, "/admin/clients", Value::Null).await;
    let clients = a.json();
    assert_eq!(clients["clients"][0]["client"], "c", "{clients}");
    assert_eq!(clients["clients"][0]["inFlight"], 2, "{clients}");

    let a = rig
        .admin(Method::GET, "/admin/offsets?topic=t", Value::Null)
        .await;
    let rows = a.json();
    let rows = rows["offsets"].as_array().expect("offsets");
    assert_eq!(rows.len(), 2);
    let end: u64 = rows.iter().map(|r| r["end"].as_u64().expect("end")).sum();
    assert_eq!(end, 2);
    let p0_end = rows
        .iter()
        .find(|r| r["partition"] == 0)
        .and_then(|r| r["end"].as_u64())
        .expect("partition 0");
    let a = rig.admin(Method::GET, "/admin/offsets", Value::Null).await;
    a.error(400, "invalid-query", "topic is required");

    // NACK with one allowed attempt: both dead-lettered, browsed, replayed.
    let a = rig
        .settle("g", "nack", json!({"deliveryIds": ids(&got)}))
        .await;
    assert_eq!(a.json()["nacked"], 2);
    let mut entries = Vec::new();
    for _ in 0..100 {
        let a = rig
            .admin(Method::GET, "/admin/dlq/g?max=10", Value::Null)
            .await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.json());
        entries = a.json()["entries"].as_array().expect("entries").clone();
        if entries.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(entries.len(), 2, "both records reach the DLQ");
    assert_eq!(entries[0]["reason"], "nacked");
    assert!(
        entries[0]["event"]["emmqoffset"].is_string(),
        "{}",
        entries[0]
    );
    let a = rig
        .admin(Method::GET, "/admin/dlq/g?max=0", Value::Null)
        .await;
    a.error(400, "invalid-query", "max");
    let a = rig
        .admin(Method::POST, "/admin/dlq/g/replay?max=1", Value::Null)
        .await;
    assert_eq!(a.json(), json!({"group": "g", "replayed": 1}));
    let back = rig.take("g", "c", 1).await;
    assert_eq!(back.len(), 1, "the replayed record is delivered again");

    let a = rig
        .admin(
            Method::POST,
            "/admin/subscriptions/g/seek",
            json!({"partition": 0, "offset": 0}),
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.json());
    let a = rig
        .admin(
            Method::POST,
            "/admin/subscriptions/g/seek",
            json!({"partition": 0}),
        )
        .await;
    a.error(400, "invalid-json", "\"offset\"");
    let (request, json_) = ("invalid-request", "invalid-json");
    for (body, code, needle) in [
        (
            json!({"partition": 0, "offset": 0, "time": "2024-01-01T00:00:00Z"}),
            json_,
            "not both",
        ),
        (
            json!({"partition": 0, "time": "yesterday"}),
            request,
            "\"time\" is not an RFC 3339",
        ),
        (
            json!({"partition": 0, "time": "2024-01-01T00:00:00"}),
            request,
            "\"time\"",
        ),
        (json!({"partition": 0, "time": 5}), json_, "\"time\""),
        (json!({"partition": 0, "offset": "0"}), json_, "\"offset\""),
        (
            json!({"partition": -1, "offset": 0}),
            json_,
            "\"partition\"",
        ),
        (json!({"partition": 0, "offset": 0, "at": 1}), json_, "at"),
    ] {
        let a = rig
            .admin(Method::POST, "/admin/subscriptions/g/seek", body.clone())
            .await;
        a.error(400, code, needle);
    }
    // Before every record (and before 1970): the earliest; far after: the end. Lowercase
    // `t`/`z` and an offset are RFC 3339 too.
    for (time, offset) in [
        ("1969-12-31T23:59:59Z", 0),
        ("2000-01-01t00:00:00.5z", 0),
        ("9999-12-31T23:59:59+01:00", p0_end),
    ] {
        let a = rig
            .admin(
                Method::POST,
                "/admin/subscriptions/g/seek",
                json!({"partition": 0, "time": time}),
            )
            .await;
        assert_eq!(
            a.json(),
            json!({"group": "g", "partition": 0, "offset": offset, "time": time}),
            "{time}"
        );
    }

    let a = rig
        .admin(Method::POST, "/admin/clients/c/evict", Value::Null)
        .await;
    assert_eq!(a.json(), json!({"client": "c", "groups": 1}));
}

#[tokio::test]
async fn rate_limit_answers_429_with_retry_after() {
    let rig = rig().await;
    let a = rig
        .admin(
            Method::PUT,
            "/admin/ratelimit",
            json!({"topic": "t", "eventsPerSecond": 1, "burst": 1}),
        )
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.json());
    let a = rig
        .admin(
            Method::PUT,
            "/admin/ratelimit",
            json!({"topic": "t", "eventsPerSecond": 0, "burst": 1}),
        )
        .await;
    a.error(400, "invalid-request", "eventsPerSecond");
    assert_eq!(
        rig.publish_structured("t", "1").await.status,
        StatusCode::OK
    );
    let a = rig.publish_structured("t", "2").await;
    a.error(429, "rate-limited", "retry");
    let retry: u64 = a.headers["retry-after"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!(retry >= 1);
}

#[tokio::test]
async fn metrics_carry_engine_numbers() {
    let rig = rig().await;
    rig.subscribe("g", json!({"topic": "t"})).await;
    rig.publish_structured("t", "e1").await;
    let got = rig.take("g", "c", 1).await;
    rig.settle("g", "ack", json!({"deliveryIds": ids(&got)}))
        .await;
    let a = rig.admin(Method::GET, "/metrics", Value::Null).await;
    assert_eq!(a.status, StatusCode::OK);
    assert!(a.headers["content-type"]
        .to_str()
        .expect("ascii")
        .starts_with("application/openmetrics-text"));
    let text = String::from_utf8(a.body.to_vec()).expect("utf-8");
    for needle in [
        "unimesh_published_total{topic=\"t\"} 1",
        "unimesh_delivered_total{group=\"g\"} 1",
        "unimesh_acked_total 1",
        "unimesh_nacked_total 0",
        "unimesh_redelivered_total 0",
        "unimesh_dead_lettered_total 0",
        "unimesh_expired_total 0",
        "unimesh_in_flight{group=\"g\",partition=\"0\"}",
        "unimesh_lag{group=\"g\",partition=\"1\"}",
        "unimesh_publish_latency_seconds_count 1",
        "unimesh_http_request_duration_seconds_count{route=\"GET /v1/subscriptions/{group}/events\"}",
    ] {
        assert!(text.contains(needle), "{needle} missing from\n{text}");
    }

    // Deleting the group keeps its counts in the totals: a counter never goes down.
    let a = rig
        .traffic(Method::DELETE, "/v1/subscriptions/g", Value::Null)
        .await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.json());
    let a = rig.admin(Method::GET, "/metrics", Value::Null).await;
    let text = String::from_utf8(a.body.to_vec()).expect("utf-8");
    assert!(text.contains("unimesh_acked_total 1"), "{text}");
    assert!(!text.contains("group=\"g\""), "{text}");
}

#[tokio::test]
async fn after_engine_shutdown_requests_are_503_and_not_ready() {
    let rig = rig().await;
    rig.app.engine.shutdown().await.expect("shuts down");
    let a = rig.subscribe("g", json!({"topic": "t"})).await;
    a.error(503, "unavailable", "");
    assert!(a.headers.contains_key("retry-after"));
}

#[tokio::test]
async fn a_log_that_refuses_appends_makes_health_fail_with_the_reason() {
    let rig = rig().await;
    rig.subscribe("g", json!({"topic": "t"})).await;
    let a = rig.publish_structured("t", "before").await;
    assert_eq!(a.status, StatusCode::OK, "{}", a.json());
    rig.log
        .set_fault(Some("a log write failed: disk full".to_owned()));

    let a = rig.admin(Method::GET, "/admin/health", Value::Null).await;
    a.error(
        503,
        "unavailable",
        "unhealthy: a log write failed: disk full",
    );
    let a = rig.admin(Method::GET, "/admin/ready", Value::Null).await;
    a.error(
        503,
        "unavailable",
        "not ready: a log write failed: disk full",
    );
    let a = rig.publish_structured("t", "refused").await;
    a.error(503, "unavailable", "disk full");
    // What was accepted before the fault is still delivered.
    let got = rig.take("g", "c", 1).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0]["event"]["id"], "before");

    rig.log.set_fault(None);
    let a = rig.admin(Method::GET, "/admin/health", Value::Null).await;
    assert_eq!(a.status, StatusCode::OK);
    let a = rig.admin(Method::GET, "/admin/ready", Value::Null).await;
    assert_eq!(a.status, StatusCode::OK);
}

// ----- the listeners -----

/// Sends raw HTTP/1.1 and reads until the server closes or `Content-Length` is complete.
async fn raw(addr: std::net::SocketAddr, request: &[u8]) -> (u16, String, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(request).await.expect("write");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = s.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().to_owned())
                })
                .and_then(|v| v.parse::<usize>().ok());
            if len.is_some_and(|len| body.len() >= len) {
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head.to_owned(), body.to_owned())
}

/// Goal: both listeners serve their own routes over real sockets, an oversized body that
/// the client is still sending gets a readable 413, and shutdown ends the accept loop.
#[tokio::test]
async fn listeners_serve_and_shut_down() {
    let rig = rig().await;
    let settings = crate::config::Server {
        shutdown_grace_ms: 2_000,
        ..crate::config::Server::default()
    };
    let server = Server::bind(
        "127.0.0.1:0".parse().expect("addr"),
        "127.0.0.1:0".parse().expect("addr"),
        settings,
    )
    .await
    .expect("binds");
    let traffic = server.traffic_addr().expect("addr");
    let admin = server.admin_addr().expect("addr");
    assert_ne!(traffic, admin);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let app = rig.app.clone();
    let running = tokio::spawn(server.run(app, async {
        let _ = stop_rx.await;
    }));

    let (status, _, body) = raw(
        admin,
        b"GET /admin/health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!((status, body.as_str()), (200, "{\"status\":\"ok\"}"));
    let (status, _, _) = raw(
        traffic,
        b"GET /admin/health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 404, "admin routes are not on the traffic listener");

    let big = vec![b'x'; 200 * 1024];
    let mut req = format!(
        "POST /v1/topics/t/events HTTP/1.1\r\nhost: x\r\ncontent-type: application/cloudevents+json\r\ncontent-length: {}\r\n\r\n",
        big.len()
    )
    .into_bytes();
    req.extend_from_slice(&big);
    let (status, head, body) = raw(traffic, &req).await;
    assert_eq!(status, 413, "{head}\n{body}");
    assert!(body.contains("too-large"), "{body}");

    stop_tx.send(()).expect("server still running");
    let draining = running.await.expect("accept loop ends");
    assert_eq!(draining.finish().await, 0, "no connection left open");
    assert!(
        tokio::net::TcpStream::connect(traffic).await.is_err(),
        "the listener is closed"
    );
}

// ----- the web console -----

fn group<'a>(snapshot: &'a Value, name: &str) -> &'a Value {
    snapshot["groups"]
        .as_array()
        .and_then(|gs| gs.iter().find(|g| g["group"] == name))
        .unwrap_or(&Value::Null)
}

/// Goal: the console's feed sends the current snapshot at once, then a new one when
/// something changes — a publish moves the lag, a NACK past the last attempt writes a dead
/// letter (the DLQ change count moves), a rate rule, a client — and nothing while nothing
/// changes. Method: one watcher over the in-process admin router, a feed that refreshes only
/// when told of a change; each step waits for the snapshot that shows it.
#[tokio::test]
async fn the_console_feed_sends_a_snapshot_when_something_changed() {
    let rig = console_rig().await;
    let a = rig
        .subscribe(
            "g",
            json!({"topic": "t", "maxAttempts": 1, "startFrom": "earliest"}),
        )
        .await;
    assert!(a.status.is_success(), "{}", a.json());
    let mut feed = rig.feed(&[]).await;
    let first = feed.snapshot().await;
    assert_eq!(first["health"], json!({"ok": true}), "{first}");
    assert_eq!(group(&first, "g")["lag"], 0, "{first}");
    assert_eq!(group(&first, "g")["dlqChanges"], 0, "{first}");
    assert_eq!(first["rateLimits"], json!([]), "{first}");

    rig.publish_structured("t", "e1").await;
    let s = feed
        .until("the lag of the publish", |s| group(s, "g")["lag"] == 1)
        .await;
    assert_eq!(
        group(&s, "g")["partitions"].as_array().map(Vec::len),
        Some(2),
        "{s}"
    );

    let got = rig.take("g", "c", 1).await;
    let s = feed
        .until("client c with one in flight", |s| {
            s["clients"] == json!([{"group": "g", "client": "c", "credit": 0, "inFlight": 1, "lastActiveMs": s["clients"][0]["lastActiveMs"]}])
        })
        .await;
    assert_eq!(group(&s, "g")["inFlight"], 1, "{s}");
    rig.settle("g", "nack", json!({"deliveryIds": ids(&got)}))
        .await;
    let s = feed
        .until("the dead letter written", |s| {
            group(s, "g")["dlqChanges"] == 1
        })
        .await;
    assert_eq!(group(&s, "g")["stats"]["deadLettered"], 1, "{s}");

    let a = rig
        .admin(
            Method::PUT,
            "/admin/ratelimit",
            json!({"topic": "t", "eventsPerSecond": 5, "burst": 7}),
        )
        .await;
    assert_eq!(a.status, StatusCode::OK);
    feed.until("the rate rule", |s| {
        s["rateLimits"] == json!([{"topic": "t", "eventsPerSecond": 5, "burst": 7}])
    })
    .await;
    let a = rig
        .admin(Method::GET, "/admin/ratelimit", Value::Null)
        .await;
    assert_eq!(
        a.json(),
        json!({"rules": [{"topic": "t", "eventsPerSecond": 5, "burst": 7}]})
    );

    // Nothing changes: nothing is sent (heartbeats are comments, not events).
    let quiet = tokio::time::timeout(Duration::from_millis(600), feed.next_event()).await;
    assert!(quiet.is_err(), "a snapshot with nothing changed: {quiet:?}");
}

/// Goal: a slow watcher gets the newest snapshot, never a queue of old ones, and a second
/// watcher shares the producer. Method: one watcher reads the first snapshot, then nothing
/// while twenty publishes move the lag; its next snapshot already shows all twenty; a
/// second watcher opened meanwhile starts at the same newest snapshot.
#[tokio::test]
async fn a_slow_console_gets_the_newest_snapshot_not_a_queue() {
    let rig = console_rig().await;
    let a = rig.subscribe("g", json!({"topic": "t"})).await;
    assert!(a.status.is_success(), "{}", a.json());
    let mut slow = rig.feed(&[]).await;
    let first = slow.snapshot().await;
    assert_eq!(group(&first, "g")["lag"], 0);
    for i in 0..20 {
        rig.publish_structured("t", &format!("e{i}")).await;
    }
    let mut other = rig.feed(&[]).await;
    let newest = other
        .until("all twenty", |s| group(s, "g")["lag"] == 20)
        .await;
    let next = slow.snapshot().await;
    assert_eq!(
        group(&next, "g")["lag"],
        20,
        "the slow watcher's next snapshot is the newest: {next} (other saw {newest})"
    );
}

/// Goal: an open console does not hold a shutdown: when the engine stops, the feed sends
/// a last snapshot saying so and ends, and a watcher that comes later gets that snapshot
/// and the end too. Method: a watcher reads the first snapshot; the engine shuts down; its
/// stream shows the engine stopped, then ends (not merely goes quiet).
#[tokio::test]
async fn the_console_feed_ends_when_the_engine_stops() {
    let rig = console_rig().await;
    let mut feed = rig.feed(&[]).await;
    assert_eq!(feed.snapshot().await["health"], json!({"ok": true}));
    rig.app.engine.shutdown().await.expect("engine shutdown");
    let last = feed
        .until("the engine stopped", |s| s["health"]["ok"] == false)
        .await;
    assert_eq!(
        last["health"]["reason"], "the engine task has stopped",
        "{last}"
    );
    let after = feed.next_event().await;
    assert!(after.is_none() && feed.ended, "after the last: {after:?}");
    let mut late = rig.feed(&[]).await;
    assert_eq!(late.snapshot().await, last);
    let after = late.next_event().await;
    assert!(after.is_none() && late.ended, "after the last: {after:?}");
}

/// Goal: the console's page and files are served by the admin listener (not the traffic
/// one), with their types and a policy that keeps the page to its own origin; anything
/// else under /ui is a 404 and another method a 405, in the API's error shape.
#[tokio::test]
async fn the_console_page_and_its_files_are_served_on_the_admin_listener() {
    let rig = rig().await;
    for (path, ty, needle) in [
        (
            "/ui",
            "text/html; charset=utf-8",
            "<title>unimesh console</title>",
        ),
        ("/ui/", "text/html; charset=utf-8", "/ui/console.js"),
        (
            "/ui/console.js",
            "text/javascript; charset=utf-8",
            "EventSource",
        ),
        ("/ui/console.css", "text/css; charset=utf-8", "font"),
    ] {
        let a = rig
            .call(Listener::Admin, Method::GET, path, &[], Bytes::new())
            .await;
        assert_eq!(a.status, StatusCode::OK, "{path}");
        assert_eq!(a.headers["content-type"], ty, "{path}");
        assert!(
            a.headers["content-security-policy"]
                .to_str()
                .is_ok_and(
                    |p| p.contains("default-src 'none'") && p.contains("frame-ancestors 'none'")
                ),
            "{path}"
        );
        assert_eq!(a.headers["x-content-type-options"], "nosniff");
        assert!(String::from_utf8_lossy(&a.body).contains(needle), "{path}");
    }
    let a = rig
        .call(
            Listener::Admin,
            Method::GET,
            "/ui/other.js",
            &[],
            Bytes::new(),
        )
        .await;
    a.error(404, "not-found", "/ui/other.js");
    let a = rig
        .call(Listener::Admin, Method::POST, "/ui", &[], Bytes::new())
        .await;
    a.error(405, "method-not-allowed", "POST");
    let a = rig
        .call(Listener::Traffic, Method::GET, "/ui", &[], Bytes::new())
        .await;
    a.error(404, "not-found", "/ui");
}

/// Goal: with `[auth]` the page and its files stay open (they hold no data) while the feed
/// needs the admin right, by `Authorization` or, for an `EventSource`, the `access_token`
/// query parameter; a token without the right is refused.
#[tokio::test]
async fn with_auth_the_console_feed_needs_the_admin_right_and_its_page_does_not() {
    use sha2::{Digest, Sha256};
    let hash = |t: &str| -> String {
        Sha256::digest(t.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let mut config = test_config();
    for (name, token, admin) in [("ops", "t-ops", true), ("shop", "t-shop", false)] {
        config.auth.identities.insert(
            name.into(),
            crate::config::auth::Identity {
                token_sha256: hash(token),
                publish: vec!["*".into()],
                consume: Vec::new(),
                define: Vec::new(),
                admin,
            },
        );
    }
    let rig = rig_with(config).await;
    let get = |uri: &'static str| rig.call(Listener::Admin, Method::GET, uri, &[], Bytes::new());
    assert_eq!(get("/ui").await.status, StatusCode::OK);
    assert_eq!(get("/ui/console.js").await.status, StatusCode::OK);
    get("/admin/events")
        .await
        .error(401, "unauthorized", "credentials required");
    get("/admin/events?access_token=t-shop")
        .await
        .error(403, "forbidden", "admin");
    get("/admin/events?access_token=t-nope")
        .await
        .error(401, "unauthorized", "not valid");
    // The token as a query parameter is read on the feed only.
    let a = get("/admin/subscriptions?access_token=t-ops").await;
    assert_eq!(a.status, StatusCode::UNAUTHORIZED);
    for headers in [&[][..], &[("authorization", "Bearer t-ops")][..]] {
        let uri = if headers.is_empty() {
            "/admin/events?access_token=t-ops"
        } else {
            "/admin/events"
        };
        let a = rig
            .call(Listener::Admin, Method::GET, uri, headers, Bytes::new())
            .await;
        assert_eq!(a.status, StatusCode::OK, "{uri}");
        assert_eq!(a.json()["health"]["ok"], true, "{uri}");
    }
}

/// Goal: the SSE stream's wire format — `retry:` first, a `:heartbeat` comment when idle,
/// each delivery as `id:` (its delivery id) and `data:` (its JSON), frames that hold whole
/// events only. Method: a stream with a 1,234 ms retry and
/// a 50 ms heartbeat read frame by frame before and after three events are published.
#[tokio::test]
async fn an_sse_stream_sends_retry_heartbeats_and_whole_events_per_frame() {
    let mut config = test_config();
    config.server.stream_retry_ms = 1_234;
    config.server.stream_heartbeat_ms = 50.try_into().expect("not 0");
    let rig = rig_with(config).await;
    let a = rig.subscribe("g", json!({"topic": "t"})).await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.json());
    let req = Request::builder()
        .uri("/v1/subscriptions/g/stream?client=c")
        .body(Full::new(Bytes::new()))
        .expect("request");
    let res = router(Listener::Traffic, rig.app.clone())
        .oneshot(req)
        .await
        .unwrap_or_else(|e| match e {});
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["content-type"], "text/event-stream");
    assert_eq!(res.headers()["cache-control"], "no-cache");
    let mut body = res.into_body();
    assert_eq!(next_frame(&mut body).await, "retry: 1234\n\n");
    let idle = next_frame(&mut body).await;
    assert!(is_heartbeat(&idle), "idle: a comment, not {idle:?}");
    for id in ["e1", "e2", "e3"] {
        let a = rig.publish_structured("t", id).await;
        assert_eq!(a.status, StatusCode::OK, "{}", a.json());
    }
    let mut events = Vec::new();
    while events.len() < 3 {
        let frame = next_frame(&mut body).await;
        if is_heartbeat(&frame) {
            continue;
        }
        assert!(frame.ends_with("\n\n"), "whole events only: {frame:?}");
        for block in frame.trim_end().split("\n\n") {
            let mut lines = block.lines();
            let id = lines.next().and_then(|l| l.strip_prefix("id: "));
            let id = id.unwrap_or_else(|| panic!("id: first in {block:?}"));
            let data: Vec<&str> = lines
                .map(|l| l.strip_prefix("data: ").expect("data"))
                .collect();
            let d: Value = serde_json::from_str(&data.join("\n")).expect("data is JSON");
            assert_eq!(d["deliveryId"], id, "id: is the delivery id");
            events.push(d["event"]["id"].as_str().expect("event id").to_owned());
        }
    }
    events.sort();
    assert_eq!(events, vec!["e1", "e2", "e3"]);
}

/// An SSE comment naming the heartbeat (`: heartbeat`), alone in its frame.
fn is_heartbeat(frame: &str) -> bool {
    frame.starts_with(':')
        && frame.trim_start_matches(':').trim() == "heartbeat"
        && frame.ends_with("\n\n")
}

/// The next frame of a streaming body, as text (within 10 s).
async fn next_frame(body: &mut axum::body::Body) -> String {
    let frame = tokio::time::timeout(Duration::from_secs(10), body.frame())
        .await
        .expect("a frame within 10 s")
        .expect("the stream goes on")
        .expect("infallible");
    let data = frame.into_data().expect("a data frame");
    String::from_utf8(data.to_vec()).expect("UTF-8")
}
