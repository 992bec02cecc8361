//! [`LedgerTopic`]: the position ledger's compacted Kafka topic
//! (`kafka.ledger_topic`), like Kafka Connect's offset storage: one record
//! per relay identity, the last value per key is the ledger. What an entry
//! says and when one is written is `crate::progress::ledger`'s business;
//! this file only keeps the topic and writes records; reading them back is
//! [`LedgerReader`]'s.
//!
//! - **Compacted, one partition.** `cleanup.policy=compact` (and nothing
//!   else: with `delete` too, the entry of a relay stopped for longer than
//!   the retention would expire, and its restart would look like a first
//!   start). One partition keeps reading it back cheap; the topic is tiny.
//! - **Written by the idempotent producer**, with the sink's properties
//!   ([`client_config`]) but a `message.timeout.ms` of its own when the
//!   relay gives one ([`LedgerTopic::with_write_timeout`]): one record at a
//!   time, awaited. The relay's writer task abandons a write that passes
//!   its age limit and replaces the producer
//!   ([`renew_producer`](LedgerTopic::renew_producer)).
//! - **Read from the beginning to the end** with read_committed isolation
//!   ([`LedgerReader`]); the last value per key wins and a tombstone (null
//!   value) deletes the key.
//!
//! The exactly-once mode does not use [`LedgerTopic::write`]: its
//! transactional producer sends [`ledger_record`]'s key and value to this
//! topic inside each Kafka transaction, after the transaction's records, so
//! the position commits with them or not at all (read_committed readers
//! never see an aborted entry; see `relay::session::commit`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, NewTopic, TopicReplication};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use rdkafka::producer::{FutureProducer, FutureRecord, Producer, PurgeConfig};
use rdkafka::types::{RDKafkaErrorCode, RDKafkaRespErr};
use rdkafka::util::Timeout;
use rdkafka::ClientContext;

use super::config::{admin_client_config, client_config};
use super::delivery;
use super::error::SinkError;
use super::ledger_error::LedgerTopicError;
use super::ledger_reader::LedgerReader;
use super::topic_config::{describe_topic_config, TopicConfig};
use super::topics::{create_topic, Created, READY_TIMEOUT};
use crate::config::KafkaConfig;
use crate::progress::ledger::{LedgerEntry, LedgerIdentity};

/// The ledger topic's partition count when outboxd creates it: the topic
/// holds one small record per relay, and one partition reads back in one go.
pub const LEDGER_TOPIC_PARTITIONS: i32 = 1;
/// The one cleanup policy the ledger accepts.
const COMPACT: &str = "compact";
/// One metadata or DescribeConfigs round trip, as the topic manager allows.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);
/// Between two looks at a topic being created.
const POLL: Duration = Duration::from_millis(200);
/// How long a broker may take to know a topic another broker's controller
/// created: metadata reaches every broker within a second or so on a
/// healthy cluster; 10 s leaves room for a busy one.
const TOPIC_SETTLE: Duration = Duration::from_secs(10);

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
    let policy = cleanup_policy(admin, topic).await?;
    Ok(if is_compact_only(&policy) {
        LedgerTopicState::Compacted { partitions }
    } else {
        LedgerTopicState::NotCompacted { policy }
    })
}

/// The topic's `cleanup.policy`, as DescribeConfigs reports it. A broker
/// that has not applied a topic just created yet (another broker's
/// controller did) answers UnknownTopicOrPartition, or no entry: asked
/// again until [`TOPIC_SETTLE`]. A refusal is final at once.
async fn cleanup_policy<C: ClientContext + 'static>(
    admin: &Arc<AdminClient<C>>,
    topic: &str,
) -> Result<String, LedgerTopicError> {
    let deadline = tokio::time::Instant::now() + TOPIC_SETTLE;
    loop {
        let answer = describe_topic_config(admin, topic, METADATA_TIMEOUT).await;
        match judge_description(topic, answer) {
            Described::Policy(policy) => return Ok(policy),
            Described::Final(e) => return Err(e),
            Described::NotYet(e) if tokio::time::Instant::now() + POLL >= deadline => {
                return Err(e)
            }
            Described::NotYet(e) => {
                tracing::debug!(topic, error = %e, "ledger topic configuration: asking again");
                tokio::time::sleep(POLL).await;
            }
        }
    }
}

