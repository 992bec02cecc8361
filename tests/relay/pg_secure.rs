//! PostgreSQL as production secures it (issue 40, item 6): client
//! certificates (pg_hba.conf `cert`), SCRAM with channel binding required,
//! and a password that rotates under a running relay. One TLS cluster
//! (scram-sha-256, a CA and certificates made at start) serves the module;
//! each test has its own database, roles and slot on it.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use outboxd::source::admin::connect_sql;
use outboxd::source::replication::{connect, ConnParams, ReplicationError};

use crate::harness::events::{aggregates, payload_texts_in, verify, write};
use crate::harness::kafka::shared;
use crate::harness::pg::{Auth, PgCluster, PgOptions};
use crate::harness::pg_tls::{client_cert, require_client_certs, Issuer};
use crate::harness::relay::Relay;
use crate::harness::wait::wait_for;

const BOUND_PASSWORD: &str = "bound-Pw-7c1e";
const ROTATING_OLD: &str = "rot-Old-Pw-4b2d";
const ROTATING_NEW: &str = "rot-New-Pw-91fa";

/// The module's TLS cluster: `cert_user` must present a certificate, the
/// others log in with SCRAM (over TLS or not).
fn cluster() -> &'static PgCluster {
    static CLUSTER: OnceLock<PgCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let pg = PgCluster::start(PgOptions::default().with_auth(Auth::Scram).with_ssl());
        // Superusers so that the relay may create its publication; the
        // rights are not what these tests are about.
        pg.create_role("cert_user", None, "REPLICATION SUPERUSER");
        pg.create_role("bound_user", BOUND_PASSWORD, "REPLICATION SUPERUSER");
        pg.create_role("rot_user", ROTATING_OLD, "REPLICATION SUPERUSER");
        require_client_certs(&pg, &["hostssl all cert_user 127.0.0.1/32 cert"]);
        pg
    })
}

/// A database with the outbox migrations and a slot for one test.
fn app_database(pg: &PgCluster, db: &str, slot: &str) {
    pg.create_database(db);
    pg.apply_migrations(db);
    pg.psql(
        db,
        "CREATE TABLE agg_seq (agg text PRIMARY KEY, n bigint NOT NULL DEFAULT 0); \
         CREATE TABLE unpublished (id serial, note text)",
    );
    pg.psql(
        db,
        &format!("SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')"),
    );
}

/// A relay config for `url`, its topics named after the slot.
fn relay_config(dir: &Path, url: &str, slot: &str, postgres_extra: &str) -> PathBuf {
    let config = dir.join(format!("{slot}.toml"));
    std::fs::write(
        &config,
        format!(
            "[postgres]\nurl = \"{url}\"\nslot = \"{slot}\"\nstatus_interval = \"200ms\"\n{postgres_extra}\n\
             [kafka]\nbrokers = \"{}\"\ntopic_partitions = 3\n\
             [routing]\ntopic = \"{slot}.${{aggregate_type}}\"\n\
             [relay]\nreconnect_backoff_max = \"1s\"\n",
            shared().bootstrap()
        ),
    )
    .unwrap();
    config
}

fn confirmed(pg: &PgCluster, slot: &str) -> outboxd::Lsn {
    pg.psql(
        "postgres",
        &format!("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = '{slot}'"),
    )
    .trim()
    .parse()
    .unwrap()
}

