//! Who may do what (issue 19): with identities in `[auth]` (see `config::auth`), every
//! request of both listeners passes this gate before its handler runs, so a refused
//! request changes nothing.
//!
//! - The caller names itself with `Authorization: Bearer <token>`; on the two stream routes
//!   (SSE, WebSocket) and the console's feed (`/admin/events`), whose browser clients
//!   cannot set headers, also with the `access_token` query parameter. The token's SHA-256
//!   is compared with every identity's in constant time. The token is never logged (the request log has the
//!   path only).
//! - 401 with `WWW-Authenticate: Bearer` for a missing or unknown token; 403 naming the
//!   identity, the right and the name refused. Both in the API's error shape, both logged
//!   (identity, route, reason) and counted in `unimesh_auth_refused_total{reason}`.
//! - Rights by route: publish (topic) for publish and request/reply; consume (group) for
//!   poll, SSE, WebSocket, ACK, NACK, extend; define (group) for `PUT`/`DELETE` of a
//!   subscription; consume or define for its `GET`; `admin` for the admin listener, whose
//!   `/admin/health`, `/admin/ready` and `/metrics` stay open with `auth.open_health`, and
//!   the console's own files (`/ui`) always (they hold no data); any identity for the rest
//!   (the OpenAPI document, unknown routes).
//!
//! - Whoever the caller proves to be — a static token, a JWT (`http::jwt`, with
//!   `[auth.jwt]`) whose identity claim names it, or a verified client certificate whose
//!   CN names it (`http::tls`, mTLS) — its rights are those of `[auth.identities.NAME]`
//!   of that name; a name with no entry there has no rights (403). A bearer token, when
//!   sent, decides (a bad one is 401 even with a certificate); without one, the
//!   certificate's identity applies.
//!
//! A delivery id settles only in the group whose route it is sent to, and the core refuses
//! an id of another group's lane there (`unknown`: leases are unique across groups), so a
//! right on one group never settles another's deliveries (`tests/auth.rs`).

use std::sync::Arc;

use axum::extract::{MatchedPath, RawPathParams, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::RequestExt as _;
use http::header::{HeaderValue, AUTHORIZATION, WWW_AUTHENTICATE};
use http::{Method, StatusCode};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::error::{code, ApiError};
#[cfg(not(madsim))]
use super::jwt::Verifier;
use super::listener::{Listener, UNMATCHED_LABEL};
use super::App;
use crate::config::auth::Identity;
use crate::config::Config;

/// The identity named by the connection's verified client certificate (a request
/// extension set by the accept loop).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerIdentity(pub String);

/// The query parameter carrying a token on the stream routes.
pub const ACCESS_TOKEN_PARAM: &str = "access_token";

/// The routes on which [`ACCESS_TOKEN_PARAM`] is read: the traffic listener's delivery
/// streams and the admin listener's console feed (all opened by browsers' `EventSource` or
/// `WebSocket`, which cannot send headers).
const STREAM_ROUTES: [&str; 3] = [
    "/v1/subscriptions/{group}/stream",
    "/v1/subscriptions/{group}/ws",
    "/admin/events",
];

/// The web console's own files (`http::ui`): a page and its script and style, the same for
/// everyone (they hold no data; every view and lever they use is an admin route, which
/// needs the admin right), so a browser can load them before it has a token to send.
const CONSOLE_PAGES: [&str; 3] = ["/ui", "/ui/", "/ui/{asset}"];

/// The identities, ready for checking.
pub struct Gate {
    known: Vec<Known>,
    open_health: bool,
    /// Client certificates name identities too.
    certs: bool,
    /// The JWT keys, when `[auth.jwt]` is on and they were loaded (`App::with_jwt`); a JWT
    /// is refused without them.
    #[cfg(not(madsim))]
    jwt: Option<std::sync::Arc<Verifier>>,
    /// `[auth.jwt]` is configured.
    #[cfg_attr(madsim, allow(dead_code))]
    jwt_on: bool,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("known", &self.known.len())
            .field("open_health", &self.open_health)
            .field("certs", &self.certs)
            .field("jwt_on", &self.jwt_on)
            .finish()
    }
}

#[derive(Debug)]
struct Known {
    name: String,
    /// SHA-256 of its static token; `None`: it has none.
    digest: Option<[u8; 32]>,
    publish: Names,
    consume: Names,
    define: Names,
    admin: bool,
}

