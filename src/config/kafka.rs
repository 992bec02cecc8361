//! `[kafka]`: the producer side. Anything librdkafka understands goes in
//! `[kafka.properties]`; only what outboxd itself acts on has a typed key.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use crate::config::error::ConfigError;
use crate::config::units::de_duration;
use crate::config::units::de_opt_duration;

/// librdkafka's default `transaction.timeout.ms`.
pub(crate) const DEFAULT_TRANSACTION_TIMEOUT_MS: u64 = 60_000;

/// Create missing topics by default: it makes a first run against a dev
/// broker just work. Production clusters usually turn it off.
pub(crate) const DEFAULT_CREATE_TOPICS: bool = true;
/// One partition for created topics: per-aggregate ordering holds with any
/// count, but one is the only value that is right for a single-broker dev
/// setup; size real topics explicitly.
pub(crate) const DEFAULT_TOPIC_PARTITIONS: i32 = 1;
/// Replication factor 1 for created topics, again so a single dev broker
/// accepts it. Use -1 (broker default) or 3 in production.
pub(crate) const DEFAULT_TOPIC_REPLICATION_FACTOR: i32 = 1;
/// The position ledger's compacted topic (issue 8): like Kafka Connect's
/// `connect-offsets`, one topic a cluster's relays share, one key each.
pub(crate) const DEFAULT_LEDGER_TOPIC: &str = "outboxd.positions";
/// The broker's `default.replication.factor` for the ledger topic: the
/// ledger is what tells a lost slot from a first start, so on a cluster it
/// should be as durable as the cluster makes topics by default, and a
/// single development broker (default 1) still accepts it.
pub(crate) const DEFAULT_LEDGER_REPLICATION_FACTOR: i32 = -1;
/// The ledger producer's write timeout when `kafka.ledger_write_timeout` is
/// not set: this many status intervals (the ledger is written at most once
/// per interval and may trail the slot by one; a few more and a write is
/// stuck, not slow)...
pub(crate) const LEDGER_WRITE_TIMEOUT_INTERVALS: u32 = 5;
/// ...but at least 5 s, so a leader election on a healthy cluster (seconds)
/// does not fail writes and replace the producer for nothing...
pub(crate) const LEDGER_WRITE_TIMEOUT_MIN: Duration = Duration::from_secs(5);
/// ...and at most the data producer's own `message.timeout.ms` default
/// (30 s): the ledger should recover before the relay does, not after.
pub(crate) const LEDGER_WRITE_TIMEOUT_MAX: Duration = Duration::from_secs(30);
/// The shortest `kafka.ledger_write_timeout` accepted: librdkafka needs
/// `message.timeout.ms` above `linger.ms`, and a write takes a round trip.
const LEDGER_WRITE_TIMEOUT_FLOOR: Duration = Duration::from_secs(1);
/// How long the oldest record the data producer holds (or a Kafka
/// transaction's commit) may go unacknowledged before the watchdog asks
/// fresh metadata whether the cluster has a leader for every partition the
/// relay writes, and replaces the producer if it has. A third of the
/// default `message.timeout.ms` (30 s): a healthy cluster acks in
/// milliseconds, an election takes a few seconds, and a stuck client (see
/// docs/operations.md, "A producer stuck while the cluster is healthy")
/// otherwise holds the slot for the whole timeout.
pub(crate) const DEFAULT_STUCK_AFTER: Duration = Duration::from_secs(10);
/// Kafka's limit on a topic name's length.
const MAX_TOPIC_NAME: usize = 249;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KafkaConfig {
    /// `host:port[,host:port...]` (librdkafka `bootstrap.servers`). Optional
    /// here because subcommands such as slot management need no Kafka; the
    /// relay checks it with [`crate::config::Config::validate_for_relay`].
    pub brokers: Option<String>,
    pub create_topics: bool,
    /// Partitions for topics outboxd creates; -1 = broker default.
    pub topic_partitions: i32,
    /// Replication factor for topics outboxd creates; -1 = broker default.
    pub topic_replication_factor: i32,
    /// The position ledger's topic (compacted; see `crate::sink::LedgerTopic`).
    pub ledger_topic: String,
    /// Replication factor of the ledger topic when outboxd creates it; -1 =
    /// broker default.
    pub ledger_replication_factor: i32,
    /// librdkafka properties, passed through. Values may be written as TOML
    /// strings, integers or booleans; dotted keys may be quoted
    /// (`"security.protocol" = "SSL"`) or bare (`security.protocol = "SSL"`,
    /// which TOML reads as a nested table and we flatten back).
    #[serde(deserialize_with = "de_properties")]
    pub properties: BTreeMap<String, String>,
    /// The producer's `transactional.id` with `relay.delivery =
    /// "exactly-once"`; `None`: derived from the ledger key.
    pub transactional_id: Option<String>,
    /// How long one ledger write may take before the ledger's producer is
    /// replaced (at-least-once); `None`: derived from the status interval
    /// ([`KafkaConfig::ledger_write_timeout`]).
    #[serde(deserialize_with = "de_opt_duration")]
    pub ledger_write_timeout: Option<Duration>,
    /// See [`DEFAULT_STUCK_AFTER`]; `"0s"` turns the watchdog off.
    #[serde(deserialize_with = "de_duration")]
    pub stuck_after: Duration,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            brokers: None,
            create_topics: DEFAULT_CREATE_TOPICS,
            topic_partitions: DEFAULT_TOPIC_PARTITIONS,
            topic_replication_factor: DEFAULT_TOPIC_REPLICATION_FACTOR,
            ledger_topic: DEFAULT_LEDGER_TOPIC.to_owned(),
            ledger_replication_factor: DEFAULT_LEDGER_REPLICATION_FACTOR,
            properties: BTreeMap::new(),
            transactional_id: None,
            ledger_write_timeout: None,
            stuck_after: DEFAULT_STUCK_AFTER,
        }
    }
}

