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

/// libpq's `channel_binding`: whether SCRAM must bind the login to the TLS
/// session (SCRAM-SHA-256-PLUS, `tls-server-end-point`), so a man in the
/// middle holding another certificate cannot relay the exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ChannelBinding {
    Disable,
    /// libpq's default: bind when the server offers SCRAM-SHA-256-PLUS.
    #[default]
    Prefer,
    /// Refuse any login that is not SCRAM with channel binding: no TLS, or
    /// trust, password, md5 or cert authentication, ends the connection
    /// before a password is sent.
    Require,
}

impl std::fmt::Display for ChannelBinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ChannelBinding::Disable => "disable",
            ChannelBinding::Prefer => "prefer",
            ChannelBinding::Require => "require",
        })
    }
}

impl ChannelBinding {
    fn parse(s: &str) -> Result<Self, ConnParamsError> {
        match s {
            "disable" => Ok(ChannelBinding::Disable),
            "prefer" => Ok(ChannelBinding::Prefer),
            "require" => Ok(ChannelBinding::Require),
            other => Err(ConnParamsError::Invalid(format!(
                "channel_binding={other:?} is not supported; use disable, prefer or require"
            ))),
        }
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

/// `Debug` is written by hand: the password must not reach a log line.
#[derive(Clone, PartialEq, Eq)]
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
    /// `postgres.password_file`: read again at every connect, so a rotated
    /// password is used from the next reconnect on. Takes precedence over
    /// `password`, which then only holds what was read at start.
    pub password_file: Option<PathBuf>,
    pub dbname: String,
    pub sslmode: SslMode,
    pub sslrootcert: Option<PathBuf>,
    /// Client certificate (PEM, may hold its chain) for pg_hba.conf's `cert`
    /// method or `clientcert=verify-full`; always with `sslkey`.
    pub sslcert: Option<PathBuf>,
    /// Its private key, PEM (PKCS#8, PKCS#1 or SEC1), not encrypted.
    pub sslkey: Option<PathBuf>,
    pub channel_binding: ChannelBinding,
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
            password_file: None,
            user,
            dbname,
            sslmode: SslMode::default(),
            sslrootcert: None,
            sslcert: None,
            sslkey: None,
            channel_binding: ChannelBinding::default(),
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
                "sslcert" => params.sslcert = Some(PathBuf::from(value.as_ref())),
                "sslkey" => params.sslkey = Some(PathBuf::from(value.as_ref())),
                "sslpassword" => {
                    return Err(ConnParamsError::Invalid(
                        "sslpassword is not supported: outboxd reads only unencrypted keys; \
                         decrypt the key (openssl pkey -in key.pem -out plain.pem) and keep it readable by outboxd alone"
                            .into(),
                    ))
                }
                "channel_binding" => params.channel_binding = ChannelBinding::parse(&value)?,
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
                        "unsupported URL parameter {other:?} (supported: sslmode, sslrootcert, sslcert, sslkey, \
                         channel_binding, connect_timeout, application_name, \
                         keepalives, keepalives_idle, keepalives_interval, keepalives_count, tcp_user_timeout, \
                         user, password, dbname, host, port, target_session_attrs)"
                    )))
                }
            }
        }
        if !hosts.is_empty() || !query_ports.is_empty() {
            params.set_hosts(hosts, &query_ports)?;
        }
        params.check_tls_settings()?;
        Ok(params)
    }

    /// Settings that contradict each other are refused at start, not at the
    /// first connect: a client certificate needs its key (and the key its
    /// certificate), and binding a login to TLS needs TLS.
    fn check_tls_settings(&self) -> Result<(), ConnParamsError> {
        match (&self.sslcert, &self.sslkey) {
            (Some(_), None) => {
                return Err(ConnParamsError::Invalid(
                    "sslcert is set without sslkey: add sslkey=/path/to/client.key".into(),
                ))
            }
            (None, Some(_)) => {
                return Err(ConnParamsError::Invalid(
                    "sslkey is set without sslcert: add sslcert=/path/to/client.crt".into(),
                ))
            }
            _ => {}
        }
        if self.sslmode == SslMode::Disable {
            if self.channel_binding == ChannelBinding::Require {
                return Err(ConnParamsError::Invalid(
                    "channel_binding=require needs TLS but sslmode=disable: use sslmode=verify-full (or require)"
                        .into(),
                ));
            }
            if self.sslcert.is_some() {
                return Err(ConnParamsError::Invalid(
                    "sslcert is only sent over TLS but sslmode=disable: use sslmode=verify-full (or require)"
                        .into(),
                ));
            }
        }
        Ok(())
    }

    /// The password for the next login: `password_file` read now when it is
    /// configured (the rotated one, if it changed), else the one held.
    pub(crate) fn current_password(&self) -> Result<Option<String>, PasswordFileError> {
        match &self.password_file {
            Some(path) => read_password_file(path)
                .map(Some)
                .map_err(|source| PasswordFileError {
                    path: path.clone(),
                    source,
                }),
            None => Ok(self.password.clone()),
        }
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

impl std::fmt::Debug for ConnParams {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnParams")
            .field("server", &self.describe())
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("password_file", &self.password_file)
            .field("sslmode", &self.sslmode)
            .field("sslrootcert", &self.sslrootcert)
            .field("sslcert", &self.sslcert)
            .field("sslkey", &self.sslkey)
            .field("channel_binding", &self.channel_binding)
            .field("target_session_attrs", &self.target_session_attrs)
            .finish_non_exhaustive()
    }
}

