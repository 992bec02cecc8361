//! [`LedgerReader`]: reads the position ledger's topic back, as far as
//! [`ReadTo`] says. Each read uses fresh consumers (no state carried over);
//! the reader itself is cheap to keep and clone, so a relay keeps one for
//! its re-reads instead of building the whole ledger client (admin client
//! and producer) each time, whose closing alone cost about 140 ms of the
//! exactly-once start.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use super::ledger_error::LedgerTopicError;
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
}

impl LedgerReader {
    /// `config` is the cluster's client configuration (brokers, security);
    /// the reader adds what a `read_committed` reader needs.
    pub(super) fn new(topic: String, mut config: rdkafka::ClientConfig) -> LedgerReader {
        // librdkafka wants a group id even for assign(); nothing is joined
        // or committed under it.
        config
            .set("group.id", "outboxd-ledger-reader")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .set("isolation.level", "read_committed")
            .set("fetch.wait.max.ms", "10");
        LedgerReader {
            topic,
            consumer: config,
        }
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
        tokio::task::spawn_blocking(move || {
            let consumer: BaseConsumer = config.create().map_err(|e| e.to_string())?;
            // The high watermark comes from a reader that sees everything.
            let all = match to {
                ReadTo::Stable => None,
                ReadTo::End => {
                    let mut all = config.clone();
                    all.set("isolation.level", "read_uncommitted");
                    Some(all.create::<BaseConsumer>().map_err(|e| e.to_string())?)
                }
            };
            let values = read_to_end(&consumer, all.as_ref(), &topic);
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
        .unwrap_or_else(|e| Err(e.to_string()))
        .map_err(|reason| LedgerTopicError::Read {
            topic: self.topic.clone(),
            reason,
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

/// Reads `topic` with `consumer` from the beginning of each partition to
/// the end as the read begins: the last stable offset `consumer` (a
/// `read_committed` client) reports, or with `all` (a `read_uncommitted`
/// one) the high watermark (see [`ReadTo`]); the last value per key wins.
fn read_to_end(
    consumer: &BaseConsumer,
    all: Option<&BaseConsumer>,
    topic: &str,
) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let deadline = Instant::now() + READ_TIMEOUT;
    // The reading consumer asks for the metadata and the watermarks itself
    // even when `all` gives the end: that connects it to the leader before
    // the assignment. Assigned cold, it fetched its first record 0.5 s later.
    let (stable, high) = std::thread::scope(|scope| {
        let high = all.map(|all| scope.spawn(|| partition_ends(all, topic)));
        let stable = partition_ends(consumer, topic);
        let high = high.map(|h| {
            h.join()
                .unwrap_or_else(|_| Err("the watermark query panicked".into()))
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
    let mut tpl = TopicPartitionList::new();
    for (p, _) in &ends {
        tpl.add_partition_offset(topic, *p, Offset::Beginning)
            .map_err(|e| e.to_string())?;
    }
    consumer.assign(&tpl).map_err(|e| e.to_string())?;
    while !ends.is_empty() {
        if Instant::now() >= deadline {
            return Err(not_read_to_the_end(consumer, topic, &ends));
        }
        match consumer.poll(POLL) {
            Some(Ok(m)) => {
                let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
                match m.payload() {
                    Some(v) => values.insert(key, v.to_vec()),
                    None => values.remove(&key),
                };
                let (p, next) = (m.partition(), m.offset() + 1);
                ends.retain(|(q, high)| !(*q == p && next >= *high));
            }
            Some(Err(e)) => tracing::debug!(topic, error = %e, "ledger read: retrying"),
            None => {}
        }
        // Transaction markers (a transactional writer) are never delivered:
        // the consumer's position passes them.
        if let Ok(position) = consumer.position() {
            for e in position.elements() {
                if let Offset::Offset(next) = e.offset() {
                    ends.retain(|(q, high)| !(*q == e.partition() && next >= *high));
                }
            }
        }
    }
    Ok(values)
}

/// (partition, low, high) of each partition of `topic`, as `client` sees
/// them (its isolation level decides what "high" is).
fn partition_ends(client: &BaseConsumer, topic: &str) -> Result<Vec<(i32, i64, i64)>, String> {
    let md = client
        .fetch_metadata(Some(topic), METADATA_TIMEOUT)
        .map_err(|e| e.to_string())?;
    let t = md
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none())
        .ok_or_else(|| "the topic does not exist".to_owned())?;
    t.partitions()
        .iter()
        .map(|p| {
            let (low, high) = client
                .fetch_watermarks(topic, p.id(), METADATA_TIMEOUT)
                .map_err(|e| format!("no watermarks for partition {}: {e}", p.id()))?;
            Ok((p.id(), low, high))
        })
        .collect()
}

/// The error of a read that did not reach `ends` in time, with what holds
/// each partition back: the offset a `read_committed` reader may read to
/// now (its last stable offset), against the end it waits for. A gap is a
/// transaction open there; the offsets are what Kafka's tools ask for.
fn not_read_to_the_end(consumer: &BaseConsumer, topic: &str, ends: &[(i32, i64)]) -> String {
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
        READ_TIMEOUT.as_secs(),
        held.join(", ")
    )
}
