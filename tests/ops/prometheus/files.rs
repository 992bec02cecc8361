//! The files in `docker/` checked against each other and the repository,
//! without Docker (none runs here): the dashboard JSON, the compose stack
//! and Grafana provisioning (YAML, parsed by PyYAML when available), and the
//! runbook anchors of the alerts.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use serde_json::Value;

use super::image::container_config;
use super::{read, repo, ALERTS};
use crate::harness::pg::migration_files;

/// Every `expr` in a Grafana dashboard (panel targets, at any depth).
pub fn dashboard_exprs(v: &Value) -> Vec<String> {
    fn walk(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(map) => {
                for (k, x) in map {
                    match (k.as_str(), x) {
                        ("expr", Value::String(s)) => out.push(s.clone()),
                        _ => walk(x, out),
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|x| walk(x, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(v, &mut out);
    out
}

/// A YAML file of docker/ as JSON, parsed by Python's PyYAML (safe_load);
/// `None` when python3 or PyYAML is not there. A parse error panics.
pub fn yaml(rel: &str) -> Option<Value> {
    let script = "import json, sys, yaml\n\
                  json.dump(yaml.safe_load(open(sys.argv[1], encoding='utf-8')), sys.stdout)";
    let probe = Command::new("python3").args(["-c", "import yaml"]).output();
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!("ops::prometheus: python3 with PyYAML not found: {rel} gets line checks only");
        return None;
    }
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(repo().join(rel))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{rel} is not valid YAML:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(serde_json::from_slice(&out.stdout).unwrap())
}

/// Checks every YAML file can do without a parser: no tabs, and every
/// relative host path of a `- ./x:/y` or `- ../x:/y` volume exists.
fn yaml_line_checks(rel: &str) {
    let text = read(rel);
    let base = repo().join(rel).parent().unwrap().to_path_buf();
    for (n, line) in text.lines().enumerate() {
        assert!(!line.contains('\t'), "{rel}:{}: tab in YAML", n + 1);
        let item = line.trim_start().trim_start_matches("- ").trim_matches('"');
        if item.starts_with("./") || item.starts_with("../") {
            let host = item.split(':').next().unwrap();
            assert!(
                base.join(host).exists(),
                "{rel}:{}: {host} does not exist",
                n + 1
            );
        }
    }
}

// ---------------------------------------------------------------- dashboard

#[test]
fn dashboard_is_a_grafana_dashboard_over_the_relay_metrics() {
    let d: Value = serde_json::from_str(&read("docker/grafana/dashboards/outboxd.json"))
        .expect("docker/grafana/dashboards/outboxd.json is not JSON");
    let schema = d["schemaVersion"].as_u64().unwrap();
    assert!((36..=41).contains(&schema), "schemaVersion {schema}");
    assert_eq!(d["uid"], "outboxd");
    let vars = d["templating"]["list"].as_array().unwrap();
    let var = |name: &str| {
        vars.iter()
            .find(|v| v["name"] == name)
            .unwrap_or_else(|| panic!("no template variable {name}"))
    };
    assert_eq!(var("DS_PROMETHEUS")["type"], "datasource");
    assert_eq!(var("DS_PROMETHEUS")["query"], "prometheus");
    let instance = var("instance");
    assert_eq!(instance["type"], "query");
    assert!(instance["query"]
        .as_str()
        .unwrap()
        .starts_with("label_values(outboxd_"));

    // Panels: unique ids, inside the 24-column grid, not overlapping, every
    // query on the data source variable.
    let panels = d["panels"].as_array().unwrap();
    let mut ids = BTreeSet::new();
    let mut boxes: Vec<(String, [u64; 4])> = Vec::new();
    for p in panels {
        let title = p["title"].as_str().unwrap().to_string();
        assert!(
            ids.insert(p["id"].as_u64().unwrap()),
            "duplicate id: {title}"
        );
        let g = &p["gridPos"];
        let b = ["x", "y", "w", "h"].map(|k| g[k].as_u64().unwrap());
        assert!(b[0] + b[2] <= 24, "{title} is wider than the grid");
        for (other, o) in &boxes {
            let apart = b[0] + b[2] <= o[0]
                || o[0] + o[2] <= b[0]
                || b[1] + b[3] <= o[1]
                || o[1] + o[3] <= b[1];
            assert!(apart, "panels {title:?} and {other:?} overlap");
        }
        boxes.push((title.clone(), b));
        if p["type"] == "row" {
            continue;
        }
        assert_eq!(p["datasource"]["uid"], "${DS_PROMETHEUS}", "{title}");
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "{title} has no query");
        for t in targets {
            assert_eq!(t["datasource"]["uid"], "${DS_PROMETHEUS}", "{title}");
            let expr = t["expr"].as_str().unwrap();
            assert!(
                expr.contains("instance=~\"$instance\""),
                "{title}: `{expr}` ignores $instance"
            );
        }
    }

    // What the dashboard must show.
    let all = dashboard_exprs(&d).join("\n");
    for needle in [
        "rate(outboxd_events_published_total",
        "histogram_quantile(0.5, sum by (instance, le) (rate(outboxd_commit_to_ack_seconds_bucket",
        "histogram_quantile(0.99, sum by (instance, le) (rate(outboxd_commit_to_ack_seconds_bucket",
        "outboxd_slot_lag_bytes",
        "outboxd_slot_retained_wal_bytes",
        "outboxd_slot_wal_status",
        "outboxd_in_flight_events{",
        "outboxd_in_flight_events_limit",
        "outboxd_in_flight_bytes{",
        "outboxd_in_flight_bytes_limit",
        "rate(outboxd_delivery_failures_total",
        "rate(outboxd_reconnects_total",
        "outboxd_stall_seconds",
        "outboxd_confirmation_lag_seconds",
        "outboxd_delivery_lag_seconds",
        "histogram_quantile(0.99, sum by (instance, le) (rate(outboxd_table_watch_look_seconds_bucket",
        "outboxd_connected",
        "outboxd_events_dead_lettered_total",
        "rate(outboxd_kafka_transactions_total",
        "histogram_quantile(0.99, sum by (instance, le) (rate(outboxd_kafka_transaction_events_bucket",
        "histogram_quantile(0.99, sum by (instance, le) (rate(outboxd_kafka_transaction_commit_seconds_bucket",
        "increase(outboxd_fenced_total",
    ] {
        assert!(all.contains(needle), "no dashboard query has `{needle}`");
    }
}

// ---------------------------------------------------------------- alerts and runbook

/// GitHub's heading anchors in a Markdown file (outside code fences).
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            let text = line.trim_start_matches('#').trim();
            let slug: String = text
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect();
            out.insert(slug);
        }
    }
    out
}

