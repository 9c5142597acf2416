//! TLS and client certificates (issue 19), against the real binary with real clients: a
//! test CA made by `openssl`, `curl` for HTTPS (HTTP/1.1 and HTTP/2), Python `requests`
//! (`tests/python/tls_requests.py`), `openssl s_client` for the certificate served, and
//! the binary's own client subcommands. Checked: publish and poll over TLS on both HTTP
//! versions; a client trusting another CA refuses the server; plain HTTP to a TLS port
//! gets a 400 naming the problem; an expired server certificate is refused by curl and
//! requests; mTLS required (no certificate, another CA's certificate, an expired one: no
//! handshake, the refusal logged and counted; a certificate whose CN has rights works,
//! from curl and from requests, one whose CN has none is 403) and optional (a token
//! without a certificate; a certificate without a token); SIGHUP reload with an SSE
//! stream and a long-poll open across it, a new connection seeing the new certificate,
//! and a failed reload keeping the old one; the CLI over HTTPS with `--cacert`, and with
//! a client certificate under mTLS.

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use unimesh_tests::pki::{curl, served_serial, Curled, Issued, Pki};
use unimesh_tests::{event, json, wait_for, Options, Server, Value};

/// `[server.tls]` (and a quick flush) for this certificate.
fn tls_toml(server: &Issued, extra: &str) -> String {
    format!(
        "[mesh]\nflush_interval_ms = 20\n[server.tls]\ncert = \"{}\"\nkey = \"{}\"\n{extra}",
        server.cert.display(),
        server.key.display()
    )
}

/// curl arguments trusting `ca` (and presenting `client`).
fn trust(ca: &Issued, client: Option<&Issued>) -> Vec<String> {
    let mut args = vec!["--cacert".to_owned(), ca.cert.display().to_string()];
    if let Some(c) = client {
        args.extend([
            "--cert".to_owned(),
            c.cert.display().to_string(),
            "--key".to_owned(),
            c.key.display().to_string(),
        ]);
    }
    args
}

/// `curl ARGS... [extra...] URL`.
fn https(args: &[String], extra: &[&str], url: &str) -> Curled {
    let mut all: Vec<&str> = args.iter().map(String::as_str).collect();
    all.extend_from_slice(extra);
    all.push(url);
    curl(&all)
}

fn publish(s: &Server, args: &[String], version: &str, topic: &str, id: &str) -> Curled {
    let body = event(id, "t", json!({"id": id})).to_string();
    https(
        args,
        &[
            version,
            "-X",
            "POST",
            "-H",
            "content-type: application/cloudevents+json",
            "--data-binary",
            &body,
        ],
        &s.http_url(&format!("/v1/topics/{topic}/events")),
    )
}

fn subscribe(s: &Server, args: &[String], group: &str, topic: &str) {
    let doc = json!({"topic": topic, "startFrom": "earliest"}).to_string();
    let r = https(
        args,
        &[
            "-X",
            "PUT",
            "-H",
            "content-type: application/json",
            "--data-binary",
            &doc,
        ],
        &s.http_url(&format!("/v1/subscriptions/{group}")),
    );
    assert!(matches!(r.status, 200 | 201), "subscribe {group}: {r:?}");
}

/// Polls until `n` deliveries came (bounded), returns their event ids.
fn poll_ids(s: &Server, args: &[String], version: &str, group: &str, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    for _ in 0..20 {
        let r = https(
            args,
            &[version],
            &s.http_url(&format!(
                "/v1/subscriptions/{group}/events?client=c&max=10&waitMs=2000"
            )),
        );
        for d in r.ok_json(200).as_array().cloned().unwrap_or_default() {
            ids.push(d["event"]["id"].as_str().unwrap_or_default().to_owned());
        }
        if ids.len() >= n {
            break;
        }
    }
    ids
}

/// A TLS server (no client certificates) of a fresh PKI: `ca` signed its certificate,
/// `other` is a CA it does not know, `args` are curl's arguments trusting `ca`.
struct Served {
    pki: Pki,
    ca: Issued,
    other: Issued,
    args: Vec<String>,
    s: Server,
}

