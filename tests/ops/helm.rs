//! The Helm chart (`deploy/helm/outboxd`) and the plain manifests rendered
//! from it (`deploy/kubernetes/`), checked offline with the real tools:
//! `helm lint`, `helm template`, and the Kubernetes API schemas of
//! `kubernetes-validate` (strict: unknown fields are errors). What the
//! schemas cannot see is checked here: the rendered `outboxd.toml` is a
//! configuration outboxd accepts and says what the values say, the
//! PrometheusRule holds the promtool-tested rules, and the probes, ports and
//! Secret references fit together.
//!
//! The tools are fetched into the cache by `scripts/helm.sh` (helm built
//! from the Go module proxy, kubernetes-validate from PyPI), once.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde_json::Value;

/// Kubernetes version the manifests are validated against: the oldest the
/// chart supports (`kubeVersion` in Chart.yaml), so nothing newer sneaks in.
const KUBERNETES_VERSION: &str = "1.31.0";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn chart() -> PathBuf {
    repo().join("deploy/helm/outboxd")
}

struct Tools {
    helm: PathBuf,
    validate: PathBuf,
    /// The validator's Python, which has PyYAML (a dependency of it).
    python: PathBuf,
}

fn tools() -> &'static Tools {
    static TOOLS: OnceLock<Tools> = OnceLock::new();
    TOOLS.get_or_init(|| {
        let script = |arg: &str| -> PathBuf {
            let out = Command::new(repo().join("scripts/helm.sh"))
                .arg(arg)
                .stderr(Stdio::inherit())
                .output()
                .expect("run scripts/helm.sh");
            assert!(out.status.success(), "scripts/helm.sh {arg} failed");
            PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
        };
        let helm = script("fetch");
        let validate = script("validator");
        let python = validate.with_file_name("python3");
        Tools {
            helm,
            validate,
            python,
        }
    })
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// `helm template` with `--set` pairs.
fn template(sets: &[&str]) -> String {
    let mut cmd = Command::new(&tools().helm);
    cmd.args(["template", "relay"]).arg(chart());
    cmd.args(["--namespace", "payments"]);
    for s in sets {
        cmd.args(["--set", s]);
    }
    run(&mut cmd)
}

