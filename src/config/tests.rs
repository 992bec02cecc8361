//! Loading tests: the example file, unknown keys, environment substitution,
//! and unit parsing through the whole pipeline.

use std::time::Duration;

use crate::config::*;

const EXAMPLE: &str = include_str!("../../config/outboxd.toml");

/// Every key of the schema, as `section.key`; the example file must show each.
const ALL_KEYS: &[&str] = &[
    "postgres.url",
    "postgres.password_env",
    "postgres.password_file",
    "postgres.slot",
    "postgres.publication",
    "postgres.create_slot",
    "postgres.create_publication",
    "postgres.status_interval",
    "postgres.connect_timeout",
    "postgres.stream_timeout",
    "outbox.table",
    "outbox.message_prefix",
    "outbox.columns.id",
    "outbox.columns.key",
    "outbox.columns.aggregate_type",
    "outbox.columns.event_type",
    "outbox.columns.payload",
    "outbox.columns.headers",
    "outbox.columns.timestamp",
    "outbox.columns.topic",
    "outbox.columns.trace_context",
    "outbox.columns.ce_extensions",
    "kafka.brokers",
    "kafka.create_topics",
    "kafka.topic_partitions",
    "kafka.topic_replication_factor",
    "kafka.ledger_topic",
    "kafka.ledger_replication_factor",
    "kafka.transactional_id",
    "kafka.ledger_write_timeout",
    "routing.topic",
    "routing.value",
    "routing.format",
    "routing.cloudevents.source",
    "routing.cloudevents.data_content_type",
    "routing.cloudevents.extensions",
    "routing.tombstone_on_empty_payload",
    "routing.additional_headers",
    "routing.value_format",
    "routing.subject",
    "routing.schema_version",
    "routing.auto_register",
    "routing.schema_file",
    "routing.rules.event_type",
    "routing.rules.event_type_prefix",
    "routing.rules.aggregate_type",
    "routing.rules.topic",
    "routing.rules.schema_file",
    "schema_registry.url",
    "schema_registry.username",
    "schema_registry.password",
    "schema_registry.ca_file",
    "schema_registry.cert_file",
    "schema_registry.key_file",
    "schema_registry.request_timeout",
    "schema_registry.refresh_interval",
    "relay.max_in_flight_events",
    "relay.max_in_flight_bytes",
    "relay.on_error",
    "relay.dead_letter_topic",
    "relay.shutdown_timeout",
    "relay.reconnect_backoff_min",
    "relay.reconnect_backoff_max",
    "relay.max_permanent_failures",
    "relay.standby_poll_interval",
    "relay.delivery",
    "relay.transaction_max_events",
    "relay.transaction_max_delay",
    "metrics.listen",
    "metrics.slot_sample_interval",
    "metrics.stall_threshold",
    "metrics.debezium_aliases",
    "log.format",
    "log.level",
];

/// Tables of the schema; the example must show each header (maybe commented).
const ALL_TABLES: &[&str] = &[
    "[postgres]",
    "[outbox]",
    "[outbox.columns]",
    "[kafka]",
    "[kafka.properties]",
    "[routing]",
    "[[routing.rules]]",
    "[routing.cloudevents]",
    "[schema_registry]",
    "[relay]",
    "[metrics]",
    "[log]",
];

fn no_env(_: &str) -> Option<String> {
    None
}

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::from_toml_str_with_env(text, no_env)
}

fn parse_err(text: &str) -> String {
    parse(text).unwrap_err().to_string()
}

/// Whether `key` is set, live or commented out, under table `table` of the
/// example: a line `[#] key = ...` after the table's header, before the next.
fn example_has(table: &str, key: &str) -> bool {
    let header = |l: &str| l.trim_start_matches('#').trim().starts_with('[');
    let mut in_table = false;
    for line in EXAMPLE.lines() {
        let l = line.trim_start_matches('#').trim();
        if header(line) {
            in_table = l.trim_matches(['[', ']']) == table;
        } else if in_table && l.split_once('=').is_some_and(|(k, _)| k.trim() == key) {
            return true;
        }
    }
    false
}

#[test]
fn example_file_parses_and_is_relay_ready() {
    let cfg = parse(EXAMPLE).unwrap();
    cfg.validate_for_relay().unwrap();
    assert_eq!(cfg.postgres.url, "postgresql://outboxd@127.0.0.1:5432/app");
    assert_eq!(cfg.kafka.brokers.as_deref(), Some("127.0.0.1:9092"));
}

