//! Why the outbox rows of a window could not be read.

/// Why a [`RowReader`](super::RowReader) could not open its window or read
/// a page of it. The messages name the option to change: the reader's
/// options come from the command line (`--since`, `--until`,
/// `--time-column`) or the configuration.
#[derive(Debug, thiserror::Error)]
pub enum RowsError {
    #[error("{context}: {}", pg_message(.source))]
    Sql {
        context: &'static str,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error(
        "the outbox table {table} does not exist or is not visible to this role (outbox.table)"
    )]
    NoTable { table: String },
    #[error(
        "the outbox table {table} has no column `{column}` (from {from}) to choose rows by time: \
         set outbox.columns.timestamp, or pass --time-column NAME"
    )]
    NoTimeColumn {
        table: String,
        column: String,
        from: &'static str,
    },
    #[error(
        "column `{column}` is of type {type_name}, which holds no time: pass --time-column with a \
         timestamptz, timestamp, date or epoch-milliseconds bigint column"
    )]
    NotATime { column: String, type_name: String },
    #[error("the outbox table {table} has no id column `{column}` (outbox.columns.id)")]
    NoIdColumn { table: String, column: String },
    #[error(
        "{flag} {value:?} is not a time PostgreSQL reads: {reason}; use RFC 3339 \
         (2026-12-01T10:00:00Z) or a timestamp literal (2026-12-01 10:00:00+00)"
    )]
    InvalidTime {
        flag: &'static str,
        value: String,
        reason: String,
    },
    #[error("--until ({until}) is not after --since ({since}): the window holds no time")]
    EmptyWindow { since: String, until: String },
}

/// The server's message for a failed statement (tokio-postgres' own
/// Display says only "db error").
pub(super) fn pg_message(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => db.message().to_owned(),
        None => e.to_string(),
    }
}
