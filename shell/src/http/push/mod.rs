//! Webhook push (docs/DESIGN.md §5.1): every group with `push.url` gets its deliveries
//! POSTed as binary-mode CloudEvents. A pusher is one more transport of an engine
//! [`Stream`] session (client `push`), so it shares the credit and failure rules of the
//! other transports:
//!
//! - 2xx = ACK; 429 and 503 with `Retry-After` = NACK delayed by what it asks, capped by
//!   the group's backoff maximum; any other answer, a timeout or a refused connection =
//!   NACK with the group's backoff. The core dead-letters after `maxAttempts`, once.
//! - At most `push.max_concurrency` requests in flight per group (the session's window),
//!   each with `push.request_timeout_ms`; each group has its own pusher task, so a
//!   subscriber that is down never slows another group.
//! - Targets are limited by `push.allowed_hosts` (see `target`): non-public addresses
//!   only when listed, the mesh's own listeners never; checked when the subscription is
//!   written and again at every request after DNS resolution (the connection goes to the
//!   checked address). A refused target is a failed push (NACK with the group's backoff),
//!   logged once per pusher. Redirects are not followed: a 3xx is a failed push.
//! - A group with `push.secret` has every push signed in the style of Standard Webhooks
//!   (`webhook-id`: the delivery id, `webhook-timestamp`: Unix seconds,
//!   `webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body">`), so the
//!   receiver can tell the mesh from anyone else and refuse replays of old requests.
//!
//! The supervisor looks at the subscriptions every `push.scan_interval_ms`, and at once
//! when a subscription is written or deleted through this mesh's API, and starts, restarts
//! (the URL changed) or forgets pushers; a pusher ends when the engine ends its session
//! (group deleted, mesh stopping).
//!
//! The HTTP exchange itself is behind [`Post`]: `client.rs` (hyper's client on the checked
//! resolver) in the binary; under madsim, where hyper's connector cannot run (it is tokio's
//! own I/O), the harness gives its simulated targets through [`supervise_with`], and
//! everything else here — credit, concurrency, the timeout, signing, what an answer
//! means — runs as it ships.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::{FuturesUnordered, StreamExt as _};
use http::header::HeaderValue;
use http::{Method, Request, StatusCode, Uri};
use http_body_util::Full;
use madsim_tokio as tokio;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tracing::Instrument as _;
use unimesh_core::{ClientId, Delivery, GroupName};

#[cfg(not(madsim))]
mod client;

use crate::config::Push as PushConfig;
use crate::engine::{EngineHandle, PushOutcome, PushTarget};
use crate::event::to_binary_request_parts;
use crate::policy::{Refusal, TargetPolicy};

/// The client id of every group's pusher session.
pub const PUSH_CLIENT: &str = "push";

/// The header carrying the delivery id of a pushed event.
pub const DELIVERY_ID_HEADER: &str = "x-unimesh-delivery-id";

/// The header carrying the attempt number of a pushed event.
pub const ATTEMPT_HEADER: &str = "x-unimesh-attempt";

/// What a webhook target answered (its body is read and dropped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    pub status: StatusCode,
    /// `Retry-After` in seconds, when it is a number.
    pub retry_after: Option<u64>,
}

/// Why a push got no answer.
#[derive(Debug, thiserror::Error)]
pub enum PostError {
    /// The target is not one `push.allowed_hosts` lets the mesh reach (found at resolution).
    #[error("{0}")]
    Refused(Refusal),
    /// No answer: the connection was refused or broke, the request could not be sent.
    #[error("{0}")]
    Failed(String),
}

/// The HTTP exchange of a push: send the request to its target and say what came back.
/// The pusher bounds it with `push.request_timeout_ms`.
pub trait Post: Send + Sync + 'static {
    fn post(
        &self,
        request: Request<Full<Bytes>>,
    ) -> Pin<Box<dyn Future<Output = Result<Answer, PostError>> + Send + '_>>;
}

/// Makes the [`Post`] of one group's pusher.
pub type Connect = Arc<dyn Fn(&PushTarget, &PushConfig) -> Arc<dyn Post> + Send + Sync>;

/// The Standard Webhooks headers of a signed push.
pub const WEBHOOK_ID_HEADER: &str = "webhook-id";
pub const WEBHOOK_TIMESTAMP_HEADER: &str = "webhook-timestamp";
pub const WEBHOOK_SIGNATURE_HEADER: &str = "webhook-signature";

