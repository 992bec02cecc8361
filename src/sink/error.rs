//! The sink's errors: a bad configuration (fix it and restart), a failure
//! worth a reconnect (see [`SinkError::is_retryable`]), and the two ways a
//! single `send` can fail.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use super::admin_refusal::{AdminRefusal, CREATE_TIMEOUT};
use super::delivery::FailureKind;

/// A `[kafka]` setting that outboxd cannot run with. Always names the key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SinkConfigError {
    #[error(
        "kafka.brokers: no broker given; set it to host:port[,host:port...], e.g. \"127.0.0.1:9092\""
    )]
    NoBrokers,

    /// A `[kafka.properties]` entry that contradicts a delivery guarantee, or
    /// that librdkafka refused. `key` is the librdkafka property name.
    #[error("kafka.properties.\"{key}\" = \"{value}\": {reason}")]
    Property {
        key: String,
        value: String,
        reason: String,
    },
}

impl SinkConfigError {
    pub(crate) fn property(key: &str, value: &str, reason: impl Into<String>) -> Self {
        SinkConfigError::Property {
            key: key.to_owned(),
            value: value.to_owned(),
            reason: reason.into(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error(transparent)]
    Config(#[from] SinkConfigError),

    /// librdkafka refused to create the client for a reason not tied to one
    /// property (e.g. an SSL file it could not load).
    #[error("cannot create the Kafka {client}: {source}")]
    Client {
        client: &'static str,
        #[source]
        source: KafkaError,
    },

    /// The brokers did not answer a metadata request in time, or refused it.
    #[error("cannot fetch Kafka metadata for topic `{topic}` from kafka.brokers: {source}")]
    Metadata {
        topic: String,
        #[source]
        source: KafkaError,
    },

    /// The broker answered, with an error for this topic (e.g. not authorized).
    #[error("Kafka topic `{topic}`: {code}{}", topic_hint(topic, *code))]
    Topic {
        topic: String,
        code: RDKafkaErrorCode,
    },

    #[error(
        "Kafka topic `{topic}` does not exist; create it, or set kafka.create_topics = true \
         to let outboxd create it"
    )]
    MissingTopic { topic: String },

    #[error(
        "cannot create Kafka topic `{topic}` (kafka.create_topics = true): {code}{}",
        creation_hint(topic, *code)
    )]
    CreateTopic {
        topic: String,
        code: RDKafkaErrorCode,
    },

    #[error(
        "Kafka topic `{topic}` was created, but not every partition had a leader after {waited:?}"
    )]
    TopicNotReady { topic: String, waited: Duration },

    #[error("Kafka flush timed out with {in_flight} message(s) still queued or in flight")]
    FlushTimeout { in_flight: i32 },

    /// librdkafka raised a fatal error: the producer cannot be used again.
    #[error("the Kafka producer failed fatally: {0}")]
    Fatal(String),
}

impl SinkError {
    /// Whether reconnecting (a new producer, resuming from the slot) can help.
    /// `false` means the user has to change something first.
    pub(crate) fn is_retryable(&self) -> bool {
        match self {
            SinkError::Config(_) | SinkError::Client { .. } | SinkError::MissingTopic { .. } => {
                false
            }
            SinkError::Topic { code, .. } | SinkError::CreateTopic { code, .. } => {
                AdminRefusal::of(*code).reconnect_may_help()
            }
            SinkError::Metadata { .. }
            | SinkError::TopicNotReady { .. }
            | SinkError::FlushTimeout { .. }
            | SinkError::Fatal(_) => true,
        }
    }
}

/// A client creation failure, as a [`SinkConfigError`] naming the property
/// when librdkafka refused one of the user's `[kafka.properties]`.
pub(super) fn creation_error(
    client: &'static str,
    source: KafkaError,
    properties: &BTreeMap<String, String>,
) -> SinkError {
    if let KafkaError::ClientConfig(_, desc, key, value) = &source {
        if properties.contains_key(key) {
            return SinkConfigError::property(key, value, format!("librdkafka refused it: {desc}"))
                .into();
        }
    }
    SinkError::Client { client, source }
}