fn served() -> Served {
    let pki = Pki::new();
    let ca = pki.ca("ca");
    let other = pki.ca("other");
    let cert = pki.server(&ca, "server", 101);
    let args = trust(&ca, None);
    let probe: Vec<&str> = args.iter().map(String::as_str).collect();
    let s = Server::start(Options::new().toml(&tls_toml(&cert, "")).tls_probe(&probe));
    Served {
        pki,
        ca,
        other,
        args,
        s,
    }
}

/// Goal: both listeners speak TLS with the configured certificate, HTTP/1.1 and HTTP/2
/// by ALPN, and nothing else gets through. Method: curl with the test CA publishes and
/// polls on each version (the version curl reports is checked); curl trusting another
/// CA fails verification; curl sending plain HTTP to the TLS port gets 400
/// `tls-required`.
#[test]
fn tls_serves_http1_and_http2_and_refuses_a_wrong_ca_and_plain_http() {
    // `_pki` keeps the certificates' directory until the end.
    let Served {
        pki: _pki,
        other,
        args,
        s,
        ..
    } = served();
    assert!(s.http_url("/").starts_with("https://"));

    subscribe(&s, &args, "g", "t");
    let r = publish(&s, &args, "--http1.1", "t", "e1");
    r.ok_json(200);
    assert_eq!(r.version, "1.1", "{r:?}");
    let r = publish(&s, &args, "--http2", "t", "e2");
    r.ok_json(200);
    assert_eq!(r.version, "2", "HTTP/2 by ALPN: {r:?}");
    let ids = poll_ids(&s, &args, "--http2", "g", 2);
    assert_eq!(ids, ["e1", "e2"]);
    let health = https(&args, &["--http2"], &s.admin_url("/admin/health"));
    assert_eq!(
        health.status, 200,
        "the admin listener speaks TLS too: {health:?}"
    );
    assert_eq!(health.version, "2");

    // A client that trusts another CA refuses the server (curl: 60, peer certificate).
    let wrong = publish(&s, &trust(&other, None), "--http1.1", "t", "e3");
    assert_eq!(wrong.status, 0, "{wrong:?}");
    assert_eq!(wrong.exit, 60, "certificate verification failed: {wrong:?}");

    // Plain HTTP to the TLS port: a clear answer, then the connection closes.
    let plain = curl(&[&format!("http://{}/v1/topics/t/events", s.http_addr())]);
    let msg = plain.expect_error(400, "tls-required");
    assert!(msg.contains("https://"), "{msg}");
    let plain = curl(&[&format!("http://{}/admin/health", s.admin_addr())]);
    plain.expect_error(400, "tls-required");

    // Nothing else arrived.
    let ids = poll_ids(&s, &args, "--http1.1", "g", 0);
    assert!(ids.is_empty(), "{ids:?}");
}

/// The configuration of the mTLS servers: `shop` may publish to `orders.*` (by
/// certificate or, with `optional`, by token), `ops` is admin.
fn mtls_toml(cert: &Issued, ca: &Issued, mode: &str) -> String {
    tls_toml(
        cert,
        &format!(
            "client_ca = \"{}\"\nclient_auth = \"{mode}\"\n\
             [auth.identities.shop]\npublish = [\"orders.*\"]\n\
             [auth.identities.bot]\n\
             token_sha256 = \"982d1fa5fe370406f7d81a5f5f4e2a56a99e6b06772bc53ffea5d8da78162dbe\"\n\
             publish = [\"orders.*\"]\n\
             [auth.identities.ops]\nadmin = true\ndefine = [\"*\"]\nconsume = [\"*\"]\n",
            ca.cert.display()
        ),
    )
}

/// The token of `bot` (its SHA-256 is in [`mtls_toml`]).
const BOT: &str = "tok-shop-3f9a";

/// A server asking for client certificates (`client_auth` = `mode`, rights of
/// [`mtls_toml`]) and its PKI: `ca` signs the server's certificate and those of `shop` and
/// `ops` (CN = name); `other` is a CA the server does not know.
struct Mtls {
    pki: Pki,
    ca: Issued,
    other: Issued,
    shop: Issued,
    ops: Issued,
    s: Server,
}

