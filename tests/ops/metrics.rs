//! The metrics and health endpoint of `outboxd run`, scraped over HTTP while
//! it relays between a real PostgreSQL and a real Kafka broker: every metric
//! the README documents is exported, counts match what was written, and
//! lag, stall and readiness follow a paused broker and its recovery.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::harness::events::{aggregates, payload_texts, verify, write};
use crate::harness::http::{free_port, get, Scrape};
use crate::harness::kafka::{session_outlasting, shared, KafkaBroker};
use crate::harness::relay::{env, env_with_broker_props, lsn_now, Relay};
use crate::harness::wait::{last_lines, wait_for, wait_for_or};

const MIB: f64 = 1024.0 * 1024.0;

/// Every metric name in the README's "### Metrics" table.
pub(crate) fn documented_metrics() -> BTreeSet<String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let section = readme
        .split("### Metrics")
        .nth(1)
        .expect("a ### Metrics section")
        .split("\n#")
        .next()
        .unwrap();
    let mut names = BTreeSet::new();
    for row in section.lines().filter(|l| l.starts_with("| `")) {
        let first_cell = row.split('|').nth(1).unwrap();
        for (i, part) in first_cell.split('`').enumerate() {
            if i % 2 == 1 && (part.starts_with("outboxd_") || part.starts_with("debezium_")) {
                names.insert(part.to_string());
            }
        }
    }
    assert!(names.len() > 30, "few metrics found in README: {names:?}");
    names
}

fn readyz(port: u16) -> (u16, String) {
    get(port, "/readyz").unwrap_or((0, "no answer".into()))
}

/// When each step of a test was reached, counted from its start.
struct Timeline {
    start: Instant,
    marks: RefCell<Vec<String>>,
}

impl Timeline {
    fn new() -> Timeline {
        Timeline {
            start: Instant::now(),
            marks: RefCell::new(Vec::new()),
        }
    }

    fn mark(&self, what: &str) {
        let at = self.start.elapsed().as_secs_f64();
        self.marks.borrow_mut().push(format!("{what} {at:.1}s"));
    }

    fn show(&self) -> String {
        self.marks.borrow().join(", ")
    }
}

/// The series a failed wait of the paused-broker test turns on.
const WATCHED: [&str; 9] = [
    "outboxd_events_published_total",
    "outboxd_in_flight_events ",
    "outboxd_stall_seconds",
    "outboxd_connected",
    "outboxd_slot_lag_bytes",
    "outboxd_server_lsn",
    "outboxd_confirmed_lsn",
    "outboxd_delivery_failures_total",
    "outboxd_reconnects_total",
];

