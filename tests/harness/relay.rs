//! `outboxd run` against a private PostgreSQL cluster and a Kafka broker:
//! the cluster with the migrations and a config ([`env`]), the relay as a
//! child process ([`Relay`]), and what a test asks the server about the
//! slot.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::harness::events::{write, Sent};
use crate::harness::kafka::KafkaBroker;
use crate::harness::outboxd::bin;
use crate::harness::pg::{PgCluster, PgOptions};
use crate::harness::wait::wait_for;
use outboxd::relay::EVENTS_TARGET;

pub struct Env {
    pub pg: PgCluster,
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
}

/// A cluster with the migrations and a per-aggregate sequence table, and a
/// config pointing `outboxd run` at it and at `brokers`.
pub fn env(brokers: &str, slot: &str, extra: &str) -> Env {
    let pg = PgCluster::start(PgOptions::default());
    pg.create_database("app");
    pg.apply_migrations("app");
    pg.psql("app", "CREATE TABLE agg_seq (agg text PRIMARY KEY, n bigint NOT NULL DEFAULT 0); CREATE TABLE unpublished (id serial, note text)");
    pg.psql(
        "app",
        &format!("SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')"),
    );
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "{}?sslmode=disable",
        pg.url("postgres", Some("postgres"), "app")
    );
    let config = dir.path().join("outboxd.toml");
    // Each test routes to topics of its own on the shared broker.
    let routing = if extra.contains("[routing]") {
        String::new()
    } else {
        format!("[routing]\ntopic = \"{slot}.${{aggregate_type}}\"\n")
    };
    let text = format!(
        "[postgres]\nurl = \"{url}\"\nslot = \"{slot}\"\nstatus_interval = \"200ms\"\n\
         [kafka]\nbrokers = \"{brokers}\"\ntopic_partitions = 3\n{routing}{extra}\n"
    );
    std::fs::write(&config, text).unwrap();
    Env { pg, dir, config }
}

/// A private broker (for a test that pauses or kills it) and an [`env`]
/// pointing at it, started side by side rather than one after the other:
/// the broker's JVM start is most of a test's setup. `broker_extra` goes
/// into the broker's server.properties: a test that pauses the broker
/// gives it a session that outlasts the pause (the harness's 3 s would
/// have its frozen controller fence it at the resume).
pub fn env_with_broker_props(slot: &str, extra: &str, broker_extra: &str) -> (KafkaBroker, Env) {
    env_with_broker_from(slot, extra, || KafkaBroker::start_with(broker_extra))
}

/// As [`env_with_broker_props`], with the broker `start` starts.
pub fn env_with_broker_from(
    slot: &str,
    extra: &str,
    start: impl FnOnce() -> KafkaBroker + Send,
) -> (KafkaBroker, Env) {
    // The config is written before the broker has its port.
    const PENDING: &str = "127.0.0.1:pending-broker";
    std::thread::scope(|s| {
        let broker = s.spawn(start);
        let e = env(PENDING, slot, extra);
        let broker = broker
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        edit_config(
            &e,
            &format!("brokers = \"{PENDING}\""),
            &format!("brokers = \"{}\"", broker.bootstrap()),
        );
        (broker, e)
    })
}

/// Replaces `from` (which must be there) with `to` in `env`'s config file,
/// e.g. another `status_interval` or a `ledger_topic` under `[kafka]`.
pub fn edit_config(env: &Env, from: &str, to: &str) {
    let text = std::fs::read_to_string(&env.config).unwrap();
    assert!(text.contains(from), "{from:?} not in the config:\n{text}");
    std::fs::write(&env.config, text.replacen(from, to, 1)).unwrap();
}

/// Makes the relay of `env` keep its position ledger in `topic` (one per
/// test, so a test reads back only its own entries).
pub fn use_ledger_topic(env: &Env, topic: &str) {
    edit_config(
        env,
        "topic_partitions = 3\n",
        &format!("topic_partitions = 3\nledger_topic = \"{topic}\"\n"),
    );
}

/// `outboxd run` as a child process; killed on drop.
pub struct Relay {
    pub child: Child,
    pub log: PathBuf,
}

impl Relay {
    pub fn start(env: &Env) -> Relay {
        Relay::start_with_env(env, &[])
    }

    /// Like [`start`](Self::start), with extra environment variables (for
    /// `${VAR}` references and `password_env` in the config).
    pub fn start_with_env(env: &Env, vars: &[(&str, &str)]) -> Relay {
        Relay::start_with(env, vars, &[])
    }

    /// Like [`start_with_env`](Self::start_with_env), with extra arguments
    /// to `outboxd run` (e.g. `--accept-gap`).
    pub fn start_with(env: &Env, vars: &[(&str, &str)], args: &[&str]) -> Relay {
        Relay::start_config(&env.config, env.dir.path(), vars, args)
    }

