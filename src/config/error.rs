//! The one error type of configuration loading. Every variant carries enough
//! to act on without reading the source: the file, the variable and line, or
//! the full dotted key and what to change.

use std::path::PathBuf;

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

    /// The text is not valid TOML or does not fit the schema. toml's message
    /// already names the offending key and shows the line, so it is kept whole.
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
    pub fn invalid(key: impl Into<String>, reason: impl Into<String>) -> Self {
        ConfigError::Invalid {
            key: key.into(),
            reason: reason.into(),
        }
    }

    /// The dotted key this error is about, for `Invalid` errors.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Invalid { key, .. } => Some(key),
            _ => None,
        }
    }
}

impl From<toml::de::Error> for ConfigError {
    fn from(e: toml::de::Error) -> Self {
        ConfigError::Parse {
            message: e.to_string().trim_end().to_owned(),
        }
    }
}
