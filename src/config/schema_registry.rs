//! `[schema_registry]`: where the schemas of the Avro value format come from.
//! Any registry speaking Confluent's REST API will do (Confluent Schema
//! Registry, Apicurio's `/apis/ccompat/v7`, Karapace, Redpanda).

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::config::error::ConfigError;
use crate::config::units::de_duration;

/// Long enough for a registry under load or across a region, short enough
/// that a dead one is noticed before the relay's own timeouts matter.
pub(crate) const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// How often the `latest` subjects are asked for a newer version: a new
/// version is in use within this long, at one request per subject per
/// interval (nothing per event). Confluent's serializers cache `latest` for
/// about as long when told to use it.
pub(crate) const DEFAULT_REFRESH_INTERVAL: Duration = Duration::from_secs(30);

#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SchemaRegistryConfig {
    /// One or more base URLs, comma-separated, tried in turn; "" = no
    /// registry.
    pub url: String,
    /// Basic auth user; set together with `password`.
    pub username: Option<String>,
    /// Basic auth password, usually `${VAR}` from the environment.
    pub password: Option<String>,
    /// PEM file of the CA certificates to trust for `https://` URLs; unset:
    /// the CA file must be given for https (no system store is read).
    pub ca_file: Option<PathBuf>,
    /// PEM file of the client certificate (chain) for mutual TLS; set
    /// together with `key_file`.
    pub cert_file: Option<PathBuf>,
    /// PEM file of the client certificate's private key.
    pub key_file: Option<PathBuf>,
    #[serde(deserialize_with = "de_duration")]
    pub request_timeout: Duration,
    /// How often subjects used at `routing.schema_version = "latest"` are
    /// read again for a newer version; "0s" = only when a payload does not
    /// fit.
    #[serde(deserialize_with = "de_duration")]
    pub refresh_interval: Duration,
}

impl Default for SchemaRegistryConfig {
    fn default() -> Self {
        SchemaRegistryConfig {
            url: String::new(),
            username: None,
            password: None,
            ca_file: None,
            cert_file: None,
            key_file: None,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            refresh_interval: DEFAULT_REFRESH_INTERVAL,
        }
    }
}

/// The password never reaches a log line or a panic message.
impl fmt::Debug for SchemaRegistryConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SchemaRegistryConfig")
            .field("url", &self.url)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            // Only where the key is; the path alone says little, but a
            // dump of the config has no reason to carry it either.
            .field("key_file", &self.key_file.as_ref().map(|_| "***"))
            .field("request_timeout", &self.request_timeout)
            .field("refresh_interval", &self.refresh_interval)
            .finish()
    }
}

impl SchemaRegistryConfig {
    /// A registry is configured (a `url` is set).
    pub(crate) fn is_configured(&self) -> bool {
        !self.urls().is_empty()
    }

    /// The base URLs, in the order to try them, without trailing slashes.
    pub(crate) fn urls(&self) -> Vec<&str> {
        self.url
            .split(',')
            .map(|u| u.trim().trim_end_matches('/'))
            .filter(|u| !u.is_empty())
            .collect()
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let urls = self.urls();
        if urls.is_empty() {
            return Err(ConfigError::invalid(
                "schema_registry.url",
                "must name the registry, e.g. \"http://registry:8081\" (several: comma-separated)",
            ));
        }
        for u in &urls {
            let parsed = url::Url::parse(u).map_err(|e| {
                ConfigError::invalid("schema_registry.url", format!("`{u}` is not a URL: {e}"))
            })?;
            match parsed.scheme() {
                "http" => {}
                "https" if self.ca_file.is_some() => {}
                "https" => {
                    return Err(ConfigError::invalid(
                        "schema_registry.ca_file",
                        format!(
                            "must name the PEM file of the CA that signed {u}'s certificate \
                             (no system trust store is read)"
                        ),
                    ))
                }
                s => {
                    return Err(ConfigError::invalid(
                        "schema_registry.url",
                        format!("`{u}`: scheme `{s}` is not http or https"),
                    ))
                }
            }
            if !parsed.username().is_empty() || parsed.password().is_some() {
                return Err(ConfigError::invalid(
                    "schema_registry.url",
                    "holds credentials; set schema_registry.username and \
                     schema_registry.password (= \"${VAR}\") instead",
                ));
            }
        }
        if self.username.is_some() != self.password.is_some() {
            return Err(ConfigError::invalid(
                if self.username.is_some() {
                    "schema_registry.password"
                } else {
                    "schema_registry.username"
                },
                "basic auth needs both schema_registry.username and schema_registry.password",
            ));
        }
        if self.cert_file.is_some() != self.key_file.is_some() {
            return Err(ConfigError::invalid(
                if self.cert_file.is_some() {
                    "schema_registry.key_file"
                } else {
                    "schema_registry.cert_file"
                },
                "mutual TLS needs both schema_registry.cert_file (the client certificate) and \
                 schema_registry.key_file (its private key), PEM files",
            ));
        }
        if self.request_timeout.is_zero() {
            return Err(ConfigError::invalid(
                "schema_registry.request_timeout",
                "must be more than 0, e.g. \"10s\"",
            ));
        }
        Ok(())
    }
}
