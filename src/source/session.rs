//! One streaming session: check and prepare the database, start replication
//! from the slot, and hand the stream to its driver task.
//!
//! A session is thrown away on any error; the caller reconnects and the slot
//! (not any state of ours) says where to resume.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::admin::{self, AdminError, Target};
use super::driver::{DriverOptions, SourceHandle};
use super::pgoutput::{DecodeError, Decoder};
use super::replication::{self, ConnParams, ReplicationError, ReplicationStream, StartOptions};
use super::transactions::{AssembleError, TransactionAssembler};
use crate::progress::ledger::SlotState;
use crate::Lsn;

/// pgoutput protocol version requested. Version 1 sends each transaction
/// whole at commit, so nothing uncommitted is ever seen.
pub(crate) const PROTO_VERSION: u32 = 1;

#[derive(Debug, Clone)]
pub struct SourceSettings {
    pub conn: ConnParams,
    pub slot: String,
    pub publication: String,
    /// The outbox tables, in configuration order; at least one.
    pub tables: Vec<SourceTable>,
    pub create_slot: bool,
    pub create_publication: bool,
    pub failover_slot: bool,
    /// How often standby status updates are sent (checked against the
    /// server's wal_sender_timeout).
    pub status_interval: Duration,
}

/// One outbox table as the source sees it: where its rows come from and
/// which `pg_logical_emit_message` prefix belongs to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceTable {
    pub schema: String,
    pub name: String,
    /// Prefix of messages treated as this table's events; `None` = off.
    pub message_prefix: Option<String>,
}

impl SourceSettings {
    /// What the slot checks and `ensure_*` work on; its table is the first
    /// one (the slot and the publication are shared by all).
    pub(crate) fn target(&self) -> Target<'_> {
        self.target_for(&self.tables[0])
    }

    /// One target per outbox table, for the per-table publication checks.
    pub(crate) fn targets(&self) -> impl Iterator<Item = Target<'_>> {
        self.tables.iter().map(|t| self.target_for(t))
    }

    fn target_for<'a>(&'a self, table: &'a SourceTable) -> Target<'a> {
        Target {
            slot: &self.slot,
            publication: &self.publication,
            table_schema: &table.schema,
            table_name: &table.name,
            all_tables: &self.tables,
            create_slot: self.create_slot,
            create_publication: self.create_publication,
            failover_slot: self.failover_slot,
        }
    }

    /// Whether any table relays logical decoding messages.
    pub(crate) fn wants_messages(&self) -> bool {
        self.tables.iter().any(|t| t.message_prefix.is_some())
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
    pub(crate) fn is_retryable(&self) -> bool {
        match self {
            SourceError::Replication(e) => e.is_retryable(),
            SourceError::Admin(e) => e.is_retryable(),
            _ => false,
        }
    }
}

/// The highest position a session may confirm, raised by whoever vouches
/// for positions (the relay's table watch). Shared, so the watch can raise
/// it while the session confirms from anywhere in the relay; a raise wakes
/// the driver ([`ConfirmCeiling::raises`]), so a position held back only by
/// the ceiling is sent as soon as it is vouched for, not at the next status
/// period (which under a steady flow of acks was seen to add up to a
/// period, a whole `status_interval`, to the slot's lag).
///
/// The other way, the driver says what it would confirm
/// ([`ConfirmCeiling::want`]): whoever vouches learns whether anything
/// waits on it ([`ConfirmCeiling::waiting`]), and is woken when something
/// starts to ([`ConfirmCeiling::wants`]), so an idle relay need not vouch
/// on a fast beat for nothing.
#[derive(Debug, Clone)]
pub(crate) struct ConfirmCeiling {
    ceiling: Arc<watch::Sender<Lsn>>,
    wanted: Arc<watch::Sender<Lsn>>,
}

/// Moves a watched position up to `lsn`; never down. Wakes receivers only
/// when it moved.
fn raise_to(position: &watch::Sender<Lsn>, lsn: Lsn) {
    position.send_if_modified(|at| {
        let higher = lsn > *at;
        if higher {
            *at = lsn;
        }
        higher
    });
}

impl ConfirmCeiling {
    pub(crate) fn new(at: Lsn) -> Self {
        ConfirmCeiling {
            ceiling: Arc::new(watch::Sender::new(at)),
            wanted: Arc::new(watch::Sender::new(at)),
        }
    }

    /// Moves the ceiling up to `lsn`; never down.
    pub(crate) fn raise(&self, lsn: Lsn) {
        raise_to(&self.ceiling, lsn);
    }

    pub(crate) fn get(&self) -> Lsn {
        *self.ceiling.borrow()
    }

    /// A receiver that wakes on every raise.
    pub(crate) fn raises(&self) -> watch::Receiver<Lsn> {
        self.ceiling.subscribe()
    }

    /// The driver would confirm up to `lsn` (acked, or an idle keepalive);
    /// never down.
    pub(crate) fn want(&self, lsn: Lsn) {
        raise_to(&self.wanted, lsn);
    }

    /// Something the driver would confirm is held back by the ceiling.
    pub(crate) fn waiting(&self) -> bool {
        *self.wanted.borrow() > self.get()
    }

