//! `outboxd check` with `relay.delivery = "exactly-once"`: four more lines
//! (transactions, the state log, the transactional id, the timeout), each
//! FAIL naming the fix; the relay's own transactional id is never
//! initialised, so a running relay is not fenced by a check.

use crate::harness::kafka;
use crate::harness::pg::PgOptions;

use super::support::{check, env, Env};

const TXN_CHECKS: [&str; 4] = [
    "transactions",
    "txn state log",
    "transactional id",
    "txn timeout",
];

fn exactly_once(e: &Env, name: &str, brokers: &str, kafka: &str) -> std::path::PathBuf {
    e.config(
        name,
        &e.url("outboxd", None),
        brokers,
        "create_publication = false",
        &format!("{kafka}\n[relay]\ndelivery = \"exactly-once\"\n"),
    )
}

#[test]
fn transactions_pass_on_the_test_broker_and_a_high_timeout_fails() {
    let e = env(PgOptions::default());
    let broker = kafka::shared();
    let out = check(&exactly_once(&e, "eos.toml", broker.bootstrap(), ""));
    assert_eq!(out.code, Some(0), "{out}");
    for name in TXN_CHECKS {
        assert_eq!(out.line(name).0, "ok", "{name}:\n{out}");
    }
    assert!(
        out.stdout.contains("summary: 20 ok, 0 warn, 0 FAIL"),
        "{out}"
    );
    let system = e.count("SELECT system_identifier FROM pg_control_system()");
    let id = format!("outboxd-{system}/app/check");
    let txn_id = out.line("transactional id").1;
    assert!(
        txn_id.contains(&format!("{id:?} (derived from the ledger key)"))
            && txn_id.contains(&format!("{:?} instead", format!("{id}.check"))),
        "{out}"
    );
    assert!(
        out.line("txn timeout")
            .1
            .contains("transaction.timeout.ms = 60000 (librdkafka's default) <= the brokers' transaction.max.timeout.ms = 900000"),
        "{out}"
    );

    // Above the broker's maximum (Kafka's default, 15 minutes).
    let high = exactly_once(
        &e,
        "high.toml",
        broker.bootstrap(),
        "transactional_id = \"relay-a\"\n[kafka.properties]\n\"transaction.timeout.ms\" = \"900001\"",
    );
    let out = check(&high);
    out.expect_fail(
        "txn timeout",
        &[
            "transaction.timeout.ms = 900001 (kafka.properties)",
            "transaction.max.timeout.ms = 900000",
            "lower kafka.properties.\"transaction.timeout.ms\"",
            "raise transaction.max.timeout.ms on the brokers",
        ],
    );
    // The coordinator refused the probe for that reason, and said so.
    assert_eq!(out.line("transactions").0, "ok", "{out}");
    assert_eq!(out.line("transactional id").0, "skip", "{out}");

    // At-least-once (the default) adds no line.
    let out = check(&e.documented_config("alo.toml"));
    assert_eq!(out.code, Some(0), "{out}");
    let names: Vec<String> = out.lines().into_iter().map(|(_, n, _)| n).collect();
    for name in TXN_CHECKS {
        assert!(!names.iter().any(|n| n == name), "{name}:\n{out}");
    }
}

#[test]
fn a_transaction_timeout_below_the_message_timeout_fails_with_the_fix() {
    let e = env(PgOptions::default());
    let c = exactly_once(
        &e,
        "low.toml",
        kafka::shared().bootstrap(),
        "[kafka.properties]\n\"transaction.timeout.ms\" = \"20000\"",
    );
    let out = check(&c);
    out.expect_fail(
        "txn timeout",
        &[
            "transaction.timeout.ms = 20000 (kafka.properties) is below message.timeout.ms = 30000",
            "raise kafka.properties.\"transaction.timeout.ms\" to at least 30000",
        ],
    );
    // librdkafka refuses that producer: the probe says so too.
    let (verdict, detail) = out.line("transactions");
    assert_eq!(verdict, "FAIL", "{out}");
    assert!(detail.contains("transaction.timeout.ms"), "{out}");
}

