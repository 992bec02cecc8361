//! [`LedgerTopic`]: the position ledger's compacted Kafka topic
//! (`kafka.ledger_topic`), like Kafka Connect's offset storage: one record
//! per relay identity, the last value per key is the ledger. What an entry
//! says and when one is written is `crate::progress::ledger`'s business;
//! this file only keeps the topic, writes records and reads them back.
//!
//! - **Compacted, one partition.** `cleanup.policy=compact` (and nothing
//!   else: with `delete` too, the entry of a relay stopped for longer than
//!   the retention would expire, and its restart would look like a first
//!   start). One partition keeps reading it back cheap; the topic is tiny.
//! - **Written by the idempotent producer**, with the sink's properties
//!   ([`client_config`]), one record at a time, awaited.
//! - **Read from the beginning to the high watermark** with read_committed
//!   isolation; the last value per key wins and a tombstone (null value)
//!   deletes the key.
//!
//! The exactly-once mode does not use [`LedgerTopic::write`]: its
//! transactional producer sends [`ledger_record`]'s key and value to this
//! topic inside each Kafka transaction, after the transaction's records, so
//! the position commits with them or not at all (read_committed readers
//! never see an aborted entry; see `relay::session::commit`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::{RDKafkaErrorCode, RDKafkaRespErr};
use rdkafka::util::Timeout;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use super::config::{admin_client_config, client_config};
use super::delivery;
use super::error::SinkError;
use super::topics::{create_topic, Created, READY_TIMEOUT};
use crate::config::KafkaConfig;
use crate::progress::ledger::{LedgerEntry, LedgerFormatError, LedgerIdentity};

/// The ledger topic's partition count when outboxd creates it: the topic
/// holds one small record per relay, and one partition reads back in one go.
pub const LEDGER_TOPIC_PARTITIONS: i32 = 1;
/// The one cleanup policy the ledger accepts.
const COMPACT: &str = "compact";
/// One metadata or DescribeConfigs round trip, as the topic manager allows.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);
/// Reading the whole topic: a few records per relay, so seconds at most on
/// a reachable cluster; 30 s covers a broker that is slow to serve fetches.
const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Between two polls (and two looks at a topic being created).
const POLL: Duration = Duration::from_millis(200);

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

/// What the cluster says about the ledger topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerTopicState {
    Missing,
    Compacted {
        partitions: usize,
    },
    /// Exists with another `cleanup.policy` (e.g. `delete`).
    NotCompacted {
        policy: String,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum LedgerTopicError {
    #[error(transparent)]
    Sink(#[from] SinkError),

    #[error(
        "the ledger topic `{topic}` (kafka.ledger_topic) does not exist; create it compacted \
         (kafka-topics.sh --create --topic {topic} --partitions 1 --config \
         cleanup.policy=compact), or set kafka.create_topics = true to let outboxd create it"
    )]
    Missing { topic: String },

    #[error(
        "the ledger topic `{topic}` (kafka.ledger_topic) has cleanup.policy={policy}; it must \
         be exactly `compact`, or a stopped relay's position expires with the retention: \
         kafka-configs.sh --alter --entity-type topics --entity-name {topic} --add-config \
         cleanup.policy=compact, or point kafka.ledger_topic at a compacted topic"
    )]
    NotCompacted { topic: String, policy: String },

    #[error(
        "cannot read the configuration of the ledger topic `{topic}` (kafka.ledger_topic) to \
         check that it is compacted: {code}; grant the principal DESCRIBE_CONFIGS on the topic"
    )]
    Describe {
        topic: String,
        code: RDKafkaErrorCode,
    },

    #[error("cannot write the ledger entry to `{topic}`: {source}")]
    Write {
        topic: String,
        #[source]
        source: KafkaError,
    },

    #[error("cannot read the ledger topic `{topic}`: {reason}")]
    Read { topic: String, reason: String },

    #[error("ledger record `{key}` in `{topic}`: {source}")]
    Format {
        topic: String,
        key: String,
        #[source]
        source: LedgerFormatError,
    },
}

/// The ledger record for `entry`: (key, value). For any producer that
/// writes it, e.g. a transactional one (see the module documentation).
pub fn ledger_record(entry: &LedgerEntry) -> (String, Vec<u8>) {
    (entry.identity().key(), entry.to_json())
}

