//! Webhook targets: what the shipped pusher (`unimesh_shell::http::push`) POSTs to, in place
//! of hyper's client (whose connector is tokio's own I/O, which madsim does not simulate).
//! Everything else of the push path runs as it ships on the mesh node: the supervisor, the
//! pusher's credit and concurrency, the request timeout, signing, what an answer means.
//!
//! A target reads the delivery ids of a request from its `x-unimesh-delivery-id` header (as
//! a receiver would), takes them (the world's tracker holds them to "handed to this
//! client once"), and answers as its [`PushOptions`] draw while faults last: 2xx, 429 or
//! 503 with `Retry-After`, 500, never (the pusher's timeout ends the request); or the
//! connection is refused or the host is one `push.allowed_hosts` refuses, and nothing is
//! taken. Once faults stop, every request is answered 2xx.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Full;
use madsim_tokio as tokio;
use std::num::{NonZeroU32, NonZeroU64};
use unimesh_core::{ClientId, DeliveryId, GroupName};
use unimesh_shell::config::Push as PushConfig;
use unimesh_shell::engine::PushTarget;
use unimesh_shell::http::push::{
    Answer, Connect, Post, PostError, DELIVERY_ID_HEADER, PUSH_CLIENT,
};
use unimesh_shell::policy::Refusal;
use unimesh_sim::rng::Rng;

use crate::options::{PushOptions, PushRun};
use crate::world::{Answered, World};

/// The `[push]` settings of the run's mesh nodes.
pub fn config(run: &PushRun) -> PushConfig {
    PushConfig {
        max_concurrency: NonZeroU32::new(run.max_concurrency).unwrap_or(NonZeroU32::MIN),
        request_timeout_ms: NonZeroU64::new(run.request_timeout_ms).unwrap_or(NonZeroU64::MIN),
        allowed_hosts: String::new(),
        scan_interval_ms: NonZeroU64::new(run.scan_interval_ms).unwrap_or(NonZeroU64::MIN),
    }
}

/// The URL of group `name`'s target (a public name: `push.allowed_hosts` lets it through).
pub fn url(name: &str) -> String {
    format!("http://hooks-{name}.example/events")
}

/// The targets of mesh node `node`'s pushers.
pub fn connect(world: Arc<World>, node: usize, rng: Rng) -> Connect {
    let rng = Mutex::new(rng);
    Arc::new(move |target: &PushTarget, config: &PushConfig| {
        let opts = world
            .opts
            .groups
            .iter()
            .find(|g| g.name == target.group.as_str())
            .and_then(|g| g.push.clone());
        let credit = config
            .max_concurrency
            .get()
            .saturating_mul(target.batch.max(1));
        Arc::new(Target {
            world: world.clone(),
            node,
            group: target.group.clone(),
            client: ClientId::new(PUSH_CLIENT).unwrap_or_else(|_| unreachable!("a valid id")),
            credit,
            opts,
            rng: Mutex::new(rng.lock().unwrap_or_else(|p| p.into_inner()).fork()),
        }) as Arc<dyn Post>
    })
}

/// One group's target, as one pusher sees it.
struct Target {
    world: Arc<World>,
    node: usize,
    group: GroupName,
    client: ClientId,
    credit: u32,
    /// None: a group the options give no target (every request answered 2xx).
    opts: Option<PushOptions>,
    rng: Mutex<Rng>,
}

/// How one request ends.
#[derive(Clone, Copy)]
enum Fate {
    Ok,
    Deferred(StatusCode, u64),
    Fail,
    Hang,
    Refuse,
    NotAllowed,
}

impl Target {
    fn draw(&self) -> (u64, Fate) {
        let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
        let Some(o) = &self.opts else {
            return (0, Fate::Ok);
        };
        let latency = rng.range(0, o.latency_ms);
        if !self.world.faults_on() {
            return (latency, Fate::Ok);
        }
        let fate = if rng.chance(o.refuse) {
            Fate::Refuse
        } else if rng.chance(o.not_allowed) {
            Fate::NotAllowed
        } else if rng.chance(o.hang) {
            Fate::Hang
        } else if rng.chance(o.deferred) {
            let status = if rng.chance(0.5) {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            Fate::Deferred(status, rng.range(0, o.retry_after_s))
        } else if rng.chance(o.fail) {
            Fate::Fail
        } else {
            Fate::Ok
        };
        (latency, fate)
    }
}

impl Post for Target {
    fn post(
        &self,
        request: Request<Full<Bytes>>,
    ) -> Pin<Box<dyn Future<Output = Result<Answer, PostError>> + Send + '_>> {
        Box::pin(async move {
            let ids: Vec<DeliveryId> = request
                .headers()
                .get(DELIVERY_ID_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(|v| v.split(',').filter_map(|id| id.parse().ok()).collect())
                .unwrap_or_default();
            let (latency, fate) = self.draw();
            if latency > 0 {
                tokio::time::sleep(Duration::from_millis(latency)).await;
            }
            self.world.count(|c| &mut c.pushes);
            match fate {
                Fate::Refuse => {
                    self.world.count(|c| &mut c.pushes_refused);
                    return Err(PostError::Failed("connection refused".into()));
                }
                Fate::NotAllowed => {
                    self.world.count(|c| &mut c.pushes_not_allowed);
                    return Err(PostError::Refused(Refusal::NoAddress {
                        host: request.uri().host().unwrap_or_default().to_owned(),
                    }));
                }
                _ => {}
            }
            self.world
                .pushed(self.node, &self.group, &self.client, self.credit, &ids);
            let (status, retry_after, answered) = match fate {
                Fate::Deferred(status, secs) => {
                    self.world.count(|c| &mut c.pushes_deferred);
                    (status, Some(secs), Answered::Deferred(secs))
                }
                Fate::Fail => {
                    self.world.count(|c| &mut c.pushes_failed);
                    (StatusCode::INTERNAL_SERVER_ERROR, None, Answered::Failed)
                }
                Fate::Hang => {
                    self.world.count(|c| &mut c.pushes_hung);
                    self.world
                        .push_answered(self.node, &self.group, &ids, Answered::Taken);
                    // Never answers: the pusher's `request_timeout_ms` ends the request.
                    std::future::pending::<()>().await;
                    (StatusCode::GATEWAY_TIMEOUT, None, Answered::Failed)
                }
                _ => (StatusCode::OK, None, Answered::Ok),
            };
            self.world
                .push_answered(self.node, &self.group, &ids, answered);
            Ok(Answer {
                status,
                retry_after,
            })
        })
    }
}