/// The names of one right: exact, prefixes (`orders.` of `orders.*`), or all (`*`).
#[derive(Debug, Default)]
struct Names(Vec<String>);

impl Names {
    fn new(patterns: &[String]) -> Self {
        Self(patterns.to_vec())
    }

    fn allows(&self, name: &str) -> bool {
        self.0.iter().any(|p| {
            p == "*"
                || p == name
                || p.strip_suffix('*')
                    .is_some_and(|prefix| prefix.ends_with('.') && name.starts_with(prefix))
        })
    }
}

/// A right, as refusals name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Right {
    Admin,
    Consume,
    Define,
    Publish,
}

impl Right {
    fn as_str(self) -> &'static str {
        match self {
            Right::Admin => "admin",
            Right::Consume => "consume",
            Right::Define => "define",
            Right::Publish => "publish",
        }
    }
}

/// What a route needs.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Need {
    /// Nothing (health probes with `auth.open_health`).
    Open,
    /// Any identity.
    Identity,
    /// The admin right.
    Admin,
    /// One of these rights on this topic or group (by the route's parameter).
    On(&'static [Right], String),
}

/// The `reason` label of `unimesh_auth_refused_total` for a client certificate refused in
/// the TLS handshake (`http::server`): no request was read, so there is no HTTP answer.
pub const CERTIFICATE_REFUSED: &str = "certificate";

/// Why a request was refused: the `reason` label of `unimesh_auth_refused_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// No token at all.
    Missing,
    /// A token no identity has (or not a bearer token).
    Invalid,
    /// A known identity without the right.
    Forbidden,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Forbidden => "forbidden",
            Reason::Invalid => "invalid",
            Reason::Missing => "missing",
        }
    }
}

/// A caller that proved who it is: its name, and its entry of the rights table if it has
/// one (a JWT or a certificate may name an identity that has none: no rights).
struct Caller<'a> {
    name: String,
    rights: Option<&'a Known>,
}

impl Caller<'_> {
    fn has(&self, right: Right, name: &str) -> bool {
        self.rights.is_some_and(|k| k.has(right, name))
    }
}

impl Gate {
    /// The gate of `[auth]` (and of client certificates), or `None` when neither
    /// identities, JWT keys nor a client CA are configured (auth off).
    pub fn new(config: &Config) -> Option<Self> {
        if !config.auth_on() {
            return None;
        }
        let auth = &config.auth;
        let known = auth
            .identities
            .iter()
            .filter_map(|(name, id)| Known::new(name, id))
            .collect();
        Some(Self {
            known,
            open_health: auth.open_health,
            certs: config.server.tls.client_certs(),
            #[cfg(not(madsim))]
            jwt: None,
            jwt_on: auth.jwt.enabled(),
        })
    }

    /// The gate checking JWTs with these keys.
    #[cfg(not(madsim))]
    pub fn with_jwt(mut self, jwt: Option<std::sync::Arc<Verifier>>) -> Self {
        self.jwt = jwt;
        self
    }

    /// The identity whose static token this is. Every identity is compared, in constant
    /// time.
    fn identify(&self, token: &str) -> Option<&Known> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for k in &self.known {
            if let Some(d) = &k.digest {
                if bool::from(d.ct_eq(&digest)) {
                    found = Some(k);
                }
            }
        }
        found
    }

    /// The entry of the rights table named `name`.
    fn named(&self, name: &str) -> Caller<'_> {
        Caller {
            name: name.to_owned(),
            rights: self.known.iter().find(|k| k.name == name),
        }
    }

    /// Who a bearer token names: a static token, else a JWT. `Err`: why it is refused (the
    /// `error_description` of a JWT refusal, if it was one).
    fn caller_of_token(&self, token: &str) -> Result<Caller<'_>, Option<String>> {
        if let Some(k) = self.identify(token) {
            return Ok(Caller {
                name: k.name.clone(),
                rights: Some(k),
            });
        }
        #[cfg(not(madsim))]
        if self.jwt_on && Verifier::looks_like_jwt(token) {
            let Some(jwt) = &self.jwt else {
                return Err(Some("JWT keys are not loaded".into()));
            };
            return match jwt.verify(token) {
                Ok(name) => Ok(self.named(&name)),
                Err(why) => Err(Some(why)),
            };
        }
        Err(None)
    }

    /// What a request needs: by listener, method and matched route, with its parameters.
    fn need(
        &self,
        listener: Listener,
        method: &Method,
        route: Option<&str>,
        params: &[(String, String)],
    ) -> Need {
        let param = |name: &str| {
            params
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        match listener {
            Listener::Admin => match route {
                Some("/admin/health" | "/admin/ready" | "/metrics") if self.open_health => {
                    Need::Open
                }
                Some(r) if CONSOLE_PAGES.contains(&r) => Need::Open,
                _ => Need::Admin,
            },
            Listener::Traffic => match route {
                Some("/v1/topics/{topic}/events" | "/v1/topics/{topic}/request") => {
                    Need::On(&[Right::Publish], param("topic"))
                }
                Some("/v1/subscriptions/{group}") if *method == Method::GET => {
                    Need::On(&[Right::Consume, Right::Define], param("group"))
                }
                Some("/v1/subscriptions/{group}") => Need::On(&[Right::Define], param("group")),
                Some(
                    "/v1/subscriptions/{group}/events"
                    | "/v1/subscriptions/{group}/stream"
                    | "/v1/subscriptions/{group}/ws"
                    | "/v1/subscriptions/{group}/ack"
                    | "/v1/subscriptions/{group}/nack"
                    | "/v1/subscriptions/{group}/extend",
                ) => Need::On(&[Right::Consume], param("group")),
                _ => Need::Identity,
            },
        }
    }
}