impl Mtls {
    fn start(mode: &str) -> Self {
        let pki = Pki::new();
        let ca = pki.ca("ca");
        let other = pki.ca("other");
        let cert = pki.server(&ca, "server", 101);
        let shop = pki.client(&ca, "shop", "shop", 201);
        let ops = pki.client(&ca, "ops", "ops", 203);
        // The readiness probe shows ops' certificate (none would do under `require`).
        let probe = trust(&ca, Some(&ops));
        let probe: Vec<&str> = probe.iter().map(String::as_str).collect();
        let s = Server::start(
            Options::new()
                .toml(&mtls_toml(&cert, &ca, mode))
                .tls_probe(&probe),
        );
        Self {
            pki,
            ca,
            other,
            shop,
            ops,
            s,
        }
    }

    /// curl arguments trusting the CA, presenting `client`'s certificate.
    fn args(&self, client: Option<&Issued>) -> Vec<String> {
        trust(&self.ca, client)
    }
}

/// The offsets of `topic` as `ops` sees them; `Null` when it was never published to.
fn offsets(s: &Server, ops: &[String], topic: &str) -> Value {
    let r = https(
        ops,
        &[],
        &s.admin_url(&format!("/admin/offsets?topic={topic}")),
    );
    if r.status == 404 {
        r.expect_error(404, "unknown-topic");
        return Value::Null;
    }
    r.ok_json(200)["offsets"].clone()
}

/// Goal: with `client_auth = "require"` only a certificate of the client CA gets a
/// connection, and its CN is the identity whose rights apply. Method: curl without a
/// certificate and with another CA's certificate (no HTTP answer at all); with `shop`'s
/// certificate a publish inside its prefix works and one outside is 403 naming shop;
/// a certificate whose CN has no entry is 403; after each refusal the topic is unchanged.
#[test]
fn mtls_required_takes_the_identity_from_the_certificate() {
    let m = Mtls::start("require");
    let (s, ca) = (&m.s, &m.ca);
    let stranger = m.pki.client(ca, "stranger", "stranger", 202);
    let forged = m.pki.client(&m.other, "forged", "shop", 204);
    let shop_args = m.args(Some(&m.shop));
    let ops_args = m.args(Some(&m.ops));
    // ops watches what reaches orders.eu.
    subscribe(s, &ops_args, "watch", "orders.eu");

    // No certificate, or one of another CA: the handshake fails, nothing is answered.
    for (what, args) in [
        ("no certificate", trust(ca, None)),
        ("another CA's certificate", trust(ca, Some(&forged))),
    ] {
        for version in ["--http1.1", "--http2"] {
            let r = publish(s, &args, version, "orders.eu", "x");
            assert_eq!(r.status, 0, "{what} {version}: {r:?}");
            assert_ne!(r.exit, 0, "{what} {version}: {r:?}");
        }
    }
    // A token does not replace the certificate when it is required.
    let r = https(
        &trust(ca, None),
        &["-H", &format!("authorization: Bearer {BOT}")],
        &s.http_url("/v1/topics/orders.eu/events"),
    );
    assert_eq!(r.status, 0, "{r:?}");

    // The certificate's CN is the identity.
    publish(s, &shop_args, "--http1.1", "orders.eu", "e1").ok_json(200);
    publish(s, &shop_args, "--http2", "orders.eu", "e2").ok_json(200);
    let msg = publish(s, &shop_args, "--http2", "audit", "e2").expect_error(403, "forbidden");
    assert!(msg.contains("shop") && msg.contains("audit"), "{msg}");
    let msg = publish(
        s,
        &trust(ca, Some(&stranger)),
        "--http1.1",
        "orders.eu",
        "e3",
    )
    .expect_error(403, "forbidden");
    assert!(msg.contains("stranger"), "{msg}");
    assert!(msg.contains("no entry"), "{msg}");
    // shop is not admin; ops is.
    https(&shop_args, &[], &s.admin_url("/admin/clients")).expect_error(403, "forbidden");
    assert_eq!(
        offsets(s, &ops_args, "audit"),
        Value::Null,
        "nothing was published"
    );
    let mut ids = poll_ids(s, &ops_args, "--http2", "watch", 2);
    ids.sort();
    assert_eq!(
        ids,
        ["e1", "e2"],
        "only the publishes by shop's certificate"
    );
}

