//! The `[auth]` section (issue 19): static bearer tokens, each naming an identity with its
//! rights. The tokens themselves are never in the configuration, only their SHA-256 (hex):
//!
//! ```toml
//! [auth]
//! open_health = true            # /admin/health, /admin/ready, /metrics without a token
//!
//! [auth.identities.billing]
//! token_sha256 = "…"            # printf %s "$TOKEN" | sha256sum
//! publish = ["orders.*"]        # topics: exact names, or prefixes ending in .*
//! consume = ["billing"]         # groups: poll, stream, WebSocket, ACK, NACK, extend
//! define = ["billing"]          # groups: PUT and DELETE of the subscription
//! admin = false                 # the admin listener
//! ```
//!
//! No identities: auth is off (and `serve` then binds loopback addresses only, unless
//! `server.insecure`). The checks at request time live in `http::auth`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The dotted key of the identities table (a table of free names, like
/// `kafka.properties`).
pub const IDENTITIES_KEY: &str = "auth.identities";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Auth {
    /// With identities: `/admin/health`, `/admin/ready` and `/metrics` answer without
    /// credentials (probes and scrapers); every other route needs a token.
    pub open_health: bool,
    /// The callers, by name: their static tokens and the rights of each (whichever way it
    /// proved who it is: token, JWT or client certificate). None (and no JWT key, no
    /// client CA): auth is off.
    pub identities: BTreeMap<String, Identity>,
    /// JWT bearer tokens (off while neither `key_file` nor `jwks_file` is set).
    pub jwt: Jwt,
}

impl Default for Auth {
    fn default() -> Self {
        Self {
            open_health: true,
            identities: BTreeMap::new(),
            jwt: Jwt::default(),
        }
    }
}

/// `[auth.jwt]`: JWTs as bearer tokens. The algorithm is fixed by the configuration (by
/// `algorithm` with `key_file`, by each JWKS key's `alg` or type), never taken from a
/// token: `alg: none` and a token whose `alg` differs from its key's are refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Jwt {
    /// `HS256`, `RS256`, `ES256` or `EdDSA`: the algorithm of `key_file`.
    pub algorithm: String,
    /// HS256: a file holding the secret (at least 32 bytes; one trailing newline is
    /// dropped). RS256, ES256, EdDSA: the PEM public key (`openssl pkey -pubout`).
    pub key_file: PathBuf,
    /// A JWKS file (`{"keys": [...]}`): a token's `kid` picks the key (a single key needs
    /// none); each key's `alg` (or its type: RSA RS256, EC P-256 ES256, OKP Ed25519 EdDSA)
    /// is its algorithm. Instead of `key_file`.
    pub jwks_file: PathBuf,
    /// The `aud` a token must name. Empty: a token with an `aud` is refused.
    pub audience: String,
    /// The `iss` a token must carry. Empty: not checked.
    pub issuer: String,
    /// The claim naming the identity (whose rights are those of `[auth.identities.NAME]`).
    pub identity_claim: String,
    /// Clock skew allowed on `exp` and `nbf`, in seconds.
    pub leeway_s: u64,
}

impl Default for Jwt {
    fn default() -> Self {
        Self {
            algorithm: String::new(),
            key_file: PathBuf::new(),
            jwks_file: PathBuf::new(),
            audience: String::new(),
            issuer: String::new(),
            identity_claim: "sub".to_owned(),
            leeway_s: 30,
        }
    }
}

/// The algorithms `[auth.jwt]` accepts.
pub const JWT_ALGORITHMS: [&str; 4] = ["HS256", "RS256", "ES256", "EdDSA"];

impl Jwt {
    /// Whether JWTs are accepted.
    pub fn enabled(&self) -> bool {
        !self.key_file.as_os_str().is_empty() || !self.jwks_file.as_os_str().is_empty()
    }

    fn validate(&self) -> Result<(), (String, String)> {
        let key = |k: &str| format!("auth.jwt.{k}");
        if !self.algorithm.is_empty() && !JWT_ALGORITHMS.contains(&self.algorithm.as_str()) {
            return Err((
                key("algorithm"),
                format!(
                    "{:?} is not one of {}",
                    self.algorithm,
                    JWT_ALGORITHMS.join(", ")
                ),
            ));
        }
        let file = !self.key_file.as_os_str().is_empty();
        let jwks = !self.jwks_file.as_os_str().is_empty();
        if file && jwks {
            return Err((
                key("jwks_file"),
                "is instead of auth.jwt.key_file: set one of them".into(),
            ));
        }
        if file && self.algorithm.is_empty() {
            return Err((
                key("algorithm"),
                format!(
                    "must name the algorithm of auth.jwt.key_file ({})",
                    JWT_ALGORITHMS.join(", ")
                ),
            ));
        }
        if self.identity_claim.trim().is_empty() {
            return Err((key("identity_claim"), "must name a claim (sub)".into()));
        }
        Ok(())
    }
}

