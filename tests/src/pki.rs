//! A throw-away PKI made at test time with the `openssl` command line (the same commands
//! the README shows), and `curl` as the HTTPS client of the TLS tests.
//!
//! Every key is EC P-256; certificates are valid for two days, or were valid for one day
//! in January 2020 (an expired one: `openssl ca` with `-startdate`/`-enddate`, since
//! `openssl x509 -days` cannot go negative and Debian 12's OpenSSL 3.0 has no
//! `-not_before`/`-not_after`); a server certificate names `127.0.0.1` and `localhost`, a
//! client certificate has the CN it is given.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A directory of keys and certificates.
pub struct Pki {
    dir: tempfile::TempDir,
}

/// When a leaf certificate is valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Validity {
    /// From now for two days.
    Current,
    /// 2020-01-01 to 2020-01-02: expired.
    Expired,
}

/// A certificate and its key.
#[derive(Clone, Debug)]
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Default for Pki {
    fn default() -> Self {
        Self::new()
    }
}

impl Pki {
    pub fn new() -> Self {
        match tempfile::Builder::new().prefix("unimesh-pki-").tempdir() {
            Ok(dir) => Self { dir },
            Err(e) => panic!("cannot create a temporary directory: {e}"),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A self-signed CA: `NAME.pem`, `NAME.key`.
    pub fn ca(&self, name: &str) -> Issued {
        let issued = self.files(name);
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN={name} test CA"),
            "-keyout",
            &text(&issued.key),
            "-out",
            &text(&issued.cert),
        ]);
        issued
    }

    /// A server certificate for 127.0.0.1 and localhost, signed by `ca`, with this serial.
    pub fn server(&self, ca: &Issued, name: &str, serial: u32) -> Issued {
        self.leaf(ca, name, "localhost", serial, SERVER_EXT, Validity::Current)
    }

    /// [`Pki::server`], expired since 2020-01-02.
    pub fn expired_server(&self, ca: &Issued, name: &str, serial: u32) -> Issued {
        self.leaf(ca, name, "localhost", serial, SERVER_EXT, Validity::Expired)
    }

    /// A client certificate with subject CN `cn`, signed by `ca`.
    pub fn client(&self, ca: &Issued, name: &str, cn: &str, serial: u32) -> Issued {
        self.leaf(ca, name, cn, serial, CLIENT_EXT, Validity::Current)
    }

    /// [`Pki::client`], expired since 2020-01-02.
    pub fn expired_client(&self, ca: &Issued, name: &str, cn: &str, serial: u32) -> Issued {
        self.leaf(ca, name, cn, serial, CLIENT_EXT, Validity::Expired)
    }

    fn leaf(
        &self,
        ca: &Issued,
        name: &str,
        cn: &str,
        serial: u32,
        ext: &str,
        validity: Validity,
    ) -> Issued {
        let issued = self.files(name);
        let csr = self.path(&format!("{name}.csr"));
        let extfile = self.path(&format!("{name}.ext"));
        let ext = format!(
            "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n{ext}"
        );
        if let Err(e) = std::fs::write(&extfile, ext) {
            panic!("cannot write {}: {e}", extfile.display());
        }
        openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            &format!("/CN={cn}"),
            "-keyout",
            &text(&issued.key),
            "-out",
            &text(&csr),
        ]);
        match validity {
            Validity::Current => openssl(&[
                "x509",
                "-req",
                "-in",
                &text(&csr),
                "-CA",
                &text(&ca.cert),
                "-CAkey",
                &text(&ca.key),
                "-set_serial",
                &serial.to_string(),
                "-days",
                "2",
                "-extfile",
                &text(&extfile),
                "-out",
                &text(&issued.cert),
            ]),
            Validity::Expired => self.sign_in_the_past(ca, name, serial, &csr, &extfile, &issued),
        };
        issued
    }

    /// `openssl ca`, the one signing command that takes dates: it wants a database of its
    /// own (here one per certificate) and the serial in a file.
    fn sign_in_the_past(
        &self,
        ca: &Issued,
        name: &str,
        serial: u32,
        csr: &Path,
        extfile: &Path,
        issued: &Issued,
    ) -> String {
        let db = self.path(&format!("{name}-ca"));
        let config = db.join("ca.cnf");
        let written = std::fs::create_dir_all(&db)
            .and_then(|()| std::fs::write(db.join("index.txt"), ""))
            .and_then(|()| std::fs::write(db.join("serial"), format!("{serial:08X}\n")))
            .and_then(|()| {
                std::fs::write(
                    &config,
                    format!(
                        "[ca]\ndefault_ca = test\n[test]\ndir = {}\ndatabase = $dir/index.txt\n\
                         new_certs_dir = $dir\nserial = $dir/serial\ndefault_md = sha256\n\
                         policy = any\n[any]\ncommonName = supplied\n",
                        db.display()
                    ),
                )
            });
        if let Err(e) = written {
            panic!("cannot write the CA database in {}: {e}", db.display());
        }
        openssl(&[
            "ca",
            "-batch",
            "-notext",
            "-config",
            &text(&config),
            "-cert",
            &text(&ca.cert),
            "-keyfile",
            &text(&ca.key),
            "-in",
            &text(csr),
            "-startdate",
            "20200101000000Z",
            "-enddate",
            "20200102000000Z",
            "-extfile",
            &text(extfile),
            "-out",
            &text(&issued.cert),
        ])
    }

    fn files(&self, name: &str) -> Issued {
        Issued {
            cert: self.path(&format!("{name}.pem")),
            key: self.path(&format!("{name}.key")),
        }
    }
}

