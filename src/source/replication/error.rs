//! Errors of the walsender connection, split by what the caller should do:
//! retry (reconnect and resume from the slot) or stop and tell the user.

use postgres_protocol::message::backend::ErrorResponseBody;
use tokio_postgres::error::{DbError, SqlState};

use super::tls::TlsConfigError;

/// What a failure asks of the relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Disposition {
    /// The network or the server went away: reconnect with backoff, for as
    /// long as it takes.
    Transient,
    /// A setting only a person can fix (credentials, pg_hba.conf, database
    /// name, privileges, TLS trust, slot or publication): a few attempts ride
    /// out a change being rolled out, then the relay stops and says what to fix.
    Permanent,
    /// Retrying cannot help (a stream we cannot read): stop at once.
    Fatal,
}

/// Server errors that a reconnect can cure: shutdowns and restarts, a full
/// server, a dropped connection, and the slot still held by the walsender
/// of a connection that died on our side only (until the server's
/// wal_sender_timeout ends it), as `AdminError::SlotActive` already is.
const TRANSIENT_SQLSTATES: [SqlState; 9] = [
    SqlState::OBJECT_IN_USE,
    SqlState::ADMIN_SHUTDOWN,
    SqlState::CRASH_SHUTDOWN,
    SqlState::CANNOT_CONNECT_NOW,
    SqlState::TOO_MANY_CONNECTIONS,
    SqlState::IDLE_SESSION_TIMEOUT,
    SqlState::CONNECTION_EXCEPTION,
    SqlState::CONNECTION_FAILURE,
    SqlState::CONNECTION_DOES_NOT_EXIST,
];

/// How to react to a server error with SQLSTATE `code`.
pub(crate) fn sqlstate_disposition(code: &SqlState) -> Disposition {
    if TRANSIENT_SQLSTATES.contains(code) {
        Disposition::Transient
    } else if sqlstate_fix(code).is_some() {
        Disposition::Permanent
    } else {
        Disposition::Fatal
    }
}

/// The setting to fix for the permanent connection errors.
pub(crate) fn sqlstate_fix(code: &SqlState) -> Option<&'static str> {
    Some(if *code == SqlState::INVALID_PASSWORD {
        "fix the password: in postgres.url, or in what postgres.password_env or postgres.password_file names"
    } else if *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION {
        "the server's pg_hba.conf refuses this user, database or address: add a matching host line \
         (for the database; logical replication does not use the \"replication\" lines) and reload \
         PostgreSQL, or fix the user in postgres.url"
    } else if *code == SqlState::INVALID_CATALOG_NAME {
        "fix the database name in postgres.url"
    } else if *code == SqlState::INSUFFICIENT_PRIVILEGE {
        "grant the role the privilege the message names (e.g. GRANT CONNECT ON DATABASE, \
         ALTER ROLE ... REPLICATION), or use another user in postgres.url"
    } else {
        return None;
    })
}

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
        if let Some(fix) = sqlstate_fix(&self.sqlstate()) {
            write!(f, "; {fix}")?;
        }
        Ok(())
    }
}

impl ServerError {
    /// The same fields from a tokio-postgres error (the SQL connection).
    pub(crate) fn from_db_error(e: &DbError) -> ServerError {
        ServerError {
            severity: e.severity().to_string(),
            code: e.code().code().to_string(),
            message: e.message().to_string(),
            detail: e.detail().map(str::to_string),
            hint: e.hint().map(str::to_string),
        }
    }

    pub(crate) fn sqlstate(&self) -> SqlState {
        SqlState::from_code(&self.code)
    }

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
    #[error(
        "nothing received from {server} for {seconds}s although outboxd asked for a reply \
         (postgres.stream_timeout): the link is presumed dead"
    )]
    Silent { server: String, seconds: u64 },
    /// Every host answered read-only while postgres.url asks for
    /// `target_session_attrs=read-write`: a failover in progress, typically.
    #[error("no host of {server} accepts writes (target_session_attrs=read-write): waiting for a primary")]
    NoPrimary { server: String },
}

impl ReplicationError {
    /// Worth reconnecting for: the network or the server went away, as
    /// opposed to configuration the user must fix.
    pub fn is_retryable(&self) -> bool {
        self.disposition() == Disposition::Transient
    }

    pub(crate) fn disposition(&self) -> Disposition {
        match self {
            ReplicationError::Io { .. }
            | ReplicationError::ConnectTimeout { .. }
            | ReplicationError::Closed { .. }
            | ReplicationError::Silent { .. }
            | ReplicationError::NoPrimary { .. } => Disposition::Transient,
            ReplicationError::TlsConfig(_)
            | ReplicationError::Tls { .. }
            | ReplicationError::Auth { .. } => Disposition::Permanent,
            ReplicationError::Server { error, .. } => sqlstate_disposition(&error.sqlstate()),
            ReplicationError::Protocol { .. } => Disposition::Fatal,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: &str) -> ReplicationError {
        ReplicationError::Server {
            server: "u@h:5432/db".into(),
            error: Box::new(ServerError {
                severity: "FATAL".into(),
                code: code.into(),
                message: "m".into(),
                detail: None,
                hint: None,
            }),
        }
    }

    #[test]
    fn sqlstates_decide_between_retrying_and_stopping() {
        for code in ["28P01", "28000", "3D000", "42501"] {
            assert_eq!(server(code).disposition(), Disposition::Permanent, "{code}");
        }
        for code in ["57P01", "57P03", "53300", "08006", "55006"] {
            assert_eq!(server(code).disposition(), Disposition::Transient, "{code}");
        }
        assert_eq!(server("XX000").disposition(), Disposition::Fatal);
    }

    #[test]
    fn permanent_errors_name_the_setting() {
        let msg = server("3D000").to_string();
        assert!(
            msg.contains("SQLSTATE 3D000") && msg.contains("postgres.url"),
            "{msg}"
        );
        let msg = server("28P01").to_string();
        assert!(msg.contains("postgres.password_env"), "{msg}");
    }
}
