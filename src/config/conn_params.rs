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
pub(crate) const DEFAULT_TCP_USER_TIMEOUT: Duration = Duration::from_secs(30);

/// libpq's `target_session_attrs`, minus the variants a CDC source has no use
/// for: the slot lives on the primary, so only "any" and "read-write" matter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TargetSessionAttrs {
    /// The first host that answers.
    #[default]
    Any,
    /// The first host that accepts writes: a standby (in recovery) is
    /// skipped, so after a failover the promoted one is found.
    ReadWrite,
}

impl TargetSessionAttrs {
    fn parse(s: &str) -> Result<Self, ConnParamsError> {
        match s {
            "any" => Ok(TargetSessionAttrs::Any),
            "read-write" | "primary" => Ok(TargetSessionAttrs::ReadWrite),
            other => Err(ConnParamsError::Invalid(format!(
                "target_session_attrs={other:?} is not supported; use any or read-write"
            ))),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnParams {
    /// The first host of the URL; the one connected to when it is the only one.
    pub host: String,
    pub port: u16,
    /// The URL's further hosts (libpq's `host1:5432,host2:5433`), tried in
    /// order after `host`; see [`ConnParams::candidates`].
    pub other_hosts: Vec<(String, u16)>,
    pub target_session_attrs: TargetSessionAttrs,
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
    /// Several hosts (`postgresql://u@a:5432,b:5433/db`) are libpq's
    /// multi-host form, which `url::Url` rejects: the authority is split
    /// here and only the first host is left for it to parse.
    pub fn from_url(text: &str) -> Result<Self, ConnParamsError> {
        let (text, mut hosts) = split_hosts(text)?;
        let url = url::Url::parse(&text).map_err(|e| ConnParamsError::Invalid(e.to_string()))?;
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
        let port = url.port().unwrap_or(5432);
        let mut params = ConnParams {
            host,
            port,
            other_hosts: Vec::new(),
            target_session_attrs: TargetSessionAttrs::default(),
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
        let mut query_ports: Vec<Option<u16>> = Vec::new();
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
                "host" => {
                    hosts = value
                        .split(',')
                        .map(|h| (h.to_string(), None))
                        .collect()
                }
                "port" => {
                    query_ports = value
                        .split(',')
                        .map(|p| {
                            (!p.is_empty())
                                .then(|| p.parse())
                                .transpose()
                                .map_err(|_| ConnParamsError::Invalid(format!("port={value:?} is not a port number")))
                        })
                        .collect::<Result<_, _>>()?
                }
                "target_session_attrs" => {
                    params.target_session_attrs = TargetSessionAttrs::parse(&value)?
                }
                other => {
                    return Err(ConnParamsError::Invalid(format!(
                        "unsupported URL parameter {other:?} (supported: sslmode, sslrootcert, connect_timeout, application_name, \
                         keepalives, keepalives_idle, keepalives_interval, keepalives_count, tcp_user_timeout, \
                         user, password, dbname, host, port, target_session_attrs)"
                    )))
                }
            }
        }
        if !hosts.is_empty() || !query_ports.is_empty() {
            params.set_hosts(hosts, &query_ports)?;
        }
        Ok(params)
    }

    /// Applies the multi-host list: `hosts` from the authority (with their
    /// ports) or `?host=`, and `?port=` either one for all or one per host.
    fn set_hosts(
        &mut self,
        mut hosts: Vec<HostPort>,
        ports: &[Option<u16>],
    ) -> Result<(), ConnParamsError> {
        if hosts.is_empty() {
            hosts.push((self.host.clone(), None));
        }
        if ports.len() > 1 && ports.len() != hosts.len() {
            return Err(ConnParamsError::Invalid(format!(
                "{} hosts but {} ports: give one port for all hosts or one per host",
                hosts.len(),
                ports.len()
            )));
        }
        let default_port = self.port;
        let mut all = hosts.into_iter().enumerate().map(|(i, (host, own))| {
            let given = if ports.len() == 1 {
                ports[0]
            } else {
                ports.get(i).copied().flatten()
            };
            let host = if host.is_empty() {
                "127.0.0.1".to_string()
            } else {
                host
            };
            (host, own.or(given).unwrap_or(default_port))
        });
        let (host, port) = all.next().expect("at least one host");
        self.host = host;
        self.port = port;
        self.other_hosts = all.collect();
        Ok(())
    }

    /// One single-host `ConnParams` per host, in the order to try them.
    /// A single-host URL gives itself.
    pub(crate) fn candidates(&self) -> Vec<ConnParams> {
        let first = ConnParams {
            other_hosts: Vec::new(),
            ..self.clone()
        };
        std::iter::once(first.clone())
            .chain(self.other_hosts.iter().map(|(host, port)| ConnParams {
                host: host.clone(),
                port: *port,
                ..first.clone()
            }))
            .collect()
    }

    /// `user@host:port/db` for error messages: never includes the password.
    pub(crate) fn describe(&self) -> String {
        let mut hosts = format!("{}:{}", self.host, self.port);
        for (host, port) in &self.other_hosts {
            hosts.push_str(&format!(",{host}:{port}"));
        }
        format!("{}@{hosts}/{}", self.user, self.dbname)
    }
}

/// A host of a multi-host URL, with the port written next to it if any.
type HostPort = (String, Option<u16>);

/// Splits a multi-host authority off the URL: the URL with only its first
/// host left, and every host with the port written next to it. A URL with
/// one host comes back unchanged, with no hosts.
fn split_hosts(text: &str) -> Result<(String, Vec<HostPort>), ConnParamsError> {
    let Some((scheme, rest)) = text.split_once("://") else {
        return Ok((text.to_string(), Vec::new()));
    };
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let (userinfo, hostlist) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    if !hostlist.contains(',') {
        return Ok((text.to_string(), Vec::new()));
    }
    let hosts = hostlist
        .split(',')
        .map(split_host_port)
        .collect::<Result<Vec<_>, _>>()?;
    let first = hostlist.split(',').next().unwrap_or_default();
    let userinfo = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
    Ok((format!("{scheme}://{userinfo}{first}{tail}"), hosts))
}

/// `host`, `host:port`, `[::1]:port`.
fn split_host_port(item: &str) -> Result<HostPort, ConnParamsError> {
    let bad_port = |p: &str| {
        ConnParamsError::Invalid(format!("port {p:?} of host {item:?} is not a port number"))
    };
    if let Some(inner) = item.strip_prefix('[') {
        let (host, after) = inner.split_once(']').ok_or_else(|| {
            ConnParamsError::Invalid(format!("host {item:?} lacks its closing ]"))
        })?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p.parse().map_err(|_| bad_port(p))?),
            None => None,
        };
        return Ok((host.to_string(), port));
    }
    let decode = |s: &str| percent_decode_str(s).decode_utf8_lossy().into_owned();
    match item.rsplit_once(':') {
        Some((host, p)) => Ok((decode(host), Some(p.parse().map_err(|_| bad_port(p))?))),
        None => Ok((decode(item), None)),
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
    fn multi_host_url_like_libpq() {
        let p = ConnParams::from_url(
            "postgresql://u:pw@db-a:5432,db-b:5433,[::1]/app?target_session_attrs=read-write",
        )
        .unwrap();
        assert_eq!((p.host.as_str(), p.port), ("db-a", 5432));
        assert_eq!(
            p.other_hosts,
            vec![("db-b".to_string(), 5433), ("::1".to_string(), 5432)]
        );
        assert_eq!(p.target_session_attrs, TargetSessionAttrs::ReadWrite);
        assert_eq!((p.user.as_str(), p.password.as_deref()), ("u", Some("pw")));
        assert_eq!(p.dbname, "app");
        assert_eq!(p.describe(), "u@db-a:5432,db-b:5433,::1:5432/app");
        let tried: Vec<_> = p
            .candidates()
            .into_iter()
            .map(|c| (c.host.clone(), c.port, c.other_hosts.len(), c.dbname))
            .collect();
        assert_eq!(
            tried,
            vec![
                ("db-a".into(), 5432, 0, "app".into()),
                ("db-b".into(), 5433, 0, "app".into()),
                ("::1".into(), 5432, 0, "app".into()),
            ]
        );
    }

    #[test]
    fn hosts_and_ports_as_query_parameters() {
        let p = ConnParams::from_url("postgresql:///app?user=u&host=a,b&port=6001,6002").unwrap();
        assert_eq!((p.host.as_str(), p.port), ("a", 6001));
        assert_eq!(p.other_hosts, vec![("b".to_string(), 6002)]);
        let one_port = ConnParams::from_url("postgresql:///app?user=u&host=a,b&port=7000").unwrap();
        assert_eq!(one_port.port, 7000);
        assert_eq!(one_port.other_hosts, vec![("b".to_string(), 7000)]);
        let err = ConnParams::from_url("postgresql:///app?host=a,b,c&port=1,2").unwrap_err();
        assert!(err.to_string().contains("3 hosts but 2 ports"), "{err}");
        let err = ConnParams::from_url("postgresql://u@a:1,b:x/app").unwrap_err();
        assert!(err.to_string().contains("\"x\""), "{err}");
        let err = ConnParams::from_url("postgresql://u@a,b/app?target_session_attrs=standby")
            .unwrap_err();
        assert!(err.to_string().contains("target_session_attrs"), "{err}");
    }

    #[test]
    fn single_host_urls_are_one_candidate_as_before() {
        for url in [
            "postgresql://u@h:6543/db",
            "postgresql:///db?user=u&host=h&port=6543",
            "postgresql://u@h/db?port=6543",
        ] {
            let p = ConnParams::from_url(url).unwrap();
            assert_eq!((p.host.as_str(), p.port), ("h", 6543), "{url}");
            assert!(p.other_hosts.is_empty(), "{url}");
            assert_eq!(p.target_session_attrs, TargetSessionAttrs::Any);
            assert_eq!(p.candidates(), vec![p.clone()]);
            assert_eq!(p.describe(), "u@h:6543/db");
        }
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
