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
//! - Targets are limited to `push.allowed_hosts` (comma-separated; empty: any), checked
//!   when the subscription is written and again before every request.
//!
//! The supervisor looks at the subscriptions every `push.scan_interval_ms` and starts,
//! restarts (the URL changed) or forgets pushers; a pusher ends when the engine ends its
//! session (group deleted, mesh stopping).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, RETRY_AFTER};
use http::{Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::task::{JoinHandle, JoinSet};
use unimesh_core::{ClientId, Delivery, GroupName};

use crate::config::Push as PushConfig;
use crate::engine::{EngineHandle, PushOutcome};
use crate::event::to_binary_request_parts;

/// The client id of every group's pusher session.
pub const PUSH_CLIENT: &str = "push";

/// The header carrying the delivery id of a pushed event.
pub const DELIVERY_ID_HEADER: &str = "x-unimesh-delivery-id";

/// The header carrying the attempt number of a pushed event.
pub const ATTEMPT_HEADER: &str = "x-unimesh-attempt";

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Whether `url`'s host may be pushed to under `allowed` (comma-separated host names;
/// empty allows every host).
pub fn host_allowed(allowed: &str, url: &str) -> bool {
    let allowed: Vec<&str> = allowed
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .collect();
    if allowed.is_empty() {
        return true;
    }
    let Ok(uri) = url.parse::<Uri>() else {
        return false;
    };
    uri.host()
        .is_some_and(|h| allowed.iter().any(|a| a.eq_ignore_ascii_case(h)))
}

/// Runs the pushers of every group with `push.url` until the engine stops.
pub async fn supervise(engine: EngineHandle, config: PushConfig) {
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(Duration::from_millis(config.request_timeout_ms)));
    connector.set_nodelay(true);
    let client: HttpClient = Client::builder(TokioExecutor::new()).build(connector);
    let mut running: BTreeMap<GroupName, ((String, u64), JoinHandle<()>)> = BTreeMap::new();
    let every = Duration::from_millis(config.scan_interval_ms);
    loop {
        let targets = engine.push_targets().await;
        if targets.is_err() && !engine.is_running() {
            // The engine task stopped: its sessions ended, so every pusher ends too.
            return;
        }
        if let Ok(targets) = targets {
            let mut wanted: BTreeMap<GroupName, (String, u64)> = BTreeMap::new();
            for (group, url, backoff_max_ms) in targets {
                wanted.insert(group, (url, backoff_max_ms));
            }
            // A changed URL or backoff maximum restarts the group's pusher.
            running.retain(|group, (target, job)| {
                let keep = !job.is_finished() && wanted.get(group) == Some(target);
                if !keep {
                    job.abort();
                }
                keep
            });
            for (group, (url, backoff_max_ms)) in wanted {
                if running.contains_key(&group) {
                    continue;
                }
                let job = tokio::spawn(push_group(
                    engine.clone(),
                    client.clone(),
                    config.clone(),
                    group.clone(),
                    url.clone(),
                    backoff_max_ms,
                ));
                running.insert(group, ((url, backoff_max_ms), job));
            }
        }
        tokio::time::sleep(every).await;
    }
}

