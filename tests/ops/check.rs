//! `outboxd check` against real servers: the documented setup passes with
//! every line `ok` and creates nothing; each misconfiguration fails on its
//! line with the message naming the fix, and exit code 1 (2 for a config
//! that cannot be read).

mod acl;
mod exactly_once;
mod ledger;
mod secure;
pub(crate) mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::harness::kafka;
use crate::harness::outboxd::bin;
use crate::harness::pg::PgOptions;
use support::{check, env, topic_exists, SLOT};

const EVERY_CHECK: [&str; 16] = [
    "config",
    "postgres",
    "server version",
    "wal_level",
    "replication slots",
    "wal senders",
    "privileges",
    "slot",
    "failover slot",
    "publication",
    "outbox columns",
    "kafka",
    "topics",
    "ledger topic",
    "idempotence",
    "rights",
];

#[test]
fn healthy_setup_passes_and_creates_nothing() {
    let e = env(PgOptions::default());
    let routing = "[routing]\ntopic = \"check.${aggregate_type}\"\n\
                   [[routing.rules]]\nevent_type_prefix = \"payment.\"\ntopic = \"check-payments\"\n\
                   [relay]\non_error = \"dead_letter\"\ndead_letter_topic = \"check-dlq\"\n";
    let documented = e.config(
        "documented.toml",
        &e.url("outboxd", None),
        kafka::shared().bootstrap(),
        "create_publication = false",
        routing,
    );
    // As the table's owner with a publication still to be created.
    let owner = e.config(
        "owner.toml",
        &e.url("postgres", Some("postgres")),
        kafka::shared().bootstrap(),
        "publication = \"fresh\"",
        routing,
    );
    for config in [&documented, &owner] {
        let out = check(config);
        assert_eq!(out.code, Some(0), "{out}");
        let lines = out.lines();
        for (verdict, name, _) in &lines {
            assert_eq!(verdict, "ok", "{name} is not ok:\n{out}");
        }
        let names: Vec<&str> = lines.iter().map(|(_, n, _)| n.as_str()).collect();
        for name in EVERY_CHECK {
            assert!(names.contains(&name), "no {name:?} line:\n{out}");
        }
        assert!(
            out.stdout.contains("summary: 20 ok, 0 warn, 0 FAIL"),
            "{out}"
        );
        assert!(
            out.line("slot").1.contains("outboxd will create it"),
            "{out}"
        );
        let topics: Vec<&str> = lines
            .iter()
            .filter(|(_, n, _)| n == "topics")
            .map(|(_, _, d)| d.as_str())
            .collect();
        assert!(topics[0].contains("check.${aggregate_type}"), "{out}");
        assert!(topics[0].contains("decided per event"), "{out}");
        assert!(
            topics[1].starts_with("check-payments (routing.rules[0].topic)"),
            "{out}"
        );
        assert!(
            topics[2].starts_with("check-dlq (relay.dead_letter_topic)"),
            "{out}"
        );
        assert!(topics[2].contains("validated, not created"), "{out}");
    }
    let out = check(&owner);
    assert!(
        out.line("publication")
            .1
            .contains("\"fresh\" does not exist yet"),
        "{out}"
    );
    assert!(
        out.line("privileges")
            .1
            .contains("may create the publication"),
        "{out}"
    );

    // It only looked.
    assert_eq!(e.count("SELECT count(*) FROM pg_replication_slots"), "0");
    assert_eq!(
        e.count("SELECT count(*) FROM pg_publication WHERE pubname = 'fresh'"),
        "0"
    );
    assert!(!topic_exists("check-payments"));
    assert!(!topic_exists("check-dlq"));

    // An existing slot is described, with its lag.
    e.pg.psql(
        "app",
        &format!("SELECT pg_create_logical_replication_slot('{SLOT}', 'pgoutput')"),
    );
    e.pg.psql("app", "SELECT outbox_emit('a', '1', 'e', '{}')");
    let out = check(&documented);
    assert_eq!(out.code, Some(0), "{out}");
    let slot = out.line("slot").1;
    assert!(
        slot.contains("pgoutput, database \"app\", not active"),
        "{out}"
    );
    assert!(slot.contains("wal_status reserved"), "{out}");
    assert!(
        !slot.contains("lag 0 bytes") && slot.contains(" bytes"),
        "{out}"
    );
}

