//! [`SourceError`]: why a streaming session ended, and whether reconnecting
//! may help.

use super::admin::AdminError;
use super::assembler::AssembleError;
use super::pgoutput::DecodeError;
use super::replication::ReplicationError;
use crate::Lsn;

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error(transparent)]
    Admin(#[from] AdminError),
    #[error(transparent)]
    Replication(#[from] ReplicationError),
    #[error("cannot decode pgoutput message at {lsn}: {source}")]
    Decode {
        lsn: Lsn,
        #[source]
        source: DecodeError,
    },
    #[error("inconsistent pgoutput stream at {lsn}: {source}")]
    Assemble {
        lsn: Lsn,
        #[source]
        source: AssembleError,
    },
}

impl SourceError {
    /// Reconnecting may help (network, server restart); anything else needs
    /// a person.
    pub(crate) fn is_retryable(&self) -> bool {
        match self {
            SourceError::Replication(e) => e.is_retryable(),
            SourceError::Admin(e) => e.is_retryable(),
            _ => false,
        }
    }
}
