//! [`LedgerReader`]: reads the position ledger's topic back, as far as
//! [`ReadTo`] says. No consumer group: the partitions are read from their
//! start with librdkafka's simple consumer calls ([`SimpleConsumer`]), so
//! the principal needs READ and DESCRIBE on the topic and nothing on any
//! group. Each read uses fresh consumers (no state carried over);
//! the reader itself is cheap to keep and clone, so a relay keeps one for
//! its re-reads instead of building the whole ledger client (admin client
//! and producer) each time, whose closing alone cost about 140 ms of the
//! exactly-once start.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::{RDKafkaErrorCode, RDKafkaRespErr};

use super::ledger_error::LedgerTopicError;
use super::simple_consumer::{Fetched, SimpleConsumer};
use crate::progress::ledger::{LedgerEntry, LedgerIdentity};

/// One metadata or ListOffsets round trip.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);
/// Reading the whole topic: a few records per relay, so seconds at most on
/// a reachable cluster; 30 s covers a broker that is slow to serve fetches.
const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Between two looks at the consumer's position. Short: a read that ends on
/// a transaction marker (every exactly-once commit writes one) is done only
/// once a poll came back empty and the position passed the marker, and the
/// relay's start waits for it.
const POLL: Duration = Duration::from_millis(10);

/// How far a read of the ledger goes. Every read is `read_committed`; the
/// difference is where it counts as done.
///
/// A `read_committed` reader sees a partition only up to its last stable
/// offset: the first record of a transaction still open there. The ledger
/// topic is one partition shared by every relay, and an exactly-once relay
/// writes its entry inside each commit, so another relay's commit under way
/// (or a stopped instance's open transaction, until it is aborted) hides
/// every entry committed after it. librdkafka's watermark query follows the
/// reader's isolation level and returns that stable offset, so a read that
/// stops there is silently short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadTo {
    /// Up to the last stable offset, without waiting. It may miss entries
    /// committed behind an open transaction: for a start that is checked
    /// again later, never for the check itself.
    Stable,
    /// Up to the high watermark as the read begins: it waits until every
    /// transaction open then is resolved, so no entry committed before the
    /// read is missed. (An open transaction of this relay's own
    /// transactional id would hold it until `transaction.timeout.ms`:
    /// read this way once the id has been initialised, which aborts it.)
    End,
}

/// Reads the ledger topic. Clone it freely: it is a topic name and a
/// consumer configuration.
#[derive(Clone)]
pub struct LedgerReader {
    topic: String,
    /// For each read: a fresh consumer, so no state is carried over.
    consumer: rdkafka::ClientConfig,
    /// How long a read may take before it fails naming what holds it.
    read_timeout: Duration,
}

impl LedgerReader {
    /// `config` is the cluster's client configuration (brokers, security);
    /// the reader adds what a `read_committed` reader needs.
    pub(super) fn new(topic: String, mut config: rdkafka::ClientConfig) -> LedgerReader {
        // No group.id: a group handle would look up its coordinator at once
        // (see `simple_consumer`). Nothing is committed or stored.
        config
            .remove("group.id")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .set("isolation.level", "read_committed")
            .set("fetch.wait.max.ms", "10");
        LedgerReader {
            topic,
            consumer: config,
            read_timeout: READ_TIMEOUT,
        }
    }

    /// This reader with another limit on how long a read may take (30 s by
    /// default), e.g. for a test of a read held by an open transaction that
    /// need not wait the whole default.
    pub fn with_read_timeout(mut self, timeout: Duration) -> LedgerReader {
        self.read_timeout = timeout;
        self
    }

