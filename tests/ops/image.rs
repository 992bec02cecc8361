//! The container image, built and run for real: `scripts/image.sh` builds
//! docker/Dockerfile around the binary under test (its `prebuilt` stage),
//! and the tests run it with podman (docker where a daemon answers) on the
//! host's network against the harness' PostgreSQL and Kafka on loopback.
//! Every container runs as the image's user with a read-only root.
//!
//! A Dockerfile, entrypoint or health check that does not work fails here:
//! `outboxd check` (ok, and exit 1 on a wrong password), relaying with a
//! mounted config file and with the environment alone, a clean stop on
//! SIGTERM with the slot confirmed, `/metrics` and `/readyz` from inside,
//! and the tag the deployments name.

mod engine;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use engine::{image, inspect_image, run_once, Container, Spec};

use crate::harness::http::{free_port, get, Scrape};
use crate::harness::kafka::shared;
use crate::harness::outboxd::bin;
use crate::harness::pg::{Auth, PgCluster, PgOptions};
use crate::harness::relay::{confirmed_lsn, lsn_now};
use crate::harness::wait::wait_for;

const PASSWORD: &str = "image pw 'q'";

fn read(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A cluster set up as the documentation says: the migrations, the
/// least-privilege role `outboxd` with a password, password auth.
fn database() -> PgCluster {
    let pg = PgCluster::start(PgOptions::default().with_auth(Auth::Scram));
    pg.create_database("app");
    pg.apply_migrations("app");
    pg.psql(
        "app",
        &format!(
            "ALTER ROLE outboxd PASSWORD {}",
            crate::harness::pg::quote_literal(PASSWORD)
        ),
    );
    pg
}

/// The image's default configuration (docker/outboxd.toml), pointed at the
/// harness' servers through the variables it documents.
fn image_env(
    pg: &PgCluster,
    slot: &str,
    metrics_port: u16,
    password: &str,
) -> Vec<(&'static str, String)> {
    vec![
        (
            "OUTBOXD_PG_URL",
            format!(
                "postgresql://outboxd@127.0.0.1:{}/app?sslmode=disable",
                pg.port()
            ),
        ),
        ("OUTBOXD_PG_PASSWORD", password.to_string()),
        ("OUTBOXD_KAFKA_BROKERS", shared().bootstrap().to_string()),
        ("OUTBOXD_SLOT", slot.to_string()),
        (
            "OUTBOXD_METRICS_LISTEN",
            format!("127.0.0.1:{metrics_port}"),
        ),
    ]
}

/// Commits `n` events of aggregate type `kind` in one transaction; returns
/// the WAL position after the commit.
fn emit(pg: &PgCluster, kind: &str, n: usize) -> outboxd::Lsn {
    pg.psql(
        "app",
        &format!(
            "SELECT outbox_emit('{kind}', (i % 5)::text, '{kind}.happened', jsonb_build_object('i', i)) \
             FROM generate_series(1, {n}) i"
        ),
    );
    lsn_now(pg)
}

fn slot_active(pg: &PgCluster, slot: &str) -> bool {
    pg.psql(
        "app",
        &format!("SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}' AND active"),
    ) == "1"
}

/// The container's process is not root, and its root is mounted read-only.
fn assert_unprivileged_and_read_only(c: &Container) {
    let pid = c.pid();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    let gid = status.lines().find(|l| l.starts_with("Gid:")).unwrap();
    assert_eq!(
        uid.split_whitespace().collect::<Vec<_>>(),
        ["Uid:", "10001", "10001", "10001", "10001"]
    );
    assert_eq!(
        gid.split_whitespace().collect::<Vec<_>>(),
        ["Gid:", "10001", "10001", "10001", "10001"]
    );
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let root = mounts
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some("/"))
        .expect("the container's root in its mountinfo");
    let options = root.split_whitespace().nth(5).unwrap();
    assert!(
        options.split(',').any(|o| o == "ro"),
        "root mounted {options}: {root}"
    );
}

/// `/readyz` and `/healthz` 200 and the image's HEALTHCHECK passing, all
/// from the running container.
fn assert_ready_and_healthy(c: &Container, port: u16) {
    c.wait_for("/readyz 200", Duration::from_secs(60), || {
        matches!(get(port, "/readyz"), Some((200, _)))
    });
    assert_eq!(get(port, "/healthz").map(|(s, _)| s), Some(200));
    let (healthy, text) = c.health_check();
    assert!(healthy, "HEALTHCHECK failed on a ready relay: {text}");
    assert!(text.starts_with("ready"), "{text}");
}

/// `/metrics` counts the `n` events published.
fn assert_metrics_count(port: u16, n: usize) {
    wait_for(
        "outboxd_events_published_total",
        Duration::from_secs(30),
        || {
            Scrape::take(port)
                .get("outboxd_events_published_total", "")
                .is_some_and(|v| v >= n as f64)
        },
    );
}

