//! `[postgres]`: where to connect and which slot/publication to stream from.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::config::error::ConfigError;
use crate::config::units::de_duration;

/// Slot name used when none is configured: one relay per database is the
/// common case, and naming the slot after the tool makes it easy to find in
/// `pg_replication_slots`.
pub(crate) const DEFAULT_SLOT: &str = "outboxd";
/// Publication name default; same reasoning as [`DEFAULT_SLOT`].
pub(crate) const DEFAULT_PUBLICATION: &str = "outboxd";
/// How often standby status updates are sent. 1s keeps the server's view of
/// our progress fresh (WAL can be recycled promptly) at negligible cost, and
/// is well under the default `wal_sender_timeout` of 60s.
pub(crate) const DEFAULT_STATUS_INTERVAL: Duration = Duration::from_secs(1);
/// Connection timeout. 10s tolerates a slow TLS handshake across regions but
/// still fails fast enough for an orchestrator to notice a dead database.
pub(crate) const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the replication stream may stay silent before the link is
/// presumed dead. Silence is broken on purpose (a status update asking for a
/// reply after a third of this), so only a dead link or server stays silent
/// this long; 30 s is half the server's default wal_sender_timeout.
pub(crate) const DEFAULT_STREAM_TIMEOUT: Duration = Duration::from_secs(30);
/// PostgreSQL truncates identifiers to NAMEDATALEN-1 = 63 bytes.
pub(crate) const MAX_IDENTIFIER_BYTES: usize = 63;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PostgresConfig {
    /// libpq-style URL (`postgresql://user@host:port/db?sslmode=...`). Kept as
    /// text: the connector parses it. Required.
    pub url: String,
    /// Environment variable holding the password.
    pub password_env: Option<String>,
    /// File holding the password; one trailing newline is trimmed.
    pub password_file: Option<PathBuf>,
    pub slot: String,
    pub publication: String,
    pub create_slot: bool,
    pub create_publication: bool,
    /// PostgreSQL 17+: create the slot with FAILOVER (or alter an existing
    /// one), so a standby with `sync_replication_slots = on` keeps a copy
    /// that survives its promotion.
    pub failover_slot: bool,
    #[serde(deserialize_with = "de_duration")]
    pub status_interval: Duration,
    #[serde(deserialize_with = "de_duration")]
    pub connect_timeout: Duration,
    #[serde(deserialize_with = "de_duration")]
    pub stream_timeout: Duration,
}

impl Default for PostgresConfig {
    fn default() -> Self {
        PostgresConfig {
            url: String::new(),
            password_env: None,
            password_file: None,
            slot: DEFAULT_SLOT.to_owned(),
            publication: DEFAULT_PUBLICATION.to_owned(),
            create_slot: true,
            create_publication: true,
            failover_slot: false,
            status_interval: DEFAULT_STATUS_INTERVAL,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            stream_timeout: DEFAULT_STREAM_TIMEOUT,
        }
    }
}

