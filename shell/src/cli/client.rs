//! A small blocking HTTP client (ureq) for the two APIs of a running server. Every status
//! comes back as an [`Answer`]; [`Answer::ok`] turns an error answer into one readable
//! line (`POST http://…/v1/topics/t/events: 400 invalid-cloudevent: …`). A transport
//! failure is [`Failure::Unreachable`].
//!
//! `https://` URLs are spoken by rustls (on `ring`, like the server): the server's
//! certificate must chain to a CA of `--cacert FILE`, or without it to one of the system's
//! (`rustls-native-certs`: `/etc/ssl/certs`, or `SSL_CERT_FILE`/`SSL_CERT_DIR`), and name
//! the URL's host. `--client-cert`/`--client-key` present a client certificate to a
//! listener with mTLS.

use std::io::Read;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use percent_encoding::{utf8_percent_encode, AsciiSet, CONTROLS};
use serde_json::Value;
use ureq::tls::{Certificate, ClientCert, PemItem, PrivateKey, RootCerts, TlsConfig, TlsProvider};

use super::{Common, Failure};

/// How long one request may take (a stream has no overall limit, only a connect timeout).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest answer read into memory.
const MAX_ANSWER_BYTES: u64 = 64 << 20;

/// Characters escaped in a path segment: everything but unreserved ones (RFC 3986).
const SEGMENT: &AsciiSet = &CONTROLS
    .add(b' ')
    .add(b'"')
    .add(b'#')
    .add(b'%')
    .add(b'/')
    .add(b'<')
    .add(b'>')
    .add(b'?')
    .add(b'`')
    .add(b'{')
    .add(b'}')
    .add(b'&')
    .add(b'+')
    .add(b'=');

/// One path segment (a topic, group or client name), escaped.
pub fn segment(name: &str) -> String {
    utf8_percent_encode(name, SEGMENT).to_string()
}

/// Which listener a request goes to.
#[derive(Clone, Copy, Debug)]
pub enum Api {
    Admin,
    Traffic,
}

pub struct Client {
    server: String,
    admin: String,
    token: Option<String>,
    agent: ureq::Agent,
    streams: ureq::Agent,
}

/// A server's answer.
pub struct Answer {
    /// `METHOD url`, for messages.
    pub what: String,
    pub status: u16,
    /// `Retry-After` in seconds, when given.
    pub retry_after: Option<u64>,
    pub body: Vec<u8>,
}

impl Answer {
    /// The body as JSON when the status is 2xx; otherwise the server's error as one line.
    pub fn ok(self) -> Result<Value, Failure> {
        if !(200..300).contains(&self.status) {
            return Err(Failure::Refused(self.error_line()));
        }
        serde_json::from_slice(&self.body).map_err(|e| {
            Failure::Refused(format!(
                "{}: {} with an answer that is not JSON ({e})",
                self.what, self.status
            ))
        })
    }

    /// `METHOD url: STATUS code: message` (or the start of a body that is not the API's
    /// error shape).
    pub fn error_line(&self) -> String {
        format!("{}: {}", self.what, self.reason())
    }

    /// `STATUS code: message`, without the request.
    pub fn reason(&self) -> String {
        let parsed: Option<(String, String)> = serde_json::from_slice::<Value>(&self.body)
            .ok()
            .and_then(|v| {
                Some((
                    v.get("error")?.as_str()?.to_owned(),
                    v.get("message")?.as_str()?.to_owned(),
                ))
            });
        match parsed {
            Some((code, message)) => format!("{} {code}: {message}", self.status),
            None => {
                let text = String::from_utf8_lossy(&self.body);
                let text: String = text.trim().chars().take(200).collect();
                if text.is_empty() {
                    format!("{}", self.status)
                } else {
                    format!("{}: {text}", self.status)
                }
            }
        }
    }
}

fn agent(timeout: Option<Duration>, tls: &TlsConfig) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        // Direct connections: a proxy variable meant for the internet must not capture
        // requests to the mesh.
        .proxy(None)
        .timeout_global(timeout)
        .timeout_connect(Some(CONNECT_TIMEOUT))
        .tls_config(tls.clone())
        .build()
        .into()
}