/// One group's pusher: takes deliveries as requests finish, at most `max_concurrency` at a
/// time, and settles each by its answer.
async fn push_group(
    engine: EngineHandle,
    client: HttpClient,
    config: PushConfig,
    group: GroupName,
    url: String,
    backoff_max_ms: u64,
) {
    let Ok(who) = ClientId::new(PUSH_CLIENT) else {
        return;
    };
    let stream = match engine
        .open_stream(&group, &who, config.max_concurrency)
        .await
    {
        Ok(s) => Arc::new(s),
        Err(e) => {
            tracing::warn!(%group, error = %e, "cannot start the webhook pusher");
            return;
        }
    };
    tracing::info!(%group, %url, "webhook pusher started");
    let mut inflight: JoinSet<()> = JoinSet::new();
    let max = config.max_concurrency as usize;
    loop {
        let free = max.saturating_sub(inflight.len());
        if free == 0 {
            let _ = inflight.join_next().await;
            continue;
        }
        tokio::select! {
            batch = stream.next(free) => {
                let Some(batch) = batch else { break };
                for d in batch {
                    let (client, config, url, stream) =
                        (client.clone(), config.clone(), url.clone(), stream.clone());
                    let group = group.clone();
                    inflight.spawn(async move {
                        let outcome = push_one(&client, &config, &group, &url, &d, backoff_max_ms).await;
                        stream.settled(vec![d.id], outcome);
                    });
                }
            }
            Some(_) = inflight.join_next(), if !inflight.is_empty() => {}
        }
    }
    // The session ended; requests still in flight finish and settle (their ids may be
    // refused as stale: harmless).
    while inflight.join_next().await.is_some() {}
    tracing::info!(%group, "webhook pusher stopped");
}

/// POSTs one delivery and says how it ended.
async fn push_one(
    client: &HttpClient,
    config: &PushConfig,
    group: &GroupName,
    url: &str,
    d: &Delivery,
    backoff_max_ms: u64,
) -> PushOutcome {
    let backoff = PushOutcome::Nack { delay_ms: None };
    if !host_allowed(&config.allowed_hosts, url) {
        tracing::warn!(%group, %url, "push target not in push.allowed_hosts; NACKed");
        return backoff;
    }
    let (headers, body) =
        match to_binary_request_parts(&d.record.body, d.partition, d.record.offset) {
            Ok(parts) => parts,
            Err(e) => {
                tracing::error!(%group, id = %d.id, error = %e, "cannot render the event for push");
                return backoff;
            }
        };
    let Ok(uri) = url.parse::<Uri>() else {
        return backoff;
    };
    let mut req = Request::new(Full::new(body));
    *req.method_mut() = Method::POST;
    *req.uri_mut() = uri;
    *req.headers_mut() = headers;
    if let Ok(v) = HeaderValue::from_str(&d.id.to_string()) {
        req.headers_mut().insert(DELIVERY_ID_HEADER, v);
    }
    req.headers_mut()
        .insert(ATTEMPT_HEADER, HeaderValue::from(d.attempt));
    let timeout = Duration::from_millis(config.request_timeout_ms);
    let answer = tokio::time::timeout(timeout, async {
        let res = client.request(req).await?;
        let status = res.status();
        let retry_after = res
            .headers()
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        // Read (and drop) the answer's body so the connection can be reused.
        let _ = res.into_body().collect().await;
        Ok::<_, hyper_util::client::legacy::Error>((status, retry_after))
    })
    .await;
    match answer {
        Ok(Ok((status, _))) if status.is_success() => PushOutcome::Ack,
        Ok(Ok((status, Some(secs))))
            if status == StatusCode::TOO_MANY_REQUESTS
                || status == StatusCode::SERVICE_UNAVAILABLE =>
        {
            let delay_ms = secs.saturating_mul(1000).min(backoff_max_ms);
            tracing::debug!(%group, id = %d.id, %status, delay_ms, "push deferred by the subscriber");
            PushOutcome::Nack {
                delay_ms: Some(delay_ms),
            }
        }
        Ok(Ok((status, _))) => {
            tracing::debug!(%group, id = %d.id, %status, "push refused");
            backoff
        }
        Ok(Err(e)) => {
            tracing::debug!(%group, id = %d.id, error = %e, "push failed");
            backoff
        }
        Err(_) => {
            tracing::debug!(%group, id = %d.id, "push timed out");
            backoff
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allow_list_names_hosts() {
        assert!(host_allowed("", "http://anything:9/x"));
        assert!(host_allowed(
            " a.example , b.example",
            "http://B.example:80/x"
        ));
        assert!(!host_allowed("a.example", "http://127.0.0.1:8081/admin"));
        assert!(!host_allowed("a.example", "not a url"));
    }
}
