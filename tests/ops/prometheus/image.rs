//! The container image's files: the Dockerfile against what the binary
//! really links and what the repository holds, and the image's
//! configuration (`docker/outboxd.toml`) parsed as outboxd parses it.
//! `ops::image` builds the image and runs it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use super::{read, repo};
use crate::harness::outboxd::bin;

/// docker/outboxd.toml parsed as outboxd parses it, with `vars` as the
/// environment.
pub fn container_config(vars: &BTreeMap<&str, &str>) -> outboxd::config::Config {
    let text = read("docker/outboxd.toml");
    let cfg = outboxd::config::Config::from_toml_str_with_env(&text, |k| {
        vars.get(k).map(|v| v.to_string())
    })
    .unwrap_or_else(|e| panic!("docker/outboxd.toml: {e}"));
    cfg.validate_for_relay()
        .unwrap_or_else(|e| panic!("docker/outboxd.toml: {e}"));
    cfg
}

#[test]
fn container_config_defaults_to_the_compose_stack_and_reads_the_environment() {
    let cfg = container_config(&BTreeMap::new());
    assert!(cfg
        .postgres
        .url
        .starts_with("postgresql://outboxd@postgres:5432/app"));
    assert_eq!(
        cfg.postgres.password_env.as_deref(),
        Some("OUTBOXD_PG_PASSWORD")
    );
    assert!(
        !cfg.postgres.create_publication,
        "the role does not own the table"
    );
    assert_eq!(cfg.kafka.brokers.as_deref(), Some("kafka:9092"));
    assert_eq!(cfg.metrics.listen.unwrap().to_string(), "0.0.0.0:9187");
    let cfg = container_config(&BTreeMap::from([
        ("OUTBOXD_SLOT", "billing"),
        ("OUTBOXD_KAFKA_BROKERS", "k1:9092,k2:9092"),
        ("OUTBOXD_METRICS_LISTEN", "[::]:9300"),
    ]));
    assert_eq!(cfg.postgres.slot, "billing");
    assert_eq!(cfg.kafka.brokers.as_deref(), Some("k1:9092,k2:9092"));
    assert_eq!(cfg.metrics.listen.unwrap().port(), 9300);
}

/// Dockerfile instructions (continuations joined, comments dropped), by
/// stage; the first "stage" holds the global ARGs before the first FROM.
fn dockerfile_stages() -> Vec<Vec<(String, String)>> {
    let text = read("docker/Dockerfile");
    let mut stages: Vec<Vec<(String, String)>> = vec![Vec::new()];
    let mut current = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('#') || t.is_empty() && current.is_empty() {
            continue;
        }
        current.push_str(t.trim_end_matches('\\'));
        current.push(' ');
        if t.ends_with('\\') {
            continue;
        }
        let ins = std::mem::take(&mut current);
        let (op, args) = ins.trim().split_once(' ').unwrap_or((ins.trim(), ""));
        if op == "FROM" {
            stages.push(Vec::new());
        }
        if let Some(stage) = stages.last_mut() {
            stage.push((op.to_string(), args.trim().to_string()));
        }
    }
    stages
}

/// Packages of `apt-get install` in a RUN argument.
fn apt_packages(run: &str) -> BTreeSet<String> {
    let Some((_, rest)) = run.split_once("apt-get install") else {
        return BTreeSet::new();
    };
    rest.split("&&")
        .next()
        .unwrap()
        .split_whitespace()
        .filter(|w| !w.starts_with('-'))
        .map(str::to_string)
        .collect()
}

