//! A relay on a broker with an authoriser (issue 40): the position ledger
//! needs no consumer group, and a ledger the principal may not read stops
//! the relay with the ACL to grant, not a story about open transactions.

use std::time::{Duration, Instant};

use outboxd::config::KafkaConfig;
use outboxd::sink::{LedgerTopic, LedgerTopicError, ReadTo};

use crate::harness::events::{aggregates, ledger_entries, payload_texts, verify, write};
use crate::harness::kafka::KafkaBroker;
use crate::harness::kafka_acl::{
    allow_anonymous, deny_anonymous, deny_every_group, Operation, Pattern, Resource, AUTHORIZER,
};
use crate::harness::relay::{env, use_ledger_topic, Relay};
use crate::harness::wait::wait_for;

/// What librdkafka logs when a group coordinator lookup is refused.
const GROUP_REFUSED: [&str; 2] = ["GroupAuthorizationFailed", "Group authorization failed"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_any_group_right_a_relay_reads_its_ledger_and_logs_no_group_error() {
    let broker = tokio::task::block_in_place(|| KafkaBroker::start_with(AUTHORIZER));
    tokio::task::block_in_place(|| deny_every_group(broker.bootstrap()));
    let e = env(broker.bootstrap(), "nogroup", "");
    let ledger = "nogroup-ledger";
    use_ledger_topic(&e, ledger);
    let first = Relay::start(&e);
    let aggs = aggregates(10);
    let mut client = e.pg.client("app").await;
    let sent = write(&mut client, "nogroup", &aggs, 200, &[1, 10], 0).await;
    tokio::task::block_in_place(|| {
        wait_for("a ledger entry", Duration::from_secs(60), || {
            !ledger_entries(&broker, ledger).is_empty()
        })
    });
    drop(first);
    // A later start reads the entry back.
    let second = Relay::start(&e);
    let more = write(&mut client, "nogroup", &aggs, 100, &[5], 0).await;
    let all: Vec<_> = sent.into_iter().chain(more).collect();
    let texts = payload_texts(&e.pg);
    let dir = e.dir.path().to_path_buf();
    let v = tokio::task::block_in_place(|| {
        verify(&broker, &all, &texts, Duration::from_secs(120), true, &dir)
    });
    assert_eq!(v.delivered, 300, "relay log:\n{}", second.log());
    let log = second.log();
    for refused in GROUP_REFUSED {
        assert!(
            !log.contains(refused),
            "{refused} in the relay's log:\n{log}"
        );
    }
    drop(second);
    tokio::task::block_in_place(|| drop(broker));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ledger_the_relay_may_not_read_stops_it_naming_read_on_the_topic() {
    let broker = tokio::task::block_in_place(|| KafkaBroker::start_with(AUTHORIZER));
    let e = env(broker.bootstrap(), "noread", "");
    let ledger = "noread-ledger";
    use_ledger_topic(&e, ledger);
    let first = Relay::start(&e);
    let aggs = aggregates(5);
    let mut client = e.pg.client("app").await;
    write(&mut client, "noread", &aggs, 50, &[5], 0).await;
    tokio::task::block_in_place(|| {
        wait_for("a ledger entry", Duration::from_secs(60), || {
            !ledger_entries(&broker, ledger).is_empty()
        })
    });
    drop(first);
    let literal = Pattern::RD_KAFKA_RESOURCE_PATTERN_LITERAL;
    let topic = Resource::RD_KAFKA_RESOURCE_TOPIC;
    tokio::task::block_in_place(|| {
        allow_anonymous(
            broker.bootstrap(),
            topic,
            ledger,
            literal,
            Operation::RD_KAFKA_ACL_OPERATION_ALL,
        );
        deny_anonymous(
            broker.bootstrap(),
            topic,
            ledger,
            literal,
            Operation::RD_KAFKA_ACL_OPERATION_READ,
        );
    });
    // Applied once outboxd's own reader is refused.
    let kafka = KafkaConfig {
        brokers: Some(broker.bootstrap().to_owned()),
        ledger_topic: ledger.to_owned(),
        ..KafkaConfig::default()
    };
    let reader = LedgerTopic::new(broker.bootstrap(), &kafka)
        .unwrap()
        .reader()
        .clone();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !matches!(
        reader.read_all(ReadTo::Stable).await,
        Err(LedgerTopicError::Refused { .. })
    ) {
        assert!(
            Instant::now() < deadline,
            "READ on {ledger} still granted after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut relay = Relay::start(&e);
    let exit = tokio::task::block_in_place(|| relay.wait(Duration::from_secs(120)));
    let log = relay.log();
    let exit = exit.unwrap_or_else(|| panic!("the relay did not stop in 120 s:\n{log}"));
    assert!(!exit.success(), "{log}");
    assert!(
        log.contains(&format!("--operation Read --topic {ledger}")),
        "the ACL is not named:\n{log}"
    );
    assert!(
        !log.contains("A transaction open at the first unreadable offset"),
        "{log}"
    );
    tokio::task::block_in_place(|| drop(broker));
}
