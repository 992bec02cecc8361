//! `outboxd health`: asks the running relay's own `/readyz` and exits 0 when
//! it answers 200. It is the container image's `HEALTHCHECK`: the image has
//! no shell or HTTP client, and the address comes from the same
//! configuration the relay reads (`[metrics] listen`), so a mounted file or
//! `OUTBOXD_METRICS_LISTEN` that moves the port moves the check with it.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::time::Duration;

/// `/readyz` answered 200.
pub const EXIT_READY: u8 = 0;
/// Not ready: another status, no answer, or nothing listening.
pub const EXIT_NOT_READY: u8 = 1;

/// How long the whole request may take: a health check that hangs is
/// killed by the runtime anyway, with a less helpful message.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// Where to ask for a relay listening on `listen`: an unspecified address
/// (`0.0.0.0`, `[::]`) listens on loopback too, and loopback is the address
/// that works inside any network namespace the relay shares.
pub fn probe_address(listen: SocketAddr) -> SocketAddr {
    let ip = match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, listen.port())
}

/// The status code and body of an HTTP/1.x response.
pub fn parse_response(raw: &[u8]) -> Option<(u16, String)> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status_line = head.lines().next()?;
    let mut words = status_line.split_whitespace();
    if !words.next()?.starts_with("HTTP/1.") {
        return None;
    }
    let code = words.next()?.parse().ok()?;
    Some((code, body.trim().to_string()))
}

/// GET `path` at `addr` with HTTP/1.0 (the server closes after answering).
pub fn get(addr: SocketAddr, path: &str, timeout: Duration) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    parse_response(&raw).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not an HTTP response: {:?}", String::from_utf8_lossy(&raw)),
        )
    })
}

/// Asks `/readyz` of a relay listening on `listen`; prints one line saying
/// what it answered to `out` and returns the exit code.
pub fn run(listen: SocketAddr, out: &mut impl Write) -> u8 {
    let addr = probe_address(listen);
    let (code, line) = match get(addr, "/readyz", TIMEOUT) {
        Ok((200, body)) => (EXIT_READY, format!("ready: {body}")),
        Ok((status, body)) => (EXIT_NOT_READY, format!("not ready ({status}): {body}")),
        Err(e) => (
            EXIT_NOT_READY,
            format!("not ready: cannot ask http://{addr}/readyz: {e}"),
        ),
    };
    let _ = writeln!(out, "{line}");
    code
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unspecified_listen_addresses_are_asked_on_loopback() {
        let ask = |s: &str| probe_address(s.parse().unwrap()).to_string();
        assert_eq!(ask("0.0.0.0:9187"), "127.0.0.1:9187");
        assert_eq!(ask("[::]:9300"), "[::1]:9300");
        assert_eq!(ask("10.1.2.3:9187"), "10.1.2.3:9187");
        assert_eq!(ask("[::1]:1"), "[::1]:1");
    }

    #[test]
    fn responses_are_parsed_into_status_and_body() {
        let r = parse_response(
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 8\r\n\r\nhalted: x\n",
        );
        assert_eq!(r, Some((503, "halted: x".to_string())));
        assert_eq!(
            parse_response(b"HTTP/1.0 200 OK\r\n\r\nready"),
            Some((200, "ready".into()))
        );
        assert_eq!(parse_response(b""), None);
        assert_eq!(parse_response(b"SSH-2.0-OpenSSH\r\n"), None);
        assert_eq!(parse_response(b"HTTP/1.1 abc\r\n\r\n"), None);
    }

    #[test]
    fn nothing_listening_is_not_ready() {
        // A port just released: connecting is refused at once.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut out = Vec::new();
        let code = run(SocketAddr::from(([127, 0, 0, 1], port)), &mut out);
        assert_eq!(code, EXIT_NOT_READY);
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.starts_with("not ready: cannot ask http://127.0.0.1:"),
            "{text}"
        );
    }
}
