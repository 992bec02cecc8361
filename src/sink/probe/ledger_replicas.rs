//! How many copies the cluster keeps of the position ledger, against
//! `kafka.ledger_replication_factor` and the topic's
//! `min.insync.replicas`. The ledger is written with `acks=all`: with fewer
//! replicas than `min.insync.replicas` no entry is ever accepted, and with
//! exactly `min.insync.replicas` one broker down (a rolling restart) stops
//! every ledger write, and with it the relay.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;

/// One metadata or DescribeConfigs round trip.
const TIMEOUT: Duration = Duration::from_secs(10);

/// What the cluster says about the ledger topic's replication.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Replication {
    /// The fewest replicas any of its partitions has.
    pub(crate) replicas: usize,
    /// The topic's `min.insync.replicas`; `None` when the broker did not
    /// say (never taken for a value).
    pub(crate) min_insync: Option<usize>,
    /// Brokers in the cluster's metadata.
    pub(crate) brokers: usize,
}

/// A problem with `r` for a ledger configured with `configured` replicas
/// (-1: the broker default, which is not compared): `Err` when no entry can
/// be written, `Ok(Some)` for a warning, `Ok(None)` when it is fine.
pub(crate) fn judge(r: Replication, configured: i32) -> Result<Option<String>, String> {
    let have = r.replicas;
    if let Some(min) = r.min_insync.filter(|&min| have < min) {
        return Err(format!(
            "{have} replica(s) but min.insync.replicas = {min}: the brokers refuse every ledger \
             write (acks=all); add replicas with kafka-reassign-partitions.sh or lower the \
             topic's min.insync.replicas"
        ));
    }
    if configured > 0 && have < configured as usize {
        return Ok(Some(format!(
            "{have} replica(s), fewer than kafka.ledger_replication_factor = {configured}; \
             add replicas with kafka-reassign-partitions.sh"
        )));
    }
    // One broker alone cannot give a topic more copies: nothing to fix.
    match r.min_insync {
        Some(min) if r.brokers > 1 && have < min + 1 => Ok(Some(format!(
            "{have} replica(s) with min.insync.replicas = {min}: one broker down (a restart) \
             stops every ledger write; give it at least {} replicas",
            min + 1
        ))),
        _ => Ok(None),
    }
}

/// Asks the cluster about `topic` (which exists).
pub(crate) async fn replication(
    admin: &Arc<AdminClient<DefaultClientContext>>,
    topic: &str,
) -> Result<Replication, String> {
    let (replicas, brokers) = {
        let (admin, name) = (Arc::clone(admin), topic.to_owned());
        tokio::task::spawn_blocking(move || {
            let md = admin
                .inner()
                .fetch_metadata(Some(&name), TIMEOUT)
                .map_err(|e| format!("no metadata for `{name}`: {e}"))?;
            let replicas = md
                .topics()
                .iter()
                .find(|t| t.name() == name)
                .and_then(|t| t.partitions().iter().map(|p| p.replicas().len()).min())
                .ok_or_else(|| format!("no partitions of `{name}` in the metadata"))?;
            Ok::<_, String>((replicas, md.brokers().len()))
        })
        .await
        .map_err(|e| e.to_string())??
    };
    let options = AdminOptions::new().request_timeout(Some(TIMEOUT));
    let min_insync = admin
        .describe_configs([&ResourceSpecifier::Topic(topic)], &options)
        .await
        .ok()
        .and_then(|rs| rs.into_iter().next()?.ok())
        .and_then(|r| r.get("min.insync.replicas")?.value.as_deref()?.parse().ok());
    Ok(Replication {
        replicas,
        min_insync,
        brokers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(replicas: usize, min_insync: Option<usize>, brokers: usize) -> Replication {
        Replication {
            replicas,
            min_insync,
            brokers,
        }
    }

    #[test]
    fn fewer_replicas_than_min_insync_fails() {
        let e = judge(r(1, Some(2), 3), -1).unwrap_err();
        assert!(e.contains("min.insync.replicas = 2"), "{e}");
    }

    #[test]
    fn fewer_replicas_than_configured_warns() {
        let w = judge(r(2, Some(1), 3), 3).unwrap().unwrap();
        assert!(w.contains("kafka.ledger_replication_factor = 3"), "{w}");
    }

    #[test]
    fn no_spare_replica_above_min_insync_warns_on_a_cluster_only() {
        let w = judge(r(2, Some(2), 3), -1).unwrap().unwrap();
        assert!(w.contains("at least 3 replicas"), "{w}");
        assert_eq!(judge(r(1, Some(1), 1), -1), Ok(None));
    }

    #[test]
    fn enough_replicas_or_an_unknown_minimum_is_fine() {
        assert_eq!(judge(r(3, Some(2), 3), 3), Ok(None));
        assert_eq!(judge(r(3, None, 3), -1), Ok(None));
    }
}
