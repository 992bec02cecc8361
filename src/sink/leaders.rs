//! Fresh metadata for the producer watchdog: does every partition of the
//! topics the relay writes have a leader, as the cluster sees it now?
//!
//! Asked on a client of its own, made for the one question and dropped
//! after: a stuck producer's metadata is what is in doubt (librdkafka 2.12.1
//! can keep "new leader -1 not found in cache" long after the cluster
//! elected one), and a long-lived client's connections may be the stuck
//! ones. A new client opens new connections, as a new producer would.

use std::collections::BTreeSet;
use std::fmt;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};

use super::config::admin_client_config;
use crate::config::KafkaConfig;

/// What fresh metadata said about the topics asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Leaders {
    /// Partitions seen, over every topic asked for.
    pub(crate) partitions: usize,
    /// Those without a leader (or with an error), as `topic[partition]`,
    /// and topics the metadata did not have (as `topic`).
    pub(crate) leaderless: Vec<String>,
}

impl Leaders {
    /// Every partition asked for has a leader.
    pub(crate) fn all_led(&self) -> bool {
        self.partitions > 0 && self.leaderless.is_empty()
    }
}

impl fmt::Display for Leaders {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.all_led() {
            write!(f, "all {} partition(s) have a leader", self.partitions)
        } else {
            write!(
                f,
                "{} partition(s), without a leader: {}",
                self.partitions,
                self.leaderless.join(", ")
            )
        }
    }
}

/// Asks the cluster, on a fresh client, who leads each partition of
/// `topics`; `Err` with why when it did not answer within `timeout`, for
/// all of them together. Blocks (librdkafka's metadata call): run it on the
/// blocking pool.
pub(crate) fn fresh_leaders(
    brokers: &str,
    kafka: &KafkaConfig,
    topics: &BTreeSet<String>,
    timeout: Duration,
) -> Result<Leaders, String> {
    let config = admin_client_config(brokers, &kafka.properties).map_err(|e| e.to_string())?;
    let client: BaseConsumer = config.create().map_err(|e| e.to_string())?;
    let mut leaders = Leaders {
        partitions: 0,
        leaderless: Vec::new(),
    };
    let deadline = Instant::now() + timeout;
    for topic in topics {
        let left = deadline.saturating_duration_since(Instant::now());
        let metadata = client
            .fetch_metadata(Some(topic), left)
            .map_err(|e| format!("no metadata for {topic}: {e}"))?;
        let Some(found) = metadata.topics().iter().find(|t| t.name() == topic) else {
            leaders.leaderless.push(topic.clone());
            continue;
        };
        if found.error().is_some() || found.partitions().is_empty() {
            leaders.leaderless.push(topic.clone());
            continue;
        }
        for p in found.partitions() {
            leaders.partitions += 1;
            if p.leader() < 0 || p.error().is_some() {
                leaders.leaderless.push(format!("{topic}[{}]", p.id()));
            }
        }
    }
    Ok(leaders)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_led_needs_partitions_and_no_leaderless_one() {
        let none = Leaders {
            partitions: 0,
            leaderless: vec![],
        };
        assert!(!none.all_led());
        let led = Leaders {
            partitions: 3,
            leaderless: vec![],
        };
        assert!(led.all_led());
        assert_eq!(led.to_string(), "all 3 partition(s) have a leader");
        let one_short = Leaders {
            partitions: 3,
            leaderless: vec!["t[1]".into()],
        };
        assert!(!one_short.all_led());
        assert_eq!(
            one_short.to_string(),
            "3 partition(s), without a leader: t[1]"
        );
    }
}
