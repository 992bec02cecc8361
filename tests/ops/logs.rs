//! The process log of `outboxd run` with `[log] format = "json"`: one JSON
//! object per line, and lines for state changes only, never one per event.

use std::time::Duration;

use serde_json::Value;

use crate::harness::events::{aggregates, payload_texts, verify, write};
use crate::harness::kafka::shared;
use crate::harness::relay::{env, Relay};
use crate::harness::wait::wait_for;

const EVENTS: usize = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_log_is_one_object_per_line_and_quiet_per_event() {
    let broker = shared();
    let e = env(
        broker.bootstrap(),
        "opslogs",
        "[log]\nformat = \"json\"\nlevel = \"info\"\n",
    );
    // The suite's default OUTBOXD_LOG asks for debug; run as configured.
    let mut relay = Relay::start_with_env(&e, &[("OUTBOXD_LOG", "info")]);
    let mut client = e.pg.client("app").await;
    let sent = write(
        &mut client,
        "opslogs",
        &aggregates(20),
        EVENTS,
        &[1, 10, 100],
        0,
    )
    .await;
    let logs = e.dir.path().to_path_buf();
    let texts = payload_texts(&e.pg);
    let verdict = tokio::task::spawn_blocking(move || {
        verify(
            broker,
            &sent,
            &texts,
            Duration::from_secs(120),
            false,
            &logs,
        )
    })
    .await
    .unwrap();
    assert_eq!(verdict.delivered, EVENTS);
    relay.signal("-TERM");
    let status = tokio::task::block_in_place(|| relay.wait(Duration::from_secs(40)));
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}\n{}",
        relay.log()
    );

    let log = relay.log();
    let lines: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|err| panic!("not JSON ({err}): {l:?}")))
        .collect();
    let level = |v: &Value| v["level"].as_str().unwrap_or_default().to_string();
    let message = |v: &Value| {
        v["fields"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        lines.iter().all(|v| v.is_object() && !level(v).is_empty()),
        "{log}"
    );
    let info = lines.iter().filter(|v| level(v) == "INFO").count();
    eprintln!(
        "{} log lines, {info} at info, for {EVENTS} events",
        lines.len()
    );
    assert!(info < 50, "{info} info lines for {EVENTS} events:\n{log}");
    assert!(
        lines
            .iter()
            .all(|v| level(v) != "DEBUG" && level(v) != "TRACE"),
        "level = \"info\" must hold:\n{log}"
    );
    // The state changes are there: connected, and a drained shutdown.
    assert!(
        lines.iter().any(|v| message(v) == "replication started"),
        "{log}"
    );
    assert!(
        lines.iter().any(|v| message(v) == "connected to Kafka"),
        "{log}"
    );
    assert!(
        lines
            .iter()
            .any(|v| message(v) == "shutting down" && v["fields"]["drained"] == Value::Bool(true)),
        "{log}"
    );
}

/// librdkafka's errors (here: every broker refuses connections) reach the
/// log once each, as structured lines of target `librdkafka` naming the
/// facility and the error, without rdkafka's "Ignored event 'Error' on base
/// producer poll" after each.
#[test]
fn librdkafka_errors_are_logged_once_and_structured() {
    // A port nothing listens on: connections are refused at once.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let e = env(
        &format!("127.0.0.1:{port}"),
        "kafkalog",
        "[log]\nformat = \"json\"\n",
    );
    let relay = Relay::start_with_env(&e, &[("OUTBOXD_LOG", "info")]);
    wait_for(
        "librdkafka to report the refused connection",
        Duration::from_secs(30),
        || relay.log().contains("Connection refused"),
    );
    // Let a few reconnect attempts (and what rdkafka logs after them) land.
    std::thread::sleep(Duration::from_secs(3));
    let log = relay.log();
    assert!(!log.contains("Ignored event"), "{log}");
    let lines: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|err| panic!("not JSON ({err}): {l:?}")))
        .collect();
    let refused: Vec<&Value> = lines
        .iter()
        .filter(|v| v.to_string().contains("Connection refused"))
        .collect();
    assert!(!refused.is_empty(), "{log}");
    for v in &refused {
        assert_eq!(v["target"], "librdkafka", "{v}");
        assert_eq!(v["level"], "ERROR", "{v}");
        assert_eq!(v["fields"]["fac"], "FAIL", "{v}");
        let thread = v["fields"]["thread"].as_str().unwrap_or_default();
        assert!(
            thread.contains(&port.to_string()),
            "no broker thread field: {v}"
        );
        let message = v["fields"]["message"].as_str().unwrap_or_default();
        assert!(message.starts_with(&format!("127.0.0.1:{port}/")), "{v}");
    }
    // Nothing else at warn or above while only that happens.
    let others: Vec<&Value> = lines
        .iter()
        .filter(|v| v["level"] == "WARN" || v["level"] == "ERROR")
        .filter(|v| v["target"] != "librdkafka")
        .collect();
    assert!(others.is_empty(), "{others:?}");
}
