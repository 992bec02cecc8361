//! The ordinary SQL connection (tokio-postgres), configured from the same
//! [`ConnParams`] and TLS settings as the walsender connection.

use tokio_postgres::config::SslMode as PgSslMode;
use tokio_postgres::{Client, NoTls};

use super::AdminError;
use crate::source::replication::tls;
use crate::source::replication::{ConnParams, SslMode};

/// Connects and spawns the connection task; the task ends when the client is
/// dropped. `connect_timeout` bounds the whole startup, not only the TCP
/// connect as in tokio-postgres: a server (or a link) that accepts and then
/// says nothing must not hang the caller.
pub async fn connect_sql(params: &ConnParams) -> Result<Client, AdminError> {
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
    if let Some(pw) = &params.password {
        cfg.password(pw);
    }
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
    let connect_err = |error| AdminError::Connect {
        server: params.describe(),
        error,
    };
    let client = match tls::client_config(params)? {
        None => {
            let (client, conn) = cfg.connect(NoTls).await.map_err(connect_err)?;
            tokio::spawn(conn);
            client
        }
        Some(config) => {
            let tls = tokio_postgres_rustls::MakeRustlsConnect::new((*config).clone());
            let (client, conn) = cfg.connect(tls).await.map_err(connect_err)?;
            tokio::spawn(conn);
            client
        }
    };
    Ok(client)
}
