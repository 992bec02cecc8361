//! A TLS gate in front of the test registry that requires a client
//! certificate, as a registry behind mutual TLS does. Apicurio 3.3.3 can
//! serve HTTPS, but Quarkus fixes `quarkus.http.ssl.client-auth` when the
//! application is built (NONE in the published distribution), so its own
//! listener cannot be told to require a client certificate; the gate, on
//! rustls, can. What outboxd sees is the same: a handshake that asks for a
//! certificate and a fatal alert when it has none or one from another CA.
//!
//! The certificates are made at the start of each use with the openssl CLI
//! ([`TlsFiles::make`]): a CA, the gate's certificate for 127.0.0.1, a client
//! certificate from the same CA, and a client certificate from another CA.
//!
//! One request per connection, forwarded with `Connection: close` (as the
//! basic-auth gate does).
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection, StreamOwned};

/// The PEM files of one test: paths under a temp dir.
pub struct TlsFiles {
    dir: tempfile::TempDir,
}

impl TlsFiles {
    /// Makes the CA, the gate's certificate, a client certificate of the
    /// same CA (`client`), and one of another CA (`stranger`).
    pub fn make() -> TlsFiles {
        let dir = tempfile::Builder::new()
            .prefix("outboxd-registry-tls-")
            .tempdir()
            .unwrap();
        let d = dir.path();
        openssl(
            d,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=outboxd test registry CA",
            ],
        );
        openssl(
            d,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "other-ca.key",
                "-out",
                "other-ca.pem",
                "-days",
                "2",
                "-subj",
                "/CN=another CA",
            ],
        );
        std::fs::write(
            d.join("server.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .unwrap();
        std::fs::write(d.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
        for (name, ca, ext) in [
            ("server", "ca", "server.ext"),
            ("client", "ca", "client.ext"),
            ("stranger", "other-ca", "client.ext"),
        ] {
            openssl(
                d,
                &[
                    "req",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-keyout",
                    &format!("{name}.key"),
                    "-out",
                    &format!("{name}.csr"),
                    "-subj",
                    &format!("/CN={name}"),
                ],
            );
            openssl(
                d,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &format!("{name}.csr"),
                    "-CA",
                    &format!("{ca}.pem"),
                    "-CAkey",
                    &format!("{ca}.key"),
                    "-CAcreateserial",
                    "-out",
                    &format!("{name}.pem"),
                    "-days",
                    "2",
                    "-extfile",
                    ext,
                ],
            );
        }
        TlsFiles { dir }
    }

    /// `<name>.pem` / `<name>.key`: ca, other-ca, server, client, stranger.
    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

pub struct TlsGate {
    url: String,
    stop: Arc<AtomicBool>,
    refused: Arc<AtomicUsize>,
}

impl TlsGate {
    /// Listens on a free loopback port in front of the registry at
    /// `registry_url` (`http://127.0.0.1:PORT/apis/ccompat/v7`), serving
    /// `files`' server certificate and letting through only clients with a
    /// certificate its CA signed.
    pub fn start(registry_url: &str, files: &TlsFiles) -> TlsGate {
        let upstream_url = url::Url::parse(registry_url).unwrap();
        let upstream = SocketAddr::from(([127, 0, 0, 1], upstream_url.port().unwrap()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(files.path("ca.pem")).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .unwrap();
        let chain = CertificateDer::pem_file_iter(files.path("server.pem"))
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(files.path("server.key")).unwrap();
        let config = Arc::new(
            ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_client_cert_verifier(verifier)
                .with_single_cert(chain, key)
                .unwrap(),
        );
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let url = format!("https://127.0.0.1:{port}{}", upstream_url.path());
        let stop = Arc::new(AtomicBool::new(false));
        let refused = Arc::new(AtomicUsize::new(0));
        let (s, r) = (stop.clone(), refused.clone());
        std::thread::spawn(move || {
            while !s.load(SeqCst) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let (config, r) = (config.clone(), r.clone());
                        std::thread::spawn(move || serve(client, config, upstream, &r));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        TlsGate {
            url: url.trim_end_matches('/').to_owned(),
            stop,
            refused,
        }
    }

    /// The registry's https URL through the gate.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Handshakes refused so far.
    pub fn refused(&self) -> usize {
        self.refused.load(SeqCst)
    }
}

impl Drop for TlsGate {
    fn drop(&mut self) {
        self.stop.store(true, SeqCst);
    }
}

fn serve(tcp: TcpStream, config: Arc<ServerConfig>, upstream: SocketAddr, refused: &AtomicUsize) {
    let _ = tcp.set_nonblocking(false);
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(10)));
    let Ok(conn) = ServerConnection::new(config) else {
        return;
    };
    let mut client = StreamOwned::new(conn, tcp);
    // Drives the handshake; a refused certificate ends here, with the alert
    // rustls sends.
    while client.conn.is_handshaking() {
        if client.conn.complete_io(&mut client.sock).is_err() {
            refused.fetch_add(1, SeqCst);
            return;
        }
    }
    let mut request = Vec::new();
    let mut buf = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = request.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        match client.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    };
    let head = String::from_utf8_lossy(&request[..head_end]).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let l = l.to_ascii_lowercase();
            l.strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap_or(0))
        })
        .unwrap_or(0);
    while request.len() < head_end + length {
        match client.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    }
    let forwarded: Vec<&str> = head
        .trim_end()
        .lines()
        .filter(|l| !l.to_ascii_lowercase().starts_with("connection:"))
        .collect();
    let Ok(mut server) = TcpStream::connect(upstream) else {
        return;
    };
    let mut out = format!("{}\r\nConnection: close\r\n\r\n", forwarded.join("\r\n")).into_bytes();
    out.extend_from_slice(&request[head_end..]);
    if server.write_all(&out).is_err() {
        return;
    }
    let mut answer = Vec::new();
    let _ = server.read_to_end(&mut answer);
    let _ = client.write_all(&answer);
    let _ = client.flush();
    client.conn.send_close_notify();
    let _ = client.conn.complete_io(&mut client.sock);
}
