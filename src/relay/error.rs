//! Why a relay stops, and whether reconnecting may help
//! ([`Disposition`]).

use crate::outbox::MappingConfigError;
use crate::progress::ledger::StartGap;
use crate::registry::RegistryError;
use crate::sink::{LedgerTopicError, SinkError, TransactionError};
use crate::source::error::SourceError;
use crate::source::replication::error::Disposition;

#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error(transparent)]
    Mapping(#[from] MappingConfigError),
    /// The position ledger's topic cannot be used (the message names the
    /// fix).
    #[error(transparent)]
    Ledger(#[from] LedgerTopicError),
    /// Exactly-once: the transactional producer failed. A fencing (another
    /// instance took the transactional id over) stops the relay.
    #[error(transparent)]
    Transaction(#[from] TransactionError),
    /// The schema registry refused, or a route's schema cannot be used
    /// (the message names the setting or the subject).
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// The ledger, the server and the slot disagree: events may have been
    /// lost. The message names the slot, both positions and the recovery.
    #[error("{0}")]
    Gap(Box<StartGap>),
    /// The last error is rendered here rather than kept as the source, so
    /// the message says it once.
    #[error(
        "gave up after {attempts} attempts in a row failed for a reason reconnecting cannot fix \
         (relay.max_permanent_failures = {attempts}): {last}"
    )]
    GaveUp {
        attempts: u32,
        last: Box<RelayError>,
    },
    /// The slot was streamed by this process and is gone now: dropped, or
    /// lost in a failover to a server that does not have it. A new slot
    /// would start at the server's current position and skip everything
    /// committed since `confirmed`, so none is created.
    #[error(
        "replication slot {slot:?} disappeared while outboxd was relaying it (dropped, or lost in a \
         failover to a server without it). outboxd last confirmed {confirmed} at {confirmed_at}; \
         outbox events committed after that were not relayed, and a new slot would skip them, so \
         outboxd created none and stopped. To recover: run `outboxd backfill --since '{confirmed_at}'` \
         (a little earlier is safer: duplicates carry the same id), then start outboxd once with \
         `outboxd run --accept-gap`, which creates the slot and records the accepted range in the \
         position ledger (a plain restart refuses, naming the gap)"
    )]
    SlotLost {
        slot: String,
        confirmed: crate::Lsn,
        confirmed_at: String,
    },
}

impl RelayError {
    /// Reconnect (how often), or stop.
    pub(super) fn disposition(&self) -> Disposition {
        let by_retry = |retryable: bool| {
            if retryable {
                Disposition::Transient
            } else {
                Disposition::Fatal
            }
        };
        match self {
            RelayError::Source(SourceError::Admin(e)) => e.disposition(),
            RelayError::Source(SourceError::Replication(e)) => e.disposition(),
            RelayError::Source(e) => by_retry(e.is_retryable()),
            RelayError::Sink(e) => by_retry(e.is_retryable()),
            RelayError::Ledger(LedgerTopicError::Sink(e)) => by_retry(e.is_retryable()),
            // An ACL to grant, or a broker that did not answer for the
            // topic's configuration: a restart may find it fixed, and after
            // `relay.max_permanent_failures` the relay stops naming it.
            RelayError::Ledger(
                LedgerTopicError::Refused { .. } | LedgerTopicError::PolicyNotReported { .. },
            ) => Disposition::Permanent,
            RelayError::Ledger(LedgerTopicError::Read { .. } | LedgerTopicError::Write { .. }) => {
                Disposition::Transient
            }
            RelayError::Transaction(
                TransactionError::Abortable { .. } | TransactionError::Unfinished { .. },
            ) => Disposition::Transient,
            RelayError::Transaction(_)
            | RelayError::Mapping(_)
            | RelayError::Registry(_)
            | RelayError::GaveUp { .. }
            | RelayError::SlotLost { .. }
            | RelayError::Ledger(_)
            | RelayError::Gap(_) => Disposition::Fatal,
        }
    }
}
