//! The route table of both listeners and the matcher over (method, path segments).
//!
//! One static table is the single source of truth: the matcher, the `Allow` header of a 405,
//! the `route` label of the request-duration histogram and the OpenAPI drift test all read
//! it. A later route (SSE, WebSocket, webhook admin, request/reply) is one more row and one
//! more arm in the dispatcher.

use http::Method;
use percent_encoding::percent_decode_str;

use super::error::ApiError;

/// Which listener a request came in on. Admin routes are not served on the traffic listener
/// (and the reverse), so the admin port can stay private.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Listener {
    Admin,
    Traffic,
}

/// Every route, by what it does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RouteId {
    Ack,
    AdminClients,
    AdminSubscriptions,
    DeleteSubscription,
    DlqBrowse,
    DlqReplay,
    EvictClient,
    Extend,
    GetSubscription,
    Health,
    Metrics,
    Nack,
    Offsets,
    OpenApi,
    Poll,
    Publish,
    PutSubscription,
    RateLimit,
    Ready,
    Seek,
}

pub struct Route {
    pub id: RouteId,
    pub method: Method,
    /// Path template; `{name}` matches one non-empty segment.
    pub pattern: &'static str,
    pub listeners: &'static [Listener],
}

const TRAFFIC: &[Listener] = &[Listener::Traffic];
const ADMIN: &[Listener] = &[Listener::Admin];
const BOTH: &[Listener] = &[Listener::Traffic, Listener::Admin];

macro_rules! routes {
    ($($id:ident $method:ident $pattern:literal $on:ident;)*) => {
        pub static ROUTES: &[Route] = &[
            $(Route { id: RouteId::$id, method: Method::$method, pattern: $pattern, listeners: $on },)*
        ];
    };
}

routes! {
    Publish            POST   "/v1/topics/{topic}/events"               TRAFFIC;
    PutSubscription    PUT    "/v1/subscriptions/{group}"               TRAFFIC;
    GetSubscription    GET    "/v1/subscriptions/{group}"               TRAFFIC;
    DeleteSubscription DELETE "/v1/subscriptions/{group}"               TRAFFIC;
    Poll               GET    "/v1/subscriptions/{group}/events"        TRAFFIC;
    Ack                POST   "/v1/subscriptions/{group}/ack"           TRAFFIC;
    Nack               POST   "/v1/subscriptions/{group}/nack"          TRAFFIC;
    Extend             POST   "/v1/subscriptions/{group}/extend"        TRAFFIC;
    OpenApi            GET    "/openapi.json"                           BOTH;
    Metrics            GET    "/metrics"                                ADMIN;
    Health             GET    "/admin/health"                           ADMIN;
    Ready              GET    "/admin/ready"                            ADMIN;
    AdminSubscriptions GET    "/admin/subscriptions"                    ADMIN;
    Seek               POST   "/admin/subscriptions/{group}/seek"       ADMIN;
    AdminClients       GET    "/admin/clients"                          ADMIN;
    EvictClient        POST   "/admin/clients/{client}/evict"           ADMIN;
    Offsets            GET    "/admin/offsets"                          ADMIN;
    DlqBrowse          GET    "/admin/dlq/{group}"                      ADMIN;
    DlqReplay          POST   "/admin/dlq/{group}/replay"               ADMIN;
    RateLimit          PUT    "/admin/ratelimit"                        ADMIN;
}

impl Route {
    /// The `route` label of metrics: method and template, so label values stay bounded.
    pub fn label(&self) -> String {
        format!("{} {}", self.method, self.pattern)
    }
}

/// Label of requests that matched no route.
pub const UNMATCHED_LABEL: &str = "unmatched";

/// A matched route and the decoded values of its `{name}` segments, in order.
pub struct Matched {
    pub route: &'static Route,
    pub params: Vec<String>,
}

impl Matched {
    /// The path's one parameter (`{topic}` or `{group}`), empty when the route has none.
    pub fn param(&self) -> &str {
        self.params.first().map(String::as_str).unwrap_or_default()
    }
}

/// Finds the route of a request: 404 when no route of this listener has the path, 405 (with
/// the allowed methods) when some have it with another method.
pub fn route(listener: Listener, method: &Method, path: &str) -> Result<Matched, ApiError> {
    let Some(segments) = split(path) else {
        return Err(ApiError::not_found(path));
    };
    let mut allowed: Vec<Method> = Vec::new();
    for r in ROUTES.iter().filter(|r| r.listeners.contains(&listener)) {
        let Some(params) = match_pattern(r.pattern, &segments) else {
            continue;
        };
        if r.method == *method {
            return Ok(Matched { route: r, params });
        }
        if !allowed.contains(&r.method) {
            allowed.push(r.method.clone());
        }
    }
    if allowed.is_empty() {
        Err(ApiError::not_found(path))
    } else {
        Err(ApiError::method_not_allowed(method, path, &allowed))
    }
}

