//! Acceptance 4: SCRAM and MD5 authenticate on both connections (walsender
//! and SQL); a wrong password names user and server; TLS `require` works with
//! a self-signed certificate; `verify-full` against the wrong CA fails clearly.
//!
//! And `outboxd run` as operators meet these errors: a cause only a person
//! can fix (password, pg_hba.conf, database, privilege, certificate) ends the
//! process after `relay.max_permanent_failures` attempts, naming the server's
//! message, the SQLSTATE and the setting; a refused connection is retried.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use outboxd::source::admin::connect_sql;
use outboxd::source::replication::{connect, ConnParams, ReplicationError};

use crate::harness::outboxd::{bin, tail, wait_with_timeout, wait_with_timeout_keep, write_config};
use crate::harness::pg::{Auth, PgCluster, PgOptions};

fn params(pg: &PgCluster, user: &str, password: &str, extra: &str) -> ConnParams {
    ConnParams::from_url(&format!(
        "{}?sslmode=disable{extra}",
        pg.url(user, Some(password), "postgres")
    ))
    .unwrap()
}

async fn both_connections_work(p: &ConnParams) {
    let mut wal = connect(p)
        .await
        .unwrap_or_else(|e| panic!("walsender connect as {}: {e}", p.user));
    let id = wal.identify_system().await.expect("IDENTIFY_SYSTEM");
    assert_eq!(id.dbname.as_deref(), Some("postgres"));
    wal.close().await;
    let sql = connect_sql(p)
        .await
        .unwrap_or_else(|e| panic!("sql connect as {}: {e}", p.user));
    let one: i32 = sql.query_one("SELECT 1", &[]).await.unwrap().get(0);
    assert_eq!(one, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_authenticates_and_wrong_password_names_user_and_server() {
    let pg = PgCluster::start(PgOptions::default().with_auth(Auth::Scram));
    pg.create_role("scram_user", "s3cret-пароль", "REPLICATION");
    both_connections_work(&params(&pg, "scram_user", "s3cret-пароль", "")).await;

    let err = connect(&params(&pg, "scram_user", "wrong", ""))
        .await
        .err()
        .expect("wrong password accepted");
    assert!(matches!(err, ReplicationError::Auth { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("\"scram_user\""), "{msg}");
    assert!(msg.contains(&format!("127.0.0.1:{}", pg.port())), "{msg}");
    assert!(msg.contains("password authentication failed"), "{msg}");
    assert!(!err.is_retryable());

    // No password configured at all: the error says where to put one.
    let mut no_pw = params(&pg, "scram_user", "x", "");
    no_pw.password = None;
    let msg = connect(&no_pw).await.err().unwrap().to_string();
    assert!(msg.contains("postgres.password_env"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn md5_authenticates() {
    let pg = PgCluster::start(PgOptions::default().with_auth(Auth::Md5));
    pg.create_role("md5_user", "md5-pass", "REPLICATION");
    assert!(pg
        .psql(
            "postgres",
            "SELECT rolpassword FROM pg_authid WHERE rolname = 'md5_user'"
        )
        .starts_with("md5"));
    both_connections_work(&params(&pg, "md5_user", "md5-pass", "")).await;
    let msg = connect(&params(&pg, "md5_user", "nope", ""))
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(msg.contains("md5_user") && msg.contains("failed"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_require_and_verify_modes() {
    let pg = PgCluster::start(PgOptions::default().with_auth(Auth::Scram).with_ssl());
    pg.create_role("tls_user", "pw", "REPLICATION");
    let url = |mode: &str, ca: Option<&std::path::Path>| {
        let mut u = format!(
            "{}?sslmode={mode}",
            pg.url("tls_user", Some("pw"), "postgres")
        );
        if let Some(ca) = ca {
            u.push_str(&format!("&sslrootcert={}", ca.display()));
        }
        ConnParams::from_url(&u).unwrap()
    };
    both_connections_work(&url("require", None)).await;
    // The connection really is encrypted.
    let sql = connect_sql(&url("require", None)).await.unwrap();
    let ssl: bool = sql
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(ssl);
    both_connections_work(&url("verify-full", Some(&pg.ca_cert_path()))).await;
    both_connections_work(&url("verify-ca", Some(&pg.ca_cert_path()))).await;

    let err = connect(&url("verify-full", Some(&pg.wrong_ca_cert_path())))
        .await
        .err()
        .expect("wrong CA accepted");
    let msg = err.to_string();
    assert!(matches!(err, ReplicationError::Tls { .. }), "{err:?}");
    assert!(
        msg.contains("verify-full") || msg.contains("VerifyFull"),
        "{msg}"
    );
    assert!(msg.to_lowercase().contains("certificate"), "{msg}");
    assert!(
        connect_sql(&url("verify-full", Some(&pg.wrong_ca_cert_path())))
            .await
            .is_err()
    );

    let msg = connect(&url("verify-full", None))
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(msg.contains("sslrootcert"), "{msg}");
}

#[test]
fn tls_required_but_server_has_none() {
    let pg = PgCluster::start(PgOptions::default());
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "{}?sslmode=require",
        pg.url("postgres", Some("postgres"), "postgres")
    );
    let config = write_config(dir.path(), "c.toml", &url, "s", "");
    let out = tail(&config, &["--limit", "1"], Duration::from_secs(30));
    assert!(!out.success);
    assert!(
        out.stderr.contains("does not support TLS") || out.stderr.contains("does not accept TLS"),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains(&format!("127.0.0.1:{}", pg.port())),
        "names the server: {}",
        out.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleartext_password_authenticates() {
    let pg = PgCluster::start(PgOptions::default().with_auth(Auth::Scram));
    pg.create_role("plain_user", "plain-pw", "REPLICATION");
    pg.write_hba(
        "local all all trust\nlocal replication all trust\n\
         host all postgres 127.0.0.1/32 scram-sha-256\n\
         host all all 127.0.0.1/32 password\nhost replication all 127.0.0.1/32 password\n",
    );
    both_connections_work(&params(&pg, "plain_user", "plain-pw", "")).await;
    let msg = connect(&params(&pg, "plain_user", "bad", ""))
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        msg.contains("plain_user") && msg.contains("password authentication failed"),
        "{msg}"
    );
}

#[test]
fn password_from_a_file_and_from_the_environment() {
    let pg = PgCluster::start(PgOptions::default().with_auth(Auth::Scram));
    pg.create_role("file_user", "from-file", "REPLICATION SUPERUSER");
    pg.psql("postgres", "CREATE TABLE outbox (id int)");
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("pg-password");
    std::fs::write(&secret, "from-file\n").unwrap();
    let url = format!("{}?sslmode=disable", pg.url("file_user", None, "postgres"));
    let extra = format!("password_file = \"{}\"", secret.display());
    let config = dir.path().join("file.toml");
    std::fs::write(
        &config,
        format!("[postgres]\nurl = \"{url}\"\nslot = \"pwfile\"\n{extra}\n"),
    )
    .unwrap();
    // --limit 0: connect, prepare slot and publication, stream, stop.
    let out = tail(&config, &["--limit", "0"], Duration::from_secs(30));
    assert!(out.success, "{}", out.stderr);

    let config = dir.path().join("env.toml");
    std::fs::write(
        &config,
        format!(
            "[postgres]\nurl = \"{url}\"\nslot = \"pwenv\"\npassword_env = \"OUTBOXD_TEST_PW\"\n"
        ),
    )
    .unwrap();
    let status = std::process::Command::new(crate::harness::outboxd::bin())
        .args(["tail", "--limit", "0", "--config"])
        .arg(&config)
        .env("OUTBOXD_TEST_PW", "from-file")
        .output()
        .unwrap();
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let unset = tail(&config, &["--limit", "0"], Duration::from_secs(30));
    assert!(!unset.success);
    assert!(unset.stderr.contains("OUTBOXD_TEST_PW"), "{}", unset.stderr);
}

/// What `outboxd run` did with `url`: its exit status (None: still running
/// after `limit`, then killed), its stderr (logs included), how long it ran.
struct RunOutcome {
    status: Option<std::process::ExitStatus>,
    stderr: String,
    elapsed: Duration,
}

/// `outboxd run` against `url`; Kafka is never reached (the database fails
/// first), so any broker address does.
fn run_relay(dir: &Path, name: &str, url: &str, limit: Duration) -> RunOutcome {
    let config = write_config(
        dir,
        &format!("{name}.toml"),
        url,
        name,
        "[kafka]\nbrokers = \"127.0.0.1:9\"\n[relay]\nreconnect_backoff_max = \"1s\"\n",
    );
    let log = dir.join(format!("{name}.log"));
    let started = Instant::now();
    let mut child = Command::new(bin())
        .args(["run", "--config"])
        .arg(&config)
        .env("OUTBOXD_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("spawn outboxd run");
    let status = wait_with_timeout_keep(&mut child, limit);
    let elapsed = started.elapsed();
    if status.is_none() {
        let _ = wait_with_timeout(&mut child, Duration::ZERO);
    }
    RunOutcome {
        status,
        stderr: std::fs::read_to_string(&log).unwrap(),
        elapsed,
    }
}

/// Exits non-zero within the bound, and the final error holds every needle.
#[track_caller]
fn assert_gives_up(out: &RunOutcome, what: &str, needles: &[&str]) {
    let status = out.status.unwrap_or_else(|| {
        panic!(
            "{what}: still retrying after {:?}; stderr:\n{}",
            out.elapsed, out.stderr
        )
    });
    assert!(!status.success(), "{what}: exit {status}; {}", out.stderr);
    let last = out
        .stderr
        .lines()
        .rev()
        .find(|l| l.starts_with("outboxd:"))
        .unwrap_or_else(|| panic!("{what}: no final error; stderr:\n{}", out.stderr));
    for needle in needles {
        assert!(
            last.contains(needle),
            "{what}: {needle:?} missing from: {last}"
        );
    }
    assert!(
        last.contains("relay.max_permanent_failures"),
        "{what}: {last}"
    );
    eprintln!("{what}: exit {status} after {:.1?}: {last}", out.elapsed);
}

/// Bound on a run that must give up: 3 attempts with 0.5 s and 1 s backoff
/// and a local server answering at once take a few seconds; 30 s leaves room
/// for a loaded machine.
const GIVE_UP_WITHIN: Duration = Duration::from_secs(30);

#[test]
fn run_stops_on_wrong_password_unknown_database_pg_hba_and_missing_privileges() {
    let pg = PgCluster::start(PgOptions::default().with_auth(Auth::Scram));
    pg.create_role("relay_user", "right", "REPLICATION SUPERUSER");
    pg.create_role("refused_user", "pw", "REPLICATION SUPERUSER");
    pg.create_role("plain_user", "pw", "");
    pg.create_database("locked");
    pg.psql("postgres", "REVOKE CONNECT ON DATABASE locked FROM PUBLIC");
    pg.psql("postgres", "CREATE TABLE outbox (id int)");
    pg.write_hba(
        "local all all trust\nlocal replication all trust\n\
         host all refused_user 127.0.0.1/32 reject\n\
         host all all 127.0.0.1/32 scram-sha-256\nhost replication all 127.0.0.1/32 scram-sha-256\n",
    );
    let dir = tempfile::tempdir().unwrap();
    let url =
        |user: &str, pw: &str, db: &str| format!("{}?sslmode=disable", pg.url(user, Some(pw), db));

    let out = run_relay(
        dir.path(),
        "wrongpw",
        &url("relay_user", "wrong", "postgres"),
        GIVE_UP_WITHIN,
    );
    assert_gives_up(
        &out,
        "wrong password",
        &[
            "SQLSTATE 28P01",
            "password authentication failed for user \"relay_user\"",
            "postgres.password_env",
        ],
    );

    let out = run_relay(
        dir.path(),
        "nodb",
        &url("relay_user", "right", "no_such_db"),
        GIVE_UP_WITHIN,
    );
    assert_gives_up(
        &out,
        "unknown database",
        &[
            "SQLSTATE 3D000",
            "database \"no_such_db\" does not exist",
            "database name in postgres.url",
        ],
    );

    let out = run_relay(
        dir.path(),
        "hba",
        &url("refused_user", "pw", "postgres"),
        GIVE_UP_WITHIN,
    );
    assert_gives_up(
        &out,
        "pg_hba reject",
        &[
            "SQLSTATE 28000",
            "pg_hba.conf rejects connection",
            "refused_user",
        ],
    );

    // The server's own 42501: no CONNECT privilege on the database.
    let out = run_relay(
        dir.path(),
        "noconnect",
        &url("plain_user", "pw", "locked"),
        GIVE_UP_WITHIN,
    );
    assert_gives_up(
        &out,
        "no CONNECT privilege",
        &[
            "SQLSTATE 42501",
            "permission denied for database \"locked\"",
            "use another user in postgres.url",
        ],
    );

    let out = run_relay(
        dir.path(),
        "norepl",
        &url("plain_user", "pw", "postgres"),
        GIVE_UP_WITHIN,
    );
    assert_gives_up(
        &out,
        "no REPLICATION",
        &["plain_user", "REPLICATION", "ALTER ROLE"],
    );
}

#[test]
fn run_stops_when_verify_full_does_not_trust_the_server() {
    let pg = PgCluster::start(PgOptions::default().with_auth(Auth::Scram).with_ssl());
    pg.create_role("tls_user", "pw", "REPLICATION SUPERUSER");
    let dir = tempfile::tempdir().unwrap();
    let wrong_ca = pg.wrong_ca_cert_path();
    let url = pg.url_with(
        "tls_user",
        Some("pw"),
        "postgres",
        &[
            ("sslmode", "verify-full"),
            ("sslrootcert", wrong_ca.to_str().unwrap()),
        ],
    );
    let out = run_relay(dir.path(), "wrongca", &url, GIVE_UP_WITHIN);
    assert_gives_up(
        &out,
        "verify-full, wrong CA",
        &["unknown issuer", "UnknownIssuer", "sslrootcert"],
    );
}

#[test]
fn run_keeps_retrying_a_refused_connection_and_says_so() {
    // Nothing listens there: bind, note the port, close.
    let port = crate::harness::http::free_port();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("postgresql://postgres:pw@127.0.0.1:{port}/app?sslmode=disable");
    let out = run_relay(dir.path(), "refused", &url, Duration::from_secs(8));
    assert!(
        out.status.is_none(),
        "a refused connection must be retried, but run exited ({:?}):\n{}",
        out.status,
        out.stderr
    );
    let retries = out
        .stderr
        .lines()
        .filter(|l| l.contains("resuming from the slot"))
        .count();
    assert!(retries >= 2, "{retries} retries:\n{}", out.stderr);
    assert!(
        out.stderr.contains("Connection refused"),
        "the cause is not logged:\n{}",
        out.stderr
    );
}
