//! Why the database is not ready for outboxd, each with the fix.

use super::target::quote_ident;
use crate::source::replication::error::{sqlstate_disposition, Disposition, ServerError};
use crate::source::replication::tls::certificate_problem;

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// `error` is rendered in full here (not kept as the source): its own
    /// Display is only "db error" or "error performing TLS handshake".
    #[error(
        "cannot connect to PostgreSQL at {server}: {}",
        describe_pg_error(error)
    )]
    Connect {
        server: String,
        error: tokio_postgres::Error,
    },
    /// The server logged the SQL connection in without SCRAM channel binding
    /// (no TLS, or a trust, password, md5 or cert method).
    #[error(
        "cannot connect to PostgreSQL at {server}: channel_binding=require in postgres.url, but the server \
         did not use SCRAM-SHA-256-PLUS (no TLS, pg_hba.conf gives this user trust, password, md5 or cert, \
         or the server's certificate is signed with an algorithm tls-server-end-point defines no hash for, \
         such as Ed25519): set scram-sha-256 on a hostssl line, or drop channel_binding=require"
    )]
    ChannelBindingRefused { server: String },
    /// postgres.password_file could not be read at a connect.
    #[error("{0}")]
    PasswordFile(String),
    #[error("connecting to PostgreSQL at {server} timed out after {seconds}s (postgres.connect_timeout)")]
    ConnectTimeout { server: String, seconds: u64 },
    /// Every host answered read-only while postgres.url asks for
    /// `target_session_attrs=read-write`: a failover in progress, typically.
    #[error("no host of {server} accepts writes (target_session_attrs=read-write in postgres.url): waiting for a primary")]
    NoPrimary { server: String },
    /// The table watch could not look at the table: the session ends (its
    /// confirmation is frozen meanwhile, and a server shutting down waits
    /// for our confirmation before it stops), and the next one starts when
    /// PostgreSQL answers again.
    #[error("the table watch cannot reach PostgreSQL ({cause}); ending the session, to resume from the slot")]
    WatchLost { cause: String },
    #[error(transparent)]
    Tls(#[from] crate::source::replication::tls::TlsConfigError),
    #[error("{context}: {}", describe_pg_error(source))]
    Sql {
        context: &'static str,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("PostgreSQL {version} is too old: outboxd needs PostgreSQL 14 or newer")]
    ServerTooOld { version: String },
    #[error(
        "wal_level is '{actual}', logical decoding needs 'logical': set wal_level = logical in postgresql.conf \
         (ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL"
    )]
    WalLevel { actual: String },
    #[error(
        "role {user:?} lacks the REPLICATION attribute needed to stream the WAL: \
         run ALTER ROLE {} REPLICATION as a superuser", quote_ident(.user)
    )]
    NoReplicationPrivilege { user: String },
    #[error(
        "all max_replication_slots = {max} replication slots are in use, so slot {slot:?} cannot be created: \
         raise max_replication_slots (needs a restart) or drop an unused slot with pg_drop_replication_slot"
    )]
    NoFreeSlots { slot: String, max: i64 },
    #[error(
        "all max_wal_senders = {max} WAL senders are busy ({used} connected): \
         raise max_wal_senders (needs a restart) or stop an idle replication client"
    )]
    NoFreeWalSenders { max: i64, used: i64 },
    #[error(
        "replication slot {slot:?} does not exist and postgres.create_slot = false: set create_slot = true, \
         or create it with SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')"
    )]
    SlotMissing { slot: String },
    #[error("replication slot {slot:?} is a physical slot; outboxd needs a logical pgoutput slot: use another postgres.slot")]
    SlotNotLogical { slot: String },
    #[error(
        "replication slot {slot:?} uses output plugin {plugin:?}, not pgoutput: use another postgres.slot, \
         or drop this slot if nothing else needs it"
    )]
    SlotWrongPlugin { slot: String, plugin: String },
    #[error("replication slot {slot:?} belongs to database {database:?}, not {expected:?}: use another postgres.slot")]
    SlotWrongDatabase {
        slot: String,
        database: String,
        expected: String,
    },
    #[error(
        "replication slot {slot:?} is active for PID {pid}: another outboxd or replication client is streaming it; \
         stop that process (SELECT pg_terminate_backend({pid})) or give this instance its own postgres.slot"
    )]
    SlotActive { slot: String, pid: i32 },
    #[error(
        "replication slot {slot:?} is invalidated (wal_status = 'lost'): WAL it still needed was removed, \
         so events committed meanwhile cannot be streamed. Drop the slot (SELECT pg_drop_replication_slot('{slot}')), \
         let outboxd create a new one, and reconcile the outbox rows written since the last confirmed position"
    )]
    SlotLost { slot: String },
    #[error("table {table} does not exist: create it (see migrations/) or fix outbox.table")]
    TableMissing { table: String },
    #[error(
        "publication {publication:?} does not exist and postgres.create_publication = false: set create_publication = true, \
         or run CREATE PUBLICATION {} FOR TABLE {table} WITH (publish = 'insert', publish_via_partition_root = true)", quote_ident(.publication)
    )]
    PublicationMissing { publication: String, table: String },
    #[error(
        "publication {publication:?} does not include {table}: run ALTER PUBLICATION {} ADD TABLE {table}", quote_ident(.publication)
    )]
    PublicationMissingTable { publication: String, table: String },
    #[error(
        "publication {publication:?} does not publish inserts: run ALTER PUBLICATION {} SET (publish = 'insert')", quote_ident(.publication)
    )]
    PublicationNoInserts { publication: String },
    #[error(
        "publication {publication:?} publishes the partitioned table {table} by partition, so its rows \
         arrive under the partitions' names and would never be relayed: run ALTER PUBLICATION \
         {} SET (publish_via_partition_root = true)", quote_ident(.publication)
    )]
    PublicationNotViaRoot { publication: String, table: String },
    #[error(
        "postgres.failover_slot = true needs PostgreSQL 17 or newer (failover slots), the server runs {version}: \
         set failover_slot = false, or upgrade the server"
    )]
    FailoverUnsupported { version: String },
    #[error(
        "postgres.failover_slot = true, but replication slot {slot:?} is not a failover slot and could not be \
         altered ({error}): run ALTER_REPLICATION_SLOT {slot} ( FAILOVER true ) on a replication connection \
         as its owner, or set failover_slot = false"
    )]
    FailoverAlter {
        slot: String,
        error: Box<crate::source::replication::ReplicationError>,
    },
    #[error("PostgreSQL returned {text:?} where a WAL position was expected")]
    BadLsn { text: String },
    #[error("the table watch's look returned {rows} rows for {tables} outbox tables")]
    LookRows { rows: usize, tables: usize },
}

