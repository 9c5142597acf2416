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

use super::der::{spki_key, KeyKind};
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
    let (kind, bits) = spki_key(spki.as_ref())
        .ok_or_else(|| bad("not an RSA, EC P-256 or Ed25519 public key".into()))?;
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
}