#[test]
fn wal_level_replica_fails_with_the_fix() {
    let e = env(PgOptions {
        wal_level_logical: false,
        ..PgOptions::default()
    });
    let out = check(&e.documented_config("c.toml"));
    out.expect_fail(
        "wal_level",
        &["wal_level is 'replica'", "wal_level = logical"],
    );
    assert_eq!(out.line("postgres").0, "ok", "{out}");
    assert_eq!(out.line("kafka").0, "ok", "{out}");
}

#[test]
fn publication_without_the_table_fails_with_the_fix() {
    let e = env(PgOptions::default());
    e.pg.psql(
        "app",
        "CREATE TABLE other (id int); CREATE PUBLICATION wrongtable FOR TABLE other",
    );
    let c = e.config(
        "c.toml",
        &e.url("outboxd", None),
        kafka::shared().bootstrap(),
        "publication = \"wrongtable\"\ncreate_publication = false",
        "",
    );
    check(&c).expect_fail(
        "publication",
        &[
            "\"wrongtable\" does not include \"public\".\"outbox\"",
            "ALTER PUBLICATION \"wrongtable\" ADD TABLE \"public\".\"outbox\"",
        ],
    );
}

#[test]
fn role_without_replication_fails_with_the_fix() {
    let e = env(PgOptions::default());
    e.pg.create_role("norepl", "pw", "");
    e.pg.psql("app", "GRANT SELECT ON outbox TO norepl");
    let c = e.config(
        "c.toml",
        &e.url("norepl", Some("pw")),
        kafka::shared().bootstrap(),
        "create_publication = false",
        "",
    );
    let out = check(&c);
    out.expect_fail(
        "privileges",
        &[
            "\"norepl\" lacks the REPLICATION attribute",
            "ALTER ROLE \"norepl\" REPLICATION",
        ],
    );
    // The walsender refuses it too, and says so.
    let (verdict, detail) = out.line("postgres");
    assert_eq!(verdict, "FAIL", "{out}");
    assert!(detail.contains("replication connection does not"), "{out}");
}