impl Known {
    /// `None` for a hash that is neither empty nor 64 hex digits (`Config::validate`
    /// refuses those).
    fn new(name: &str, id: &Identity) -> Option<Self> {
        let hex = id.token_sha256.as_bytes();
        let digest = if hex.is_empty() {
            None
        } else {
            if hex.len() != 64 {
                return None;
            }
            let mut digest = [0u8; 32];
            for (i, pair) in hex.chunks(2).enumerate() {
                let text = std::str::from_utf8(pair).ok()?;
                digest[i] = u8::from_str_radix(text, 16).ok()?;
            }
            Some(digest)
        };
        Some(Self {
            name: name.to_owned(),
            digest,
            publish: Names::new(&id.publish),
            consume: Names::new(&id.consume),
            define: Names::new(&id.define),
            admin: id.admin,
        })
    }

    fn has(&self, right: Right, name: &str) -> bool {
        match right {
            Right::Admin => self.admin,
            Right::Consume => self.consume.allows(name),
            Right::Define => self.define.allows(name),
            Right::Publish => self.publish.allows(name),
        }
    }
}

/// The bearer token of a request: the `Authorization` header, or on a stream route the
/// `access_token` query parameter. `Err(())`: an `Authorization` header that is not a
/// bearer token.
fn token_of(req: &Request, route: Option<&str>) -> Result<Option<String>, ()> {
    if let Some(h) = req.headers().get(AUTHORIZATION) {
        let text = h.to_str().map_err(|_| ())?;
        let (scheme, token) = text.trim().split_once(' ').ok_or(())?;
        if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
            return Err(());
        }
        return Ok(Some(token.trim().to_owned()));
    }
    if route.is_some_and(|r| STREAM_ROUTES.contains(&r)) {
        if let Some(q) = req.uri().query() {
            let found = url::form_urlencoded::parse(q.as_bytes())
                .find(|(k, _)| k == ACCESS_TOKEN_PARAM)
                .map(|(_, v)| v.into_owned());
            return Ok(found);
        }
    }
    Ok(None)
}

/// The middleware of one listener (state: the app and which listener it is).
pub async fn gate(
    State((app, listener)): State<(Arc<App>, Listener)>,
    mut req: Request,
    next: Next,
) -> Response {
    let Some(refused) = check(&app, listener, &mut req).await else {
        return next.run(req).await;
    };
    // HTTP/2: a stream answered before its body was read is reset, and a client still
    // sending it may report the reset instead of the answer (curl: error 92). Read (and
    // drop) a bounded body first; HTTP/1 closes the connection instead (see `check`).
    if req.version() == http::Version::HTTP_2 {
        let drain = axum::body::to_bytes(req.into_body(), REFUSED_BODY_DRAIN_BYTES);
        let _ = tokio::time::timeout(REFUSED_BODY_DRAIN_TIMEOUT, drain).await;
    }
    refused
}

