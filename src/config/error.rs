//! The one error type of configuration loading. Every variant carries enough
//! to act on without reading the source: the file, the variable and line, or
//! the full dotted key and what to change.

use std::ops::Range;
use std::path::PathBuf;

use crate::config::redact;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file (or `postgres.password_file`) could not be read. The
    /// cause is left to the error chain (`{:#}` in anyhow) so it is not printed
    /// twice.
    #[error("cannot read {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The text is not valid TOML or does not fit the schema. The message
    /// names the offending key and shows the line, with any secret on it
    /// masked ([`ConfigError::toml`]).
    #[error("{message}")]
    Parse { message: String },

    /// `${NAME}` without a default refers to an unset environment variable.
    #[error(
        "environment variable {name} (referenced on line {line}) is not set; \
         export it, or write ${{{name}:-default}} to give a fallback"
    )]
    MissingEnv { name: String, line: usize },

    /// A value parsed but is not acceptable. `key` is the full dotted key, e.g.
    /// `postgres.slot` or `routing.rules[2].topic`; `reason` says what to change.
    #[error("{key}: {reason}")]
    Invalid { key: String, reason: String },
}

impl ConfigError {
    /// Shorthand used by the validators, which build many of these.
    pub(crate) fn invalid(key: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError::Invalid {
            key: key.into(),
            reason: reason.into(),
        }
    }

    /// The dotted key this error is about, for `Invalid` errors.
    #[cfg(test)]
    pub(crate) fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { key, .. } => Some(key),
            _ => None,
        }
    }
}

impl ConfigError {
    /// A TOML error from parsing `text`, shown like toml shows it but with
    /// the secrets on the quoted line masked. `from_env` are the byte ranges
    /// of `text` substituted from the environment. (No `From` impl: toml's
    /// own rendering would print the line as it is.)
    pub(crate) fn toml(e: &toml::de::Error, text: &str, from_env: &[Range<usize>]) -> Self {
        ConfigError::Parse {
            message: redact::toml_error(e, text, from_env),
        }
    }
}