/// The ACL to grant when the broker refuses to describe `topic`: without
/// DESCRIBE, Kafka answers TopicAuthorizationFailed for its metadata.
fn topic_hint(topic: &str, code: RDKafkaErrorCode) -> String {
    if code == RDKafkaErrorCode::TopicAuthorizationFailed {
        format!(
            "; grant the principal DESCRIBE (and WRITE) on the topic: kafka-acls.sh \
             --bootstrap-server BROKER --add --allow-principal User:PRINCIPAL --operation \
             Describe --operation Write --topic {topic}"
        )
    } else {
        String::new()
    }
}

/// What to change when CreateTopics keeps refusing with `code`.
fn creation_hint(topic: &str, code: RDKafkaErrorCode) -> String {
    use RDKafkaErrorCode as C;
    match code {
        C::InvalidReplicationFactor => format!(
            "; the cluster has fewer unfenced brokers than kafka.topic_replication_factor \
             (asked again for {} s)",
            CREATE_TIMEOUT.as_secs()
        ),
        C::TopicAuthorizationFailed | C::ClusterAuthorizationFailed => format!(
            "; grant the principal CREATE on the topic (or on the cluster: --cluster), e.g. \
             kafka-acls.sh --bootstrap-server BROKER --add --allow-principal User:PRINCIPAL \
             --operation Create --topic {topic}, or create the topic and set \
             kafka.create_topics = false"
        ),
        _ => String::new(),
    }
}

/// Why [`KafkaSink::send`](super::KafkaSink::send) did not enqueue a record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// librdkafka's local queue is full (`queue.buffering.max.messages` or
    /// `.kbytes`): wait for a delivery report, then send the same record again.
    #[error("the Kafka producer queue is full")]
    QueueFull,

    /// Refused before it was queued, e.g. larger than `message.max.bytes`
    /// (`PerEvent`) or the producer already failed fatally (`Transport`).
    #[error("Kafka refused the record: {message}")]
    Rejected {
        code: RDKafkaErrorCode,
        kind: FailureKind,
        message: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_topic_says_what_to_do() {
        let e = SinkError::MissingTopic {
            topic: "orders".into(),
        };
        let text = e.to_string();
        assert!(text.contains("`orders`"), "{text}");
        assert!(text.contains("kafka.create_topics = true"), "{text}");
        assert!(!e.is_retryable());
    }

    #[test]
    fn retryable_split() {
        let auth = SinkError::CreateTopic {
            topic: "t".into(),
            code: RDKafkaErrorCode::TopicAuthorizationFailed,
        };
        assert!(!auth.is_retryable());
        let timeout = SinkError::CreateTopic {
            topic: "t".into(),
            code: RDKafkaErrorCode::RequestTimedOut,
        };
        assert!(timeout.is_retryable());
        assert!(SinkError::Fatal("x".into()).is_retryable());
        assert!(!SinkError::Config(SinkConfigError::NoBrokers).is_retryable());
    }

    #[test]
    fn a_refused_creation_names_the_setting_to_change() {
        let e = SinkError::CreateTopic {
            topic: "orders".into(),
            code: RDKafkaErrorCode::InvalidReplicationFactor,
        };
        let text = e.to_string();
        assert!(text.contains("kafka.topic_replication_factor"), "{text}");
        assert!(!e.is_retryable(), "asked again inside the sink already");
        let e = SinkError::CreateTopic {
            topic: "orders".into(),
            code: RDKafkaErrorCode::TopicAuthorizationFailed,
        };
        assert!(e.to_string().contains("kafka.create_topics = false"), "{e}");
        assert!(
            e.to_string().contains("--operation Create --topic orders"),
            "{e}"
        );
    }

    #[test]
    fn an_invalid_replication_factor_names_how_long_it_was_asked() {
        let hint = creation_hint("t", RDKafkaErrorCode::InvalidReplicationFactor);
        assert!(
            hint.contains(&format!("{} s", CREATE_TIMEOUT.as_secs())),
            "{hint}"
        );
    }
}
