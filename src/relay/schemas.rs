//! The registered schemas of the registry value formats: fetched once
//! before the first session (the mappers are built with them, so no event
//! waits on the registry), then, for the subjects that follow `latest`,
//! read again every `schema_registry.refresh_interval` by a task of their
//! own ([`Refresh`]), whose finds the relay's mapper takes between events.
//!
//! A registry that cannot be reached is asked again with the reconnect
//! backoff (nothing is read from the slot meanwhile) and makes `/readyz`
//! 503 naming it until it answers; any other answer at start (wrong
//! credentials, a subject or version that does not exist, a schema that
//! does not parse) stops the relay naming the setting. Before the schemas
//! are read, the routes with `routing.auto_register` register their
//! `routing.schema_file` (development only).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Mutex};
use tokio::task::JoinHandle;

use crate::config::value_format::SchemaVersion;
use crate::metrics::Health;
use crate::outbox::registered::{RegisteredSchema, SchemaSet};
use crate::registry::{RegistryError, SchemaRegistry};
use crate::relay::settings::RelaySettings;

/// The registry, shared by the refresh task and the relay's mapper (which
/// asks it when a payload does not fit a `latest` subject's schema).
pub(super) type SharedRegistry = Arc<Mutex<SchemaRegistry>>;

/// The newest version of each `latest` subject the refresh task has seen.
pub(super) type LatestSchemas = Vec<Arc<RegisteredSchema>>;

/// The subjects that follow `latest`: those fetched at start, and those
/// the relay's mapper meets first at run time (a per-event subject), so the
/// refresh task reads them all.
pub(super) type LatestSubjects = Arc<std::sync::Mutex<BTreeSet<String>>>;

/// What the relay starts with.
pub(super) struct Fetched {
    pub(super) schemas: SchemaSet,
    /// `None` when no table uses a registry value format.
    pub(super) registry: Option<SharedRegistry>,
}

/// The schemas every table needs, or `None` when asked to stop while
/// waiting for the registry.
pub(super) async fn fetch(
    settings: &RelaySettings,
    stop: &watch::Receiver<bool>,
) -> Result<Option<Fetched>, RegistryError> {
    let tables = settings.config.tables();
    if !tables.iter().any(|t| t.routing.uses_registry()) {
        return Ok(Some(Fetched {
            schemas: SchemaSet::new(),
            registry: None,
        }));
    }
    let relay = &settings.config.relay;
    let mut registry = SchemaRegistry::new(&settings.config.schema_registry)?;
    let mut backoff = relay.reconnect_backoff_min;
    loop {
        // `routing.auto_register` first, so the subjects it creates are
        // there to be read; asked again with the rest after an outage.
        let fetched = match registry.auto_register(&tables).await {
            Ok(()) => registry.schemas_for(&tables).await,
            Err(e) => Err(e),
        };
        match fetched {
            Ok(schemas) => {
                settings.health.registry_up();
                return Ok(Some(Fetched {
                    schemas,
                    registry: Some(Arc::new(Mutex::new(registry))),
                }));
            }
            Err(e) if e.is_retryable() => {
                settings.health.registry_down(&e.to_string());
                tracing::warn!(error = %e, ?backoff, "asking the schema registry again");
                let mut stop = stop.clone();
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.wait_for(|s| *s) => return Ok(None),
                }
                backoff = (backoff * 2).min(relay.reconnect_backoff_max);
            }
            Err(e) => return Err(e),
        }
    }
}

/// The task that reads the `latest` subjects again; stopped when dropped.
pub(super) struct Refresh {
    task: Option<JoinHandle<()>>,
}

impl Refresh {
    /// No task: no table follows a `latest` subject of a registry.
    pub(super) fn none() -> Refresh {
        Refresh { task: None }
    }

    /// Starts reading the `latest` subjects every
    /// `schema_registry.refresh_interval` (none: no task, nor when no table
    /// follows `latest`), telling what it finds on `found`.
    pub(super) fn start(
        settings: &RelaySettings,
        registry: &SharedRegistry,
        subjects: &LatestSubjects,
        found: watch::Sender<LatestSchemas>,
    ) -> Refresh {
        let every = settings.config.schema_registry.refresh_interval;
        let follows_latest = settings.config.tables().iter().any(|t| {
            t.routing.uses_registry() && t.routing.schema_version == SchemaVersion::Latest
        });
        if every.is_zero() || !follows_latest {
            return Refresh { task: None };
        }
        let task = tokio::spawn(refresh_loop(
            registry.clone(),
            subjects.clone(),
            every,
            settings.health.clone(),
            found,
        ));
        Refresh { task: Some(task) }
    }
}

impl Drop for Refresh {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

async fn refresh_loop(
    registry: SharedRegistry,
    subjects: LatestSubjects,
    every: Duration,
    health: Arc<Health>,
    found: watch::Sender<LatestSchemas>,
) {
    loop {
        tokio::time::sleep(every).await;
        let subjects: Vec<String> = subjects
            .lock()
            .expect("no panic while holding the subjects")
            .iter()
            .cloned()
            .collect();
        let mut newest = Vec::with_capacity(subjects.len());
        for subject in &subjects {
            let answer = registry
                .lock()
                .await
                .resolve(subject, SchemaVersion::Latest)
                .await;
            match answer {
                Ok(schema) => {
                    health.registry_up();
                    newest.push(schema);
                }
                Err(e) if e.is_retryable() => {
                    health.registry_down(&e.to_string());
                    break;
                }
                // A subject deleted meanwhile, or credentials revoked: the
                // cached schema goes on encoding; a payload that does not
                // fit it will stop the relay with this cause.
                Err(e) => {
                    tracing::warn!(%subject, error = %e, "cannot read the subject's latest version")
                }
            }
        }
        found.send_if_modified(|current| {
            let ids = |l: &LatestSchemas| l.iter().map(|s| s.id).collect::<Vec<_>>();
            let changed = !newest.is_empty() && ids(current) != ids(&newest);
            if changed {
                *current = std::mem::take(&mut newest);
            }
            changed
        });
    }
}
