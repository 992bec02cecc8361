//! Startup and authentication of a `replication=database` connection:
//! TCP, optional TLS (SSLRequest, with a client certificate when configured),
//! StartupMessage, then trust, cleartext, MD5 or SCRAM-SHA-256 (-PLUS, bound
//! to the TLS session, as libpq's `channel_binding` asks), until ReadyForQuery.

use std::collections::HashMap;
use std::sync::Arc;

use postgres_protocol::message::backend::Message;
use postgres_protocol::message::frontend;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::auth::{authenticate, TlsBinding};
use super::channel_binding::server_end_point;
use super::error::{ReplicationError, ServerError};
use super::framed::{Frame, FramedConnection, Socket};
use super::tls;
use crate::config::conn_params::{ConnParams, SslMode, TargetSessionAttrs};

/// An authenticated walsender connection, ready for replication commands.
pub struct WalConnection {
    pub(crate) framed: FramedConnection,
    /// ParameterStatus values reported at startup (`server_version`, ...).
    pub server_params: HashMap<String, String>,
}

/// Connects and authenticates, to the first of the URL's hosts that answers
/// (and accepts writes, with `target_session_attrs=read-write`): after a
/// failover the promoted standby is found, as libpq would.
pub async fn connect(params: &ConnParams) -> Result<WalConnection, ReplicationError> {
    let mut last = None;
    for candidate in params.candidates() {
        match connect_one(&candidate).await {
            Ok(conn)
                if params.target_session_attrs == TargetSessionAttrs::ReadWrite
                    && read_only(&conn.server_params) =>
            {
                tracing::debug!(server = %candidate.describe(), "skipping a read-only server (target_session_attrs=read-write)");
                conn.close().await;
                last = Some(ReplicationError::NoPrimary {
                    server: params.describe(),
                });
            }
            Ok(conn) => return Ok(conn),
            Err(e) if params.other_hosts.is_empty() => return Err(e),
            Err(e) => {
                tracing::debug!(server = %candidate.describe(), error = %e, "trying the next host");
                // A read-only answer says more than a later host's refusal.
                if !matches!(last, Some(ReplicationError::NoPrimary { .. })) {
                    last = Some(e);
                }
            }
        }
    }
    Err(last.expect("a URL has at least one host"))
}

/// What libpq looks at for `read-write` on PostgreSQL 14+: both are
/// reported at startup, so no query is needed.
fn read_only(server_params: &HashMap<String, String>) -> bool {
    let on = |name: &str| server_params.get(name).is_some_and(|v| v == "on");
    on("in_hot_standby") || on("default_transaction_read_only")
}

async fn connect_one(params: &ConnParams) -> Result<WalConnection, ReplicationError> {
    let server = params.describe();
    let fut = connect_inner(params, server.clone());
    match params.connect_timeout {
        Some(t) => {
            tokio::time::timeout(t, fut)
                .await
                .map_err(|_| ReplicationError::ConnectTimeout {
                    server,
                    seconds: t.as_secs(),
                })?
        }
        None => fut.await,
    }
}

async fn connect_inner(
    params: &ConnParams,
    server: String,
) -> Result<WalConnection, ReplicationError> {
    let io_err = |source| ReplicationError::Io {
        server: server.clone(),
        source,
    };
    let tcp = TcpStream::connect((params.host.as_str(), params.port))
        .await
        .map_err(io_err)?;
    tcp.set_nodelay(true).map_err(io_err)?;
    tune_socket(&tcp, params).map_err(io_err)?;
    let (socket, binding) = negotiate_tls(tcp, params, &server).await?;
    let framed = FramedConnection::new(socket, server);
    log_in(framed, params, &binding)
        .await
        .map_err(|e| refused_certificate(e, params))
}

/// A server's refusal of the client certificate arrives after the TLS 1.3
/// handshake, at the first read: a setting to fix, not a network problem.
fn refused_certificate(e: ReplicationError, params: &ConnParams) -> ReplicationError {
    match e {
        ReplicationError::Io { server, source } => match tls::certificate_problem(&source) {
            Some(problem) => ReplicationError::Tls {
                server,
                reason: format!("{problem} (sslmode={})", params.sslmode),
            },
            None => ReplicationError::Io { server, source },
        },
        other => other,
    }
}

async fn log_in(
    mut framed: FramedConnection,
    params: &ConnParams,
    binding: &TlsBinding,
) -> Result<WalConnection, ReplicationError> {
    let startup = [
        ("user", params.user.as_str()),
        ("database", params.dbname.as_str()),
        ("replication", "database"),
        ("application_name", params.application_name.as_str()),
        ("client_encoding", "UTF8"),
    ];
    frontend::startup_message(startup.iter().copied(), &mut framed.write_buf)
        .map_err(|e| framed.protocol_err(e.to_string()))?;
    framed.flush().await?;
    authenticate(&mut framed, params, binding).await?;

    let mut server_params = HashMap::new();
    loop {
        match framed.read_frame().await? {
            Frame::Other(Message::ParameterStatus(body)) => {
                let name = body.name().unwrap_or_default().to_string();
                let value = body.value().unwrap_or_default().to_string();
                server_params.insert(name, value);
            }
            Frame::Other(Message::BackendKeyData(_)) | Frame::Other(Message::NoticeResponse(_)) => {
            }
            Frame::Other(Message::ReadyForQuery(_)) => break,
            Frame::Other(Message::ErrorResponse(body)) => {
                return Err(framed.server_err(ServerError::from_body(&body)));
            }
            _ => return Err(framed.protocol_err("unexpected message before ReadyForQuery")),
        }
    }
    Ok(WalConnection {
        framed,
        server_params,
    })
}

