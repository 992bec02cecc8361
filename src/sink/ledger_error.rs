//! [`LedgerTopicError`]: what can go wrong keeping, writing or reading the
//! position ledger's topic. Its own file: the topic and its reader both
//! return it.

use std::time::Duration;

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

    /// DescribeConfigs for the topic failed, with the broker's error for
    /// it: an authoriser's refusal names the right to grant.
    #[error(
        "cannot read the configuration of the ledger topic `{topic}` (kafka.ledger_topic) to \
         check that it is compacted: {code}{}",
        describe_hint(topic, *code)
    )]
    Describe {
        topic: String,
        code: RDKafkaErrorCode,
    },

    /// The broker described the topic without a `cleanup.policy`, however
    /// long it was asked: nothing is assumed about the policy.
    #[error(
        "the broker's description of the ledger topic `{topic}` (kafka.ledger_topic) has no \
         cleanup.policy (asked for {}s); outboxd cannot tell whether it is compacted: check \
         with kafka-configs.sh --describe --entity-type topics --entity-name {topic}",
        waited.as_secs()
    )]
    PolicyNotReported { topic: String, waited: Duration },

    /// The authoriser refused the reader an ACL operation on the topic.
    #[error(
        "the principal may not read the ledger topic `{topic}` (kafka.ledger_topic): {code}; \
         grant it {} on the topic: kafka-acls.sh --bootstrap-server BROKER --add \
         --allow-principal User:PRINCIPAL --operation {operation} --topic {topic}",
        operation.to_uppercase()
    )]
    Refused {
        topic: String,
        /// The ACL operation, as kafka-acls.sh spells it (`Read`, `Describe`).
        operation: &'static str,
        code: RDKafkaErrorCode,
    },

    #[error(
        "cannot write the ledger entry to `{topic}`: {source}{}",
        write_hint(topic, source)
    )]
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

impl LedgerTopicError {
    /// The authoriser refused a right on the topic: a person has to grant
    /// it, asking again will not help (a few attempts may ride out an ACL
    /// being rolled out).
    pub fn is_refused_by_authorizer(&self) -> bool {
        match self {
            LedgerTopicError::Refused { .. } => true,
            LedgerTopicError::Describe { code, .. } => is_authorization(*code),
            LedgerTopicError::Write { source, .. } => {
                source.rdkafka_error_code().is_some_and(is_authorization)
            }
            _ => false,
        }
    }

    /// A write librdkafka gave up on after `message.timeout.ms`.
    pub(crate) fn is_write_timeout(&self) -> bool {
        matches!(
            self,
            LedgerTopicError::Write { source, .. }
                if source.rdkafka_error_code() == Some(RDKafkaErrorCode::MessageTimedOut)
        )
    }
}

fn is_authorization(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::TopicAuthorizationFailed | RDKafkaErrorCode::ClusterAuthorizationFailed
    )
}

/// The ACL to grant when the authoriser refused a ledger write.
fn write_hint(topic: &str, source: &KafkaError) -> String {
    if source.rdkafka_error_code().is_some_and(is_authorization) {
        format!(
            "; grant the principal WRITE on the ledger topic: kafka-acls.sh --bootstrap-server \
             BROKER --add --allow-principal User:PRINCIPAL --operation Write --topic {topic}"
        )
    } else {
        String::new()
    }
}

/// What to do when DescribeConfigs on the ledger topic fails with `code`.
fn describe_hint(topic: &str, code: RDKafkaErrorCode) -> String {
    if is_authorization(code) {
        format!(
            "; grant the principal DESCRIBE_CONFIGS on the topic: kafka-acls.sh \
             --bootstrap-server BROKER --add --allow-principal User:PRINCIPAL --operation \
             DescribeConfigs --topic {topic}"
        )
    } else if code == RDKafkaErrorCode::UnknownTopicOrPartition {
        "; the broker asked does not know the topic (yet): check that every broker is up and \
         sees it (kafka-topics.sh --describe)"
            .to_owned()
    } else {
        String::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_read_names_the_acl_and_is_the_authorisers() {
        let e = LedgerTopicError::Refused {
            topic: "outboxd.ledger".into(),
            operation: "Read",
            code: RDKafkaErrorCode::TopicAuthorizationFailed,
        };
        let text = e.to_string();
        assert!(text.contains("grant it READ on the topic"), "{text}");
        assert!(
            text.contains("--operation Read --topic outboxd.ledger"),
            "{text}"
        );
        assert!(!text.contains("transaction"), "{text}");
        assert!(e.is_refused_by_authorizer());
        let slow = LedgerTopicError::Read {
            topic: "outboxd.ledger".into(),
            reason: "not read to the end within 30s".into(),
        };
        assert!(!slow.is_refused_by_authorizer());
    }

    #[test]
    fn a_refused_write_names_the_acl() {
        let refused = LedgerTopicError::Write {
            topic: "l".into(),
            source: KafkaError::MessageProduction(RDKafkaErrorCode::TopicAuthorizationFailed),
        };
        assert!(refused.is_refused_by_authorizer());
        assert!(
            refused.to_string().contains("--operation Write --topic l"),
            "{refused}"
        );
        let slow = LedgerTopicError::Write {
            topic: "l".into(),
            source: KafkaError::MessageProduction(RDKafkaErrorCode::MessageTimedOut),
        };
        assert!(!slow.is_refused_by_authorizer());
        assert!(!slow.to_string().contains("grant"), "{slow}");
    }

    #[test]
    fn an_unreadable_configuration_says_which_right_is_missing_only_when_it_is_one() {
        let denied = LedgerTopicError::Describe {
            topic: "l".into(),
            code: RDKafkaErrorCode::TopicAuthorizationFailed,
        };
        let text = denied.to_string();
        assert!(text.contains("DESCRIBE_CONFIGS"), "{text}");
        assert!(
            text.contains("--operation DescribeConfigs --topic l"),
            "{text}"
        );
        assert!(!text.contains("cleanup.policy="), "{text}");
        assert!(denied.is_refused_by_authorizer());
        let unknown = LedgerTopicError::Describe {
            topic: "l".into(),
            code: RDKafkaErrorCode::UnknownTopicOrPartition,
        };
        let text = unknown.to_string();
        assert!(!text.contains("DESCRIBE_CONFIGS"), "{text}");
        assert!(text.contains("does not know the topic"), "{text}");
        assert!(!unknown.is_refused_by_authorizer());
    }

    #[test]
    fn only_a_message_timeout_is_a_write_timeout() {
        let write = |code| LedgerTopicError::Write {
            topic: "l".into(),
            source: rdkafka::error::KafkaError::MessageProduction(code),
        };
        assert!(write(RDKafkaErrorCode::MessageTimedOut).is_write_timeout());
        assert!(!write(RDKafkaErrorCode::TopicAuthorizationFailed).is_write_timeout());
        assert!(!LedgerTopicError::Missing { topic: "l".into() }.is_write_timeout());
    }
}
