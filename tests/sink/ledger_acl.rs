//! The position ledger's topic on a broker with an authoriser: a right
//! taken away is named, at once, with the ACL that grants it; and no
//! consumer group is used, so no group right is needed.

use std::time::{Duration, Instant};

use outboxd::config::KafkaConfig;
use outboxd::progress::ledger::{LedgerEntry, LedgerIdentity, LEDGER_VERSION};
use outboxd::sink::{LedgerTopic, LedgerTopicError, ReadTo};
use outboxd::Lsn;
use rdkafka::types::RDKafkaErrorCode;

use crate::harness::kafka::KafkaBroker;
use crate::harness::kafka_acl::{
    allow_anonymous, deny_anonymous, deny_every_group, Operation, Pattern, Resource, AUTHORIZER,
};

/// How long the broker may take to apply an ACL.
const ACL_APPLIED: Duration = Duration::from_secs(60);

fn ledger(broker: &KafkaBroker, topic: &str) -> LedgerTopic {
    let kafka = KafkaConfig {
        brokers: Some(broker.bootstrap().to_owned()),
        create_topics: true,
        ledger_topic: topic.to_owned(),
        ..KafkaConfig::default()
    };
    LedgerTopic::new(broker.bootstrap(), &kafka).unwrap()
}

fn entry(lsn: u64) -> LedgerEntry {
    LedgerEntry {
        version: LEDGER_VERSION,
        system_identifier: "7".into(),
        database: "app".into(),
        slot: "acl".into(),
        timeline: 1,
        confirmed_lsn: Lsn(lsn),
        commit_time_us: None,
        outboxd_version: "test".into(),
        written_at_us: 1,
        accepted_gaps: Vec::new(),
        inside: None,
        transactional: false,
    }
}

fn identity() -> LedgerIdentity {
    LedgerIdentity {
        system_identifier: "7".into(),
        database: "app".into(),
        slot: "acl".into(),
    }
}

/// Takes `operation` on `topic` away from every client, and only that.
fn deny_on_topic(broker: &KafkaBroker, topic: &str, operation: Operation) {
    let literal = Pattern::RD_KAFKA_RESOURCE_PATTERN_LITERAL;
    let t = Resource::RD_KAFKA_RESOURCE_TOPIC;
    allow_anonymous(
        broker.bootstrap(),
        t,
        topic,
        literal,
        Operation::RD_KAFKA_ACL_OPERATION_ALL,
    );
    deny_anonymous(broker.bootstrap(), t, topic, literal, operation);
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn a_ledger_read_refused_by_the_authoriser_names_read_at_once() {
    let broker = KafkaBroker::start_with(AUTHORIZER);
    let topic = "outboxd-ledger-read-acl";
    runtime().block_on(async {
        let ledger = ledger(&broker, topic);
        ledger.ensure().await.unwrap();
        ledger.write(&entry(0x10)).await.unwrap();
        let reader = ledger.reader().clone();
        let before = reader.latest(&identity(), ReadTo::End).await.unwrap();
        assert_eq!(before, Some(entry(0x10)));

        deny_on_topic(&broker, topic, Operation::RD_KAFKA_ACL_OPERATION_READ);
        let deadline = Instant::now() + ACL_APPLIED;
        for to in [ReadTo::End, ReadTo::Stable] {
            let (e, took) = loop {
                let started = Instant::now();
                match reader.read_all(to).await {
                    // Not applied yet.
                    Ok(_) if Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(200)).await
                    }
                    Ok(_) => panic!("READ denied for {ACL_APPLIED:?}, the ledger still reads"),
                    Err(e) => break (e, started.elapsed()),
                }
            };
            match &e {
                LedgerTopicError::Refused {
                    operation, code, ..
                } => {
                    assert_eq!(*operation, "Read", "{e}");
                    assert_eq!(*code, RDKafkaErrorCode::TopicAuthorizationFailed, "{e}");
                }
                other => panic!("{to:?}: expected the authoriser's refusal, got: {other}"),
            }
            let text = e.to_string();
            assert!(
                text.contains(&format!("--operation Read --topic {topic}")),
                "{text}"
            );
            assert!(!text.contains("transaction"), "{text}");
            assert!(e.is_refused_by_authorizer());
            // Named at once, not after the read's 30 s timeout.
            assert!(took < Duration::from_secs(10), "{to:?} took {took:?}");
        }
    });
}

#[test]
fn a_ledger_topic_whose_configuration_may_not_be_read_names_describe_configs() {
    let broker = KafkaBroker::start_with(AUTHORIZER);
    let topic = "outboxd-ledger-describe-acl";
    runtime().block_on(async {
        let ledger = ledger(&broker, topic);
        ledger.ensure().await.unwrap();
        deny_on_topic(
            &broker,
            topic,
            Operation::RD_KAFKA_ACL_OPERATION_DESCRIBE_CONFIGS,
        );
        let deadline = Instant::now() + ACL_APPLIED;
        let e = loop {
            match ledger.ensure().await {
                Ok(()) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(200)).await
                }
                Ok(()) => panic!("DESCRIBE_CONFIGS denied for {ACL_APPLIED:?}, still described"),
                Err(e) => break e,
            }
        };
        let text = e.to_string();
        assert!(
            matches!(
                e,
                LedgerTopicError::Describe {
                    code: RDKafkaErrorCode::TopicAuthorizationFailed,
                    ..
                }
            ),
            "{text}"
        );
        assert!(text.contains("DESCRIBE_CONFIGS"), "{text}");
        assert!(
            text.contains(&format!("--operation DescribeConfigs --topic {topic}")),
            "{text}"
        );
        // Never a guess at the policy.
        assert!(!text.contains("cleanup.policy=delete"), "{text}");
        assert!(e.is_refused_by_authorizer());
    });
}

#[test]
fn the_ledger_reads_with_every_group_right_denied() {
    let broker = KafkaBroker::start_with(AUTHORIZER);
    let topic = "outboxd-ledger-no-group";
    deny_every_group(broker.bootstrap());

    runtime().block_on(async {
        let ledger = ledger(&broker, topic);
        ledger.ensure().await.unwrap();
        ledger.write(&entry(0x20)).await.unwrap();
        ledger.write(&entry(0x30)).await.unwrap();
        let reader = ledger.reader().clone();
        for to in [ReadTo::End, ReadTo::Stable] {
            let latest = reader.latest(&identity(), to).await.unwrap();
            assert_eq!(latest, Some(entry(0x30)), "{to:?}");
        }
    });
}