/// Runs the pushers of every group with `push.url` until the engine stops, over HTTP
/// (hyper's client, connecting only to addresses `policy` lets through). `wake` says a
/// subscription was written or deleted: the next look is at once, not at the next scan.
#[cfg(not(madsim))]
pub async fn supervise(
    engine: EngineHandle,
    config: PushConfig,
    policy: Arc<TargetPolicy>,
    wake: Arc<Notify>,
) {
    let checked = policy.clone();
    let connect: Connect = Arc::new(move |target: &PushTarget, config: &PushConfig| {
        Arc::new(client::HyperPost::new(checked.clone(), config, target)) as Arc<dyn Post>
    });
    supervise_with(engine, config, policy, connect, wake).await;
}

/// [`supervise`] with each pusher's HTTP exchange made by `connect`.
pub async fn supervise_with(
    engine: EngineHandle,
    config: PushConfig,
    policy: Arc<TargetPolicy>,
    connect: Connect,
    wake: Arc<Notify>,
) {
    let mut running: BTreeMap<GroupName, (PushTarget, JoinHandle<()>)> = BTreeMap::new();
    let every = Duration::from_millis(config.scan_interval_ms.get());
    loop {
        let targets = engine.push_targets().await;
        if targets.is_err() && !engine.is_running() {
            // The engine task stopped: its sessions ended, so every pusher ends too.
            return;
        }
        if let Ok(targets) = targets {
            let wanted: BTreeMap<GroupName, PushTarget> =
                targets.into_iter().map(|t| (t.group.clone(), t)).collect();
            // A changed URL, secret or backoff maximum restarts the group's pusher.
            running.retain(|group, (target, job)| {
                let keep = !job.is_finished() && wanted.get(group) == Some(target);
                if !keep {
                    job.abort();
                }
                keep
            });
            for (group, target) in wanted {
                if running.contains_key(&group) {
                    continue;
                }
                let post = connect(&target, &config);
                let pusher = Pusher::new(policy.clone(), config.clone(), target.clone(), post);
                let job = tokio::spawn(push_group(engine.clone(), Arc::new(pusher)));
                running.insert(group, (target, job));
            }
        }
        // A subscription written here starts pushing at once: waiting for the scan held a
        // new group's first deliveries up to `scan_interval_ms` (the comparison's webhook
        // rows: publish->ACK p99 near 0.5 s, from their first events). Biased: an unbiased
        // select draws from a generator the madsim harness cannot seed.
        tokio::select! {
            biased;
            () = wake.notified() => {}
            () = tokio::time::sleep(every) => {}
        }
    }
}

/// One group's pusher: its target, its HTTP exchange and what its requests share.
struct Pusher {
    target: PushTarget,
    config: PushConfig,
    policy: Arc<TargetPolicy>,
    post: Arc<dyn Post>,
    /// The HMAC key of `push.secret`.
    key: Option<Vec<u8>>,
    /// A refused target is logged once per pusher (every push to it fails the same way).
    warned: std::sync::atomic::AtomicBool,
}

