//! Which ACL operations outboxd needs on each kind of topic, and which of
//! them the cluster's answer (KIP-430 authorised operations) leaves out.
//! Pure: `describe_topics` asks, `cli::check` prints.

use std::collections::BTreeMap;

use rdkafka::types::RDKafkaErrorCode;

use super::describe_topics::{AclOperation, TopicAnswer};

/// An ACL operation on a topic that outboxd needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Right {
    Read,
    Write,
    Describe,
    DescribeConfigs,
}

impl Right {
    /// As Kafka's documentation and authoriser logs spell it.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Right::Read => "READ",
            Right::Write => "WRITE",
            Right::Describe => "DESCRIBE",
            Right::DescribeConfigs => "DESCRIBE_CONFIGS",
        }
    }

    /// As `kafka-acls.sh --operation` takes it.
    pub(crate) fn acl_operation(self) -> &'static str {
        match self {
            Right::Read => "Read",
            Right::Write => "Write",
            Right::Describe => "Describe",
            Right::DescribeConfigs => "DescribeConfigs",
        }
    }

    fn operation(self) -> AclOperation {
        match self {
            Right::Read => AclOperation::RD_KAFKA_ACL_OPERATION_READ,
            Right::Write => AclOperation::RD_KAFKA_ACL_OPERATION_WRITE,
            Right::Describe => AclOperation::RD_KAFKA_ACL_OPERATION_DESCRIBE,
            Right::DescribeConfigs => AclOperation::RD_KAFKA_ACL_OPERATION_DESCRIBE_CONFIGS,
        }
    }
}

/// What a topic is to outboxd, which decides the rights it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TopicRole {
    /// A routing topic: events are produced to it.
    Outbox,
    /// `relay.dead_letter_topic`: copies of undeliverable events.
    DeadLetter,
    /// `kafka.ledger_topic`: written while relaying, read at every start,
    /// its configuration read to check it is compacted.
    Ledger,
}

impl TopicRole {
    /// The rights on an existing topic. CREATE is not among them: it is
    /// needed only while the topic does not exist, where no authorised
    /// operations can be read, so creation is validated instead.
    pub(crate) fn rights(self) -> &'static [Right] {
        match self {
            TopicRole::Outbox | TopicRole::DeadLetter => &[Right::Write, Right::Describe],
            TopicRole::Ledger => &[
                Right::Read,
                Right::Write,
                Right::Describe,
                Right::DescribeConfigs,
            ],
        }
    }
}

/// What the answer about one topic means for its rights.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Rights {
    /// Every right is granted.
    Granted,
    /// These rights are not.
    Missing(Vec<Right>),
    /// The principal may not describe the topic: DESCRIBE is missing, and
    /// Kafka tells nothing more (not even whether the topic exists).
    DescribeRefused,
    /// The topic does not exist: its rights cannot be read before it does.
    NoTopic,
    /// The broker reported no authorised operations (before Kafka 2.3).
    NotReported,
    /// Another error for the topic.
    Unknown(RDKafkaErrorCode),
}

/// The rights `role` needs that `answer` does not grant.
pub(crate) fn judge(role: TopicRole, answer: &TopicAnswer) -> Rights {
    match answer {
        TopicAnswer::Refused(RDKafkaErrorCode::TopicAuthorizationFailed) => Rights::DescribeRefused,
        TopicAnswer::Refused(RDKafkaErrorCode::UnknownTopicOrPartition) => Rights::NoTopic,
        TopicAnswer::Refused(code) => Rights::Unknown(*code),
        TopicAnswer::Described(None) => Rights::NotReported,
        TopicAnswer::Described(Some(granted)) => {
            let all = granted.contains(&AclOperation::RD_KAFKA_ACL_OPERATION_ALL);
            let missing: Vec<Right> = role
                .rights()
                .iter()
                .copied()
                .filter(|r| !all && !granted.contains(&r.operation()))
                .collect();
            if missing.is_empty() {
                Rights::Granted
            } else {
                Rights::Missing(missing)
            }
        }
    }
}

/// The principal ACLs name, as far as the client's settings tell it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Principal {
    /// `User:<name>`, or a placeholder to replace.
    pub(crate) name: String,
    /// Where the name comes from, or what to put in its place.
    pub(crate) origin: &'static str,
}

/// The principal the brokers see for a client with `properties`: SASL's
/// user name (PLAIN and SCRAM log in with it), Kafka's `User:ANONYMOUS` on
/// a PLAINTEXT listener, else a placeholder (a TLS certificate's or a
/// token's principal depends on the brokers' principal mapping).
pub(crate) fn principal(properties: &BTreeMap<String, String>) -> Principal {
    let protocol = properties
        .get("security.protocol")
        .map_or("plaintext".to_owned(), |p| p.trim().to_ascii_lowercase());
    let mechanism = ["sasl.mechanisms", "sasl.mechanism"]
        .into_iter()
        .find_map(|k| properties.get(k))
        .map(|m| m.trim().to_ascii_uppercase());
    let username = properties.get("sasl.username").map(|u| u.trim());
    let logs_in_by_name = mechanism
        .as_deref()
        .is_some_and(|m| m == "PLAIN" || m.starts_with("SCRAM-"));
    match (protocol.as_str(), username) {
        ("sasl_ssl" | "sasl_plaintext", Some(user)) if logs_in_by_name && !user.is_empty() => {
            Principal {
                name: format!("User:{user}"),
                origin: "from kafka.properties.\"sasl.username\"",
            }
        }
        ("plaintext", _) => Principal {
            name: "User:ANONYMOUS".to_owned(),
            origin: "Kafka's principal for every client of a PLAINTEXT listener",
        },
        _ => Principal {
            name: "User:<outboxd's principal>".to_owned(),
            origin: "a placeholder: put the principal the brokers map outboxd's certificate, \
                     token or Kerberos name to",
        },
    }
}

