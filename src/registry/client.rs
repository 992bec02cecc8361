//! One request to the registry: a fresh HTTP/1.1 connection per request
//! (plain or rustls, with a client certificate for mutual TLS), basic auth,
//! a timeout, and each configured URL in turn until one answers. Requests are rare (at start and on a cache miss), so there is
//! no pool to keep healthy.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE as CONTENT_TYPE_HEADER, HOST, USER_AGENT};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{AlertDescription, ClientConfig, RootCertStore};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::config::SchemaRegistryConfig;
use crate::registry::error::RegistryError;

/// What Confluent's clients send and the registries answer with.
const CONTENT_TYPE: &str = "application/vnd.schemaregistry.v1+json, application/json";
/// The type of a request body (a schema to register).
const BODY_TYPE: &str = "application/vnd.schemaregistry.v1+json";

/// Why one URL did not answer.
enum Failure {
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

/// A TLS error named by the setting that fixes it: the registry's
/// certificate not signed by the CA of `ca_file`, or the registry refusing
/// the client certificate (or its absence); anything else is a connection
/// that may work later.
fn tls_failure(
    error: &(dyn std::error::Error + 'static),
    what: String,
    client_cert: bool,
) -> Failure {
    let reason = format!("{what}: {error}");
    match find_rustls_error(error) {
        Some(rustls::Error::InvalidCertificate(e)) => Failure::Tls {
            key: "schema_registry.ca_file",
            reason: format!(
                "the registry's certificate is not trusted ({e:?}): schema_registry.ca_file must \
                 hold the CA that signed it, for the host name in schema_registry.url"
            ),
        },
        Some(rustls::Error::AlertReceived(alert))
            if refuses_client_certificate(*alert) && client_cert =>
        {
            Failure::Tls {
                key: "schema_registry.cert_file",
                reason: format!(
                    "the registry refused the client certificate (TLS alert {alert:?}): \
                     schema_registry.cert_file and schema_registry.key_file must name a \
                     certificate the registry's trusted CA signed, and its key"
                ),
            }
        }
        Some(rustls::Error::AlertReceived(alert)) if refuses_client_certificate(*alert) => {
            Failure::Tls {
                key: "schema_registry.cert_file",
                reason: format!(
                    "the registry wants a client certificate (TLS alert {alert:?}): set \
                     schema_registry.cert_file and schema_registry.key_file to the PEM files of \
                     a certificate its trusted CA signed and of its key"
                ),
            }
        }
        _ => Failure::Unreachable(reason),
    }
}

/// The alerts a server sends about the client's certificate.
fn refuses_client_certificate(alert: AlertDescription) -> bool {
    matches!(
        alert,
        AlertDescription::CertificateRequired
            | AlertDescription::BadCertificate
            | AlertDescription::UnsupportedCertificate
            | AlertDescription::CertificateRevoked
            | AlertDescription::CertificateExpired
            | AlertDescription::CertificateUnknown
            | AlertDescription::UnknownCA
            | AlertDescription::AccessDenied
    )
}

/// The rustls error under hyper's and tokio-rustls' wrapping. An
/// `io::Error`'s `source()` skips the error it wraps, so that is looked
/// into too.
fn find_rustls_error<'a>(
    mut error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a rustls::Error> {
    loop {
        if let Some(e) = error.downcast_ref::<rustls::Error>() {
            return Some(e);
        }
        if let Some(inner) = error
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            if let Some(e) = find_rustls_error(inner) {
                return Some(e);
            }
        }
        error = error.source()?;
    }
}

/// The TLS settings: the CAs of `ca_file`, and the client certificate and
/// key of `cert_file`/`key_file` when set. Errors never quote the key.
fn tls_connector(
    ca_file: &Path,
    client: Option<(&Path, &Path)>,
) -> Result<TlsConnector, RegistryError> {
    let err = |key: &'static str, path: &Path, reason: String| RegistryError::Config {
        key,
        reason: format!("{}: {reason}", path.display()),
    };
    let certs = read_certs(ca_file).map_err(|r| err("schema_registry.ca_file", ca_file, r))?;
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| err("schema_registry.ca_file", ca_file, e.to_string()))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| err("schema_registry.ca_file", ca_file, e.to_string()))?
        .with_root_certificates(roots);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some((cert_file, key_file)) => {
            let chain = read_certs(cert_file)
                .map_err(|r| err("schema_registry.cert_file", cert_file, r))?;
            // The parser's errors say what is wrong with the file, not
            // what is in it.
            let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| {
                err(
                    "schema_registry.key_file",
                    key_file,
                    format!("no readable PEM private key (PKCS#8, PKCS#1 or SEC1): {e}"),
                )
            })?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                err(
                    "schema_registry.key_file",
                    key_file,
                    format!("does not fit schema_registry.cert_file: {e}"),
                )
            })?
        }
    };
    Ok(TlsConnector::from(Arc::new(config)))
}

/// The PEM certificates of a file, at least one.
fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| e.to_string())?
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    if certs.is_empty() {
        return Err("no PEM certificates in the file".into());
    }
    Ok(certs)
}