/// A base URL without its trailing `/`: `http://` or `https://`.
fn base(flag: &str, url: &str) -> Result<String, Failure> {
    let parsed = url::Url::parse(url)
        .map_err(|e| Failure::Usage(format!("--{flag} {url:?} is not a URL: {e}")))?;
    match parsed.scheme() {
        "http" | "https" => Ok(url.trim_end_matches('/').to_owned()),
        other => Err(Failure::Usage(format!(
            "--{flag} {url}: scheme {other} is not http or https"
        ))),
    }
}

/// The TLS settings of both agents: rustls on `ring`, trusting the CA certificates of
/// `--cacert`, or the system's when an `https://` URL is given without it (with neither,
/// the roots are never used: no connection speaks TLS), and presenting the client
/// certificate of `--client-cert`/`--client-key` when given.
fn tls_config(c: &Common, https: bool) -> Result<TlsConfig, Failure> {
    let roots = match &c.cacert {
        Some(path) => RootCerts::from(certificates("cacert", path)?),
        None if https => RootCerts::from(system_certificates()?),
        None => RootCerts::Specific(Arc::new(Vec::new())),
    };
    let client = match (&c.client_cert, &c.client_key) {
        (Some(cert), Some(key)) => Some(ClientCert::new_with_certs(
            &certificates("client-cert", cert)?,
            private_key(key)?,
        )),
        // clap makes each of the two require the other.
        _ => None,
    };
    Ok(TlsConfig::builder()
        .provider(TlsProvider::Rustls)
        .unversioned_rustls_crypto_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .root_certs(roots)
        .client_cert(client)
        .build())
}

/// Every certificate of the PEM file of `--FLAG`; at least one.
fn certificates(flag: &str, path: &Path) -> Result<Vec<Certificate<'static>>, Failure> {
    let bad = |why: String| Failure::Usage(format!("--{flag} {}: {why}", path.display()));
    let pem = std::fs::read(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
    let mut certs = Vec::new();
    for item in ureq::tls::parse_pem(&pem) {
        match item {
            Ok(PemItem::Certificate(c)) => certs.push(c),
            Ok(_) => {}
            Err(e) => return Err(bad(format!("not a PEM file: {e}"))),
        }
    }
    if certs.is_empty() {
        return Err(bad("no CERTIFICATE in it".into()));
    }
    Ok(certs)
}

/// The private key of the PEM file `--client-key`.
fn private_key(path: &Path) -> Result<PrivateKey<'static>, Failure> {
    let bad = |why: String| Failure::Usage(format!("--client-key {}: {why}", path.display()));
    let pem = std::fs::read(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
    PrivateKey::from_pem(&pem).map_err(|_| bad("no PRIVATE KEY in it".into()))
}

/// The system's CA certificates; an error when there are none.
fn system_certificates() -> Result<Vec<Certificate<'static>>, Failure> {
    let found = rustls_native_certs::load_native_certs();
    if found.certs.is_empty() {
        let why = found
            .errors
            .first()
            .map(|e| format!(" ({e})"))
            .unwrap_or_default();
        return Err(Failure::Usage(format!(
            "https: no CA certificates of the system could be read{why}; give the server's \
             CA with --cacert FILE"
        )));
    }
    Ok(found
        .certs
        .iter()
        .map(|c| Certificate::from_der(c.as_ref()).to_owned())
        .collect())
}

impl Client {
    pub fn new(c: &Common) -> Result<Self, Failure> {
        let server = base("server", &c.server)?;
        let admin = base("admin", &c.admin)?;
        let https = [&server, &admin].iter().any(|u| u.starts_with("https:"));
        let tls = tls_config(c, https)?;
        Ok(Self {
            server,
            admin,
            token: c.token.clone().filter(|t| !t.is_empty()),
            agent: agent(Some(REQUEST_TIMEOUT), &tls),
            streams: agent(None, &tls),
        })
    }

    pub fn url(&self, api: Api, path_and_query: &str) -> String {
        let base = match api {
            Api::Admin => &self.admin,
            Api::Traffic => &self.server,
        };
        format!("{base}{path_and_query}")
    }

    pub fn get(&self, api: Api, path: &str) -> Result<Answer, Failure> {
        self.call(api, "GET", path, None)
    }