/// Waits until the relay has confirmed everything written to `db` so far.
fn wait_caught_up(pg: &PgCluster, db: &str, slot: &str, relay: &Relay) {
    let end: outboxd::Lsn = pg
        .psql(db, "SELECT pg_current_wal_lsn()")
        .trim()
        .parse()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while confirmed(pg, slot) < end {
        assert!(
            Instant::now() < deadline,
            "slot {slot} did not reach {end}; the relay's log:\n{}",
            relay.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs a relay on `url`, writes `n` events to `db` and checks every one
/// arrived in Kafka once, in per-aggregate order; the relay's log.
async fn relays_events(pg: &PgCluster, db: &str, slot: &str, url: &str, n: usize) -> String {
    let dir = tempfile::tempdir().unwrap();
    let config = relay_config(dir.path(), url, slot, "");
    let relay = Relay::start_config(&config, dir.path(), &[], &[]);
    let mut client = pg.client(db).await;
    let sent = write(&mut client, slot, &aggregates(12), n, &[1, 10, 50], 7).await;
    let texts = payload_texts_in(pg, db);
    let v = tokio::task::block_in_place(|| {
        verify(
            shared(),
            &sent,
            &texts,
            Duration::from_secs(120),
            false,
            dir.path(),
        )
    });
    assert_eq!(v.delivered, sent.len());
    relay.log()
}

fn secure_url(
    pg: &PgCluster,
    user: &str,
    password: Option<&str>,
    db: &str,
    extra: &[(&str, &str)],
) -> String {
    let ca = pg.ca_cert_path().display().to_string();
    let mut params = vec![("sslmode", "verify-full"), ("sslrootcert", ca.as_str())];
    params.extend_from_slice(extra);
    pg.url_with(user, password, db, &params)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificate_logs_in_on_both_connections_and_relays() {
    let pg = cluster();
    let dir = tempfile::tempdir().unwrap();
    let (crt, key) = client_cert(pg, "cert_user", Issuer::ServerCa, dir.path());
    let (crt, key) = (crt.display().to_string(), key.display().to_string());
    let cert_params = [("sslcert", crt.as_str()), ("sslkey", key.as_str())];
    let params =
        ConnParams::from_url(&secure_url(pg, "cert_user", None, "postgres", &cert_params)).unwrap();

    let mut wal = connect(&params)
        .await
        .expect("walsender login by certificate");
    assert!(wal.identify_system().await.is_ok());
    wal.close().await;
    let sql = connect_sql(&params)
        .await
        .expect("SQL login by certificate");
    let row = sql
        .query_one(
            "SELECT ssl, client_dn FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .unwrap();
    assert!(row.get::<_, bool>(0));
    assert_eq!(
        row.get::<_, Option<String>>(1).as_deref(),
        Some("/CN=cert_user")
    );

    // No certificate: pg_hba.conf's cert method refuses, naming it.
    let bare = ConnParams::from_url(&secure_url(pg, "cert_user", None, "postgres", &[])).unwrap();
    let err = connect(&bare)
        .await
        .err()
        .expect("login without a certificate");
    assert!(matches!(err, ReplicationError::Auth { .. }), "{err:?}");
    assert!(err.to_string().contains("certificate"), "{err}");
    assert!(connect_sql(&bare).await.is_err());

    // A certificate from a CA the server does not trust.
    let (bad_crt, bad_key) = client_cert(pg, "cert_user", Issuer::WrongCa, dir.path());
    let (bad_crt, bad_key) = (bad_crt.display().to_string(), bad_key.display().to_string());
    let wrong = ConnParams::from_url(&secure_url(
        pg,
        "cert_user",
        None,
        "postgres",
        &[("sslcert", bad_crt.as_str()), ("sslkey", bad_key.as_str())],
    ))
    .unwrap();
    let err = connect(&wrong)
        .await
        .err()
        .expect("certificate from a foreign CA");
    assert!(matches!(err, ReplicationError::Tls { .. }), "{err:?}");
    assert!(!err.is_retryable(), "{err:?}");
    assert!(err.to_string().contains("sslcert"), "{err}");
    let msg = connect_sql(&wrong)
        .await
        .expect_err("SQL with a certificate from a foreign CA")
        .to_string();
    assert!(msg.contains("sslcert"), "{msg}");

    // A key file that is no key: the error names the setting, never the
    // file's contents.
    let not_a_key = ConnParams::from_url(&secure_url(
        pg,
        "cert_user",
        None,
        "postgres",
        &[("sslcert", crt.as_str()), ("sslkey", crt.as_str())],
    ))
    .unwrap();
    let msg = connect(&not_a_key)
        .await
        .err()
        .expect("a certificate as key")
        .to_string();
    assert!(msg.contains("sslkey"), "{msg}");
    let cert_body = std::fs::read_to_string(&crt).unwrap();
    let body_line = cert_body.lines().nth(1).unwrap();
    assert!(!msg.contains(body_line), "{msg}");

    // channel_binding=require refuses a login SCRAM did not bind: cert.
    let unbound = ConnParams::from_url(&secure_url(
        pg,
        "cert_user",
        None,
        "postgres",
        &[
            cert_params[0],
            cert_params[1],
            ("channel_binding", "require"),
        ],
    ))
    .unwrap();
    let msg = connect(&unbound)
        .await
        .err()
        .expect("cert login under require")
        .to_string();
    assert!(msg.contains("channel_binding=require"), "{msg}");
    let msg = connect_sql(&unbound)
        .await
        .expect_err("SQL cert login under require")
        .to_string();
    assert!(msg.contains("channel_binding=require"), "{msg}");

    app_database(pg, "cert_app", "pgcert");
    let url = secure_url(pg, "cert_user", None, "cert_app", &cert_params);
    let log = relays_events(pg, "cert_app", "pgcert", &url, 400).await;
    let key_body = std::fs::read_to_string(&key).unwrap();
    for line in key_body.lines().filter(|l| !l.starts_with("-----")) {
        assert!(
            !log.contains(line),
            "a line of the private key is in the log"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channel_binding_required_on_both_connections() {
    let pg = cluster();
    let bound = [("channel_binding", "require")];
    let params = ConnParams::from_url(&secure_url(
        pg,
        "bound_user",
        Some(BOUND_PASSWORD),
        "postgres",
        &bound,
    ))
    .unwrap();
    // Under `require` only SCRAM-SHA-256-PLUS logs in, and the server checks
    // the binding (the hash of its certificate as this side saw it).
    let mut wal = connect(&params)
        .await
        .expect("walsender login with channel binding");
    assert!(wal.identify_system().await.is_ok());
    wal.close().await;
    let sql = connect_sql(&params)
        .await
        .expect("SQL login with channel binding");
    let one: i32 = sql.query_one("SELECT 1", &[]).await.unwrap().get(0);
    assert_eq!(one, 1);

    let wrong = ConnParams::from_url(&secure_url(
        pg,
        "bound_user",
        Some("not-it"),
        "postgres",
        &bound,
    ))
    .unwrap();
    let err = connect(&wrong)
        .await
        .err()
        .expect("wrong password accepted");
    assert!(
        err.to_string().contains("password authentication failed"),
        "{err}"
    );

    // A server without TLS cannot bind: both connections refuse it.
    let plain = PgCluster::start(PgOptions::default().with_auth(Auth::Scram));
    plain.create_role("bound_user", BOUND_PASSWORD, "REPLICATION");
    let to_plain = ConnParams::from_url(&plain.url_with(
        "bound_user",
        Some(BOUND_PASSWORD),
        "postgres",
        &[("sslmode", "prefer"), ("channel_binding", "require")],
    ))
    .unwrap();
    let err = connect(&to_plain)
        .await
        .err()
        .expect("unbound login to a plain server");
    assert!(matches!(err, ReplicationError::Auth { .. }), "{err:?}");
    assert!(err.to_string().contains("not encrypted"), "{err}");
    let msg = connect_sql(&to_plain)
        .await
        .expect_err("SQL to a plain server")
        .to_string();
    assert!(msg.contains("channel_binding=require"), "{msg}");
    // The same server with binding preferred (the default) still works.
    let preferred = ConnParams::from_url(&plain.url_with(
        "bound_user",
        Some(BOUND_PASSWORD),
        "postgres",
        &[("sslmode", "prefer")],
    ))
    .unwrap();
    connect(&preferred)
        .await
        .expect("SCRAM without binding when preferred")
        .close()
        .await;

    app_database(pg, "bound_app", "pgbound");
    let url = secure_url(pg, "bound_user", Some(BOUND_PASSWORD), "bound_app", &bound);
    let log = relays_events(pg, "bound_app", "pgbound", &url, 400).await;
    assert!(
        !log.contains(BOUND_PASSWORD),
        "the password is in the relay's log"
    );
}

fn backend_pids(pg: &PgCluster, user: &str) -> Vec<i32> {
    pg.psql(
        "postgres",
        &format!("SELECT pid FROM pg_stat_activity WHERE usename = '{user}' ORDER BY pid"),
    )
    .lines()
    .map(|l| l.trim().parse().unwrap())
    .collect()
}

/// Terminates every session of `user`; the pids it terminated.
fn cut_sessions(pg: &PgCluster, user: &str) -> Vec<i32> {
    pg.psql(
        "postgres",
        // Materialized first: in a plain WHERE the planner may call
        // pg_terminate_backend before filtering by user (this session too).
        &format!(
            "WITH p AS MATERIALIZED (SELECT pid FROM pg_stat_activity WHERE usename = '{user}') \
             SELECT pid FROM p WHERE pg_terminate_backend(pid) ORDER BY pid"
        ),
    )
    .lines()
    .map(|l| l.trim().parse().unwrap())
    .collect()
}

/// Replaces the file at once, as a secret store (or a Kubernetes secret
/// volume) does: a reader sees the old password or the new, never half.
fn replace_file(path: &Path, text: &str) {
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_password_file_is_used_after_the_connections_are_cut() {
    let pg = cluster();
    let db = "rot_app";
    let slot = "pgrot";
    app_database(pg, db, slot);
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("pg-password");
    replace_file(&secret, &format!("{ROTATING_OLD}\n"));
    let url = secure_url(pg, "rot_user", None, db, &[]);
    let config = relay_config(
        dir.path(),
        &url,
        slot,
        &format!("password_file = \"{}\"", secret.display()),
    );
    let relay = Relay::start_config(&config, dir.path(), &[], &[]);
    let aggs = aggregates(16);
    let mut client = pg.client(db).await;
    let mut sent = write(&mut client, slot, &aggs, 1_000, &[1, 10, 100], 9).await;
    tokio::task::block_in_place(|| {
        wait_for(
            "the relay to log in as rot_user",
            Duration::from_secs(60),
            || !backend_pids(pg, "rot_user").is_empty(),
        );
    });

    // The rotation: the role's password and the file change while the relay
    // runs; its sessions, logged in with the old one, go on.
    pg.psql(
        "postgres",
        &format!("ALTER ROLE rot_user PASSWORD '{ROTATING_NEW}'"),
    );
    replace_file(&secret, &format!("{ROTATING_NEW}\n"));
    sent.extend(write(&mut client, slot, &aggs, 1_000, &[5, 50], 0).await);
    // Cut the sessions the relay holds, once it holds some: in one CI run
    // it held none at this point (the relay's log was not kept; this now
    // shows it), so the cut would test nothing.
    let deadline = Instant::now() + Duration::from_secs(60);
    let before = loop {
        let cut = cut_sessions(pg, "rot_user");
        if !cut.is_empty() {
            break cut;
        }
        assert!(
            Instant::now() < deadline,
            "the relay held no session to cut for 60 s; its log:\n{}",
            relay.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    sent.extend(write(&mut client, slot, &aggs, 1_000, &[1, 20], 11).await);

    tokio::task::block_in_place(|| wait_caught_up(pg, db, slot, &relay));
    let after = backend_pids(pg, "rot_user");
    assert!(
        !after.is_empty() && after.iter().all(|p| !before.contains(p)),
        "the relay's sessions after the cut ({after:?}) should all be new (before: {before:?})"
    );
    let texts = payload_texts_in(pg, db);
    let v = tokio::task::block_in_place(|| {
        verify(
            shared(),
            &sent,
            &texts,
            Duration::from_secs(120),
            true,
            dir.path(),
        )
    });
    eprintln!(
        "password rotation: {} events, {} delivered, {} duplicates, sessions {before:?} -> {after:?}",
        sent.len(),
        v.delivered,
        v.duplicates
    );
    let log = relay.log();
    assert!(
        log.contains("resuming from the slot"),
        "no reconnect in the log:\n{log}"
    );
    for pw in [ROTATING_OLD, ROTATING_NEW] {
        assert!(!log.contains(pw), "a password is in the relay's log");
    }
    // The old password no longer opens a session: the reconnect used the file's new one.
    let old = ConnParams::from_url(&secure_url(
        pg,
        "rot_user",
        Some(ROTATING_OLD),
        "postgres",
        &[],
    ))
    .unwrap();
    assert!(connect(&old).await.is_err());
}

/// `outboxd check` and `tail` (debug logging) as operators run them:
/// stdout and stderr together, and the exit code.
fn outboxd(sub: &str, config: &Path) -> (Option<i32>, String) {
    let mut cmd = std::process::Command::new(crate::harness::outboxd::bin());
    cmd.arg(sub).arg("--config").arg(config);
    if sub == "tail" {
        cmd.args(["--limit", "0"]);
    }
    let out = cmd
        .env("OUTBOXD_LOG", "debug")
        .output()
        .expect("run outboxd");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

#[test]
fn no_password_or_key_in_check_or_tail_output() {
    const QUIET: &str = "quiet-Pw-e5d0";
    const WRONG: &str = "wrong-Quiet-Pw-22b8";
    let pg = cluster();
    pg.create_role("quiet_user", QUIET, "REPLICATION SUPERUSER");
    app_database(pg, "quiet_app", "pgquiet");
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("pg-password");

    let url = secure_url(
        pg,
        "quiet_user",
        None,
        "quiet_app",
        &[("channel_binding", "require")],
    );
    let config = relay_config(
        dir.path(),
        &url,
        "pgquiet",
        &format!("password_file = \"{}\"", secret.display()),
    );
    replace_file(&secret, &format!("{QUIET}\n"));
    for sub in ["check", "tail"] {
        let (code, text) = outboxd(sub, &config);
        assert!(!text.contains(QUIET), "{sub} printed the password");
        assert!(!text.contains("authentication failed"), "{sub}: {text}");
        if sub == "tail" {
            assert_eq!(code, Some(0), "{text}");
        }
    }
    replace_file(&secret, &format!("{WRONG}\n"));
    for sub in ["check", "tail"] {
        let (code, text) = outboxd(sub, &config);
        assert_ne!(code, Some(0), "{sub} passed with a wrong password: {text}");
        assert!(
            text.contains("password authentication failed"),
            "{sub}: {text}"
        );
        assert!(!text.contains(WRONG), "{sub} printed the password");
    }

    let (crt, key) = client_cert(pg, "cert_user", Issuer::ServerCa, dir.path());
    let (crt, key) = (crt.display().to_string(), key.display().to_string());
    let url = secure_url(
        pg,
        "cert_user",
        None,
        "quiet_app",
        &[("sslcert", crt.as_str()), ("sslkey", key.as_str())],
    );
    let config = relay_config(dir.path(), &url, "pgquiet", "");
    let key_lines: Vec<String> = std::fs::read_to_string(&key)
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .map(str::to_owned)
        .collect();
    for sub in ["check", "tail"] {
        let (code, text) = outboxd(sub, &config);
        for line in &key_lines {
            assert!(
                !text.contains(line.as_str()),
                "{sub} printed a line of the private key"
            );
        }
        if sub == "tail" {
            assert_eq!(code, Some(0), "{text}");
        }
    }
}
