//! The two listeners: accept loops with a bounded number of connections each, HTTP/1.1 and
//! HTTP/2 (h2c, or by ALPN over TLS) on every connection, TLS when `[server.tls]` says so
//! (`tls.rs`), and graceful shutdown.
//!
//! Shutdown happens in two steps so the caller can flush the engine in between:
//! [`Server::run`] returns once the stop signal came (nothing new is accepted), handing
//! back a [`Draining`]; [`Draining::finish`] asks every open connection to close after its
//! current request and waits for them, up to the grace period.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::{GracefulShutdown, Watcher};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tower::ServiceExt as _;

use super::auth::PeerIdentity;
use super::listener::{ConnSlot, Listener};
use super::routes::router;
#[cfg(not(madsim))]
use super::tls::Tls;
use super::App;
use crate::config;

/// Both listeners, bound.
pub struct Server {
    traffic: TcpListener,
    admin: TcpListener,
    settings: config::Server,
    #[cfg(not(madsim))]
    tls: Option<Arc<Tls>>,
}

/// A connection's byte stream: TCP, or TLS over TCP.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// Connections still open after the stop signal.
pub struct Draining {
    graceful: GracefulShutdown,
    grace: Duration,
}

impl Server {
    /// Binds both addresses (port 0 picks a free port; see [`Server::traffic_addr`]).
    pub async fn bind(
        http: SocketAddr,
        admin: SocketAddr,
        settings: config::Server,
    ) -> std::io::Result<Self> {
        let traffic = TcpListener::bind(http).await.map_err(|e| {
            std::io::Error::new(e.kind(), format!("cannot listen on {http} (http): {e}"))
        })?;
        let admin = TcpListener::bind(admin).await.map_err(|e| {
            std::io::Error::new(e.kind(), format!("cannot listen on {admin} (admin): {e}"))
        })?;
        Ok(Self {
            traffic,
            admin,
            settings,
            #[cfg(not(madsim))]
            tls: None,
        })
    }

    /// Serves both listeners over TLS.
    #[cfg(not(madsim))]
    #[must_use]
    pub fn with_tls(mut self, tls: Arc<Tls>) -> Self {
        self.tls = Some(tls);
        self
    }

    pub fn traffic_addr(&self) -> std::io::Result<SocketAddr> {
        self.traffic.local_addr()
    }

    pub fn admin_addr(&self) -> std::io::Result<SocketAddr> {
        self.admin.local_addr()
    }

    /// Serves until `stop` resolves, then stops accepting and returns the open connections.
    pub async fn run(self, app: Arc<App>, stop: impl Future<Output = ()>) -> Draining {
        let traffic = router(Listener::Traffic, app.clone());
        let admin = router(Listener::Admin, app.clone());
        self.serve(traffic, admin, Some(app), stop).await
    }

    /// Before there is an application to serve (storage still waiting for its broker):
    /// answers every request on both listeners 503 `unavailable` with `why()` until `stop`
    /// resolves, so `/admin/health` and `/admin/ready` say what is wrong meanwhile. The
    /// connections still open are handed back, to be finished before [`Server::run`].
    pub async fn run_unavailable(
        &self,
        why: Arc<dyn Fn() -> String + Send + Sync>,
        stop: impl Future<Output = ()>,
    ) -> Draining {
        let answer = move || {
            let why = why();
            async move {
                super::error::ApiError::new(
                    hyper::StatusCode::SERVICE_UNAVAILABLE,
                    super::error::code::UNAVAILABLE,
                    format!("unhealthy: {why}"),
                )
            }
        };
        let unavailable = axum::Router::new().fallback(answer);
        self.serve(unavailable.clone(), unavailable, None, stop)
            .await
    }

    /// Serves `traffic` and `admin` on their listeners until `stop` resolves; `app`, when
    /// there is one, counts refused client certificates.
    async fn serve(
        &self,
        traffic_router: axum::Router,
        admin_router: axum::Router,
        app: Option<Arc<App>>,
        stop: impl Future<Output = ()>,
    ) -> Draining {
        let graceful = GracefulShutdown::new();
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(Duration::from_millis(
                self.settings.header_read_timeout_ms.get(),
            ));
        // No TLS under madsim: nothing to count.
        #[cfg(madsim)]
        let _ = app;
        let traffic_slots = Arc::new(Semaphore::new(self.settings.max_connections.get()));
        let admin_slots = Arc::new(Semaphore::new(self.settings.max_connections.get()));
        tokio::pin!(stop);
        loop {
            let accepted = tokio::select! {
                () = &mut stop => break,
                a = accept(&self.traffic, &traffic_slots) => a.map(|a| (a, Listener::Traffic)),
                a = accept(&self.admin, &admin_slots) => a.map(|a| (a, Listener::Admin)),
            };
            let ((stream, peer, permit), listener) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of file descriptors or similar: the condition clears when
                    // connections close, so wait a moment instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let _ = stream.set_nodelay(true);
            let router = match listener {
                Listener::Admin => admin_router.clone(),
                Listener::Traffic => traffic_router.clone(),
            };
            let slot = Arc::new(ConnSlot::new(permit));
            let builder = builder.clone();
            let watcher = graceful.watcher();
            #[cfg(not(madsim))]
            let tls = self.tls.clone();
            #[cfg(not(madsim))]
            let app = app.clone();
            let timeout = Duration::from_millis(self.settings.header_read_timeout_ms.get());
            tokio::spawn(async move {
                #[cfg(not(madsim))]
                if let Some(tls) = tls {
                    if let Some((io, identity)) =
                        handshake(&tls, app.as_deref(), stream, peer, timeout).await
                    {
                        serve(
                            &builder,
                            watcher,
                            Box::new(io),
                            slot,
                            identity,
                            router,
                            peer,
                        )
                        .await;
                    }
                    return;
                }
                let _ = timeout;
                serve(
                    &builder,
                    watcher,
                    Box::new(stream),
                    slot,
                    None,
                    router,
                    peer,
                )
                .await;
            });
        }
        Draining {
            graceful,
            grace: Duration::from_millis(self.settings.shutdown_grace_ms),
        }
    }
}

