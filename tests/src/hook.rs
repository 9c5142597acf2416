//! A webhook receiver for tests and the load example: a small HTTP/1.1 server on a free
//! loopback port that records every request and answers as its responder says (status,
//! headers, or a delay before answering). Keep-alive, one thread per connection.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One received request.
#[derive(Clone, Debug)]
pub struct HookRequest {
    pub method: String,
    pub path: String,
    /// Names lower-case.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// When it arrived, from the receiver's start.
    pub at: Duration,
}

impl HookRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The event's `ce-id`.
    pub fn event_id(&self) -> &str {
        self.header("ce-id").unwrap_or("")
    }
}

/// How to answer one request.
#[derive(Clone, Debug)]
pub struct HookAnswer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    /// Wait this long before answering (a slow subscriber).
    pub delay: Duration,
}

impl HookAnswer {
    pub fn status(status: u16) -> Self {
        Self {
            status,
            headers: Vec::new(),
            delay: Duration::ZERO,
        }
    }

    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    pub fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

type Responder = dyn Fn(&HookRequest, usize) -> HookAnswer + Send + Sync;

/// The receiver; stops accepting when dropped.
pub struct Hook {
    addr: SocketAddr,
    log: Arc<Log>,
    stop: Arc<AtomicBool>,
}

/// What a receiver keeps: every request, or (a load's receiver) only their count.
struct Log {
    requests: Mutex<Vec<HookRequest>>,
    keep: bool,
    count: AtomicUsize,
}

impl Hook {
    /// Starts a receiver; `respond` gets each request and how many came before it.
    pub fn start(
        respond: impl Fn(&HookRequest, usize) -> HookAnswer + Send + Sync + 'static,
    ) -> Self {
        Self::start_at("127.0.0.1:0", respond)
    }

    /// Starts a receiver on `bind` (`[::1]:0`: IPv6 loopback).
    pub fn start_at(
        bind: &str,
        respond: impl Fn(&HookRequest, usize) -> HookAnswer + Send + Sync + 'static,
    ) -> Self {
        Self::start_with(bind, true, respond)
    }

    /// [`Hook::start`] keeping no request, only their count (a load's receiver, whose
    /// memory must not grow with the events).
    pub fn start_unlogged(
        respond: impl Fn(&HookRequest, usize) -> HookAnswer + Send + Sync + 'static,
    ) -> Self {
        Self::start_with("127.0.0.1:0", false, respond)
    }

    fn start_with(
        bind: &str,
        keep: bool,
        respond: impl Fn(&HookRequest, usize) -> HookAnswer + Send + Sync + 'static,
    ) -> Self {
        let listener = TcpListener::bind(bind).expect("bind a loopback port");
        let addr = listener.local_addr().expect("local address");
        let log = Arc::new(Log {
            requests: Mutex::new(Vec::new()),
            keep,
            count: AtomicUsize::new(0),
        });
        let stop = Arc::new(AtomicBool::new(false));
        let respond: Arc<Responder> = Arc::new(respond);
        let started = Instant::now();
        {
            let (log, stop) = (log.clone(), stop.clone());
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let Ok(conn) = conn else { continue };
                    let (log, respond) = (log.clone(), respond.clone());
                    std::thread::spawn(move || serve(conn, log, respond, started));
                }
            });
        }
        Self { addr, log, stop }
    }

    /// Answers 200 to everything.
    pub fn ok() -> Self {
        Self::start(|_, _| HookAnswer::status(200))
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Every request so far, in arrival order (none for [`Hook::start_unlogged`]).
    pub fn requests(&self) -> Vec<HookRequest> {
        self.log
            .requests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn count(&self) -> usize {
        self.log.count.load(Ordering::Relaxed)
    }
}

impl Drop for Hook {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

fn serve(conn: TcpStream, log: Arc<Log>, respond: Arc<Responder>, started: Instant) {
    let _ = conn.set_nodelay(true);
    let Ok(mut writer) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(conn);
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let mut parts = line.split_whitespace();
        let method = parts.next().unwrap_or("").to_owned();
        let path = parts.next().unwrap_or("").to_owned();
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            match reader.read_line(&mut h) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
            }
        }
        let len = headers
            .iter()
            .find(|(k, _)| k == "content-length")
            .and_then(|(_, v)| v.parse::<usize>().ok())
            .unwrap_or(0);
        let mut body = vec![0u8; len];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let req = HookRequest {
            method,
            path,
            headers,
            body,
            at: started.elapsed(),
        };
        let n = if log.keep {
            let mut requests = log.requests.lock().unwrap_or_else(|p| p.into_inner());
            requests.push(req.clone());
            log.count.store(requests.len(), Ordering::Relaxed);
            requests.len() - 1
        } else {
            log.count.fetch_add(1, Ordering::Relaxed)
        };
        let answer = respond(&req, n);
        if !answer.delay.is_zero() {
            std::thread::sleep(answer.delay);
        }
        let mut head = format!("HTTP/1.1 {} X\r\ncontent-length: 0\r\n", answer.status);
        for (k, v) in &answer.headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        if writer.write_all(head.as_bytes()).is_err() {
            return;
        }
    }
}