/// The YAML documents of a stream, as JSON.
fn documents(yaml: &str) -> Vec<Value> {
    let mut child = Command::new(&tools().python)
        .args([
            "-c",
            "import sys, json, yaml; print(json.dumps([d for d in yaml.safe_load_all(sys.stdin) if d]))",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(yaml.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the rendered YAML does not parse");
    serde_json::from_slice(&out.stdout).unwrap()
}

fn by_kind(docs: &[Value]) -> BTreeMap<String, Value> {
    docs.iter()
        .map(|d| (d["kind"].as_str().unwrap().to_owned(), d.clone()))
        .collect()
}

/// Validates every built-in kind against the API schemas; returns the kinds
/// it validated.
fn validate(yaml: &str, dir: &Path) -> Vec<String> {
    let docs = documents(yaml);
    let mut kinds = Vec::new();
    for (i, doc) in docs.iter().enumerate() {
        let api = doc["apiVersion"].as_str().unwrap();
        if api.starts_with("monitoring.coreos.com/") {
            continue; // CRDs: no schema in the validator; checked below.
        }
        let file = dir.join(format!("{i}.json"));
        std::fs::write(&file, doc.to_string()).unwrap();
        let out = Command::new(&tools().validate)
            .args(["--strict", "-k", KUBERNETES_VERSION])
            .arg(&file)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && !text.contains("ERROR") && !text.contains("WARN"),
            "{} {} does not validate against Kubernetes {KUBERNETES_VERSION}:\n{text}",
            doc["kind"],
            doc["metadata"]["name"]
        );
        kinds.push(doc["kind"].as_str().unwrap().to_owned());
    }
    kinds
}

/// The rendered `outboxd.toml`, loaded by outboxd itself.
fn loaded_config(configmap: &Value, env: &[(&str, &str)]) -> outboxd::config::Config {
    let text = configmap["data"]["outboxd.toml"].as_str().unwrap();
    // The file's ${...} references are substituted from the environment:
    // check them with the values the Deployment would set.
    let lookup = |name: &str| {
        env.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| (*v).to_owned())
    };
    let cfg = outboxd::config::Config::from_toml_str_with_env(text, lookup)
        .unwrap_or_else(|e| panic!("the chart's outboxd.toml is refused: {e}\n{text}"));
    cfg.validate_for_relay()
        .unwrap_or_else(|e| panic!("the chart's outboxd.toml is refused: {e}\n{text}"));
    cfg
}

fn container(deployment: &Value) -> &Value {
    &deployment["spec"]["template"]["spec"]["containers"][0]
}

fn env_names(deployment: &Value) -> Vec<String> {
    container(deployment)["env"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| e["name"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn chart_lints_and_its_defaults_render_valid_manifests_and_a_config_outboxd_accepts() {
    let t = tools();
    run(Command::new(&t.helm)
        .args(["lint", "--strict"])
        .arg(chart()));
    let dir = tempfile::tempdir().unwrap();
    let yaml = template(&[]);
    let kinds = validate(&yaml, dir.path());
    for kind in ["ConfigMap", "Deployment", "Service", "PodDisruptionBudget"] {
        assert!(kinds.iter().any(|k| k == kind), "no {kind} in {kinds:?}");
    }
    let docs = by_kind(&documents(&yaml));
    for optional in ["ServiceMonitor", "PrometheusRule"] {
        assert!(
            !docs.contains_key(optional),
            "{optional} rendered by default"
        );
    }
    let deployment = &docs["Deployment"];
    assert_eq!(deployment["spec"]["replicas"], 2, "active + standby");
    assert_eq!(deployment["spec"]["strategy"]["type"], "Recreate");
    let c = container(deployment);
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["ports"][0]["containerPort"], 9187);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert!(
        pod["terminationGracePeriodSeconds"].as_u64().unwrap() > 30,
        "the grace period must exceed relay.shutdown_timeout"
    );
    assert!(c["resources"]["limits"]["memory"].is_string());
    let cfg = loaded_config(&docs["ConfigMap"], &[]);
    assert_eq!(cfg.postgres.slot, "outboxd");
    assert_eq!(
        cfg.metrics.listen.map(|a| a.port()),
        Some(9187),
        "the probes' port is the metrics port"
    );
    assert_eq!(cfg.relay.shutdown_timeout.as_secs(), 30);
    assert!(
        env_names(deployment).is_empty(),
        "no Secret is referenced by default"
    );
}

#[test]
fn chart_options_render_valid_manifests_with_secrets_monitoring_and_the_tested_rules() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = template(&[
        "replicaCount=1",
        "secrets.postgresPassword.name=orders-db",
        "secrets.kafkaSaslPassword.name=orders-kafka",
        "secrets.kafkaSaslPassword.key=sasl",
        "config.postgres.slot=orders",
        "config.outbox.table=sales.outbox",
        "config.kafka.properties.sasl\\.username=outboxd",
        "config.kafka.properties.sasl\\.mechanisms=SCRAM-SHA-512",
        "config.kafka.properties.security\\.protocol=SASL_SSL",
        "config.relay.max_in_flight_events=5000",
        "config.metrics.listen=0.0.0.0:9300",
        "serviceMonitor.enabled=true",
        "prometheusRule.enabled=true",
        "grafanaDashboard.enabled=true",
    ]);
    let kinds = validate(&yaml, dir.path());
    assert_eq!(
        kinds.iter().filter(|k| *k == "ConfigMap").count(),
        2,
        "the config and the dashboard: {kinds:?}"
    );
    let docs = documents(&yaml);
    let kind = |k: &str, suffix: &str| {
        docs.iter()
            .find(|d| d["kind"] == k && d["metadata"]["name"].as_str().unwrap().ends_with(suffix))
            .unwrap_or_else(|| panic!("no {k} *{suffix}"))
            .clone()
    };
    let deployment = kind("Deployment", "outboxd");
    assert_eq!(deployment["spec"]["replicas"], 1);
    assert_eq!(container(&deployment)["ports"][0]["containerPort"], 9300);
    assert_eq!(
        env_names(&deployment),
        ["OUTBOXD_PG_PASSWORD", "OUTBOXD_KAFKA_SASL_PASSWORD"]
    );
    let sasl = &container(&deployment)["env"][1]["valueFrom"]["secretKeyRef"];
    assert_eq!(
        (sasl["name"].as_str(), sasl["key"].as_str()),
        (Some("orders-kafka"), Some("sasl"))
    );
    let cfg = loaded_config(
        &kind("ConfigMap", "outboxd"),
        &[("OUTBOXD_KAFKA_SASL_PASSWORD", "s3cret")],
    );
    assert_eq!(cfg.postgres.slot, "orders");
    assert_eq!(
        cfg.postgres.password_env.as_deref(),
        Some("OUTBOXD_PG_PASSWORD")
    );
    assert_eq!(cfg.tables()[0].table.schema(), "sales");
    assert_eq!(cfg.relay.max_in_flight_events, 5000);
    let props = &cfg.kafka.properties;
    assert_eq!(
        props.get("sasl.password").map(String::as_str),
        Some("s3cret")
    );
    assert_eq!(
        props.get("sasl.mechanisms").map(String::as_str),
        Some("SCRAM-SHA-512")
    );

    // The ServiceMonitor scrapes the metrics port as job "outboxd" with a
    // `slot` label, which is what the rules select and carry.
    let monitor = kind("ServiceMonitor", "outboxd");
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["port"], "metrics");
    let relabel = endpoint["relabelings"].to_string();
    assert!(
        relabel.contains("\"replacement\":\"outboxd\"")
            && relabel.contains("\"targetLabel\":\"slot\"")
    );
    let service = kind("Service", "outboxd");
    assert_eq!(service["spec"]["ports"][0]["name"], "metrics");
    assert_eq!(service["metadata"]["labels"]["outboxd.io/slot"], "orders");

    // The PrometheusRule carries exactly the rules promtool tests.
    let rule = kind("PrometheusRule", "outboxd");
    let rules_file = dir.path().join("rules.json");
    std::fs::write(&rules_file, rule["spec"].to_string()).unwrap();
    run(Command::new("promtool")
        .args(["check", "rules"])
        .arg(&rules_file));
    let docker_rules =
        documents(&std::fs::read_to_string(repo().join("docker/prometheus/alerts.yml")).unwrap());
    assert_eq!(rule["spec"], docker_rules[0]);

    let dashboard = kind("ConfigMap", "dashboard");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let json: Value =
        serde_json::from_str(dashboard["data"]["outboxd.json"].as_str().unwrap()).unwrap();
    assert!(json["panels"].as_array().is_some_and(|p| !p.is_empty()));
}

#[test]
fn chart_copies_of_the_rules_and_dashboard_are_the_tested_ones_and_plain_manifests_are_current() {
    for (copy, original) in [
        ("files/alerts.yml", "docker/prometheus/alerts.yml"),
        (
            "files/outboxd-dashboard.json",
            "docker/grafana/dashboards/outboxd.json",
        ),
    ] {
        assert_eq!(
            std::fs::read(chart().join(copy)).unwrap(),
            std::fs::read(repo().join(original)).unwrap(),
            "deploy/helm/outboxd/{copy} differs from {original}: copy it over"
        );
    }
    let committed = std::fs::read_to_string(repo().join("deploy/kubernetes/outboxd.yaml")).unwrap();
    let mut cmd = Command::new(&tools().helm);
    cmd.args(["template", "outboxd"])
        .arg(chart())
        .args(["--namespace", "default"]);
    let fresh = run(&mut cmd);
    assert!(
        committed.ends_with(&fresh),
        "deploy/kubernetes/outboxd.yaml is not the chart's current output: run scripts/helm.sh render"
    );
}