/// Goal: with `client_auth = "optional"` a caller may come with a certificate or with a
/// token, and a token sent decides. Method: curl without a certificate and without a
/// token (401 naming both ways), with the token (200), with shop's certificate (200), with
/// the certificate and a bad token (401).
#[test]
fn mtls_optional_accepts_a_certificate_or_a_token() {
    let m = Mtls::start("optional");
    let s = &m.s;
    let plain = m.args(None);
    let ops_args = m.args(Some(&m.ops));
    subscribe(s, &ops_args, "watch", "orders.eu");
    // HTTP/2: the gate reads a refused request's body before it answers, so curl gets the
    // 401 rather than a reset stream (error 92).
    let r = publish(s, &plain, "--http2", "orders.eu", "e0");
    let msg = r.expect_error(401, "unauthorized");
    assert!(msg.contains("client certificate"), "{msg}");
    let with_token = {
        let mut a = plain.clone();
        a.extend(["-H".to_owned(), format!("authorization: Bearer {BOT}")]);
        a
    };
    publish(s, &with_token, "--http1.1", "orders.eu", "e1").ok_json(200);
    publish(s, &m.args(Some(&m.shop)), "--http2", "orders.eu", "e2").ok_json(200);
    let mut bad = m.args(Some(&m.shop));
    bad.extend(["-H".to_owned(), "authorization: Bearer nope".to_owned()]);
    publish(s, &bad, "--http2", "orders.eu", "e3").expect_error(401, "unauthorized");
    let mut ids = poll_ids(s, &ops_args, "--http2", "watch", 2);
    ids.sort();
    assert_eq!(ids, ["e1", "e2"], "the refused publishes changed nothing");
    let more = poll_ids(s, &ops_args, "--http2", "watch", 0);
    assert!(more.is_empty(), "{more:?}");
}

/// Runs `tests/python/tls_requests.py` on `calls` (see there): each call's answer or
/// error, by name. Fails, saying what to install, without python3 and `requests`.
fn python_requests(pki: &Pki, calls: &Value) -> BTreeMap<String, Value> {
    let file = pki.path("calls.json");
    std::fs::write(&file, calls.to_string()).expect("write the calls");
    let script = unimesh_tests::package_dir().join("python/tls_requests.py");
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let out = Command::new(&python)
        .arg(&script)
        .arg(&file)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {python} (needed for {}): {e}", script.display()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "tls_requests.py failed (needs `python3 -m pip install requests`, see \
         tests/prepare.sh): {stderr}"
    );
    eprintln!("{}", stderr.trim());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            (v["name"].as_str().unwrap_or_default().to_owned(), v)
        })
        .collect()
}

/// A publish of one event to `topic` as a [`python_requests`] call.
fn py_publish(name: &str, s: &Server, topic: &str, ca: &Issued, client: Option<&Issued>) -> Value {
    let mut call = json!({
        "name": name,
        "method": "POST",
        "url": s.http_url(&format!("/v1/topics/{topic}/events")),
        "verify": ca.cert.display().to_string(),
        "event": event(name, "t", json!({"by": name})),
    });
    if let Some(c) = client {
        call["cert"] = json!([c.cert.display().to_string(), c.key.display().to_string()]);
    }
    call
}

/// Goal: a server certificate past its notAfter is refused by the clients users run, and
/// nothing they sent arrives. Method: a server with a certificate of the test CA valid
/// only on 2020-01-01; curl trusting that CA fails verification (exit 60, "expired"), and
/// so does Python `requests` with `verify=CA` (an `SSLError` saying the certificate has
/// expired); curl with `--insecure` still gets answers from the same server (so the
/// dates alone made the refusals), and the topic was never created.
#[test]
fn an_expired_server_certificate_is_refused_by_curl_and_python_requests() {
    let pki = Pki::new();
    let ca = pki.ca("ca");
    let expired = pki.expired_server(&ca, "expired", 0x301);
    let s = Server::start(
        Options::new()
            .toml(&tls_toml(&expired, ""))
            .tls_probe(&["--insecure"]),
    );
    for version in ["--http1.1", "--http2"] {
        let r = publish(&s, &trust(&ca, None), version, "t", "e1");
        assert_eq!((r.exit, r.status), (60, 0), "{version}: {r:?}");
        assert!(r.stderr.contains("expired"), "{version}: {r:?}");
    }
    let got = python_requests(&pki, &json!([py_publish("py", &s, "t", &ca, None)]));
    let py = &got["py"];
    assert_eq!(py["error"], "SSLError", "{py}");
    assert!(
        py["message"]
            .as_str()
            .is_some_and(|m| m.contains("certificate has expired")),
        "{py}"
    );
    let insecure = vec!["--insecure".to_owned()];
    let health = https(&insecure, &[], &s.admin_url("/admin/health"));
    assert_eq!(health.status, 200, "{health:?}");
    let r = https(&insecure, &[], &s.admin_url("/admin/offsets?topic=t"));
    r.expect_error(404, "unknown-topic");
}

