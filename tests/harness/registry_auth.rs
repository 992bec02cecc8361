//! A gate in front of the test registry that asks for HTTP basic auth, as a
//! secured Confluent Schema Registry does (401 with Confluent's error body
//! when the credentials are wrong or missing). Apicurio's own
//! authentication needs an OpenID Connect server (Keycloak) beside it, too
//! much to start for one test; what outboxd sees is the same: a 401 to a
//! request with the wrong `Authorization` header.
//!
//! It takes one request per connection (outboxd's client opens one per
//! request) and forwards it with `Connection: close`, so the registry's
//! answer ends with the connection.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;

pub struct AuthGate {
    url: String,
    stop: Arc<AtomicBool>,
    refused: Arc<AtomicUsize>,
}

impl AuthGate {
    /// Listens on a free loopback port in front of the registry at
    /// `registry_url` (`http://127.0.0.1:PORT/apis/ccompat/v7`), letting
    /// through requests that carry `user`:`password`.
    pub fn start(registry_url: &str, user: &str, password: &str) -> AuthGate {
        let upstream_url = url::Url::parse(registry_url).unwrap();
        let upstream = SocketAddr::from(([127, 0, 0, 1], upstream_url.port().unwrap()));
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let mut url = upstream_url.clone();
        url.set_port(Some(listener.local_addr().unwrap().port()))
            .unwrap();
        let expected = format!(
            "basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
        )
        .to_ascii_lowercase();
        let stop = Arc::new(AtomicBool::new(false));
        let refused = Arc::new(AtomicUsize::new(0));
        let (s, r) = (stop.clone(), refused.clone());
        std::thread::spawn(move || {
            while !s.load(SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let (expected, r) = (expected.clone(), r.clone());
                        std::thread::spawn(move || serve(client, upstream, &expected, &r));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        AuthGate {
            url: url.to_string().trim_end_matches('/').to_owned(),
            stop,
            refused,
        }
    }

    /// The registry's URL through the gate.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Requests refused so far.
    pub fn refused(&self) -> usize {
        self.refused.load(SeqCst)
    }
}

impl Drop for AuthGate {
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
    }
}

fn serve(mut client: TcpStream, upstream: SocketAddr, expected: &str, refused: &AtomicUsize) {
    let _ = client.set_nonblocking(false);
    let _ = client.set_read_timeout(Some(Duration::from_secs(10)));
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match client.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let authorized = text.lines().any(|l| {
        l.to_ascii_lowercase()
            .strip_prefix("authorization:")
            .is_some_and(|v| v.trim() == expected)
    });
    if !authorized {
        refused.fetch_add(1, SeqCst);
        let body = r#"{"error_code":40101,"message":"Unauthorized"}"#;
        let _ = write!(
            client,
            "HTTP/1.1 401 Unauthorized\r\ncontent-type: application/json\r\n\
             www-authenticate: Basic realm=\"registry\"\r\ncontent-length: {}\r\n\
             connection: close\r\n\r\n{body}",
            body.len()
        );
        return;
    }
    let (head_text, rest) = text.split_once("\r\n\r\n").unwrap();
    let forwarded: Vec<&str> = head_text
        .lines()
        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
        .collect();
    let Ok(mut server) = TcpStream::connect(upstream) else {
        return;
    };
    let request = format!(
        "{}\r\nConnection: close\r\n\r\n{rest}",
        forwarded.join("\r\n")
    );
    if server.write_all(request.as_bytes()).is_err() {
        return;
    }
    let _ = std::io::copy(&mut server, &mut client);
}
