//! The check's `ledger topic` line on a broker with an authoriser: a
//! configuration the principal may not read is named with the right to
//! grant, never taken for a cleanup policy.

use crate::harness::kafka::KafkaBroker;
use crate::harness::kafka_acl::{
    allow_anonymous, deny_anonymous, Operation, Pattern, Resource, AUTHORIZER,
};
use crate::harness::pg::PgOptions;

use super::support::{check, env};

#[test]
fn a_ledger_topic_whose_configuration_may_not_be_read_fails_naming_describe_configs() {
    let broker = KafkaBroker::start_with(AUTHORIZER);
    let ledger = "check-ledger-acl";
    broker.create_topic_with(ledger, 1, &[("cleanup.policy", "compact")]);
    let (topic, literal) = (
        Resource::RD_KAFKA_RESOURCE_TOPIC,
        Pattern::RD_KAFKA_RESOURCE_PATTERN_LITERAL,
    );
    allow_anonymous(
        broker.bootstrap(),
        topic,
        ledger,
        literal,
        Operation::RD_KAFKA_ACL_OPERATION_ALL,
    );
    let e = env(PgOptions::default());
    let config = e.config(
        "ledger.toml",
        &e.url("outboxd", None),
        broker.bootstrap(),
        "create_publication = false",
        &format!("ledger_topic = \"{ledger}\""),
    );
    let out = check(&config);
    assert_eq!(out.line("ledger topic").0, "ok", "{out}");

    deny_anonymous(
        broker.bootstrap(),
        topic,
        ledger,
        literal,
        Operation::RD_KAFKA_ACL_OPERATION_DESCRIBE_CONFIGS,
    );
    // The broker applies an ACL within moments; a check is slower than that.
    let mut out = check(&config);
    for _ in 0..5 {
        if out.line("ledger topic").0 == "FAIL" {
            break;
        }
        std::thread::sleep(std::time::Duration::from_secs(1));
        out = check(&config);
    }
    out.expect_fail(
        "ledger topic",
        &[
            "TopicAuthorizationFailed",
            "grant the principal DESCRIBE_CONFIGS on the topic",
            &format!("--operation DescribeConfigs --topic {ledger}"),
        ],
    );
    assert!(!out.stdout.contains("cleanup.policy=delete"), "{out}");
}