/// Most bytes of a refused HTTP/2 request's body read before answering.
const REFUSED_BODY_DRAIN_BYTES: usize = 1 << 20;
/// How long reading it may take.
const REFUSED_BODY_DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The refusal of a request, or `None` to let it through.
async fn check(app: &App, listener: Listener, req: &mut Request) -> Option<Response> {
    let gate = app.auth.as_ref()?;
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned());
    let params: Vec<(String, String)> = match req.extract_parts::<RawPathParams>().await {
        Ok(p) => p
            .iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        Err(_) => Vec::new(),
    };
    let need = gate.need(listener, req.method(), route.as_deref(), &params);
    if need == Need::Open {
        return None;
    }
    let shown_route = route.as_deref().unwrap_or(UNMATCHED_LABEL);
    // A refused request's body is never read: close the connection after the answer, so
    // a client does not send its next request on a connection that is being torn down.
    // (HTTP/1 only: HTTP/2 has no `Connection` header, and `gate` reads the body there.)
    let has_body = req.version() < http::Version::HTTP_2
        && (req.headers().contains_key(http::header::CONTENT_LENGTH)
            || req.headers().contains_key(http::header::TRANSFER_ENCODING));
    let refuse = |reason: Reason, identity: &str, message: String, detail: Option<&str>| {
        tracing::info!(
            identity,
            method = %req.method(),
            route = shown_route,
            reason = reason.as_str(),
            %message,
            "request refused"
        );
        app.metrics.auth_refused(reason.as_str());
        refusal(reason, message, detail, has_body)
    };
    let peer = req.extensions().get::<PeerIdentity>().cloned();
    let who = match token_of(req, route.as_deref()) {
        Ok(Some(token)) => match gate.caller_of_token(&token) {
            Ok(who) => who,
            Err(Some(why)) => {
                return Some(refuse(
                    Reason::Invalid,
                    "-",
                    format!("the token is not valid: {why}"),
                    Some(&why),
                ))
            }
            Err(None) => {
                return Some(refuse(
                    Reason::Invalid,
                    "-",
                    "the token is not valid".into(),
                    None,
                ))
            }
        },
        Ok(None) => match peer {
            Some(PeerIdentity(name)) => gate.named(&name),
            None => {
                let how = if gate.certs {
                    "credentials required: send Authorization: Bearer <token> or a client \
                     certificate"
                } else {
                    "credentials required: send Authorization: Bearer <token>"
                };
                return Some(refuse(Reason::Missing, "-", how.into(), None));
            }
        },
        Err(()) => {
            return Some(refuse(
                Reason::Invalid,
                "-",
                "the Authorization header is not Bearer <token>".into(),
                None,
            ))
        }
    };
    let refused = match &need {
        Need::Open | Need::Identity => None,
        Need::Admin => (!who.has(Right::Admin, "")).then(|| "the admin right".to_owned()),
        Need::On(rights, name) => (!rights.iter().any(|r| who.has(*r, name))).then(|| {
            let rights: Vec<&str> = rights.iter().map(|r| r.as_str()).collect();
            let kind = if rights.contains(&"publish") {
                "topic"
            } else {
                "group"
            };
            format!("the {} right on {kind} {name}", rights.join(" or "))
        }),
    };
    if let Some(what) = refused {
        let unlisted = if who.rights.is_none() {
            " (it has no entry in [auth.identities])"
        } else {
            ""
        };
        return Some(refuse(
            Reason::Forbidden,
            &who.name,
            format!("identity {} does not have {what}{unlisted}", who.name),
            None,
        ));
    }
    None
}

