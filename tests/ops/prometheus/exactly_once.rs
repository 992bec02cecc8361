//! The dashboard's exactly-once row against a real Prometheus scraping a
//! relay with `relay.delivery = "exactly-once"`: every expression over the
//! exactly-once metrics returns series, every metric docs/operations.md
//! lists for the mode is exported, and `OutboxdTransactionsAborted` stays
//! quiet while transactions commit.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::Value;

use super::names::{exported_names, metric_names};
use super::server::Prometheus;
use super::{
    base_name, emit, files, free_port, get_metrics, poll, read, scrape_config, substitute,
    EXACTLY_ONCE_ONLY,
};
use crate::harness::kafka::shared;
use crate::harness::relay::{env, Relay};

/// The metric names of the table in docs/operations.md's "Exactly-once".
fn documented() -> BTreeSet<String> {
    let doc = read("docs/operations.md");
    let section = doc
        .split("\n## Exactly-once\n")
        .nth(1)
        .expect("docs/operations.md has a section ## Exactly-once")
        .split("\n## ")
        .next()
        .unwrap();
    section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_string)
        .collect()
}

#[test]
fn exactly_once_panels_show_a_transactional_relay() {
    let broker = shared();
    let slot = "ops_prom_eos";
    let kind = "promeos";
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let e = env(
        broker.bootstrap(),
        slot,
        &format!("[relay]\ndelivery = \"exactly-once\"\n[metrics]\nlisten = \"{metrics_addr}\"\n"),
    );
    let relay = Relay::start(&e);
    let prom = Prometheus::start(&scrape_config(&metrics_addr, slot, Some("1s")));
    poll(
        "several scrapes of the relay",
        Duration::from_secs(90),
        || {
            let r = prom.query(
                "count_over_time(up{job=\"outboxd\"}[1m]) >= 3 and up{job=\"outboxd\"} == 1",
            )?;
            if r.len() == 1 {
                Ok(())
            } else {
                Err(format!("{r:?}; relay log:\n{}", relay.log()))
            }
        },
    );
    // Twice: the histograms' series are born with the first commit, so
    // their rates need commits after that.
    for round in 1..=2 {
        emit(&e.pg, kind, 12, 25);
        let published = 300 * round;
        poll(
            &format!("{published} events published"),
            Duration::from_secs(60),
            || {
                let r = prom.query(&format!(
                    "outboxd_events_published_total{{slot=\"{slot}\"}} >= {published}"
                ))?;
                if r.is_empty() {
                    Err(format!("relay log:\n{}", relay.log()))
                } else {
                    Ok(())
                }
            },
        );
    }

    // Documented for the mode, and exported.
    let documented = documented();
    assert_eq!(
        documented,
        EXACTLY_ONCE_ONLY.iter().map(|s| s.to_string()).collect(),
        "docs/operations.md's exactly-once metrics"
    );
    let exported: BTreeSet<String> = exported_names(&get_metrics(&metrics_addr))
        .iter()
        .map(|n| base_name(n).to_string())
        .collect();
    let missing: Vec<&String> = documented.difference(&exported).collect();
    assert!(missing.is_empty(), "documented, not exported: {missing:?}");

    // Each panel expression over them returns series.
    let dashboard: Value =
        serde_json::from_str(&read("docker/grafana/dashboards/outboxd.json")).unwrap();
    let exprs: Vec<String> = files::dashboard_exprs(&dashboard)
        .into_iter()
        .filter(|x| {
            metric_names(x)
                .iter()
                .any(|n| EXACTLY_ONCE_ONLY.contains(&base_name(n)))
        })
        .collect();
    assert_eq!(exprs.len(), 6, "{exprs:?}");
    for raw in &exprs {
        let q = substitute(raw, &metrics_addr);
        let series = poll(
            &format!("series from `{q}`"),
            Duration::from_secs(30),
            || match prom.query(&q)? {
                s if s.is_empty() => Err("no series".into()),
                s => Ok(s),
            },
        );
        eprintln!("`{q}`: {series:?}");
    }
    // Kafka transactions may each hold several of the 24 database
    // transactions: every event is in one committed transaction, none
    // aborted.
    let value = |q: &str| -> f64 {
        let r = prom.query(q).unwrap();
        r[0]["value"][1].as_str().unwrap().parse().unwrap()
    };
    let committed = value("outboxd_kafka_transactions_total{outcome=\"committed\"}");
    assert!(committed >= 1.0, "{committed}");
    assert_eq!(value("outboxd_kafka_transaction_events_sum"), 600.0);
    eprintln!("{committed} Kafka transactions committed for 24 database transactions");
    let aborted = prom
        .query("outboxd_kafka_transactions_total{outcome=\"aborted\"}")
        .unwrap();
    assert_eq!(aborted[0]["value"][1], "0", "{aborted:?}");

    // The rule is loaded, evaluates, and is quiet.
    let active = prom.alerts();
    assert!(
        !active
            .iter()
            .any(|(name, _, _)| name == "OutboxdTransactionsAborted"),
        "{active:?}"
    );
    let rules = prom.api("/api/v1/rules").unwrap();
    let health: Vec<&Value> = rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .filter(|r| r["name"] == "OutboxdTransactionsAborted")
        .map(|r| &r["health"])
        .collect();
    assert_eq!(health.len(), 1, "{rules}");
    drop(prom);
    drop(relay);
}