    /// The topic it reads.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The latest value per key, tombstoned keys left out, read as far as
    /// `to` says. Values are returned unparsed: another relay's entry in a
    /// newer format must not stop this one.
    pub async fn read_all(
        &self,
        to: ReadTo,
    ) -> Result<BTreeMap<String, Vec<u8>>, LedgerTopicError> {
        let (config, topic) = (self.consumer.clone(), self.topic.clone());
        let timeout = self.read_timeout;
        let read = tokio::task::spawn_blocking(move || {
            let consumer: BaseConsumer = config.create().map_err(ReadFailure::other)?;
            // The high watermark comes from a reader that sees everything.
            let all = match to {
                ReadTo::Stable => None,
                ReadTo::End => {
                    let mut all = config.clone();
                    all.set("isolation.level", "read_uncommitted");
                    Some(all.create::<BaseConsumer>().map_err(ReadFailure::other)?)
                }
            };
            let values = read_to_end(&consumer, all.as_ref(), &topic, timeout);
            // Closing a consumer waits for its threads, about 100 ms here:
            // not on the relay's way to its first event.
            let closing = std::thread::Builder::new()
                .name("outboxd-ledger-close".into())
                .spawn(move || drop((consumer, all)));
            if let Err(e) = closing {
                tracing::debug!(error = %e, "closing the ledger reader on this thread");
            }
            values
        })
        .await
        .unwrap_or_else(|e| Err(ReadFailure::other(e)));
        read.map_err(|failure| match failure {
            ReadFailure::Refused { operation, code } => LedgerTopicError::Refused {
                topic: self.topic.clone(),
                operation,
                code,
            },
            ReadFailure::Other(reason) => LedgerTopicError::Read {
                topic: self.topic.clone(),
                reason,
            },
        })
    }

    /// The entry of `identity`, if the ledger has one.
    pub async fn latest(
        &self,
        identity: &LedgerIdentity,
        to: ReadTo,
    ) -> Result<Option<LedgerEntry>, LedgerTopicError> {
        let key = identity.key();
        match self.read_all(to).await?.get(&key) {
            None => Ok(None),
            Some(value) => {
                LedgerEntry::from_json(value)
                    .map(Some)
                    .map_err(|source| LedgerTopicError::Format {
                        topic: self.topic.clone(),
                        key,
                        source,
                    })
            }
        }
    }

    /// Every readable entry for `database` and `slot`, on any server (what
    /// `progress::ledger::select_entry` chooses from). Entries of this
    /// database and slot in a format this build cannot read are an error.
    pub async fn entries_for(
        &self,
        database: &str,
        slot: &str,
        to: ReadTo,
    ) -> Result<Vec<LedgerEntry>, LedgerTopicError> {
        let mut out = Vec::new();
        for (key, value) in self.read_all(to).await? {
            let Some(id) = LedgerIdentity::from_key(&key) else {
                continue;
            };
            if id.database != database || id.slot != slot {
                continue;
            }
            out.push(LedgerEntry::from_json(&value).map_err(|source| {
                LedgerTopicError::Format {
                    topic: self.topic.clone(),
                    key,
                    source,
                }
            })?);
        }
        Ok(out)
    }
}

/// Why a read stopped short.
#[derive(Debug, PartialEq, Eq)]
enum ReadFailure {
    /// The authoriser refused `operation` (an ACL operation, e.g. `Read`)
    /// on the topic: asking again will not help.
    Refused {
        operation: &'static str,
        code: RDKafkaErrorCode,
    },
    Other(String),
}

impl ReadFailure {
    fn other(e: impl std::fmt::Display) -> ReadFailure {
        ReadFailure::Other(e.to_string())
    }

    /// A refusal if `code` is the authoriser's, for `operation`.
    fn refused(operation: &'static str, code: RDKafkaErrorCode) -> Option<ReadFailure> {
        matches!(code, RDKafkaErrorCode::TopicAuthorizationFailed)
            .then_some(ReadFailure::Refused { operation, code })
    }
}

