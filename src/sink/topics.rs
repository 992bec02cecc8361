//! [`TopicManager`]: makes sure a topic exists before the first record goes
//! to it, creating it when `kafka.create_topics` allows.
//!
//! The producer never creates topics itself (`allow.auto.create.topics` is
//! off, here and by default on the producer): a topic a broker auto-creates
//! gets the broker's partition count, not `kafka.topic_partitions`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use rdkafka::metadata::Metadata;
use rdkafka::types::{RDKafkaErrorCode, RDKafkaRespErr};
use rdkafka::ClientContext;

use super::admin_refusal::{AdminRefusal, CREATE_TIMEOUT};
use super::config::admin_client_config;
use super::delivery;
use super::error::{creation_error, SinkError};
use crate::config::KafkaConfig;

/// One metadata round trip. Ample for a reachable cluster; when it is not,
/// the relay reconnects with backoff and asks again.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);
/// Until every partition of a created topic has a leader. Usually well under
/// a second; 30 s covers a busy controller.
pub(super) const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Between two CreateTopics requests the cluster refused for the moment.
const CREATE_RETRY: Duration = Duration::from_millis(500);
/// Between two metadata checks while waiting for leaders.
const READY_POLL: Duration = Duration::from_millis(200);

/// The admin client's context: librdkafka logs and errors to tracing.
struct AdminContext;

impl ClientContext for AdminContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        delivery::forward_log(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(target: "librdkafka", %error, %reason, "Kafka admin client error");
    }
}

/// What the cluster's metadata says about one topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TopicState {
    Missing,
    /// `ready`: every partition has a leader.
    Exists {
        ready: bool,
    },
    /// The broker answered with an error for it (e.g. not authorized).
    Refused(RDKafkaErrorCode),
}

pub(crate) struct TopicManager {
    admin: Arc<AdminClient<AdminContext>>,
    create: bool,
    partitions: i32,
    replication_factor: i32,
    /// Topics seen to exist, not asked about again.
    known: HashSet<String>,
}

impl TopicManager {
    pub(crate) fn new(brokers: &str, kafka: &KafkaConfig) -> Result<TopicManager, SinkError> {
        let mut config = admin_client_config(brokers, &kafka.properties)?;
        config.set_log_level(delivery::log_level());
        let admin = config
            .create_with_context(AdminContext)
            .map_err(|e| creation_error("admin client", e, &kafka.properties))?;
        Ok(TopicManager {
            admin: Arc::new(admin),
            create: kafka.create_topics,
            partitions: kafka.topic_partitions,
            replication_factor: kafka.topic_replication_factor,
            known: HashSet::new(),
        })
    }

    /// Ok once `topic` exists: from the cache, from metadata, or by creating
    /// it (`kafka.create_topics`) and waiting until every partition has a
    /// leader. [`SinkError::MissingTopic`] when it is missing and may not be
    /// created.
    pub(crate) async fn ensure(&mut self, topic: &str) -> Result<(), SinkError> {
        if self.known.contains(topic) {
            return Ok(());
        }
        match self.state(topic).await? {
            // A leaderless partition of an existing topic is the producer's
            // to wait out (it retries until message.timeout.ms).
            TopicState::Exists { .. } => {}
            TopicState::Missing if self.create => self.create(topic).await?,
            TopicState::Missing => {
                return Err(SinkError::MissingTopic {
                    topic: topic.to_owned(),
                })
            }
            TopicState::Refused(code) => {
                return Err(SinkError::Topic {
                    topic: topic.to_owned(),
                    code,
                })
            }
        }
        self.known.insert(topic.to_owned());
        Ok(())
    }

    /// True when `topic` is known to exist: [`ensure`](Self::ensure) would
    /// return at once, without asking the cluster.
    pub(crate) fn is_known(&self, topic: &str) -> bool {
        self.known.contains(topic)
    }

    async fn create(&self, topic: &str) -> Result<(), SinkError> {
        let new = NewTopic::new(
            topic,
            self.partitions,
            TopicReplication::Fixed(self.replication_factor),
        );
        match create_topic(&self.admin, &new).await {
            Ok(Created::Now) => tracing::info!(
                topic,
                partitions = self.partitions,
                replication_factor = self.replication_factor,
                "created Kafka topic"
            ),
            // Someone else was quicker: just as good.
            Ok(Created::AlreadyThere) => {}
            Err(code) => {
                return Err(SinkError::CreateTopic {
                    topic: topic.to_owned(),
                    code,
                })
            }
        }
        self.wait_ready(topic).await
    }

    /// Until every partition has a leader in the metadata *and* answers
    /// that leader's ListOffsets: a broker publishes a new topic in its
    /// metadata a moment before its partitions take writes. A first produce
    /// request in that moment is refused and retried, and before Kafka 4.5
    /// a second request overtaking it is accepted, leaving the first one's
    /// records out (KAFKA-15591; the sink refuses to count them delivered,
    /// see `delivery::implicit_ack`, but they then arrive late, after
    /// records that were committed later).
    async fn wait_ready(&self, topic: &str) -> Result<(), SinkError> {
        let deadline = tokio::time::Instant::now() + READY_TIMEOUT;
        loop {
            // A metadata error while waiting counts as "not yet".
            if let Ok(TopicState::Exists { ready: true }) = self.state(topic).await {
                if self.writable(topic).await {
                    return Ok(());
                }
            }
            if tokio::time::Instant::now() + READY_POLL > deadline {
                return Err(SinkError::TopicNotReady {
                    topic: topic.to_owned(),
                    waited: READY_TIMEOUT,
                });
            }
            tokio::time::sleep(READY_POLL).await;
        }
    }