/// The topic as outboxd creates it (and as `outboxd check` validates it).
pub fn new_ledger_topic(topic: &str, replication_factor: i32) -> NewTopic<'_> {
    NewTopic::new(
        topic,
        LEDGER_TOPIC_PARTITIONS,
        TopicReplication::Fixed(replication_factor),
    )
    .set("cleanup.policy", COMPACT)
}

/// Whether `topic` exists and is compacted: a metadata request, then
/// DescribeConfigs.
pub async fn inspect_ledger_topic<C: ClientContext + 'static>(
    admin: &Arc<AdminClient<C>>,
    topic: &str,
) -> Result<LedgerTopicState, LedgerTopicError> {
    let partitions = super::topics::describe_topic(admin, topic)
        .await
        .map_err(|source| SinkError::Metadata {
            topic: topic.to_owned(),
            source,
        })?;
    let partitions = match partitions {
        None | Some((Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART), _)) => {
            return Ok(LedgerTopicState::Missing)
        }
        Some((None, n)) => n,
        // Being created: its configuration is already there to describe.
        Some((Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE), n)) => n,
        Some((Some(err), _)) => {
            return Err(SinkError::Topic {
                topic: topic.to_owned(),
                code: err.into(),
            }
            .into())
        }
    };
    let options = AdminOptions::new().request_timeout(Some(METADATA_TIMEOUT));
    let describe = |code| LedgerTopicError::Describe {
        topic: topic.to_owned(),
        code,
    };
    let results = admin
        .describe_configs([&ResourceSpecifier::Topic(topic)], &options)
        .await
        .map_err(|e| describe(e.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail)))?;
    let resource = results
        .into_iter()
        .next()
        .ok_or(describe(RDKafkaErrorCode::Fail))?
        .map_err(describe)?;
    let policy = resource
        .get("cleanup.policy")
        .and_then(|e| e.value.clone())
        .unwrap_or_else(|| "delete".to_owned());
    Ok(if is_compact_only(&policy) {
        LedgerTopicState::Compacted { partitions }
    } else {
        LedgerTopicState::NotCompacted { policy }
    })
}

/// `compact`, however written; `compact,delete` is not.
fn is_compact_only(policy: &str) -> bool {
    let mut parts = policy.split(',').map(str::trim).filter(|p| !p.is_empty());
    parts.next() == Some(COMPACT) && parts.all(|p| p == COMPACT)
}

/// The clients' context: librdkafka logs and errors to tracing.
struct LedgerContext;

impl ClientContext for LedgerContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        delivery::forward_log(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        // Transport errors were logged by librdkafka already (see
        // `DeliveryContext::error`); the write or read fails on its own.
        let logged = matches!(
            error.rdkafka_error_code(),
            Some(
                RDKafkaErrorCode::BrokerTransportFailure
                    | RDKafkaErrorCode::AllBrokersDown
                    | RDKafkaErrorCode::Resolve
            )
        );
        if logged {
            tracing::debug!(target: "librdkafka", %error, %reason, "Kafka ledger client error");
        } else {
            tracing::warn!(target: "librdkafka", %error, %reason, "Kafka ledger client error");
        }
    }
}

/// The ledger topic: ensure it, write entries, read them back.
pub struct LedgerTopic {
    topic: String,
    create: bool,
    replication_factor: i32,
    admin: Arc<AdminClient<LedgerContext>>,
    producer: FutureProducer<LedgerContext>,
    /// What [`renew_producer`](Self::renew_producer) makes a new one from.
    producer_config: rdkafka::ClientConfig,
    /// For each read: a fresh consumer, so no state is carried over.
    consumer: rdkafka::ClientConfig,
}