/// One caller: its token's hash and what it may do. Names in a right are exact
/// (`orders`), prefixes (`orders.*`: `orders.eu`, `orders.us.west`) or `*` (every name).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Identity {
    /// SHA-256 of the bearer token, 64 hex digits. Empty: no static token (the identity
    /// proves itself by a JWT or a client certificate).
    #[serde(default)]
    pub token_sha256: String,
    /// Topics it may publish to (and send requests of request/reply to).
    #[serde(default)]
    pub publish: Vec<String>,
    /// Groups it may consume from: poll, SSE, WebSocket, ACK, NACK, extend, and `GET` of
    /// the subscription.
    #[serde(default)]
    pub consume: Vec<String>,
    /// Groups it may define: `PUT` and `DELETE` of the subscription (and `GET`).
    #[serde(default)]
    pub define: Vec<String>,
    /// The admin listener.
    #[serde(default)]
    pub admin: bool,
}

impl Auth {
    /// Whether any identity or a JWT key is configured (auth on; client certificates
    /// turn it on too, see `Config::auth_on`).
    pub fn enabled(&self) -> bool {
        !self.identities.is_empty() || self.jwt.enabled()
    }

    /// Checks every identity; the error is (dotted key, why).
    pub fn validate(&self) -> Result<(), (String, String)> {
        let mut seen: BTreeMap<String, &str> = BTreeMap::new();
        for (name, id) in &self.identities {
            let key = |k: &str| format!("{IDENTITIES_KEY}.{name}{k}");
            if !is_name(name) {
                return Err((
                    key(""),
                    "an identity name is 1 to 200 of A-Z a-z 0-9 . _ -".into(),
                ));
            }
            let hash = id.token_sha256.to_ascii_lowercase();
            if hash.is_empty() {
                // No static token: known by a JWT or a client certificate only.
            } else if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err((
                    key(".token_sha256"),
                    "must be the SHA-256 of the token in 64 hex digits \
                     (printf %s \"$TOKEN\" | sha256sum)"
                        .into(),
                ));
            } else if let Some(other) = seen.insert(hash, name) {
                return Err((
                    key(".token_sha256"),
                    format!("is also the token of identity {other}"),
                ));
            }
            for (right, names) in [
                ("publish", &id.publish),
                ("consume", &id.consume),
                ("define", &id.define),
            ] {
                for n in names {
                    if !is_pattern(n) {
                        return Err((
                            key(&format!(".{right}")),
                            format!(
                                "{n:?} is neither a name, a prefix ending in .* (orders.*) nor *"
                            ),
                        ));
                    }
                }
            }
        }
        self.jwt.validate()
    }
}

/// A topic, group or identity name as the API spells them.
fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 200
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A name, a prefix (`orders.*`) or `*`.
fn is_pattern(s: &str) -> bool {
    s == "*" || s.strip_suffix(".*").map_or_else(|| is_name(s), is_name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(id: Identity) -> Auth {
        Auth {
            identities: [("svc".to_owned(), id)].into_iter().collect(),
            ..Auth::default()
        }
    }

    fn id(hash: &str, publish: &[&str]) -> Identity {
        Identity {
            token_sha256: hash.to_owned(),
            publish: publish.iter().map(|s| (*s).to_owned()).collect(),
            consume: Vec::new(),
            define: Vec::new(),
            admin: false,
        }
    }

    const HASH: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    #[test]
    fn identities_are_checked_naming_the_key() {
        assert_eq!(
            one(id(HASH, &["orders.*", "audit", "*"])).validate(),
            Ok(())
        );
        let (key, _) = one(id("abc", &[])).validate().expect_err("short hash");
        assert_eq!(key, "auth.identities.svc.token_sha256");
        let (key, why) = one(id(HASH, &["orders*"]))
            .validate()
            .expect_err("bad pattern");
        assert_eq!(key, "auth.identities.svc.publish");
        assert!(why.contains("orders*"), "{why}");
        let mut two = one(id(HASH, &[]));
        two.identities
            .insert("other".into(), id(&HASH.to_uppercase(), &[]));
        let (_, why) = two.validate().expect_err("one token, two identities");
        assert!(
            why.contains("identity other") || why.contains("identity svc"),
            "{why}"
        );
    }
}