/// Serves one connection until it ends (or the graceful shutdown closes it).
async fn serve(
    builder: &auto::Builder<TokioExecutor>,
    watcher: Watcher,
    io: Box<dyn Io>,
    slot: Arc<ConnSlot>,
    identity: Option<PeerIdentity>,
    router: axum::Router,
    peer: SocketAddr,
) {
    let held = slot.clone();
    // An axum router never fails (its error type is `Infallible`).
    let service = service_fn(move |mut req: Request<Incoming>| {
        req.extensions_mut().insert(slot.clone());
        if let Some(id) = &identity {
            req.extensions_mut().insert(id.clone());
        }
        router.clone().oneshot(req)
    });
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    if let Err(e) = watcher.watch(conn.into_owned()).await {
        tracing::debug!(%peer, error = %e, "connection ended with an error");
    }
    drop(held);
}

/// The TLS handshake of an accepted connection, within `timeout`, and the identity its
/// client certificate names. A client speaking plain HTTP (its first byte is not a TLS
/// handshake record) gets a plain 400 naming the problem, then the connection closes. A
/// client certificate refused (none under `require`, another CA's, expired, not valid
/// yet) is logged with the peer and rustls' reason and counted as
/// `unimesh_auth_refused_total{reason="certificate"}`; the client gets the TLS alert.
#[cfg(not(madsim))]
async fn handshake(
    tls: &Tls,
    app: Option<&App>,
    stream: TcpStream,
    peer: SocketAddr,
    timeout: Duration,
) -> Option<(
    tokio_rustls::server::TlsStream<TcpStream>,
    Option<PeerIdentity>,
)> {
    /// The content type of a TLS handshake record, the first byte of every ClientHello.
    const HANDSHAKE: u8 = 0x16;
    let mut first = [0u8; 1];
    match tokio::time::timeout(timeout, stream.peek(&mut first)).await {
        Ok(Ok(1)) if first[0] == HANDSHAKE => {}
        Ok(Ok(1)) => {
            let _ = tokio::time::timeout(timeout, refuse_plain(stream)).await;
            return None;
        }
        _ => return None,
    }
    let accept = tls.acceptor().accept(stream).into_fallible();
    match tokio::time::timeout(timeout, accept).await {
        Ok(Ok(io)) => {
            let identity = super::tls::peer_identity(io.get_ref().1).map(PeerIdentity);
            Some((io, identity))
        }
        Ok(Err((e, stream))) => {
            match super::tls::refused_client_certificate(&e) {
                Some(why) => {
                    tracing::info!(
                        %peer,
                        reason = super::auth::CERTIFICATE_REFUSED,
                        message = %why,
                        "client certificate refused"
                    );
                    if let Some(app) = app {
                        app.metrics.auth_refused(super::auth::CERTIFICATE_REFUSED);
                    }
                }
                None => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
            }
            close_after_alert(stream, timeout).await;
            None
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            None
        }
    }
}

/// Closes a connection whose handshake failed, so that the client reads the TLS alert
/// that says why (`certificate required`, `certificate expired`, `unknown ca`). The
/// alert is out already; closing a socket with input still unread sends a reset instead
/// of a FIN, and a reset makes the client drop what it had not read yet — with TLS 1.3 a
/// client has sent its request by the time the server refuses its certificate, and Python
/// `requests` saw a bare EOF in most runs. So the write side is shut (a FIN after the
/// alert) and what the client still sends is read and dropped until it closes, up to
/// 64 KiB and 5 s (or `server.header_read_timeout_ms` when shorter).
#[cfg(not(madsim))]
async fn close_after_alert(mut stream: TcpStream, timeout: Duration) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let _ = stream.shutdown().await;
    let drain = async {
        let mut buf = [0u8; 4096];
        let mut left = 64 * 1024usize;
        while left > 0 {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(timeout.min(Duration::from_secs(5)), drain).await;
}

/// Answers a plain-HTTP request on a TLS port: reads its head (so closing does not reset
/// the connection under the answer), answers 400 `tls-required`, closes.
#[cfg(not(madsim))]
async fn refuse_plain(mut stream: TcpStream) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while head.len() < 64 * 1024 && !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let body = serde_json::json!({
        "error": super::error::code::TLS_REQUIRED,
        "message": "this port speaks TLS: use https:// (plain HTTP is not served here)",
    })
    .to_string();
    let answer = format!(
        "HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(answer.as_bytes()).await;
    let _ = stream.shutdown().await;
}

async fn accept(
    listener: &TcpListener,
    slots: &Arc<Semaphore>,
) -> std::io::Result<(TcpStream, SocketAddr, tokio::sync::OwnedSemaphorePermit)> {
    // The semaphore is never closed, so acquiring only waits.
    let permit = slots
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| std::io::Error::other("connection limit closed"))?;
    let (stream, peer) = listener.accept().await?;
    Ok((stream, peer, permit))
}

impl Draining {
    /// Open connections right now.
    pub fn open(&self) -> usize {
        self.graceful.count()
    }

    /// Asks every connection to close after its current request and waits up to the grace
    /// period. Returns how many were still open when it ran out (they are dropped).
    pub async fn finish(self) -> usize {
        let Draining { graceful, grace } = self;
        let open = graceful.count();
        let done = tokio::time::timeout(grace, graceful.shutdown()).await;
        match done {
            Ok(()) => 0,
            Err(_) => open,
        }
    }
}
