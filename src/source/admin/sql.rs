//! The ordinary SQL connection (tokio-postgres), configured from the same
//! [`ConnParams`] and TLS settings as the walsender connection.

use tokio_postgres::config::SslMode as PgSslMode;
use tokio_postgres::{Client, NoTls};

use super::AdminError;
use crate::source::replication::tls;
use crate::source::replication::{ConnParams, SslMode};

/// Connects and spawns the connection task; the task ends when the client is
/// dropped.
pub async fn connect_sql(params: &ConnParams) -> Result<Client, AdminError> {
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