/// What the relay's endpoint, its log and the broker's log showed: ends a
/// failure message, so a run that failed once says which part was late.
/// The short lines come last: CI shows the end of a long message.
fn showing(port: u16, relay: &Relay, broker: &KafkaBroker, timeline: &str) -> String {
    let scrape = get(port, "/metrics").map_or("no answer".into(), |(_, body)| {
        body.lines()
            .filter(|l| !l.starts_with('#') && WATCHED.iter().any(|w| l.starts_with(w)))
            .collect::<Vec<_>>()
            .join("\n")
    });
    format!(
        "relay log (tail):\n{}\nbroker log (tail):\n{}\nmetrics:\n{scrape}\n/readyz: {:?}\ntimeline: {timeline}",
        last_lines(&relay.log(), 25),
        last_lines(&broker.log(), 10),
        readyz(port),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_and_readiness_follow_a_paused_broker_and_its_recovery() {
    let port = free_port();
    // A short message timeout turns the pause into a delivery failure and a
    // reconnect, so the failure series show up too.
    let extra = format!(
        "[relay]\nmax_in_flight_events = 5000\nreconnect_backoff_max = \"2s\"\n\
         [kafka.properties]\n\"message.timeout.ms\" = \"15000\"\n\
         [metrics]\nlisten = \"127.0.0.1:{port}\"\nslot_sample_interval = \"1s\"\n\
         stall_threshold = \"3s\"\ndebezium_aliases = true\n"
    );
    // Paused through the checks of the stall below, which allow it up to
    // about 100 s (15 s until the message timeout, usually): a hung broker,
    // not a fenced one.
    let (broker, e) = tokio::task::block_in_place(|| {
        env_with_broker_props(
            "opsmetrics",
            &extra,
            &session_outlasting(Duration::from_secs(110)),
        )
    });
    let relay = Relay::start(&e);
    let log = || relay.log();
    let timeline = Timeline::new();
    let wait = |what: &str, timeout: Duration, cond: &mut dyn FnMut() -> bool| {
        wait_for_or(what, timeout, cond, || {
            showing(port, &relay, &broker, &timeline.show())
        });
        timeline.mark(what);
    };
    tokio::task::block_in_place(|| {
        wait("/healthz", Duration::from_secs(60), &mut || {
            get(port, "/healthz") == Some((200, "ok\n".into()))
        })
    });
    // Logical messages under another prefix are filtered, and counted.
    e.pg.psql(
        "app",
        "SELECT pg_logical_emit_message(true, 'not-outbox', 'x') FROM generate_series(1, 3)",
    );
    let mut client = e.pg.client("app").await;
    let aggs = aggregates(10);
    let mut sent = write(&mut client, "opsmetrics", &aggs, 300, &[1, 10, 50], 0).await;

    let quiet = tokio::task::block_in_place(|| {
        wait(
            "300 events published",
            Duration::from_secs(120),
            &mut || Scrape::take(port).get("outboxd_events_published_total", "") == Some(300.0),
        );
        wait("ready", Duration::from_secs(30), &mut || {
            readyz(port).0 == 200
        });
        // slot_active = 1: a sample taken since the stream started.
        wait(
            "lag near 0 and no stall",
            Duration::from_secs(60),
            &mut || {
                let s = Scrape::take(port);
                s.get("outboxd_slot_active", "") == Some(1.0)
                    && s.get("outboxd_slot_lag_bytes", "").is_some_and(|v| v < MIB)
                    && s.value("outboxd_stall_seconds", "") == 0.0
                    && s.value("outboxd_in_flight_events", "") == 0.0
            },
        );
        Scrape::take(port)
    });
    let v = |name: &str, label: &str| quiet.value(name, label);
    assert_eq!(v("outboxd_events_seen_total", ""), 300.0);
    assert_eq!(v("outboxd_wal_receive_to_ack_seconds_count", ""), 300.0);
    assert_eq!(v("outboxd_commit_to_ack_seconds_count", ""), 300.0);
    assert_eq!(
        v(
            "outboxd_events_filtered_total",
            "reason=\"other_prefix_message\""
        ),
        3.0,
        "relay log:\n{}",
        log()
    );
    assert_eq!(v("outboxd_in_flight_events_limit", ""), 5000.0);
    assert_eq!(v("outboxd_in_flight_bytes_limit", ""), 64.0 * MIB);
    let version = format!("version=\"{}\"", env!("CARGO_PKG_VERSION"));
    assert_eq!(v("outboxd_build_info", &version), 1.0);
    assert_eq!(v("outboxd_connected", "side=\"postgres\""), 1.0);
    assert_eq!(v("outboxd_connected", "side=\"kafka\""), 1.0);
    assert_eq!(v("outboxd_slot_active", ""), 1.0);
    assert_eq!(v("outboxd_slot_wal_status", "status=\"reserved\""), 1.0);
    assert_eq!(
        v("outboxd_slot_wal_status", ""),
        1.0,
        "one status at a time"
    );
    // Sampled a moment apart from the relay's own gauge: compare loosely.
    assert!(v("outboxd_server_lsn", "") > 0.0 && v("outboxd_confirmed_lsn", "") > 0.0);
    assert!(v("outboxd_slot_retained_wal_bytes", "") >= v("outboxd_slot_lag_bytes", ""));
    let dbz = "name=\"opsmetrics\"";
    assert_eq!(v("debezium_metrics_TotalNumberOfEventsSeen", dbz), 300.0);
    assert_eq!(v("debezium_metrics_QueueRemainingCapacity", dbz), 5000.0);
    assert_eq!(v("debezium_metrics_Connected", dbz), 1.0);
    assert!(v("debezium_metrics_MilliSecondsBehindSource", dbz) >= 0.0);
    assert!(v("debezium_metrics_MilliSecondsSinceLastEvent", dbz) >= 0.0);

    // A hung broker: events pile up in flight, the position stops, the lag
    // grows and /readyz fails within the stall threshold.
    broker.pause();
    let paused_at = Instant::now();
    timeline.mark("paused");
    // One commit: the message timeout runs from the first event's send, so
    // a write slowed by a busy disk must not eat into the time for the
    // checks of the stall below.
    sent.extend(write(&mut client, "opsmetrics", &aggs, 200, &[200], 0).await);
    let wal_after = lsn_now(&e.pg);
    timeline.mark("written");
    let context = || showing(port, &relay, &broker, &timeline.show());
    tokio::task::block_in_place(|| {
        wait("events in flight", Duration::from_secs(10), &mut || {
            Scrape::take(port).value("outboxd_in_flight_events", "") > 0.0
        });
        wait("/readyz 503", Duration::from_secs(15), &mut || {
            readyz(port).0 == 503
        });
        let (_, reason) = readyz(port);
        assert!(
            reason.starts_with("stalled") && reason.lines().count() == 1,
            "{reason}\n{}",
            context()
        );
        // 3 s threshold, checked on every request: well within 12 s, before the
        // 15 s message timeout turns it into a Kafka outage.
        assert!(
            paused_at.elapsed() < Duration::from_secs(12),
            "/readyz failed {:?} after the pause\n{}",
            paused_at.elapsed(),
            context()
        );
        let first = Scrape::take(port).value("outboxd_stall_seconds", "");
        std::thread::sleep(Duration::from_millis(1500));
        let second = Scrape::take(port).value("outboxd_stall_seconds", "");
        assert!(
            first >= 3.0 && second > first,
            "stall {first} then {second}\n{}",
            context()
        );
        // A sample taken after the writes shows them as lag: the slot is
        // held before the commit of the unacknowledged transaction, and
        // the lag covers at least what lies between the confirmed position
        // and the end of that commit. Not "most of the WAL since
        // `wal_before`": a keepalive may rightly confirm WAL written before
        // the transaction's commit by others (an autoanalyze, a prune
        // record with a full-page image) or inside its span, as decoding
        // sends every transaction that commits past the confirmed position;
        // the stability run once saw 27,024 bytes of lag against
        // "0.9 x written" with the slot held (resumed from 0/194FFE8, the
        // commit at 0/1956948).
        wait("lag to grow", Duration::from_secs(15), &mut || {
            let s = Scrape::take(port);
            let confirmed = s.value("outboxd_confirmed_lsn", "");
            s.value("outboxd_server_lsn", "") >= wal_after.0 as f64
                && confirmed < wal_after.0 as f64
                && s.value("outboxd_slot_lag_bytes", "") >= wal_after.0 as f64 - confirmed
        });
        // Past message.timeout.ms the delivery fails and Kafka counts as down.
        wait("a delivery failure", Duration::from_secs(60), &mut || {
            let s = Scrape::take(port);
            s.get("outboxd_delivery_failures_total", "").unwrap_or(0.0) > 0.0
                && s.value("outboxd_connected", "side=\"kafka\"") == 0.0
        });
    });
    broker.resume();
    timeline.mark("resumed");
    tokio::task::block_in_place(|| {
        wait(
            "/readyz 200 after the resume",
            Duration::from_secs(120),
            &mut || readyz(port).0 == 200,
        );
        wait(
            "all 500 published, caught up",
            Duration::from_secs(120),
            &mut || {
                let s = Scrape::take(port);
                s.value("outboxd_events_published_total", "") >= 500.0
                    && s.value("outboxd_stall_seconds", "") == 0.0
                    && s.get("outboxd_slot_lag_bytes", "").is_some_and(|v| v < MIB)
            },
        );
        // librdkafka statistics come every 5 s.
        wait("broker round trips", Duration::from_secs(30), &mut || {
            Scrape::take(port)
                .get("outboxd_kafka_broker_rtt_seconds", "")
                .is_some()
        });
    });
    let after = Scrape::take(port);
    assert!(after.value("outboxd_reconnects_total", "") >= 1.0);
    let missing: Vec<String> = documented_metrics()
        .difference(&after.names())
        .cloned()
        .collect();
    assert!(
        missing.is_empty(),
        "documented but not exported: {missing:?}"
    );
    assert!(
        log().contains("Kafka outage ended after"),
        "{}",
        last_lines(&log(), 40)
    );
    let logs = e.dir.path().to_path_buf();
    let texts = payload_texts(&e.pg);
    let b = &broker;
    let verdict = tokio::task::block_in_place(|| {
        verify(b, &sent, &texts, Duration::from_secs(120), true, &logs)
    });
    assert_eq!(verdict.delivered, 500);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_defaults_no_debezium_aliases_and_plain_http_answers() {
    let broker = shared();
    let port = free_port();
    let extra = format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n");
    let e = env(broker.bootstrap(), "opsdefaults", &extra);
    let _relay = Relay::start(&e);
    let mut client = e.pg.client("app").await;
    write(&mut client, "opsdefaults", &aggregates(4), 20, &[5], 0).await;
    tokio::task::block_in_place(|| {
        wait_for("20 events published", Duration::from_secs(120), || {
            get(port, "/metrics").is_some()
                && Scrape::take(port).get("outboxd_events_published_total", "") == Some(20.0)
        });
        wait_for("ready", Duration::from_secs(30), || {
            readyz(port) == (200, "ready\n".into())
        });
    });
    let (_, body) = get(port, "/metrics").unwrap();
    assert!(!body.contains("debezium_"), "aliases are off by default");
    assert!(body.contains("# TYPE outboxd_wal_receive_to_ack_seconds histogram"));
    assert!(body.contains("# HELP outboxd_slot_lag_bytes"));
    assert_eq!(get(port, "/nope").map(|r| r.0), Some(404));
}
