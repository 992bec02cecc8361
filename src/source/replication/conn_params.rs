//! Connection settings from a libpq-style URL.
//!
//! One parser feeds both connections (the walsender one, which is ours, and the
//! tokio-postgres SQL one) so they can never disagree about host, user or TLS.

use std::path::PathBuf;
use std::time::Duration;

use percent_encoding::percent_decode_str;

/// libpq's `sslmode`, minus `allow` (which only makes sense for a fallback we
/// never want: a CDC connector should not silently drop to plain text).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    Disable,
    /// libpq's default: TLS if the server offers it, without verification.
    #[default]
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl std::fmt::Display for SslMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        })
    }
}

impl SslMode {
    fn parse(s: &str) -> Result<Self, ConnParamsError> {
        Ok(match s {
            "disable" => SslMode::Disable,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            other => {
                return Err(ConnParamsError::Invalid(format!(
                    "sslmode={other:?} is not supported; use disable, prefer, require, verify-ca or verify-full"
                )))
            }
        })
    }
}

/// TCP keepalive probes (libpq's `keepalives*` parameters). The defaults
/// notice a silent peer on an idle connection within idle + interval *
/// count = 25 s, where the kernel's own (2 h idle) would take hours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keepalive {
    pub enabled: bool,
    pub idle: Duration,
    pub interval: Duration,
    pub count: u32,
}

impl Default for Keepalive {
    fn default() -> Self {
        Keepalive {
            enabled: true,
            idle: Duration::from_secs(10),
            interval: Duration::from_secs(5),
            count: 3,
        }
    }
}

