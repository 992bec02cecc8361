//! Issue 8, point 4: PostgreSQL 17 failover slots. `postgres.failover_slot`
//! makes the slot one (created so, or altered), `outboxd check` says what it
//! sees of it, and with the standby's host in `postgres.url` the relay
//! continues on a promoted standby losing nothing. Skipped before 17
//! (scripts/test.sh runs this suite on 17 and 18); before 17 the check
//! refuses the key instead.

use std::time::Duration;

use outboxd::source::admin::connect_sql;
use outboxd::source::replication::{connect, ConnParams};

use crate::harness::events::{aggregates, payload_texts, verify, write, Sent};
use crate::harness::kafka::shared;
use crate::harness::pg::{pg_install, PgCluster, PgOptions};
use crate::harness::relay::{confirmed_lsn, env as relay_env, lsn_now, Relay};
use crate::harness::standby::{promote, start_standby, synchronize_standby_slot};
use crate::harness::wait::wait_for;
use crate::ops::check::support::{check, env as check_env, SLOT};

fn slot_flags(pg: &PgCluster, slot: &str) -> String {
    pg.psql(
        "app",
        &format!(
            "SELECT failover || '/' || synced || '/' || temporary FROM pg_replication_slots \
             WHERE slot_name = '{slot}'"
        ),
    )
}

#[test]
fn check_reports_the_failover_slot_and_its_synchronisation() {
    let e = check_env(PgOptions::default());
    let config = |name: &str, postgres: &str| {
        e.config(
            name,
            &e.url("outboxd", None),
            shared().bootstrap(),
            &format!("create_publication = false\n{postgres}"),
            "",
        )
    };
    let wanted = config("failover.toml", "failover_slot = true");
    if e.pg.major() < 17 {
        // No failover slots: the key is refused, naming it.
        check(&wanted).expect_fail(
            "failover slot",
            &["postgres.failover_slot = true needs PostgreSQL 17"],
        );
        let plain = check(&config("plain.toml", ""));
        assert_eq!(plain.line("failover slot").0, "ok", "{plain}");
        assert!(
            plain
                .line("failover slot")
                .1
                .contains("has no failover slots"),
            "{plain}"
        );
        return;
    }
    // A slot made without failover, as before this key existed.
    e.pg.psql(
        "app",
        &format!("SELECT pg_create_logical_replication_slot('{SLOT}', 'pgoutput')"),
    );
    let plain = check(&config("plain.toml", ""));
    let (verdict, detail) = plain.line("failover slot");
    assert_eq!(verdict, "ok", "{plain}");
    assert!(detail.contains("is not a failover slot"), "{plain}");
    assert!(
        detail.contains("failover_slot = true to keep it"),
        "{plain}"
    );

    // Wanted, alterable by this REPLICATION role, but nothing keeps a
    // standby ahead of the relay: a warning naming the setting.
    let out = check(&wanted);
    let (verdict, detail) = out.line("failover slot");
    assert_eq!(verdict, "warn", "{out}");
    assert!(detail.contains("outboxd makes it one at start"), "{out}");
    assert!(
        detail.contains("synchronized_standby_slots is empty"),
        "{out}"
    );

    // A role without REPLICATION cannot alter it.
    e.pg.psql("app", "CREATE ROLE nobody LOGIN");
    let weak = e.config(
        "weak.toml",
        &e.url("nobody", None),
        shared().bootstrap(),
        "create_publication = false\nfailover_slot = true",
        "",
    );
    check(&weak).expect_fail(
        "failover slot",
        &[
            "is not a failover slot",
            "cannot alter it",
            "ALTER_REPLICATION_SLOT",
        ],
    );

    // Once it is one, with synchronized_standby_slots set: ok, and named.
    e.pg.psql(
        "app",
        &format!("SELECT pg_drop_replication_slot('{SLOT}'); \
                  SELECT pg_create_logical_replication_slot('{SLOT}', 'pgoutput', false, false, true)"),
    );
    e.pg.psql(
        "app",
        "ALTER SYSTEM SET synchronized_standby_slots = 'standby1'",
    );
    e.pg.reload();
    let out = check(&wanted);
    let (verdict, detail) = out.line("failover slot");
    assert_eq!(verdict, "ok", "{out}");
    assert!(detail.contains("is a failover slot"), "{out}");
    assert!(detail.contains("\"standby1\""), "{out}");
}

