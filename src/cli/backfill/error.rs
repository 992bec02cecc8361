//! Why a backfill could not start, or stopped: shared by the backfill and
//! its Kafka side.

use crate::outbox::MappingConfigError;
use crate::sink::SinkError;
use crate::source::admin::AdminError;
use crate::source::outbox_rows::RowsError;

/// Why a backfill could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum BackfillError {
    #[error(transparent)]
    Connect(#[from] AdminError),
    #[error(transparent)]
    Rows(#[from] RowsError),
    #[error("{0}")]
    TableChoice(String),
    #[error(transparent)]
    Mapping(#[from] MappingConfigError),
    #[error(transparent)]
    Sink(#[from] SinkError),
}