impl AdminError {
    /// Reconnecting may help: the server went away or is starting or
    /// stopping (SQLSTATE class 08, 57P01-57P03), or another client holds
    /// the slot. Anything else needs a person.
    pub(crate) fn is_retryable(&self) -> bool {
        match self {
            AdminError::Connect { .. }
            | AdminError::NoPrimary { .. }
            | AdminError::SlotActive { .. } => true,
            AdminError::Sql { source, .. } => {
                source.is_closed()
                    || source.code().is_some_and(|c| {
                        c.code().starts_with("08")
                            || matches!(c.code(), "57P01" | "57P02" | "57P03")
                    })
            }
            _ => false,
        }
    }
}

impl AdminError {
    /// Whether reconnecting can help, and for how long.
    pub(crate) fn disposition(&self) -> Disposition {
        match self {
            AdminError::Connect { error, .. } | AdminError::Sql { source: error, .. } => {
                pg_error_disposition(error)
            }
            AdminError::ConnectTimeout { .. }
            | AdminError::NoPrimary { .. }
            | AdminError::SlotActive { .. }
            | AdminError::WatchLost { .. } => Disposition::Transient,
            // Everything else names a setting or a server change to make.
            _ => Disposition::Permanent,
        }
    }
}

/// A server error by its SQLSTATE; a refused certificate is a setting to
/// fix; anything else (refused, reset, closed, timed out) is the network.
fn pg_error_disposition(e: &tokio_postgres::Error) -> Disposition {
    if let Some(db) = e.as_db_error() {
        sqlstate_disposition(db.code())
    } else if certificate_problem(e).is_some() {
        Disposition::Permanent
    } else {
        Disposition::Transient
    }
}

/// A tokio-postgres error with what its Display leaves out: the server's
/// severity, message, SQLSTATE, detail and hint, or the certificate problem,
/// or the chain of causes (e.g. "Connection refused").
pub(crate) fn describe_pg_error(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        return ServerError::from_db_error(db).to_string();
    }
    if let Some(problem) = certificate_problem(e) {
        return format!("{e}: {problem}");
    }
    let mut text = e.to_string();
    let mut next = std::error::Error::source(e);
    while let Some(cause) = next {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        next = cause.source();
    }
    text
}

/// An SQL failure while `context`, as an [`AdminError`].
pub(super) fn sql_err(context: &'static str) -> impl FnOnce(tokio_postgres::Error) -> AdminError {
    move |source| AdminError::Sql { context, source }
}
