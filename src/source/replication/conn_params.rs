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
                        "unsupported URL parameter {other:?} (supported: sslmode, sslrootcert, connect_timeout, application_name, user, password, dbname, host, port)"
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
