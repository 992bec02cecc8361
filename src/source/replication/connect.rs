//! Startup and authentication of a `replication=database` connection:
//! TCP, optional TLS (SSLRequest), StartupMessage, then trust, cleartext, MD5
//! or SCRAM-SHA-256, until ReadyForQuery.

use std::collections::HashMap;
use std::sync::Arc;

use postgres_protocol::authentication::md5_hash;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256, SCRAM_SHA_256};
use postgres_protocol::message::backend::Message;
use postgres_protocol::message::frontend;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_postgres::error::SqlState;

use super::error::{ReplicationError, ServerError};
use super::framed::{Frame, FramedConnection, Socket};
use super::tls;
use crate::config::conn_params::{ConnParams, SslMode, TargetSessionAttrs};

/// Refusals of the login itself: a wrong password, or pg_hba.conf.
const AUTH_SQLSTATES: [SqlState; 2] = [
    SqlState::INVALID_PASSWORD,
    SqlState::INVALID_AUTHORIZATION_SPECIFICATION,
];

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
    let socket = negotiate_tls(tcp, params, &server).await?;
    let mut framed = FramedConnection::new(socket, server);

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
    authenticate(&mut framed, params).await?;

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
) -> Result<Box<dyn Socket>, ReplicationError> {
    let Some(config) = tls::client_config(params)? else {
        return Ok(Box::new(tcp));
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
        b'N' if params.sslmode == SslMode::Prefer => return Ok(Box::new(tcp)),
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
    Ok(Box::new(stream))
}

async fn authenticate(
    framed: &mut FramedConnection,
    params: &ConnParams,
) -> Result<(), ReplicationError> {
    let auth_err = |reason: String| ReplicationError::Auth {
        user: params.user.clone(),
        server: format!("{}:{}", params.host, params.port),
        reason,
    };
    let password = || {
        params.password.as_deref().ok_or_else(|| {
            auth_err(
                "the server requires a password and none is configured: put it in postgres.url, \
                 or name it with postgres.password_env or postgres.password_file"
                    .into(),
            )
        })
    };
    let mut scram: Option<ScramSha256> = None;
    loop {
        let msg = match framed.read_frame().await? {
            Frame::Other(msg) => msg,
            _ => return Err(framed.protocol_err("unexpected copy frame during authentication")),
        };
        match msg {
            Message::AuthenticationOk => return Ok(()),
            Message::AuthenticationCleartextPassword => {
                frontend::password_message(password()?.as_bytes(), &mut framed.write_buf)
                    .map_err(|e| framed.protocol_err(e.to_string()))?;
            }
            Message::AuthenticationMd5Password(body) => {
                let hash = md5_hash(params.user.as_bytes(), password()?.as_bytes(), body.salt());
                frontend::password_message(hash.as_bytes(), &mut framed.write_buf)
                    .map_err(|e| framed.protocol_err(e.to_string()))?;
            }
            Message::AuthenticationSasl(body) => {
                let mut offers_scram = false;
                let mut mechanisms = body.mechanisms();
                while let Ok(Some(m)) = fallible_iterator::FallibleIterator::next(&mut mechanisms) {
                    offers_scram |= m == SCRAM_SHA_256;
                }
                if !offers_scram {
                    return Err(auth_err("the server offers no SASL mechanism outboxd supports (SCRAM-SHA-256)".into()));
                }
                // Channel binding is optional in PostgreSQL; without it the
                // exchange is still mutually authenticated by SCRAM itself.
                let s = ScramSha256::new(password()?.as_bytes(), ChannelBinding::unsupported());
                frontend::sasl_initial_response(SCRAM_SHA_256, s.message(), &mut framed.write_buf)
                    .map_err(|e| framed.protocol_err(e.to_string()))?;
                scram = Some(s);
            }
            Message::AuthenticationSaslContinue(body) => {
                let s = scram.as_mut().ok_or_else(|| framed.protocol_err("SASL continue without start"))?;
                s.update(body.data()).map_err(|e| auth_err(format!("SCRAM exchange failed: {e}")))?;
                frontend::sasl_response(s.message(), &mut framed.write_buf)
                    .map_err(|e| framed.protocol_err(e.to_string()))?;
            }
            Message::AuthenticationSaslFinal(body) => {
                let mut s = scram.take().ok_or_else(|| framed.protocol_err("SASL final without start"))?;
                s.finish(body.data())
                    .map_err(|e| auth_err(format!("the server's SCRAM signature is invalid: {e}")))?;
                continue;
            }
            Message::ErrorResponse(body) => {
                let error = ServerError::from_body(&body);
                return Err(if AUTH_SQLSTATES.contains(&error.sqlstate()) {
                    auth_err(error.to_string())
                } else {
                    framed.server_err(error)
                });
            }
            Message::NoticeResponse(_) => continue,
            _ => return Err(auth_err("the server asked for an authentication method outboxd does not support (use scram-sha-256, md5, password or trust)".into())),
        }
        framed.flush().await?;
    }
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
