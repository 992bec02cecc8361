//! Helpers of the `outboxd check` suite: a cluster with the migrations,
//! config files, and running the binary with its output parsed into lines.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;

use crate::harness::kafka;
use crate::harness::outboxd::{bin, wait_with_timeout};
use crate::harness::pg::{PgCluster, PgOptions};

pub const SLOT: &str = "check";

pub struct Env {
    pub pg: PgCluster,
    pub dir: tempfile::TempDir,
}

/// A cluster with the migrations applied to `app` (outbox table,
/// publication `outboxd`, role `outboxd` with REPLICATION and SELECT).
pub fn env(opts: PgOptions) -> Env {
    let pg = PgCluster::start(opts);
    pg.create_database("app");
    pg.apply_migrations("app");
    Env {
        pg,
        dir: tempfile::tempdir().unwrap(),
    }
}

impl Env {
    pub fn url(&self, user: &str, password: Option<&str>) -> String {
        format!("{}?sslmode=disable", self.pg.url(user, password, "app"))
    }

    /// `postgres` goes into `[postgres]` after url and slot, `rest` after
    /// `[kafka] brokers`, so it may open further sections.
    pub fn config(
        &self,
        name: &str,
        url: &str,
        brokers: &str,
        postgres: &str,
        rest: &str,
    ) -> PathBuf {
        let path = self.dir.path().join(name);
        let text = format!(
            "[postgres]\nurl = \"{url}\"\nslot = \"{SLOT}\"\n{postgres}\n\
             [kafka]\nbrokers = \"{brokers}\"\n{rest}\n"
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    /// The least-privilege setup of migrations/: role `outboxd`, the
    /// publication created by the admin.
    pub fn documented_config(&self, name: &str) -> PathBuf {
        self.config(
            name,
            &self.url("outboxd", None),
            kafka::shared().bootstrap(),
            "create_publication = false",
            "",
        )
    }

    pub fn count(&self, sql: &str) -> String {
        self.pg.psql("app", sql).trim().to_string()
    }
}

pub struct Checked {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Checked {
    /// `(verdict, name, detail)` of each check line (the summary excluded);
    /// indented continuation lines are part of the detail.
    pub fn lines(&self) -> Vec<(String, String, String)> {
        let mut lines: Vec<(String, String, String)> = Vec::new();
        for l in self.stdout.lines().filter(|l| !l.starts_with("summary:")) {
            match lines.last_mut() {
                Some((_, _, detail)) if l.starts_with(' ') => {
                    detail.push('\n');
                    detail.push_str(l.trim());
                }
                _ => {
                    assert!(l.len() > 25, "short line {l:?} in:\n{}", self.stdout);
                    let field = |r: std::ops::Range<usize>| l[r].trim().to_string();
                    lines.push((field(0..4), field(6..23), l[25..].to_string()));
                }
            }
        }
        lines
    }

    /// The first line of check `name`.
    pub fn line(&self, name: &str) -> (String, String) {
        self.lines()
            .into_iter()
            .find(|(_, n, _)| n == name)
            .map(|(v, _, d)| (v, d))
            .unwrap_or_else(|| panic!("no {name:?} line in:\n{}", self.stdout))
    }

    /// Exit code 1 and a FAIL line for `name` (of possibly several) that
    /// contains every needle.
    pub fn expect_fail(&self, name: &str, needles: &[&str]) {
        assert_eq!(self.code, Some(1), "exit code; output:\n{self}");
        let lines = self.lines();
        let (_, _, detail) = lines
            .iter()
            .find(|(v, n, _)| n == name && v == "FAIL")
            .unwrap_or_else(|| panic!("no FAIL {name:?} line in:\n{self}"));
        for n in needles {
            assert!(detail.contains(n), "missing {n:?} in {name} line:\n{self}");
        }
    }
}

impl std::fmt::Display for Checked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}--- stderr\n{}", self.stdout, self.stderr)
    }
}

/// Runs `outboxd check`; the output is printed, so a failing test shows it.
pub fn check(config: &Path) -> Checked {
    check_with(Some(config), &[])
}

/// `outboxd check`, with or without a file, with extra environment
/// variables (`OUTBOXD_<SECTION>__<KEY>` overrides among them).
pub fn check_with(config: Option<&Path>, vars: &[(&str, &str)]) -> Checked {
    let mut cmd = Command::new(bin());
    cmd.arg("check");
    if let Some(config) = config {
        cmd.arg("--config").arg(config);
    }
    let mut child = cmd
        .env_remove("OUTBOXD_CONFIG")
        .envs(vars.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn outboxd check");
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut out, &mut s).unwrap();
        s
    });
    // Worst case: a 10 s Kafka metadata timeout, then nothing else waits.
    let status = wait_with_timeout(&mut child, Duration::from_secs(90));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut err, &mut stderr).unwrap();
    let out = Checked {
        code: status.expect("outboxd check did not finish in 90 s").code(),
        stdout: reader.join().unwrap(),
        stderr,
    };
    let shown = config.map_or("(no file)".into(), |c| c.display().to_string());
    println!("$ outboxd check --config {shown}\n{out}");
    out
}

/// Whether `topic` exists on the shared broker.
pub fn topic_exists(topic: &str) -> bool {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", kafka::shared().bootstrap())
        .set("allow.auto.create.topics", "false")
        .create()
        .unwrap();
    let md = admin
        .inner()
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    md.topics()
        .iter()
        .any(|t| t.name() == topic && t.error().is_none())
}
