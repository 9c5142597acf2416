//! TLS on both listeners (issue 19), by rustls with the `ring` provider.
//!
//! - `[server.tls]` names a PEM chain and key; ALPN offers `h2` and `http/1.1` (hyper's
//!   auto builder serves either on the decrypted stream).
//! - With `client_ca`, client certificates are verified by rustls' `WebPkiClientVerifier`
//!   (`require`, or `optional`: a handshake without one is allowed); the verified
//!   certificate's subject CN, or without one its first DNS name, is the caller's
//!   identity ([`peer_identity`]), which `http::auth` gives the rights of the identity of
//!   that name — the same rights table as for tokens.
//! - [`Tls::reload`] (on SIGHUP) builds a new `ServerConfig` from the same files and swaps
//!   it in: each accepted connection takes the config current at its accept, so an open
//!   connection (a stream, a long-poll) keeps its session and a new one gets the new
//!   certificate. A reload that fails keeps the old config.
//! - Plain HTTP sent to a TLS port: the first byte of a TLS connection is a handshake
//!   record (0x16); anything else gets a plain-text `HTTP/1.1 400` with the API's JSON
//!   error body (`tls-required`) and the connection is closed (see `server.rs`).
//!
//! Not built under madsim (the simulator has no sockets, and rustls has no use there).

use std::path::Path;
use std::sync::{Arc, RwLock};

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ServerConnection, WebPkiClientVerifier};
use rustls::{RootCertStore, ServerConfig};
use sha2::{Digest, Sha256};
use spki::der::asn1::{AnyRef, Ia5StringRef, PrintableStringRef, Utf8StringRef};
use spki::der::{Decode as _, Reader as _, SliceReader, Tag, Tagged as _};
use spki::ObjectIdentifier;
use tokio_rustls::TlsAcceptor;

use crate::config::{self, ClientAuth};

/// The TLS settings in force, swapped on reload.
pub struct Tls {
    settings: config::Tls,
    current: RwLock<Loaded>,
}

#[derive(Clone)]
struct Loaded {
    config: Arc<ServerConfig>,
    /// SHA-256 of the leaf certificate (hex), for the log.
    fingerprint: String,
}

impl Tls {
    /// Reads the files of `[server.tls]`; the error is one line naming the key and file.
    pub fn load(settings: &config::Tls) -> Result<Self, String> {
        let loaded = build(settings)?;
        Ok(Self {
            settings: settings.clone(),
            current: RwLock::new(loaded),
        })
    }

    /// Reads the files again and uses them for new connections from now on. On error the
    /// old ones stay in use.
    pub fn reload(&self) -> Result<(), String> {
        let loaded = build(&self.settings)?;
        let mut current = self.current.write().unwrap_or_else(|p| p.into_inner());
        *current = loaded;
        Ok(())
    }

    /// An acceptor with the config current now.
    pub fn acceptor(&self) -> TlsAcceptor {
        let current = self.current.read().unwrap_or_else(|p| p.into_inner());
        TlsAcceptor::from(current.config.clone())
    }

    /// SHA-256 of the certificate served now (hex).
    pub fn fingerprint(&self) -> String {
        let current = self.current.read().unwrap_or_else(|p| p.into_inner());
        current.fingerprint.clone()
    }

    /// Whether client certificates are asked for.
    pub fn client_certs(&self) -> bool {
        self.settings.client_certs()
    }
}

/// The identity a verified client certificate names: its subject CN, or without one its
/// first DNS name. `None` without a certificate (or with one naming neither).
pub fn peer_identity(conn: &ServerConnection) -> Option<String> {
    let leaf = conn.peer_certificates()?.first()?;
    let cert = webpki::EndEntityCert::try_from(leaf).ok()?;
    common_name(cert.subject())
        .ok()
        .flatten()
        .filter(|cn| !cn.is_empty())
        .or_else(|| cert.valid_dns_names().next().map(str::to_owned))
}

/// Why the client's certificate was refused, when that is why a handshake failed: none
/// sent where one is required, or one that does not verify (another CA's, expired, not
/// valid yet, not for client authentication). tokio-rustls hands rustls' error out inside
/// the I/O error.
pub fn refused_client_certificate(e: &std::io::Error) -> Option<&rustls::Error> {
    let tls = e.get_ref()?.downcast_ref::<rustls::Error>()?;
    matches!(
        tls,
        rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented
    )
    .then_some(tls)
}

/// commonName (X.520, 2.5.4.3).
const COMMON_NAME: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.4.3");

/// The first commonName of a certificate subject's RDNs (the `Name` without its outer
/// `SEQUENCE`, as `webpki::EndEntityCert::subject` gives it), read by `der`: `None`
/// without one; an error for malformed DER, or a CN that is not a UTF-8, printable or IA5
/// string.
fn common_name(name: &[u8]) -> Result<Option<String>, spki::der::Error> {
    let mut rdns = SliceReader::new(name)?;
    while !rdns.is_finished() {
        let rdn = AnyRef::decode(&mut rdns)?;
        rdn.tag().assert_eq(Tag::Set)?;
        let mut attributes = SliceReader::new(rdn.value())?;
        while !attributes.is_finished() {
            let (kind, value) = attributes.sequence(|a| {
                Ok::<_, spki::der::Error>((ObjectIdentifier::decode(a)?, AnyRef::decode(a)?))
            })?;
            if kind != COMMON_NAME {
                continue;
            }
            let text = match value.tag() {
                Tag::Utf8String => value.decode_as::<Utf8StringRef<'_>>()?.as_str(),
                Tag::PrintableString => value.decode_as::<PrintableStringRef<'_>>()?.as_str(),
                Tag::Ia5String => value.decode_as::<Ia5StringRef<'_>>()?.as_str(),
                other => return Err(other.value_error().into()),
            };
            return Ok(Some(text.to_owned()));
        }
    }
    Ok(None)
}