const SERVER_EXT: &str = "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n";
const CLIENT_EXT: &str = "extendedKeyUsage=clientAuth\n";

fn text(p: &Path) -> String {
    p.display().to_string()
}

/// Runs `openssl ARGS`; panics with its output when it fails.
pub fn openssl(args: &[&str]) -> String {
    let out = match Command::new("openssl")
        .args(args)
        .stdin(Stdio::null())
        .output()
    {
        Ok(o) => o,
        Err(e) => panic!("cannot run openssl (Debian package openssl): {e}"),
    };
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The serial number (hex, as `openssl x509 -serial` prints it) of the certificate a TLS
/// server at `addr` presents now, read by `openssl s_client` over a new connection.
pub fn served_serial(addr: std::net::SocketAddr, client: Option<&Issued>) -> Option<String> {
    let mut cmd = Command::new("openssl");
    cmd.args([
        "s_client",
        "-connect",
        &addr.to_string(),
        "-servername",
        "localhost",
    ]);
    if let Some(c) = client {
        cmd.arg("-cert").arg(&c.cert).arg("-key").arg(&c.key);
    }
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let pem = String::from_utf8_lossy(&out.stdout).into_owned();
    let begin = pem.find("-----BEGIN CERTIFICATE-----")?;
    let end = pem.find("-----END CERTIFICATE-----")? + "-----END CERTIFICATE-----".len();
    let mut child = Command::new("openssl")
        .args(["x509", "-noout", "-serial"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take()?;
        stdin.write_all(&pem.as_bytes()[begin..end]).ok()?;
    }
    let out = child.wait_with_output().ok()?;
    let line = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    line.strip_prefix("serial=").map(str::to_owned)
}

/// What curl got: its exit code, the HTTP status (0 when there was no answer), the HTTP
/// version it spoke, the body, and its error output.
#[derive(Clone, Debug)]
pub struct Curled {
    pub exit: i32,
    pub status: u16,
    pub version: String,
    pub body: String,
    pub stderr: String,
}

impl Curled {
    pub fn json(&self) -> serde_json::Value {
        match serde_json::from_str(&self.body) {
            Ok(v) => v,
            Err(e) => panic!("curl: the body is not JSON ({e}): {self:?}"),
        }
    }

    /// Asserts the status (curl's failure shown otherwise) and returns the JSON body.
    pub fn ok_json(&self, status: u16) -> serde_json::Value {
        assert_eq!(self.status, status, "curl: {self:?}");
        self.json()
    }

    /// Asserts an error answer of the API: this status and `error` code; the message.
    pub fn expect_error(&self, status: u16, code: &str) -> String {
        let v = self.ok_json(status);
        assert_eq!(v["error"], code, "{self:?}");
        let message = v["message"].as_str().unwrap_or_default().to_owned();
        assert!(!message.is_empty(), "{self:?}");
        message
    }
}

/// Runs `curl -sS ARGS` and reads the status and version from `--write-out`.
pub fn curl(args: &[&str]) -> Curled {
    const MARK: &str = "\n--curl-status--";
    let out = match Command::new("curl")
        .args(["-sS", "--max-time", "60", "-w"])
        .arg(format!("{MARK}%{{http_code}} %{{http_version}}"))
        .args(args)
        .stdin(Stdio::null())
        .output()
    {
        Ok(o) => o,
        Err(e) => panic!("cannot run curl: {e}"),
    };
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, tail) = stdout.rsplit_once(MARK).unwrap_or((stdout.as_str(), "0 0"));
    let mut tail = tail.split_whitespace();
    let status = tail.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    let version = tail.next().unwrap_or("0").to_owned();
    Curled {
        exit: out.status.code().unwrap_or(-1),
        status,
        version,
        body: body.to_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}