/// Reads `topic` with `consumer` from the beginning of each partition to
/// the end as the read begins: the last stable offset `consumer` (a
/// `read_committed` client) reports, or with `all` (a `read_uncommitted`
/// one) the high watermark (see [`ReadTo`]); the last value per key wins.
fn read_to_end(
    consumer: &BaseConsumer,
    all: Option<&BaseConsumer>,
    topic: &str,
    timeout: Duration,
) -> Result<BTreeMap<String, Vec<u8>>, ReadFailure> {
    let deadline = Instant::now() + timeout;
    // The reading consumer asks for the metadata and the watermarks itself
    // even when `all` gives the end: that connects it to the leader before
    // the partitions are started. Started cold, it fetched its first record
    // 0.5 s later.
    let (stable, high) = std::thread::scope(|scope| {
        let high = all.map(|all| scope.spawn(|| partition_ends(all, topic)));
        let stable = partition_ends(consumer, topic);
        let high = high.map(|h| {
            h.join()
                .unwrap_or_else(|_| Err(ReadFailure::other("the watermark query panicked")))
        });
        (stable, high)
    });
    let ends = match high {
        Some(high) => {
            stable?;
            high?
        }
        None => stable?,
    };
    // (partition, end) of the partitions that hold anything.
    let mut ends: Vec<(i32, i64)> = ends
        .into_iter()
        .filter(|&(_, low, high)| high > low)
        .map(|(p, _, high)| (p, high))
        .collect();
    let mut values = BTreeMap::new();
    if ends.is_empty() {
        return Ok(values);
    }
    let partitions: Vec<i32> = ends.iter().map(|&(p, _)| p).collect();
    let reading =
        SimpleConsumer::start(consumer, topic, &partitions).map_err(ReadFailure::Other)?;
    while !ends.is_empty() {
        if Instant::now() >= deadline {
            return Err(ReadFailure::Other(not_read_to_the_end(
                consumer, topic, &ends, timeout,
            )));
        }
        // Serves the client's error and log events, as a group consumer's
        // poll did.
        consumer.poll(Duration::ZERO);
        let fetched = reading.next(POLL, |fetched| match fetched {
            Fetched::Record {
                partition,
                offset,
                key,
                payload,
            } => {
                let key = String::from_utf8_lossy(key.unwrap_or_default()).into_owned();
                match payload {
                    Some(v) => values.insert(key, v.to_vec()),
                    None => values.remove(&key),
                };
                Ok((partition, offset + 1))
            }
            Fetched::Error { partition, code } => Err((partition, code)),
        });
        match fetched {
            Some(Ok((p, next))) => ends.retain(|(q, high)| !(*q == p && next >= *high)),
            Some(Err((partition, code))) => {
                if let Some(refused) = ReadFailure::refused("Read", code) {
                    return Err(refused);
                }
                tracing::debug!(topic, partition, %code, "ledger read: retrying");
            }
            None => {}
        }
        // Transaction markers (a transactional writer) are never delivered:
        // the consumer's position passes them.
        for (p, next) in reading.positions() {
            if let Some(next) = next {
                ends.retain(|(q, high)| !(*q == p && next >= *high));
            }
        }
    }
    Ok(values)
}

/// (partition, low, high) of each partition of `topic`, as `client` sees
/// them (its isolation level decides what "high" is).
fn partition_ends(client: &BaseConsumer, topic: &str) -> Result<Vec<(i32, i64, i64)>, ReadFailure> {
    let md = client
        .fetch_metadata(Some(topic), METADATA_TIMEOUT)
        .map_err(ReadFailure::other)?;
    let t = md
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .ok_or_else(|| ReadFailure::other("the topic does not exist"))?;
    match t.error() {
        None => {}
        Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) => {
            return Err(ReadFailure::other("the topic does not exist"))
        }
        // Without DESCRIBE the broker says "not authorized" rather than
        // whether the topic exists.
        Some(err) => {
            let code = RDKafkaErrorCode::from(err);
            return Err(ReadFailure::refused("Describe", code)
                .unwrap_or_else(|| ReadFailure::Other(format!("the topic's metadata: {code}"))));
        }
    }
    t.partitions()
        .iter()
        .map(|p| {
            let (low, high) = client
                .fetch_watermarks(topic, p.id(), METADATA_TIMEOUT)
                .map_err(|e| {
                    match e
                        .rdkafka_error_code()
                        .and_then(|c| ReadFailure::refused("Describe", c))
                    {
                        Some(refused) => refused,
                        None => ReadFailure::Other(format!(
                            "no watermarks for partition {}: {e}",
                            p.id()
                        )),
                    }
                })?;
            Ok((p.id(), low, high))
        })
        .collect()
}

