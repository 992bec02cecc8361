//! The outbox table changed under a running relay: dropped and created
//! again, renamed with a new one in its place, removed from the publication.
//! Its inserts are then not in the replication stream; the relay must halt
//! (`outboxd_halted` = 1, `/readyz` 503 naming the recovery) and keep the
//! slot before them, so that they can still be found and re-published.

use std::time::Duration;

use outboxd::Lsn;

use super::standby::{readyz_until, start_on_port};
use crate::harness::events::{
    aggregates, payload_texts, verify_env, verify_reading, write, ReadBack,
};
use crate::harness::http::{free_port, get, Scrape};
use crate::harness::kafka::shared;
use crate::harness::relay::{
    confirmed_lsn, edit_config, env, lsn_now, use_ledger_topic, Env, Relay,
};
use crate::harness::wait::wait_for;

/// How many events go to the changed table.
const LOST: usize = 20;

/// The outbox table dropped and created again, as a migration might.
pub(super) const RECREATE_OUTBOX: &str = "DROP TABLE outbox; \
     CREATE TABLE outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), \
       aggregate_type text NOT NULL, aggregate_id text NOT NULL, event_type text NOT NULL, \
       payload jsonb NOT NULL, headers jsonb, created_at timestamptz NOT NULL DEFAULT now())";

/// The outbox table renamed, with a new one created in its place.
pub(super) const RENAME_OUTBOX: &str = "ALTER TABLE outbox RENAME TO outbox_2025; \
     CREATE TABLE outbox (LIKE outbox_2025 INCLUDING ALL)";

/// The outbox table taken out of the publication.
pub(super) const UNPUBLISH_OUTBOX: &str = "ALTER PUBLICATION outboxd DROP TABLE outbox";

pub(super) struct Halted {
    /// Keeps the cluster up.
    _e: Env,
    pub(super) relay: Relay,
    pub(super) port: u16,
    /// The WAL position right after the change.
    pub(super) changed_at: Lsn,
}

/// How the relay under test runs: extra configuration, the ledger topic
/// (when the test reads it back) and how its topics are read back.
pub(super) struct RelayMode<'a> {
    pub(super) extra: &'a str,
    pub(super) ledger_topic: Option<&'a str>,
    pub(super) read: ReadBack,
}

const AT_LEAST_ONCE: RelayMode<'static> = RelayMode {
    extra: "",
    ledger_topic: None,
    read: ReadBack::Count,
};

async fn change_under_the_relay(slot: &str, change: &str) -> Halted {
    change_under_the_relay_in(slot, &AT_LEAST_ONCE, change).await
}

/// Starts a relay, relays a first batch, runs `change`, writes [`LOST`]
/// events through the changed table, then checks the relay halted and the
/// slot stayed before them.
pub(super) async fn change_under_the_relay_in(
    slot: &str,
    mode: &RelayMode<'_>,
    change: &str,
) -> Halted {
    let port = free_port();
    let e = env(
        shared().bootstrap(),
        slot,
        &format!("{}[metrics]\nlisten = \"127.0.0.1:{port}\"\n", mode.extra),
    );
    if let Some(topic) = mode.ledger_topic {
        use_ledger_topic(&e, topic);
    }
    let relay = Relay::start(&e);
    let aggs = aggregates(4);
    let mut client = e.pg.client("app").await;
    let sent = write(&mut client, slot, &aggs, 10, &[5], 0).await;
    let pg = &e.pg;
    tokio::task::block_in_place(|| {
        wait_for(
            "the first batch confirmed",
            Duration::from_secs(120),
            || confirmed_lsn(pg, slot) >= lsn_now(pg),
        )
    });
    let texts = payload_texts(pg);
    let logs = e.dir.path().to_path_buf();
    tokio::task::block_in_place(|| {
        verify_reading(
            shared(),
            &sent,
            &texts,
            Duration::from_secs(60),
            false,
            true,
            mode.read,
            &logs,
        )
    });

    pg.psql("app", change);
    let changed_at = lsn_now(pg);
    let lost = write(&mut client, slot, &aggs, LOST, &[1], 0).await;
    assert_eq!(lost.len(), LOST);
    let written = lsn_now(pg);
    // Today's failure: the slot moves past the lost events, nothing halts.
    tokio::task::block_in_place(|| {
        wait_for(
            "a halt, or the slot passing the lost events",
            Duration::from_secs(30),
            || readyz(port).0 == 503 || confirmed_lsn(pg, slot) >= written,
        )
    });
    // Give a wrong confirmation time to happen.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let confirmed = confirmed_lsn(pg, slot);
    assert!(
        confirmed < changed_at,
        "{LOST} of {LOST} events written after the change are lost: the slot confirmed {confirmed}, \
         past the change at {changed_at} (writes ended at {written}); log:\n{}",
        relay.log()
    );
    Halted {
        _e: e,
        relay,
        port,
        changed_at,
    }
}