impl LedgerTopic {
    pub fn new(brokers: &str, kafka: &KafkaConfig) -> Result<LedgerTopic, LedgerTopicError> {
        let client = |name, e| SinkError::Client {
            client: name,
            source: e,
        };
        let mut admin = admin_client_config(brokers, &kafka.properties).map_err(SinkError::from)?;
        admin.set_log_level(delivery::log_level());
        let mut consumer = admin.clone();
        let admin = admin
            .create_with_context(LedgerContext)
            .map_err(|e| client("admin client", e))?;
        let mut producer = client_config(brokers, &kafka.properties).map_err(SinkError::from)?;
        producer.set_log_level(delivery::log_level());
        let producer_config = producer.clone();
        let producer = producer
            .create_with_context(LedgerContext)
            .map_err(|e| client("ledger producer", e))?;
        // librdkafka wants a group id even for assign(); nothing is joined
        // or committed under it.
        consumer
            .set("group.id", "outboxd-ledger-reader")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .set("isolation.level", "read_committed")
            .set("fetch.wait.max.ms", "10");
        Ok(LedgerTopic {
            topic: kafka.ledger_topic.clone(),
            create: kafka.create_topics,
            replication_factor: kafka.topic_replication_factor,
            admin: Arc::new(admin),
            producer,
            producer_config,
            consumer,
        })
    }

    /// Replaces the producer with a new one (a new producer id). After a
    /// broker paused under load, an idempotent producer was seen to time out
    /// every later record for good while the relay's own producer went on;
    /// a fresh one writes at once.
    pub(crate) fn renew_producer(&mut self) -> Result<(), LedgerTopicError> {
        let fresh = self
            .producer_config
            .create_with_context(LedgerContext)
            .map_err(|e| {
                LedgerTopicError::from(SinkError::Client {
                    client: "ledger producer",
                    source: e,
                })
            })?;
        let old = std::mem::replace(&mut self.producer, fresh);
        // Dropping a librdkafka client joins its threads: not on this one.
        tokio::task::spawn_blocking(move || drop(old));
        Ok(())
    }

    /// Ok once the topic exists and is compacted, creating it when
    /// `kafka.create_topics` allows (and waiting until it takes writes).
    pub async fn ensure(&self) -> Result<(), LedgerTopicError> {
        match inspect_ledger_topic(&self.admin, &self.topic).await? {
            LedgerTopicState::Compacted { .. } => Ok(()),
            LedgerTopicState::NotCompacted { policy } => Err(LedgerTopicError::NotCompacted {
                topic: self.topic.clone(),
                policy,
            }),
            LedgerTopicState::Missing if self.create => self.create().await,
            LedgerTopicState::Missing => Err(LedgerTopicError::Missing {
                topic: self.topic.clone(),
            }),
        }
    }

    async fn create(&self) -> Result<(), LedgerTopicError> {
        let topic = self.topic.clone();
        let creation = |code| SinkError::CreateTopic {
            topic: topic.clone(),
            code,
        };
        match create_topic(
            &self.admin,
            &new_ledger_topic(&topic, self.replication_factor),
        )
        .await
        {
            Ok(Created::Now) => tracing::info!(
                topic,
                replication_factor = self.replication_factor,
                "created the ledger topic (compacted)"
            ),
            // Another relay was quicker: check what it created.
            Ok(Created::AlreadyThere) => {}
            Err(code) => return Err(creation(code).into()),
        }
        self.wait_writable().await?;
        // Whoever created it, it has to be compacted.
        match inspect_ledger_topic(&self.admin, &topic).await? {
            LedgerTopicState::Compacted { .. } => Ok(()),
            LedgerTopicState::NotCompacted { policy } => {
                Err(LedgerTopicError::NotCompacted { topic, policy })
            }
            LedgerTopicState::Missing => Err(LedgerTopicError::Missing { topic }),
        }
    }

    /// Until every partition answers ListOffsets on its leader (a new
    /// topic's partitions take writes a moment after they show in the
    /// metadata; see `TopicManager::wait_ready`).
    async fn wait_writable(&self) -> Result<(), LedgerTopicError> {
        let (admin, topic) = (Arc::clone(&self.admin), self.topic.clone());
        let ready = tokio::task::spawn_blocking(move || {
            let deadline = Instant::now() + READY_TIMEOUT;
            while Instant::now() < deadline {
                if let Ok(md) = admin.inner().fetch_metadata(Some(&topic), POLL * 10) {
                    let writable =
                        md.topics()
                            .iter()
                            .find(|t| t.name() == topic)
                            .is_some_and(|t| {
                                !t.partitions().is_empty()
                                    && t.partitions().iter().all(|p| {
                                        p.leader() >= 0
                                            && admin
                                                .inner()
                                                .fetch_watermarks(&topic, p.id(), POLL * 10)
                                                .is_ok()
                                    })
                            });
                    if writable {
                        return true;
                    }
                }
                std::thread::sleep(POLL);
            }
            false
        })
        .await
        .unwrap_or(false);
        if ready {
            Ok(())
        } else {
            Err(SinkError::TopicNotReady {
                topic: self.topic.clone(),
                waited: READY_TIMEOUT,
            }
            .into())
        }
    }