impl KafkaConfig {
    /// The transactional id when `kafka.transactional_id` is not set:
    /// `outboxd-<ledger key>`, the same for every instance of one slot, so a
    /// standby taking over fences the instance it replaces.
    pub(crate) fn default_transactional_id(&self, ledger_key: &str) -> String {
        format!("outboxd-{ledger_key}")
    }

    /// How long the coordinator lets a transaction run before it aborts it:
    /// `transaction.timeout.ms` from `[kafka.properties]`, or librdkafka's
    /// default (librdkafka refuses a value that is not a number when the
    /// producer is made, before this matters).
    pub(crate) fn transaction_timeout(&self) -> Duration {
        let ms = self
            .properties
            .get("transaction.timeout.ms")
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(DEFAULT_TRANSACTION_TIMEOUT_MS);
        Duration::from_millis(ms)
    }

    /// The ledger producer's `message.timeout.ms` and the age limit of each
    /// ledger write: `kafka.ledger_write_timeout`, or
    /// [`LEDGER_WRITE_TIMEOUT_INTERVALS`] status intervals within
    /// [`LEDGER_WRITE_TIMEOUT_MIN`]..=[`LEDGER_WRITE_TIMEOUT_MAX`].
    pub(crate) fn ledger_write_timeout(&self, status_interval: Duration) -> Duration {
        self.ledger_write_timeout.unwrap_or_else(|| {
            (status_interval * LEDGER_WRITE_TIMEOUT_INTERVALS)
                .clamp(LEDGER_WRITE_TIMEOUT_MIN, LEDGER_WRITE_TIMEOUT_MAX)
        })
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self
            .ledger_write_timeout
            .is_some_and(|t| t < LEDGER_WRITE_TIMEOUT_FLOOR)
        {
            return Err(ConfigError::invalid(
                "kafka.ledger_write_timeout",
                "must be at least \"1s\"; leave it out to derive it from postgres.status_interval",
            ));
        }
        if self
            .transactional_id
            .as_deref()
            .is_some_and(|id| id.trim().is_empty())
        {
            return Err(ConfigError::invalid(
                "kafka.transactional_id",
                "must not be empty; leave it out to derive it from the ledger key",
            ));
        }
        if let Some(b) = &self.brokers {
            if b.split(',').any(|s| s.trim().is_empty()) {
                return Err(ConfigError::invalid(
                    "kafka.brokers",
                    format!("`{b}` has an empty entry; write host:port[,host:port...]"),
                ));
            }
        }
        for (key, n) in [
            ("kafka.topic_partitions", self.topic_partitions),
            (
                "kafka.topic_replication_factor",
                self.topic_replication_factor,
            ),
            (
                "kafka.ledger_replication_factor",
                self.ledger_replication_factor,
            ),
        ] {
            if n == 0 || n < -1 {
                return Err(ConfigError::invalid(
                    key,
                    format!("must be at least 1, or -1 for the broker default; got {n}"),
                ));
            }
        }
        validate_topic_name("kafka.ledger_topic", &self.ledger_topic)?;
        if self.properties.contains_key("bootstrap.servers") {
            return Err(ConfigError::invalid(
                "kafka.properties.\"bootstrap.servers\"",
                "set the brokers with kafka.brokers instead, so there is one place to look",
            ));
        }
        if let Some((k, _)) = self.properties.iter().find(|(k, _)| k.is_empty()) {
            return Err(ConfigError::invalid(
                format!("kafka.properties.\"{k}\""),
                "empty property name",
            ));
        }
        Ok(())
    }