#[test]
fn example_file_shows_the_defaults() {
    // The example documents defaults; if a constant changes, so must the text.
    let cfg = parse(EXAMPLE).unwrap();
    let defaults = Config::default();
    assert_eq!(
        cfg.postgres,
        PostgresConfig {
            url: cfg.postgres.url.clone(),
            ..defaults.postgres
        }
    );
    assert_eq!(cfg.outbox, defaults.outbox);
    assert_eq!(
        cfg.kafka,
        KafkaConfig {
            brokers: cfg.kafka.brokers.clone(),
            ..defaults.kafka
        }
    );
    assert_eq!(cfg.routing, defaults.routing);
    assert_eq!(cfg.schema_registry, defaults.schema_registry);
    assert_eq!(cfg.relay, defaults.relay);
    assert_eq!(cfg.metrics, defaults.metrics);
    assert_eq!(cfg.log, defaults.log);
}

#[test]
fn example_file_mentions_every_key() {
    let missing: Vec<&str> = ALL_KEYS
        .iter()
        .filter(|dotted| {
            let (table, key) = dotted.rsplit_once('.').unwrap();
            !example_has(table, key)
        })
        .copied()
        .collect();
    assert!(
        missing.is_empty(),
        "config/outboxd.toml does not show: {missing:?}"
    );
    for table in ALL_TABLES {
        assert!(
            EXAMPLE.contains(table),
            "config/outboxd.toml does not show {table}"
        );
    }
}

