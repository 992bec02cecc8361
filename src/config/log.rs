//! `[log]`: output format and verbosity of the process log.

use serde::Deserialize;

use crate::config::error::ConfigError;

/// `info` logs lifecycle events (connect, slot created, shutdown) without a
/// line per relayed event.
pub(crate) const DEFAULT_LEVEL: &str = "info";
const PLAIN_LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    pub format: LogFormat,
    /// A level (`info`) or a tracing filter directive (`info,outboxd=debug`);
    /// The `OUTBOXD_LOG` environment variable, when set, takes precedence.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::default(),
            level: DEFAULT_LEVEL.to_owned(),
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// Human-readable lines: the right thing at a terminal.
    #[default]
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

impl LogConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let level = self.level.trim();
        // Directives (`a=b`, `x,y`) are checked by the log setup, which has the
        // real parser; catch only the common typo of a misspelt plain level.
        let directive = level.contains(['=', ',', ':', '[']);
        if level.is_empty()
            || (!directive && !PLAIN_LEVELS.contains(&level.to_ascii_lowercase().as_str()))
        {
            return Err(ConfigError::invalid(
                "log.level",
                format!(
                    "`{}` is not a level; use one of {} or a filter such as \"info,outboxd=debug\"",
                    self.level,
                    PLAIN_LEVELS.join(", ")
                ),
            ));
        }
        Ok(())
    }
}