    /// `outboxd run --config config`, its log in `log_dir`: for a test
    /// whose cluster is not an [`Env`]'s (one shared by a module).
    pub fn start_config(
        config: &Path,
        log_dir: &Path,
        vars: &[(&str, &str)],
        args: &[&str],
    ) -> Relay {
        let log = log_dir.join(format!("relay-{}.log", uuid::Uuid::new_v4()));
        let child = Command::new(bin())
            .args(["run", "--config"])
            .arg(config)
            .args(args)
            // The per-event trail lets a failed read-back say whether the
            // relay sent a missing event and where Kafka said it put it.
            .env("OUTBOXD_LOG", "info,outboxd=debug,outboxd::events=trace")
            .envs(vars.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn outboxd run");
        crate::harness::watchdog::watch(
            crate::harness::watchdog::Target::Pid(child.id()),
            "KILL",
            None,
        );
        Relay { child, log }
    }

    /// The process's peak resident memory so far (VmHWM), in KiB; 0 once
    /// it is gone.
    pub fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    /// Whether the process has ended (a zombie until it is waited for).
    pub fn exited(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))
            .ok()
            .and_then(|stat| {
                // The state follows the command name, which is in brackets.
                let (_, rest) = stat.rsplit_once(") ")?;
                rest.chars().next()
            })
            .map_or(true, |state| matches!(state, 'Z' | 'X'))
    }

    /// How long ago the relay last wrote to its log (per-event trail
    /// included): a stuck relay is told apart from a slow one.
    pub fn silent_for(&self) -> Duration {
        std::fs::metadata(&self.log)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .unwrap_or_default()
    }

    /// The relay's log without the per-event trail (see [`event_trail`]).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.contains(EVENTS_TARGET))
            .fold(String::new(), |mut out, l| {
                out.push_str(l);
                out.push('\n');
                out
            })
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig}");
    }

    /// Waits for exit up to `timeout`; None if still running.
    pub fn wait(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        crate::harness::outboxd::wait_with_timeout_keep(&mut self.child, timeout)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The commit time a relay's gap error names in `outboxd backfill --since`.
pub fn named_since(log: &str) -> String {
    log.split("--since '")
        .nth(1)
        .and_then(|rest| rest.split('\'').next())
        .unwrap_or_else(|| panic!("no --since time in:\n{log}"))
        .to_owned()
}

/// Runs `outboxd backfill --since` from 10 s before `since` (for
/// transactions open at that moment), as the gap error advises; panics
/// unless it succeeds.
pub fn backfill_from(pg: &PgCluster, config: &Path, since: &str) -> std::process::Output {
    let earlier = pg.psql(
        "app",
        &format!("SELECT (timestamptz '{since}' - interval '10 seconds')::text"),
    );
    let out = Command::new(bin())
        .args(["backfill", "--config"])
        .arg(config)
        .args(["--since", earlier.trim()])
        .env("OUTBOXD_LOG", "info")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "backfill failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Starts a relay, commits `n` events, and stops it with SIGTERM (exit 0)
/// once the slot is confirmed to the end: the ledger holds them all.
pub async fn relayed_then_stopped(
    e: &Env,
    client: &mut tokio_postgres::Client,
    slot: &str,
    aggs: &[String],
    n: usize,
) -> Vec<Sent> {
    let mut relay = Relay::start(e);
    let sent = write(client, slot, aggs, n, &[1, 10], 0).await;
    let end = lsn_now(&e.pg);
    tokio::task::block_in_place(|| {
        wait_for(
            "the slot confirmed to the end",
            Duration::from_secs(120),
            || confirmed_lsn(&e.pg, slot) >= end,
        );
        relay.signal("-TERM");
        assert!(
            relay
                .wait(Duration::from_secs(30))
                .is_some_and(|s| s.success()),
            "{}",
            relay.log()
        );
    });
    sent
}

/// The server's current WAL position.
pub fn lsn_now(pg: &PgCluster) -> outboxd::Lsn {
    pg.psql("app", "SELECT pg_current_wal_lsn()")
        .trim()
        .parse()
        .unwrap()
}

pub fn confirmed_lsn(pg: &PgCluster, slot: &str) -> outboxd::Lsn {
    pg.psql(
        "app",
        &format!("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = '{slot}'"),
    )
    .trim()
    .parse()
    .unwrap()
}

/// A walsender streams the slot (a relay or `outboxd tail` holds it).
pub fn slot_active(pg: &PgCluster, slot: &str) -> bool {
    pg.psql(
        "app",
        &format!("SELECT active FROM pg_replication_slots WHERE slot_name = '{slot}'"),
    )
    .trim()
        == "t"
}

/// SIGKILLs the postmaster, waits until its backends are gone (they notice
/// the postmaster's death and exit; the shared memory must be free before
/// the next start), starts the server again (crash recovery).
pub fn kill_postmaster(pg: &PgCluster) {
    let pid = std::fs::read_to_string(pg.data_dir().join("postmaster.pid")).unwrap();
    let pid = pid.lines().next().unwrap().trim().to_owned();
    let children = Command::new("pgrep").args(["-P", &pid]).output().unwrap();
    let children: Vec<String> = String::from_utf8_lossy(&children.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let killed = Command::new("kill").args(["-9", &pid]).status().unwrap();
    assert!(killed.success(), "kill -9 {pid}");
    wait_for("the backends to exit", Duration::from_secs(30), || {
        std::iter::once(&pid).chain(&children).all(|p| {
            !Command::new("kill")
                .args(["-0", p])
                .stderr(Stdio::null())
                .status()
                .unwrap()
                .success()
        })
    });
    pg.start_again();
}
