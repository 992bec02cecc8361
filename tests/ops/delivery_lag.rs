//! Issue 38: a relay falling behind its writers is visible.
//! `outboxd_delivery_lag_seconds` (alert `OutboxdDeliveryLagging`, whose
//! timing `docker/prometheus/alerts_test.yml` checks) shows how late the
//! relay delivers while it works off a backlog, falls back once it caught
//! up, and is 0 when the relay is idle, so a relay that caught up does not
//! keep its last late figure.

use std::time::{Duration, Instant};

use super::prometheus::emit;
use crate::harness::http::{free_port, get, Scrape};
use crate::harness::kafka::shared;
use crate::harness::relay::{env, Relay};
use crate::harness::wait::wait_for;

const LAG: &str = "outboxd_delivery_lag_seconds";
const PUBLISHED: &str = "outboxd_events_published_total";

#[test]
fn the_delivery_lag_shows_a_backlog_falls_once_caught_up_and_is_zero_when_idle() {
    let broker = shared();
    let port = free_port();
    // A small window makes the backlog go out in a hundred round trips,
    // long enough to be scraped while it does.
    let e = env(
        broker.bootstrap(),
        "opslag",
        &format!("[relay]\nmax_in_flight_events = 20\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n"),
    );
    // A backlog in the slot (env made it), at least `AGE` old when the
    // relay starts: every one of its acknowledgements comes that late.
    const AGE: Duration = Duration::from_secs(4);
    emit(&e.pg, "opslag", 40, 50);
    let backlog = 2_000.0;
    std::thread::sleep(AGE);
    let relay = Relay::start(&e);
    // The endpoint is up before the stream opens.
    wait_for("the metrics endpoint", Duration::from_secs(30), || {
        get(port, "/metrics").is_some()
    });

    // Then a writer at a trickle, one event per poll, until 2 s after the
    // backlog went out: something stays pending while the backlog is worked
    // off, and the trickle's own events show the relay caught up.
    let started = Instant::now();
    let mut trickled = 0.0;
    let mut backlog_out: Option<Instant> = None;
    let mut seen: Vec<(f64, f64)> = Vec::new(); // (s since the start, lag)
    let mut caught_up = false;
    let deadline = started + Duration::from_secs(60);
    loop {
        assert!(
            Instant::now() < deadline,
            "lag samples (s, lag): {seen:?}\nrelay log:\n{}",
            relay.log()
        );
        let trickling = backlog_out.is_none_or(|t| t.elapsed() < Duration::from_secs(2));
        if trickling {
            emit(&e.pg, "opslag", 1, 1);
            trickled += 1.0;
        }
        let scrape = Scrape::take(port);
        let lag = scrape.value(LAG, "");
        let published = scrape.get(PUBLISHED, "").unwrap_or(0.0);
        if seen.last().map(|s| s.1) != Some(lag) {
            seen.push((started.elapsed().as_secs_f64(), lag));
        }
        if published >= backlog {
            backlog_out.get_or_insert_with(Instant::now);
            caught_up |= lag > 0.0 && lag < 1.0;
        }
        // Done once the trickle ended, all of it went out and the relay
        // says it is idle.
        if !trickling && published >= backlog + trickled && lag == 0.0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("ops::delivery_lag: samples (s since the relay's start, lag s): {seen:?}");
    let highest = seen.iter().map(|s| s.1).fold(0.0, f64::max);
    assert!(
        highest >= AGE.as_secs_f64(),
        "the backlog's acknowledgements came at least {AGE:?} after their commits, \
         the gauge showed at most {highest} s: {seen:?}"
    );
    assert!(
        caught_up,
        "once the backlog was out, the trickle's events should show under 1 s: {seen:?}"
    );
}
