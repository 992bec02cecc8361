//! [`LedgerTopicError`]: what can go wrong keeping, writing or reading the
//! position ledger's topic. Its own file: the topic and its reader both
//! return it.

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

use super::error::SinkError;
use crate::progress::ledger::LedgerFormatError;

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
