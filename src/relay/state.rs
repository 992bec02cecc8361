//! What outlives a session: owned by [`run`](super::run), lent to each
//! session in turn ([`Lent`]).

use std::time::Duration;

use tokio::sync::watch;

use super::error::RelayError;
use super::ledger::RelayLedger;
use super::session::{self, Lent, PoisonMemory, SessionEnd, DEAD_LETTER_REASONS};
use super::settings::RelaySettings;
use super::slot_record::SlotRecord;
use super::table_watch::TableBaseline;
use super::telemetry::{RelayEvent, RelayTelemetry};
use crate::outbox::registered::SchemaSet;
use crate::outbox::TableMappers;
use crate::registry::SchemaRegistry;
use crate::source::admin;
use crate::source::error::SourceError;

pub(super) struct RelayState {
    mapper: TableMappers,
    /// For the schema ids framed payloads name and the subjects met first
    /// at run time (`None` when no table uses a registry value format).
    registry: Option<SchemaRegistry>,
    /// The verdicts on poison events, which outlive a reconnect.
    poison: PoisonMemory,
    /// Opened before the first session, again after a failure that
    /// reconnecting may fix (Kafka unreachable at start).
    ledger: Option<RelayLedger>,
    /// What the sessions found of the slot: the relay's decisions are made
    /// from it, not from the health endpoint's state.
    pub(super) slot: SlotRecord,
    /// The outbox tables as the first session found them.
    tables: TableBaseline,
    /// Turns true when a shutdown is asked for.
    pub(super) stop: watch::Receiver<bool>,
}

impl RelayState {
    pub(super) fn new(
        settings: &RelaySettings,
        schemas: &SchemaSet,
        stop: watch::Receiver<bool>,
    ) -> Result<Self, RelayError> {
        let tables = settings.config.tables();
        let registry = if tables.iter().any(|t| t.routing.uses_registry()) {
            Some(SchemaRegistry::new(&settings.config.schema_registry)?)
        } else {
            None
        };
        Ok(RelayState {
            mapper: TableMappers::with_schemas(&tables, schemas)?,
            registry,
            poison: PoisonMemory::default(),
            ledger: None,
            slot: SlotRecord::new(),
            tables: TableBaseline::default(),
            stop,
        })
    }

    pub(super) fn tell_start(&self, settings: &RelaySettings, telemetry: &RelayTelemetry) {
        telemetry.emit(RelayEvent::Starting {
            config: &settings.config,
            mappers: &self.mapper,
            dead_letter_reasons: &DEAD_LETTER_REASONS,
        });
    }

    /// Runs one session, opening the position ledger first if it is not
    /// open yet.
    pub(super) async fn session(
        &mut self,
        settings: &RelaySettings,
    ) -> Result<SessionEnd, RelayError> {
        let ledger = match &mut self.ledger {
            Some(ledger) => ledger,
            None => {
                // PostgreSQL first: a wrong password or a missing privilege
                // must be reported as such (and stop the relay) even while
                // Kafka is unreachable too.
                let client = admin::connect_sql(&settings.source.conn)
                    .await
                    .map_err(SourceError::from)?;
                admin::preflight(&client).await.map_err(SourceError::from)?;
                drop(client);
                self.ledger.insert(RelayLedger::open(settings).await?)
            }
        };
        let lent = Lent {
            mapper: &mut self.mapper,
            registry: &mut self.registry,
            poison: &mut self.poison,
            ledger,
            slot: &mut self.slot,
            tables: &mut self.tables,
            stop: self.stop.clone(),
        };
        session::run(settings, lent).await
    }

    /// After a session: whether it had streamed the slot (from then on, a
    /// missing slot is a lost one).
    pub(super) fn session_ended(&mut self) -> bool {
        let streamed = self.slot.session_ended();
        if streamed {
            if let Some(ledger) = &mut self.ledger {
                ledger.streaming();
            }
        }
        streamed
    }

    /// Another instance released the slot, which this one takes over.
    pub(super) fn taking_over(&mut self) {
        if let Some(ledger) = &mut self.ledger {
            ledger.taking_over();
        }
        self.tables.forget();
    }

    /// Waits `wait`, or less if a shutdown is asked for meanwhile (true).
    pub(super) async fn stopped_within(&self, wait: Duration) -> bool {
        let mut stop = self.stop.clone();
        tokio::select! {
            _ = tokio::time::sleep(wait) => false,
            _ = stop.wait_for(|s| *s) => true,
        }
    }
}
