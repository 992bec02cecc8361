//! Errors of the walsender connection, split by what the caller should do:
//! retry (reconnect and resume from the slot) or stop and tell the user.

use postgres_protocol::message::backend::ErrorResponseBody;

use super::tls::TlsConfigError;

/// A server ErrorResponse, with the fields worth showing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerError {
    pub severity: String,
    /// SQLSTATE, e.g. `55000` for an invalidated slot.
    pub code: String,
    pub message: String,
    pub detail: Option<String>,
    pub hint: Option<String>,
}

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} (SQLSTATE {})",
            self.severity, self.message, self.code
        )?;
        if let Some(d) = &self.detail {
            write!(f, "; detail: {d}")?;
        }
        if let Some(h) = &self.hint {
            write!(f, "; hint: {h}")?;
        }
        Ok(())
    }
}

impl ServerError {
    pub(crate) fn from_body(body: &ErrorResponseBody) -> ServerError {
        use fallible_iterator::FallibleIterator;
        let mut e = ServerError {
            severity: "ERROR".into(),
            code: String::new(),
            message: String::new(),
            detail: None,
            hint: None,
        };
        let mut fields = body.fields();
        while let Ok(Some(field)) = fields.next() {
            let value = String::from_utf8_lossy(field.value_bytes()).into_owned();
            match field.type_() {
                b'V' => e.severity = value,
                b'C' => e.code = value,
                b'M' => e.message = value,
                b'D' => e.detail = Some(value),
                b'H' => e.hint = Some(value),
                _ => {}
            }
        }
        e
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReplicationError {
    #[error("connection to {server} failed: {source}")]
    Io {
        server: String,
        #[source]
        source: std::io::Error,
    },
    #[error("connecting to {server} timed out after {seconds}s (postgres.connect_timeout)")]
    ConnectTimeout { server: String, seconds: u64 },
    #[error(transparent)]
    TlsConfig(#[from] TlsConfigError),
    #[error("TLS with {server} failed: {reason}")]
    Tls { server: String, reason: String },
    #[error("authentication of user {user:?} at {server} failed: {reason}")]
    Auth {
        user: String,
        server: String,
        reason: String,
    },
    #[error("{server}: {error}")]
    Server {
        server: String,
        error: Box<ServerError>,
    },
    #[error("protocol error from {server}: {reason}")]
    Protocol { server: String, reason: String },
    #[error("{server} closed the replication connection")]
    Closed { server: String },
}

impl ReplicationError {
    /// Worth reconnecting for: the network or the server went away, as
    /// opposed to configuration the user must fix.
    pub fn is_retryable(&self) -> bool {
        match self {
            ReplicationError::Io { .. }
            | ReplicationError::ConnectTimeout { .. }
            | ReplicationError::Closed { .. } => true,
            // 57P01 admin shutdown, 57P02 crash shutdown, 57P03 cannot connect now, 53300 too many connections
            ReplicationError::Server { error, .. } => {
                matches!(
                    error.code.as_str(),
                    "57P01" | "57P02" | "57P03" | "53300" | "08006" | "08003"
                )
            }
            _ => false,
        }
    }

    pub fn sqlstate(&self) -> Option<&str> {
        match self {
            ReplicationError::Server { error, .. } => Some(&error.code),
            _ => None,
        }
    }
}
