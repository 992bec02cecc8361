//! Every key from the environment (`OUTBOXD_<SECTION>__<KEY>`), through the
//! binary against real servers: the environment wins over the file, no file
//! is needed when the environment has every required key, and `check` lists
//! the effective configuration with secrets masked and where each value
//! came from.

use std::time::Duration;

use crate::harness::kafka::shared;
use crate::harness::pg::PgOptions;
use crate::harness::relay::{env as relay_env, Relay};
use crate::ops::check::support::{check_with, env, SLOT};

/// The `config` line's listing, key -> (value, origin).
fn listing(detail: &str) -> Vec<(String, String)> {
    detail
        .lines()
        .skip(2)
        .map(|l| {
            let (kv, origin) = l.rsplit_once("  ").unwrap_or((l, ""));
            (kv.trim().to_owned(), origin.trim().to_owned())
        })
        .collect()
}

fn origin_of<'a>(listed: &'a [(String, String)], kv: &str) -> &'a str {
    listed
        .iter()
        .find(|(k, _)| k == kv)
        .map(|(_, o)| o.as_str())
        .unwrap_or_else(|| panic!("{kv:?} not listed in {listed:#?}"))
}

#[test]
fn check_shows_the_environment_winning_over_the_file_with_secrets_masked() {
    let e = env(PgOptions::default());
    let file = e.documented_config("file.toml");
    let slot = format!("{SLOT}_env");
    let out = check_with(
        Some(&file),
        &[
            ("OUTBOXD_POSTGRES__SLOT", &slot),
            ("OUTBOXD_RELAY__MAX_IN_FLIGHT_EVENTS", "1234"),
            ("OUTBOXD_KAFKA__PROPERTIES__SASL_PASSWORD", "hunter2"),
        ],
    );
    assert_eq!(out.code, Some(0), "{out}");
    let (verdict, detail) = out.line("config");
    assert_eq!(verdict, "ok");
    assert!(detail.contains(&format!("slot {slot:?}")), "{detail}");
    let listed = listing(&detail);
    assert_eq!(
        origin_of(&listed, &format!("postgres.slot = {slot:?}")),
        "environment OUTBOXD_POSTGRES__SLOT"
    );
    assert_eq!(
        origin_of(&listed, "relay.max_in_flight_events = 1234"),
        "environment OUTBOXD_RELAY__MAX_IN_FLIGHT_EVENTS"
    );
    assert_eq!(
        origin_of(&listed, "kafka.properties.sasl.password = ***"),
        "environment OUTBOXD_KAFKA__PROPERTIES__SASL_PASSWORD"
    );
    assert_eq!(
        origin_of(&listed, "postgres.create_publication = false"),
        "file"
    );
    assert_eq!(
        origin_of(&listed, "relay.shutdown_timeout = \"30s\""),
        "default"
    );
    // The slot line checked the environment's slot, not the file's.
    let (_, slot_line) = out.line("slot");
    assert!(slot_line.contains(&slot), "{slot_line}");
    assert!(!format!("{out}").contains("hunter2"), "{out}");
}

#[test]
fn check_needs_no_file_when_the_environment_has_every_required_key() {
    let e = env(PgOptions::default());
    let url = e.url("postgres", Some("postgres"));
    let out = check_with(
        None,
        &[
            ("OUTBOXD_POSTGRES__URL", &url),
            ("OUTBOXD_POSTGRES__SLOT", SLOT),
            ("OUTBOXD_POSTGRES__PUBLICATION", "fresh"),
            ("OUTBOXD_KAFKA__BROKERS", shared().bootstrap()),
        ],
    );
    assert_eq!(out.code, Some(0), "{out}");
    let (_, detail) = out.line("config");
    assert!(detail.starts_with("the environment: valid"), "{detail}");
    // The superuser's password is in the URL: listed masked, never shown.
    assert!(detail.contains("postgres:***@"), "{detail}");
    assert!(!format!("{out}").contains(":postgres@"), "{out}");

    // Without the URL there is nothing to connect to: exit 2, naming the key.
    let out = check_with(None, &[("OUTBOXD_KAFKA__BROKERS", shared().bootstrap())]);
    assert_eq!(out.code, Some(2), "{out}");
    assert!(out.stdout.contains("postgres.url"), "{out}");
    // A variable naming no key is refused by name.
    let out = check_with(None, &[("OUTBOXD_POSTGRES__SLOTT", "x")]);
    assert_eq!(out.code, Some(2), "{out}");
    assert!(out.stdout.contains("OUTBOXD_POSTGRES__SLOTT"), "{out}");
}

#[test]
fn run_takes_the_environment_over_the_file() {
    let broker = shared();
    let e = relay_env(broker.bootstrap(), "envwins", "");
    // The file routes to envwins.<aggregate_type>; the environment wins.
    let relay = Relay::start_with_env(&e, &[("OUTBOXD_ROUTING__TOPIC", "envwins-from-env")]);
    e.pg.psql(
        "app",
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('order', 'o-1', 'order.created', '{\"n\": 1}')",
    );
    let got = broker.consume_all("envwins-from-env", 1, Duration::from_secs(60));
    assert_eq!(got.len(), 1, "relay log:\n{}", relay.log());
    assert_eq!(got[0].key_str(), Some("o-1"));
}
