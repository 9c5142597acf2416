//! JWT bearer tokens (issue 19), verified by `jsonwebtoken` (with `ring`).
//!
//! The algorithm is the configured key's, never the token's: `auth.jwt.algorithm` for a
//! `key_file`, each JWKS key's `alg` (or its type) for a `jwks_file`. A token whose header
//! names another algorithm is refused before any signature check, so `alg: none` and an
//! HS256 token "signed" with an RSA public key as its secret (algorithm confusion) never
//! verify. `exp` is required; `nbf` is checked when present; `aud` must be the configured
//! audience (and a token naming an audience is refused when none is configured); `iss`,
//! when configured, is required and must match. The claim `auth.jwt.identity_claim`
//! (default `sub`) names the identity, whose rights `http::auth` takes from
//! `[auth.identities.NAME]`.
//!
//! Every refusal is described in words that go into `WWW-Authenticate`'s
//! `error_description` and the 401 body (no quotes, no token content).
//!
//! Not built under madsim.

use std::path::Path;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::SubjectPublicKeyInfoDer;
use serde_json::{Map, Value};
use spki::der::Decode as _;
use spki::{ObjectIdentifier, SubjectPublicKeyInfoRef};

use crate::config::auth::Jwt;

/// Shortest HMAC secret accepted: the size of the SHA-256 output (RFC 7518 §3.2).
const MIN_SECRET_BYTES: usize = 32;

/// The keys of `[auth.jwt]`, ready for checking tokens.
pub struct Verifier {
    keys: Vec<Key>,
    /// A JWKS: tokens pick a key by `kid`.
    by_kid: bool,
    claim: String,
}

struct Key {
    kid: Option<String>,
    alg: Algorithm,
    key: DecodingKey,
    validation: Validation,
}