    /// Whether every partition of `topic` answers a ListOffsets request on
    /// its leader, i.e. the leader has taken the partition on.
    async fn writable(&self, topic: &str) -> bool {
        let admin = Arc::clone(&self.admin);
        let name = topic.to_owned();
        tokio::task::spawn_blocking(move || {
            let Ok(metadata) = admin.inner().fetch_metadata(Some(&name), METADATA_TIMEOUT) else {
                return false;
            };
            let Some(t) = metadata.topics().iter().find(|t| t.name() == name) else {
                return false;
            };
            !t.partitions().is_empty()
                && t.partitions().iter().all(|p| {
                    admin
                        .inner()
                        .fetch_watermarks(&name, p.id(), READY_POLL * 10)
                        .is_ok()
                })
        })
        .await
        .unwrap_or(false)
    }

    /// Asks the cluster about `topic` (librdkafka's metadata call blocks, so
    /// it runs on the blocking pool).
    async fn state(&self, topic: &str) -> Result<TopicState, SinkError> {
        let admin = Arc::clone(&self.admin);
        let name = topic.to_owned();
        let fetched = tokio::task::spawn_blocking(move || {
            let metadata = admin
                .inner()
                .fetch_metadata(Some(&name), METADATA_TIMEOUT)?;
            Ok(topic_state(&metadata, &name))
        })
        .await;
        match fetched {
            Ok(Ok(state)) => Ok(state),
            Ok(Err(source)) => Err(SinkError::Metadata {
                topic: topic.to_owned(),
                source,
            }),
            Err(join) if join.is_panic() => std::panic::resume_unwind(join.into_panic()),
            Err(_) => Err(SinkError::Metadata {
                topic: topic.to_owned(),
                source: KafkaError::Canceled,
            }),
        }
    }
}

/// How a CreateTopics request ended well.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Created {
    Now,
    /// Someone else created it first.
    AlreadyThere,
}

/// Asks the cluster to create `new`. A refusal that a cluster in motion
/// gives for a moment is asked again until [`CREATE_TIMEOUT`]: a KRaft
/// controller fences a broker that missed its heartbeats (a paused or
/// restarted broker) and, while too few are unfenced, refuses with
/// INVALID_REPLICATION_FACTOR ("All brokers are currently fenced"), the
/// same code a replication factor above the cluster's size gets. Seen
/// after a broker's SIGCONT: fenced for 14 ms, long enough to stop a relay
/// that took the code as final.
pub(crate) async fn create_topic<C: ClientContext + 'static>(
    admin: &AdminClient<C>,
    new: &NewTopic<'_>,
) -> Result<Created, RDKafkaErrorCode> {
    let deadline = tokio::time::Instant::now() + CREATE_TIMEOUT;
    let options = AdminOptions::new().operation_timeout(Some(CREATE_TIMEOUT));
    loop {
        let answer = match admin.create_topics([new], &options).await {
            Ok(results) => results
                .into_iter()
                .next()
                .map_or(Err(RDKafkaErrorCode::Fail), |r| r.map_err(|(_, code)| code)),
            Err(e) => Err(e.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail)),
        };
        match answer {
            Ok(_) => return Ok(Created::Now),
            Err(RDKafkaErrorCode::TopicAlreadyExists) => return Ok(Created::AlreadyThere),
            Err(code)
                if AdminRefusal::of(code).may_pass()
                    && tokio::time::Instant::now() + CREATE_RETRY < deadline =>
            {
                tracing::debug!(topic = new.name, %code, "CreateTopics refused; asking again");
                tokio::time::sleep(CREATE_RETRY).await;
            }
            Err(code) => return Err(code),
        }
    }
}

fn topic_state(metadata: &Metadata, topic: &str) -> TopicState {
    let Some(t) = metadata.topics().iter().find(|t| t.name() == topic) else {
        return TopicState::Missing;
    };
    match t.error() {
        None => TopicState::Exists {
            ready: !t.partitions().is_empty()
                && t.partitions()
                    .iter()
                    .all(|p| p.error().is_none() && p.leader() >= 0),
        },
        Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART) => TopicState::Missing,
        // The topic is being created (by us or someone else).
        Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE) => {
            TopicState::Exists { ready: false }
        }
        Some(err) => TopicState::Refused(err.into()),
    }
}

/// What one metadata request says of `topic`: `None` when the answer does
/// not list it, else its error (if any) and its partition count.
/// librdkafka's call blocks, so it runs on the blocking pool.
pub(crate) async fn describe_topic<C: ClientContext + 'static>(
    admin: &Arc<AdminClient<C>>,
    topic: &str,
) -> Result<Option<(Option<RDKafkaRespErr>, usize)>, KafkaError> {
    let (admin, name) = (Arc::clone(admin), topic.to_owned());
    tokio::task::spawn_blocking(move || {
        let md = admin
            .inner()
            .fetch_metadata(Some(&name), METADATA_TIMEOUT)?;
        Ok(md
            .topics()
            .iter()
            .find(|t| t.name() == name)
            .map(|t| (t.error(), t.partitions().len())))
    })
    .await
    .unwrap_or(Err(KafkaError::Canceled))
}