#[test]
fn image_is_tagged_as_the_deployments_name_it_and_holds_only_what_the_binary_needs() {
    let img = image();
    let tag = format!("outboxd:{}", env!("CARGO_PKG_VERSION"));
    assert_eq!(img.tag, tag, "scripts/image.sh's default tag");

    // The Helm chart's default: repository `outboxd`, tag empty = appVersion.
    let values = read("deploy/helm/outboxd/values.yaml");
    let block: Vec<&str> = values
        .split("\nimage:\n")
        .nth(1)
        .expect("image: in values.yaml")
        .lines()
        .take_while(|l| l.starts_with("  ") || l.trim().is_empty())
        .collect();
    let value = |key: &str| {
        block
            .iter()
            .find_map(|l| l.trim().strip_prefix(&format!("{key}:")))
            .map(|v| v.trim().trim_matches('"').to_string())
            .unwrap_or_else(|| panic!("image.{key} in values.yaml"))
    };
    let app_version = read("deploy/helm/outboxd/Chart.yaml")
        .lines()
        .find_map(|l| l.strip_prefix("appVersion:"))
        .map(|v| v.trim().trim_matches('"').to_string())
        .expect("appVersion");
    let chart_tag = match value("tag").as_str() {
        "" => app_version,
        t => t.to_string(),
    };
    assert_eq!(format!("{}:{chart_tag}", value("repository")), tag, "Helm");
    let manifest = read("deploy/kubernetes/outboxd.yaml");
    let images: Vec<&str> = manifest
        .lines()
        .filter_map(|l| l.trim().strip_prefix("image:"))
        .map(|v| v.trim().trim_matches('"'))
        .collect();
    assert_eq!(images, [tag.as_str()], "deploy/kubernetes/outboxd.yaml");
    let compose = read("docker/docker-compose.yml");
    assert!(
        compose.contains(&format!("\n    image: {tag}\n")),
        "docker/docker-compose.yml's outboxd service"
    );
    // The tag names the image just built.
    let tagged = engine::run(&["image", "inspect", "--format", "{{.Id}}", &tag]);
    assert_eq!(tagged, img.id);

    let config = &inspect_image()["Config"];
    assert_eq!(config["User"], "10001:10001");
    assert_eq!(config["Entrypoint"], serde_json::json!(["outboxd"]));
    assert_eq!(config["Cmd"], serde_json::json!(["run"]));
    assert!(config["Env"]
        .as_array()
        .unwrap()
        .contains(&"OUTBOXD_CONFIG=/etc/outboxd/outboxd.toml".into()));
    assert!(config["ExposedPorts"]["9187/tcp"].is_object());
    assert_eq!(
        engine::healthcheck_test(),
        serde_json::json!(["CMD", "outboxd", "health"])
    );

    // Its files: the binary, what ldd says it loads, CA certificates, the
    // configuration and the user's passwd/group lines. Nothing else.
    // (`image mount` is podman's; under docker this part is not checked.)
    if engine::engine() != engine::Engine::Podman {
        eprintln!("ops::image: the image's files are listed with podman only");
        return;
    }
    let (files, passwd) = image_files();
    let libs: BTreeSet<String> = linked_libraries()
        .iter()
        .map(|p| p.rsplit('/').next().unwrap().to_string())
        .collect();
    let mut expected: BTreeSet<String> = [
        "etc/group",
        "etc/nsswitch.conf",
        "etc/outboxd/outboxd.toml",
        "etc/passwd",
        "etc/ssl/certs/ca-certificates.crt",
        "usr/lib/ssl/cert.pem",
        "usr/lib/ssl/certs",
        "usr/local/bin/outboxd",
    ]
    .map(String::from)
    .into();
    let mut seen_libs = BTreeSet::new();
    for f in &files {
        let name = f.rsplit('/').next().unwrap();
        if libs.contains(name) && !expected.contains(f) {
            seen_libs.insert(name.to_string());
            expected.insert(f.clone());
        }
    }
    assert_eq!(seen_libs, libs, "the libraries ldd resolves for the binary");
    assert_eq!(files, expected, "the image's files");
    assert!(passwd.starts_with("outboxd:x:10001:10001:"), "{passwd}");
    eprintln!(
        "ops::image: {} files, {:.1} MiB ({} bytes)",
        files.len(),
        img.bytes as f64 / 1048576.0,
        img.bytes
    );
}

/// Paths (no leading slash) of the files and symlinks in the image, and
/// its /etc/passwd.
fn image_files() -> (BTreeSet<String>, String) {
    let id = &image().id;
    let root = engine::run(&["image", "mount", id]);
    fn walk(dir: &Path, root: &Path, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_dir() {
                walk(&entry.path(), root, out);
            } else {
                let rel = entry.path().strip_prefix(root).unwrap().to_path_buf();
                out.insert(rel.display().to_string());
            }
        }
    }
    let mut files = BTreeSet::new();
    walk(Path::new(&root), Path::new(&root), &mut files);
    let passwd = std::fs::read_to_string(Path::new(&root).join("etc/passwd")).unwrap();
    engine::run(&["image", "unmount", id]);
    (files, passwd)
}

