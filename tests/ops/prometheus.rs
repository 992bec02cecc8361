//! The deployment files in `docker/`, tested for real.
//!
//! * Here: promtool checks the alert rules, runs their unit tests
//!   (`docker/prometheus/alerts_test.yml`, which fire every alert) and checks
//!   the scrape config. End to end, a relay runs with the container's own
//!   configuration (`docker/outboxd.toml`), as the least-privilege role set
//!   up the way the compose stack sets it up, and a real Prometheus
//!   (`server`) scrapes it with `docker/prometheus/prometheus.yml` and
//!   `alerts.yml`. Every dashboard query and every rule is evaluated through
//!   Prometheus' HTTP API; then a poison event halts the relay and
//!   `OutboxdHalted` fires.
//! * `files`: the dashboard, the compose stack, Grafana provisioning and the
//!   runbook agree with each other and with the repository.
//! * `image`: the Dockerfile and the image's configuration.
//!
//! Nothing is installed here: `scripts/setup.sh` installs Debian's
//! `prometheus` package (`/usr/bin/prometheus`, `/usr/bin/promtool`). YAML
//! is parsed with Python's PyYAML when `python3 -c 'import yaml'` works (it
//! does on this project's kind of machine); without it the structural checks
//! of the YAML files shrink to line checks, and the test says so.

mod exactly_once;
mod files;
mod http;
mod image;
mod names;
mod server;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

use self::http::get;
use self::names::{declared_names, exported_names, metric_names};
use self::server::Prometheus;
use crate::harness::kafka::shared;
use crate::harness::pg::{pg_install, Auth, PgCluster, PgOptions, SUPERUSER, SUPERUSER_PASSWORD};
use crate::harness::relay::{Env, Relay};
use crate::harness::wait::{last_lines, wait_for};

/// The alerts `docker/prometheus/alerts.yml` must define.
const ALERTS: [&str; 13] = [
    "OutboxdDown",
    "OutboxdStalled",
    "OutboxdSlotLagHigh",
    "OutboxdRetainedWalHigh",
    "OutboxdWalStatusUnreserved",
    "OutboxdSlotLost",
    "OutboxdDeliveryFailures",
    "OutboxdDeadLetters",
    "OutboxdHalted",
    "OutboxdConfirmationLagging",
    "OutboxdDeliveryLagging",
    "OutboxdLedgerStalled",
    "OutboxdTransactionsAborted",
];

/// Counters that may have no series until something goes wrong (outboxd
/// registers some of them at 0 at startup, but not all): a dashboard
/// expression over them may legitimately return no series in a healthy run,
/// and is then only checked to evaluate without error. Today only
/// `outboxd_delivery_failures_total` is actually empty.
const EMPTY_WHEN_HEALTHY: [&str; 3] = [
    "outboxd_delivery_failures_total",
    "outboxd_reconnects_total",
    "outboxd_events_dead_lettered_total",
];

/// Metrics of `relay.delivery = "exactly-once"` (histograms by their base
/// name): no series from the at-least-once relay of the end-to-end test;
/// `exactly_once_panels_show_a_transactional_relay` evaluates them.
const EXACTLY_ONCE_ONLY: [&str; 4] = [
    "outboxd_kafka_transactions_total",
    "outboxd_kafka_transaction_events",
    "outboxd_kafka_transaction_commit_seconds",
    "outboxd_fenced_total",
];

/// A histogram's base name for its `_bucket`, `_sum` and `_count` series.
fn base_name(name: &str) -> &str {
    ["_bucket", "_sum", "_count"]
        .iter()
        .find_map(|s| name.strip_suffix(s))
        .unwrap_or(name)
}

/// No series is expected from the at-least-once relay while it is healthy.
fn empty_when_healthy(name: &str) -> bool {
    EMPTY_WHEN_HEALTHY.contains(&name) || EXACTLY_ONCE_ONLY.contains(&base_name(name))
}