/// Where the password comes from; at most one source may be configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PasswordSource<'a> {
    /// No password configured (trust, peer, or client-certificate auth).
    None,
    /// Embedded in `postgres.url` (userinfo or `?password=`).
    Url,
    Env(&'a str),
    File(&'a Path),
}

impl PostgresConfig {
    pub(crate) fn password_source(&self) -> PasswordSource<'_> {
        if let Some(name) = &self.password_env {
            PasswordSource::Env(name)
        } else if let Some(path) = &self.password_file {
            PasswordSource::File(path)
        } else if url_has_password(&self.url) {
            PasswordSource::Url
        } else {
            PasswordSource::None
        }
    }

    /// Reads the password from `password_env` or `password_file`. Returns
    /// `None` when the password is in the URL or there is none: the URL parser
    /// handles the former. Read at start to refuse a missing file at once; the
    /// connections read `password_file` again at each connect (see
    /// `ConnParams::current_password`), so a rotated password is picked up.
    pub(crate) fn resolve_password(&self) -> Result<Option<String>, ConfigError> {
        match self.password_source() {
            PasswordSource::Env(name) => std::env::var(name).map(Some).map_err(|_| {
                ConfigError::invalid(
                    "postgres.password_env",
                    format!("environment variable {name} is not set (or not UTF-8); export it or remove postgres.password_env"),
                )
            }),
            PasswordSource::File(path) => crate::config::conn_params::read_password_file(path)
                .map(Some)
                .map_err(|source| ConfigError::Io {
                    path: path.to_owned(),
                    source,
                }),
            PasswordSource::Url | PasswordSource::None => Ok(None),
        }
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.url.trim().is_empty() {
            return Err(ConfigError::invalid(
                "postgres.url",
                "required; set it to a libpq-style URL such as \"postgresql://outboxd@127.0.0.1:5432/app\"",
            ));
        }
        if !(self.url.starts_with("postgresql://") || self.url.starts_with("postgres://")) {
            return Err(ConfigError::invalid(
                "postgres.url",
                "must start with postgresql:// or postgres:// (key=value connection strings are not supported)",
            ));
        }
        let mut sources = Vec::new();
        if url_has_password(&self.url) {
            sources.push("a password in postgres.url");
        }
        if self.password_env.is_some() {
            sources.push("postgres.password_env");
        }
        if self.password_file.is_some() {
            sources.push("postgres.password_file");
        }
        if sources.len() > 1 {
            let key = if self.password_env.is_some() {
                "postgres.password_env"
            } else {
                "postgres.password_file"
            };
            return Err(ConfigError::invalid(
                key,
                format!(
                    "the password is given by more than one of: {}; keep exactly one",
                    sources.join(", ")
                ),
            ));
        }
        if self
            .password_env
            .as_deref()
            .is_some_and(|n| n.trim().is_empty())
        {
            return Err(ConfigError::invalid(
                "postgres.password_env",
                "is empty; name an environment variable or remove the key",
            ));
        }
        if self
            .password_file
            .as_deref()
            .is_some_and(|p| p.as_os_str().is_empty())
        {
            return Err(ConfigError::invalid(
                "postgres.password_file",
                "is empty; give a path or remove the key",
            ));
        }
        validate_slot_name(&self.slot)?;
        if self.publication.is_empty() || self.publication.len() > MAX_IDENTIFIER_BYTES {
            return Err(ConfigError::invalid(
                "postgres.publication",
                format!(
                    "must be 1 to {MAX_IDENTIFIER_BYTES} bytes long, got {}",
                    self.publication.len()
                ),
            ));
        }
        for (key, d) in [
            ("postgres.status_interval", self.status_interval),
            ("postgres.connect_timeout", self.connect_timeout),
            ("postgres.stream_timeout", self.stream_timeout),
        ] {
            if d.is_zero() {
                return Err(ConfigError::invalid(
                    key,
                    "must be greater than zero, e.g. \"1s\"",
                ));
            }
        }
        if self.stream_timeout < Duration::from_secs(3) {
            return Err(ConfigError::invalid(
                "postgres.stream_timeout",
                "must be at least \"3s\": a shorter one declares a busy but healthy link dead",
            ));
        }
        Ok(())
    }
}

/// PostgreSQL only accepts lower-case letters, digits and underscores in
/// replication slot names, up to 63 bytes.
fn validate_slot_name(slot: &str) -> Result<(), ConfigError> {
    let ok_chars = slot
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if slot.is_empty() || slot.len() > MAX_IDENTIFIER_BYTES || !ok_chars {
        return Err(ConfigError::invalid(
            "postgres.slot",
            format!(
                "`{slot}` is not a valid replication slot name; use 1 to {MAX_IDENTIFIER_BYTES} \
                 lower-case letters, digits or underscores, e.g. \"{DEFAULT_SLOT}\""
            ),
        ));
    }
    Ok(())
}

/// Whether a libpq URL carries a password, in the userinfo (`user:pw@`) or as a
/// `password=` query parameter. Done by hand rather than with `url::Url`,
/// which rejects libpq's multi-host form (`host1:5432,host2:5432`).
pub(crate) fn url_has_password(url: &str) -> bool {
    let Some((_, rest)) = url.split_once("://") else {
        return false;
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    if let Some((userinfo, _)) = authority.rsplit_once('@') {
        if userinfo.contains(':') {
            return true;
        }
    }
    let Some((_, query)) = rest.split_once('?') else {
        return false;
    };
    let query = query.split('#').next().unwrap_or("");
    url::form_urlencoded::parse(query.as_bytes()).any(|(k, _)| k == "password")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_passwords_in_urls() {
        assert!(url_has_password("postgresql://u:pw@h/db"));
        assert!(url_has_password(
            "postgresql://u@h/db?sslmode=require&password=x"
        ));
        assert!(url_has_password("postgres://u:p%40w@h1:5432,h2:5432/db"));
        assert!(!url_has_password("postgresql://u@h:5432/db"));
        assert!(!url_has_password(
            "postgresql://h:5432/db?sslmode=verify-full"
        ));
        assert!(!url_has_password("postgresql:///db?host=/run/postgresql"));
    }

    #[test]
    fn password_file_trailing_newline_trimmed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        std::fs::write(&path, "s3cret \n").unwrap();
        let cfg = PostgresConfig {
            url: "postgresql://u@h/db".into(),
            password_file: Some(path.clone()),
            ..Default::default()
        };
        assert_eq!(cfg.resolve_password().unwrap().as_deref(), Some("s3cret "));
        std::fs::write(&path, "a\r\n").unwrap();
        assert_eq!(cfg.resolve_password().unwrap().as_deref(), Some("a"));
        let missing = PostgresConfig {
            password_file: Some(dir.path().join("nope")),
            ..cfg
        };
        assert!(matches!(
            missing.resolve_password(),
            Err(ConfigError::Io { .. })
        ));
    }
}