    pub fn post_json(&self, api: Api, path: &str, body: &Value) -> Result<Answer, Failure> {
        self.call(
            api,
            "POST",
            path,
            Some(("application/json", body.to_string().into_bytes())),
        )
    }

    /// A request with an optional `(content type, body)`.
    pub fn call(
        &self,
        api: Api,
        method: &str,
        path: &str,
        body: Option<(&str, Vec<u8>)>,
    ) -> Result<Answer, Failure> {
        let url = self.url(api, path);
        let what = format!("{method} {url}");
        let mut response = self.send(&self.agent, &what, method, &url, body, &[])?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok());
        let body = response
            .body_mut()
            .with_config()
            .limit(MAX_ANSWER_BYTES)
            .read_to_vec()
            .map_err(|e| unreachable(&what, &e))?;
        Ok(Answer {
            what,
            status,
            retry_after,
            body,
        })
    }

    /// Opens a streaming GET (Server-Sent Events): on 200 the body as a reader, otherwise
    /// the server's error.
    pub fn stream(&self, api: Api, path: &str) -> Result<impl Read + Send + 'static, Failure> {
        let url = self.url(api, path);
        let what = format!("GET {url}");
        let mut response = self.send(
            &self.streams,
            &what,
            "GET",
            &url,
            None,
            &[("accept", "text/event-stream")],
        )?;
        let status = response.status().as_u16();
        if status != 200 {
            let body = response
                .body_mut()
                .with_config()
                .limit(MAX_ANSWER_BYTES)
                .read_to_vec()
                .unwrap_or_default();
            let answer = Answer {
                what,
                status,
                retry_after: None,
                body,
            };
            return Err(Failure::Refused(answer.error_line()));
        }
        Ok(response.into_body().into_reader())
    }

    fn send(
        &self,
        agent: &ureq::Agent,
        what: &str,
        method: &str,
        url: &str,
        body: Option<(&str, Vec<u8>)>,
        headers: &[(&str, &str)],
    ) -> Result<ureq::http::Response<ureq::Body>, Failure> {
        let mut builder = ureq::http::Request::builder().method(method).uri(url);
        if let Some(token) = &self.token {
            builder = builder.header("authorization", format!("Bearer {token}"));
        }
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        match body {
            Some((content_type, bytes)) => builder
                .header("content-type", content_type)
                .body(bytes)
                .map_err(|e| Failure::Usage(format!("{what}: {e}")))
                .and_then(|r| agent.run(r).map_err(|e| classify(what, &e))),
            None => builder
                .body(())
                .map_err(|e| Failure::Usage(format!("{what}: {e}")))
                .and_then(|r| agent.run(r).map_err(|e| classify(what, &e))),
        }
    }
}

/// A request that could not be made: a bad URL is usage, anything else unreachable.
fn classify(what: &str, e: &ureq::Error) -> Failure {
    match e {
        ureq::Error::BadUri(_) | ureq::Error::Http(_) => Failure::Usage(format!("{what}: {e}")),
        _ => match tls_error(e) {
            Some(tls) => Failure::Unreachable(format!(
                "{what}: TLS with the server failed: {tls}{}",
                tls_hint(tls)
            )),
            None => unreachable(what, e),
        },
    }
}

/// What to try after a TLS failure: the server's certificate did not verify, or the
/// server refused the client's (or its absence).
fn tls_hint(e: &rustls::Error) -> &'static str {
    use rustls::AlertDescription as A;
    match e {
        rustls::Error::InvalidCertificate(_) => " (a server with a private CA: --cacert FILE)",
        rustls::Error::AlertReceived(
            A::CertificateRequired
            | A::BadCertificate
            | A::CertificateExpired
            | A::CertificateRevoked
            | A::CertificateUnknown
            | A::UnknownCA,
        ) => " (the server asks for a client certificate it accepts: --client-cert FILE --client-key FILE)",
        _ => "",
    }
}

/// The rustls error behind a failed request, if TLS failed (ureq hands it out as is, or
/// inside the I/O error of the handshake).
fn tls_error(e: &ureq::Error) -> Option<&rustls::Error> {
    match e {
        ureq::Error::Rustls(tls) => Some(tls),
        ureq::Error::Io(io) => io.get_ref()?.downcast_ref::<rustls::Error>(),
        _ => None,
    }
}