/// The Debian packages of the shared libraries the outboxd binary loads.
fn linked_packages() -> BTreeSet<String> {
    let out = Command::new("ldd").arg(bin()).output().expect("ldd");
    assert!(out.status.success());
    let mut pkgs = BTreeSet::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some((_, right)) = line.split_once("=> ") else {
            continue;
        };
        let path = Path::new(right.split_whitespace().next().unwrap());
        // dpkg knows each file by one name: with /usr merged, /lib/x.so.1.2
        // may be registered while ldd shows /usr/lib/... or a symlink.
        let real = std::fs::canonicalize(path).unwrap();
        let unmerged = real.strip_prefix("/usr").map(|p| Path::new("/").join(p));
        let beside = path.with_file_name(real.file_name().unwrap());
        let candidates = [
            Some(path.to_path_buf()),
            Some(real.clone()),
            unmerged.ok(),
            Some(beside),
        ];
        let pkg = candidates
            .iter()
            .flatten()
            .find_map(|c| {
                let owner = Command::new("dpkg")
                    .arg("-S")
                    .arg(c)
                    .output()
                    .expect("dpkg -S");
                let text = String::from_utf8_lossy(&owner.stdout).to_string();
                let pkg = text.split(':').next().unwrap_or("").trim().to_string();
                (owner.status.success() && !pkg.is_empty()).then_some(pkg)
            })
            .unwrap_or_else(|| panic!("no Debian package owns {}", path.display()));
        pkgs.insert(pkg);
    }
    pkgs
}

