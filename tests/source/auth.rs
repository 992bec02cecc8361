//! Acceptance 4: SCRAM and MD5 authenticate on both connections (walsender
//! and SQL); a wrong password names user and server; TLS `require` works with
//! a self-signed certificate; `verify-full` against the wrong CA fails clearly.

use std::time::Duration;

use outboxd::source::admin::connect_sql;
use outboxd::source::replication::{connect, ConnParams, ReplicationError};

use crate::harness::outboxd::{tail, write_config};
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