/// The `kafka-acls.sh` command that grants `principal` the `rights` on
/// `topic` (one command: `--operation` may be repeated).
pub(crate) fn grant_command(
    brokers: &str,
    principal: &str,
    rights: &[Right],
    topic: &str,
) -> String {
    let operations: Vec<String> = rights
        .iter()
        .map(|r| format!("--operation {}", r.acl_operation()))
        .collect();
    format!(
        "kafka-acls.sh --bootstrap-server {brokers} --add --allow-principal {principal} {} \
         --topic {topic}",
        operations.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use AclOperation as Op;

    fn described(ops: &[Op]) -> TopicAnswer {
        TopicAnswer::Described(Some(ops.to_vec()))
    }

    #[test]
    fn an_outbox_topic_needs_write_and_describe_only() {
        let granted = described(&[
            Op::RD_KAFKA_ACL_OPERATION_WRITE,
            Op::RD_KAFKA_ACL_OPERATION_DESCRIBE,
        ]);
        assert_eq!(judge(TopicRole::Outbox, &granted), Rights::Granted);
        assert_eq!(judge(TopicRole::DeadLetter, &granted), Rights::Granted);
        let no_write = described(&[
            Op::RD_KAFKA_ACL_OPERATION_READ,
            Op::RD_KAFKA_ACL_OPERATION_DESCRIBE,
            Op::RD_KAFKA_ACL_OPERATION_DESCRIBE_CONFIGS,
        ]);
        assert_eq!(
            judge(TopicRole::Outbox, &no_write),
            Rights::Missing(vec![Right::Write])
        );
    }

    #[test]
    fn the_ledger_needs_read_write_describe_and_describe_configs() {
        let write_only = described(&[
            Op::RD_KAFKA_ACL_OPERATION_WRITE,
            Op::RD_KAFKA_ACL_OPERATION_DESCRIBE,
        ]);
        assert_eq!(
            judge(TopicRole::Ledger, &write_only),
            Rights::Missing(vec![Right::Read, Right::DescribeConfigs])
        );
        let everything = described(&[
            Op::RD_KAFKA_ACL_OPERATION_READ,
            Op::RD_KAFKA_ACL_OPERATION_WRITE,
            Op::RD_KAFKA_ACL_OPERATION_DESCRIBE,
            Op::RD_KAFKA_ACL_OPERATION_DESCRIBE_CONFIGS,
        ]);
        assert_eq!(judge(TopicRole::Ledger, &everything), Rights::Granted);
        assert_eq!(
            judge(
                TopicRole::Ledger,
                &described(&[Op::RD_KAFKA_ACL_OPERATION_ALL])
            ),
            Rights::Granted
        );
        assert_eq!(
            judge(TopicRole::Ledger, &described(&[])),
            Rights::Missing(vec![
                Right::Read,
                Right::Write,
                Right::Describe,
                Right::DescribeConfigs
            ])
        );
    }

    #[test]
    fn errors_for_the_topic_are_told_apart() {
        use RDKafkaErrorCode as C;
        let refused = TopicAnswer::Refused(C::TopicAuthorizationFailed);
        assert_eq!(judge(TopicRole::Outbox, &refused), Rights::DescribeRefused);
        let unknown = TopicAnswer::Refused(C::UnknownTopicOrPartition);
        assert_eq!(judge(TopicRole::Ledger, &unknown), Rights::NoTopic);
        let other = TopicAnswer::Refused(C::LeaderNotAvailable);
        assert_eq!(
            judge(TopicRole::Outbox, &other),
            Rights::Unknown(C::LeaderNotAvailable)
        );
        assert_eq!(
            judge(TopicRole::Outbox, &TopicAnswer::Described(None)),
            Rights::NotReported
        );
    }

    #[test]
    fn the_principal_is_named_only_when_the_settings_tell_it() {
        let props = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let scram = props(&[
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanisms", "SCRAM-SHA-512"),
            ("sasl.username", "relay"),
            ("sasl.password", "secret"),
        ]);
        assert_eq!(principal(&scram).name, "User:relay");
        assert!(!format!("{:?}", principal(&scram)).contains("secret"));
        assert_eq!(principal(&props(&[])).name, "User:ANONYMOUS");
        let tls = props(&[("security.protocol", "SSL")]);
        assert_eq!(principal(&tls).name, "User:<outboxd's principal>");
        assert!(principal(&tls).origin.contains("placeholder"));
        let oauth = props(&[
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanisms", "OAUTHBEARER"),
            ("sasl.username", "ignored"),
        ]);
        assert_eq!(principal(&oauth).name, "User:<outboxd's principal>");
    }

    #[test]
    fn the_grant_command_lists_every_missing_operation() {
        assert_eq!(
            grant_command(
                "b:9092",
                "User:outboxd",
                &[Right::Read, Right::DescribeConfigs],
                "outboxd.positions"
            ),
            "kafka-acls.sh --bootstrap-server b:9092 --add --allow-principal User:outboxd \
             --operation Read --operation DescribeConfigs --topic outboxd.positions"
        );
    }
}
