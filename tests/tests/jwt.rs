//! JWT bearer tokens (issue 19), against the real binary: keys made by `openssl`, tokens
//! minted at test time by PyJWT (`tests/python/jwt_tokens.py`, as an issuer would), sent
//! by ureq. Checked: a valid token names an identity whose rights (by prefix) apply, 403
//! outside them and for a name without an entry; expired, not yet valid, wrongly signed,
//! wrong audience, wrong issuer, without `exp`, `alg: none` and HS256 "signed" with the
//! RSA public key (algorithm confusion) each get 401 with `WWW-Authenticate: Bearer
//! error="invalid_token", error_description=...` and the JSON body, are counted, and
//! change nothing; a JWKS file with RS256, ES256, EdDSA and HS256 keys picked by `kid`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use unimesh_tests::pki::openssl;
use unimesh_tests::{event, json, metric, published, Call, Options, Resp, Server, Value};

/// The static token of `ops` (admin, defines and consumes everything); its SHA-256 below.
const OPS: &str = "tok-ops-81c2";
const OPS_SHA256: &str = "7fc44aa971a6befb28f983c4b2b45afc7722a9920d5f78b1325b5acd6c99f19e";

const AUDIENCE: &str = "unimesh-test";
const ISSUER: &str = "https://issuer.test";

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Keys in a temporary directory: `NAME.key` (private) and `NAME.pub` (public, PEM).
struct Keys {
    dir: tempfile::TempDir,
}

impl Keys {
    fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("unimesh-jwt-")
            .tempdir()
            .expect("temp dir");
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn pair(&self, name: &str, genpkey: &[&str]) {
        let key = self.path(&format!("{name}.key"));
        let public = self.path(&format!("{name}.pub"));
        let mut args = vec!["genpkey"];
        args.extend_from_slice(genpkey);
        let key_text = key.display().to_string();
        args.extend(["-out", &key_text]);
        openssl(&args);
        openssl(&[
            "pkey",
            "-in",
            &key_text,
            "-pubout",
            "-out",
            &public.display().to_string(),
        ]);
    }

    fn rsa(&self, name: &str) {
        self.pair(
            name,
            &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
        );
    }

    fn secret(&self, name: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, "a-secret-of-forty-eight-bytes-for-hs256-signing!\n").expect("write");
        p
    }
}

fn text(p: &Path) -> String {
    p.display().to_string()
}

/// Runs the minting script on `spec`; the tokens by name.
fn mint(keys: &Keys, spec: &Value) -> serde_json::Map<String, Value> {
    let spec_path = keys.path("spec.json");
    std::fs::write(&spec_path, spec.to_string()).expect("write the spec");
    let script = unimesh_tests::package_dir().join("python/jwt_tokens.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(&spec_path)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "jwt_tokens.py failed (needs `python3 -m pip install 'PyJWT[crypto]'`, see \
         tests/prepare.sh): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    match serde_json::from_slice::<Value>(&out.stdout) {
        Ok(Value::Object(m)) => m,
        other => panic!("jwt_tokens.py printed no tokens: {other:?}"),
    }
}

fn signed(name: &str, alg: &str, key: &Path, claims: Value) -> Value {
    json!({"name": name, "kind": "signed", "alg": alg, "key": text(key), "claims": claims})
}

fn token<'a>(tokens: &'a serde_json::Map<String, Value>, name: &str) -> &'a str {
    tokens
        .get(name)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no token {name}"))
}

fn bearer(call: Call, token: &str) -> Call {
    call.header("authorization", &format!("Bearer {token}"))
}

fn publish(s: &Server, topic: &str, token: &str, id: &str) -> Resp {
    bearer(s.call("POST", &format!("/v1/topics/{topic}/events")), token)
        .header("content-type", "application/cloudevents+json")
        .body(event(id, "t", json!({"id": id})).to_string())
        .send()
}

