//! The registered schemas of the registry value formats, fetched once
//! before the first session: the mappers are built with them, so no event
//! waits on the registry. A registry that cannot be reached is asked again
//! with the reconnect backoff (nothing is read from the slot meanwhile);
//! any other answer (wrong credentials, a subject or version that does not
//! exist, a schema that does not parse) stops the relay naming the setting.

use tokio::sync::watch;

use crate::outbox::registered::SchemaSet;
use crate::registry::{RegistryError, SchemaRegistry};
use crate::relay::settings::RelaySettings;

/// The schemas every table needs (empty when none uses a registry value
/// format), or `None` when asked to stop while waiting for the registry.
pub(super) async fn fetch(
    settings: &RelaySettings,
    stop: &watch::Receiver<bool>,
) -> Result<Option<SchemaSet>, RegistryError> {
    let tables = settings.config.tables();
    if !tables.iter().any(|t| t.routing.uses_registry()) {
        return Ok(Some(SchemaSet::new()));
    }
    let relay = &settings.config.relay;
    let mut registry = SchemaRegistry::new(&settings.config.schema_registry)?;
    let mut backoff = relay.reconnect_backoff_min;
    loop {
        match registry.schemas_for(&tables).await {
            Ok(set) => return Ok(Some(set)),
            Err(e) if e.is_retryable() => {
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
