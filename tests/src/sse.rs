//! A minimal Server-Sent Events reader over a raw socket (the black-box tests use a real
//! Python SSE client too): it sends the GET, checks the answer's head, and reads events.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// One SSE event.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SseEvent {
    pub id: Option<String>,
    pub data: String,
    pub retry: Option<u64>,
}

/// An open SSE stream.
pub struct SseStream {
    reader: BufReader<TcpStream>,
    /// The answer's status and head.
    pub status: u16,
    pub head: String,
    /// The body as read so far when the status is not 200.
    pub body: String,
}

impl SseStream {
    /// Opens `path` (with `Last-Event-ID` when given). Panics on a transport failure.
    pub fn open(addr: SocketAddr, path: &str, last_event_id: Option<&str>) -> Self {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(60)))
            .expect("read timeout");
        let mut req =
            format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\naccept: text/event-stream\r\n");
        if let Some(id) = last_event_id {
            req.push_str(&format!("last-event-id: {id}\r\n"));
        }
        req.push_str("\r\n");
        s.write_all(req.as_bytes()).expect("write");
        let mut reader = BufReader::new(s);
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
            status,
            head,
            body,
        }
    }

    /// The next event with data (comments and `retry:`-only events are skipped, the
    /// latter remembered on the next event). `None` when the stream ends. Chunked
    /// transfer framing is skipped: chunk-size lines are hex numbers alone on a line.
    pub fn next_event(&mut self) -> Option<SseEvent> {
        let mut ev = SseEvent::default();
        let mut has_data = false;
        loop {
            let mut line = String::new();
            if self.reader.read_line(&mut line).ok()? == 0 {
                return None;
            }
            let line = line.trim_end_matches(['\r', '\n']);
            if line.is_empty() {
                if has_data {
                    return Some(ev);
                }
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            if let Some(v) = line.strip_prefix("id:") {
                ev.id = Some(v.trim_start().to_owned());
            } else if let Some(v) = line.strip_prefix("data:") {
                if has_data {
                    ev.data.push('\n');
                }
                ev.data.push_str(v.strip_prefix(' ').unwrap_or(v));
                has_data = true;
            } else if let Some(v) = line.strip_prefix("retry:") {
                ev.retry = v.trim().parse().ok();
            }
            // Anything else is chunk framing (a hex size) or an unknown field: ignored.
        }
    }
}