    /// Stricter checks for running the relay, which needs a broker.
    pub(crate) fn validate_for_relay(&self) -> Result<(), ConfigError> {
        match self.brokers.as_deref() {
            Some(b) if !b.trim().is_empty() => {}
            _ => {
                return Err(ConfigError::invalid(
                    "kafka.brokers",
                    "required to run the relay; set it to host:port[,host:port...], e.g. \"127.0.0.1:9092\"",
                ))
            }
        }
        if !cfg!(feature = "gssapi") {
            self.refuse_gssapi()?;
        }
        Ok(())
    }

    /// Without the `gssapi` feature librdkafka has no Kerberos; say so by
    /// key instead of librdkafka's "No provider for SASL mechanism GSSAPI".
    /// GSSAPI is also librdkafka's default mechanism for a SASL protocol.
    fn refuse_gssapi(&self) -> Result<(), ConfigError> {
        let sasl = self
            .properties
            .get("security.protocol")
            .is_some_and(|p| p.to_ascii_lowercase().starts_with("sasl_"));
        let mechanism = ["sasl.mechanisms", "sasl.mechanism"]
            .into_iter()
            .find_map(|k| self.properties.get(k).map(|v| (k, v.trim())));
        let key = match mechanism {
            Some((k, m)) if m.eq_ignore_ascii_case("GSSAPI") => k,
            None if sasl => "sasl.mechanisms",
            _ => return Ok(()),
        };
        let unset = if mechanism.is_none() {
            " (unset with a SASL security.protocol, librdkafka picks GSSAPI)"
        } else {
            ""
        };
        Err(ConfigError::invalid(
            format!("kafka.properties.\"{key}\""),
            format!(
                "GSSAPI (Kerberos){unset} needs outboxd built with `--features gssapi` \
                 (and libsasl2-dev installed to build it); this build supports PLAIN, \
                 SCRAM-SHA-256, SCRAM-SHA-512 and OAUTHBEARER"
            ),
        ))
    }
}

/// Kafka's rule for a topic name: 1 to 249 of `[a-zA-Z0-9._-]`, not `.` or `..`.
fn validate_topic_name(key: &str, name: &str) -> Result<(), ConfigError> {
    let legal = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if name.is_empty() || name.len() > MAX_TOPIC_NAME || !legal || name == "." || name == ".." {
        return Err(ConfigError::invalid(
            key,
            format!(
                "`{name}` is not a Kafka topic name: use 1 to {MAX_TOPIC_NAME} of a-z, A-Z,                  0-9, `.`, `_`, `-`"
            ),
        ));
    }
    Ok(())
}

fn de_properties<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    let tree = PropertyTree::deserialize(d)?;
    let mut out = BTreeMap::new();
    tree.flatten_into("", &mut out);
    Ok(out)
}

/// A `[kafka.properties]` value before flattening.
enum PropertyTree {
    Leaf(String),
    Table(Vec<(String, PropertyTree)>),
}

