//! The OTLP exporter (HTTP/protobuf): a `tracing-opentelemetry` layer over an
//! `opentelemetry_sdk` batch processor whose exporter sends with the blocking `ureq` from
//! the processor's own thread (no async runtime, no reqwest, no gRPC).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider as _,
};
use opentelemetry::Context;
use opentelemetry_http::{HttpClient, HttpError};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::{Layer, Registry};

use super::context::TraceParent;
use crate::config::Otel;

/// The standard variables that turn the exporter on when `[otel] endpoint` is empty.
pub const STANDARD_ENDPOINT_VARS: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
];

/// One export's bound (connect and send), so a dead collector never holds the batch thread.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// The installed exporter: flushes what is buffered when [`Exporter::shutdown`] runs.
pub struct Exporter {
    provider: SdkTracerProvider,
    /// Where spans go, for the startup line.
    pub endpoint: String,
}

impl Exporter {
    /// Sends what is buffered and stops the batch thread (at exit).
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "the OTLP exporter did not shut down cleanly");
        }
    }
}

/// Whether an exporter is configured: `[otel] endpoint` (`UNIMESH_OTEL_ENDPOINT`), or one
/// of the standard `OTEL_EXPORTER_OTLP_*ENDPOINT` variables.
pub fn configured(cfg: &Otel) -> bool {
    !cfg.endpoint.is_empty()
        || STANDARD_ENDPOINT_VARS
            .iter()
            .any(|v| std::env::var_os(v).is_some_and(|s| !s.is_empty()))
}

/// The layer exporting the mesh's spans (the per-event spans of [`super::TARGET`] and
/// every INFO span), and the exporter to shut down at exit. `None` when not configured.
pub fn layer(cfg: &Otel) -> Result<Option<(impl Layer<Registry>, Exporter)>, String> {
    if !configured(cfg) {
        return Ok(None);
    }
    let mut builder = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_http_client(UreqClient::new()?)
        .with_timeout(EXPORT_TIMEOUT);
    // `[otel] endpoint` is a base URL like OTEL_EXPORTER_OTLP_ENDPOINT; the crate takes a
    // programmatic endpoint as the full traces URL.
    let endpoint = if cfg.endpoint.is_empty() {
        STANDARD_ENDPOINT_VARS
            .iter()
            .find_map(|v| std::env::var(v).ok().filter(|s| !s.is_empty()))
            .unwrap_or_default()
    } else {
        let full = format!("{}/v1/traces", cfg.endpoint.trim_end_matches('/'));
        builder = builder.with_endpoint(full.clone());
        full
    };
    let exporter = builder
        .build()
        .map_err(|e| format!("the OTLP exporter cannot be built: {e}"))?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            Resource::builder()
                .with_service_name(cfg.service_name.clone())
                .build(),
        )
        .build();
    let tracer = provider.tracer("unimesh");
    let filter = Targets::new()
        .with_target(super::TARGET, tracing::Level::DEBUG)
        .with_default(tracing::Level::INFO);
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(filter);
    super::EXPORTING.store(true, std::sync::atomic::Ordering::Relaxed);
    Ok(Some((layer, Exporter { provider, endpoint })))
}

/// Sets the remote parent of a span not yet started.
pub(super) fn set_parent(span: &Span, p: TraceParent, state: Option<&str>) {
    let state = state
        .and_then(|s| s.parse::<TraceState>().ok())
        .unwrap_or_default();
    let remote = SpanContext::new(
        TraceId::from_bytes(p.trace_id),
        SpanId::from_bytes(p.span_id),
        TraceFlags::new(p.flags),
        true,
        state,
    );
    // Fails only when the span is off for the exporter or already started: then it keeps
    // the parent it has.
    let _ = span.set_parent(Context::new().with_remote_span_context(remote));
}

/// The span's own context as a `traceparent` (for a push's header), when it has one.
pub(super) fn span_parent(span: &Span) -> Option<TraceParent> {
    let cx = span.context();
    let own = cx.span().span_context().clone();
    own.is_valid().then(|| TraceParent {
        trace_id: own.trace_id().to_bytes(),
        span_id: own.span_id().to_bytes(),
        flags: own.trace_flags().to_u8(),
    })
}

/// The exporter's HTTP client: `ureq`, blocking, on the batch processor's thread;
/// `https://` by rustls on `ring` trusting the system's CA certificates.
#[derive(Debug)]
struct UreqClient(ureq::Agent);

impl UreqClient {
    fn new() -> Result<Self, String> {
        use ureq::tls::{Certificate, RootCerts, TlsConfig, TlsProvider};
        let roots: Vec<Certificate<'static>> = rustls_native_certs::load_native_certs()
            .certs
            .iter()
            .map(|c| Certificate::from_der(c.as_ref()).to_owned())
            .collect();
        let tls = TlsConfig::builder()
            .provider(TlsProvider::Rustls)
            .unversioned_rustls_crypto_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .root_certs(RootCerts::from(roots))
            .build();
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(EXPORT_TIMEOUT))
            .tls_config(tls)
            .build()
            .into();
        Ok(Self(agent))
    }
}

#[async_trait::async_trait]
impl HttpClient for UreqClient {
    async fn send_bytes(
        &self,
        request: http::Request<Bytes>,
    ) -> Result<http::Response<Bytes>, HttpError> {
        let request = request.map(|b| b.to_vec());
        let (parts, mut body) = self.0.run(request)?.into_parts();
        let bytes = body.read_to_vec()?;
        Ok(http::Response::from_parts(parts, Bytes::from(bytes)))
    }
}
