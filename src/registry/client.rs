//! One request to the registry: a fresh HTTP/1.1 connection per request
//! (plain or rustls, with a client certificate for mutual TLS: `tls`),
//! basic auth, a timeout, and each configured URL in turn until one
//! answers. Requests are rare (at start and on a cache miss), so there is
//! no pool to keep healthy.

use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE as CONTENT_TYPE_HEADER, HOST, USER_AGENT};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::config::SchemaRegistryConfig;
use crate::registry::error::RegistryError;
use crate::registry::tls::{tls_connector, tls_failure};

/// What Confluent's clients send and the registries answer with.
const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json, application/json";
/// The type of a request body (a schema to register).
const BODY_TYPE: &str = "application/vnd.schemaregistry.v1+json";

/// Why one URL did not answer.
pub(super) enum Failure {
    /// Cannot connect, or the connection broke: the next URL, or later.
    Unreachable(String),
    /// TLS refused by one side for a reason a retry does not fix; names the
    /// setting to look at.
    Tls { key: &'static str, reason: String },
}

impl From<String> for Failure {
    fn from(reason: String) -> Failure {
        Failure::Unreachable(reason)
    }
}

impl From<&str> for Failure {
    fn from(reason: &str) -> Failure {
        Failure::Unreachable(reason.to_owned())
    }
}

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
    /// `cert_file`/`key_file` are set: what a refused handshake means.
    client_cert: bool,
    timeout: Duration,
}

impl HttpClient {
    pub(crate) fn new(config: &SchemaRegistryConfig) -> Result<HttpClient, RegistryError> {
        let urls = config
            .urls()
            .into_iter()
            .map(|u| {
                url::Url::parse(u).map_err(|e| RegistryError::Config {
                    key: "schema_registry.url".into(),
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
            Some(path) => Some(tls_connector(
                path,
                config.cert_file.as_deref().zip(config.key_file.as_deref()),
            )?),
            None => None,
        };
        Ok(HttpClient {
            urls,
            authorization,
            tls,
            client_cert: config.cert_file.is_some(),
            timeout: config.request_timeout,
        })
    }

    /// `GET <base>/<path>` (path already percent-encoded), trying each base
    /// URL in turn while they cannot be reached or answer 5xx. The last
    /// failure is returned when none answers.
    pub(crate) async fn get(&self, path: &str) -> Result<Answer, RegistryError> {
        self.request(Method::GET, path, None).await
    }

    /// `POST <base>/<path>` with a JSON body, tried like [`HttpClient::get`].
    pub(crate) async fn post(&self, path: &str, body: Bytes) -> Result<Answer, RegistryError> {
        self.request(Method::POST, path, Some(body)).await
    }

    async fn request(
        &self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
    ) -> Result<Answer, RegistryError> {
        let mut last = None;
        for base in &self.urls {
            let full = format!("{}{path}", base.as_str().trim_end_matches('/'));
            let one = self.request_one(method.clone(), &full, body.clone());
            match tokio::time::timeout(self.timeout, one).await {
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
                Ok(Err(Failure::Unreachable(reason))) => {
                    last = Some(RegistryError::Unavailable {
                        url: base.to_string(),
                        reason,
                    })
                }
                // The same certificates go to every URL: another one would
                // refuse them too.
                Ok(Err(Failure::Tls { key, reason })) => {
                    return Err(RegistryError::Tls {
                        url: base.to_string(),
                        key,
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

    async fn request_one(
        &self,
        method: Method,
        full: &str,
        body: Option<Bytes>,
    ) -> Result<Answer, Failure> {
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
        let mut request = Request::builder()
            .method(method)
            .uri(&url[url::Position::BeforePath..])
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
        if body.is_some() {
            request = request.header(CONTENT_TYPE_HEADER, BODY_TYPE);
        }
        let request = request
            .body(Full::new(body.unwrap_or_default()))
            .map_err(|e| e.to_string())?;
        match url.scheme() {
            "https" => {
                let tls = self
                    .tls
                    .as_ref()
                    .ok_or("https needs schema_registry.ca_file")?;
                let name = ServerName::try_from(bare).map_err(|e| e.to_string())?;
                let stream = tls.connect(name, tcp).await.map_err(|e| {
                    tls_failure(&e, format!("TLS with {host}:{port}"), self.client_cert)
                })?;
                // With TLS 1.3 a refused client certificate shows only when
                // the answer is read.
                send(TokioIo::new(stream), request).await.map_err(|e| {
                    tls_failure(
                        &*e,
                        format!("request to {host}:{port} over TLS"),
                        self.client_cert,
                    )
                })
            }
            _ => send(TokioIo::new(tcp), request)
                .await
                .map_err(|e| Failure::Unreachable(e.to_string())),
        }
        .map(|(status, body)| Answer {
            status,
            body,
            url: String::new(),
        })
    }
}

type SendError = Box<dyn std::error::Error + Send + Sync>;

async fn send<T>(io: T, request: Request<Full<Bytes>>) -> Result<(StatusCode, Bytes), SendError>
where
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(io).await?;
    // The connection is driven until the answer is read, then dropped; also
    // when the request times out (this future dropped), or a registry that
    // never answers would keep a task per request.
    let driver = AbortOnDrop(tokio::spawn(connection));
    let result = async {
        let response = sender.send_request(request).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
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