impl Verifier {
    /// The verifier of `[auth.jwt]`, `None` when JWTs are off. The error is one line
    /// naming the key and the file.
    pub fn load(cfg: &Jwt) -> Result<Option<Self>, String> {
        if !cfg.enabled() {
            return Ok(None);
        }
        let validation = |alg: Algorithm| {
            let mut v = Validation::new(alg);
            v.leeway = cfg.leeway_s;
            v.validate_nbf = true;
            v.validate_exp = true;
            // With no audience configured, a token naming one is refused (jsonwebtoken).
            v.validate_aud = true;
            if !cfg.audience.is_empty() {
                v.set_audience(&[cfg.audience.as_str()]);
                v.required_spec_claims.insert("aud".to_owned());
            }
            if !cfg.issuer.is_empty() {
                v.set_issuer(&[cfg.issuer.as_str()]);
                v.required_spec_claims.insert("iss".to_owned());
            }
            v
        };
        let keys = if cfg.jwks_file.as_os_str().is_empty() {
            let alg = algorithm(&cfg.algorithm).ok_or_else(|| {
                format!("auth.jwt.algorithm: {:?} is not supported", cfg.algorithm)
            })?;
            let key = key_from_file(&cfg.key_file, alg)?;
            vec![Key {
                kid: None,
                alg,
                key,
                validation: validation(alg),
            }]
        } else {
            let path = &cfg.jwks_file;
            let bad = |why: String| format!("auth.jwt.jwks_file {}: {why}", path.display());
            let text = std::fs::read(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
            let set: JwkSet =
                serde_json::from_slice(&text).map_err(|e| bad(format!("not a JWKS: {e}")))?;
            if set.keys.is_empty() {
                return Err(bad("holds no key".into()));
            }
            let wanted = algorithm(&cfg.algorithm);
            let mut keys = Vec::new();
            for (i, jwk) in set.keys.iter().enumerate() {
                let name = jwk.common.key_id.clone().unwrap_or_else(|| format!("#{i}"));
                let (alg, key) =
                    key_from_jwk(jwk).map_err(|why| bad(format!("key {name}: {why}")))?;
                if wanted.is_some_and(|w| w != alg) {
                    return Err(bad(format!(
                        "key {name} is {alg:?}, not auth.jwt.algorithm {}",
                        cfg.algorithm
                    )));
                }
                keys.push(Key {
                    kid: jwk.common.key_id.clone(),
                    alg,
                    key,
                    validation: validation(alg),
                });
            }
            keys
        };
        Ok(Some(Self {
            by_kid: !cfg.jwks_file.as_os_str().is_empty(),
            keys,
            claim: cfg.identity_claim.clone(),
        }))
    }

    /// Whether `token` has the shape of a JWT (three base64url parts), so that it is
    /// checked here rather than as a static token.
    pub fn looks_like_jwt(token: &str) -> bool {
        let parts: Vec<&str> = token.split('.').collect();
        parts.len() == 3
            && parts[..2].iter().all(|p| !p.is_empty())
            && token
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    }

    /// The identity a valid token names, or why it is refused.
    pub fn verify(&self, token: &str) -> Result<String, String> {
        let header = token
            .split('.')
            .next()
            .and_then(|h| URL_SAFE_NO_PAD.decode(h).ok())
            .and_then(|h| serde_json::from_slice::<Map<String, Value>>(&h).ok())
            .ok_or("the token is not a JWT (its header is not base64url JSON)")?;
        let alg = header
            .get("alg")
            .and_then(Value::as_str)
            .ok_or("the token header has no alg")?;
        if alg.eq_ignore_ascii_case("none") {
            return Err("unsigned tokens (alg none) are refused".into());
        }
        let key = if self.by_kid {
            match header.get("kid").and_then(Value::as_str) {
                Some(kid) => self
                    .keys
                    .iter()
                    .find(|k| k.kid.as_deref() == Some(kid))
                    .ok_or("no key of the JWKS has the token's kid")?,
                None if self.keys.len() == 1 => &self.keys[0],
                None => return Err("the token names no kid and the JWKS has several keys".into()),
            }
        } else {
            &self.keys[0]
        };
        if alg != alg_name(key.alg) {
            return Err(format!(
                "the token's alg is not {}, the algorithm of its key",
                alg_name(key.alg)
            ));
        }
        let data = jsonwebtoken::decode::<Map<String, Value>>(token, &key.key, &key.validation)
            .map_err(|e| describe(e.kind(), &self.claim))?;
        match data.claims.get(&self.claim).and_then(Value::as_str) {
            Some(name) if !name.is_empty() => Ok(name.to_owned()),
            _ => Err(format!(
                "the token has no {} claim naming an identity",
                self.claim
            )),
        }
    }
}

fn describe(kind: &ErrorKind, claim: &str) -> String {
    match kind {
        ErrorKind::ExpiredSignature => "the token has expired (exp)".into(),
        ErrorKind::ImmatureSignature => "the token is not valid yet (nbf)".into(),
        ErrorKind::InvalidSignature => "the token's signature does not verify".into(),
        ErrorKind::InvalidAudience => "the token's audience (aud) is not this mesh".into(),
        ErrorKind::InvalidIssuer => "the token's issuer (iss) is not the configured one".into(),
        ErrorKind::InvalidAlgorithm => "the token's algorithm is not its key's".into(),
        ErrorKind::MissingRequiredClaim(c) => format!("the token has no {c} claim"),
        ErrorKind::Json(_) => format!("the token's claims are not valid JSON claims ({claim})"),
        _ => "the token is not a valid JWT".into(),
    }
}

fn algorithm(name: &str) -> Option<Algorithm> {
    Some(match name {
        "HS256" => Algorithm::HS256,
        "RS256" => Algorithm::RS256,
        "ES256" => Algorithm::ES256,
        "EdDSA" => Algorithm::EdDSA,
        _ => return None,
    })
}

fn alg_name(alg: Algorithm) -> &'static str {
    match alg {
        Algorithm::HS256 => "HS256",
        Algorithm::RS256 => "RS256",
        Algorithm::ES256 => "ES256",
        Algorithm::EdDSA => "EdDSA",
        // `algorithm` and `key_from_jwk` make no other.
        _ => "(unsupported)",
    }
}