#[test]
fn slot_in_use_fails_with_the_pid() {
    let e = env(PgOptions::default());
    let c = e.documented_config("c.toml");
    let mut holder = Command::new(bin())
        .args(["tail", "--config"])
        .arg(&c)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let active =
        format!("SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{SLOT}' AND active");
    let start = std::time::Instant::now();
    while e.count(&active) != "1" {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "tail never took the slot"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let pid = e.count(&format!(
        "SELECT active_pid FROM pg_replication_slots WHERE slot_name = '{SLOT}'"
    ));
    let out = check(&c);
    holder.kill().unwrap();
    holder.wait().unwrap();
    out.expect_fail(
        "slot",
        &[
            &format!("\"{SLOT}\" is active for PID {pid}"),
            &format!("pg_terminate_backend({pid})"),
        ],
    );
}

#[test]
fn unreachable_kafka_fails_and_skips_the_rest() {
    let e = env(PgOptions::default());
    // A port nothing listens on: bound, then released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let brokers = format!("127.0.0.1:{port}");
    let c = e.config(
        "c.toml",
        &e.url("outboxd", None),
        &brokers,
        "create_publication = false",
        "",
    );
    let out = check(&c);
    out.expect_fail(
        "kafka",
        &[
            &format!("no metadata from kafka.brokers = \"{brokers}\""),
            "check the addresses",
        ],
    );
    assert!(
        out.line("topics").0 == "skip" && out.line("idempotence").0 == "skip",
        "{out}"
    );
    assert_eq!(out.line("publication").0, "ok", "{out}");
}

#[test]
fn missing_outbox_column_fails_with_the_fix() {
    let e = env(PgOptions::default());
    e.pg.psql("app", "ALTER TABLE outbox RENAME COLUMN payload TO body");
    let out = check(&e.documented_config("c.toml"));
    out.expect_fail(
        "outbox columns",
        &[
            "column `payload` (outbox.columns.payload) is not in \"public\".\"outbox\"",
            "set outbox.columns.payload",
        ],
    );
    // With the config following the table, the type is checked as well.
    let c = e.config(
        "body.toml",
        &e.url("outboxd", None),
        kafka::shared().bootstrap(),
        "create_publication = false",
        "[outbox.columns]\npayload = \"body\"\n",
    );
    let out = check(&c);
    assert_eq!(out.code, Some(0), "{out}");
    assert!(out.line("outbox columns").1.contains("body jsonb"), "{out}");

    // A publication column list (PostgreSQL 15+) that leaves a column out
    // fails every event just the same.
    if e.pg.major() >= 15 {
        e.pg.psql(
            "app",
            "CREATE PUBLICATION some_cols FOR TABLE outbox (id, aggregate_id, aggregate_type, event_type)",
        );
        let c = e.config(
            "cols.toml",
            &e.url("outboxd", None),
            kafka::shared().bootstrap(),
            "publication = \"some_cols\"\ncreate_publication = false",
            "[outbox.columns]\npayload = \"body\"\n",
        );
        check(&c).expect_fail(
            "outbox columns",
            &["column `body` (outbox.columns.payload) is not published by \"some_cols\""],
        );
    }
}

#[test]
fn topics_must_exist_without_create_topics() {
    let e = env(PgOptions::default());
    kafka::shared().create_topic("check-present", 2);
    let c = e.config(
        "c.toml",
        &e.url("outboxd", None),
        kafka::shared().bootstrap(),
        "create_publication = false",
        "create_topics = false\n\
         [routing]\ntopic = \"check-present\"\n\
         [relay]\non_error = \"dead_letter\"\ndead_letter_topic = \"check-absent\"\n",
    );
    let out = check(&c);
    out.expect_fail(
        "topics",
        &[
            "Kafka topic `check-absent` does not exist",
            "kafka.create_topics = true",
        ],
    );
    let present = out.lines();
    assert!(
        present.iter().any(|(v, n, d)| v == "ok"
            && n == "topics"
            && d.contains("check-present (routing.topic): exists, 2 partition(s)")),
        "{out}"
    );
}

#[test]
fn unreadable_config_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let out = check(&dir.path().join("absent.toml"));
    assert_eq!(out.code, Some(2), "{out}");
    assert_eq!(out.line("config").0, "FAIL", "{out}");
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[postgres]\nurl = \"postgresql://u@h/db\"\nslott = \"x\"\n",
    )
    .unwrap();
    let out = check(&bad);
    assert_eq!(out.code, Some(2), "{out}");
    assert!(out.line("config").1.contains("slott"), "{out}");
}

#[test]
fn trace_context_column_is_checked_like_the_other_mapped_columns() {
    let e = env(PgOptions::default());
    let with_trace = |name: &str| {
        e.config(
            name,
            &e.url("outboxd", None),
            kafka::shared().bootstrap(),
            "create_publication = false",
            "[outbox.columns]\ntrace_context = \"trace\"\n",
        )
    };
    check(&with_trace("missing.toml")).expect_fail(
        "outbox columns",
        &[
            "column `trace` (outbox.columns.trace_context) is not in \"public\".\"outbox\"",
            "set outbox.columns.trace_context",
        ],
    );
    e.pg.psql("app", "ALTER TABLE outbox ADD COLUMN trace bigint");
    check(&with_trace("mistyped.toml")).expect_fail(
        "outbox columns",
        &["trace", "outbox.columns.trace_context", "W3C traceparent"],
    );
    e.pg.psql("app", "ALTER TABLE outbox ALTER COLUMN trace TYPE text");
    let out = check(&with_trace("good.toml"));
    assert_eq!(out.code, Some(0), "{out}");
    assert!(out.line("outbox columns").1.contains("trace text"), "{out}");
}