/// Goal: Python `requests` with a client certificate (`cert=(crt, key)`, `verify=CA`)
/// gets the rights of the certificate's CN under mTLS `require`, and a certificate the
/// server cannot accept gets no connection, with the refusal logged and counted. Method:
/// requests publishes with shop's certificate inside its prefix (200) and outside it (403
/// naming shop); without a certificate, with another CA's certificate for CN shop, and
/// with shop's certificate expired since 2020-01-02 it gets an `SSLError` carrying the
/// server's TLS alert (certificate required, unknown CA, certificate expired), as does
/// curl with the expired certificate. The server logs each of the four refused
/// handshakes with rustls' reason and counts them in
/// `unimesh_auth_refused_total{reason="certificate"}`; only the allowed publish arrived.
#[test]
fn python_requests_with_a_client_certificate_gets_the_rights_of_its_cn() {
    let m = Mtls::start("require");
    let (s, ca) = (&m.s, &m.ca);
    let forged = m.pki.client(&m.other, "forged", "shop", 204);
    let expired = m.pki.expired_client(ca, "expired", "shop", 205);
    let ops_args = m.args(Some(&m.ops));
    subscribe(s, &ops_args, "watch", "orders.eu");

    let got = python_requests(
        &m.pki,
        &json!([
            py_publish("shop", s, "orders.eu", ca, Some(&m.shop)),
            py_publish("outside", s, "audit", ca, Some(&m.shop)),
            py_publish("none", s, "orders.eu", ca, None),
            py_publish("forged", s, "orders.eu", ca, Some(&forged)),
            py_publish("expired", s, "orders.eu", ca, Some(&expired)),
        ]),
    );
    for (name, r) in &got {
        eprintln!("requests {name}: {r}");
    }
    assert_eq!(got["shop"]["status"], 200, "{}", got["shop"]);
    let outside = &got["outside"];
    assert_eq!(outside["status"], 403, "{outside}");
    let body: Value = serde_json::from_str(outside["body"].as_str().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {outside}"));
    assert_eq!(body["error"], "forbidden", "{body}");
    let message = body["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("shop") && message.contains("audit"),
        "{body}"
    );
    for (name, alert) in [
        ("none", "certificate required"),
        ("forged", "unknown ca"),
        ("expired", "certificate expired"),
    ] {
        let r = &got[name];
        assert_eq!(r["error"], "SSLError", "{name}: {r}");
        assert!(
            r["message"].as_str().is_some_and(|m| m.contains(alert)),
            "{name}: {r}"
        );
    }
    let r = publish(s, &m.args(Some(&expired)), "--http2", "orders.eu", "curl");
    assert_eq!(r.status, 0, "{r:?}");
    assert!(r.stderr.contains("certificate expired"), "{r:?}");

    // The server's side: four refused handshakes, logged and counted.
    let refused = wait_for("four refusals counted", Duration::from_secs(30), || {
        let r = https(&ops_args, &[], &s.admin_url("/metrics"));
        let n = unimesh_tests::metric(
            &r.body,
            "unimesh_auth_refused_total",
            r#"reason="certificate""#,
        )?;
        (n >= 4.0).then_some(n)
    });
    assert_eq!(refused, 4.0, "one per refused handshake");
    let log = s.stderr();
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("client certificate refused"))
        .collect();
    assert_eq!(lines.len(), 4, "{log}");
    for reason in ["no certificates", "UnknownIssuer", "certificate expired"] {
        assert!(
            lines.iter().any(|l| l.contains(reason)),
            "no refusal naming {reason}: {lines:#?}"
        );
    }
    let ids = poll_ids(s, &ops_args, "--http2", "watch", 1);
    assert_eq!(ids, ["shop"], "only the allowed publish arrived");
    assert_eq!(offsets(s, &ops_args, "audit"), Value::Null);
}

