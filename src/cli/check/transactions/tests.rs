use super::*;
use crate::sink::probe::init_transactions::BrokerSettings;

fn facts(settings: Option<BrokerSettings>, state_log: Option<Vec<usize>>) -> TransactionFacts {
    TransactionFacts {
        brokers: 1,
        settings: settings.ok_or_else(|| "ClusterAuthorizationFailed".to_owned()),
        state_log: Ok(state_log),
    }
}

const DEV: BrokerSettings = BrokerSettings {
    replication_factor: 1,
    min_isr: 1,
    max_timeout_ms: 900_000,
};

fn timeouts(transaction_ms: u64) -> Timeouts {
    Timeouts {
        transaction_ms,
        origin: "kafka.properties",
        message_ms: Some(30_000),
    }
}

fn id() -> Result<TransactionalId, String> {
    Ok(TransactionalId {
        id: "outboxd-1/app/s".into(),
        origin: "derived from the ledger key",
    })
}

fn lines(f: &TransactionFacts, t: Timeouts, probe: Probe) -> Vec<Line> {
    let cfg = Config::default();
    decide(&cfg, f, state_log_line(f), t, id(), &probe)
}

fn verdicts(lines: &[Line]) -> Vec<Verdict> {
    lines.iter().map(|l| l.verdict).collect()
}

#[test]
fn an_initialised_probe_on_a_dev_broker_is_all_ok() {
    let l = lines(
        &facts(Some(DEV), None),
        timeouts(60_000),
        Probe::Initialised,
    );
    assert_eq!(verdicts(&l), [Verdict::Ok; 4], "{l:?}");
    assert!(
        l[2].detail.contains("\"outboxd-1/app/s.check\" instead"),
        "{l:?}"
    );
}

#[test]
fn a_replication_factor_above_the_broker_count_fails_and_skips_the_probe_lines() {
    let rf3 = BrokerSettings {
        replication_factor: 3,
        min_isr: 2,
        ..DEV
    };
    let l = lines(&facts(Some(rf3), None), timeouts(60_000), Probe::NotRun);
    assert_eq!(
        verdicts(&l),
        [Verdict::Skip, Verdict::Fail, Verdict::Skip, Verdict::Ok],
        "{l:?}"
    );
    assert!(
        l[1].detail
            .contains("set transaction.state.log.replication.factor to at most 1"),
        "{l:?}"
    );
    // Existing with too few in-sync replicas.
    let two = BrokerSettings { min_isr: 2, ..DEV };
    let l = state_log_line(&facts(Some(two), Some(vec![1, 2, 2])));
    assert_eq!(l.verdict, Verdict::Fail, "{l:?}");
    assert!(l.detail.starts_with("1 of 3 partition(s)"), "{l:?}");
    // min.isr above the factor can never be met.
    let l = state_log_line(&facts(Some(BrokerSettings { min_isr: 2, ..DEV }), None));
    assert_eq!(l.verdict, Verdict::Fail, "{l:?}");
}

#[test]
fn the_acl_failure_names_the_resource_and_a_prefixed_pattern() {
    let l = lines(
        &facts(Some(DEV), Some(vec![1])),
        timeouts(60_000),
        Probe::Unauthorized("denied (TransactionalIdAuthorizationFailed)".into()),
    );
    assert_eq!(
        verdicts(&l),
        [Verdict::Ok, Verdict::Ok, Verdict::Fail, Verdict::Ok],
        "{l:?}"
    );
    for needle in [
        "WRITE and DESCRIBE on the TransactionalId resource",
        "--transactional-id 'outboxd-1/app/s' --resource-pattern-type prefixed",
    ] {
        assert!(l[2].detail.contains(needle), "{needle}: {l:?}");
    }
}

#[test]
fn timeouts_against_the_broker_maximum_the_message_timeout_and_the_delay() {
    let f = facts(Some(DEV), Some(vec![1]));
    let l = lines(&f, timeouts(900_001), Probe::TimeoutRefused("x".into()));
    assert_eq!(l[3].verdict, Verdict::Fail, "{l:?}");
    assert!(
        l[3].detail.contains("transaction.max.timeout.ms = 900000"),
        "{l:?}"
    );
    // Broker settings unreadable: the probe's refusal still fails it.
    let hidden = facts(None, Some(vec![1]));
    let l = lines(
        &hidden,
        timeouts(900_001),
        Probe::TimeoutRefused("x".into()),
    );
    assert_eq!(l[3].verdict, Verdict::Fail, "{l:?}");
    let l = lines(&hidden, timeouts(60_000), Probe::Initialised);
    assert_eq!(l[3].verdict, Verdict::Warn, "{l:?}");
    assert!(l[3].detail.contains("a coordinator accepted it"), "{l:?}");
    // Below the producer's message timeout: librdkafka refuses it.
    let l = lines(&f, timeouts(20_000), Probe::Failed("x".into()));
    assert_eq!(l[3].verdict, Verdict::Fail, "{l:?}");
    assert!(l[3].detail.contains("message.timeout.ms = 30000"), "{l:?}");
    // Not above relay.transaction_max_delay (100 ms by default).
    let t = Timeouts {
        message_ms: None,
        ..timeouts(100)
    };
    let l = lines(&f, t, Probe::Initialised);
    assert_eq!(l[3].verdict, Verdict::Fail, "{l:?}");
    assert!(l[3].detail.contains("relay.transaction_max_delay"), "{l:?}");
}

#[test]
fn without_the_system_identifier_the_id_lines_are_skipped() {
    let f = facts(Some(DEV), None);
    let l = decide(
        &Config::default(),
        &f,
        state_log_line(&f),
        timeouts(60_000),
        Err("no system identifier".into()),
        &Probe::NotRun,
    );
    assert_eq!(
        verdicts(&l),
        [Verdict::Skip, Verdict::Ok, Verdict::Skip, Verdict::Ok],
        "{l:?}"
    );
}