    /// A receiver that wakes whenever the driver wants more.
    pub(crate) fn wants(&self) -> watch::Receiver<Lsn> {
        self.wanted.subscribe()
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

/// The server (IDENTIFY_SYSTEM) and the slot, as found before any slot is
/// created: what the position ledger is compared with.
#[derive(Debug, Clone)]
pub(crate) struct Identified {
    pub(crate) system_id: String,
    pub(crate) timeline: u32,
    pub(crate) xlogpos: Lsn,
    pub(crate) slot: SlotState,
    /// The slot is a failover slot (PostgreSQL 17+): after a promotion it
    /// is the synchronised copy, so a new timeline is expected.
    pub(crate) failover_slot: bool,
    /// This timeline's history (`TIMELINE_HISTORY`), read for a failover
    /// slot on a timeline after the first: where the earlier ones branched.
    pub(crate) timeline_history: Option<String>,
}

/// What the gate of [`SourceSession::open_gated`] lets the session do
/// about the slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotPlan {
    /// As `postgres.create_slot` says: create a missing slot when allowed,
    /// refuse an invalidated one.
    AsConfigured,
    /// The operator accepted the gap: drop an invalidated slot and create a
    /// new one (a missing one is created).
    Recreate,
}

impl SourceSession {
    /// Preflight, publication and slot checks, the replication connection,
    /// and only then creating what is missing and START_REPLICATION: a
    /// check that fails leaves no slot behind (a slot nobody streams holds
    /// WAL until someone drops it).
    pub(crate) async fn open(s: &SourceSettings) -> Result<SourceSession, SourceError> {
        Self::open_gated(s, |_| Ok::<_, SourceError>(SlotPlan::AsConfigured)).await
    }

    /// As [`open`](Self::open), with `gate` deciding, once the server and
    /// the slot are known and before any slot is created, whether to go on
    /// (the relay asks the position ledger, see `relay::ledger`).
    pub(crate) async fn open_gated<E: From<SourceError>>(
        s: &SourceSettings,
        gate: impl FnOnce(&Identified) -> Result<SlotPlan, E>,
    ) -> Result<SourceSession, E> {
        replication::commands::validate_identifier("postgres.slot", &s.slot)
            .map_err(|reason| ReplicationError::Protocol {
                server: s.conn.describe(),
                reason,
            })
            .map_err(SourceError::from)?;
        let client = admin::connect_sql(&s.conn)
            .await
            .map_err(SourceError::from)?;
        admin::preflight(&client).await.map_err(SourceError::from)?;
        let target = s.target();
        // Every table is checked before anything is created: one missing
        // from an existing publication is refused with its ALTER fix.
        let mut create_publication = false;
        for t in s.targets() {
            create_publication |= admin::check_publication_ready(&client, &t)
                .await
                .map_err(SourceError::from)?;
        }
        // A missing (with create_slot = false) or invalidated slot is for
        // the gate to judge first: the ledger may name the gap.
        let (slot_state, slot_refusal, existing_slot) =
            match admin::check_slot_ready(&client, &target).await {
                Ok(Some(info)) => (
                    SlotState::Present {
                        confirmed_flush: info.confirmed_flush_lsn.unwrap_or(Lsn::ZERO),
                    },
                    None,
                    Some(info),
                ),
                Ok(None) => (SlotState::Missing, None, None),
                Err(e @ AdminError::SlotMissing { .. }) => (SlotState::Missing, Some(e), None),
                Err(e @ AdminError::SlotLost { .. }) => (SlotState::Invalidated, Some(e), None),
                Err(e) => return Err(SourceError::from(e).into()),
            };
        let wal_sender_timeout = admin::wal_sender_timeout(&client)
            .await
            .map_err(SourceError::from)?;
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
        let mut conn = replication::connect(&s.conn)
            .await
            .map_err(SourceError::from)?;
        let identity = conn.identify_system().await.map_err(SourceError::from)?;
        tracing::debug!(system_id = %identity.system_id, timeline = identity.timeline, xlogpos = %identity.xlogpos, "identified system");
        let failover_slot = existing_slot
            .as_ref()
            .is_some_and(|i| i.failover == Some(true));
        let timeline_history = if failover_slot && identity.timeline > 1 {
            match conn.timeline_history(identity.timeline).await {
                Ok(history) => Some(history),
                Err(e) => {
                    tracing::warn!(error = %e, timeline = identity.timeline, "cannot read the timeline history: events the position ledger has from before the promotion are relayed again");
                    None
                }
            }
        } else {
            None
        };
        let identified = Identified {
            system_id: identity.system_id.clone(),
            timeline: identity.timeline,
            xlogpos: identity.xlogpos,
            slot: slot_state,
            failover_slot,
            timeline_history,
        };
        let plan = gate(&identified)?;
        // The publication first: the slot's changes are decoded with it.
        if create_publication {
            admin::create_publication(&client, &target)
                .await
                .map_err(SourceError::from)?;
        }
        let slot = match (existing_slot, slot_refusal, plan) {
            (Some(slot), _, _) => admin::ensure_failover(&mut conn, &target, slot)
                .await
                .map_err(SourceError::from)?,
            // An accepted gap: a new slot replaces the missing or lost one.
            (None, _, SlotPlan::Recreate) => {
                if slot_state == SlotState::Invalidated {
                    client
                        .execute("SELECT pg_drop_replication_slot($1)", &[&s.slot])
                        .await
                        .map_err(|source| AdminError::Sql {
                            context: "dropping the invalidated slot",
                            source,
                        })
                        .map_err(SourceError::from)?;
                }
                admin::create_slot(&client, &target)
                    .await
                    .map_err(SourceError::from)?
            }
            (None, Some(refusal), SlotPlan::AsConfigured) => {
                return Err(SourceError::from(refusal).into())
            }
            (None, None, SlotPlan::AsConfigured) => admin::create_slot(&client, &target)
                .await
                .map_err(SourceError::from)?,
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
                messages: s.wants_messages(),
            })
            .await
            .map_err(SourceError::from)?;
        tracing::info!(slot = %s.slot, %start_lsn, "replication started");
        Ok(SourceSession {
            stream,
            decoder: Decoder::new(PROTO_VERSION),
            assembler: TransactionAssembler::new(&s.tables),
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
