//! `[metrics]`: the Prometheus and health endpoint, slot sampling, the stall
//! threshold behind `/readyz`, and the Debezium metric aliases.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

use crate::config::units::de_duration;

/// How often the slot is looked at in `pg_replication_slots`. One cheap query
/// on its own connection; 10 s is below Prometheus' usual 15 s scrape
/// interval, so every scrape sees a fresh value.
pub(crate) const DEFAULT_SLOT_SAMPLE_INTERVAL: Duration = Duration::from_secs(10);
/// How long the confirmed position may stand still while events are pending
/// before `/readyz` fails. Long enough to ride out a broker leader election
/// or a slow batch, short enough for an orchestrator to notice a hung relay.
pub(crate) const DEFAULT_STALL_THRESHOLD: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// `ip:port` to serve `/metrics`, `/healthz` and `/readyz` on; absent =
    /// no endpoint. There is no default address: the relay opens no port
    /// nobody asked for.
    #[serde(deserialize_with = "de_listen")]
    pub listen: Option<SocketAddr>,
    /// Period of the slot sampler (lag, retained WAL, wal_status).
    #[serde(deserialize_with = "de_positive_duration")]
    pub slot_sample_interval: Duration,
    /// `/readyz` fails once the confirmed position stood still this long
    /// while events were pending.
    #[serde(deserialize_with = "de_positive_duration")]
    pub stall_threshold: Duration,
    /// Also export Debezium's streaming metric names, for existing dashboards.
    pub debezium_aliases: bool,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            listen: None,
            slot_sample_interval: DEFAULT_SLOT_SAMPLE_INTERVAL,
            stall_threshold: DEFAULT_STALL_THRESHOLD,
            debezium_aliases: false,
        }
    }
}

/// A duration that must not be zero: a zero sample interval would spin, a
/// zero stall threshold would fail `/readyz` on every event. Rejected while
/// parsing, so the error carries the line.
fn de_positive_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let v = de_duration(d)?;
    if v.is_zero() {
        return Err(de::Error::custom("must be greater than zero, e.g. \"10s\""));
    }
    Ok(v)
}

fn de_listen<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
    d.deserialize_str(ListenVisitor).map(Some)
}

struct ListenVisitor;

impl Visitor<'_> for ListenVisitor {
    type Value = SocketAddr;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an \"ip:port\" string such as \"0.0.0.0:9187\"")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<SocketAddr, E> {
        v.parse().map_err(|_| {
            E::custom(format!(
                "`{v}` is not an ip:port address; use e.g. \"127.0.0.1:9187\", \
                 \"0.0.0.0:9187\" for all interfaces, or \"[::]:9187\" (host names are not resolved)"
            ))
        })
    }
}
