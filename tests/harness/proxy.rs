//! A TCP proxy that can become a black hole: it stops forwarding in both
//! directions without closing either socket, as a dead switch, a moved VIP
//! or an expired NAT entry does (no RST, no FIN reaches either side). The
//! relay connects through it; the writer in a test connects directly.
//!
//! Held bytes are forwarded once the link heals, as TCP retransmission would
//! deliver them. New connections made meanwhile are accepted (the proxy's
//! kernel answers the SYN) but reach the server only after healing.
//!
//! It can also stall one client against a healthy server
//! ([`Proxy::freeze_existing_on`]): a connection open at the call that then
//! sends a given byte string (say a topic name in a Produce request) hangs
//! from that chunk on, while every connection made later passes. A client
//! then waits on a connection that never answers, as one stuck after a
//! fenced broker does, and a fresh client of the same kind works at once.
//! It can also freeze only the connections open so far
//! ([`Proxy::freeze_existing`]) while new ones pass: a client whose own
//! connections hang, on a healthy cluster that fresh clients reach.
//!
//! It can also put a server far away ([`Proxy::start_delayed`]): every chunk
//! is forwarded a fixed time after it arrived, in each direction, with no
//! limit on what is on its way (a long fat link, not a slow one). The
//! kernel here has no `netem`.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often an idle pump looks at the switch.
const POLL: Duration = Duration::from_millis(20);

#[derive(Default)]
struct Switch {
    black_hole: AtomicBool,
    stop: AtomicBool,
    /// How long each chunk takes, one way.
    delay: Duration,
    /// Numbers the connections in the order they were accepted.
    accepted: AtomicU64,
    /// Connections numbered below the first freeze on the second's bytes
    /// (see [`Proxy::freeze_existing_on`]).
    freeze: Mutex<Option<(u64, Vec<u8>)>>,
    /// Connections frozen so far.
    frozen: AtomicUsize,
    /// Connections numbered below this are frozen for good
    /// (see [`Proxy::freeze_existing`]).
    frozen_below: AtomicU64,
}

/// One proxied connection, shared by its two pumps.
#[derive(Default)]
struct Link {
    number: u64,
    frozen: AtomicBool,
}

impl Switch {
    /// Waits while the link is a black hole or frozen; false once the
    /// proxy stops.
    fn wait_open(&self, link: &Link) -> bool {
        while (self.black_hole.load(SeqCst)
            || link.frozen.load(SeqCst)
            || link.number < self.frozen_below.load(SeqCst))
            && !self.stop.load(SeqCst)
        {
            std::thread::sleep(POLL);
        }
        !self.stop.load(SeqCst)
    }

    /// Freezes `link` when it existed at the freeze and `chunk`, from its
    /// client, holds the freeze's bytes.
    fn inspect(&self, link: &Link, chunk: &[u8]) {
        let freeze = self.freeze.lock().unwrap();
        let Some((below, bytes)) = freeze.as_ref() else {
            return;
        };
        let holds = !bytes.is_empty() && chunk.windows(bytes.len()).any(|w| w == bytes);
        if link.number < *below && holds && !link.frozen.swap(true, SeqCst) {
            self.frozen.fetch_add(1, SeqCst);
        }
    }
}

pub struct Proxy {
    port: u16,
    switch: Arc<Switch>,
}

impl Proxy {
    /// Listens on 127.0.0.1 (a free port) and forwards to `upstream`.
    pub fn start(upstream: SocketAddr) -> Proxy {
        Proxy::start_delayed(upstream, Duration::ZERO)
    }

