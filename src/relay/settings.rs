//! What a relay is configured with, derived once from the configuration
//! file.

use std::sync::Arc;

use crate::config::{Config, OnError};
use crate::metrics::Health;
use crate::source::session::SourceSettings;

/// Everything a relay needs, derived from the configuration file.
pub struct RelaySettings {
    pub source: SourceSettings,
    pub brokers: String,
    pub config: Config,
    pub dead_letter_topic: Option<Arc<str>>,
    /// Shared with the health endpoint: the relay reports into it.
    pub health: Arc<Health>,
    /// `outboxd run --accept-gap`: resume past a gap the position ledger
    /// names (once), recording the range in the ledger.
    pub accept_gap: bool,
}

impl RelaySettings {
    pub fn new(source: SourceSettings, config: Config) -> RelaySettings {
        let brokers = config.kafka.brokers.clone().unwrap_or_default();
        let dead_letter_topic = match config.relay.on_error {
            OnError::DeadLetter => config.relay.dead_letter_topic.as_deref().map(Arc::from),
            OnError::Stop => None,
        };
        RelaySettings {
            source,
            brokers,
            health: Arc::new(Health::new(&config)),
            config,
            dead_letter_topic,
            accept_gap: false,
        }
    }
}