pub(super) fn readyz(port: u16) -> (u16, String) {
    get(port, "/readyz").unwrap_or((0, "no answer".into()))
}

/// The halt is visible where operators look, naming the change (one of
/// `changes`) and the recovery.
pub(super) fn assert_halted(h: &Halted, changes: &[&str], needles: &[&str]) {
    let (status, reason) = readyz(h.port);
    assert_eq!(status, 503, "{reason}\nlog:\n{}", h.relay.log());
    eprintln!("/readyz: {reason}");
    assert!(
        changes.iter().any(|c| reason.contains(c)),
        "none of {changes:?} in /readyz: {reason}\nlog:\n{}",
        h.relay.log()
    );
    for n in needles.iter().chain(&[
        "\"public\".\"outbox\"",
        "re-publish the outbox rows committed since",
    ]) {
        assert!(reason.contains(n), "{n:?} not in /readyz: {reason}");
    }
    assert_eq!(Scrape::take(h.port).value("outboxd_halted", ""), 1.0);
    assert!(h.relay.log().contains("relay halted"), "{}", h.relay.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_and_recreated_table_halts_before_its_events() {
    let h = change_under_the_relay("recreated", RECREATE_OUTBOX).await;
    // Seen between the two statements, or after both.
    assert_halted(
        &h,
        &["was dropped or renamed", "was replaced"],
        &["ADD TABLE \"public\".\"outbox\""],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renamed_table_with_a_new_one_in_its_place_halts_before_its_events() {
    let h = change_under_the_relay("renamed", RENAME_OUTBOX).await;
    assert_halted(
        &h,
        &["was dropped or renamed", "was replaced"],
        &["ADD TABLE \"public\".\"outbox\""],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_removed_from_the_publication_halts_before_its_events() {
    let h = change_under_the_relay("unpublished", UNPUBLISH_OUTBOX).await;
    assert_halted(
        &h,
        &["left the publication"],
        &["ADD TABLE \"public\".\"outbox\""],
    );
    // Still halted (not reconnecting into the same loss) a while later.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(readyz(h.port).0, 503);
}

/// Out of the publication for a moment, with events written meanwhile:
/// they are lost although the table is back when the watch looks (if the
/// watch looked in between, it saw it out).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_removed_and_added_again_halts_before_its_events() {
    let h = change_under_the_relay(
        "republished",
        "ALTER PUBLICATION outboxd DROP TABLE outbox; \
         INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
           SELECT 'order', 'o-gap', 'order.happened', '{}' FROM generate_series(1, 20); \
         ALTER PUBLICATION outboxd ADD TABLE outbox",
    )
    .await;
    assert_halted(
        &h,
        &[
            "was removed from the publication and added again",
            "left the publication",
        ],
        &["ADD TABLE \"public\".\"outbox\""],
    );
}

/// A session that starts after the table changed judges it against what
/// the process's first session found, not against its own first look.
/// Here the outbox table is renamed, a new one created, written to, then
/// published, and the replication connection is cut at once, before the
/// watch's next look (looks 2 s apart): the next session finds a published
/// table. Before, it took that table for the configured one and confirmed
/// past the events written before it was published (or, unpublished, named
/// another change: the exactly-once relay's one-off CI failure).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_started_after_the_table_was_replaced_still_halts_before_its_events() {
    let slot = "replaced_reconnect";
    let port = free_port();
    let e = env(
        shared().bootstrap(),
        slot,
        &format!(
            "[metrics]\nlisten = \"127.0.0.1:{port}\"\n\
             [relay]\nreconnect_backoff_min = \"100ms\"\n"
        ),
    );
    edit_config(
        &e,
        "status_interval = \"200ms\"",
        "status_interval = \"8s\"",
    );
    let relay = Relay::start(&e);
    let aggs = aggregates(4);
    let pg = &e.pg;
    let mut client = pg.client("app").await;
    let sent = write(&mut client, slot, &aggs, 10, &[5], 0).await;
    verify_env(&e, &sent, Duration::from_secs(60));

    let changed_at = lsn_now(pg);
    pg.psql(
        "app",
        &format!(
            "{RENAME_OUTBOX}; INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             SELECT 'order', 'o-gap', 'order.happened', '{{}}' FROM generate_series(1, {LOST})"
        ),
    );
    pg.psql("app", "ALTER PUBLICATION outboxd ADD TABLE outbox");
    // Cut, and the time right after it: any look that found the table
    // intact was before the change, so before this.
    let cut = pg.psql(
        "app",
        &format!(
            "SELECT n || '|' || clock_timestamp()::text FROM (SELECT \
             count(pg_terminate_backend(active_pid)) AS n FROM pg_replication_slots \
             WHERE slot_name = '{slot}') c"
        ),
    );
    let (killed, cut_time) = cut.trim().split_once('|').unwrap();
    assert_eq!(killed, "1", "{}", relay.log());
    let written = lsn_now(pg);
    // Published again: what is written now is in the stream, and moves it.
    write(&mut client, slot, &aggs, 5, &[5], 0).await;

    // The halt of the session that started after the cut (an earlier one,
    // had the old session's watch looked first, is cleared by the restart).
    let halted_after_the_cut = || {
        let log = relay.log();
        let cut_at = log.find("relay interrupted; resuming from the slot");
        let halt_at = log.rfind("relay halted");
        matches!((cut_at, halt_at), (Some(c), Some(h)) if h > c) && readyz(port).0 == 503
    };
    tokio::task::block_in_place(|| {
        wait_for(
            "a halt after the reconnect, or the slot passing the lost events",
            Duration::from_secs(60),
            || halted_after_the_cut() || confirmed_lsn(pg, slot) >= written,
        )
    });
    // Give a wrong confirmation time to happen (a status interval).
    tokio::time::sleep(Duration::from_secs(9)).await;
    let confirmed = confirmed_lsn(pg, slot);
    assert!(
        confirmed < written,
        "{LOST} events written before the new table was published are lost: the slot confirmed \
         {confirmed}, past them (changed at {changed_at}, written by {written}); log:\n{}",
        relay.log()
    );
    // The rows to re-publish are named from the last look before the
    // change (the old session's), not from the new session's first, which
    // was after the cut.
    let (_, reason) = readyz(port);
    let since = reason
        .split("committed since ")
        .nth(1)
        .and_then(|rest| rest.split(" (WAL position").next())
        .unwrap_or_else(|| panic!("no time in the halt: {reason}"));
    let before = pg.psql(
        "app",
        &format!("SELECT timestamptz '{since}' < timestamptz '{cut_time}'"),
    );
    assert_eq!(
        before.trim(),
        "t",
        "the halt names rows since {since}, after the cut at {cut_time}: {reason}\nlog:\n{}",
        relay.log()
    );
    let h = Halted {
        _e: e,
        relay,
        port,
        changed_at,
    };
    assert_halted(&h, &["was replaced"], &["ADD TABLE \"public\".\"outbox\""]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_watch_connection_is_no_table_change() {
    let port = free_port();
    let e = env(
        shared().bootstrap(),
        "watchconn",
        &format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n"),
    );
    let relay = Relay::start(&e);
    let pg = &e.pg;
    tokio::task::block_in_place(|| {
        wait_for("ready", Duration::from_secs(60), || readyz(port).0 == 200)
    });
    // The table watch's SQL connection, cut.
    let killed = pg.psql(
        "app",
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
         WHERE application_name = 'outboxd-watch-sql'",
    );
    assert_eq!(killed.trim(), "1", "{}", relay.log());
    let aggs = aggregates(4);
    let mut client = pg.client("app").await;
    let sent = write(&mut client, "watchconn", &aggs, 10, &[5], 0).await;
    let written = lsn_now(pg);
    tokio::task::block_in_place(|| {
        wait_for(
            "confirmation past the writes",
            Duration::from_secs(60),
            || confirmed_lsn(pg, "watchconn") >= written,
        )
    });
    assert_eq!(readyz(port).0, 200, "{}", relay.log());
    // The cut was noticed, and the watch reconnected.
    let log = relay.log();
    assert!(
        log.contains("table watch: its SQL connection closed; reconnecting"),
        "{log}"
    );
    // However the client saw the cut (the FATAL, or the connection found
    // closed first), it is no outage of the watch.
    assert!(
        !log.contains("table watch: cannot look at the outbox table"),
        "{log}"
    );
    verify_env(&e, &sent, Duration::from_secs(60));
}

/// An instance that streamed the slot, lost it to a standby and now stands
/// by itself, takes over later judging the tables by what it finds then,
/// not by what it found when it last streamed: another instance has
/// streamed meanwhile and a table change may have been met and recovered
/// from there. Here the other instance halts on a re-created table, the
/// operator follows its recovery (the new table added to the publication,
/// that instance stopped), and the first one takes over and relays. Before,
/// it halted naming a replaced table, the one the operator had just
/// published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_that_streamed_before_takes_over_after_a_recovered_table_change() {
    let slot = "baseline_takeover";
    let e = env(
        shared().bootstrap(),
        slot,
        "[relay]\nreconnect_backoff_min = \"100ms\"\nstandby_poll_interval = \"200ms\"\n",
    );
    let (port_a, port_b) = (free_port(), free_port());
    let pg = &e.pg;
    let a = start_on_port(&e, port_a);
    let aggs = aggregates(4);
    let mut client = pg.client("app").await;
    let mut sent = write(&mut client, slot, &aggs, 10, &[5], 0).await;
    tokio::task::block_in_place(|| {
        wait_for(
            "the first batch confirmed",
            Duration::from_secs(120),
            || confirmed_lsn(pg, slot) >= lsn_now(pg),
        )
    });
    let b = start_on_port(&e, port_b);
    let standing_by = |port: u16| {
        readyz_until(port, Duration::from_secs(60), |_, body| {
            body.starts_with("standby")
        })
    };
    tokio::task::block_in_place(|| assert!(standing_by(port_b).is_some(), "{}", b.log()));

    // A loses the slot to B: paused, its walsender ended, then woken to
    // find B streaming, so it stands by in turn.
    a.signal("-STOP");
    pg.psql(
        "app",
        &format!(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
             WHERE slot_name = '{slot}'"
        ),
    );
    let b_ready = tokio::task::block_in_place(|| {
        readyz_until(port_b, Duration::from_secs(60), |s, _| s == 200)
    });
    a.signal("-CONT");
    assert_eq!(b_ready.map(|r| r.0), Some(200), "{}", b.log());
    let a_waits = tokio::task::block_in_place(|| standing_by(port_a));
    assert!(
        a_waits
            .as_ref()
            .is_some_and(|(_, body)| body.starts_with("standby")),
        "{a_waits:?}\n{}",
        a.log()
    );

    // B halts on the re-created table; the operator publishes it and stops B.
    pg.psql("app", RECREATE_OUTBOX);
    let b_halted = tokio::task::block_in_place(|| {
        readyz_until(port_b, Duration::from_secs(30), |s, body| {
            s == 503 && body.contains("halted")
        })
    });
    assert!(
        b_halted.as_ref().is_some_and(|(s, _)| *s == 503),
        "{b_halted:?}\n{}",
        b.log()
    );
    pg.psql("app", "ALTER PUBLICATION outboxd ADD TABLE outbox");
    let mut b = b;
    b.signal("-TERM");
    assert!(b.wait(Duration::from_secs(30)).is_some(), "{}", b.log());

    // A takes over and relays what is written now.
    let a_ready = tokio::task::block_in_place(|| {
        readyz_until(port_a, Duration::from_secs(60), |s, _| s == 200)
    });
    assert_eq!(
        a_ready.as_ref().map(|r| r.0),
        Some(200),
        "{a_ready:?}\n{}",
        a.log()
    );
    sent.extend(write(&mut client, slot, &aggs, 10, &[5], 0).await);
    let v = verify_env(&e, &sent, Duration::from_secs(60));
    let (status, body) = readyz(port_a);
    assert_eq!(status, 200, "{body}\n{}", a.log());
    assert!(!a.log().contains("relay halted"), "{}", a.log());
    eprintln!(
        "B halted on the re-created table ({}); after the recovery A took over and \
         relayed {} of {} events, /readyz {status}",
        b_halted.map(|(_, body)| body).unwrap_or_default(),
        v.delivered,
        sent.len()
    );
}