/// What one DescribeConfigs answer says of the ledger topic's policy.
#[derive(Debug)]
enum Described {
    Policy(String),
    /// Maybe a broker that does not know the topic yet: ask again.
    NotYet(LedgerTopicError),
    Final(LedgerTopicError),
}

fn judge_description(topic: &str, answer: Result<TopicConfig, RDKafkaErrorCode>) -> Described {
    let describe = |code| LedgerTopicError::Describe {
        topic: topic.to_owned(),
        code,
    };
    match answer {
        Ok(config) => match config.get("cleanup.policy") {
            Some(Some(policy)) => Described::Policy(policy.clone()),
            // Never a guess: a topic always has a policy, so an answer
            // without one is not an answer about it.
            _ => Described::NotYet(LedgerTopicError::PolicyNotReported {
                topic: topic.to_owned(),
                waited: TOPIC_SETTLE,
            }),
        },
        Err(code @ RDKafkaErrorCode::UnknownTopicOrPartition) => Described::NotYet(describe(code)),
        Err(code) => Described::Final(describe(code)),
    }
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

/// One write under way ([`LedgerTopic::start_write`]): (partition, offset)
/// once Kafka acknowledged it.
pub(crate) type LedgerWrite = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<(i32, i64), LedgerTopicError>> + Send>,
>;

/// The ledger topic: ensure it, write entries, read them back.
pub struct LedgerTopic {
    topic: String,
    create: bool,
    replication_factor: i32,
    admin: Arc<AdminClient<LedgerContext>>,
    producer: FutureProducer<LedgerContext>,
    /// What [`renew_producer`](Self::renew_producer) makes a new one from.
    producer_config: rdkafka::ClientConfig,
    reader: LedgerReader,
}

impl LedgerTopic {
    /// The topic, written with the sink's `message.timeout.ms`.
    pub fn new(brokers: &str, kafka: &KafkaConfig) -> Result<LedgerTopic, LedgerTopicError> {
        LedgerTopic::with_write_timeout(brokers, kafka, None)
    }

    /// The topic, its writes given up by librdkafka after `write_timeout`
    /// (`message.timeout.ms`, whatever `[kafka.properties]` says: the relay's
    /// writer replaces a producer whose write hangs past it, see
    /// `kafka.ledger_write_timeout`); `None`: the sink's.
    pub fn with_write_timeout(
        brokers: &str,
        kafka: &KafkaConfig,
        write_timeout: Option<Duration>,
    ) -> Result<LedgerTopic, LedgerTopicError> {
        let client = |name, e| SinkError::Client {
            client: name,
            source: e,
        };
        let mut admin = admin_client_config(brokers, &kafka.properties).map_err(SinkError::from)?;
        admin.set_log_level(delivery::log_level());
        let reader = LedgerReader::new(kafka.ledger_topic.clone(), admin.clone());
        let admin = admin
            .create_with_context(LedgerContext)
            .map_err(|e| client("admin client", e))?;
        let mut producer = client_config(brokers, &kafka.properties).map_err(SinkError::from)?;
        producer.set_log_level(delivery::log_level());
        if let Some(timeout) = write_timeout {
            producer
                .remove("delivery.timeout.ms")
                .set("message.timeout.ms", timeout.as_millis().to_string());
        }
        let producer_config = producer.clone();
        let producer = producer
            .create_with_context(LedgerContext)
            .map_err(|e| client("ledger producer", e))?;
        Ok(LedgerTopic {
            topic: kafka.ledger_topic.clone(),
            create: kafka.create_topics,
            replication_factor: kafka.ledger_replication_factor,
            admin: Arc::new(admin),
            producer,
            producer_config,
            reader,
        })
    }

    /// Reads the topic back (see [`LedgerReader`]).
    pub fn reader(&self) -> &LedgerReader {
        &self.reader
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
        // What it still holds must not land after what the new one writes:
        // purged (a request already on the wire may still be appended: an
        // older, acked position, see `progress::ledger::LedgerWrites`).
        old.purge(PurgeConfig::default().queue().inflight().non_blocking());
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
        // Whoever created it, it has to be compacted. The look may reach a
        // broker that has not applied the new topic yet (another answered
        // `wait_writable`): its "unknown topic" is no fact about a topic
        // the cluster just confirmed, so it is asked again, as the
        // configuration is (a first start on a 3-broker cluster exited
        // here, "does not exist", right after creating it).
        let deadline = tokio::time::Instant::now() + TOPIC_SETTLE;
        loop {
            match inspect_ledger_topic(&self.admin, &topic).await? {
                LedgerTopicState::Compacted { .. } => return Ok(()),
                LedgerTopicState::NotCompacted { policy } => {
                    return Err(LedgerTopicError::NotCompacted { topic, policy })
                }
                LedgerTopicState::Missing if tokio::time::Instant::now() + POLL < deadline => {
                    tracing::debug!(topic, "ledger topic not known to the broker asked yet");
                    tokio::time::sleep(POLL).await;
                }
                LedgerTopicState::Missing => return Err(LedgerTopicError::Missing { topic }),
            }
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

    /// Hands `entry` to the producer now; the future is Kafka's answer. It
    /// borrows nothing, so the caller may give up on it (drop it) and
    /// [`renew_producer`](Self::renew_producer) while it is pending.
    pub(crate) fn start_write(&self, entry: &LedgerEntry) -> LedgerWrite {
        let (key, value) = ledger_record(entry);
        let record = FutureRecord::<str, [u8]>::to(&self.topic)
            .key(&key)
            .payload(&value);
        let topic = self.topic.clone();
        let write = self.producer.send_result(record).map_err(|(e, _)| e);
        Box::pin(async move {
            let failed = |source| LedgerTopicError::Write {
                topic: topic.clone(),
                source,
            };
            match write {
                Err(e) => Err(failed(e)),
                Ok(report) => match report.await {
                    Ok(Ok(at)) => Ok(at),
                    Ok(Err((e, _))) => Err(failed(e)),
                    // The producer went away with the record.
                    Err(_canceled) => Err(failed(KafkaError::Canceled)),
                },
            }
        })
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
    fn a_description_without_a_policy_is_asked_again_and_never_read_as_delete() {
        let policy = |v: Option<&str>| {
            TopicConfig::from([("cleanup.policy".to_owned(), v.map(str::to_owned))])
        };
        assert!(matches!(
            judge_description("l", Ok(policy(Some("compact")))),
            Described::Policy(p) if p == "compact"
        ));
        for empty in [TopicConfig::new(), policy(None)] {
            match judge_description("l", Ok(empty)) {
                Described::NotYet(e @ LedgerTopicError::PolicyNotReported { .. }) => {
                    assert!(!e.to_string().contains("cleanup.policy=delete"), "{e}");
                }
                other => panic!("{other:?}"),
            }
        }
        // A broker that has not applied a new topic yet.
        assert!(matches!(
            judge_description("l", Err(RDKafkaErrorCode::UnknownTopicOrPartition)),
            Described::NotYet(LedgerTopicError::Describe { .. })
        ));
        // The authoriser's refusal is final, and names the right.
        match judge_description("l", Err(RDKafkaErrorCode::TopicAuthorizationFailed)) {
            Described::Final(e) => {
                assert!(e.to_string().contains("DESCRIBE_CONFIGS"), "{e}");
                assert!(e.is_refused_by_authorizer());
            }
            other => panic!("{other:?}"),
        }
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