impl Pusher {
    fn new(
        policy: Arc<TargetPolicy>,
        config: PushConfig,
        target: PushTarget,
        post: Arc<dyn Post>,
    ) -> Self {
        // The secret was checked when the subscription was written; one that no longer
        // parses (never: the format is fixed) would push unsigned, so it is logged.
        let key = target
            .secret
            .as_deref()
            .and_then(|s| match crate::spec_json::push_secret_key(s) {
                Ok(k) => Some(k),
                Err(why) => {
                    tracing::error!(group = %target.group, why, "push.secret unusable; pushing unsigned");
                    None
                }
            });
        Self {
            target,
            config,
            policy,
            post,
            key,
            warned: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Pushes deliveries (one in binary mode, or a batch) and says how it ended for all.
    async fn push(&self, batch: &[Delivery]) -> PushOutcome {
        let spans = crate::trace::push_spans(&self.target.group, batch);
        let pushed = match batch {
            [d] if self.target.batch <= 1 => self.push_one(d, spans.first()).await,
            _ => self.push_batch(batch).await,
        };
        let outcome = self.outcome(pushed);
        for span in &spans {
            span.record(
                "outcome",
                match outcome {
                    PushOutcome::Ack => "ack",
                    PushOutcome::Nack { .. } => "nack",
                },
            );
        }
        outcome
    }

    /// A refused target fails (NACKed with backoff), warned once.
    fn outcome(&self, pushed: Result<PushOutcome, Refusal>) -> PushOutcome {
        match pushed {
            Ok(outcome) => outcome,
            Err(refusal) => {
                if !self.warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
                    tracing::warn!(
                        group = %self.target.group,
                        url = %self.target.url,
                        reason = %refusal,
                        "push target refused (push.allowed_hosts); its pushes fail and are NACKed"
                    );
                }
                PushOutcome::Nack { delay_ms: None }
            }
        }
    }

    /// POSTs one delivery in binary mode and says how it ended, or why its target was
    /// refused.
    /// Binary mode carries the event's trace as the W3C `traceparent` header as well as
    /// `ce-traceparent` (while exporting: the push span's own context, a child of the
    /// event's trace), so a receiver that knows only W3C trace context continues the trace.
    async fn push_one(
        &self,
        d: &Delivery,
        span: Option<&tracing::Span>,
    ) -> Result<PushOutcome, Refusal> {
        let (mut headers, body) = match to_binary_request_parts(
            &d.record.body,
            d.partition,
            d.record.offset,
        ) {
            Ok(parts) => parts,
            Err(e) => {
                let group = &self.target.group;
                tracing::error!(%group, id = %d.id, error = %e, "cannot render the event for push");
                return Ok(PushOutcome::Nack { delay_ms: None });
            }
        };
        let id = d.id.to_string();
        if let Ok(v) = HeaderValue::from_str(&id) {
            headers.insert(DELIVERY_ID_HEADER, v);
        }
        headers.insert(ATTEMPT_HEADER, HeaderValue::from(d.attempt));
        let event = crate::trace::event_context(&d.record.meta);
        let none = tracing::Span::none();
        let span = span.unwrap_or(&none);
        if let Some(tp) = crate::trace::outgoing(span, event.map(|(p, _)| p)) {
            if let Ok(v) = HeaderValue::from_str(&tp) {
                headers.insert(crate::trace::context::TRACEPARENT, v);
            }
            if let Some(state) = event.and_then(|(_, s)| HeaderValue::from_str(s?).ok()) {
                headers.insert(crate::trace::context::TRACESTATE, state);
            }
        }
        self.send(headers, body, &id).instrument(span.clone()).await
    }

    /// POSTs deliveries as one CloudEvents batch (structured events, as a long-poll hands
    /// them out); the answer settles all of them. `x-unimesh-delivery-id` lists the ids in
    /// the order of the events, comma-separated; a signed batch's `webhook-id` is the
    /// first id (unique per attempt, like every delivery id).
    async fn push_batch(&self, batch: &[Delivery]) -> Result<PushOutcome, Refusal> {
        let mut events = Vec::with_capacity(batch.len());
        for d in batch {
            match crate::event::delivery_event_json(&d.record.body, d.partition, d.record.offset) {
                Ok(e) => events.push(e),
                Err(e) => {
                    let group = &self.target.group;
                    tracing::error!(%group, id = %d.id, error = %e, "cannot render the event for push");
                    return Ok(PushOutcome::Nack { delay_ms: None });
                }
            }
        }
        // A list of raw JSON values serialises without failure.
        let body = Bytes::from(serde_json::to_vec(&events).unwrap_or_default());
        let ids: Vec<String> = batch.iter().map(|d| d.id.to_string()).collect();
        let mut headers = http::HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/cloudevents-batch+json"),
        );
        if let Ok(v) = HeaderValue::from_str(&ids.join(",")) {
            headers.insert(DELIVERY_ID_HEADER, v);
        }
        let first = ids.first().cloned().unwrap_or_default();
        self.send(headers, body, &first).await
    }

    /// Signs (with `push.secret`) and POSTs a request, and says how it ended.
    async fn send(
        &self,
        mut headers: http::HeaderMap,
        body: Bytes,
        id: &str,
    ) -> Result<PushOutcome, Refusal> {
        let (group, url) = (&self.target.group, self.target.url.as_str());
        let backoff = PushOutcome::Nack { delay_ms: None };
        self.policy.check_url(url)?;
        let Ok(uri) = url.parse::<Uri>() else {
            return Ok(backoff);
        };
        if let Some(key) = &self.key {
            let timestamp = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |t| t.as_secs());
            let signature = sign(key, id, timestamp, &body);
            for (name, value) in [
                (WEBHOOK_ID_HEADER, id.to_owned()),
                (WEBHOOK_TIMESTAMP_HEADER, timestamp.to_string()),
                (WEBHOOK_SIGNATURE_HEADER, signature),
            ] {
                if let Ok(v) = HeaderValue::from_str(&value) {
                    headers.insert(name, v);
                }
            }
        }
        let mut req = Request::new(Full::new(body));
        *req.method_mut() = Method::POST;
        *req.uri_mut() = uri;
        *req.headers_mut() = headers;
        let timeout = Duration::from_millis(self.config.request_timeout_ms.get());
        let answer = tokio::time::timeout(timeout, self.post.post(req)).await;
        Ok(match answer {
            Ok(Ok(Answer { status, .. })) if status.is_success() => PushOutcome::Ack,
            Ok(Ok(Answer {
                status,
                retry_after: Some(secs),
            })) if status == StatusCode::TOO_MANY_REQUESTS
                || status == StatusCode::SERVICE_UNAVAILABLE =>
            {
                let delay_ms = secs.saturating_mul(1000).min(self.target.backoff_max_ms);
                tracing::debug!(%group, id, %status, delay_ms, "push deferred by the subscriber");
                PushOutcome::Nack {
                    delay_ms: Some(delay_ms),
                }
            }
            // Anything else fails, a redirect too (never followed: it could lead anywhere).
            Ok(Ok(Answer { status, .. })) => {
                tracing::debug!(%group, id, %status, "push refused");
                backoff
            }
            Ok(Err(PostError::Refused(refusal))) => return Err(refusal),
            Ok(Err(PostError::Failed(e))) => {
                tracing::debug!(%group, id, error = %e, "push failed");
                backoff
            }
            Err(_) => {
                tracing::debug!(%group, id, "push timed out");
                backoff
            }
        })
    }
}

