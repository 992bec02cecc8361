//! Issue 11, point 3: hot standby by design. Two `outboxd run` on one slot:
//! the second stands by (quietly, not ready, `outboxd_standby` 1) and takes
//! over within 5 s of a kill -9 of the first, under load, losing nothing and
//! keeping per-key order.

use std::time::{Duration, Instant};

use super::faults::commit_end_by_id;
use crate::harness::events::{payload_texts, verify};
use crate::harness::http::{free_port, get, Scrape};
use crate::harness::kafka::shared;
use crate::harness::relay::{confirmed_lsn, env, Env, Relay};
use crate::harness::wait::wait_for;
use crate::harness::writers::Writers;

/// The acceptance bound on takeover after the active instance dies.
const TAKEOVER_BOUND: Duration = Duration::from_secs(5);

/// How long the standby waits before the kill: long enough for a growing
/// backoff (0.5 s, 1 s, 2 s, 4 s, ...) to show, and for several looks.
const STANDING_BY: Duration = Duration::from_secs(8);

pub(super) fn start_on_port(e: &Env, port: u16) -> Relay {
    let listen = format!("127.0.0.1:{port}");
    Relay::start_with_env(e, &[("OUTBOXD_METRICS__LISTEN", listen.as_str())])
}

/// Polls `/readyz` until `want(status, body)`, up to `timeout`; the last
/// answer either way.
pub(super) fn readyz_until(
    port: u16,
    timeout: Duration,
    want: impl Fn(u16, &str) -> bool,
) -> Option<(u16, String)> {
    let deadline = Instant::now() + timeout;
    let mut last = None;
    while Instant::now() < deadline {
        last = get(port, "/readyz");
        if let Some((status, body)) = &last {
            if want(*status, body) {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    last
}

fn is_warn_or_error(line: &str) -> bool {
    line.contains(" WARN ") || line.contains(" ERROR ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standby_takes_over_a_killed_active_within_5s_quietly_and_loses_nothing() {
    let broker = shared();
    let e = env(
        broker.bootstrap(),
        "standby",
        "[relay]\nmax_in_flight_events = 2000\n",
    );
    // An observer slot records each transaction's commit end LSN, so every
    // duplicate can be checked against the position the slot held at the kill.
    e.pg.psql(
        "app",
        "SELECT pg_create_logical_replication_slot('observer', 'test_decoding')",
    );
    let (port_a, port_b) = (free_port(), free_port());
    let mut active = start_on_port(&e, port_a);
    let ready_a = tokio::task::block_in_place(|| {
        readyz_until(port_a, Duration::from_secs(60), |s, _| s == 200)
    });
    assert_eq!(
        ready_a.as_ref().map(|a| a.0),
        Some(200),
        "the first instance never became ready: {ready_a:?}\n{}",
        active.log()
    );
    let standby = start_on_port(&e, port_b);
    let holder_pid = e.pg.psql(
        "app",
        "SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'standby'",
    );
    let expected = format!(
        "standby: slot \"standby\" is active on PID {}",
        holder_pid.trim()
    );
    let waiting = tokio::task::block_in_place(|| {
        readyz_until(port_b, Duration::from_secs(30), |_, body| {
            body.starts_with("standby")
        })
    });
    let standing_since = Instant::now();
    let (gauge_b, gauge_a) = tokio::task::block_in_place(|| {
        (
            Scrape::take(port_b).get("outboxd_standby", ""),
            Scrape::take(port_a).get("outboxd_standby", ""),
        )
    });

    if let Some(rest) = STANDING_BY.checked_sub(standing_since.elapsed()) {
        tokio::time::sleep(rest).await;
    }
    let still_waiting = tokio::task::block_in_place(|| get(port_b, "/readyz"));
    // Load: the active relays while writers go on through the kill and the
    // takeover.
    let start = confirmed_lsn(&e.pg, "standby");
    let writers = Writers::start(&e, "standby", &[&[1, 10, 100], &[50, 1, 300]], 40);
    let pg = &e.pg;
    tokio::task::block_in_place(|| {
        wait_for("first confirmations", Duration::from_secs(120), || {
            confirmed_lsn(pg, "standby") > start
        })
    });
    // They go on until stopped: false only if one failed.
    let writing_at_kill = writers.writing() == 2;
    active.signal("-KILL");
    let killed = Instant::now();
    assert!(active.wait(Duration::from_secs(10)).is_some());
    let at_kill = confirmed_lsn(pg, "standby");
    let after_kill = tokio::task::block_in_place(|| {
        readyz_until(port_b, Duration::from_secs(60), |s, _| s == 200)
    });
    let takeover = killed.elapsed();
    let gauge_after =
        tokio::task::block_in_place(|| Scrape::take(port_b).get("outboxd_standby", ""));

    let sent = writers.stop().await;
    let logs = e.dir.path().to_path_buf();
    let texts = payload_texts(pg);
    let v = tokio::task::spawn_blocking(move || {
        verify(broker, &sent, &texts, Duration::from_secs(240), true, &logs)
    })
    .await
    .unwrap_or_else(|err| panic!("{err:?}\nstandby log:\n{}", standby.log()));

    // The takeover resumed from the slot: re-delivered is only what the
    // dead instance had not confirmed.
    let commit_end = commit_end_by_id(pg);
    let replayed_confirmed = v
        .duplicated_ids
        .iter()
        .filter(|id| commit_end[id.as_str()] <= at_kill)
        .count();

    // The standby's own lines up to the takeover: one to say it waits, one
    // to say it took over, nothing louder than INFO.
    let log = standby.log();
    let lines: Vec<&str> = log.lines().collect();
    let took_over_at = lines.iter().position(|l| l.contains("taking over slot"));
    let wait_lines = &lines[..took_over_at.unwrap_or(lines.len())];
    let standing_by = lines.iter().filter(|l| l.contains("standing by")).count();
    let taking_over = lines
        .iter()
        .filter(|l| l.contains("taking over slot"))
        .count();
    let loud: Vec<&&str> = wait_lines.iter().filter(|l| is_warn_or_error(l)).collect();
    let report = format!(
        "standby /readyz {waiting:?} (then {still_waiting:?}), expected 503 {expected:?}; \
         outboxd_standby {gauge_b:?} on the standby, {gauge_a:?} on the active, {gauge_after:?} after; \
         takeover {takeover:?} after the kill (writers running at the kill: {writing_at_kill}), /readyz then {after_kill:?}; \
         {} delivered, {} duplicates ({replayed_confirmed} of them confirmed at the kill, {at_kill}); standby log: {standing_by} standing-by line(s), \
         {taking_over} taking-over line(s), {} WARN/ERROR line(s) while waiting",
        v.delivered,
        v.duplicates,
        loud.len()
    );
    eprintln!("hot standby: {report}");
    let ok = waiting
        .as_ref()
        .is_some_and(|(s, b)| *s == 503 && b.trim() == expected)
        && still_waiting
            .as_ref()
            .is_some_and(|(s, b)| *s == 503 && b.starts_with("standby: "))
        && gauge_b == Some(1.0)
        && gauge_a == Some(0.0)
        && gauge_after == Some(0.0)
        && after_kill.as_ref().is_some_and(|(s, _)| *s == 200)
        && takeover <= TAKEOVER_BOUND
        && writing_at_kill
        && standing_by == 1
        && taking_over == 1
        && loud.is_empty()
        && replayed_confirmed == 0;
    assert!(
        ok,
        "{report}\nWARN/ERROR while waiting: {loud:#?}\nstandby log (tail):\n{}",
        lines[lines.len().saturating_sub(40)..].join("\n")
    );
}