#[test]
fn every_alert_has_a_runbook_section_and_fires_in_the_unit_tests() {
    let rules = read("docker/prometheus/alerts.yml");
    let docs = anchors(&read("docs/operations.md"));
    let urls: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("runbook_url: "))
        .map(|u| u.trim_matches('"'))
        .collect();
    assert_eq!(urls.len(), ALERTS.len(), "one runbook_url per alert");
    for (alert, url) in ALERTS.iter().zip(&urls) {
        let anchor = url
            .strip_prefix("docs/operations.md#")
            .unwrap_or_else(|| panic!("{alert}: runbook_url {url} is not docs/operations.md#..."));
        assert_eq!(anchor, alert.to_lowercase(), "{alert}: anchor");
        assert!(
            docs.contains(anchor),
            "docs/operations.md has no section #{anchor}"
        );
    }

    // Which alerts the unit tests expect to fire (promtool runs them in
    // promtool_checks_the_rules_runs_their_unit_tests_and_checks_the_config).
    let Some(tests) = yaml("docker/prometheus/alerts_test.yml") else {
        let text = read("docker/prometheus/alerts_test.yml");
        for alert in ALERTS {
            assert!(
                text.contains(&format!("alertname: {alert}\n        exp_alerts:\n")),
                "{alert} never fires in alerts_test.yml"
            );
        }
        return;
    };
    let mut fired = BTreeSet::new();
    let mut checked_quiet = BTreeSet::new();
    for case in tests["tests"].as_array().unwrap() {
        for t in case["alert_rule_test"].as_array().unwrap() {
            let name = t["alertname"].as_str().unwrap().to_string();
            if t["exp_alerts"].as_array().is_some_and(|a| !a.is_empty()) {
                fired.insert(name);
            } else {
                checked_quiet.insert(name);
            }
        }
    }
    let all: BTreeSet<String> = ALERTS.iter().map(|s| s.to_string()).collect();
    assert_eq!(fired, all, "alerts that fire in alerts_test.yml");
    assert_eq!(
        checked_quiet, all,
        "alerts checked not to fire in alerts_test.yml"
    );
}