/// `postgres.password_file` could not be read at a connect.
#[derive(Debug, thiserror::Error)]
#[error("cannot read postgres.password_file {}: {source}", path.display())]
pub struct PasswordFileError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// The password held in `path`. Secret files are usually written with
/// `echo`, which appends a newline that is not part of the password.
pub(crate) fn read_password_file(path: &std::path::Path) -> std::io::Result<String> {
    let text = std::fs::read_to_string(path)?;
    let pw = text.strip_suffix('\n').unwrap_or(&text);
    Ok(pw.strip_suffix('\r').unwrap_or(pw).to_owned())
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
    fn client_certificate_and_channel_binding_parameters() {
        let p = ConnParams::from_url(
            "postgresql://u@h/db?sslmode=verify-full&sslrootcert=/ca.crt&sslcert=/c.crt&sslkey=/c.key&channel_binding=require",
        )
        .unwrap();
        assert_eq!(p.sslcert, Some(PathBuf::from("/c.crt")));
        assert_eq!(p.sslkey, Some(PathBuf::from("/c.key")));
        assert_eq!(p.channel_binding, ChannelBinding::Require);
        assert_eq!(
            ConnParams::from_url("postgresql://u@h/db")
                .unwrap()
                .channel_binding,
            ChannelBinding::Prefer
        );
        for (url, needle) in [
            ("postgresql://u@h/db?sslcert=/c.crt", "without sslkey"),
            ("postgresql://u@h/db?sslkey=/c.key", "without sslcert"),
            (
                "postgresql://u@h/db?sslmode=disable&channel_binding=require",
                "needs TLS",
            ),
            (
                "postgresql://u@h/db?sslmode=disable&sslcert=/c&sslkey=/k",
                "only sent over TLS",
            ),
            (
                "postgresql://u@h/db?channel_binding=always",
                "channel_binding",
            ),
            ("postgresql://u@h/db?sslpassword=x", "decrypt the key"),
        ] {
            let err = ConnParams::from_url(url).unwrap_err().to_string();
            assert!(err.contains(needle), "{url}: {err}");
        }
    }

    #[test]
    fn password_file_is_read_at_each_call() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pw");
        std::fs::write(&path, "first\n").unwrap();
        let mut p = ConnParams::from_url("postgresql://u@h/db").unwrap();
        p.password = Some("first".into());
        p.password_file = Some(path.clone());
        assert_eq!(p.current_password().unwrap().as_deref(), Some("first"));
        std::fs::write(&path, "second\r\n").unwrap();
        assert_eq!(p.current_password().unwrap().as_deref(), Some("second"));
        std::fs::remove_file(&path).unwrap();
        let err = p.current_password().unwrap_err().to_string();
        assert!(
            err.contains("postgres.password_file") && err.contains("pw"),
            "{err}"
        );
        p.password_file = None;
        assert_eq!(p.current_password().unwrap().as_deref(), Some("first"));
    }

    #[test]
    fn debug_never_shows_the_password() {
        let p = ConnParams::from_url("postgresql://u:hunter2-secret@h/db?password=other-secret")
            .unwrap();
        let text = format!("{p:?}");
        assert!(!text.contains("secret"), "{text}");
        assert!(
            text.contains("***") && text.contains("u@h:5432/db"),
            "{text}"
        );
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
