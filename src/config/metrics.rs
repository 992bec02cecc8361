//! `[metrics]`: the Prometheus endpoint.

use std::fmt;
use std::net::SocketAddr;

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsConfig {
    /// `ip:port` to serve `/metrics` on; absent = no endpoint. There is no
    /// default address: the relay opens no port nobody asked for.
    #[serde(deserialize_with = "de_listen")]
    pub listen: Option<SocketAddr>,
}

fn de_listen<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
    d.deserialize_str(ListenVisitor).map(Some)
}

struct ListenVisitor;

impl Visitor<'_> for ListenVisitor {
    type Value = SocketAddr;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
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