/// A 401 (with `WWW-Authenticate`, and the JWT refusal's `error_description`) or 403
/// answer.
fn refusal(reason: Reason, message: String, detail: Option<&str>, close: bool) -> Response {
    let (status, code, challenge) = match reason {
        Reason::Missing => (
            StatusCode::UNAUTHORIZED,
            code::UNAUTHORIZED,
            r#"Bearer realm="unimesh""#,
        ),
        Reason::Invalid => (
            StatusCode::UNAUTHORIZED,
            code::UNAUTHORIZED,
            r#"Bearer realm="unimesh", error="invalid_token""#,
        ),
        Reason::Forbidden => (
            StatusCode::FORBIDDEN,
            code::FORBIDDEN,
            r#"Bearer realm="unimesh", error="insufficient_scope""#,
        ),
    };
    let mut e = ApiError::new(status, code, message);
    e.close = close;
    let mut r = e.into_response();
    let described = detail.and_then(|d| {
        // A quoted-string: the descriptions are plain words, but keep it safe.
        let d: String = d
            .chars()
            .filter(|c| c.is_ascii() && !c.is_ascii_control() && !matches!(c, '"' | '\\'))
            .collect();
        HeaderValue::from_str(&format!("{challenge}, error_description=\"{d}\"")).ok()
    });
    r.headers_mut().insert(
        WWW_AUTHENTICATE,
        described.unwrap_or_else(|| HeaderValue::from_static(challenge)),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(token: &str) -> String {
        Sha256::digest(token.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    fn gate() -> Gate {
        let mut config = Config::default();
        let auth = &mut config.auth;
        auth.identities.insert(
            "shop".into(),
            Identity {
                token_sha256: sha("t-shop"),
                publish: vec!["orders.*".into(), "audit".into()],
                consume: vec!["billing".into()],
                define: Vec::new(),
                admin: false,
            },
        );
        auth.identities.insert(
            "ops".into(),
            Identity {
                token_sha256: sha("t-ops").to_uppercase(),
                publish: Vec::new(),
                consume: Vec::new(),
                define: vec!["*".into()],
                admin: true,
            },
        );
        Gate::new(&config).expect("identities: auth on")
    }

    #[test]
    fn tokens_name_identities_and_rights_match_exact_and_prefix_names() {
        let g = gate();
        assert!(g.identify("nope").is_none());
        let shop = g.identify("t-shop").expect("known");
        assert_eq!(shop.name, "shop");
        assert_eq!(g.identify("t-ops").map(|k| k.name.as_str()), Some("ops"));
        assert!(shop.has(Right::Publish, "orders.eu"));
        assert!(shop.has(Right::Publish, "orders.eu.west"));
        assert!(
            !shop.has(Right::Publish, "orders"),
            "orders.* is a prefix of orders."
        );
        assert!(!shop.has(Right::Publish, "ordersx"));
        assert!(shop.has(Right::Publish, "audit"));
        assert!(!shop.has(Right::Publish, "audit.x"));
        assert!(shop.has(Right::Consume, "billing"));
        assert!(!shop.has(Right::Define, "billing"));
        assert!(!shop.has(Right::Admin, ""));
        let ops = g.identify("t-ops").expect("known");
        assert!(ops.has(Right::Define, "anything") && ops.has(Right::Admin, ""));
        assert!(
            Gate::new(&Config::default()).is_none(),
            "no identities: off"
        );
        let named = g.named("shop");
        assert!(
            named.has(Right::Publish, "orders.eu"),
            "a name gets its rights"
        );
        assert!(!g.named("stranger").has(Right::Publish, "orders.eu"));
    }

    #[test]
    fn routes_need_their_rights() {
        let g = gate();
        let p = |k: &str, v: &str| vec![(k.to_owned(), v.to_owned())];
        assert_eq!(
            g.need(
                Listener::Traffic,
                &Method::POST,
                Some("/v1/topics/{topic}/events"),
                &p("topic", "orders.eu")
            ),
            Need::On(&[Right::Publish], "orders.eu".into())
        );
        assert_eq!(
            g.need(
                Listener::Traffic,
                &Method::POST,
                Some("/v1/subscriptions/{group}/ack"),
                &p("group", "b")
            ),
            Need::On(&[Right::Consume], "b".into())
        );
        assert_eq!(
            g.need(
                Listener::Traffic,
                &Method::PUT,
                Some("/v1/subscriptions/{group}"),
                &p("group", "b")
            ),
            Need::On(&[Right::Define], "b".into())
        );
        assert_eq!(
            g.need(Listener::Traffic, &Method::GET, None, &[]),
            Need::Identity
        );
        assert_eq!(
            g.need(Listener::Admin, &Method::GET, Some("/admin/health"), &[]),
            Need::Open
        );
        assert_eq!(
            g.need(
                Listener::Admin,
                &Method::POST,
                Some("/admin/dlq/{group}/replay"),
                &p("group", "b")
            ),
            Need::Admin
        );
        for page in ["/ui", "/ui/", "/ui/{asset}"] {
            assert_eq!(
                g.need(Listener::Admin, &Method::GET, Some(page), &[]),
                Need::Open,
                "{page}"
            );
        }
        assert_eq!(
            g.need(Listener::Admin, &Method::GET, Some("/admin/events"), &[]),
            Need::Admin,
            "the feed carries the data: admin"
        );
        assert_eq!(
            g.need(Listener::Traffic, &Method::GET, Some("/ui"), &[]),
            Need::Identity,
            "no console on the traffic listener"
        );
    }
}