fn unreachable(what: &str, e: &ureq::Error) -> Failure {
    Failure::Unreachable(format!("{what}: cannot reach the server: {e}"))
}

#[cfg(test)]
mod tests {
    use base64::Engine as _;

    use super::*;

    fn answer(status: u16, body: &str) -> Answer {
        Answer {
            what: "GET http://h/x".into(),
            status,
            retry_after: None,
            body: body.as_bytes().to_vec(),
        }
    }

    #[test]
    fn an_error_answer_is_one_line_with_status_code_and_message() {
        let a = answer(404, r#"{"error":"unknown-group","message":"no group g"}"#);
        assert_eq!(
            a.ok(),
            Err(Failure::Refused(
                "GET http://h/x: 404 unknown-group: no group g".into()
            ))
        );
        let a = answer(502, "<html>bad gateway</html>\n");
        assert_eq!(
            a.error_line(),
            "GET http://h/x: 502: <html>bad gateway</html>"
        );
        assert_eq!(
            answer(200, r#"{"a":1}"#).ok(),
            Ok(serde_json::json!({"a": 1}))
        );
    }

    #[test]
    fn names_are_escaped_as_one_path_segment() {
        assert_eq!(segment("orders.eu-1_x~"), "orders.eu-1_x~");
        assert_eq!(segment("a/b?c#d e"), "a%2Fb%3Fc%23d%20e");
    }

    #[test]
    fn only_http_and_https_urls_are_taken() {
        assert_eq!(
            base("server", "http://127.0.0.1:8080/"),
            Ok("http://127.0.0.1:8080".into())
        );
        assert_eq!(
            base("server", "https://mesh:8443/"),
            Ok("https://mesh:8443".into())
        );
        assert!(matches!(base("server", "ftp://x"), Err(Failure::Usage(_))));
        assert!(matches!(base("admin", "127.0.0.1"), Err(Failure::Usage(_))));
    }

    /// The common arguments with these files.
    fn with_files(cacert: Option<&Path>, client: Option<(&Path, &Path)>) -> Common {
        Common {
            server: "https://127.0.0.1:8443".into(),
            admin: "https://127.0.0.1:8444".into(),
            token: None,
            cacert: cacert.map(Path::to_owned),
            client_cert: client.map(|(c, _)| c.to_owned()),
            client_key: client.map(|(_, k)| k.to_owned()),
            json: false,
        }
    }

    #[test]
    fn unusable_certificate_and_key_files_are_usage_errors_naming_them() {
        let dir = tempfile::tempdir().expect("temp dir");
        let missing = dir.path().join("missing.pem");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "no PEM here\n").expect("write");
        for (path, why) in [(&missing, "cannot read it"), (&empty, "no CERTIFICATE")] {
            for (flag, args) in [
                ("--cacert ", with_files(Some(path), None)),
                ("--client-cert ", with_files(None, Some((path, path)))),
            ] {
                // Without https URLs no system certificates are looked for.
                match tls_config(&args, false) {
                    Err(Failure::Usage(m)) => {
                        assert!(m.starts_with(flag) && m.contains(why), "{m}");
                        assert!(m.contains(&path.display().to_string()), "{m}");
                    }
                    other => panic!("{flag}{path:?}: {:?}", other.map(|_| ())),
                }
            }
        }
        // A certificate file that is fine, and a key file without a key.
        let cert = dir.path().join("cert.pem");
        let der = base64::engine::general_purpose::STANDARD.encode([0x30, 0x00]);
        std::fs::write(
            &cert,
            format!("-----BEGIN CERTIFICATE-----\n{der}\n-----END CERTIFICATE-----\n"),
        )
        .expect("write");
        for (key, why) in [(&missing, "cannot read it"), (&cert, "no PRIVATE KEY")] {
            match tls_config(&with_files(None, Some((&cert, key))), false) {
                Err(Failure::Usage(m)) => {
                    assert!(m.starts_with("--client-key ") && m.contains(why), "{m}");
                }
                other => panic!("{key:?}: {:?}", other.map(|_| ())),
            }
        }
    }
}