#[test]
fn example_commented_rules_parse_when_enabled() {
    // Uncommenting the documented rules must give a valid config.
    let uncommented: String = EXAMPLE
        .lines()
        .map(|l| match l.strip_prefix("# ") {
            Some(rest)
                if rest.starts_with("[[routing.rules]]")
                    || rest.starts_with("event_type")
                    || rest.starts_with("aggregate_type =")
                    || rest.starts_with("topic =") =>
            {
                rest
            }
            _ => l,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let cfg = parse(&uncommented).unwrap();
    assert_eq!(cfg.routing.rules.len(), 3);
    assert_eq!(
        cfg.routing
            .topic_template_for("payment.completed", "payment"),
        "payments"
    );
    assert_eq!(
        cfg.routing
            .topic_template_for("payment.refunded", "payment"),
        "payments.other"
    );
    assert_eq!(
        cfg.routing.topic_template_for("x", "customer"),
        "crm.${event_type}"
    );
}

#[test]
fn minimal_config_takes_defaults() {
    let cfg = parse("[postgres]\nurl = \"postgresql://u@h/db\"").unwrap();
    assert_eq!(cfg.postgres.slot, postgres::DEFAULT_SLOT);
    assert_eq!(cfg.relay.max_in_flight_bytes, 64 << 20);
    assert_eq!(
        cfg.routing.additional_headers,
        routing::default_additional_headers()
    );
    assert_eq!(cfg.metrics.listen, None);
    let err = cfg.validate_for_relay().unwrap_err();
    assert_eq!(err.key(), Some("kafka.brokers"));
}

#[test]
fn missing_url_names_the_key() {
    assert!(parse("")
        .unwrap_err()
        .to_string()
        .starts_with("postgres.url: required"));
}

#[test]
fn unknown_top_level_key_is_named() {
    let err = parse_err("[postgres]\nurl = \"postgresql://h/db\"\n\n[kafak]\nbrokers = \"b\"");
    assert!(err.contains("kafak") && err.contains("line 4"), "{err}");
}

#[test]
fn unknown_nested_keys_are_named() {
    let err = parse_err("[postgres]\nurl = \"postgresql://h/db\"\nslott = \"x\"");
    assert!(err.contains("slott") && err.contains("line 3"), "{err}");
    let err =
        parse_err("[postgres]\nurl = \"postgresql://h/db\"\n[outbox.columns]\naggregateid = \"a\"");
    assert!(
        err.contains("aggregateid") && err.contains("line 4"),
        "{err}"
    );
    let err = parse_err(
        "[postgres]\nurl = \"postgresql://h/db\"\n[[routing.rules]]\nevent = \"a\"\ntopic = \"t\"",
    );
    assert!(err.contains("`event`"), "{err}");
}

#[test]
fn unknown_enum_value_lists_the_choices() {
    let err = parse_err("[postgres]\nurl = \"postgresql://h/db\"\n[relay]\non_error = \"skip\"");
    assert!(err.contains("skip") && err.contains("dead_letter"), "{err}");
}

#[test]
fn env_substitution_in_config() {
    let text = "[postgres]\nurl = \"postgresql://u@${PGHOST_X}/db\"\nslot = \"${SLOT_X:-fallback_slot}\"\n\
                [routing]\ntopic = \"events.${aggregate_type}\"\n\
                [kafka]\nbrokers = \"$${LITERAL}\"\ntopic_partitions = ${PARTS_X:-3}";
    let cfg = Config::from_toml_str_with_env(text, |n| (n == "PGHOST_X").then(|| "db:5432".into()))
        .unwrap();
    assert_eq!(cfg.postgres.url, "postgresql://u@db:5432/db");
    assert_eq!(cfg.postgres.slot, "fallback_slot");
    assert_eq!(cfg.routing.topic, "events.${aggregate_type}");
    assert_eq!(cfg.kafka.brokers.as_deref(), Some("${LITERAL}"));
    assert_eq!(cfg.kafka.topic_partitions, 3);

    match parse(text) {
        Err(ConfigError::MissingEnv { name, line }) => {
            assert_eq!((name.as_str(), line), ("PGHOST_X", 2))
        }
        other => panic!("expected MissingEnv, got {other:?}"),
    }
}

#[test]
fn durations_and_sizes_through_the_pipeline() {
    let base = "[postgres]\nurl = \"postgresql://h/db\"\n";
    let cfg = parse(&format!("{base}status_interval = \"250ms\"\n[relay]\nmax_in_flight_bytes = \"1GiB\"\nshutdown_timeout = \"2m\"")).unwrap();
    assert_eq!(cfg.postgres.status_interval, Duration::from_millis(250));
    assert_eq!(cfg.relay.max_in_flight_bytes, 1 << 30);
    assert_eq!(cfg.relay.shutdown_timeout, Duration::from_secs(120));

    let err = parse_err(&format!("{base}connect_timeout = 10"));
    assert!(err.contains("\"10s\"") && err.contains("line 3"), "{err}");
    let err = parse_err(&format!("{base}[relay]\nshutdown_timeout = \"30 sec\""));
    assert!(err.contains("unknown unit `sec`"), "{err}");
    let err = parse_err(&format!("{base}[relay]\nmax_in_flight_bytes = \"64MB\""));
    assert!(err.contains("MiB") && err.contains("line 4"), "{err}");
    let err = parse_err(&format!("{base}[metrics]\nlisten = \"localhost:9187\""));
    assert!(
        err.contains("localhost:9187") && err.contains("127.0.0.1:9187"),
        "{err}"
    );
}

#[test]
fn from_file_reads_and_reports_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("outboxd.toml");
    std::fs::write(&path, "[postgres]\nurl = \"postgresql://h/db\"\n").unwrap();
    assert_eq!(
        Config::from_file(&path).unwrap().postgres.url,
        "postgresql://h/db"
    );

    std::fs::write(&path, "[postgres]\nurl = 5\n").unwrap();
    let err = Config::from_file(&path).unwrap_err().to_string();
    assert!(err.contains("line 2") && err.contains("url = 5"), "{err}");

    let missing = dir.path().join("nope.toml");
    match Config::from_file(&missing) {
        Err(ConfigError::Io { path, .. }) => assert_eq!(path, missing),
        other => panic!("expected Io, got {other:?}"),
    }
}

#[test]
fn metrics_keys_parse_and_zero_durations_are_refused() {
    let base = "[postgres]\nurl = \"postgresql://h/db\"\n[metrics]\n";
    let cfg = parse(&format!(
        "{base}slot_sample_interval = \"2s\"\nstall_threshold = \"90s\"\ndebezium_aliases = true"
    ))
    .unwrap();
    assert_eq!(cfg.metrics.slot_sample_interval, Duration::from_secs(2));
    assert_eq!(cfg.metrics.stall_threshold, Duration::from_secs(90));
    assert!(cfg.metrics.debezium_aliases);
    for key in ["slot_sample_interval", "stall_threshold"] {
        let err = parse_err(&format!("{base}{key} = \"0s\""));
        assert!(
            err.contains("greater than zero") && err.contains("line 4"),
            "{err}"
        );
    }
}

#[test]
fn the_window_holds_a_whole_kafka_transaction_in_exactly_once() {
    let base = "[postgres]\nurl = \"postgresql://h/db\"\n[relay]\n";
    let window = |relay: &str| {
        parse(&format!("{base}{relay}"))
            .unwrap()
            .relay
            .window_events()
    };
    assert_eq!(window(""), 1536, "at-least-once: max_in_flight_events");
    assert_eq!(window("transaction_max_events = 9000"), 1536);
    assert_eq!(window("delivery = \"exactly-once\""), 3072);
    assert_eq!(
        window("delivery = \"exactly-once\"\nmax_in_flight_events = 10000"),
        10000,
        "a larger window stays"
    );
    assert_eq!(
        window("delivery = \"exactly-once\"\ntransaction_max_events = 100"),
        1536,
        "a smaller transaction does not shrink the window"
    );
}
