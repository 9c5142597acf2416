//! A fault-injecting TCP proxy for the Kafka tests: it listens on a loopback port and
//! forwards every connection to an upstream address (the broker), and the test can cut it
//! ([`Proxy::cut`]: every connection closed, new ones closed at once, until
//! [`Proxy::heal`]), delay every chunk ([`Proxy::delay`]), drop one direction
//! ([`Proxy::drop_direction`]: the bytes are read and thrown away, the connection stays
//! open — a black hole), close the connections of one Kafka client
//! ([`Proxy::refuse_client`], told by the client id of its requests), reset every open connection once ([`Proxy::reset`]) or point it
//! at another upstream ([`Proxy::set_upstream`], a broker restarted elsewhere).
//!
//! Kafka clients connect to the addresses the broker advertises in its metadata, not to
//! the bootstrap address, so the broker must advertise the proxy (see
//! `kafka::Broker::start_behind_proxy`).
//!
//! Plain std threads: one acceptor, two pumps per connection. Every open connection is
//! registered so a cut or a reset can shut its sockets at once (a blocked read then
//! returns), and leaves the registry when its pumps end.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

/// One direction of a proxied connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Client (unimesh) to broker: requests.
    ToUpstream,
    /// Broker to client: answers.
    ToClient,
}

#[derive(Default)]
struct Faults {
    cut: bool,
    delay: Duration,
    drop_to_upstream: bool,
    drop_to_client: bool,
    /// Connections whose Kafka requests carry a client id starting with this are closed.
    refused_client: Option<String>,
}