/// The key of `auth.jwt.key_file` for `alg`.
fn key_from_file(path: &Path, alg: Algorithm) -> Result<DecodingKey, String> {
    let bad = |why: String| format!("auth.jwt.key_file {}: {why}", path.display());
    if alg == Algorithm::HS256 {
        let mut secret = std::fs::read(path).map_err(|e| bad(format!("cannot read it: {e}")))?;
        if secret.ends_with(b"\n") {
            secret.pop();
            if secret.ends_with(b"\r") {
                secret.pop();
            }
        }
        if secret.len() < MIN_SECRET_BYTES {
            return Err(bad(format!(
                "an HS256 secret must be at least {MIN_SECRET_BYTES} bytes"
            )));
        }
        return Ok(DecodingKey::from_secret(&secret));
    }
    let spki = SubjectPublicKeyInfoDer::from_pem_file(path).map_err(|e| {
        bad(match e {
            rustls::pki_types::pem::Error::Io(io) => format!("cannot read it: {io}"),
            _ => "no PEM PUBLIC KEY in it (openssl pkey -in KEY -pubout)".into(),
        })
    })?;
    let (kind, bits) = spki_key(spki.as_ref()).map_err(bad)?;
    match (alg, kind) {
        (Algorithm::RS256, KeyKind::Rsa) => Ok(DecodingKey::from_rsa_der(bits)),
        (Algorithm::ES256, KeyKind::EcP256) => Ok(DecodingKey::from_ec_der(bits)),
        (Algorithm::EdDSA, KeyKind::Ed25519) => Ok(DecodingKey::from_ed_der(bits)),
        (alg, kind) => Err(bad(format!(
            "a {kind:?} key cannot verify {} (auth.jwt.algorithm)",
            alg_name(alg)
        ))),
    }
}

/// The kind of a public key, by its SubjectPublicKeyInfo algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KeyKind {
    Rsa,
    EcP256,
    Ed25519,
}

/// rsaEncryption (RFC 8017).
const RSA_ENCRYPTION: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");
/// id-ecPublicKey (RFC 5480).
const EC_PUBLIC_KEY: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");
/// secp256r1, P-256 (RFC 5480).
const P256: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.3.1.7");
/// id-Ed25519 (RFC 8410).
const ED25519: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.101.112");

/// The kind and the key bits of a DER `SubjectPublicKeyInfo` (a PEM `PUBLIC KEY`), which
/// is what `jsonwebtoken`'s DER constructors want: for RSA the PKCS#1 `RSAPublicKey`, for
/// P-256 the uncompressed point, for Ed25519 the 32 bytes. Read by the `spki` crate; the
/// error says what is wrong, in words for the `auth.jwt.key_file` message.
fn spki_key(der: &[u8]) -> Result<(KeyKind, &[u8]), String> {
    let info = SubjectPublicKeyInfoRef::from_der(der)
        .map_err(|e| format!("not a DER SubjectPublicKeyInfo ({e})"))?;
    let bits = info
        .subject_public_key
        .as_bytes()
        .ok_or("its public key is not a whole number of bytes")?;
    let (algorithm, parameters) = info
        .algorithm
        .oids()
        .map_err(|e| format!("its algorithm parameters are not an OID ({e})"))?;
    let kind = match (algorithm, parameters) {
        (a, None) if a == RSA_ENCRYPTION => KeyKind::Rsa,
        (a, None) if a == ED25519 => KeyKind::Ed25519,
        (a, Some(curve)) if a == EC_PUBLIC_KEY && curve == P256 => KeyKind::EcP256,
        (a, p) => {
            let with = p
                .map(|p| format!(" with parameters {p}"))
                .unwrap_or_default();
            return Err(format!(
                "its algorithm {a}{with} is not RSA, EC P-256 or Ed25519"
            ));
        }
    };
    Ok((kind, bits))
}

