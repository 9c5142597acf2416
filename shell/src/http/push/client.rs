//! The binary's [`Post`]: hyper's client on the checked resolver (`target.rs`), so a
//! connection goes only to an address `push.allowed_hosts` lets through. Not under madsim
//! (the connector is tokio's own I/O): the harness gives its simulated targets instead.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::RETRY_AFTER;
use http::{Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::{Answer, Post, PostError};
use crate::config::Push as PushConfig;
use crate::engine::PushTarget;
use crate::http::target::{refusal_in, CheckedResolver};
use crate::policy::TargetPolicy;

type HttpClient = Client<HttpConnector<CheckedResolver>, Full<Bytes>>;

/// One group's HTTP client.
pub(super) struct HyperPost {
    client: HttpClient,
}

impl HyperPost {
    pub(super) fn new(policy: Arc<TargetPolicy>, config: &PushConfig, target: &PushTarget) -> Self {
        let port = target.url.parse::<Uri>().ok().map(|u| {
            u.port_u16().unwrap_or(if u.scheme_str() == Some("https") {
                443
            } else {
                80
            })
        });
        // The resolver checks names; IP literals (which the connector does not resolve) are
        // checked before each request.
        let mut connector =
            HttpConnector::new_with_resolver(CheckedResolver::new(policy, port.unwrap_or(80)));
        connector.set_connect_timeout(Some(Duration::from_millis(config.request_timeout_ms.get())));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Self { client }
    }
}

impl Post for HyperPost {
    fn post(
        &self,
        request: Request<Full<Bytes>>,
    ) -> Pin<Box<dyn Future<Output = Result<Answer, PostError>> + Send + '_>> {
        Box::pin(async move {
            let res = self
                .client
                .request(request)
                .await
                .map_err(|e| match refusal_in(&e) {
                    Some(refusal) => PostError::Refused(refusal),
                    None => PostError::Failed(e.to_string()),
                })?;
            let status = res.status();
            let retry_after = res
                .headers()
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok());
            // Read (and drop) the answer's body so the connection can be reused.
            let _ = res.into_body().collect().await;
            Ok(Answer {
                status,
                retry_after,
            })
        })
    }
}