/// Two writers, `n` events each way, on `pg`.
async fn write_on(pg: &PgCluster, prefix: &str, n: usize) -> Vec<Sent> {
    let aggs = aggregates(20);
    let mut handles = Vec::new();
    for w in 0..2 {
        let url = pg.url("postgres", Some("postgres"), "app");
        let (aggs, prefix) = (aggs.clone(), prefix.to_string());
        handles.push(tokio::spawn(async move {
            let (mut client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .unwrap();
            tokio::spawn(conn);
            let sizes = if w == 0 {
                vec![1, 10, 100]
            } else {
                vec![50, 1, 300]
            };
            write(&mut client, &prefix, &aggs, n / 2, &sizes, 0).await
        }));
    }
    let mut sent = Vec::new();
    for h in handles {
        sent.extend(h.await.unwrap());
    }
    sent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_continues_on_the_promoted_standby_losing_nothing() {
    let major = pg_install().major;
    if major < 17 {
        println!(
            "skipped: PostgreSQL {major} has no failover slots (OUTBOXD_TEST_PG_VERSION=17 runs this)"
        );
        return;
    }
    let broker = shared();
    let slot = "failover";
    // The slot made here has no failover flag: the relay alters it.
    let e = relay_env(
        broker.bootstrap(),
        slot,
        "[relay]\nreconnect_backoff_max = \"1s\"\n",
    );
    let standby = tokio::task::block_in_place(|| start_standby(&e.pg, "standby1"));
    synchronize_standby_slot(&e.pg, "standby1");
    // Both hosts, the standby second: after the failover the first one is
    // gone and the second is found once it accepts writes.
    let url = format!(
        "postgresql://postgres:postgres@{}:{},{}:{}/app?sslmode=disable&target_session_attrs=read-write",
        e.pg.host(),
        e.pg.port(),
        standby.host(),
        standby.port()
    );
    let text = std::fs::read_to_string(&e.config).unwrap();
    let (head, rest) = text.split_once("\nslot = ").unwrap();
    let head = head.split_once("url = ").unwrap().0;
    std::fs::write(
        &e.config,
        format!("{head}url = \"{url}\"\nfailover_slot = true\nslot = {rest}"),
    )
    .unwrap();

    // Standby first: `read-write` skips it on both connections, `any` not.
    let standby_first = |attrs: &str| {
        ConnParams::from_url(&format!(
            "postgresql://postgres:postgres@{}:{},{}:{}/app?sslmode=disable&target_session_attrs={attrs}",
            standby.host(),
            standby.port(),
            e.pg.host(),
            e.pg.port()
        ))
        .unwrap()
    };
    for (attrs, want_standby) in [("read-write", false), ("any", true)] {
        let p = standby_first(attrs);
        let wal = connect(&p).await.unwrap();
        let in_recovery = wal.server_params.get("in_hot_standby").map(String::as_str);
        assert_eq!(
            in_recovery == Some("on"),
            want_standby,
            "walsender, {attrs}"
        );
        wal.close().await;
        let sql = connect_sql(&p).await.unwrap();
        let in_recovery: bool = sql
            .query_one("SELECT pg_is_in_recovery()", &[])
            .await
            .unwrap()
            .get(0);
        assert_eq!(in_recovery, want_standby, "SQL connection, {attrs}");
    }

    let mut relay = Relay::start(&e);
    tokio::task::block_in_place(|| {
        wait_for(
            "the relay to make the slot a failover slot",
            Duration::from_secs(60),
            || slot_flags(&e.pg, slot).starts_with("true/"),
        )
    });
    let mut sent = write_on(&e.pg, slot, 6_000).await;
    // Promoting before the standby's copy is persistent would drop it.
    tokio::task::block_in_place(|| {
        wait_for(
            "the slot to be synchronised to the standby",
            Duration::from_secs(120),
            || slot_flags(&standby, slot) == "true/true/false",
        )
    });
    // What outboxd check sees on the standby: the synchronised copy.
    let on_standby = e.dir.path().join("standby.toml");
    let text = std::fs::read_to_string(&e.config).unwrap();
    std::fs::write(
        &on_standby,
        text.replace(
            &url,
            &format!(
                "postgresql://postgres:postgres@{}:{}/app?sslmode=disable",
                standby.host(),
                standby.port()
            ),
        ),
    )
    .unwrap();
    let out = tokio::task::block_in_place(|| check(&on_standby));
    let (verdict, detail) = out.line("failover slot");
    assert_eq!(verdict, "warn", "{out}");
    assert!(
        detail.contains("is a failover slot; this server is a standby")
            && detail.contains("synced = true"),
        "{out}"
    );
    // More under way while the primary goes: the relay is mid-stream.
    sent.extend(write_on(&e.pg, slot, 4_000).await);
    tokio::task::block_in_place(|| {
        println!(
            "at the stop: WAL at {}, the relay's slot confirmed {}",
            lsn_now(&e.pg),
            confirmed_lsn(&e.pg, slot)
        );
        e.pg.stop();
        promote(&standby);
    });
    sent.extend(write_on(&standby, slot, 4_000).await);
    let v = tokio::task::block_in_place(|| {
        verify(
            broker,
            &sent,
            &payload_texts(&standby),
            Duration::from_secs(180),
            true,
            e.dir.path(),
        )
    });
    println!(
        "failover: {} committed, {} delivered, {} duplicates, 0 lost, per-key order kept",
        sent.len(),
        v.delivered,
        v.duplicates
    );
    assert_eq!(v.delivered, sent.len());
    let log = relay.log();
    for line in log.lines().filter(|l| l.contains("replication started")) {
        println!("relay: {line}");
    }
    assert!(
        relay.child.try_wait().unwrap().is_none(),
        "the relay exited:\n{}",
        relay.log()
    );
    let active = standby.psql(
        "app",
        &format!("SELECT active FROM pg_replication_slots WHERE slot_name = '{slot}'"),
    );
    assert_eq!(
        active,
        "t",
        "the relay streams the promoted standby's slot:\n{}",
        relay.log()
    );
    relay.signal("-TERM");
    relay.wait(Duration::from_secs(30));
}