/// A JWKS key and its algorithm: its `alg`, or its type.
fn key_from_jwk(jwk: &Jwk) -> Result<(Algorithm, DecodingKey), String> {
    let by_type = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Some(Algorithm::RS256),
        AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => {
            Some(Algorithm::ES256)
        }
        AlgorithmParameters::EllipticCurve(_) => {
            return Err("an EC key must be on P-256 (ES256)".into())
        }
        AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
            Some(Algorithm::EdDSA)
        }
        AlgorithmParameters::OctetKeyPair(_) => {
            return Err("an OKP key must be Ed25519 (EdDSA)".into())
        }
        AlgorithmParameters::OctetKey(_) => None,
    };
    let alg = match jwk.common.key_algorithm {
        None => by_type.ok_or("an oct key needs alg HS256")?,
        Some(KeyAlgorithm::HS256) => Algorithm::HS256,
        Some(KeyAlgorithm::RS256) => Algorithm::RS256,
        Some(KeyAlgorithm::ES256) => Algorithm::ES256,
        Some(KeyAlgorithm::EdDSA) => Algorithm::EdDSA,
        Some(other) => {
            return Err(format!(
                "alg {other:?} is not supported ({})",
                crate::config::auth::JWT_ALGORITHMS.join(", ")
            ))
        }
    };
    let fits = match &jwk.algorithm {
        AlgorithmParameters::OctetKey(p) => {
            let secret = URL_SAFE_NO_PAD
                .decode(p.value.trim_end_matches('='))
                .map_err(|_| "its k is not base64url")?;
            if secret.len() < MIN_SECRET_BYTES {
                return Err(format!(
                    "an HS256 secret must be at least {MIN_SECRET_BYTES} bytes"
                ));
            }
            alg == Algorithm::HS256
        }
        _ => by_type == Some(alg),
    };
    if !fits {
        return Err(format!(
            "its alg {} does not fit its key type",
            alg_name(alg)
        ));
    }
    let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("not a usable key: {e}"))?;
    Ok((alg, key))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(v: &Value) -> String {
        URL_SAFE_NO_PAD.encode(v.to_string())
    }

    fn hs_verifier(dir: &tempfile::TempDir) -> Verifier {
        let path = dir.path().join("secret");
        std::fs::write(&path, "0123456789abcdef0123456789abcdef\n").expect("write secret");
        let cfg = Jwt {
            algorithm: "HS256".into(),
            key_file: path,
            audience: "mesh".into(),
            ..Jwt::default()
        };
        Verifier::load(&cfg).expect("loads").expect("on")
    }

    fn hs256(claims: &Value) -> String {
        let key = jsonwebtoken::EncodingKey::from_secret(b"0123456789abcdef0123456789abcdef");
        jsonwebtoken::encode(&jsonwebtoken::Header::new(Algorithm::HS256), claims, &key)
            .expect("encodes")
    }

    fn now() -> u64 {
        jsonwebtoken::get_current_timestamp()
    }

    #[test]
    fn valid_tokens_name_their_identity_and_bad_ones_say_why() {
        let dir = tempfile::tempdir().expect("temp dir");
        let v = hs_verifier(&dir);
        let ok = hs256(&serde_json::json!({"sub": "shop", "aud": "mesh", "exp": now() + 600}));
        assert!(Verifier::looks_like_jwt(&ok));
        assert_eq!(v.verify(&ok), Ok("shop".to_owned()));
        let expired = hs256(&serde_json::json!({"sub": "shop", "aud": "mesh", "exp": now() - 600}));
        assert!(v.verify(&expired).expect_err("expired").contains("exp"));
        let other_aud = hs256(&serde_json::json!({"sub": "s", "aud": "x", "exp": now() + 600}));
        assert!(v.verify(&other_aud).expect_err("aud").contains("aud"));
        let no_aud = hs256(&serde_json::json!({"sub": "s", "exp": now() + 600}));
        assert!(v.verify(&no_aud).expect_err("no aud").contains("aud"));
        let no_sub = hs256(&serde_json::json!({"aud": "mesh", "exp": now() + 600}));
        assert!(v.verify(&no_sub).expect_err("no sub").contains("sub"));
    }

    #[test]
    fn the_algorithm_is_the_keys_not_the_tokens() {
        let dir = tempfile::tempdir().expect("temp dir");
        let v = hs_verifier(&dir);
        let claims = b64(&serde_json::json!({"sub": "shop", "aud": "mesh", "exp": now() + 600}));
        let none = format!("{}.{claims}.", b64(&serde_json::json!({"alg": "none"})));
        assert!(v.verify(&none).expect_err("none").contains("alg none"));
        let rs = format!(
            "{}.{claims}.c2ln",
            b64(&serde_json::json!({"alg": "RS256"}))
        );
        assert!(v.verify(&rs).expect_err("rs").contains("HS256"));
        assert!(v.verify("a.b.c").is_err());
        assert!(!Verifier::looks_like_jwt("tok-shop-3f9a"));
    }

    #[test]
    fn short_secrets_and_mismatched_keys_are_refused_at_load() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("secret");
        std::fs::write(&path, "short").expect("write");
        let cfg = Jwt {
            algorithm: "HS256".into(),
            key_file: path.clone(),
            ..Jwt::default()
        };
        let err = Verifier::load(&cfg).err().expect("too short");
        assert!(
            err.contains("auth.jwt.key_file") && err.contains("32"),
            "{err}"
        );
        let cfg = Jwt {
            algorithm: "RS256".into(),
            key_file: path,
            ..Jwt::default()
        };
        let err = Verifier::load(&cfg).err().expect("not PEM");
        assert!(err.contains("PUBLIC KEY"), "{err}");
    }

    /// An Ed25519 public key as `openssl pkey -pubout -outform DER` writes it, with 32
    /// bytes of 7 for its key.
    fn ed25519_spki() -> Vec<u8> {
        let mut ed = vec![
            0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
        ];
        ed.extend([7u8; 32]);
        ed
    }

    #[test]
    fn spki_keys_are_told_apart_by_their_algorithm() {
        let ed = ed25519_spki();
        assert_eq!(spki_key(&ed), Ok((KeyKind::Ed25519, &[7u8; 32][..])));
        // P-256: id-ecPublicKey with the curve as its parameter, a 65-byte point.
        let mut ec = vec![
            0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01, 0x06,
            0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00, 0x04,
        ];
        ec.extend([9u8; 64]);
        assert_eq!(spki_key(&ec), Ok((KeyKind::EcP256, &ec[26..])));
        // RSA: rsaEncryption with NULL parameters; the bits are not looked into here.
        let rsa = [
            0x30, 0x17, 0x30, 0x0d, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01,
            0x01, 0x05, 0x00, 0x03, 0x06, 0x00, 0x30, 0x03, 0x02, 0x01, 0x03,
        ];
        assert_eq!(spki_key(&rsa), Ok((KeyKind::Rsa, &rsa[20..])));
        let mut ed448 = ed.clone();
        ed448[8] = 0x71;
        let err = spki_key(&ed448).expect_err("Ed448");
        assert!(
            err.contains("1.3.101.113") && err.contains("not RSA"),
            "{err}"
        );
        let mut p384 = ec.clone();
        p384[22] = 0x08;
        let err = spki_key(&p384).expect_err("another curve");
        assert!(err.contains("parameters 1.2.840.10045.3.1.8"), "{err}");
    }

    #[test]
    fn cut_and_malformed_spki_are_refused_with_a_reason() {
        let ed = ed25519_spki();
        for cut in 0..ed.len() {
            let err = spki_key(&ed[..cut]).expect_err("cut");
            assert!(
                err.starts_with("not a DER SubjectPublicKeyInfo ("),
                "cut at {cut}: {err}"
            );
        }
        let mut trailing = ed.clone();
        trailing.push(0);
        let err = spki_key(&trailing).expect_err("bytes after the SEQUENCE");
        assert!(err.contains("trailing"), "{err}");
        let mut unused = ed.clone();
        unused[11] = 1;
        unused[43] = 6; // its last bit, now unused, is 0 as DER wants
        assert!(spki_key(&unused)
            .expect_err("unused bits")
            .contains("whole number of bytes"));
        let mut long = ed.clone();
        long[1] = 0x84;
        assert!(spki_key(&long).is_err(), "a length past the input");
        // INTEGER 0 as the parameters of Ed25519's algorithm.
        let mut params = ed.clone();
        params.splice(9..9, [0x02, 0x01, 0x00]);
        params[3] += 3;
        params[1] += 3;
        let err = spki_key(&params).expect_err("parameters that are not an OID");
        assert!(err.contains("not an OID"), "{err}");
    }

    #[test]
    fn a_key_file_that_is_no_public_key_is_named_with_the_reason() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("key.pem");
        // A PEM PUBLIC KEY whose DER is cut short.
        let body = base64::engine::general_purpose::STANDARD.encode(&ed25519_spki()[..20]);
        let pem = format!("-----BEGIN PUBLIC KEY-----\n{body}\n-----END PUBLIC KEY-----\n");
        std::fs::write(&path, pem).expect("write");
        let cfg = Jwt {
            algorithm: "EdDSA".into(),
            key_file: path.clone(),
            ..Jwt::default()
        };
        let err = Verifier::load(&cfg).err().expect("cut key");
        assert!(
            err.contains("auth.jwt.key_file") && err.contains("SubjectPublicKeyInfo"),
            "{err}"
        );
    }
}