#[test]
fn operations_doc_links_resolve() {
    let text = read("docs/operations.md");
    let own = anchors(&text);
    let docs = repo().join("docs");
    for link in text.split("](").skip(1).filter_map(|r| r.split(')').next()) {
        if link.starts_with("http") {
            continue;
        }
        let (file, anchor) = link.split_once('#').unwrap_or((link, ""));
        if file.is_empty() {
            assert!(
                own.contains(anchor),
                "docs/operations.md: no section #{anchor}"
            );
            continue;
        }
        let target = docs.join(file);
        assert!(
            target.exists(),
            "docs/operations.md links to missing {link}"
        );
        if !anchor.is_empty() {
            let other = anchors(&std::fs::read_to_string(&target).unwrap());
            assert!(other.contains(anchor), "{file} has no section #{anchor}");
        }
    }
}

// ---------------------------------------------------------------- compose and provisioning

/// `host:container[:mode]` volume strings of a compose service, host paths
/// resolved against docker/.
fn volumes(service: &Value) -> Vec<(String, String)> {
    service["volumes"]
        .as_array()
        .map(|v| {
            v.iter()
                .map(|x| {
                    let parts: Vec<&str> = x.as_str().unwrap().split(':').collect();
                    (parts[0].to_string(), parts[1].to_string())
                })
                .collect()
        })
        .unwrap_or_default()
}

fn mounts(service: &Value, host: &str, container: &str) -> bool {
    volumes(service)
        .iter()
        .any(|(h, c)| h == host && c == container)
}

fn seconds(s: &str) -> u64 {
    s.strip_suffix('s')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{s:?}: expected whole seconds such as \"40s\""))
}