fn build(s: &config::Tls) -> Result<Loaded, String> {
    let certs = read_certs(&s.cert, "server.tls.cert")?;
    let key = PrivateKeyDer::from_pem_file(&s.key).map_err(|e| {
        format!(
            "server.tls.key {}: {}",
            s.key.display(),
            pem_error(&e, "no PRIVATE KEY in it")
        )
    })?;
    let fingerprint = certs
        .first()
        .map(|c| hex(&Sha256::digest(c.as_ref())))
        .unwrap_or_default();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = if s.client_certs() {
        let mut roots = RootCertStore::empty();
        for ca in read_certs(&s.client_ca, "server.tls.client_ca")? {
            roots.add(ca).map_err(|e| {
                format!(
                    "server.tls.client_ca {}: not a CA certificate: {e}",
                    s.client_ca.display()
                )
            })?;
        }
        let mut verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
        if s.client_auth == ClientAuth::Optional {
            verifier = verifier.allow_unauthenticated();
        }
        let verifier = verifier
            .build()
            .map_err(|e| format!("server.tls.client_ca {}: {e}", s.client_ca.display()))?;
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let mut config = builder.with_single_cert(certs, key).map_err(|e| {
        format!(
            "server.tls.key {} does not fit server.tls.cert {}: {e}",
            s.key.display(),
            s.cert.display()
        )
    })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Loaded {
        config: Arc::new(config),
        fingerprint,
    })
}

/// Every certificate of a PEM file; at least one.
fn read_certs(path: &Path, key: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let bad = |why: String| format!("{key} {}: {why}", path.display());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(pem_error(&e, "no CERTIFICATE in it")))?
        .collect::<Result<_, _>>()
        .map_err(|e| bad(pem_error(&e, "no CERTIFICATE in it")))?;
    if certs.is_empty() {
        return Err(bad("no CERTIFICATE in it".into()));
    }
    Ok(certs)
}

fn pem_error(e: &rustls::pki_types::pem::Error, none: &str) -> String {
    use rustls::pki_types::pem::Error;
    match e {
        Error::Io(io) => format!("cannot read it: {io}"),
        Error::NoItemsFound => none.to_owned(),
        other => format!("not a PEM file: {other}"),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `CN=billing, O=Shop` as `openssl` writes a subject (two RDNs), without the outer
    /// SEQUENCE.
    const SUBJECT: &[u8] = &[
        0x31, 0x0d, 0x30, 0x0b, 0x06, 0x03, 0x55, 0x04, 0x0a, 0x0c, 0x04, b'S', b'h', b'o', b'p',
        0x31, 0x10, 0x30, 0x0e, 0x06, 0x03, 0x55, 0x04, 0x03, 0x0c, 0x07, b'b', b'i', b'l', b'l',
        b'i', b'n', b'g',
    ];

    #[test]
    fn the_common_name_is_found_among_the_rdns() {
        assert_eq!(common_name(SUBJECT), Ok(Some("billing".to_owned())));
        assert_eq!(common_name(&SUBJECT[..15]), Ok(None), "only O");
        assert_eq!(common_name(&[]), Ok(None));
        // The same CN as a PrintableString (0x13) and as an IA5String (0x16).
        for tag in [0x13, 0x16] {
            let mut other = SUBJECT.to_vec();
            other[24] = tag;
            assert_eq!(common_name(&other), Ok(Some("billing".to_owned())));
        }
    }

    #[test]
    fn malformed_names_are_errors_not_panics() {
        for cut in 0..SUBJECT.len() {
            let got = common_name(&SUBJECT[..cut]);
            if cut == 0 || cut == 15 {
                // Whole RDNs, none of them a CN.
                assert_eq!(got, Ok(None), "cut at {cut}");
            } else {
                assert!(got.is_err(), "cut at {cut}: {got:?}");
            }
        }
        for bad in [
            &[0x31, 0x84, 0xff, 0xff, 0xff, 0xff][..],
            &[0x31, 0x85, 0, 0, 0, 0, 1],
            &[0x1f, 0x00],
            // A SEQUENCE where an RDN's SET belongs.
            &[0x30, 0x00],
        ] {
            assert!(common_name(bad).is_err(), "{bad:?}");
        }
        // A CN that is an INTEGER, and one that is not valid UTF-8.
        let mut integer = SUBJECT.to_vec();
        integer[24] = 0x02;
        assert!(common_name(&integer).is_err());
        let mut bytes = SUBJECT.to_vec();
        bytes[26] = 0xff;
        assert!(common_name(&bytes).is_err());
    }
}