/// What the dashboard's `$__rate_interval` becomes in these queries: with
/// the 1 s scrape interval used here, several samples.
const RATE_INTERVAL: &str = "30s";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

/// Runs a tool that `scripts/setup.sh` installs; panics with its output on
/// failure.
fn run_tool(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("cannot run {cmd:?}: {e} (scripts/setup.sh installs Debian's `prometheus` package)")
    });
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Polls `f` until it returns `Ok`, or panics naming `what` and the last
/// error `f` reported.
fn poll<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Result<T, String>) -> T {
    let start = Instant::now();
    loop {
        match f() {
            Ok(v) => return v,
            Err(last) if start.elapsed() > timeout => {
                panic!("timed out after {timeout:?} waiting for {what}; last: {last}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(250)),
        }
    }
}

// ---------------------------------------------------------------- promtool

#[test]
fn promtool_checks_the_rules_runs_their_unit_tests_and_checks_the_config() {
    let dir = repo().join("docker/prometheus");
    let out = run_tool(
        Command::new("promtool")
            .args(["check", "rules"])
            .arg(dir.join("alerts.yml")),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("{} rules found", ALERTS.len())),
        "{text}"
    );
    // Relative rule_files in the test file resolve beside it.
    run_tool(
        Command::new("promtool")
            .args(["test", "rules", "alerts_test.yml"])
            .current_dir(&dir),
    );
    // The shipped config names the rules by their path in the container.
    let tmp = tempfile::tempdir().unwrap();
    let config = scrape_config("outboxd:9187", "outboxd", None);
    std::fs::write(tmp.path().join("prometheus.yml"), config).unwrap();
    run_tool(
        Command::new("promtool")
            .args(["check", "config"])
            .arg(tmp.path().join("prometheus.yml")),
    );
}

/// `docker/prometheus/prometheus.yml` with the rule file's container path
/// replaced by the repository's file, the target by `target`, the slot
/// label by `slot`, and (when given) both intervals by `interval`.
fn scrape_config(target: &str, slot: &str, interval: Option<&str>) -> String {
    let mut text = read("docker/prometheus/prometheus.yml");
    let rules = repo().join("docker/prometheus/alerts.yml");
    let mut swap = |from: &str, to: &str| {
        assert_eq!(
            text.matches(from).count(),
            1,
            "docker/prometheus/prometheus.yml: expected `{from}` once"
        );
        text = text.replace(from, to);
    };
    swap("/etc/prometheus/alerts.yml", rules.to_str().unwrap());
    swap("\"outboxd:9187\"", &format!("\"{target}\""));
    swap("__slot: outboxd\n", &format!("__slot: {slot}\n"));
    if let Some(i) = interval {
        swap("scrape_interval: 15s", &format!("scrape_interval: {i}"));
        swap(
            "evaluation_interval: 15s",
            &format!("evaluation_interval: {i}"),
        );
    }
    text
}

// ---------------------------------------------------------------- the relay

/// `psql` for the init script: the harness's binaries, or Debian's.
fn psql_dir() -> PathBuf {
    let own = &pg_install().bin;
    if own.join("psql").exists() {
        return own.clone();
    }
    ["18", "17", "16", "15", "14"]
        .iter()
        .map(|v| PathBuf::from(format!("/usr/lib/postgresql/{v}/bin")))
        .find(|d| d.join("psql").exists())
        .expect("no psql binary")
}

/// Runs `docker/postgres/005_outboxd_login.sh` as the postgres image would
/// after the migrations, against `pg`: it must set the role's password and
/// add a pg_hba.conf line that PostgreSQL accepts.
fn run_compose_init_script(pg: &PgCluster, password: &str) {
    let path = format!(
        "{}:{}",
        psql_dir().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    run_tool(
        Command::new("sh")
            .arg(repo().join("docker/postgres/005_outboxd_login.sh"))
            .env("PATH", path)
            .env("PGHOST", "127.0.0.1")
            .env("PGPORT", pg.port().to_string())
            .env("PGPASSWORD", SUPERUSER_PASSWORD)
            .env("PGCONNECT_TIMEOUT", "10")
            .env("POSTGRES_USER", SUPERUSER)
            .env("POSTGRES_DB", "app")
            .env("PGDATA", pg.data_dir())
            .env("OUTBOXD_PG_PASSWORD", password),
    );
    let hba = pg.psql(
        "app",
        "SELECT count(*) FILTER (WHERE error IS NOT NULL) || ' ' || \
                count(*) FILTER (WHERE 'replication' = ANY(database) AND 'outboxd' = ANY(user_name)) \
         FROM pg_hba_file_rules",
    );
    assert_eq!(
        hba, "0 1",
        "pg_hba.conf after the init script: errors, outboxd replication rules"
    );
    pg.reload();
}

/// Commits `txns` transactions of `per_txn` events through `outbox_emit()`
/// (insert and delete: only the insert is relayed), aggregate type `kind`.
pub(super) fn emit(pg: &PgCluster, kind: &str, txns: usize, per_txn: usize) {
    for t in 0..txns {
        pg.psql(
            "app",
            &format!(
                "SELECT outbox_emit('{kind}', (i % 7)::text, '{kind}.happened', jsonb_build_object('t', {t}, 'i', i)) \
                 FROM generate_series(1, {per_txn}) i"
            ),
        );
    }
}

// ---------------------------------------------------------------- end to end

#[test]
fn dashboard_and_alerts_evaluate_against_a_real_prometheus_scraping_a_real_relay() {
    let broker = shared();
    let slot = "ops_prometheus";
    let kind = "opsprom";
    let topic = format!("outbox.event.{kind}");
    let password = "s3cret 'quoted' pw";

    // PostgreSQL prepared like the compose stack's: migrations, then the
    // init script; the relay connects as the least-privilege role.
    let pg = PgCluster::start(PgOptions::default().with_auth(Auth::Scram));
    pg.create_database("app");
    pg.apply_migrations("app");
    run_compose_init_script(&pg, password);

    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("outboxd.toml");
    std::fs::copy(repo().join("docker/outboxd.toml"), &config).unwrap();
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    let pg_url = format!(
        "postgresql://outboxd@127.0.0.1:{}/app?sslmode=disable",
        pg.port()
    );
    let e = Env { pg, dir, config };
    let relay = Relay::start_with_env(
        &e,
        &[
            ("OUTBOXD_PG_URL", pg_url.as_str()),
            ("OUTBOXD_PG_PASSWORD", password),
            ("OUTBOXD_KAFKA_BROKERS", broker.bootstrap()),
            ("OUTBOXD_METRICS_LISTEN", metrics_addr.as_str()),
            ("OUTBOXD_SLOT", slot),
        ],
    );
    // The relay creates its slot; events written before that are not in it.
    let slot_active =
        format!("SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}' AND active");
    wait_for("the relay's slot", Duration::from_secs(60), || {
        e.pg.psql("app", &slot_active) == "1"
    });
    emit(&e.pg, kind, 12, 25);
    let got = broker.consume_all(&topic, 300, Duration::from_secs(60));
    assert_eq!(got.len(), 300, "relay log:\n{}", relay.log());

    let prom = Prometheus::start(&scrape_config(&metrics_addr, slot, Some("1s")));
    poll(
        "several scrapes of the relay",
        Duration::from_secs(60),
        || {
            let r = prom.query(
                "count_over_time(up{job=\"outboxd\"}[1m]) >= 5 and up{job=\"outboxd\"} == 1",
            )?;
            if r.len() == 1 {
                Ok(())
            } else {
                Err(format!("{r:?}; prometheus log:\n{}", prom.log()))
            }
        },
    );
    let up = prom.query("up{job=\"outboxd\"}").unwrap();
    assert_eq!(up[0]["metric"]["instance"], metrics_addr.as_str());
    assert_eq!(
        up[0]["metric"]["slot"], slot,
        "the slot label from relabeling"
    );

    // docker-compose.yml's health check passes against a ready relay.
    let healthy = compose_healthcheck(&e.config, &metrics_addr);
    assert_ne!(
        healthy,
        Some(false),
        "compose health check failed on a ready relay"
    );

    // The rules: all loaded and evaluated without error.
    let rules = poll(
        "every rule to be evaluated",
        Duration::from_secs(30),
        || {
            let data = prom.api("/api/v1/rules")?;
            let rules: Vec<Value> = data["groups"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|g| g["rules"].as_array().unwrap().clone())
                .collect();
            let pending: Vec<&Value> = rules.iter().filter(|r| r["health"] != "ok").collect();
            if pending.is_empty() {
                Ok(rules)
            } else {
                Err(format!("{pending:?}"))
            }
        },
    );
    let names: BTreeSet<&str> = rules.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ALERTS.iter().copied().collect(), "alert names");
    let mut problems = Vec::new();
    let exported = exported_names(&get_metrics(&metrics_addr));
    for r in &rules {
        let q = r["query"].as_str().unwrap();
        if let Err(err) = prom.query(q) {
            problems.push(format!("rule {}: `{q}`: {err}", r["name"]));
        }
    }

    // The dashboard: every expression evaluates, and returns series unless
    // it is over a counter that only exists once something failed.
    let dashboard: Value =
        serde_json::from_str(&read("docker/grafana/dashboards/outboxd.json")).unwrap();
    let exprs = files::dashboard_exprs(&dashboard);
    assert!(exprs.len() >= 20, "only {} expressions found", exprs.len());
    let mut empty_ok = Vec::new();
    for raw in &exprs {
        let q = substitute(raw, &metrics_addr);
        match prom.query(&q) {
            Err(err) => problems.push(format!("dashboard `{q}`: {err}")),
            Ok(series) if series.is_empty() => {
                if metric_names(raw).iter().any(|n| empty_when_healthy(n)) {
                    empty_ok.push(q);
                } else {
                    problems.push(format!("dashboard `{q}`: no series"));
                }
            }
            Ok(_) => {}
        }
    }
    // The instance variable, label_values(METRIC, LABEL), lists this relay.
    let var = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "instance")
        .unwrap()["query"]
        .as_str()
        .unwrap();
    let (metric, label) = var
        .strip_prefix("label_values(")
        .and_then(|r| r.strip_suffix(')'))
        .and_then(|r| r.split_once(','))
        .unwrap_or_else(|| panic!("instance variable: {var}"));
    let path = format!(
        "/api/v1/label/{}/values?match[]={}",
        label.trim(),
        metric.trim()
    );
    match prom.api(&path) {
        Ok(v)
            if v.as_array()
                .unwrap()
                .iter()
                .any(|x| x == metrics_addr.as_str()) => {}
        other => problems.push(format!("{var} = {other:?}")),
    }
    // Only names the relay exports (or declares, for the failure counters).
    let declared = declared_names();
    let mut referenced = BTreeSet::from([metric.trim().to_string()]);
    for raw in exprs
        .iter()
        .map(String::as_str)
        .chain(rules.iter().map(|r| r["query"].as_str().unwrap()))
    {
        referenced.extend(metric_names(raw));
    }
    for name in &referenced {
        let ok = exported.contains(name)
            || (empty_when_healthy(name) && declared.contains(base_name(name)));
        if !ok {
            problems.push(format!("{name} is neither exported on /metrics nor an expected-empty counter declared in src/metrics/"));
        }
    }
    // Healthy: nothing pending or firing.
    let active = prom.alerts();
    if !active.is_empty() {
        problems.push(format!("alerts active on a healthy relay: {active:?}"));
    }
    assert!(
        problems.is_empty(),
        "{}\n\n/metrics exports: {exported:?}\nrelay log (tail):\n{}",
        problems.join("\n"),
        last_lines(&relay.log(), 40)
    );
    eprintln!(
        "ops::prometheus: {} rules and {} dashboard expressions evaluated; without series while healthy, as expected: {empty_ok:?}",
        rules.len(),
        exprs.len()
    );

    // A poison event (over Kafka's message.max.bytes) under the default
    // on_error = "stop": the relay halts and OutboxdHalted fires.
    e.pg.psql(
        "app",
        &format!(
            "SELECT outbox_emit('{kind}', 'big', '{kind}.huge', jsonb_build_object('blob', string_agg(md5(i::text), ''))) \
             FROM generate_series(1, 48000) i"
        ),
    );
    let halted = poll("OutboxdHalted to fire", Duration::from_secs(90), || {
        let alerts = prom.alerts();
        alerts
            .iter()
            .find(|(name, state, _)| name == "OutboxdHalted" && state == "firing")
            .map(|(_, _, labels)| labels.clone())
            .ok_or_else(|| {
                format!(
                    "{alerts:?}\nrelay log (tail):\n{}",
                    last_lines(&relay.log(), 20)
                )
            })
    });
    assert_eq!(halted["severity"], "critical");
    assert_eq!(halted["slot"], slot);
    assert_eq!(halted["instance"], metrics_addr);
    // The dashboard's Halted panel shows it.
    let raw = exprs
        .iter()
        .find(|x| metric_names(x).contains("outboxd_halted"))
        .expect("a dashboard expression over outboxd_halted");
    let q = substitute(raw, &metrics_addr);
    let series = prom.query(&q).unwrap();
    assert_eq!(series.len(), 1, "`{q}`: {series:?}");
    assert_eq!(series[0]["value"][1], "1", "`{q}`");
    // Not ready any more: the compose health check says so.
    if healthy.is_some() {
        assert_eq!(
            compose_healthcheck(&e.config, &metrics_addr),
            Some(false),
            "compose health check passed on a halted relay"
        );
    }
    drop(prom);
}

