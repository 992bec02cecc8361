//! The ordinary SQL connection (tokio-postgres), configured from the same
//! [`ConnParams`] and TLS settings as the walsender connection.

use tokio_postgres::config::{ChannelBinding as PgChannelBinding, SslMode as PgSslMode};
use tokio_postgres::{Client, NoTls};

use super::error::AdminError;
use super::sql_tls::MakeRustlsConnect;
use crate::config::conn_params::{ChannelBinding, TargetSessionAttrs};
use crate::source::replication::tls;
use crate::source::replication::{ConnParams, SslMode};

/// Connects and spawns the connection task; the task ends when the client is
/// dropped. `connect_timeout` bounds the whole startup of each host, not
/// only the TCP connect as in tokio-postgres: a server (or a link) that
/// accepts and then says nothing must not hang the caller.
///
/// The URL's hosts are tried in order, and with
/// `target_session_attrs=read-write` a server in recovery is skipped: the
/// same choice [`crate::source::replication::connect`] makes, so both
/// connections land on the primary.
pub async fn connect_sql(params: &ConnParams) -> Result<Client, AdminError> {
    let mut last = None;
    for candidate in params.candidates() {
        match connect_one(&candidate).await {
            Ok(client) if params.target_session_attrs == TargetSessionAttrs::ReadWrite => {
                match read_only(&client).await {
                    Ok(false) => return Ok(client),
                    Ok(true) => {
                        tracing::debug!(server = %candidate.describe(), "skipping a read-only server (target_session_attrs=read-write)");
                        last = Some(AdminError::NoPrimary {
                            server: params.describe(),
                        });
                    }
                    Err(e) => last = Some(e),
                }
            }
            Ok(client) => return Ok(client),
            Err(e) if params.other_hosts.is_empty() => return Err(e),
            Err(e) => {
                tracing::debug!(server = %candidate.describe(), error = %e, "trying the next host");
                // A read-only answer says more than a later host's refusal.
                if !matches!(last, Some(AdminError::NoPrimary { .. })) {
                    last = Some(e);
                }
            }
        }
    }
    Err(last.expect("a URL has at least one host"))
}

/// libpq's test for `read-write`.
async fn read_only(client: &Client) -> Result<bool, AdminError> {
    let row = client
        .query_one(
            "SELECT pg_is_in_recovery() OR current_setting('transaction_read_only') = 'on'",
            &[],
        )
        .await
        .map_err(|source| AdminError::Sql {
            context: "asking whether the server accepts writes",
            source,
        })?;
    Ok(row.get(0))
}

async fn connect_one(params: &ConnParams) -> Result<Client, AdminError> {
    match params.connect_timeout {
        Some(t) => tokio::time::timeout(t, connect_sql_inner(params))
            .await
            .map_err(|_| AdminError::ConnectTimeout {
                server: params.describe(),
                seconds: t.as_secs(),
            })?,
        None => connect_sql_inner(params).await,
    }
}

async fn connect_sql_inner(params: &ConnParams) -> Result<Client, AdminError> {
    let mut cfg = tokio_postgres::Config::new();
    cfg.host(&params.host)
        .port(params.port)
        .user(&params.user)
        .dbname(&params.dbname)
        .application_name(format!("{}-sql", params.application_name));
    // Read at every connect: a rotated password_file is used from the next
    // reconnect on.
    if let Some(pw) = params
        .current_password()
        .map_err(|e| AdminError::PasswordFile(e.to_string()))?
    {
        cfg.password(pw);
    }
    cfg.channel_binding(match params.channel_binding {
        ChannelBinding::Disable => PgChannelBinding::Disable,
        ChannelBinding::Prefer => PgChannelBinding::Prefer,
        ChannelBinding::Require => PgChannelBinding::Require,
    });
    if let Some(t) = params.connect_timeout {
        cfg.connect_timeout(t);
    }
    cfg.ssl_mode(match params.sslmode {
        SslMode::Disable => PgSslMode::Disable,
        SslMode::Prefer => PgSslMode::Prefer,
        SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => PgSslMode::Require,
    });
    let keepalive = &params.keepalive;
    cfg.keepalives(keepalive.enabled)
        .keepalives_idle(keepalive.idle)
        .keepalives_interval(keepalive.interval)
        .keepalives_retries(keepalive.count);
    if let Some(t) = params.tcp_user_timeout {
        cfg.tcp_user_timeout(t);
    }
    let connect_err = |error: tokio_postgres::Error| {
        // tokio-postgres says only "server did not use channel binding".
        if params.channel_binding == ChannelBinding::Require
            && error.as_db_error().is_none()
            && std::error::Error::source(&error)
                .is_some_and(|cause| cause.to_string().contains("channel binding"))
        {
            return AdminError::ChannelBindingRefused {
                server: params.describe(),
            };
        }
        AdminError::Connect {
            server: params.describe(),
            error,
        }
    };
    let client = match tls::client_config(params)? {
        None => {
            let (client, conn) = cfg.connect(NoTls).await.map_err(connect_err)?;
            tokio::spawn(conn);
            client
        }
        Some(config) => {
            let tls = MakeRustlsConnect::new(config);
            let (client, conn) = cfg.connect(tls).await.map_err(connect_err)?;
            tokio::spawn(conn);
            client
        }
    };
    Ok(client)
}