/// Keepalives and `TCP_USER_TIMEOUT`, as tokio-postgres sets them on the SQL
/// connection: a peer that vanishes without a reset is noticed in seconds,
/// not after the kernel's hours of keepalive idle or minutes of retransmits.
pub(crate) fn tune_socket(tcp: &TcpStream, params: &ConnParams) -> std::io::Result<()> {
    let socket = socket2::SockRef::from(tcp);
    let k = &params.keepalive;
    if k.enabled {
        let keepalive = socket2::TcpKeepalive::new()
            .with_time(k.idle)
            .with_interval(k.interval)
            .with_retries(k.count);
        socket.set_tcp_keepalive(&keepalive)?;
    }
    #[cfg(target_os = "linux")]
    socket.set_tcp_user_timeout(params.tcp_user_timeout)?;
    Ok(())
}

async fn negotiate_tls(
    mut tcp: TcpStream,
    params: &ConnParams,
    server: &str,
) -> Result<(Box<dyn Socket>, TlsBinding), ReplicationError> {
    let Some(config) = tls::client_config(params)? else {
        return Ok((Box::new(tcp), TlsBinding::Plain));
    };
    let io_err = |source| ReplicationError::Io {
        server: server.to_string(),
        source,
    };
    let mut buf = bytes::BytesMut::new();
    frontend::ssl_request(&mut buf);
    tcp.write_all(&buf).await.map_err(io_err)?;
    let answer = tcp.read_u8().await.map_err(io_err)?;
    match answer {
        b'S' => {}
        b'N' if params.sslmode == SslMode::Prefer => return Ok((Box::new(tcp), TlsBinding::Plain)),
        b'N' => {
            return Err(ReplicationError::Tls {
                server: server.to_string(),
                reason: format!(
                    "the server does not accept TLS but postgres.url asks for sslmode={}; enable ssl on the server or lower sslmode",
                    params.sslmode
                ),
            })
        }
        other => {
            return Err(ReplicationError::Protocol {
                server: server.to_string(),
                reason: format!("unexpected answer {other:#x} to SSLRequest"),
            })
        }
    }
    let name = tls::server_name(&params.host)?;
    let connector = tokio_rustls::TlsConnector::from(Arc::clone(&config));
    let stream = connector.connect(name, tcp).await.map_err(|e| {
        match tls::certificate_problem(&e) {
            // Verification failed: a setting to fix, not a network problem.
            Some(problem) => ReplicationError::Tls {
                server: server.to_string(),
                reason: format!(
                    "{problem} (sslmode={}, sslrootcert={:?})",
                    params.sslmode, params.sslrootcert
                ),
            },
            // Any other TLS failure (no common version or cipher, an alert
            // from the server) is no network problem either.
            None if e.get_ref().is_some_and(|inner| inner.is::<rustls::Error>()) => {
                ReplicationError::Tls {
                    server: server.to_string(),
                    reason: format!("{e} (sslmode={})", params.sslmode),
                }
            }
            None => io_err(e),
        }
    })?;
    let binding = match stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
    {
        Some(cert) => match server_end_point(cert) {
            Ok(hash) => TlsBinding::EndPoint(hash),
            Err(e) => TlsBinding::Unavailable(e.to_string()),
        },
        None => TlsBinding::Unavailable("the server sent no certificate".into()),
    };
    Ok((Box::new(stream), binding))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_write_skips_what_libpq_skips() {
        let params = |pairs: &[(&str, &str)]| -> HashMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert!(!read_only(&params(&[
            ("in_hot_standby", "off"),
            ("default_transaction_read_only", "off")
        ])));
        assert!(read_only(&params(&[("in_hot_standby", "on")])));
        assert!(read_only(&params(&[(
            "default_transaction_read_only",
            "on"
        )])));
        assert!(!read_only(&params(&[])));
    }

    #[tokio::test]
    async fn socket_gets_keepalives_and_user_timeout() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tcp = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let params = ConnParams::from_url(
            "postgresql://u@h/db?keepalives_idle=7&keepalives_interval=3&keepalives_count=4&tcp_user_timeout=12000",
        )
        .unwrap();
        tune_socket(&tcp, &params).unwrap();
        let s = socket2::SockRef::from(&tcp);
        assert!(s.keepalive().unwrap());
        assert_eq!(
            s.tcp_keepalive_time().unwrap(),
            std::time::Duration::from_secs(7)
        );
        assert_eq!(
            s.tcp_keepalive_interval().unwrap(),
            std::time::Duration::from_secs(3)
        );
        assert_eq!(s.tcp_keepalive_retries().unwrap(), 4);
        #[cfg(target_os = "linux")]
        assert_eq!(
            s.tcp_user_timeout().unwrap(),
            Some(std::time::Duration::from_secs(12))
        );
    }
}