/// The `webhook-signature` value of a push (Standard Webhooks): `v1,` and the base64 of
/// HMAC-SHA256 over `id.timestamp.body`.
pub fn sign(key: &[u8], id: &str, timestamp: u64, body: &[u8]) -> String {
    use base64::Engine as _;
    use hmac::Mac as _;
    // HMAC takes a key of any length: `new_from_slice` cannot fail for it.
    let Ok(mut mac) = hmac::Hmac::<sha2::Sha256>::new_from_slice(key) else {
        return String::new();
    };
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    let tag = mac.finalize().into_bytes();
    format!(
        "v1,{}",
        base64::engine::general_purpose::STANDARD.encode(tag)
    )
}

/// One group's pusher task: takes deliveries as requests finish, at most `max_concurrency`
/// at a time, and settles each by its answer.
async fn push_group(engine: EngineHandle, pusher: Arc<Pusher>) {
    let group = pusher.target.group.clone();
    let Ok(who) = ClientId::new(PUSH_CLIENT) else {
        return;
    };
    // Up to `max_concurrency` requests of up to `batch` events each are out at a time.
    let per_request = pusher.target.batch.max(1);
    let credit = pusher
        .config
        .max_concurrency
        .get()
        .saturating_mul(per_request);
    let stream = match engine.open_stream(&group, &who, credit).await {
        Ok(s) => Arc::new(s),
        Err(e) => {
            tracing::warn!(%group, error = %e, "cannot start the webhook pusher");
            return;
        }
    };
    tracing::info!(%group, url = %pusher.target.url, signed = pusher.key.is_some(), batch = per_request, "webhook pusher started");
    // The requests in flight run inside this task (one wake-up source, and a pusher that is
    // stopped drops them with it).
    let mut inflight = FuturesUnordered::new();
    let max = pusher.config.max_concurrency.get() as usize;
    loop {
        let free = max.saturating_sub(inflight.len());
        if free == 0 {
            let _ = inflight.next().await;
            continue;
        }
        let wanted = free.saturating_mul(per_request as usize);
        // Biased (answers first, then new deliveries): an unbiased select draws its order
        // from tokio's thread-local generator, which the madsim harness cannot seed.
        tokio::select! {
            biased;
            Some(()) = inflight.next(), if !inflight.is_empty() => {}
            got = stream.next(wanted) => {
                let Some(got) = got else { break };
                let mut got = got.into_iter().peekable();
                while got.peek().is_some() {
                    let chunk: Vec<Delivery> = got.by_ref().take(per_request as usize).collect();
                    let (pusher, stream) = (pusher.clone(), stream.clone());
                    inflight.push(async move {
                        let outcome = pusher.push(&chunk).await;
                        stream.settled(chunk.into_iter().map(|d| d.id).collect(), outcome);
                    });
                }
            }
        }
    }
    // The session ended; requests still in flight finish and settle (their ids may be
    // refused as stale: harmless).
    while inflight.next().await.is_some() {}
    tracing::info!(%group, "webhook pusher stopped");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Standard Webhooks specification (its reference libraries' test
    /// vector): the same key, id, timestamp and body give the same signature.
    #[test]
    fn signatures_match_the_standard_webhooks_example() {
        let key = crate::spec_json::push_secret_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
            .expect("a valid secret");
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            sign(&key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1_614_265_330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
        assert_ne!(
            sign(&key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1_614_265_331, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }
}
