//! Browsers on the traffic listener (issue 19), against the real binary with an HTTP client
//! speaking as a browser does (`Origin`, preflight `OPTIONS`): an allowed origin gets the
//! CORS answers, another origin gets none; a WebSocket upgrade from a page on another
//! origin is refused with 403 before anything is opened, one from an allowed origin (or
//! from no page at all) is served. Without `server.cors_allowed_origins` there is no CORS.

use tungstenite::client::IntoClientRequest as _;
use tungstenite::http::HeaderValue;
use unimesh_tests::{event, json, published, Options, Resp, Server};

const APP: &str = "http://app.example:3000";
const EVIL: &str = "http://evil.example";

fn with_origins(origins: &str) -> Options {
    Options::new().toml(&format!("[server]\ncors_allowed_origins = \"{origins}\"\n"))
}

fn preflight(s: &Server, path: &str, origin: &str, method: &str, headers: &str) -> Resp {
    s.call("OPTIONS", path)
        .header("origin", origin)
        .header("access-control-request-method", method)
        .header("access-control-request-headers", headers)
        .send()
}

fn listed(r: &Resp, name: &str) -> Vec<String> {
    r.header(name)
        .unwrap_or("")
        .split(',')
        .map(|h| h.trim().to_ascii_lowercase())
        .filter(|h| !h.is_empty())
        .collect()
}

/// Goal: a preflight of a binary-mode publish from an allowed page is answered with the
/// origin, the method and the headers it may send (`content-type`, `ce-*`,
/// `authorization`), not with a header outside that set; the same preflight from another
/// origin gets no `Access-Control-Allow-Origin` and no allowed headers. The publish itself
/// then carries the origin back to the allowed page only.
#[test]
fn a_preflight_from_an_allowed_origin_gets_the_headers_and_another_does_not() {
    let s = Server::start(with_origins(&format!("https://other.example, {APP}")));
    let asked = "content-type, ce-id, ce-source, ce-type, ce-specversion, authorization, x-evil";
    let r = preflight(&s, "/v1/topics/t/events", APP, "POST", asked);
    assert!(
        r.status == 200 || r.status == 204,
        "{} {}",
        r.status,
        r.text()
    );
    assert_eq!(r.header("access-control-allow-origin"), Some(APP));
    assert!(listed(&r, "access-control-allow-methods").contains(&"post".to_owned()));
    let allowed = listed(&r, "access-control-allow-headers");
    for h in [
        "content-type",
        "ce-id",
        "ce-source",
        "ce-type",
        "authorization",
    ] {
        assert!(allowed.contains(&h.to_owned()), "{h} not in {allowed:?}");
    }
    assert!(!allowed.contains(&"x-evil".to_owned()), "{allowed:?}");

    let r = preflight(&s, "/v1/topics/t/events", EVIL, "POST", asked);
    assert_eq!(
        r.header("access-control-allow-origin"),
        None,
        "{:?}",
        r.headers
    );
    assert!(
        listed(&r, "access-control-allow-headers").is_empty(),
        "{:?}",
        r.headers
    );

    // An SSE reconnect sends Last-Event-ID.
    let r = preflight(
        &s,
        "/v1/subscriptions/g/stream",
        APP,
        "GET",
        "last-event-id",
    );
    assert_eq!(r.header("access-control-allow-origin"), Some(APP));
    assert_eq!(
        listed(&r, "access-control-allow-headers"),
        vec!["last-event-id"]
    );

    let e = event("c1", "t", json!({"n": 1}));
    let r = s
        .call("POST", "/v1/topics/t/events")
        .header("origin", APP)
        .header("content-type", "application/cloudevents+json")
        .body(e.to_string())
        .send();
    published(&r, 1);
    assert_eq!(r.header("access-control-allow-origin"), Some(APP));
    let r = s
        .call("GET", "/v1/subscriptions/nope")
        .header("origin", EVIL)
        .send();
    r.expect_error(404, "unknown-group");
    assert_eq!(r.header("access-control-allow-origin"), None);
}

/// Goal: without `server.cors_allowed_origins` there is no CORS: a preflight is an
/// ordinary `OPTIONS` (405 in the API's error shape) and answers carry no CORS headers.
#[test]
fn without_origins_there_is_no_cors() {
    let s = Server::start_default();
    let r = preflight(&s, "/v1/topics/t/events", APP, "POST", "content-type");
    r.expect_error(405, "method-not-allowed");
    assert_eq!(r.header("access-control-allow-origin"), None);
}

fn ws_request(s: &Server, origin: Option<&str>) -> tungstenite::handshake::client::Request {
    let url = format!("ws://{}/v1/subscriptions/g/ws?client=page", s.http_addr());
    let mut req = url.into_client_request().expect("a WebSocket request");
    if let Some(o) = origin {
        req.headers_mut().insert(
            "origin",
            HeaderValue::from_str(o).expect("an origin header"),
        );
    }
    req
}

/// Goal: the WebSocket `Origin` is checked against the same list: a page on another origin
/// is refused with 403 and a JSON body naming the origin, and no client is attached
/// (nothing changed); an allowed page and a client that sends no `Origin` are served.
#[test]
fn a_websocket_from_another_origin_is_refused() {
    let s = Server::start(with_origins(APP));
    s.subscribe("g", &json!({"topic": "t"}));
    match tungstenite::connect(ws_request(&s, Some(EVIL))) {
        Err(tungstenite::Error::Http(resp)) => {
            assert_eq!(resp.status().as_u16(), 403);
            let body: serde_json::Value =
                serde_json::from_slice(resp.body().as_deref().unwrap_or(b"")).expect("JSON body");
            assert_eq!(body["error"], "origin-not-allowed", "{body}");
            assert!(
                body["message"].as_str().unwrap_or("").contains(EVIL),
                "{body}"
            );
        }
        Ok(_) => panic!("a page on {EVIL} opened a WebSocket"),
        Err(e) => panic!("unexpected failure: {e}"),
    }
    let clients = s.admin_get("/admin/clients").ok_json(200);
    assert!(
        !clients.to_string().contains("\"page\""),
        "the refused page left a client: {clients}"
    );
    for origin in [Some(APP), None] {
        let (mut ws, resp) = tungstenite::connect(ws_request(&s, origin))
            .unwrap_or_else(|e| panic!("origin {origin:?}: {e}"));
        assert_eq!(resp.status().as_u16(), 101);
        let _ = ws.close(None);
    }
}
