//! One test per `validate()` rule: each error must name the full dotted key
//! and say what to do.

use std::time::Duration;

use crate::config::postgres::PasswordSource;
use crate::config::routing::RoutingRule;
use crate::config::*;

fn base() -> Config {
    Config {
        postgres: PostgresConfig {
            url: "postgresql://outboxd@127.0.0.1:5432/app".into(),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// Asserts `cfg` fails validation on `key` with a reason containing `hint`.
#[track_caller]
fn assert_invalid(cfg: &Config, key: &str, hint: &str) {
    match cfg.validate() {
        Err(ConfigError::Invalid { key: k, reason }) => {
            assert_eq!(k, key, "reason: {reason}");
            assert!(reason.contains(hint), "{key}: `{reason}` lacks `{hint}`");
        }
        other => panic!("expected Invalid for {key}, got {other:?}"),
    }
}

#[test]
fn base_is_valid() {
    base().validate().unwrap();
}

#[test]
fn url_required_and_postgres_scheme() {
    let mut c = base();
    c.postgres.url = "host=db user=u".into();
    assert_invalid(&c, "postgres.url", "postgresql://");
}

#[test]
fn slot_name_characters() {
    for bad in ["", "Outboxd", "out-boxd", "outboxd.1", &"a".repeat(64)] {
        let mut c = base();
        c.postgres.slot = bad.to_owned();
        assert_invalid(
            &c,
            "postgres.slot",
            "lower-case letters, digits or underscores",
        );
    }
    let mut c = base();
    c.postgres.slot = "outboxd_2".into();
    c.validate().unwrap();
}

#[test]
fn publication_length() {
    let mut c = base();
    c.postgres.publication = String::new();
    assert_invalid(&c, "postgres.publication", "1 to 63 bytes");
    c.postgres.publication = "p".repeat(64);
    assert_invalid(&c, "postgres.publication", "1 to 63 bytes");
}

#[test]
fn password_source_conflicts() {
    let mut c = base();
    c.postgres.url = "postgresql://u:pw@h/db".into();
    c.postgres.password_env = Some("PGPW".into());
    assert_invalid(
        &c,
        "postgres.password_env",
        "a password in postgres.url, postgres.password_env",
    );

    let mut c = base();
    c.postgres.password_env = Some("PGPW".into());
    c.postgres.password_file = Some("/run/secrets/pg".into());
    assert_invalid(
        &c,
        "postgres.password_env",
        "postgres.password_file; keep exactly one",
    );

    let mut c = base();
    c.postgres.url = "postgresql://u@h/db?password=x".into();
    c.postgres.password_file = Some("/run/secrets/pg".into());
    assert_invalid(&c, "postgres.password_file", "keep exactly one");

    let mut c = base();
    c.postgres.password_env = Some("PGPW".into());
    c.validate().unwrap();
    assert_eq!(c.postgres.password_source(), PasswordSource::Env("PGPW"));
}

#[test]
fn zero_postgres_intervals() {
    let mut c = base();
    c.postgres.status_interval = Duration::ZERO;
    assert_invalid(&c, "postgres.status_interval", "greater than zero");
}

#[test]
fn table_name_format() {
    for bad in ["", "a.b.c", ".outbox", "public.", "\"Outbox\""] {
        let mut c = base();
        single(&mut c.outbox).table = crate::config::outbox::TableRef::Dotted(bad.to_owned());
        assert_invalid(&c, "outbox.table", "schema.table");
    }
    for good in ["my table", "Sales.Outbox Events", "ventes.événements"] {
        let mut c = base();
        single(&mut c.outbox).table = crate::config::outbox::TableRef::Dotted(good.to_owned());
        c.validate().unwrap();
    }
    let mut c = base();
    single(&mut c.outbox).table = crate::config::outbox::TableRef::Parts {
        schema: "s".into(),
        name: "x".repeat(64),
    };
    assert_invalid(&c, "outbox.table", "1 to 63 bytes");
}

#[test]
fn required_columns_non_empty() {
    let mut c = base();
    single(&mut c.outbox).columns.event_type = String::new();
    assert_invalid(&c, "outbox.columns.event_type", "required");
    let mut c = base();
    single(&mut c.outbox).columns.headers = "\"Headers\"".into();
    assert_invalid(&c, "outbox.columns.headers", "without quotes");
}

#[test]
fn template_placeholders_well_formed() {
    let cases = [
        ("outbox.${aggregate_type", "unterminated"),
        ("outbox.${aggregatetype}", "unknown placeholder"),
        ("outbox.${column:}", "needs a column name"),
        ("outbox event", "topic names allow only"),
        ("", "must not be empty"),
        ("t.${timestamp}", "outbox.columns.timestamp is empty"),
    ];
    for (template, hint) in cases {
        let mut c = base();
        c.routing.topic = template.to_owned();
        assert_invalid(&c, "routing.topic", hint);
    }
    let mut c = base();
    c.routing.topic = "t.${event_type}.${column:tenant}".into();
    c.validate().unwrap();
}

#[test]
fn rules_are_checked_with_their_index() {
    let rule = |topic: &str| RoutingRule {
        event_type: Some("a".into()),
        topic: topic.into(),
        ..Default::default()
    };
    let mut c = base();
    c.routing.rules = vec![rule("ok"), rule("bad.${x")];
    assert_invalid(&c, "routing.rules[1].topic", "unterminated");

    c.routing.rules = vec![RoutingRule {
        topic: "t".into(),
        ..Default::default()
    }];
    assert_invalid(&c, "routing.rules[0]", "no matcher");

    c.routing.rules = vec![RoutingRule {
        event_type_prefix: Some(String::new()),
        topic: "t".into(),
        ..Default::default()
    }];
    assert_invalid(&c, "routing.rules[0].event_type_prefix", "remove it");

    c.routing.rules = vec![RoutingRule {
        event_type_prefix: Some("p.".into()),
        ..rule("t")
    }];
    assert_invalid(
        &c,
        "routing.rules[0].event_type_prefix",
        "cannot be combined",
    );
}

#[test]
fn header_sources_non_empty() {
    let mut c = base();
    c.routing
        .additional_headers
        .insert("tenant".into(), String::new());
    assert_invalid(&c, "routing.additional_headers.tenant", "column role");
}

#[test]
fn backoff_min_not_above_max() {
    let mut c = base();
    c.relay.reconnect_backoff_min = Duration::from_secs(60);
    assert_invalid(&c, "relay.reconnect_backoff_min", "reconnect_backoff_max");
    c.relay.reconnect_backoff_min = Duration::ZERO;
    assert_invalid(&c, "relay.reconnect_backoff_min", "greater than zero");
}

#[test]
fn limits_positive() {
    let mut c = base();
    c.relay.max_in_flight_events = 0;
    assert_invalid(&c, "relay.max_in_flight_events", "at least 1");
    let mut c = base();
    c.relay.max_in_flight_bytes = 0;
    assert_invalid(&c, "relay.max_in_flight_bytes", "greater than zero");
    let mut c = base();
    c.kafka.topic_partitions = 0;
    assert_invalid(&c, "kafka.topic_partitions", "-1 for the broker default");
    c.kafka.topic_partitions = -1;
    c.validate().unwrap();
}

#[test]
fn dead_letter_needs_topic() {
    let mut c = base();
    c.relay.on_error = OnError::DeadLetter;
    assert_invalid(
        &c,
        "relay.dead_letter_topic",
        "required when relay.on_error",
    );
    c.relay.dead_letter_topic = Some("dlq topic".into());
    assert_invalid(&c, "relay.dead_letter_topic", "not a Kafka topic name");
    c.relay.dead_letter_topic = Some("outbox.dlq".into());
    c.validate().unwrap();
}

#[test]
fn kafka_brokers_and_properties() {
    let mut c = base();
    c.kafka.brokers = Some("a:9092,,b:9092".into());
    assert_invalid(&c, "kafka.brokers", "empty entry");
    let mut c = base();
    c.kafka
        .properties
        .insert("bootstrap.servers".into(), "a:9092".into());
    assert_invalid(
        &c,
        "kafka.properties.\"bootstrap.servers\"",
        "kafka.brokers",
    );
}

#[test]
fn relay_requires_brokers() {
    let mut c = base();
    let err = c.validate_for_relay().unwrap_err();
    assert_eq!(err.key(), Some("kafka.brokers"));
    assert!(
        err.to_string().contains("required to run the relay"),
        "{err}"
    );
    c.kafka.brokers = Some("127.0.0.1:9092".into());
    c.validate_for_relay().unwrap();
}

/// Without the `gssapi` feature, Kerberos is refused by key, naming the
/// feature; the built-in mechanisms pass.
#[cfg(not(feature = "gssapi"))]
#[test]
fn gssapi_needs_the_cargo_feature() {
    let with = |props: &[(&str, &str)]| {
        let mut c = base();
        c.kafka.brokers = Some("127.0.0.1:9092".into());
        for (k, v) in props {
            c.kafka.properties.insert(k.to_string(), v.to_string());
        }
        c.validate_for_relay()
    };
    for (props, key) in [
        (&[("sasl.mechanisms", "GSSAPI")][..], "sasl.mechanisms"),
        (&[("sasl.mechanism", "gssapi")][..], "sasl.mechanism"),
        (&[("security.protocol", "SASL_SSL")][..], "sasl.mechanisms"),
    ] {
        let err = with(props).unwrap_err();
        assert_eq!(
            err.key(),
            Some(format!("kafka.properties.\"{key}\"").as_str())
        );
        assert!(err.to_string().contains("--features gssapi"), "{err}");
    }
    for mechanism in ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] {
        with(&[
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanisms", mechanism),
        ])
        .unwrap();
    }
    with(&[("security.protocol", "SSL")]).unwrap();
}

#[test]
fn log_level_typo() {
    let mut c = base();
    c.log.level = "infos".into();
    assert_invalid(&c, "log.level", "info,outboxd=debug");
    c.log.level = "warn,outboxd=trace".into();
    c.validate().unwrap();
}

#[test]
fn stream_timeout_leaves_room_for_a_reply() {
    let mut c = base();
    c.postgres.stream_timeout = Duration::ZERO;
    assert_invalid(&c, "postgres.stream_timeout", "greater than zero");
    c.postgres.stream_timeout = Duration::from_secs(2);
    assert_invalid(&c, "postgres.stream_timeout", "at least \"3s\"");
}

#[test]
fn max_permanent_failures_at_least_one() {
    let mut c = base();
    c.relay.max_permanent_failures = 0;
    assert_invalid(&c, "relay.max_permanent_failures", "at least 1");
}

#[test]
fn standby_poll_interval_not_zero() {
    let mut c = base();
    c.relay.standby_poll_interval = Duration::ZERO;
    assert_invalid(&c, "relay.standby_poll_interval", "greater than zero");
}

/// The `[outbox]` of a single-table config, to edit.
fn single(o: &mut crate::config::OutboxSection) -> &mut crate::config::outbox::OutboxConfig {
    match o {
        crate::config::OutboxSection::Single(o) => o,
        crate::config::OutboxSection::Entries(_) => panic!("a single [outbox] was expected"),
    }
}