/// Path segments, percent-decoded. `None` for a path that cannot match any route (empty
/// segments, e.g. a trailing or doubled slash).
fn split(path: &str) -> Option<Vec<String>> {
    let rest = path.strip_prefix('/')?;
    rest.split('/')
        .map(|s| {
            if s.is_empty() {
                None
            } else {
                Some(percent_decode_str(s).decode_utf8_lossy().into_owned())
            }
        })
        .collect()
}

fn match_pattern(pattern: &str, segments: &[String]) -> Option<Vec<String>> {
    let parts: Vec<&str> = pattern.trim_start_matches('/').split('/').collect();
    if parts.len() != segments.len() {
        return None;
    }
    let mut params = Vec::new();
    for (part, seg) in parts.iter().zip(segments) {
        if part.starts_with('{') && part.ends_with('}') {
            params.push(seg.clone());
        } else if part != seg {
            return None;
        }
    }
    Some(params)
}

#[cfg(test)]
mod tests {
    use http::StatusCode;

    use super::*;

    #[test]
    fn matches_routes_and_extracts_params() {
        let m = route(
            Listener::Traffic,
            &Method::GET,
            "/v1/subscriptions/g1/events",
        )
        .expect("matches");
        assert_eq!(m.route.id, RouteId::Poll);
        assert_eq!(m.params, vec!["g1".to_owned()]);
        let m = route(
            Listener::Traffic,
            &Method::POST,
            "/v1/topics/orders.v1/events",
        )
        .expect("matches");
        assert_eq!(m.route.id, RouteId::Publish);
        assert_eq!(m.params, vec!["orders.v1".to_owned()]);
        let m =
            route(Listener::Admin, &Method::POST, "/admin/clients/c%2D1/evict").expect("matches");
        assert_eq!(m.route.id, RouteId::EvictClient);
        assert_eq!(
            m.params,
            vec!["c-1".to_owned()],
            "segments are percent-decoded"
        );
    }

    #[test]
    fn same_path_different_methods() {
        for (method, id) in [
            (Method::PUT, RouteId::PutSubscription),
            (Method::GET, RouteId::GetSubscription),
            (Method::DELETE, RouteId::DeleteSubscription),
        ] {
            let m = route(Listener::Traffic, &method, "/v1/subscriptions/g").expect("matches");
            assert_eq!(m.route.id, id);
        }
    }

    #[test]
    fn wrong_method_is_405_with_allow() {
        let e = route(Listener::Traffic, &Method::POST, "/v1/subscriptions/g")
            .err()
            .expect("refused");
        assert_eq!(e.status, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(e.allow.as_deref(), Some("PUT, GET, DELETE"));
        let e = route(Listener::Admin, &Method::GET, "/admin/ratelimit")
            .err()
            .expect("refused");
        assert_eq!(e.allow.as_deref(), Some("PUT"));
    }

    #[test]
    fn unknown_paths_are_404() {
        for path in [
            "/",
            "",
            "/v1",
            "/v1/subscriptions/g/",
            "/v1//subscriptions/g",
            "/v1/subscriptions/g/events/more",
            "/v2/topics/t/events",
        ] {
            let e = route(Listener::Traffic, &Method::GET, path)
                .err()
                .expect("refused");
            assert_eq!(e.status, StatusCode::NOT_FOUND, "{path}");
            assert_eq!(e.code, "not-found");
        }
    }

    #[test]
    fn listeners_are_separate() {
        assert!(route(Listener::Traffic, &Method::GET, "/metrics").is_err());
        assert!(route(Listener::Traffic, &Method::GET, "/admin/health").is_err());
        assert!(route(Listener::Admin, &Method::GET, "/v1/subscriptions/g").is_err());
        assert!(route(Listener::Admin, &Method::GET, "/openapi.json").is_ok());
        assert!(route(Listener::Traffic, &Method::GET, "/openapi.json").is_ok());
    }

    #[test]
    fn table_has_no_duplicates() {
        for (i, a) in ROUTES.iter().enumerate() {
            for b in &ROUTES[i + 1..] {
                assert!(
                    !(a.method == b.method && a.pattern == b.pattern),
                    "{} twice",
                    a.label()
                );
                assert_ne!(a.id, b.id, "{} and {} share an id", a.label(), b.label());
            }
        }
    }
}