/// Each include_str!/include_bytes! under src/ outside tests: (the file,
/// the path it includes relative to the repository root).
fn compile_time_includes() -> Vec<(String, std::path::PathBuf)> {
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let root = repo();
    let mut files = Vec::new();
    walk(&root.join("src"), &mut files);
    let mut found = Vec::new();
    for f in files {
        let name = f.file_name().unwrap().to_string_lossy();
        if name == "tests.rs" || name.ends_with("_tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        for macro_name in ["include_str!(\"", "include_bytes!(\""] {
            for part in text.split(macro_name).skip(1) {
                let rel = part.split('"').next().unwrap();
                let target = f.parent().unwrap().join(rel);
                let target = std::fs::canonicalize(&target)
                    .unwrap_or_else(|e| panic!("{}: {rel}: {e}", f.display()));
                let inside = target
                    .strip_prefix(std::fs::canonicalize(&root).unwrap())
                    .unwrap()
                    .to_path_buf();
                let shown = f.strip_prefix(&root).unwrap().display().to_string();
                found.push((shown, inside));
            }
        }
    }
    assert!(!found.is_empty(), "no include_str! found under src/");
    found
}

#[test]
fn dockerfile_builds_and_runs_what_the_binary_needs() {
    let stages = dockerfile_stages();
    let arg = |stage: &[(String, String)], op: &str| -> Vec<String> {
        stage
            .iter()
            .filter(|(o, _)| o == op)
            .map(|(_, a)| a.clone())
            .collect()
    };
    let froms: Vec<String> = stages[1..]
        .iter()
        .map(|s| arg(s, "FROM")[0].clone())
        .collect();
    assert_eq!(
        froms,
        [
            "rust:1-bookworm AS builder",
            "scratch AS prebuilt",
            "${OUTBOXD_BINARY} AS binary",
            "${DEBIAN} AS rootfs",
            "scratch"
        ],
        "builder, prebuilt, the binary of either, the runtime files, the image"
    );
    assert_eq!(
        arg(&stages[0], "ARG"),
        ["OUTBOXD_BINARY=builder", "DEBIAN=debian:bookworm-slim"]
    );
    let (build, prebuilt, rootfs, run) = (&stages[1], &stages[2], &stages[4], &stages[5]);
    let build_pkgs: BTreeSet<String> = arg(build, "RUN")
        .iter()
        .flat_map(|r| apt_packages(r))
        .collect();
    // No libsasl2-dev (GSSAPI is the opt-in `gssapi` feature), no libcurl
    // headers (rdkafka's `curl-static` builds its own).
    assert_eq!(
        build_pkgs,
        ["cmake", "libssl-dev", "pkg-config"]
            .map(String::from)
            .into()
    );
    assert_eq!(
        arg(prebuilt, "COPY"),
        ["--from=outboxd-bin outboxd /usr/local/bin/outboxd"]
    );

    // The runtime files come from exactly the libraries the binary links
    // (beyond the base image's libc, libgcc and zlib), plus CA certificates.
    let runtime_pkgs: BTreeSet<String> = arg(rootfs, "RUN")
        .iter()
        .flat_map(|r| apt_packages(r))
        .collect();
    let base: BTreeSet<String> = ["libc6", "libgcc-s1", "zlib1g"].map(String::from).into();
    let linked = linked_packages();
    let needed: BTreeSet<String> = linked.difference(&base).cloned().collect();
    let mut expected = needed.clone();
    expected.insert("ca-certificates".into());
    assert_eq!(
        runtime_pkgs, expected,
        "runtime packages (the binary links {linked:?})"
    );

    // A non-root user, by number (Kubernetes' runAsNonRoot checks it),
    // named in the image's /etc/passwd.
    let runs = arg(rootfs, "RUN").join(" ");
    let uid = runs
        .split("'outboxd:x:")
        .nth(1)
        .and_then(|r| r.split(':').next())
        .expect("the passwd line of user outboxd");
    assert!(runs.contains(&format!("'outboxd:x:{uid}:' > /rootfs/etc/group")));
    assert_eq!(arg(run, "USER"), [format!("{uid}:{uid}")]);
    assert_ne!(uid, "0");

    // Entry point, default command, health check and port agree with the
    // config it copies in and the compose stack mounts.
    assert_eq!(arg(run, "ENTRYPOINT"), ["[\"outboxd\"]"]);
    assert_eq!(arg(run, "CMD"), ["[\"run\"]"]);
    assert_eq!(
        arg(run, "ENV"),
        ["OUTBOXD_CONFIG=/etc/outboxd/outboxd.toml"]
    );
    assert!(arg(run, "COPY").contains(&"docker/outboxd.toml /etc/outboxd/outboxd.toml".to_string()));
    let port = container_config(&BTreeMap::new())
        .metrics
        .listen
        .unwrap()
        .port();
    assert_eq!(arg(run, "EXPOSE"), [port.to_string()]);
    assert!(read("docker/prometheus/prometheus.yml").contains(&format!("\"outboxd:{port}\"")));
    let health = arg(run, "HEALTHCHECK");
    assert_eq!(health.len(), 1);
    assert!(
        health[0].ends_with("CMD [\"outboxd\", \"health\"]"),
        "{health:?}"
    );

    // What the source includes at compile time is in the builder stage
    // (src/config/overrides.rs includes config/outboxd.toml).
    let copied: Vec<String> = arg(build, "COPY")
        .iter()
        .flat_map(|c| {
            let words: Vec<&str> = c.split_whitespace().collect();
            words[..words.len() - 1]
                .iter()
                .map(|w| w.trim_end_matches('/').to_string())
                .collect::<Vec<_>>()
        })
        .collect();
    for (file, included) in compile_time_includes() {
        assert!(
            copied
                .iter()
                .any(|c| included == Path::new(c) || included.starts_with(c)),
            "{file} includes {}, which the builder stage does not COPY",
            included.display()
        );
    }

    // Every file COPYed from the context exists and is let through by
    // docker/Dockerfile.dockerignore (which excludes everything else).
    let ignore = read("docker/Dockerfile.dockerignore");
    let allowed: Vec<&str> = ignore
        .lines()
        .filter_map(|l| l.strip_prefix('!'))
        .map(|p| p.trim_end_matches('/'))
        .collect();
    assert!(
        ignore.lines().any(|l| l == "*"),
        "the dockerignore starts from nothing"
    );
    for copy in stages.iter().flat_map(|s| arg(s, "COPY")) {
        if copy.starts_with("--from") {
            continue;
        }
        let words: Vec<&str> = copy.split_whitespace().collect();
        for src in &words[..words.len() - 1] {
            let src = src.trim_end_matches('/');
            assert!(repo().join(src).exists(), "COPY {src}: no such file");
            assert!(
                allowed
                    .iter()
                    .any(|a| src == *a || Path::new(src).starts_with(a)),
                "COPY {src} is excluded by docker/Dockerfile.dockerignore"
            );
        }
    }
}
