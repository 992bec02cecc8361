//! One streaming session: check and prepare the database, start replication
//! from the slot, and turn the stream into [`SourceItem`]s.
//!
//! A session is thrown away on any error; the caller reconnects and the slot
//! (not any state of ours) says where to resume.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::admin::{self, AdminError, Target};
use super::pgoutput::{DecodeError, Decoder};
use super::replication::{
    self, ConnParams, ReplicationError, ReplicationStream, ServerMessage, StartOptions,
};
use super::transactions::{AssembleError, IgnoredCounts, SourceItem, TransactionAssembler};
use crate::Lsn;

/// pgoutput protocol version requested. Version 1 sends each transaction
/// whole at commit, so nothing uncommitted is ever seen.
pub const PROTO_VERSION: u32 = 1;

#[derive(Debug, Clone)]
pub struct SourceSettings {
    pub conn: ConnParams,
    pub slot: String,
    pub publication: String,
    pub table_schema: String,
    pub table_name: String,
    pub create_slot: bool,
    pub create_publication: bool,
    pub failover_slot: bool,
    /// `pg_logical_emit_message` prefix treated as events; `None` = off.
    pub message_prefix: Option<String>,
    /// How often standby status updates are sent (checked against the
    /// server's wal_sender_timeout).
    pub status_interval: Duration,
}

impl SourceSettings {
    /// What the slot and publication checks and `ensure_*` work on.
    pub fn target(&self) -> Target<'_> {
        Target {
            slot: &self.slot,
            publication: &self.publication,
            table_schema: &self.table_schema,
            table_name: &self.table_name,
            create_slot: self.create_slot,
            create_publication: self.create_publication,
            failover_slot: self.failover_slot,
        }
    }
}

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
    pub fn is_retryable(&self) -> bool {
        match self {
            SourceError::Replication(e) => e.is_retryable(),
            SourceError::Admin(e) => e.is_retryable(),
            _ => false,
        }
    }
}

/// What one receive produced, besides the items appended to the caller's Vec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// A pgoutput message was decoded (items may or may not have been added).
    Data,
    /// Server keepalive: `wal_end` is safe to confirm when no transaction is
    /// open and everything before it is acked.
    Keepalive { wal_end: Lsn, reply_requested: bool },
}

/// The highest position a session may confirm, raised by whoever vouches
/// for positions (the relay's table watch). Shared, so the watch can raise
/// it while the session confirms from anywhere in the relay.
#[derive(Debug, Clone)]
pub struct ConfirmCeiling(Arc<AtomicU64>);

impl ConfirmCeiling {
    pub fn new(at: Lsn) -> Self {
        ConfirmCeiling(Arc::new(AtomicU64::new(at.0)))
    }

    /// Moves the ceiling up to `lsn`; never down.
    pub fn raise(&self, lsn: Lsn) {
        self.0.fetch_max(lsn.0, Ordering::AcqRel);
    }

    pub fn get(&self) -> Lsn {
        Lsn(self.0.load(Ordering::Acquire))
    }
}

pub struct SourceSession {
    stream: ReplicationStream,
    /// `None`: confirm whatever the caller says (`outboxd tail`).
    ceiling: Option<ConfirmCeiling>,
    decoder: Decoder,
    assembler: TransactionAssembler,
    /// Server's wal_sender_timeout; status updates must come well within it.
    pub wal_sender_timeout: Duration,
    /// The slot's confirmed position when the session started.
    pub start_lsn: Lsn,
}