#[test]
fn a_state_log_replication_factor_above_the_broker_count_fails_with_the_fix() {
    let broker = kafka::KafkaBroker::start_with(
        "transaction.state.log.replication.factor=3\ntransaction.state.log.min.isr=2",
    );
    let e = env(PgOptions::default());
    let out = check(&exactly_once(&e, "rf3.toml", broker.bootstrap(), ""));
    out.expect_fail(
        "txn state log",
        &[
            "transaction.state.log.replication.factor = 3, transaction.state.log.min.isr = 2, 1 broker(s)",
            "Kafka cannot create __transaction_state",
            "set transaction.state.log.replication.factor to at most 1",
        ],
    );
    // The probe would only wait out its timeout: not run.
    assert_eq!(out.line("transactions").0, "skip", "{out}");
    assert_eq!(out.line("transactional id").0, "skip", "{out}");
    assert_eq!(out.line("txn timeout").0, "ok", "{out}");
    assert_eq!(out.line("idempotence").0, "ok", "{out}");
}

#[test]
fn a_principal_without_write_on_the_transactional_id_fails_naming_the_acl() {
    let broker = kafka::KafkaBroker::start_with(super::acl::AUTHORIZER);
    super::acl::deny_transactional_ids(broker.bootstrap(), "outboxd-");
    let e = env(PgOptions::default());
    let out = check(&exactly_once(&e, "acl.toml", broker.bootstrap(), ""));
    let system = e.count("SELECT system_identifier FROM pg_control_system()");
    let id = format!("outboxd-{system}/app/check");
    out.expect_fail(
        "transactional id",
        &[
            &format!("may not use transactional id {:?}", format!("{id}.check")),
            "TransactionalIdAuthorizationFailed",
            "WRITE and DESCRIBE on the TransactionalId resource",
            &format!("--transactional-id '{id}' --resource-pattern-type prefixed"),
        ],
    );
    // Everything else is allowed on this broker.
    for name in [
        "transactions",
        "txn state log",
        "txn timeout",
        "idempotence",
        "topics",
    ] {
        assert_eq!(out.line(name).0, "ok", "{name}:\n{out}");
    }
    // A transactional id outside the denied prefix passes.
    let other = exactly_once(
        &e,
        "other.toml",
        broker.bootstrap(),
        "transactional_id = \"relay-orders\"",
    );
    let out = check(&other);
    assert_eq!(out.code, Some(0), "{out}");
    assert!(
        out.line("transactional id")
            .1
            .starts_with("\"relay-orders\" (kafka.transactional_id)"),
        "{out}"
    );
}

/// The check beside a running exactly-once relay: it initialises its own
/// throwaway id, so the relay is not fenced and goes on committing. With the
/// relay's own id the relay's next commit would be fenced and it would exit.
#[test]
fn checking_beside_a_running_relay_does_not_fence_it() {
    use crate::harness::relay::{self, Relay};
    let broker = kafka::shared();
    let slot = "check_eos_live";
    let topic = format!("{slot}.live");
    let e = relay::env(
        broker.bootstrap(),
        slot,
        "[relay]\ndelivery = \"exactly-once\"\n",
    );
    let mut r = Relay::start(&e);
    let emit = |from: usize| {
        e.pg.psql(
            "app",
            &format!(
                "SELECT outbox_emit('live', (i % 5)::text, 'live.happened', jsonb_build_object('i', i)) \
                 FROM generate_series({from}, {}) i",
                from + 99
            ),
        );
    };
    let read = |n: usize| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let got = broker.consume_to_end(&topic, std::time::Duration::from_secs(20));
            if got.len() >= n || std::time::Instant::now() > deadline {
                return got;
            }
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
    };
    emit(1);
    assert_eq!(read(100).len(), 100, "{}", r.log());

    // The relay's own configuration: its slot is busy (a FAIL of its own),
    // the transactional lines run all the same.
    let out = check(&e.config);
    for name in TXN_CHECKS {
        assert_eq!(out.line(name).0, "ok", "{name}:\n{out}");
    }
    assert!(out.line("slot").1.contains("is active for PID"), "{out}");

    // The relay commits its next transactions: not fenced.
    emit(101);
    let got = read(200);
    assert_eq!(got.len(), 200, "relay log:\n{}", r.log());
    assert_eq!(
        r.wait(std::time::Duration::from_millis(500)),
        None,
        "{}",
        r.log()
    );
    assert!(!r.log().contains("fenced"), "{}", r.log());
}
