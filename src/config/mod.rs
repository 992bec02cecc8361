//! Typed configuration, read from a TOML file (see `config/outboxd.toml` for
//! every key, its default and when to change it).
//!
//! Loading is: read the file, substitute `${ENV_VAR}` references (see
//! [`env`]), parse into [`Config`] (unknown keys are errors, missing keys take
//! their documented defaults), then [`Config::validate`]. Every error names
//! the full dotted key, or the line, and says what to change.

pub(crate) mod auto_register;
pub(crate) mod cloudevents;
pub(crate) mod conn_params;
pub(crate) mod env;
pub(crate) mod error;
pub(crate) mod kafka;
pub(crate) mod log;
pub(crate) mod metrics;
pub(crate) mod outbox;
pub(crate) mod outbox_tables;
pub(crate) mod overrides;
pub(crate) mod postgres;
mod redact;
pub(crate) mod relay;
pub(crate) mod routing;
pub(crate) mod schema_registry;
pub(crate) mod units;
pub(crate) mod value_format;

#[cfg(test)]
mod auto_register_tests;
#[cfg(test)]
mod env_tests;
#[cfg(test)]
mod outbox_tables_tests;
#[cfg(test)]
mod redact_tests;
#[cfg(test)]
mod registry_tls_tests;
#[cfg(test)]
mod routing_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod validate_tests;
#[cfg(test)]
mod value_format_tests;

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

pub use error::ConfigError;
pub use kafka::KafkaConfig;
pub use log::{LogConfig, LogFormat};
pub(crate) use metrics::MetricsConfig;
pub(crate) use outbox_tables::{OutboxSection, OutboxTable};
pub(crate) use overrides::Origin;

pub(crate) use postgres::PostgresConfig;
pub(crate) use relay::{DeliveryMode, OnError, RelayConfig};
pub(crate) use routing::RoutingConfig;
pub(crate) use schema_registry::SchemaRegistryConfig;

/// The whole configuration file. Every section may be omitted and then takes
/// its defaults; `postgres.url` is the one key without a default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub postgres: PostgresConfig,
    /// `[outbox]` or `[[outbox]]`; read it through [`Config::tables`].
    pub outbox: OutboxSection,
    pub kafka: KafkaConfig,
    pub routing: RoutingConfig,
    /// `[schema_registry]`: needed by the registry value formats only
    /// (an empty `url` means none).
    pub schema_registry: SchemaRegistryConfig,
    pub relay: RelayConfig,
    pub metrics: MetricsConfig,
    pub log: LogConfig,
}

impl Config {
    /// Reads, substitutes environment references, parses and validates the
    /// file at `path`, with the environment's `OUTBOXD_<SECTION>__<KEY>`
    /// variables applied over it ([`overrides`]). Only the `Io` error names
    /// the path; callers add it as context for the others (as `main` does),
    /// so it is not printed twice.
    #[cfg(test)]
    pub(crate) fn from_file(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        Config::load(Some(path.as_ref()))
    }

