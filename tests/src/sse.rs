//! A minimal Server-Sent Events reader over a raw socket (the black-box tests use a real
//! Python SSE client too): it sends the GET, checks the answer's head, and reads events.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// How long a read may wait for the next byte (but see [`SseStream::next_event_within`]).
const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// One SSE event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SseEvent {
    pub id: Option<String>,
    pub data: String,
    pub retry: Option<u64>,
}

/// What [`SseStream::next_event_within`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    End,
    Event(SseEvent),
    /// Nothing complete within the time given.
    Idle,
}

/// An open SSE stream.
pub struct SseStream {
    reader: BufReader<TcpStream>,
    /// A line (and an event) read in part when a read timed out.
    partial: String,
    pending: SseEvent,
    has_data: bool,
    /// The answer's status and head.
    pub status: u16,
    pub head: String,
    /// The body as read so far when the status is not 200.
    pub body: String,
    /// The socket's read timeout now (set again only when it changes).
    timeout: Duration,
}

impl SseStream {
    /// Opens `path` (with `Last-Event-ID` when given). Panics on a transport failure.
    pub fn open(addr: SocketAddr, path: &str, last_event_id: Option<&str>) -> Self {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(READ_TIMEOUT))
            .expect("read timeout");
        let mut req =
            format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\naccept: text/event-stream\r\n");
        if let Some(id) = last_event_id {
            req.push_str(&format!("last-event-id: {id}\r\n"));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).expect("write");
        // 64 KiB: a read at saturation brings tens of events, which one ACK then settles.
        let mut reader = BufReader::with_capacity(64 << 10, s);
        let mut head = String::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                break;
            }
            if line == "\r\n" {
                break;
            }
            head.push_str(&line);
        }
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let mut body = String::new();
        if status != 200 {
            let len = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().to_owned())
                })
                .and_then(|v| v.parse::<usize>().ok())
                .unwrap_or(0);
            let mut buf = vec![0u8; len];
            let _ = std::io::Read::read_exact(&mut reader, &mut buf);
            body = String::from_utf8_lossy(&buf).into_owned();
        }
        Self {
            reader,
            partial: String::new(),
            pending: SseEvent::default(),
            has_data: false,
            status,
            head,
            body,
            timeout: READ_TIMEOUT,
        }
    }

    fn set_timeout(&mut self, timeout: Duration) {
        if timeout != self.timeout {
            let _ = self.reader.get_ref().set_read_timeout(Some(timeout));
            self.timeout = timeout;
        }
    }

    /// Nothing already received waits to be read but line ends (a chunk's closing CRLF):
    /// the next event waits on the socket.
    pub fn drained(&self) -> bool {
        self.reader
            .buffer()
            .iter()
            .all(|b| matches!(b, b'\r' | b'\n'))
    }

    /// Like [`SseStream::next_event`], but gives up after `idle` without a complete event.
    pub fn next_event_within(&mut self, idle: Duration) -> Next {
        self.set_timeout(idle);
        match self.read_event() {
            Ok(Some(e)) => Next::Event(e),
            Ok(None) => Next::End,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                Next::Idle
            }
            Err(_) => Next::End,
        }
    }

    /// The next event with data (comments and `retry:`-only events are skipped, the
    /// latter remembered on the next event). `None` when the stream ends. Chunked
    /// transfer framing is skipped: chunk-size lines are hex numbers alone on a line.
    pub fn next_event(&mut self) -> Option<SseEvent> {
        self.set_timeout(READ_TIMEOUT);
        self.read_event().ok().flatten()
    }

    fn read_event(&mut self) -> std::io::Result<Option<SseEvent>> {
        loop {
            if self.reader.read_line(&mut self.partial)? == 0 {
                return Ok(None);
            }
            if !self.partial.ends_with('\n') {
                continue;
            }
            let line = std::mem::take(&mut self.partial);
            let line = line.trim_end_matches(['\r', '\n']);
            if line.is_empty() {
                if self.has_data {
                    self.has_data = false;
                    return Ok(Some(std::mem::take(&mut self.pending)));
                }
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let ev = &mut self.pending;
            if let Some(v) = line.strip_prefix("id:") {
                ev.id = Some(v.trim_start().to_owned());
            } else if let Some(v) = line.strip_prefix("data:") {
                if self.has_data {
                    ev.data.push('\n');
                }
                ev.data.push_str(v.strip_prefix(' ').unwrap_or(v));
                self.has_data = true;
            } else if let Some(v) = line.strip_prefix("retry:") {
                ev.retry = v.trim().parse().ok();
            }
            // Anything else is chunk framing (a hex size) or an unknown field: ignored.
        }
    }
}
