//! The two listeners: accept loops with a bounded number of connections each, HTTP/1.1 and
//! HTTP/2 (h2c) on every connection, and graceful shutdown.
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
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::ServiceExt as _;

use super::routes::{router, Listener};
use super::App;
use crate::config;

/// Both listeners, bound.
pub struct Server {
    traffic: TcpListener,
    admin: TcpListener,
    settings: config::Server,
}

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
        })
    }

    pub fn traffic_addr(&self) -> std::io::Result<SocketAddr> {
        self.traffic.local_addr()
    }

    pub fn admin_addr(&self) -> std::io::Result<SocketAddr> {
        self.admin.local_addr()
    }

    /// Serves until `stop` resolves, then stops accepting and returns the open connections.
    pub async fn run(self, app: Arc<App>, stop: impl Future<Output = ()>) -> Draining {
        let graceful = GracefulShutdown::new();
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(Duration::from_millis(self.settings.header_read_timeout_ms));
        let traffic_slots = Arc::new(Semaphore::new(self.settings.max_connections));
        let admin_slots = Arc::new(Semaphore::new(self.settings.max_connections));
        let traffic_router = router(Listener::Traffic, app.clone());
        let admin_router = router(Listener::Admin, app.clone());
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
            let slot = Arc::new(ConnSlot {
                permit: std::sync::Mutex::new(Some(permit)),
            });
            let held = slot.clone();
            // An axum router never fails (its error type is `Infallible`).
            let service = service_fn(move |mut req: Request<Incoming>| {
                req.extensions_mut().insert(slot.clone());
                router.clone().oneshot(req)
            });
            let conn = builder
                .serve_connection_with_upgrades(TokioIo::new(stream), service)
                .into_owned();
            let conn = graceful.watch(conn);
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                drop(held);
            });
        }
        Draining {
            graceful,
            grace: Duration::from_millis(self.settings.shutdown_grace_ms),
        }
    }
}

/// A connection's slot among `server.max_connections`. An HTTP/1.1 connection that becomes
/// a delivery stream gives it back ([`ConnSlot::release`]): from then on it counts among
/// the streams (`server.max_streams`), so idle streams cannot starve request connections.
pub struct ConnSlot {
    permit: std::sync::Mutex<Option<OwnedSemaphorePermit>>,
}

impl ConnSlot {
    pub fn release(&self) {
        // A plain `Option`: a panic while it was held cannot leave it broken.
        let mut p = self.permit.lock().unwrap_or_else(|p| p.into_inner());
        p.take();
    }
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
