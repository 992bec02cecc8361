//! The database restarted under a running relay: a fast restart, then a
//! crash (immediate stop, recovery on start). The slot's position survives
//! as PostgreSQL persisted it, so a crash may repeat events; none is lost and
//! per-aggregate order holds.

use std::time::{Duration, Instant};

use super::support::{aggregates, confirmed_lsn, env, payload_texts, verify, wait_for, Relay};
use crate::harness::kafka::shared;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_restart_and_crash_lose_nothing() {
    let broker = shared();
    let e = env(
        broker.bootstrap(),
        "pgrestart",
        "[relay]\nreconnect_backoff_max = \"2s\"\n",
    );
    let relay = Relay::start(&e);
    let aggs = aggregates(20);
    let pg = &e.pg;
    let start = confirmed_lsn(pg, "pgrestart");
    let mut sent = Vec::new();

    let mut client = pg.client("app").await;
    sent.extend(
        super::support::write(&mut client, "pgrestart", &aggs, 3_000, &[1, 10, 100], 0).await,
    );
    drop(client);
    tokio::task::block_in_place(|| {
        wait_for("first confirmations", Duration::from_secs(60), || {
            confirmed_lsn(pg, "pgrestart") > start
        });
        pg.restart();
    });

    let mut client = pg.client("app").await;
    sent.extend(super::support::write(&mut client, "pgrestart", &aggs, 3_000, &[10, 50], 0).await);
    drop(client);
    tokio::task::block_in_place(|| {
        pg.crash();
        pg.start_again();
    });

    let mut client = pg.client("app").await;
    sent.extend(super::support::write(&mut client, "pgrestart", &aggs, 2_000, &[5, 100], 0).await);

    // The slot catching up is the relay's own word that it recovered.
    let end: outboxd::Lsn = pg
        .psql("app", "SELECT pg_current_wal_lsn()")
        .trim()
        .parse()
        .unwrap();
    let caught_up = tokio::task::block_in_place(|| {
        let deadline = Instant::now() + Duration::from_secs(90);
        while Instant::now() < deadline {
            if confirmed_lsn(pg, "pgrestart") >= end {
                return true;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        false
    });
    let log = relay.log();
    assert!(
        caught_up,
        "the relay did not recover from the restarts; its log:\n{log}"
    );
    assert!(
        log.contains("resuming from the slot"),
        "the restarts should have forced reconnects:\n{log}"
    );
    let logs = e.dir.path().to_path_buf();
    let texts = payload_texts(pg);
    let v = tokio::task::block_in_place(|| {
        verify(broker, &sent, &texts, Duration::from_secs(180), true, &logs)
    });
    eprintln!(
        "database restart + crash: {} delivered, {} duplicates",
        v.delivered, v.duplicates
    );
}
