//! What an idle relay costs the primary (issue 38): with nothing in flight
//! and no WAL moving, the table watch looks at most once per status
//! interval, and each look is one statement. The watch's statements are
//! counted in the server's own log (`log_statement = all`, the application
//! name in each line), so neither the relay's metrics nor its code are
//! taken at their word; the whole database's commits
//! (`pg_stat_database.xact_commit`) are printed beside them.

use std::time::Duration;

use crate::harness::events::{aggregates, verify_env, write};
use crate::harness::http::{free_port, Scrape};
use crate::harness::kafka::shared;
use crate::harness::relay::{confirmed_lsn, edit_config, env, lsn_now, Relay};
use crate::harness::wait::wait_for;

/// The shipped `postgres.status_interval`.
const INTERVAL: Duration = Duration::from_secs(1);

/// How long the idle relay is watched.
const WINDOW: Duration = Duration::from_secs(20);

/// The table watch's connection, as `log_line_prefix`'s `%a` prints it
/// (`<application_name>-watch`, with the SQL connection's `-sql`).
const WATCH_APPLICATION: &str = " outboxd-watch-sql ";

/// Statements the server logged for the table watch's connection.
fn watch_statements(log: &str) -> usize {
    log.lines()
        .filter(|l| l.contains(WATCH_APPLICATION))
        .filter(|l| l.contains("LOG:  execute") || l.contains("LOG:  statement:"))
        .count()
}

fn xact_commits(pg: &crate::harness::pg::PgCluster) -> u64 {
    pg.psql(
        "app",
        "SELECT xact_commit FROM pg_stat_database WHERE datname = 'app'",
    )
    .trim()
    .parse()
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_relay_looks_once_per_status_interval_in_one_statement() {
    let slot = "idlecost";
    let port = free_port();
    let e = env(
        shared().bootstrap(),
        slot,
        &format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n"),
    );
    edit_config(
        &e,
        "status_interval = \"200ms\"",
        &format!("status_interval = \"{}ms\"", INTERVAL.as_millis()),
    );
    let pg = &e.pg;
    // Every statement in the log, with the application that sent it.
    // ALTER SYSTEM refuses a transaction block: one call each.
    pg.psql("app", "ALTER SYSTEM SET log_statement = 'all'");
    pg.psql(
        "app",
        "ALTER SYSTEM SET log_line_prefix = '%m [%p] %q%u@%d %a '",
    );
    pg.psql("app", "SELECT pg_reload_conf()");
    let relay = Relay::start(&e);
    let mut client = pg.client("app").await;
    let sent = write(&mut client, slot, &aggregates(2), 10, &[5], 0).await;
    verify_env(&e, &sent, Duration::from_secs(60));
    tokio::task::block_in_place(|| {
        wait_for("everything confirmed", Duration::from_secs(60), || {
            confirmed_lsn(pg, slot) >= lsn_now(pg)
        })
    });
    // Settled: the looks that vouch for the last writes are done.
    tokio::time::sleep(INTERVAL * 3).await;

    let looks_before = Scrape::take(port).get("outboxd_table_watch_look_seconds_count", "");
    let wal_before = lsn_now(pg);
    let log_before = pg.log().len();
    let commits_before = xact_commits(pg);
    tokio::time::sleep(WINDOW).await;
    let commits = xact_commits(pg) - commits_before;
    // The server may write a little on its own (a checkpoint, a standby
    // snapshot record): a moved WAL asks for a busy look or two.
    let wal_moved = lsn_now(pg) != wal_before;
    let log = pg.log();
    let statements = watch_statements(&log[log_before..]);
    let looks_after = Scrape::take(port).get("outboxd_table_watch_look_seconds_count", "");
    let intervals = WINDOW.as_secs_f64() / INTERVAL.as_secs_f64();
    let secs = WINDOW.as_secs_f64();
    eprintln!(
        "idle relay over {secs} s at a {} ms status interval: the table watch ran {statements} \
         statements ({:.2}/s); the database committed {commits} transactions ({:.2}/s, the two \
         psql samples included); looks counted by the relay: {:?}; WAL moved: {wal_moved}",
        INTERVAL.as_millis(),
        statements as f64 / secs,
        commits as f64 / secs,
        looks_before.zip(looks_after).map(|(b, a)| a - b),
    );
    // One per interval, one more for the window's edges, and two to vouch
    // for WAL the server wrote on its own.
    let most = intervals.ceil() as usize + 1 + if wal_moved { 2 } else { 0 };
    assert!(
        statements <= most,
        "the idle table watch ran {statements} statements in {secs} s, more than one per status \
         interval ({most}, WAL moved: {wal_moved}); relay log:\n{}",
        relay.log()
    );
    // It still looks: a change to the table is still noticed while idle.
    let least = (intervals * 0.8) as usize;
    assert!(
        statements >= least,
        "the idle table watch ran only {statements} statements in {secs} s (at least {least} \
         expected: one per status interval)"
    );
    // One statement per look: the relay's own count of looks agrees.
    let (before, after) = (
        looks_before.expect("outboxd_table_watch_look_seconds in the scrape"),
        looks_after.expect("outboxd_table_watch_look_seconds in the scrape"),
    );
    let looks = (after - before) as usize;
    assert!(
        statements.abs_diff(looks) <= 1,
        "{looks} looks counted by the relay, {statements} statements logged by the server: a \
         look is one statement"
    );
}
