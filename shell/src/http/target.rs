//! The push side of the target rule (`policy::targets`): the resolver of a pusher's HTTP
//! client checks every address a name resolves to, so the connection goes only to an
//! address that passed.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::client::legacy::connect::dns::Name;

use crate::policy::{Refusal, TargetPolicy};

/// The resolver of a pusher's HTTP client: resolves a host name and hands the connector
/// only the addresses the policy allows, so the connection goes to a checked address.
/// Built per pusher, for the port of its URL (the connector does not tell a resolver).
#[derive(Clone)]
pub struct CheckedResolver {
    policy: Arc<TargetPolicy>,
    port: u16,
}

impl CheckedResolver {
    pub fn new(policy: Arc<TargetPolicy>, port: u16) -> Self {
        Self { policy, port }
    }
}

/// Why resolving a push target's name gave nothing to connect to.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("cannot resolve {host}: {error}")]
    Lookup { host: String, error: std::io::Error },
    #[error(transparent)]
    Refused(Refusal),
}

type Resolving =
    Pin<Box<dyn Future<Output = Result<std::vec::IntoIter<SocketAddr>, ResolveError>> + Send>>;

impl tower::Service<Name> for CheckedResolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = ResolveError;
    type Future = Resolving;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let (policy, port) = (self.policy.clone(), self.port);
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), port))
                .await
                .map_err(|error| ResolveError::Lookup {
                    host: host.clone(),
                    error,
                })?
                .collect();
            let listed = policy.name_listed(&host);
            let mut refused = None;
            let mut allowed = Vec::new();
            for addr in found {
                match policy.check_addr(addr, listed) {
                    Ok(()) => allowed.push(addr),
                    Err(r) => refused = refused.or(Some(r)),
                }
            }
            if allowed.is_empty() {
                return Err(ResolveError::Refused(
                    refused.unwrap_or(Refusal::NoAddress { host }),
                ));
            }
            Ok(allowed.into_iter())
        })
    }
}

/// The refusal somewhere in an error's chain of sources (a push that failed because its
/// target was refused).
pub fn refusal_in(error: &(dyn std::error::Error + 'static)) -> Option<Refusal> {
    let mut at: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = at {
        if let Some(ResolveError::Refused(r)) = e.downcast_ref::<ResolveError>() {
            return Some(r.clone());
        }
        at = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_resolver_hands_over_only_allowed_addresses() {
        use tower::Service as _;
        let strict = Arc::new(TargetPolicy::parse("").expect("empty list"));
        let mut r = CheckedResolver::new(strict, 9000);
        let name: Name = "localhost".parse().expect("a name");
        match r.call(name.clone()).await {
            Err(e @ ResolveError::Refused(_)) => {
                assert!(refusal_in(&e).is_some());
            }
            other => panic!(
                "localhost resolved to something allowed: {:?}",
                other.map(|a| a.collect::<Vec<_>>())
            ),
        }
        let open = Arc::new(TargetPolicy::parse("localhost").expect("a list"));
        let mut r = CheckedResolver::new(open, 9000);
        let got: Vec<SocketAddr> = r.call(name).await.expect("allowed").collect();
        assert!(!got.is_empty() && got.iter().all(|a| a.port() == 9000 && a.ip().is_loopback()));
    }
}