/// The error of a read that did not reach `ends` in time, with what holds
/// each partition back: the offset a `read_committed` reader may read to
/// now (its last stable offset), against the end it waits for. A gap is a
/// transaction open there; the offsets are what Kafka's tools ask for.
fn not_read_to_the_end(
    consumer: &BaseConsumer,
    topic: &str,
    ends: &[(i32, i64)],
    timeout: Duration,
) -> String {
    let held: Vec<String> = ends
        .iter()
        .map(
            |&(p, end)| match consumer.fetch_watermarks(topic, p, Duration::from_secs(5)) {
                Ok((_, stable)) => {
                    format!("partition {p} is readable to offset {stable} of {end}")
                }
                Err(e) => format!("partition {p} (end {end}; stable offset unknown: {e})"),
            },
        )
        .collect();
    format!(
        "not read to the end within {}s: {}. A transaction open at the first unreadable \
         offset holds read_committed readers back, e.g. one a relay left open when it stopped \
         mid-commit, until the broker aborts it after that relay's transaction.timeout.ms. \
         `kafka-transactions.sh --bootstrap-server BROKER describe-producers --topic {topic} \
         --partition P` names its producer; `kafka-transactions.sh find-hanging` tells \
         whether it hangs (no coordinator will end it: Kafka leaves one when a transaction ends \
         while a partition of it has no leader, KAFKA-20734). Before `kafka-transactions.sh \
         abort` ends one, see docs/operations.md (\"A ledger read held by an open transaction\")",
        timeout.as_secs(),
        held.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reader_uses_no_consumer_group_even_when_the_properties_name_one() {
        let mut cluster = rdkafka::ClientConfig::new();
        cluster
            .set("bootstrap.servers", "127.0.0.1:9")
            .set("group.id", "from-kafka-properties");
        let reader = LedgerReader::new("ledger".into(), cluster);
        assert_eq!(reader.consumer.get("group.id"), None);
        assert_eq!(reader.consumer.get("enable.auto.commit"), Some("false"));
        assert_eq!(
            reader.consumer.get("isolation.level"),
            Some("read_committed")
        );
    }

    #[test]
    fn only_the_authorisers_refusal_stops_a_read_at_once() {
        assert_eq!(
            ReadFailure::refused("Read", RDKafkaErrorCode::TopicAuthorizationFailed),
            Some(ReadFailure::Refused {
                operation: "Read",
                code: RDKafkaErrorCode::TopicAuthorizationFailed
            })
        );
        for passing in [
            RDKafkaErrorCode::NotLeaderForPartition,
            RDKafkaErrorCode::BrokerTransportFailure,
            RDKafkaErrorCode::UnknownTopicOrPartition,
        ] {
            assert_eq!(ReadFailure::refused("Read", passing), None, "{passing:?}");
        }
    }

    #[test]
    fn a_consumer_without_a_group_starts_reading_a_partition() {
        // librdkafka's simple consumer needs no broker to start: the fetch
        // waits for one. With a group.id, assign() would be the way.
        let mut config = rdkafka::ClientConfig::new();
        config.set("bootstrap.servers", "127.0.0.1:9");
        let consumer: BaseConsumer = config.create().unwrap();
        let reading = SimpleConsumer::start(&consumer, "ledger", &[0, 1]).unwrap();
        assert_eq!(reading.positions().len(), 2);
        assert!(reading.next(Duration::from_millis(10), |_| ()).is_none());
    }
}