#[test]
fn compose_stack_and_grafana_provisioning_fit_together() {
    let files = [
        "docker/docker-compose.yml",
        "docker/grafana/provisioning/datasources/prometheus.yml",
        "docker/grafana/provisioning/dashboards/outboxd.yml",
    ];
    for f in files {
        yaml_line_checks(f);
    }
    let (Some(compose), Some(datasources), Some(providers)) =
        (yaml(files[0]), yaml(files[1]), yaml(files[2]))
    else {
        return;
    };
    let services = compose["services"].as_object().unwrap();
    let names: BTreeSet<&str> = services.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        ["grafana", "kafka", "outboxd", "postgres", "prometheus"].into()
    );
    let docker = repo().join("docker");
    for (name, s) in services {
        for (host, _) in volumes(s) {
            if host.starts_with('.') {
                assert!(docker.join(&host).exists(), "{name}: {host} does not exist");
            }
        }
    }

    // PostgreSQL: logical decoding, and every migration in name order, then
    // the login script.
    let pg = &services["postgres"];
    assert!(pg["image"].as_str().unwrap().starts_with("postgres:17"));
    assert!(pg["command"]
        .as_str()
        .unwrap()
        .contains("wal_level=logical"));
    let init: Vec<String> = volumes(pg)
        .into_iter()
        .filter_map(|(_, c)| {
            c.strip_prefix("/docker-entrypoint-initdb.d/")
                .map(str::to_string)
        })
        .collect();
    let mut expected: Vec<String> = migration_files()
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for m in &expected {
        assert!(
            mounts(
                pg,
                &format!("../migrations/{m}"),
                &format!("/docker-entrypoint-initdb.d/{m}")
            ),
            "migration {m} is not mounted into /docker-entrypoint-initdb.d"
        );
    }
    expected.push("005_outboxd_login.sh".into());
    let mut sorted = init.clone();
    sorted.sort();
    assert_eq!(
        sorted, expected,
        "init scripts, in the order the image runs them"
    );
    assert!(pg["environment"]["OUTBOXD_PG_PASSWORD"].is_string());
    assert!(pg["healthcheck"]["test"].is_array());

    // Kafka: a single KRaft node that advertises what outboxd dials.
    let kafka = &services["kafka"];
    assert!(kafka["image"]
        .as_str()
        .unwrap()
        .starts_with("apache/kafka:4."));
    let env = &kafka["environment"];
    assert_eq!(env["KAFKA_PROCESS_ROLES"], "broker,controller");
    assert_eq!(env["KAFKA_CONTROLLER_QUORUM_VOTERS"], "1@kafka:9093");
    assert_eq!(env["KAFKA_ADVERTISED_LISTENERS"], "PLAINTEXT://kafka:9092");
    assert!(kafka["healthcheck"]["test"].is_array());

    // outboxd: built from the Dockerfile, config mounted where CMD reads it,
    // started once both are healthy, stopped with time to confirm.
    let o = &services["outboxd"];
    let context = docker.join(o["build"]["context"].as_str().unwrap());
    assert_eq!(
        context.canonicalize().unwrap(),
        repo().canonicalize().unwrap()
    );
    assert!(context
        .join(o["build"]["dockerfile"].as_str().unwrap())
        .exists());
    assert!(mounts(o, "./outboxd.toml", "/etc/outboxd/outboxd.toml"));
    assert_eq!(
        o["command"],
        serde_json::json!(["run", "--config", "/etc/outboxd/outboxd.toml"])
    );
    for dep in ["postgres", "kafka"] {
        assert_eq!(
            o["depends_on"][dep]["condition"], "service_healthy",
            "outboxd on {dep}"
        );
    }
    assert_eq!(
        o["environment"]["OUTBOXD_PG_PASSWORD"],
        pg["environment"]["OUTBOXD_PG_PASSWORD"]
    );
    let cfg = container_config(&BTreeMap::new());
    assert!(
        seconds(o["stop_grace_period"].as_str().unwrap()) > cfg.relay.shutdown_timeout.as_secs(),
        "stop_grace_period must exceed relay.shutdown_timeout"
    );

    // Prometheus: the files prometheus.yml names, where it names them.
    let prom = &services["prometheus"];
    assert!(mounts(
        prom,
        "./prometheus/prometheus.yml",
        "/etc/prometheus/prometheus.yml"
    ));
    assert!(mounts(
        prom,
        "./prometheus/alerts.yml",
        "/etc/prometheus/alerts.yml"
    ));
    assert!(read("docker/prometheus/prometheus.yml").contains("  - /etc/prometheus/alerts.yml\n"));
    assert!(prom["command"]
        .as_array()
        .unwrap()
        .contains(&"--config.file=/etc/prometheus/prometheus.yml".into()));

    // Grafana: provisioning where Grafana looks, dashboards where the
    // provider looks, the data source at the Prometheus service.
    let g = &services["grafana"];
    assert!(mounts(
        g,
        "./grafana/provisioning/datasources",
        "/etc/grafana/provisioning/datasources"
    ));
    assert!(mounts(
        g,
        "./grafana/provisioning/dashboards",
        "/etc/grafana/provisioning/dashboards"
    ));
    let provider = &providers["providers"][0];
    assert_eq!(providers["apiVersion"], 1);
    assert_eq!(provider["type"], "file");
    let path = provider["options"]["path"].as_str().unwrap();
    assert!(
        mounts(g, "./grafana/dashboards", path),
        "dashboards not mounted at {path}"
    );
    let home = g["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
        .as_str()
        .unwrap();
    assert_eq!(home, format!("{path}/outboxd.json"));
    assert_eq!(datasources["apiVersion"], 1);
    let ds = &datasources["datasources"][0];
    assert_eq!(ds["type"], "prometheus");
    assert_eq!(ds["uid"], "prometheus");
    assert_eq!(ds["url"], "http://prometheus:9090");
    assert_eq!(ds["isDefault"], true);
}