    /// Writes `entry` under its identity's key and waits for Kafka's ack.
    /// Returns (partition, offset).
    pub async fn write(&self, entry: &LedgerEntry) -> Result<(i32, i64), LedgerTopicError> {
        let (key, value) = ledger_record(entry);
        self.produce(&key, Some(&value)).await
    }

    /// Deletes `identity`'s entry (a tombstone; compaction removes the key).
    pub async fn delete(&self, identity: &LedgerIdentity) -> Result<(i32, i64), LedgerTopicError> {
        self.produce(&identity.key(), None).await
    }

    async fn produce(
        &self,
        key: &str,
        value: Option<&[u8]>,
    ) -> Result<(i32, i64), LedgerTopicError> {
        let mut record = FutureRecord::<str, [u8]>::to(&self.topic).key(key);
        if let Some(v) = value {
            record = record.payload(v);
        }
        // The producer's message.timeout.ms bounds the wait.
        self.producer
            .send(record, Timeout::After(Duration::ZERO))
            .await
            .map_err(|(source, _)| LedgerTopicError::Write {
                topic: self.topic.clone(),
                source,
            })
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
            let values = read_to_end(&consumer, all.as_ref().unwrap_or(&consumer), &topic);
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
/// the end `watermarks` reports as the read begins (the high watermark for a
/// `read_uncommitted` client, the last stable offset for a `read_committed`
/// one: see [`ReadTo`]); the last value per key wins.
fn read_to_end(
    consumer: &BaseConsumer,
    watermarks: &BaseConsumer,
    topic: &str,
) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let deadline = Instant::now() + READ_TIMEOUT;
    let md = watermarks
        .fetch_metadata(Some(topic), METADATA_TIMEOUT)
        .map_err(|e| e.to_string())?;
    let t = md
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none())
        .ok_or_else(|| "the topic does not exist".to_owned())?;
    // (partition, high watermark) of the partitions that hold anything.
    let mut ends = Vec::new();
    for p in t.partitions() {
        let (low, high) = watermarks
            .fetch_watermarks(topic, p.id(), METADATA_TIMEOUT)
            .map_err(|e| format!("no watermarks for partition {}: {e}", p.id()))?;
        if high > low {
            ends.push((p.id(), high));
        }
    }
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
            return Err(format!(
                "not read to the end within {}s (a transaction left open on the topic, \
                 by a relay that stopped mid-commit, holds a read_committed reader back \
                 until the broker aborts it after the relay's transaction.timeout.ms)",
                READ_TIMEOUT.as_secs()
            ));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_is_the_identity_key_and_the_json_entry() {
        use crate::progress::ledger::{LedgerWriter, LEDGER_VERSION};
        let identity = LedgerIdentity {
            system_identifier: "42".into(),
            database: "app".into(),
            slot: "s".into(),
        };
        let entry = LedgerWriter::new(identity, 3, Duration::from_secs(1), None)
            .flush(crate::Lsn(0x10), 5)
            .unwrap();
        let (key, value) = ledger_record(&entry);
        assert_eq!(key, "42/app/s");
        let parsed = LedgerEntry::from_json(&value).unwrap();
        assert_eq!((parsed.version, parsed.timeline), (LEDGER_VERSION, 3));
        assert_eq!(parsed, entry);
    }

    #[test]
    fn only_pure_compaction_counts() {
        assert!(is_compact_only("compact"));
        assert!(is_compact_only(" compact "));
        for other in ["delete", "compact,delete", "delete,compact", ""] {
            assert!(!is_compact_only(other), "{other}");
        }
    }
}
