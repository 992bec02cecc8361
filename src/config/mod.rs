//! Typed configuration, read from a TOML file (see `config/outboxd.toml` for
//! every key, its default and when to change it).
//!
//! Loading is: read the file, substitute `${ENV_VAR}` references (see
//! [`env`]), parse into [`Config`] (unknown keys are errors, missing keys take
//! their documented defaults), then [`Config::validate`]. Every error names
//! the full dotted key, or the line, and says what to change.

pub mod env;
pub mod error;
pub mod kafka;
pub mod log;
pub mod metrics;
pub mod outbox;
pub mod postgres;
mod redact;
pub mod relay;
pub mod routing;
pub mod units;

#[cfg(test)]
mod env_tests;
#[cfg(test)]
mod redact_tests;
#[cfg(test)]
mod routing_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod validate_tests;

use std::path::Path;

use serde::Deserialize;

pub use error::ConfigError;
pub use kafka::KafkaConfig;
pub use log::{LogConfig, LogFormat};
pub use metrics::MetricsConfig;
pub use outbox::{ColumnsConfig, OutboxConfig};
pub use postgres::{PasswordSource, PostgresConfig};
pub use relay::{OnError, RelayConfig};
pub use routing::{RoutingConfig, RoutingRule, TemplatePart, ValueFormat};

/// The whole configuration file. Every section may be omitted and then takes
/// its defaults; `postgres.url` is the one key without a default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub postgres: PostgresConfig,
    pub outbox: OutboxConfig,
    pub kafka: KafkaConfig,
    pub routing: RoutingConfig,
    pub relay: RelayConfig,
    pub metrics: MetricsConfig,
    pub log: LogConfig,
}

impl Config {
    /// Reads, substitutes environment references, parses and validates the
    /// file at `path`. Only the `Io` error names the path; callers add it as
    /// context for the others (as `main` does), so it is not printed twice.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_owned(),
            source,
        })?;
        Config::from_toml_str(&text)
    }

    /// Substitutes environment references from the process environment, then
    /// parses and validates `text`.
    pub fn from_toml_str(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml_str_with_env(text, |name| std::env::var(name).ok())
    }

    /// As [`Config::from_toml_str`], looking variables up with `lookup`
    /// instead of the process environment.
    pub fn from_toml_str_with_env<F>(text: &str, lookup: F) -> Result<Config, ConfigError>
    where
        F: FnMut(&str) -> Option<String>,
    {
        let substituted = env::substitute_tracked(text, lookup)?;
        let config: Config = toml::from_str(&substituted.text)
            .map_err(|e| ConfigError::toml(&e, &substituted.text, &substituted.from_env))?;
        config.validate()?;
        Ok(config)
    }

    /// Checks everything that can be checked without connecting anywhere.
    /// Stops at the first problem, which is named by its dotted key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.postgres.validate()?;
        self.outbox.validate()?;
        self.kafka.validate()?;
        self.routing.validate(&self.outbox.columns)?;
        self.relay.validate()?;
        self.log.validate()?;
        Ok(())
    }

    /// [`Config::validate`] plus what only the relay needs: `kafka.brokers`.
    /// Subcommands that touch only PostgreSQL (e.g. dropping the slot) call
    /// `validate` alone, so they work from a config without Kafka settings.
    pub fn validate_for_relay(&self) -> Result<(), ConfigError> {
        self.validate()?;
        self.kafka.validate_for_relay()
    }
}
