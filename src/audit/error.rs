//! Why an audit could not compare, shared by the audit and the readers of
//! its two sides.

use crate::outbox::MappingConfigError;
use crate::source::admin::AdminError;
use crate::source::outbox_rows::RowsError;

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error(transparent)]
    Connect(#[from] AdminError),
    /// Reading the table, as for a backfill.
    #[error(transparent)]
    Rows(#[from] RowsError),
    #[error(transparent)]
    Mapping(#[from] MappingConfigError),
    #[error("Kafka: {what}: {message}")]
    Kafka { what: &'static str, message: String },
    #[error("the audit's temporary files: {0}")]
    Spill(#[source] std::io::Error),
    #[error("cannot read the bound {0:?} PostgreSQL printed as a time")]
    Bound(String),
    #[error(transparent)]
    Sink(#[from] crate::sink::SinkError),
}

impl From<crate::sink::error::SinkConfigError> for AuditError {
    fn from(e: crate::sink::error::SinkConfigError) -> Self {
        AuditError::Sink(e.into())
    }
}