/// Replaces `to` by `from` in one rename (the server never reads half a file).
fn install(from: &Issued, to: &Issued) {
    for (a, b) in [(&from.cert, &to.cert), (&from.key, &to.key)] {
        let tmp = b.with_extension("new");
        std::fs::copy(a, &tmp).expect("copy the new file");
        std::fs::rename(&tmp, b).expect("rename it into place");
    }
}

/// Goal: SIGHUP swaps the certificate for new connections while open connections and
/// streams go on, and a reload that fails keeps the certificate in use. Method: an SSE
/// stream (curl -N) and a long-poll (curl) are open before the reload, both seen by the
/// server as clients; the files are replaced by a certificate with another serial and
/// SIGHUP sent; `openssl s_client` sees the new serial; an event published then reaches
/// the open stream and ends the open long-poll; a broken key file and SIGHUP leave the new
/// serial in place and the server serving.
#[test]
fn sighup_reloads_the_certificate_and_open_streams_keep_going() {
    let pki = Pki::new();
    let ca = pki.ca("ca");
    let live = pki.server(&ca, "live", 0x101);
    let next = pki.server(&ca, "next", 0x202);
    let args = trust(&ca, None);
    let probe: Vec<&str> = args.iter().map(String::as_str).collect();
    let s = Server::start(Options::new().toml(&tls_toml(&live, "")).tls_probe(&probe));
    assert_eq!(served_serial(s.http_addr(), None).as_deref(), Some("0101"));
    subscribe(&s, &args, "streamed", "t");
    subscribe(&s, &args, "polled", "t");

    // The SSE stream, read line by line in a thread.
    let mut sse = Command::new("curl")
        .args(["-sS", "-N", "--http1.1"])
        .args(&args)
        .arg(s.http_url("/v1/subscriptions/streamed/stream?client=sse"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run curl for SSE");
    let (lines_tx, lines) = mpsc::channel::<String>();
    let out = sse.stdout.take().expect("curl's stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    // The long-poll, in a thread of its own.
    let poll_url = s.http_url("/v1/subscriptions/polled/events?client=poller&max=1&waitMs=50000");
    let poll_args = args.clone();
    let poll = std::thread::spawn(move || https(&poll_args, &["--http2"], &poll_url));
    let ops = trust(&ca, None);
    wait_for("both clients attached", Duration::from_secs(60), || {
        let r = https(&ops, &[], &s.admin_url("/admin/clients"));
        let clients = r.ok_json(200)["clients"].clone();
        let names: Vec<&str> = clients
            .as_array()
            .map(|a| a.iter().filter_map(|c| c["client"].as_str()).collect())
            .unwrap_or_default();
        (names.contains(&"sse") && names.contains(&"poller")).then_some(())
    });

    install(&next, &live);
    s.send_signal(libc::SIGHUP);
    wait_for(
        "the new certificate served",
        Duration::from_secs(60),
        || (served_serial(s.http_addr(), None).as_deref() == Some("0202")).then_some(()),
    );
    assert_eq!(served_serial(s.admin_addr(), None).as_deref(), Some("0202"));

    // The connections opened before the reload still work.
    publish(&s, &args, "--http2", "t", "after-reload").ok_json(200);
    let polled = poll.join().expect("the long-poll thread");
    let got = polled.ok_json(200);
    assert_eq!(got[0]["event"]["id"], "after-reload", "{polled:?}");
    let streamed = wait_for(
        "the event on the open SSE stream",
        Duration::from_secs(60),
        || {
            let line = lines.recv_timeout(Duration::from_millis(500)).ok()?;
            line.strip_prefix("data:")
                .and_then(|d| serde_json::from_str::<Value>(d.trim()).ok())
        },
    );
    assert_eq!(streamed["event"]["id"], "after-reload", "{streamed}");
    let _ = sse.kill();
    let _ = sse.wait();

    // A broken key: the reload fails, the certificate in use stays.
    std::fs::write(&live.key, "not a key\n").expect("break the key file");
    s.send_signal(libc::SIGHUP);
    wait_for("the failed reload logged", Duration::from_secs(60), || {
        s.stderr().contains("not reloaded").then_some(())
    });
    assert!(s.stderr().contains("server.tls.key"), "{}", s.stderr());
    assert_eq!(served_serial(s.http_addr(), None).as_deref(), Some("0202"));
    publish(&s, &args, "--http1.1", "t", "still-serving").ok_json(200);
}

/// Goal: a TLS file that cannot be used stops `serve` at once with one line naming it.
/// Method: the binary with a missing certificate, then with a key that is not PEM.
#[test]
fn bad_tls_files_are_named_at_start() {
    let pki = Pki::new();
    let ca = pki.ca("ca");
    let cert = pki.server(&ca, "server", 101);
    let garbage = pki.path("garbage.key");
    std::fs::write(&garbage, "nothing here\n").expect("write");
    let missing = pki.path("missing.pem");
    for (cert_path, key_path, named) in [
        (&missing, &cert.key, "server.tls.cert"),
        (&cert.cert, &garbage, "server.tls.key"),
    ] {
        let data = tempfile::tempdir().expect("temp dir");
        let out = Command::new(unimesh_tests::unimesh_bin())
            .args([
                "serve",
                "--http",
                "127.0.0.1:0",
                "--admin",
                "127.0.0.1:0",
                "--data",
            ])
            .arg(data.path())
            .arg("--tls-cert")
            .arg(cert_path)
            .arg("--tls-key")
            .arg(key_path)
            .env_remove("UNIMESH_CONFIG")
            .stdin(Stdio::null())
            .output()
            .expect("run unimesh");
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        let line = err
            .lines()
            .find(|l| l.contains(named))
            .unwrap_or_else(|| panic!("no line naming {named}: {err}"));
        let file = if named == "server.tls.cert" {
            cert_path
        } else {
            key_path
        };
        assert!(line.contains(&file.display().to_string()), "{line}");
    }
}

/// Runs the binary as a client with only the given `UNIMESH_*` variables.
fn cli(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(unimesh_tests::unimesh_bin());
    cmd.args(args).stdin(Stdio::null());
    for (k, _) in std::env::vars() {
        if k.starts_with("UNIMESH_") {
            cmd.env_remove(k);
        }
    }
    cmd.envs(env.iter().copied());
    cmd.output().expect("run unimesh")
}

/// Goal: the command line speaks HTTPS to a TLS listener whose certificate comes from a
/// private CA named by `--cacert` (or `UNIMESH_CACERT`), and refuses a server it cannot
/// verify with one line saying why. Method: the real binary against a TLS server: `publish`
/// with `--cacert` (exit 0), `groups --json` on the admin listener with `UNIMESH_CACERT`,
/// `subscribe --max 1` over SSE; without a CA (the system's do not know the test CA) and
/// with another CA: exit 3, the line names TLS, the certificate and `--cacert`, and nothing
/// was published; a `--cacert` file that is missing or holds no certificate: exit 2 naming
/// it.
#[test]
fn the_cli_speaks_https_with_a_private_ca() {
    let Served {
        pki,
        ca,
        other,
        args,
        s,
    } = served();
    subscribe(&s, &args, "g", "t");
    let server = s.http_url("");
    let admin = s.admin_url("");
    let ca_path = ca.cert.display().to_string();
    let other_path = other.cert.display().to_string();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();

    let publish_one = |id: &str, extra: &[&str], env: &[(&str, &str)]| {
        let mut a = vec![
            "publish", "t", "--type", "t", "--id", id, "--data", "{}", "--server", &server,
        ];
        a.extend_from_slice(extra);
        cli(&a, env)
    };
    let out = publish_one("cli-1", &["--cacert", &ca_path], &[]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("published cli-1"), "{out:?}");

    let out = cli(
        &["groups", "--json", "--admin", &admin],
        &[("UNIMESH_CACERT", &ca_path)],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let groups: Value = serde_json::from_slice(&out.stdout).expect("groups --json is JSON");
    assert!(groups.to_string().contains("\"g\""), "{groups}");

    let out = cli(
        &["subscribe", "g", "--max", "1", "--server", &server],
        &[("UNIMESH_CACERT", &ca_path), ("UNIMESH_ADMIN_URL", &admin)],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("cli-1"), "{out:?}");

    // A server the client cannot verify: refused before anything is sent.
    for (what, extra) in [
        ("no CA given", vec![]),
        ("another CA", vec!["--cacert", other_path.as_str()]),
    ] {
        let out = publish_one("never", &extra, &[]);
        assert_eq!(out.status.code(), Some(3), "{what}: {out:?}");
        let err = text(&out.stderr);
        assert!(
            err.contains("TLS") && err.contains("certificate") && err.contains("--cacert"),
            "{what}: {err}"
        );
    }
    // A CA file that cannot be used: a usage error naming it.
    let empty = pki.path("empty.pem");
    std::fs::write(&empty, "nothing\n").expect("write");
    let missing = pki.path("missing.pem").display().to_string();
    let empty = empty.display().to_string();
    for path in [&missing, &empty] {
        let out = publish_one("never", &["--cacert", path], &[]);
        assert_eq!(out.status.code(), Some(2), "{path}: {out:?}");
        assert!(text(&out.stderr).contains(path.as_str()), "{out:?}");
    }
    // Only cli-1 arrived (the subscriber ACKed it).
    let ids = poll_ids(&s, &args, "--http1.1", "g", 0);
    assert!(ids.is_empty(), "{ids:?}");
    let offsets = https(&args, &[], &s.admin_url("/admin/offsets?topic=t"));
    let end: u64 = offsets.ok_json(200)["offsets"]
        .as_array()
        .map(|a| a.iter().filter_map(|p| p["end"].as_u64()).sum())
        .unwrap_or(0);
    assert_eq!(end, 1, "one event published: {offsets:?}");
}

/// Goal: under mTLS `require` the command line presents a client certificate
/// (`--client-cert`/`--client-key`, or `UNIMESH_CLIENT_CERT`/`UNIMESH_CLIENT_KEY`) and gets
/// the rights of its CN; without one it is refused with a line saying what to give.
/// Method: the real binary: `publish` with shop's certificate inside its prefix (exit 0)
/// and outside (exit 1, 403 naming shop); `groups --json` with ops' certificate from the
/// environment (exit 0); `publish` without a certificate: exit 3 naming the server's alert
/// and `--client-cert`; `--client-cert` without `--client-key`: exit 2. Only the allowed
/// event arrived.
#[test]
fn the_cli_presents_a_client_certificate_under_mtls() {
    let m = Mtls::start("require");
    let s = &m.s;
    let ops_args = m.args(Some(&m.ops));
    subscribe(s, &ops_args, "watch", "orders.eu");
    let server = s.http_url("");
    let admin = s.admin_url("");
    let ca = m.ca.cert.display().to_string();
    let (shop_cert, shop_key) = (
        m.shop.cert.display().to_string(),
        m.shop.key.display().to_string(),
    );
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    let publish = |topic: &str, extra: &[&str]| {
        let mut a = vec![
            "publish", topic, "--type", "t", "--id", "cli", "--data", "{}", "--server", &server,
            "--cacert", &ca,
        ];
        a.extend_from_slice(extra);
        cli(&a, &[])
    };
    let shop = ["--client-cert", &shop_cert, "--client-key", &shop_key];

    let out = publish("orders.eu", &shop);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = publish("audit", &shop);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = text(&out.stderr);
    assert!(err.contains("403") && err.contains("shop"), "{err}");

    let (ops_cert, ops_key) = (
        m.ops.cert.display().to_string(),
        m.ops.key.display().to_string(),
    );
    let out = cli(
        &["groups", "--json", "--admin", &admin, "--cacert", &ca],
        &[
            ("UNIMESH_CLIENT_CERT", &ops_cert),
            ("UNIMESH_CLIENT_KEY", &ops_key),
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("\"watch\""), "{out:?}");

    let out = publish("orders.eu", &[]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let err = text(&out.stderr);
    assert!(
        err.contains("CertificateRequired") && err.contains("--client-cert"),
        "{err}"
    );
    let out = publish("orders.eu", &shop[..2]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");

    let ids = poll_ids(s, &ops_args, "--http2", "watch", 1);
    assert_eq!(ids, ["cli"], "only the allowed publish arrived");
}
