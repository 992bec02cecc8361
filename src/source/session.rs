//! One streaming session: check and prepare the database, start replication
//! from the slot, and hand the stream to its driver task.
//!
//! A session is thrown away on any error; the caller reconnects and the slot
//! (not any state of ours) says where to resume.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::admin::{self, AdminError, Target};
use super::driver::{DriverOptions, SourceHandle};
use super::pgoutput::{DecodeError, Decoder};
use super::replication::{self, ConnParams, ReplicationError, ReplicationStream, StartOptions};
use super::transactions::{AssembleError, TransactionAssembler};
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

/// The highest position a session may confirm, raised by whoever vouches
/// for positions (the relay's table watch). Shared, so the watch can raise
/// it while the session confirms from anywhere in the relay.
#[derive(Debug, Clone)]
pub(crate) struct ConfirmCeiling(Arc<AtomicU64>);

impl ConfirmCeiling {
    pub(crate) fn new(at: Lsn) -> Self {
        ConfirmCeiling(Arc::new(AtomicU64::new(at.0)))
    }

    /// Moves the ceiling up to `lsn`; never down.
    pub(crate) fn raise(&self, lsn: Lsn) {
        self.0.fetch_max(lsn.0, Ordering::AcqRel);
    }

    pub(crate) fn get(&self) -> Lsn {
        Lsn(self.0.load(Ordering::Acquire))
    }
}

pub(crate) struct SourceSession {
    stream: ReplicationStream,
    decoder: Decoder,
    assembler: TransactionAssembler,
    /// Server's wal_sender_timeout; status updates must come well within it.
    wal_sender_timeout: Duration,
    /// The slot's confirmed position when the session started.
    pub(crate) start_lsn: Lsn,
}

impl SourceSession {
    /// Preflight, publication and slot checks, the replication connection,
    /// and only then creating what is missing and START_REPLICATION: a
    /// check that fails leaves no slot behind (a slot nobody streams holds
    /// WAL until someone drops it).
    pub(crate) async fn open(s: &SourceSettings) -> Result<SourceSession, SourceError> {
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
        // while the relay holds back, unasked updates are all it hears from
        // us, so the driver sends them more often than configured then.
        if !wal_sender_timeout.is_zero() && s.status_interval * 3 > wal_sender_timeout {
            tracing::info!(
                status_interval_ms = s.status_interval.as_millis() as u64,
                wal_sender_timeout_ms = wal_sender_timeout.as_millis() as u64,
                "postgres.status_interval is more than a third of the server's wal_sender_timeout; \
                 status updates go every third of wal_sender_timeout instead"
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

    /// Hands the stream to its own task (see [`driver`](super::driver)):
    /// from now on it is read, and the walsender kept alive, there.
    pub(crate) fn start(self, opts: DriverOptions) -> SourceHandle {
        SourceHandle::spawn(
            self.stream,
            self.decoder,
            self.assembler,
            self.start_lsn,
            self.wal_sender_timeout,
            opts,
        )
    }
}
