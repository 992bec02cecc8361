//! Talking to `outboxd run`'s HTTP endpoint: plain GETs and parsed
//! `/metrics` scrapes.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A free port on 127.0.0.1 for a server a test starts.
///
/// Not one the kernel hands out for port 0: that comes from the ephemeral
/// range, which outgoing connections (every Kafka and PostgreSQL client of
/// the suite) draw their local ports from too, so one of them could take it
/// between this call and the listener's bind (CI, 2026-12-05: "cannot start
/// the metrics endpoint on 127.0.0.1:35875 (metrics.listen): Address already
/// in use"). Below that range only listeners take ports: each process walks
/// its own stretch of it from a random start, and skips a port in use.
pub fn free_port() -> u16 {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::OnceLock;

    const LOWEST: u32 = 10_000;
    static RANGE: OnceLock<(u32, u32)> = OnceLock::new();
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let &(first, span) = RANGE.get_or_init(|| {
        let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
            .unwrap_or(32_768);
        let span = ephemeral_low.saturating_sub(LOWEST).max(1_000);
        let start = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish() as u32
            % span;
        NEXT.store(start, Ordering::Relaxed);
        (LOWEST, span)
    });
    for _ in 0..span {
        let port = first + NEXT.fetch_add(1, Ordering::Relaxed) % span;
        if std::net::TcpListener::bind(("127.0.0.1", port as u16)).is_ok() {
            return port as u16;
        }
    }
    panic!("no free port in {first}..{}", first + span)
}

/// `GET path` with a plain socket: (status, body), or None if nothing answers.
pub fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    s.read_to_string(&mut text).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

/// One scrape of `/metrics`: (series name, labels, value) per sample.
pub struct Scrape(Vec<(String, String, f64)>);

impl Scrape {
    pub fn take(port: u16) -> Scrape {
        let (status, body) = get(port, "/metrics").expect("scrape /metrics");
        assert_eq!(status, 200, "{body}");
        let samples = body
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(|l| {
                let (series, value) = l.rsplit_once(' ').expect("sample line");
                let (name, labels) = match series.split_once('{') {
                    Some((n, rest)) => (n, rest.trim_end_matches('}')),
                    None => (series, ""),
                };
                let value = value.parse().unwrap_or_else(|_| panic!("value of {l}"));
                (name.to_string(), labels.to_string(), value)
            })
            .collect();
        Scrape(samples)
    }

    /// The sum over every sample of `name` whose labels contain `label`
    /// (`""`: all of them); None when there is none.
    pub fn get(&self, name: &str, label: &str) -> Option<f64> {
        let mut found = self
            .0
            .iter()
            .filter(|(n, l, _)| n == name && l.contains(label))
            .map(|(_, _, v)| *v)
            .peekable();
        found.peek()?;
        Some(found.sum())
    }

    pub fn value(&self, name: &str, label: &str) -> f64 {
        self.get(name, label)
            .unwrap_or_else(|| panic!("no {name}{{{label}}} in the scrape"))
    }

    /// Every sample of `name`: its labels and value.
    pub fn series(&self, name: &str) -> Vec<(String, f64)> {
        self.0
            .iter()
            .filter(|(n, _, _)| n == name)
            .map(|(_, l, v)| (l.clone(), *v))
            .collect()
    }

    /// The buckets of histogram `name`: each bound (`le`, as exported) and
    /// its cumulative count, in the scrape's order.
    pub fn buckets(&self, name: &str) -> Vec<(String, f64)> {
        let series = format!("{name}_bucket");
        self.series(&series)
            .into_iter()
            .map(|(labels, count)| {
                let le = labels
                    .split(',')
                    .find_map(|l| l.strip_prefix("le=\""))
                    .map_or("?", |l| l.trim_end_matches('"'));
                (le.to_string(), count)
            })
            .collect()
    }

    /// Metric names present (histogram series fold into their metric).
    pub fn names(&self) -> BTreeSet<String> {
        self.0
            .iter()
            .map(|(n, _, _)| {
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| n.strip_suffix(s))
                    .filter(|b| self.0.iter().any(|(m, _, _)| m == &format!("{b}_bucket")));
                base.unwrap_or(n).to_string()
            })
            .collect()
    }
}
