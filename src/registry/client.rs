//! One GET to the registry: a fresh HTTP/1.1 connection per request (plain
//! or rustls), basic auth, a timeout, and each configured URL in turn until
//! one answers. Requests are rare (at start and on a cache miss), so there is
//! no pool to keep healthy.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::header::{ACCEPT, AUTHORIZATION, HOST, USER_AGENT};
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::config::SchemaRegistryConfig;
use crate::registry::error::RegistryError;

/// What Confluent's clients send and the registries answer with.
const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json, application/json";

/// A registry's answer: status and body.
pub(crate) struct Answer {
    pub status: StatusCode,
    pub body: Bytes,
    /// The base URL that answered.
    pub url: String,
}

pub(crate) struct HttpClient {
    urls: Vec<url::Url>,
    /// `Basic …`; never logged.
    authorization: Option<String>,
    tls: Option<TlsConnector>,
    timeout: Duration,
}

impl HttpClient {
    pub(crate) fn new(config: &SchemaRegistryConfig) -> Result<HttpClient, RegistryError> {
        let urls = config
            .urls()
            .into_iter()
            .map(|u| {
                url::Url::parse(u).map_err(|e| RegistryError::Config {
                    key: "schema_registry.url",
                    reason: format!("`{u}` is not a URL: {e}"),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let authorization = match (&config.username, &config.password) {
            (Some(u), Some(p)) => Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{u}:{p}"))
            )),
            _ => None,
        };
        let tls = match &config.ca_file {
            Some(path) => Some(tls_connector(path)?),
            None => None,
        };
        Ok(HttpClient {
            urls,
            authorization,
            tls,
            timeout: config.request_timeout,
        })
    }

    /// `GET <base>/<path>` (path already percent-encoded), trying each base
    /// URL in turn while they cannot be reached or answer 5xx. The last
    /// failure is returned when none answers.
    pub(crate) async fn get(&self, path: &str) -> Result<Answer, RegistryError> {
        let mut last = None;
        for base in &self.urls {
            let full = format!("{}{path}", base.as_str().trim_end_matches('/'));
            match tokio::time::timeout(self.timeout, self.get_one(&full)).await {
                Ok(Ok(answer)) if !answer.status.is_server_error() => {
                    return Ok(Answer {
                        url: base.to_string(),
                        ..answer
                    })
                }
                Ok(Ok(answer)) => {
                    last = Some(RegistryError::Unavailable {
                        url: base.to_string(),
                        reason: format!(
                            "answered {}: {}",
                            answer.status,
                            String::from_utf8_lossy(&answer.body[..answer.body.len().min(200)])
                        ),
                    })
                }
                Ok(Err(reason)) => {
                    last = Some(RegistryError::Unavailable {
                        url: base.to_string(),
                        reason,
                    })
                }
                Err(_) => {
                    last = Some(RegistryError::Unavailable {
                        url: base.to_string(),
                        reason: format!(
                            "no answer within {:?} (schema_registry.request_timeout)",
                            self.timeout
                        ),
                    })
                }
            }
        }
        Err(last.expect("schema_registry.url names at least one URL"))
    }

    async fn get_one(&self, full: &str) -> Result<Answer, String> {
        let url = url::Url::parse(full).map_err(|e| e.to_string())?;
        let host = url.host_str().ok_or("the URL has no host")?.to_owned();
        // An IPv6 literal comes bracketed; connecting and TLS want it bare.
        let bare = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = url.port_or_known_default().ok_or("the URL has no port")?;
        let tcp = TcpStream::connect((bare.as_str(), port))
            .await
            .map_err(|e| format!("cannot connect to {host}:{port}: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let mut request = Request::get(&url[url::Position::BeforePath..])
            .header(
                HOST,
                match url.port() {
                    Some(p) => format!("{host}:{p}"),
                    None => host.clone(),
                },
            )
            .header(ACCEPT, CONTENT_TYPE)
            .header(USER_AGENT, concat!("outboxd/", env!("CARGO_PKG_VERSION")));
        if let Some(a) = &self.authorization {
            request = request.header(AUTHORIZATION, a);
        }
        let request = request
            .body(Empty::<Bytes>::new())
            .map_err(|e| e.to_string())?;
        match url.scheme() {
            "https" => {
                let tls = self
                    .tls
                    .as_ref()
                    .ok_or("https needs schema_registry.ca_file")?;
                let name = ServerName::try_from(bare).map_err(|e| e.to_string())?;
                let stream = tls
                    .connect(name, tcp)
                    .await
                    .map_err(|e| format!("TLS with {host}:{port}: {e}"))?;
                send(TokioIo::new(stream), request).await
            }
            _ => send(TokioIo::new(tcp), request).await,
        }
        .map(|(status, body)| Answer {
            status,
            body,
            url: String::new(),
        })
    }
}

async fn send<T>(io: T, request: Request<Empty<Bytes>>) -> Result<(StatusCode, Bytes), String>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| e.to_string())?;
    // The connection is driven until the answer is read, then dropped; also
    // when the request times out (this future dropped), or a registry that
    // never answers would keep a task per request.
    let driver = AbortOnDrop(tokio::spawn(connection));
    let result = async {
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, body))
    }
    .await;
    drop(driver);
    result
}

/// Aborts the task when dropped.
struct AbortOnDrop<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for AbortOnDrop<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn tls_connector(path: &std::path::Path) -> Result<TlsConnector, RegistryError> {
    let err = |reason: String| RegistryError::Config {
        key: "schema_registry.ca_file",
        reason: format!("{}: {reason}", path.display()),
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| err(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| err(e.to_string()))?;
    if certs.is_empty() {
        return Err(err("no PEM certificates in the file".into()));
    }
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots.add(cert).map_err(|e| err(e.to_string()))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| err(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}
