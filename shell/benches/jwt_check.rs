//! The CPU cost of one JWT check (issue 19): `http::jwt::Verifier::verify` on a valid
//! token — header, key choice, signature, `exp`/`nbf`/`aud`/`iss` and the identity claim —
//! for each algorithm the mesh accepts. Keys are made by the `openssl` command line.
//!
//! Run: `cargo bench -p unimesh-shell --no-default-features --bench jwt_check` (criterion
//! reports the time per check; `thrpt` is checks/s on one core). Without the default
//! features the bench build needs no RocksDB, whose release build takes half an hour cold.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use unimesh_shell::config::auth::Jwt;
use unimesh_shell::http::jwt::Verifier;

fn openssl(args: &[&str]) -> Vec<u8> {
    let out = Command::new("openssl")
        .args(args)
        .output()
        .expect("run openssl");
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
    out.stdout
}

/// A key pair for `alg` in `dir`: (public key PEM path, private key DER for signing).
fn keys(dir: &Path, alg: &str) -> (std::path::PathBuf, Vec<u8>) {
    let key = dir.join(format!("{alg}.key"));
    let public = dir.join(format!("{alg}.pub"));
    let k = key.to_str().expect("utf-8 path");
    let genpkey: &[&str] = match alg {
        "RS256" => &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
        "ES256" => &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
        _ => &["-algorithm", "ed25519"],
    };
    let mut args = vec!["genpkey"];
    args.extend_from_slice(genpkey);
    args.extend(["-out", k]);
    openssl(&args);
    openssl(&[
        "pkey",
        "-in",
        k,
        "-pubout",
        "-out",
        public.to_str().expect("utf-8"),
    ]);
    // jsonwebtoken signs RSA with PKCS#1, ECDSA and Ed25519 with PKCS#8.
    let der = if alg == "RS256" {
        openssl(&["rsa", "-in", k, "-traditional", "-outform", "DER"])
    } else {
        openssl(&["pkcs8", "-topk8", "-nocrypt", "-in", k, "-outform", "DER"])
    };
    (public, der)
}

fn jwt_check(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let exp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        + 3600;
    let claims = serde_json::json!({
        "sub": "shop", "aud": "unimesh", "iss": "https://id.example", "exp": exp,
    });
    let mut group = c.benchmark_group("jwt_check");
    group.throughput(Throughput::Elements(1));
    group.measurement_time(Duration::from_secs(5));
    for alg in ["HS256", "RS256", "ES256", "EdDSA"] {
        let (key_file, signing, algorithm) = match alg {
            "HS256" => {
                let path = dir.path().join("hs.secret");
                std::fs::write(&path, b"a-secret-of-forty-eight-bytes-for-hs256-signing!")
                    .expect("write");
                let key =
                    EncodingKey::from_secret(b"a-secret-of-forty-eight-bytes-for-hs256-signing!");
                (path, key, Algorithm::HS256)
            }
            "RS256" => {
                let (p, der) = keys(dir.path(), alg);
                (p, EncodingKey::from_rsa_der(&der), Algorithm::RS256)
            }
            "ES256" => {
                let (p, der) = keys(dir.path(), alg);
                (p, EncodingKey::from_ec_der(&der), Algorithm::ES256)
            }
            _ => {
                let (p, der) = keys(dir.path(), alg);
                (p, EncodingKey::from_ed_der(&der), Algorithm::EdDSA)
            }
        };
        let token = jsonwebtoken::encode(&Header::new(algorithm), &claims, &signing).expect("sign");
        let cfg = Jwt {
            algorithm: alg.to_owned(),
            key_file,
            audience: "unimesh".into(),
            issuer: "https://id.example".into(),
            ..Jwt::default()
        };
        let verifier = Verifier::load(&cfg).expect("load").expect("on");
        assert_eq!(verifier.verify(&token).as_deref(), Ok("shop"));
        group.bench_function(alg, |b| b.iter(|| verifier.verify(&token)));
    }
    group.finish();
}

criterion_group!(benches, jwt_check);
criterion_main!(benches);