impl PropertyTree {
    fn flatten_into(self, prefix: &str, out: &mut BTreeMap<String, String>) {
        match self {
            PropertyTree::Leaf(v) => {
                out.insert(prefix.to_owned(), v);
            }
            PropertyTree::Table(entries) => {
                for (k, v) in entries {
                    let key = if prefix.is_empty() {
                        k
                    } else {
                        format!("{prefix}.{k}")
                    };
                    v.flatten_into(&key, out);
                }
            }
        }
    }
}

impl<'de> Deserialize<'de> for PropertyTree {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(PropertyVisitor)
    }
}

struct PropertyVisitor;

impl<'de> Visitor<'de> for PropertyVisitor {
    type Value = PropertyTree;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a librdkafka property value: a string, integer or boolean")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<PropertyTree, E> {
        Ok(PropertyTree::Leaf(v.to_owned()))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<PropertyTree, E> {
        Ok(PropertyTree::Leaf(v.to_string()))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<PropertyTree, E> {
        Ok(PropertyTree::Leaf(v.to_string()))
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<PropertyTree, E> {
        Ok(PropertyTree::Leaf(v.to_string()))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<PropertyTree, A::Error> {
        let mut entries = Vec::new();
        while let Some((k, v)) = map.next_entry::<String, PropertyTree>()? {
            entries.push((k, v));
        }
        Ok(PropertyTree::Table(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<KafkaConfig, toml::de::Error> {
        toml::from_str(text)
    }

    #[test]
    fn the_ledger_write_timeout_is_a_few_status_intervals_unless_set() {
        let k = KafkaConfig::default();
        let ms = Duration::from_millis;
        assert_eq!(k.ledger_write_timeout(ms(1000)), ms(5000));
        assert_eq!(k.ledger_write_timeout(ms(2000)), ms(10_000));
        assert_eq!(k.ledger_write_timeout(ms(200)), ms(5000), "at least 5 s");
        assert_eq!(
            k.ledger_write_timeout(ms(60_000)),
            ms(30_000),
            "at most 30 s"
        );
        let k = parse("ledger_write_timeout = \"2s\"").unwrap();
        assert_eq!(k.ledger_write_timeout(ms(1000)), ms(2000));
        assert!(k.validate().is_ok());
        let err = parse("ledger_write_timeout = \"500ms\"")
            .unwrap()
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("kafka.ledger_write_timeout"), "{err}");
        assert!(
            parse("ledger_write_timeout = 5").is_err(),
            "a unit is needed"
        );
    }

    #[test]
    fn properties_accept_scalars_and_flatten_dotted_keys() {
        let k = parse(
            r#"
            [properties]
            "security.protocol" = "SSL"
            linger.ms = 5
            enable.idempotence = true
            "#,
        )
        .unwrap();
        let got: Vec<(&str, &str)> = k
            .properties
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                ("enable.idempotence", "true"),
                ("linger.ms", "5"),
                ("security.protocol", "SSL")
            ]
        );
    }

    #[test]
    fn properties_reject_other_types() {
        let err = parse("[properties]\nx = 1.5").unwrap_err().to_string();
        assert!(err.contains("string, integer or boolean"), "{err}");
        assert!(parse("[properties]\nx = [1]").is_err());
    }

    #[test]
    fn ledger_topic_defaults_and_must_be_a_topic_name() {
        let k = parse("").unwrap();
        assert_eq!(k.ledger_topic, "outboxd.positions");
        k.validate().unwrap();
        for bad in ["", "a b", "pos/itions", ".."] {
            let k = KafkaConfig {
                ledger_topic: bad.into(),
                ..KafkaConfig::default()
            };
            let err = k.validate().unwrap_err().to_string();
            assert!(err.contains("kafka.ledger_topic"), "{err}");
        }
    }

    #[test]
    fn bootstrap_servers_in_properties_is_rejected() {
        let k = parse("[properties]\n\"bootstrap.servers\" = \"b:9092\"").unwrap();
        assert!(k
            .validate()
            .unwrap_err()
            .to_string()
            .contains("kafka.brokers"));
    }
}
