//! `outboxd check`'s line for the position ledger's topic
//! (`kafka.ledger_topic`): compacted → ok; missing → ok when it may be
//! created (validated, not created), FAIL naming the fix when not; an
//! uncompacted topic under that name → FAIL naming the fix.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::ClientConfig;

use super::check::support::{check, env, topic_exists, Env};
use crate::harness::kafka;
use crate::harness::pg::PgOptions;

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

/// The documented setup with `kafka.ledger_topic = topic` and `extra` after it.
fn config(e: &Env, name: &str, topic: &str, extra: &str) -> std::path::PathBuf {
    e.config(
        name,
        &e.url("outboxd", None),
        kafka::shared().bootstrap(),
        "create_publication = false",
        &format!("ledger_topic = \"{topic}\"\n{extra}"),
    )
}

fn create_compacted(topic: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", kafka::shared().bootstrap())
        .create()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let new = NewTopic::new(topic, 1, TopicReplication::Fixed(1)).set("cleanup.policy", "compact");
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for r in rt.block_on(admin.create_topics([&new], &opts)).unwrap() {
        r.unwrap();
    }
}

#[test]
fn ledger_topic_line_says_whether_the_ledger_can_be_kept() {
    let e = env(PgOptions::default());

    // Missing, may be created: ok, and only validated.
    let absent = unique("check-ledger-absent");
    let out = check(&config(&e, "absent.toml", &absent, ""));
    assert_eq!(out.code, Some(0), "{out}");
    let (verdict, detail) = out.line("ledger topic");
    assert_eq!(verdict, "ok", "{out}");
    assert!(
        detail.starts_with(&format!(
            "{absent} (kafka.ledger_topic): does not exist yet"
        )),
        "{out}"
    );
    assert!(detail.contains("compacted"), "{out}");
    assert!(detail.contains("validated, not created"), "{out}");
    assert!(!topic_exists(&absent));

    // Missing, may not be created: FAIL with the command that creates it.
    check(&config(&e, "strict.toml", &absent, "create_topics = false")).expect_fail(
        "ledger topic",
        &[
            &format!("the ledger topic `{absent}` (kafka.ledger_topic) does not exist"),
            "cleanup.policy=compact",
            "kafka.create_topics = true",
        ],
    );

    // Exists, compacted: ok, also without create_topics.
    let compacted = unique("check-ledger-compacted");
    create_compacted(&compacted);
    let out = check(&config(&e, "ok.toml", &compacted, "create_topics = false"));
    assert_eq!(out.code, Some(0), "{out}");
    assert_eq!(
        out.line("ledger topic"),
        (
            "ok".to_string(),
            format!("{compacted} (kafka.ledger_topic): exists, compacted, 1 partition(s)")
        ),
        "{out}"
    );

    // Exists with the default cleanup.policy=delete: FAIL naming the fix.
    let plain = unique("check-ledger-plain");
    kafka::shared().create_topic(&plain, 1);
    check(&config(&e, "plain.toml", &plain, "")).expect_fail(
        "ledger topic",
        &[
            "has cleanup.policy=delete",
            &format!("--entity-name {plain} --add-config cleanup.policy=compact"),
        ],
    );
}