/// The shared libraries (and the loader) the binary under test loads.
fn linked_libraries() -> Vec<String> {
    let out = Command::new("ldd").arg(bin()).output().expect("ldd");
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            match words.as_slice() {
                [_, "=>", path, ..] if path.starts_with('/') => Some(path.to_string()),
                [path, ..] if path.starts_with('/') => Some(path.to_string()),
                _ => None,
            }
        })
        .collect()
}

#[test]
fn check_in_the_container_passes_and_fails_on_a_wrong_password() {
    let pg = database();
    let port = free_port();
    let mut spec = Spec {
        env: image_env(&pg, "imagecheck", port, PASSWORD),
        args: vec!["check"],
        ..Spec::default()
    };
    let (code, out) = run_once(&spec);
    assert_eq!(code, Some(0), "outboxd check in the container:\n{out}");
    assert!(!out.contains("FAIL "), "{out}");
    assert!(out.contains("summary: "), "{out}");

    spec.env = image_env(&pg, "imagecheck", port, "not the password");
    let (code, out) = run_once(&spec);
    assert_eq!(code, Some(1), "a wrong password:\n{out}");
    let line = out
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("postgres"))
        .unwrap_or_else(|| panic!("no postgres line:\n{out}"));
    assert!(line.starts_with("FAIL"), "{out}");
    assert!(line.contains("password"), "{line}");
    assert!(
        !out.contains("not the password"),
        "the password leaked:\n{out}"
    );
}

/// A mounted file, with a status interval long enough that the slot is only
/// confirmed when the relay says so on its way out; a clean stop confirms it.
#[test]
fn relays_with_a_mounted_config_file_and_stops_cleanly_on_sigterm() {
    let pg = database();
    let broker = shared();
    let (slot, kind) = ("imagefile", "imagefile");
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("outboxd.toml");
    std::fs::write(
        &config,
        format!(
            "[postgres]\n\
             url = \"postgresql://outboxd@127.0.0.1:{}/app?sslmode=disable\"\n\
             password_env = \"OUTBOXD_PG_PASSWORD\"\n\
             slot = \"{slot}\"\npublication = \"outboxd\"\ncreate_publication = false\n\
             status_interval = \"10m\"\n\
             [kafka]\nbrokers = \"{}\"\n\
             [routing]\ntopic = \"image.${{aggregate_type}}\"\n\
             [metrics]\nlisten = \"127.0.0.1:{port}\"\n\
             [log]\nformat = \"json\"\n",
            pg.port(),
            broker.bootstrap()
        ),
    )
    .unwrap();
    let c = Container::start(
        "file",
        &Spec {
            env: vec![("OUTBOXD_PG_PASSWORD", PASSWORD.to_string())],
            mount_config: Some(&config),
            ..Spec::default()
        },
    );
    c.wait_for("the container's slot", Duration::from_secs(90), || {
        slot_active(&pg, slot)
    });
    assert_unprivileged_and_read_only(&c);
    assert_ready_and_healthy(&c, port);

    let end = emit(&pg, kind, 200);
    let got = broker.consume_all(&format!("image.{kind}"), 200, Duration::from_secs(60));
    assert_eq!(got.len(), 200, "container log:\n{}", c.logs());
    assert_metrics_count(port, 200);
    let before = confirmed_lsn(&pg, slot);

    let (code, took) = c.stop(Duration::from_secs(40));
    let logs = c.logs();
    assert_eq!(code, 0, "exit code after SIGTERM; log:\n{logs}");
    assert!(
        took < Duration::from_secs(30),
        "stopped after {took:?}, not at once"
    );
    assert!(logs.contains("shutdown requested"), "{logs}");
    let after = confirmed_lsn(&pg, slot);
    assert!(
        after >= end,
        "slot confirmed at {after} after the stop, events committed up to {end}\n{logs}"
    );
    eprintln!("ops::image: stopped in {took:?}; slot confirmed {before} -> {after} (end {end})");
}

/// The image's own configuration, every address from `OUTBOXD_*` variables.
#[test]
fn relays_configured_by_the_environment_alone() {
    let pg = database();
    let broker = shared();
    let (slot, kind) = ("imageenv", "imageenv");
    let port = free_port();
    let c = Container::start(
        "env",
        &Spec {
            env: image_env(&pg, slot, port, PASSWORD),
            ..Spec::default()
        },
    );
    c.wait_for("the container's slot", Duration::from_secs(90), || {
        slot_active(&pg, slot)
    });
    assert_unprivileged_and_read_only(&c);
    assert_ready_and_healthy(&c, port);
    emit(&pg, kind, 100);
    let topic = format!("outbox.event.{kind}");
    let got = broker.consume_all(&topic, 100, Duration::from_secs(60));
    assert_eq!(got.len(), 100, "container log:\n{}", c.logs());
    assert_metrics_count(port, 100);
    let logs = c.logs();
    // docker/outboxd.toml logs JSON lines.
    let first = logs.lines().next().unwrap_or_default();
    assert!(
        serde_json::from_str::<serde_json::Value>(first).is_ok(),
        "not JSON: {first}"
    );
    let (code, _) = c.stop(Duration::from_secs(40));
    assert_eq!(code, 0, "{}", c.logs());
}