/// A 401 for a bad JWT: the challenge names `invalid_token` and says why (containing
/// `why`), the body is the API's error naming it too.
fn refused(r: &Resp, why: &str) {
    let challenge = r.header("www-authenticate").unwrap_or_default().to_owned();
    assert!(
        challenge.starts_with("Bearer") && challenge.contains(r#"error="invalid_token""#),
        "{}: {challenge}",
        r.what
    );
    let description = challenge
        .split_once("error_description=\"")
        .map(|(_, d)| d.trim_end_matches('"').to_owned())
        .unwrap_or_else(|| panic!("no error_description: {challenge}"));
    assert!(description.contains(why), "{why:?} not in {description:?}");
    r.expect_error_naming(401, "unauthorized", &[why]);
}

/// The event ids the `watch` group gets (ops polls, ACKs nothing; bounded).
fn watched(s: &Server, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..10 {
        let r = bearer(
            s.call(
                "GET",
                "/v1/subscriptions/watch/events?client=w&max=50&waitMs=1000",
            ),
            OPS,
        )
        .send();
        for d in r.ok_json(200).as_array().cloned().unwrap_or_default() {
            ids.push(d["event"]["id"].as_str().unwrap_or_default().to_owned());
        }
        if ids.len() >= n {
            break;
        }
    }
    ids.sort();
    ids
}

fn watch(s: &Server, topic: &str) {
    let r = bearer(s.call("PUT", "/v1/subscriptions/watch"), OPS)
        .json(&json!({"topic": topic, "startFrom": "earliest"}))
        .send();
    assert!(matches!(r.status, 200 | 201), "{}", r.text());
}

fn identities() -> String {
    format!(
        "[auth.identities.shop]\npublish = [\"orders.*\"]\n\
         [auth.identities.ops]\ntoken_sha256 = \"{OPS_SHA256}\"\nadmin = true\n\
         define = [\"*\"]\nconsume = [\"*\"]\n"
    )
}

/// Goal: with an RS256 key, audience and issuer configured, exactly the valid token is
/// accepted, its `sub` gets the rights of that identity, and every bad token is a 401
/// saying why that changes nothing. Method: PyJWT mints one valid token and one token per
/// flaw; each is sent as a publish shop could make; the refusal counter rises by their
/// number; the watching group receives only the valid publish.
#[test]
fn rs256_tokens_are_checked_and_their_subject_gets_its_rights() {
    let keys = Keys::new();
    keys.rsa("rsa");
    keys.rsa("other");
    let rsa = keys.path("rsa.key");
    let t = now();
    let good = json!({"sub": "shop", "aud": AUDIENCE, "iss": ISSUER, "exp": t + 600});
    let with = |patch: Value| {
        let mut c = good.clone();
        for (k, v) in patch.as_object().cloned().unwrap_or_default() {
            if v.is_null() {
                if let Some(o) = c.as_object_mut() {
                    o.remove(&k);
                }
            } else {
                c[k] = v;
            }
        }
        c
    };
    let tokens = mint(
        &keys,
        &json!({"tokens": [
            signed("valid", "RS256", &rsa, good.clone()),
            signed("stranger", "RS256", &rsa, with(json!({"sub": "stranger"}))),
            signed("expired", "RS256", &rsa, with(json!({"exp": t - 3600}))),
            signed("not-yet", "RS256", &rsa, with(json!({"nbf": t + 3600, "exp": t + 7200}))),
            signed("wrong-signature", "RS256", &keys.path("other.key"), good.clone()),
            signed("wrong-audience", "RS256", &rsa, with(json!({"aud": "someone-else"}))),
            signed("wrong-issuer", "RS256", &rsa, with(json!({"iss": "https://evil.test"}))),
            signed("no-exp", "RS256", &rsa, with(json!({"exp": null}))),
            {"name": "alg-none", "kind": "none", "claims": good.clone()},
            {"name": "confusion", "kind": "hmac", "key": text(&keys.path("rsa.pub")),
             "claims": good.clone()},
        ]}),
    );
    let toml = format!(
        "[mesh]\nflush_interval_ms = 20\n[auth.jwt]\nalgorithm = \"RS256\"\n\
         key_file = \"{}\"\naudience = \"{AUDIENCE}\"\nissuer = \"{ISSUER}\"\n{}",
        keys.path("rsa.pub").display(),
        identities()
    );
    let s = Server::start(Options::new().toml(&toml));
    watch(&s, "orders.eu");

    let bad = [
        ("expired", "expired"),
        ("not-yet", "not valid yet"),
        ("wrong-signature", "signature"),
        ("wrong-audience", "aud"),
        ("wrong-issuer", "iss"),
        ("no-exp", "exp"),
        ("alg-none", "alg none"),
        ("confusion", "RS256"),
    ];
    let invalid = |s: &Server| {
        metric(
            &s.metrics(),
            "unimesh_auth_refused_total",
            r#"reason="invalid""#,
        )
        .unwrap_or(0.0)
    };
    let before = invalid(&s);
    for (name, why) in bad {
        let r = publish(&s, "orders.eu", token(&tokens, name), name);
        refused(&r, why);
    }
    assert_eq!(
        invalid(&s) - before,
        bad.len() as f64,
        "each refusal counted"
    );
    assert!(
        !s.stderr().contains(token(&tokens, "confusion")),
        "a token is never logged"
    );

    // The valid token: shop's rights, by prefix.
    published(&publish(&s, "orders.eu", token(&tokens, "valid"), "ok"), 1);
    publish(&s, "audit", token(&tokens, "valid"), "no").expect_error_naming(
        403,
        "forbidden",
        &["shop", "publish", "audit"],
    );
    publish(&s, "orders.eu", token(&tokens, "stranger"), "no2").expect_error_naming(
        403,
        "forbidden",
        &["stranger", "no entry"],
    );
    assert_eq!(
        watched(&s, 1),
        ["ok"],
        "only the valid token's publish arrived"
    );
    assert!(watched(&s, 0).is_empty());
}

/// Goal: a JWKS file serves several algorithms, each key's own, picked by `kid`; a token
/// naming one key with another algorithm, an unknown `kid`, or an audience where none is
/// configured is refused. Method: PyJWT writes the JWKS (RS256, ES256, EdDSA, HS256 keys)
/// and signs a token with each private key; each publishes; the flawed ones get 401.
#[test]
fn a_jwks_file_holds_keys_of_every_algorithm() {
    let keys = Keys::new();
    keys.rsa("rsa");
    keys.pair(
        "ec",
        &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
    );
    keys.pair("ed", &["-algorithm", "ed25519"]);
    let hs = keys.secret("hs.secret");
    let jwks = keys.path("jwks.json");
    let claims = json!({"sub": "shop", "exp": now() + 600});
    let kid = |mut t: Value, kid: &str| {
        t["headers"] = json!({"kid": kid});
        t
    };
    let tokens = mint(
        &keys,
        &json!({
            "jwks": {"path": text(&jwks), "keys": [
                {"kid": "r", "alg": "RS256", "key": text(&keys.path("rsa.pub"))},
                {"kid": "e", "alg": "ES256", "key": text(&keys.path("ec.pub"))},
                {"kid": "d", "alg": "EdDSA", "key": text(&keys.path("ed.pub"))},
                {"kid": "h", "alg": "HS256", "key": text(&hs)},
            ]},
            "tokens": [
                kid(signed("RS256", "RS256", &keys.path("rsa.key"), claims.clone()), "r"),
                kid(signed("ES256", "ES256", &keys.path("ec.key"), claims.clone()), "e"),
                kid(signed("EdDSA", "EdDSA", &keys.path("ed.key"), claims.clone()), "d"),
                kid(signed("HS256", "HS256", &hs, claims.clone()), "h"),
                kid(signed("ES256-as-r", "ES256", &keys.path("ec.key"), claims.clone()), "r"),
                kid(signed("unknown-kid", "RS256", &keys.path("rsa.key"), claims.clone()), "x"),
                kid(json!({"name": "confusion", "kind": "hmac", "key": text(&keys.path("rsa.pub")),
                     "claims": claims.clone()}), "r"),
                kid(signed("with-aud", "RS256", &keys.path("rsa.key"),
                    json!({"sub": "shop", "aud": "x", "exp": now() + 600})), "r"),
            ],
        }),
    );
    let toml = format!(
        "[mesh]\nflush_interval_ms = 20\n[auth.jwt]\njwks_file = \"{}\"\n{}",
        jwks.display(),
        identities()
    );
    let s = Server::start(Options::new().toml(&toml));
    watch(&s, "orders.eu");
    for alg in ["RS256", "ES256", "EdDSA", "HS256"] {
        published(&publish(&s, "orders.eu", token(&tokens, alg), alg), 1);
    }
    refused(
        &publish(&s, "orders.eu", token(&tokens, "ES256-as-r"), "x1"),
        "RS256",
    );
    refused(
        &publish(&s, "orders.eu", token(&tokens, "unknown-kid"), "x2"),
        "kid",
    );
    refused(
        &publish(&s, "orders.eu", token(&tokens, "confusion"), "x3"),
        "RS256",
    );
    refused(
        &publish(&s, "orders.eu", token(&tokens, "with-aud"), "x4"),
        "aud",
    );
    assert_eq!(watched(&s, 4), ["ES256", "EdDSA", "HS256", "RS256"]);
}