    /// As [`Config::from_file`], the file being optional: without one the
    /// environment has to supply every required key.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        Ok(Config::load_from(path, &process_env())?.config)
    }

    /// As [`Config::load`], with where each value came from (for `check`).
    pub(crate) fn load_with_origins(path: Option<&Path>) -> Result<Loaded, ConfigError> {
        Config::load_from(path, &process_env())
    }

    /// The configuration from the file at `path` (if any) and `vars` (the
    /// environment: `${...}` references and `OUTBOXD_..__..` keys), with
    /// where each value came from.
    pub(crate) fn load_from(
        path: Option<&Path>,
        vars: &[(String, String)],
    ) -> Result<Loaded, ConfigError> {
        let text = match path {
            Some(path) => std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
                path: path.to_owned(),
                source,
            })?,
            None => String::new(),
        };
        let lookup = |name: &str| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        let substituted = env::substitute_tracked(&text, lookup)?;
        let toml_error =
            |e: toml::de::Error| ConfigError::toml(&e, &substituted.text, &substituted.from_env);
        // The file alone first, so its errors quote its own lines.
        let from_file: Config = toml::from_str(&substituted.text).map_err(toml_error)?;
        let mut table: toml::Table = toml::from_str(&substituted.text).map_err(toml_error)?;
        let mut origins = BTreeMap::new();
        let mut file_values = BTreeMap::new();
        overrides::flatten("", &table, &mut file_values);
        for key in file_values.keys() {
            origins.insert(key.clone(), Origin::File);
        }
        let set = overrides::collect(vars.iter().map(|(k, v)| (k.as_str(), v.as_str())))?;
        let config = if set.is_empty() {
            from_file
        } else {
            for o in &set {
                overrides::apply(&mut table, o)?;
                // A whole table set at once replaces what the file had in it.
                origins.retain(|k, _| !k.starts_with(&format!("{}.", o.dotted())));
                let mut leaves = BTreeMap::new();
                match &o.value {
                    toml::Value::Table(t) => overrides::flatten(&o.dotted(), t, &mut leaves),
                    v => {
                        leaves.insert(o.dotted(), v.clone());
                    }
                }
                for key in leaves.into_keys() {
                    origins.insert(key, Origin::Env(o.var.clone()));
                }
            }
            // Rendered and parsed again, so an error names the key.
            let merged = toml::to_string(&table).map_err(|e| ConfigError::Parse {
                message: format!("cannot combine the file with the OUTBOXD_ variables: {e}"),
            })?;
            toml::from_str(&merged).map_err(|e| {
                let vars: Vec<&str> = set.iter().map(|o| o.var.as_str()).collect();
                let rendered = ConfigError::toml(&e, &merged, &[]);
                ConfigError::Parse {
                    message: format!(
                        "the configuration with the environment's {} does not fit: {rendered}",
                        vars.join(", ")
                    ),
                }
            })?
        };
        config.validate()?;
        let mut values = BTreeMap::new();
        overrides::flatten("", &table, &mut values);
        let mut settings: Vec<Setting> = values
            .into_iter()
            .map(|(key, value)| {
                let origin = origins.get(&key).cloned().unwrap_or(Origin::File);
                Setting::new(key, Some(&value), origin)
            })
            .collect();
        for (key, default) in overrides::documented_defaults() {
            // `outbox` set as `[[outbox]]` entries covers `outbox.table` etc.
            if !settings.iter().any(|s| {
                s.key == key
                    || s.key.starts_with(&format!("{key}."))
                    || key.starts_with(&format!("{}.", s.key))
            }) {
                settings.push(Setting::new(key.to_owned(), default, Origin::Default));
            }
        }
        settings.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(Loaded { config, settings })
    }

    /// Substitutes environment references from the process environment, then
    /// parses and validates `text`.
    #[cfg(test)]
    pub(crate) fn from_toml_str(text: &str) -> Result<Config, ConfigError> {
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
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        self.postgres.validate()?;
        self.outbox.validate(&self.routing)?;
        self.kafka.validate()?;
        self.validate_schema_registry()?;
        self.relay.validate()?;
        self.log.validate()?;
        Ok(())
    }

    /// `[schema_registry]` itself, and that it is there when a table's value
    /// format needs it.
    fn validate_schema_registry(&self) -> Result<(), ConfigError> {
        if self.schema_registry.is_configured() {
            self.schema_registry.validate()?;
        }
        let needs = self.outbox.tables(&self.routing).into_iter().find_map(|t| {
            t.routing
                .value_formats()
                .find(|(_, f)| f.uses_registry())
                .map(|(key, f)| (t.routing_key.clone(), key, f))
        });
        match needs {
            Some((routing_key, key, f)) if !self.schema_registry.is_configured() => {
                Err(ConfigError::invalid(
                    "schema_registry.url",
                    format!(
                        "is not set, and {}{} = \"{}\" takes its schemas from a schema \
                         registry; add [schema_registry] with url = \"http://registry:8081\"",
                        routing_key,
                        key.trim_start_matches("routing"),
                        f.as_str()
                    ),
                ))
            }
            _ => Ok(()),
        }
    }

    /// Every outbox table, with its columns and resolved routing, in the
    /// order configured (one for `[outbox]`).
    pub fn tables(&self) -> Vec<OutboxTable> {
        let database = conn_params::ConnParams::from_url(&self.postgres.url)
            .map(|p| p.dbname)
            .unwrap_or_default();
        let mut tables = self.outbox.tables(&self.routing);
        for t in &mut tables {
            t.database.clone_from(&database);
        }
        tables
    }

    /// [`Config::validate`] plus what only the relay needs: `kafka.brokers`.
    /// Subcommands that touch only PostgreSQL (e.g. dropping the slot) call
    /// `validate` alone, so they work from a config without Kafka settings.
    pub fn validate_for_relay(&self) -> Result<(), ConfigError> {
        self.validate()?;
        self.kafka.validate_for_relay()
    }
}

/// A configuration and where each of its values came from.
#[derive(Debug, Clone)]
pub(crate) struct Loaded {
    pub config: Config,
    /// Every key that is set, and every documented key left at its default,
    /// sorted by key.
    pub settings: Vec<Setting>,
}

/// One key of the effective configuration, for `outboxd check`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Setting {
    pub key: String,
    /// As TOML, secrets masked; `None` for a key with no default that is
    /// not set.
    pub value: Option<String>,
    pub origin: Origin,
}

impl Setting {
    fn new(key: String, value: Option<&toml::Value>, origin: Origin) -> Setting {
        let value = value.map(|v| {
            let line = format!("{key} = {v}");
            redact::mask_line(&line)[key.len() + 3..].to_owned()
        });
        Setting { key, value, origin }
    }
}

/// The process environment, as far as it is UTF-8 (a config value has to be
/// text; other variables cannot be references or keys).
fn process_env() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect()
}