    /// As [`start`](Self::start), each chunk forwarded `delay` after it
    /// arrived, in both directions.
    pub fn start_delayed(upstream: SocketAddr, delay: Duration) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let switch = Arc::new(Switch {
            delay,
            ..Switch::default()
        });
        let s = Arc::clone(&switch);
        std::thread::spawn(move || {
            while !s.stop.load(SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let s = Arc::clone(&s);
                        let number = s.accepted.fetch_add(1, SeqCst);
                        std::thread::spawn(move || connect(client, upstream, s, number));
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(POLL),
                    Err(_) => std::thread::sleep(POLL),
                }
            }
        });
        Proxy { port, switch }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// From now on nothing passes, in either direction.
    pub fn black_hole(&self) {
        self.switch.black_hole.store(true, SeqCst);
    }

    /// From now on nothing passes on the connections accepted so far, in
    /// either direction, for good (no RST, no FIN); connections accepted
    /// later pass.
    pub fn freeze_existing(&self) {
        let accepted = self.switch.accepted.load(SeqCst);
        self.switch.frozen_below.store(accepted, SeqCst);
    }

    pub fn heal(&self) {
        self.switch.black_hole.store(false, SeqCst);
        *self.switch.freeze.lock().unwrap() = None;
    }

    /// Every connection open now that from now on sends `bytes` (in one
    /// chunk read from its client) hangs from that chunk on, both ways,
    /// until [`heal`](Self::heal); connections made later are never
    /// frozen. Not for the delayed proxy.
    pub fn freeze_existing_on(&self, bytes: &[u8]) {
        assert!(self.switch.delay.is_zero(), "not for a delayed proxy");
        let below = self.switch.accepted.load(SeqCst);
        *self.switch.freeze.lock().unwrap() = Some((below, bytes.to_vec()));
    }

    /// How many connections [`freeze_existing_on`](Self::freeze_existing_on)
    /// froze.
    pub fn frozen(&self) -> usize {
        self.switch.frozen.load(SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.switch.stop.store(true, SeqCst);
    }
}

fn connect(client: TcpStream, upstream: SocketAddr, switch: Arc<Switch>, number: u64) {
    let _ = client.set_nonblocking(false);
    let link = Arc::new(Link {
        number,
        ..Link::default()
    });
    if !switch.wait_open(&link) {
        return;
    }
    let Ok(server) = TcpStream::connect_timeout(&upstream, Duration::from_secs(5)) else {
        return;
    };
    let (Ok(client2), Ok(server2)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let (s, l) = (Arc::clone(&switch), Arc::clone(&link));
    std::thread::spawn(move || pump(client, server, s, l, true));
    pump(server2, client2, switch, link, false);
}

/// Copies `from` to `to` while the link is open; closes both at the end.
/// `from_client`: the direction [`Switch::inspect`] looks at.
fn pump(from: TcpStream, to: TcpStream, switch: Arc<Switch>, link: Arc<Link>, from_client: bool) {
    if switch.delay.is_zero() {
        pump_now(from, to, switch, &link, from_client);
    } else {
        pump_delayed(from, to, switch);
    }
}

/// A delay line: this thread reads and stamps each chunk, another writes it
/// when it is due, so chunks overlap on the way as on a long link.
fn pump_delayed(mut from: TcpStream, mut to: TcpStream, switch: Arc<Switch>) {
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    let writer = std::thread::spawn(move || {
        for (due, chunk) in rx {
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
            if to.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
    });
    let _ = from.set_read_timeout(Some(POLL));
    let mut buf = vec![0u8; 64 * 1024];
    while !switch.stop.load(SeqCst) {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(_) => break,
        };
        if tx
            .send((Instant::now() + switch.delay, buf[..n].to_vec()))
            .is_err()
        {
            break;
        }
    }
    drop(tx);
    let _ = writer.join();
    let _ = from.shutdown(Shutdown::Both);
}

fn pump_now(
    mut from: TcpStream,
    mut to: TcpStream,
    switch: Arc<Switch>,
    link: &Link,
    from_client: bool,
) {
    let _ = from.set_read_timeout(Some(POLL));
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if !switch.wait_open(link) {
            break;
        }
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(_) => break,
        };
        if from_client {
            switch.inspect(link, &buf[..n]);
        }
        // Read just as the switch flipped: hold it like the rest.
        if !switch.wait_open(link) || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}