/// `TCP_USER_TIMEOUT` when the URL sets none: data sent and unacknowledged
/// for this long ends the connection, instead of the ~15 min of
/// retransmissions Linux would otherwise try.
pub const DEFAULT_TCP_USER_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnParams {
    pub host: String,
    pub port: u16,
    pub user: String,
    pub password: Option<String>,
    pub dbname: String,
    pub sslmode: SslMode,
    pub sslrootcert: Option<PathBuf>,
    pub connect_timeout: Option<Duration>,
    pub application_name: String,
    pub keepalive: Keepalive,
    /// `None`: the system default (libpq's `tcp_user_timeout=0`).
    pub tcp_user_timeout: Option<Duration>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConnParamsError {
    #[error("postgres.url is not a valid PostgreSQL URL: {0}")]
    Invalid(String),
}

impl ConnParams {
    /// Parses `postgresql://user:password@host:port/dbname?sslmode=...`.
    pub fn from_url(text: &str) -> Result<Self, ConnParamsError> {
        let url = url::Url::parse(text).map_err(|e| ConnParamsError::Invalid(e.to_string()))?;
        if url.scheme() != "postgresql" && url.scheme() != "postgres" {
            return Err(ConnParamsError::Invalid(format!(
                "scheme {:?}: expected postgresql://",
                url.scheme()
            )));
        }
        let decode = |s: &str| percent_decode_str(s).decode_utf8_lossy().into_owned();
        let host = match url.host_str() {
            Some(h) if !h.is_empty() => h.trim_start_matches('[').trim_end_matches(']').to_string(),
            _ => "127.0.0.1".to_string(),
        };
        let user = if url.username().is_empty() {
            std::env::var("PGUSER").unwrap_or_else(|_| "postgres".to_string())
        } else {
            decode(url.username())
        };
        let dbname = match url.path().trim_start_matches('/') {
            "" => user.clone(),
            p => decode(p),
        };
        let mut params = ConnParams {
            host,
            port: url.port().unwrap_or(5432),
            password: url.password().map(decode),
            user,
            dbname,
            sslmode: SslMode::default(),
            sslrootcert: None,
            connect_timeout: None,
            application_name: "outboxd".to_string(),
            keepalive: Keepalive::default(),
            tcp_user_timeout: Some(DEFAULT_TCP_USER_TIMEOUT),
        };
        let number = |key: &str, value: &str, unit: &str| {
            value.parse::<u64>().map_err(|_| {
                ConnParamsError::Invalid(format!("{key}={value:?} is not a whole number of {unit}"))
            })
        };
        for (key, value) in url.query_pairs() {
            match key.as_ref() {
                "sslmode" => params.sslmode = SslMode::parse(&value)?,
                "sslrootcert" => params.sslrootcert = Some(PathBuf::from(value.as_ref())),
                "connect_timeout" => {
                    let secs: u64 = value.parse().map_err(|_| {
                        ConnParamsError::Invalid(format!("connect_timeout={value:?} is not a whole number of seconds"))
                    })?;
                    params.connect_timeout = Some(Duration::from_secs(secs));
                }
                "application_name" => params.application_name = value.into_owned(),
                "keepalives" => {
                    params.keepalive.enabled = number("keepalives", &value, "0 or 1")? != 0
                }
                "keepalives_idle" => {
                    params.keepalive.idle =
                        Duration::from_secs(number("keepalives_idle", &value, "seconds")?)
                }
                "keepalives_interval" => {
                    params.keepalive.interval =
                        Duration::from_secs(number("keepalives_interval", &value, "seconds")?)
                }
                "keepalives_count" => {
                    params.keepalive.count = number("keepalives_count", &value, "probes")?
                        .try_into()
                        .map_err(|_| ConnParamsError::Invalid(format!("keepalives_count={value:?} is too large")))?
                }
                "tcp_user_timeout" => {
                    let ms = number("tcp_user_timeout", &value, "milliseconds")?;
                    params.tcp_user_timeout = (ms > 0).then(|| Duration::from_millis(ms));
                }
                "user" => params.user = value.into_owned(),
                "password" => params.password = Some(value.into_owned()),
                "dbname" => params.dbname = value.into_owned(),
                "host" => params.host = value.into_owned(),
                "port" => {
                    params.port = value
                        .parse()
                        .map_err(|_| ConnParamsError::Invalid(format!("port={value:?} is not a port number")))?
                }
                other => {
                    return Err(ConnParamsError::Invalid(format!(
                        "unsupported URL parameter {other:?} (supported: sslmode, sslrootcert, connect_timeout, application_name, \
                         keepalives, keepalives_idle, keepalives_interval, keepalives_count, tcp_user_timeout, \
                         user, password, dbname, host, port)"
                    )))
                }
            }
        }
        Ok(params)
    }

    /// `user@host:port/db` for error messages: never includes the password.
    pub fn describe(&self) -> String {
        format!("{}@{}:{}/{}", self.user, self.host, self.port, self.dbname)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_full_url() {
        let p = ConnParams::from_url(
            "postgresql://out%40box:p%2Fw@db.example:6543/app?sslmode=verify-full&sslrootcert=/ca.pem&connect_timeout=7",
        )
        .unwrap();
        assert_eq!(p.user, "out@box");
        assert_eq!(p.password.as_deref(), Some("p/w"));
        assert_eq!(p.host, "db.example");
        assert_eq!(p.port, 6543);
        assert_eq!(p.dbname, "app");
        assert_eq!(p.sslmode, SslMode::VerifyFull);
        assert_eq!(p.sslrootcert, Some(PathBuf::from("/ca.pem")));
        assert_eq!(p.connect_timeout, Some(Duration::from_secs(7)));
        assert_eq!(p.describe(), "out@box@db.example:6543/app");
    }

    #[test]
    fn defaults_like_libpq() {
        let p = ConnParams::from_url("postgresql://outboxd@localhost/").unwrap();
        assert_eq!(p.port, 5432);
        assert_eq!(p.dbname, "outboxd");
        assert_eq!(p.sslmode, SslMode::Prefer);
        assert_eq!(p.password, None);
        assert_eq!(p.keepalive, Keepalive::default());
        assert_eq!(p.tcp_user_timeout, Some(DEFAULT_TCP_USER_TIMEOUT));
    }

    #[test]
    fn keepalive_parameters_like_libpq() {
        let p = ConnParams::from_url(
            "postgresql://u@h/db?keepalives_idle=30&keepalives_interval=2&keepalives_count=4&tcp_user_timeout=1500",
        )
        .unwrap();
        assert_eq!(
            p.keepalive,
            Keepalive {
                enabled: true,
                idle: Duration::from_secs(30),
                interval: Duration::from_secs(2),
                count: 4
            }
        );
        assert_eq!(p.tcp_user_timeout, Some(Duration::from_millis(1500)));
        let off =
            ConnParams::from_url("postgresql://u@h/db?keepalives=0&tcp_user_timeout=0").unwrap();
        assert!(!off.keepalive.enabled);
        assert_eq!(off.tcp_user_timeout, None);
        let err = ConnParams::from_url("postgresql://u@h/db?keepalives_idle=soon").unwrap_err();
        assert!(err.to_string().contains("keepalives_idle"), "{err}");
    }

    #[test]
    fn rejects_bad_input_with_reason() {
        for (url, needle) in [
            ("mysql://x@h/db", "scheme"),
            ("postgresql://x@h/db?sslmode=allow", "sslmode"),
            ("postgresql://x@h/db?bogus=1", "bogus"),
            (
                "postgresql://x@h/db?connect_timeout=soon",
                "connect_timeout",
            ),
        ] {
            let err = ConnParams::from_url(url).unwrap_err().to_string();
            assert!(err.contains(needle), "{url}: {err}");
            assert!(err.contains("postgres.url"), "{err}");
        }
    }
}