impl SourceSession {
    /// Preflight, publication and slot checks, the replication connection,
    /// and only then creating what is missing and START_REPLICATION: a
    /// check that fails leaves no slot behind (a slot nobody streams holds
    /// WAL until someone drops it).
    pub async fn open(s: &SourceSettings) -> Result<SourceSession, SourceError> {
        replication::commands::validate_identifier("postgres.slot", &s.slot).map_err(|reason| {
            ReplicationError::Protocol {
                server: s.conn.describe(),
                reason,
            }
        })?;
        let client = admin::connect_sql(&s.conn).await?;
        admin::preflight(&client).await?;
        let target = s.target();
        let create_publication = admin::check_publication_ready(&client, &target).await?;
        let existing_slot = admin::check_slot_ready(&client, &target).await?;
        let wal_sender_timeout = admin::wal_sender_timeout(&client).await?;
        // The server drops a walsender that stays silent for its timeout;
        // while backpressured, interval updates are all it hears from us.
        if !wal_sender_timeout.is_zero() && s.status_interval * 2 > wal_sender_timeout {
            tracing::warn!(
                status_interval_ms = s.status_interval.as_millis() as u64,
                wal_sender_timeout_ms = wal_sender_timeout.as_millis() as u64,
                "postgres.status_interval is more than half the server's wal_sender_timeout; \
                 the server may drop the connection while outboxd waits for Kafka: lower status_interval"
            );
        }
        // The last checks: pg_hba.conf admits replication connections, and
        // the walsender answers.
        let mut conn = replication::connect(&s.conn).await?;
        let identity = conn.identify_system().await?;
        tracing::debug!(system_id = %identity.system_id, timeline = identity.timeline, xlogpos = %identity.xlogpos, "identified system");
        // The publication first: the slot's changes are decoded with it.
        if create_publication {
            admin::create_publication(&client, &target).await?;
        }
        let slot = match existing_slot {
            Some(slot) => admin::ensure_failover(&mut conn, &target, slot).await?,
            None => admin::create_slot(&client, &target).await?,
        };
        drop(client);

        let start_lsn = slot.confirmed_flush_lsn.unwrap_or(Lsn::ZERO);
        let stream = conn
            .start_replication(&StartOptions {
                slot: s.slot.clone(),
                publication: s.publication.clone(),
                // 0/0: the server resumes at the slot's confirmed position.
                start_lsn: Lsn::ZERO,
                proto_version: PROTO_VERSION,
                messages: s.message_prefix.is_some(),
            })
            .await?;
        tracing::info!(slot = %s.slot, %start_lsn, "replication started");
        Ok(SourceSession {
            stream,
            ceiling: None,
            decoder: Decoder::new(PROTO_VERSION),
            assembler: TransactionAssembler::new(
                &s.table_schema,
                &s.table_name,
                s.message_prefix.as_deref(),
            ),
            wal_sender_timeout,
            start_lsn,
        })
    }

    /// Receives and decodes the next message. Cancel-safe: nothing is consumed
    /// unless the future completes.
    pub async fn next(&mut self, out: &mut Vec<SourceItem>) -> Result<Received, SourceError> {
        match self.stream.recv().await? {
            ServerMessage::XLogData {
                wal_start, data, ..
            } => {
                let msg = self
                    .decoder
                    .decode(data)
                    .map_err(|source| SourceError::Decode {
                        lsn: wal_start,
                        source,
                    })?;
                self.assembler
                    .handle(msg, out)
                    .map_err(|source| SourceError::Assemble {
                        lsn: wal_start,
                        source,
                    })?;
                Ok(Received::Data)
            }
            ServerMessage::Keepalive {
                wal_end,
                reply_requested,
            } => Ok(Received::Keepalive {
                wal_end,
                reply_requested,
            }),
        }
    }

    pub fn in_transaction(&self) -> bool {
        self.assembler.in_transaction()
    }

    pub fn ignored(&self) -> IgnoredCounts {
        self.assembler.ignored()
    }

    pub fn stream(&mut self) -> &mut ReplicationStream {
        &mut self.stream
    }

    /// From now on, confirm nothing above `ceiling`.
    pub fn set_ceiling(&mut self, ceiling: ConfirmCeiling) {
        self.ceiling = Some(ceiling);
    }

    /// `confirmable` lowered to the ceiling: what may be sent as confirmed.
    pub fn limit(&self, confirmable: Lsn) -> Lsn {
        match &self.ceiling {
            Some(c) => confirmable.min(c.get()),
            None => confirmable,
        }
    }

    /// Confirms `confirmed` (within the ceiling) and closes the connection
    /// cleanly.
    pub async fn finish(self, confirmed: Lsn) -> Result<(), SourceError> {
        let confirmed = self.limit(confirmed);
        Ok(self.stream.finish(confirmed).await?)
    }
}