struct State {
    upstream: Mutex<SocketAddr>,
    faults: Mutex<Faults>,
    /// Open connections: both sockets, to shut them on a cut or a reset.
    open: Mutex<BTreeMap<u64, (TcpStream, TcpStream)>>,
    next_id: AtomicU64,
    /// Connections accepted and forwarded, and those refused during a cut.
    forwarded: AtomicU64,
    refused: AtomicU64,
    stop: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A running proxy; stops (and closes every connection) when dropped.
pub struct Proxy {
    addr: SocketAddr,
    state: Arc<State>,
    acceptor: Option<thread::JoinHandle<()>>,
}

impl Proxy {
    /// A proxy on a free loopback port forwarding to `upstream`.
    pub fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .unwrap_or_else(|e| panic!("the proxy cannot bind a loopback port: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("the proxy has no address: {e}"));
        let state = Arc::new(State {
            upstream: Mutex::new(upstream),
            faults: Mutex::new(Faults::default()),
            open: Mutex::new(BTreeMap::new()),
            next_id: AtomicU64::new(0),
            forwarded: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let st = state.clone();
        let acceptor = thread::Builder::new()
            .name("proxy-accept".into())
            .spawn(move || accept_loop(&listener, &st))
            .unwrap_or_else(|e| panic!("cannot start the proxy's thread: {e}"));
        Proxy {
            addr,
            state,
            acceptor: Some(acceptor),
        }
    }

    /// Where clients connect (`HOST:PORT`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Cuts the broker off: every open connection is closed, and every new one is closed
    /// as soon as it is accepted, until [`Proxy::heal`]. The broker keeps its data.
    pub fn cut(&self) {
        lock(&self.state.faults).cut = true;
        self.close_all();
    }

    /// Ends a cut, a delay and dropped directions: connections are forwarded again.
    pub fn heal(&self) {
        *lock(&self.state.faults) = Faults::default();
    }

    /// Holds every chunk this long before forwarding it (both directions).
    pub fn delay(&self, d: Duration) {
        lock(&self.state.faults).delay = d;
    }

    /// Reads and throws away every byte in one direction of every connection (open or
    /// new), until [`Proxy::heal`]: the connection stays up and answers never come (or
    /// requests never arrive).
    pub fn drop_direction(&self, dir: Direction) {
        let mut f = lock(&self.state.faults);
        match dir {
            Direction::ToUpstream => f.drop_to_upstream = true,
            Direction::ToClient => f.drop_to_client = true,
        }
    }

    /// Closes every connection of the Kafka clients whose client id starts with `prefix`
    /// (told by the header of each request they send), open or new, until
    /// [`Proxy::heal`]: to such a client the broker is unreachable, to every other one it
    /// answers as before.
    pub fn refuse_client(&self, prefix: &str) {
        lock(&self.state.faults).refused_client = Some(prefix.to_owned());
    }

    /// Closes every open connection once; new ones are forwarded as before.
    pub fn reset(&self) {
        self.close_all();
    }

    /// Where new connections are forwarded.
    pub fn upstream(&self) -> SocketAddr {
        *lock(&self.state.upstream)
    }

    /// Forwards new connections to `upstream` from now on (open ones keep theirs).
    pub fn set_upstream(&self, upstream: SocketAddr) {
        *lock(&self.state.upstream) = upstream;
    }

    /// Connections open now.
    pub fn open_connections(&self) -> usize {
        lock(&self.state.open).len()
    }

    /// Connections forwarded so far, and connections closed at once during a cut.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.state.forwarded.load(Ordering::Relaxed),
            self.state.refused.load(Ordering::Relaxed),
        )
    }

    fn close_all(&self) {
        let open = std::mem::take(&mut *lock(&self.state.open));
        for (_, (client, upstream)) in open {
            let _ = client.shutdown(Shutdown::Both);
            let _ = upstream.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        // Wake the acceptor with a connection of our own.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
        self.close_all();
    }
}

fn accept_loop(listener: &TcpListener, st: &Arc<State>) {
    for conn in listener.incoming() {
        if st.stop.load(Ordering::Relaxed) {
            return;
        }
        let Ok(client) = conn else { continue };
        if lock(&st.faults).cut {
            st.refused.fetch_add(1, Ordering::Relaxed);
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        let upstream_addr = *lock(&st.upstream);
        let Ok(upstream) = TcpStream::connect_timeout(&upstream_addr, Duration::from_secs(5))
        else {
            // The broker is not there (stopped, restarting): the client sees a close.
            st.refused.fetch_add(1, Ordering::Relaxed);
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = upstream.set_nodelay(true);
        let id = st.next_id.fetch_add(1, Ordering::Relaxed);
        let clones = (
            client.try_clone(),
            upstream.try_clone(),
            client.try_clone(),
            upstream.try_clone(),
        );
        let (Ok(c_reg), Ok(u_reg), Ok(c_read), Ok(u_read)) = clones else {
            continue;
        };
        lock(&st.open).insert(id, (c_reg, u_reg));
        st.forwarded.fetch_add(1, Ordering::Relaxed);
        let done = Arc::new(AtomicU64::new(0));
        for (from, to, dir) in [
            (c_read, upstream, Direction::ToUpstream),
            (u_read, client, Direction::ToClient),
        ] {
            let (state, done) = (st.clone(), done.clone());
            let spawned = thread::Builder::new()
                .name("proxy-pump".into())
                .spawn(move || {
                    pump(from, to, dir, &state);
                    // The second pump to end takes the connection off the registry.
                    if done.fetch_add(1, Ordering::Relaxed) == 1 {
                        lock(&state.open).remove(&id);
                    }
                });
            if spawned.is_err() {
                lock(&st.open).remove(&id);
            }
        }
    }
}

/// Copies `from` to `to` until either side closes, applying the faults of the moment.
fn pump(mut from: TcpStream, mut to: TcpStream, dir: Direction, st: &State) {
    let mut buf = vec![0u8; 64 * 1024];
    // The Kafka client id of the connection's requests, from its first chunk.
    let mut client: Option<String> = None;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if dir == Direction::ToUpstream && client.is_none() {
            client = kafka_client_id(buf.get(..n).unwrap_or(&[]));
        }
        let (cut, delay, dropped, refused) = {
            let f = lock(&st.faults);
            let dropped = match dir {
                Direction::ToUpstream => f.drop_to_upstream,
                Direction::ToClient => f.drop_to_client,
            };
            let refused = match (&f.refused_client, &client) {
                (Some(prefix), Some(id)) => id.starts_with(prefix.as_str()),
                _ => false,
            };
            (f.cut, f.delay, dropped, refused)
        };
        if cut || refused {
            break;
        }
        if dropped {
            continue;
        }
        if !delay.is_zero() {
            thread::sleep(delay);
        }
        let chunk = buf.get(..n).unwrap_or(&[]);
        if to.write_all(chunk).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

/// The client id of the Kafka request `chunk` starts with: after the size (4 bytes), API
/// key and version (2 each) and correlation id (4), a 16-bit length and the id's bytes
/// (request headers v1 and v2 alike). `None` when the chunk is too short or has no id.
fn kafka_client_id(chunk: &[u8]) -> Option<String> {
    let len = i16::from_be_bytes(chunk.get(12..14)?.try_into().ok()?);
    let len = usize::try_from(len).ok()?;
    let id = chunk.get(14..14 + len)?;
    String::from_utf8(id.to_vec()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::BufRead as _;

    /// An echo server: it answers every line with `prefix` and the line.
    fn echo(prefix: &'static str) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        thread::spawn(move || {
            for c in l.incoming().flatten() {
                thread::spawn(move || {
                    let mut w = c.try_clone().expect("clone");
                    for line in std::io::BufReader::new(c).lines() {
                        let Ok(line) = line else { break };
                        if writeln!(w, "{prefix}{line}").is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    fn connect(p: &Proxy) -> (TcpStream, std::io::BufReader<TcpStream>) {
        let s = TcpStream::connect(p.addr()).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        let r = std::io::BufReader::new(s.try_clone().expect("clone"));
        (s, r)
    }

    /// A line sent through, and its echo read back (None: closed or nothing came).
    fn roundtrip(
        s: &mut TcpStream,
        r: &mut std::io::BufReader<TcpStream>,
        line: &str,
    ) -> Option<String> {
        writeln!(s, "{line}").ok()?;
        let mut got = String::new();
        match r.read_line(&mut got) {
            Ok(0) | Err(_) => None,
            Ok(_) => Some(got.trim().to_owned()),
        }
    }

    /// A Kafka request header (v1) whose client id is `client`, with a newline for the
    /// echo server.
    fn request(client: &str) -> Vec<u8> {
        let mut r = vec![0, 0, 0, 20, 0, 18, 0, 3, 0, 0, 0, 7];
        r.extend_from_slice(&(client.len() as i16).to_be_bytes());
        r.extend_from_slice(client.as_bytes());
        r.push(b'\n');
        r
    }

    /// A request sent as `client` on `s`, and whether its echo came back.
    fn answered(s: &mut TcpStream, r: &mut std::io::BufReader<TcpStream>, client: &str) -> bool {
        if s.write_all(&request(client)).is_err() {
            return false;
        }
        let mut got = Vec::new();
        matches!(r.read_until(b'\n', &mut got), Ok(n) if n > 0)
    }

    #[test]
    fn refuses_the_connections_of_one_kafka_client_only() {
        assert_eq!(
            kafka_client_id(&request("a-epoch-probe")).as_deref(),
            Some("a-epoch-probe")
        );
        assert_eq!(kafka_client_id(&[0, 0, 0, 20]), None, "too short");
        let p = Proxy::start(echo(""));
        let (mut open, mut open_r) = connect(&p);
        assert!(answered(&mut open, &mut open_r, "a-epoch-probe"));
        p.refuse_client("a-epoch");
        assert!(
            !answered(&mut open, &mut open_r, "a-epoch-probe"),
            "an open connection of the client is closed at its next request"
        );
        let (mut s, mut r) = connect(&p);
        assert!(!answered(&mut s, &mut r, "a-epoch-probe"), "and a new one");
        for other in ["a-workers", "b-epoch-probe"] {
            let (mut s, mut r) = connect(&p);
            assert!(answered(&mut s, &mut r, other), "{other} is answered");
        }
        p.heal();
        let (mut s, mut r) = connect(&p);
        assert!(answered(&mut s, &mut r, "a-epoch-probe"), "healed");
    }

    #[test]
    fn forwards_cuts_heals_drops_and_resets() {
        let p = Proxy::start(echo(""));
        let (mut s, mut r) = connect(&p);
        assert_eq!(roundtrip(&mut s, &mut r, "one").as_deref(), Some("one"));

        p.cut();
        let mut rest = String::new();
        assert!(
            matches!(r.read_line(&mut rest), Ok(0)),
            "a cut closes open connections at once (read {rest:?})"
        );
        assert_eq!(
            roundtrip(&mut s, &mut r, "two"),
            None,
            "and they stay closed"
        );
        let (mut s2, mut r2) = connect(&p);
        assert_eq!(
            roundtrip(&mut s2, &mut r2, "three"),
            None,
            "a cut closes new ones"
        );
        assert!(p.counts().1 >= 1, "the refused connection is counted");

        p.heal();
        let (mut s, mut r) = connect(&p);
        assert_eq!(roundtrip(&mut s, &mut r, "four").as_deref(), Some("four"));

        p.drop_direction(Direction::ToClient);
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .expect("timeout");
        assert_eq!(
            roundtrip(&mut s, &mut r, "five"),
            None,
            "answers are dropped"
        );
        p.heal();
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        assert_eq!(
            roundtrip(&mut s, &mut r, "six").as_deref(),
            Some("six"),
            "the connection stayed up"
        );

        p.delay(Duration::from_millis(50));
        assert_eq!(roundtrip(&mut s, &mut r, "seven").as_deref(), Some("seven"));
        p.heal();

        assert_eq!(p.open_connections(), 1);
        p.reset();
        let mut rest = String::new();
        assert!(
            matches!(r.read_line(&mut rest), Ok(0)),
            "a reset closes open connections at once (read {rest:?})"
        );
        let (mut s, mut r) = connect(&p);
        assert_eq!(
            roundtrip(&mut s, &mut r, "nine").as_deref(),
            Some("nine"),
            "and not new ones"
        );

        p.set_upstream(echo("other "));
        let (mut s, mut r) = connect(&p);
        assert_eq!(
            roundtrip(&mut s, &mut r, "ten").as_deref(),
            Some("other ten")
        );
    }
}