/// docker-compose.yml's health check for outboxd (`CMD outboxd health`), run
/// by the binary under test with the relay's configuration: true when it
/// exits 0; `None` without PyYAML.
fn compose_healthcheck(config: &Path, metrics_addr: &str) -> Option<bool> {
    let compose = files::yaml("docker/docker-compose.yml")?;
    let test: Vec<&str> = compose["services"]["outboxd"]["healthcheck"]["test"]
        .as_array()
        .expect("outboxd healthcheck test")
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(test[..2], ["CMD", "outboxd"]);
    let out = Command::new(crate::harness::outboxd::bin())
        .args(&test[2..])
        .env("OUTBOXD_CONFIG", config)
        .env("OUTBOXD_METRICS_LISTEN", metrics_addr)
        .output()
        .unwrap();
    eprintln!(
        "compose health check: {} {}",
        out.status,
        String::from_utf8_lossy(&out.stdout).trim()
    );
    Some(out.status.success())
}

/// The dashboard expression with Grafana's variables replaced by values:
/// `$instance` by the relay's instance, `$__rate_interval` by a window that
/// holds several 1 s scrapes.
fn substitute(expr: &str, instance: &str) -> String {
    let q = expr
        .replace("${instance}", instance)
        .replace("$instance", instance)
        .replace("${__rate_interval}", RATE_INTERVAL)
        .replace("$__rate_interval", RATE_INTERVAL);
    assert!(!q.contains('$'), "unsubstituted variable in `{q}`");
    q
}

fn get_metrics(addr: &str) -> String {
    match get(addr, "/metrics") {
        Ok((200, body)) => body,
        other => panic!("GET /metrics: {other:?}"),
    }
}
