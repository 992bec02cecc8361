//! `outboxd backfill`: the rows still in the outbox table whose time column
//! is in the window go to Kafka as `run` sends them, plus the header
//! `outboxd.backfill: true`; a dry run sends nothing; rows the mapper
//! refuses follow `relay.on_error`; the exit code says whether everything
//! read was acknowledged.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::harness::kafka::{shared, KafkaBroker, Record};
use crate::harness::outboxd::bin;
use crate::harness::relay::{env, Env, Relay};
use crate::harness::wait::wait_for;

const HEADER: &str = "outboxd.backfill";
const SINCE: &str = "2026-12-01T10:00:00Z";
const UNTIL: &str = "2026-12-01T11:00:00Z";

/// Rows inside the window.
const INSIDE: usize = 60;

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn backfill(config: &Path, args: &[&str]) -> Run {
    let out = Command::new(bin())
        .args(["backfill", "--config"])
        .arg(config)
        .args(args)
        .env("OUTBOXD_LOG", "info")
        .output()
        .expect("run outboxd backfill");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// 3 rows before the window, [`INSIDE`] rows in it (row `i` at 10:00 +
/// i / 2 s, so pairs share a time and go by id; key `agg-{i % 4}`, type `order` for even keys, `payment` for odd ones,
/// some with a headers object), one exactly at its end (excluded: the end
/// is exclusive) and two after. Inserted newest first, so time order is not
/// insertion order.
fn write_rows(e: &Env) {
    e.pg.psql(
        "app",
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers, created_at) \
         SELECT CASE WHEN i % 4 % 2 = 0 THEN 'order' ELSE 'payment' END, 'agg-' || i % 4, 'happened', \
                jsonb_build_object('i', i, 'note', 'Grüße 🎉'), \
                CASE WHEN i % 3 = 0 THEN jsonb_build_object('trace', 't-' || i) END, \
                timestamptz '2026-12-01 10:00:00+00' + i / 2 * interval '1 second' \
         FROM generate_series(59, 0, -1) AS i; \
         INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at) \
         SELECT 'order', 'agg-0', 'outside', jsonb_build_object('at', t), t::timestamptz \
         FROM unnest(ARRAY['2026-11-30 09:00:00+00', '2026-12-01 09:59:59.999999+00', \
                           '2026-11-01 00:00:00+00', '2026-12-01 11:00:00+00', \
                           '2026-12-01 11:00:01+00', '2026-12-02 00:00:00+00']) AS t",
    );
}

/// Ids of the rows in the window, from the table itself.
fn ids_in_window(e: &Env) -> HashSet<String> {
    e.pg.psql(
        "app",
        &format!("SELECT id FROM outbox WHERE created_at >= '{SINCE}' AND created_at < '{UNTIL}'"),
    )
    .lines()
    .map(|l| l.trim().to_owned())
    .filter(|l| !l.is_empty())
    .collect()
}

fn id_of(r: &Record) -> String {
    String::from_utf8(r.header("id").expect("id header").to_vec()).unwrap()
}

fn read_all(broker: &KafkaBroker, topics: &[&str], at_least: usize) -> Vec<Record> {
    let mut all = Vec::new();
    wait_for("the records to arrive", Duration::from_secs(90), || {
        all = topics
            .iter()
            .flat_map(|t| broker.consume_all(t, broker.record_count(t), Duration::from_secs(30)))
            .collect();
        all.len() >= at_least
    });
    all
}

const ENVELOPE: &str = "[routing]\ntopic = \"{slot}.${aggregate_type}\"\nvalue = \"envelope\"\n\
                        [outbox.columns]\nheaders = \"headers\"\n";

fn config(slot: &str, rest: &str) -> String {
    format!("{}{rest}", ENVELOPE.replace("{slot}", slot))
}

#[test]
fn backfill_sends_exactly_the_window_as_the_relay_did_plus_its_header() {
    let broker = shared();
    // Headers from a boolean and an inet column: their output functions
    // print `t` and `10.0.0.1`, where a `::text` cast gives `true` and
    // `10.0.0.1/32`.
    let headers = "[routing.additional_headers]\nurgent = \"urgent\"\norigin = \"origin\"\n";
    let e = env(broker.bootstrap(), "bfwin", &config("bfwin", headers));
    e.pg.psql(
        "app",
        "ALTER TABLE outbox ADD COLUMN urgent boolean NOT NULL DEFAULT true, \
         ADD COLUMN origin inet NOT NULL DEFAULT '10.0.0.1'",
    );
    let relay = Relay::start(&e);
    write_rows(&e);
    let topics = ["bfwin.order", "bfwin.payment"];
    let total = INSIDE + 6;
    // Everything relayed first, so the two copies can be told apart.
    let relayed = read_all(broker, &topics, total);
    assert_eq!(relayed.len(), total, "relay log:\n{}", relay.log());

    // Pages of 7 rows: page ends fall between rows of the same time.
    let run = backfill(
        &e.config,
        &["--since", SINCE, "--until", UNTIL, "--batch-size", "7"],
    );
    assert_eq!(
        run.code,
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        run.stdout,
        run.stderr
    );
    assert!(
        run.stdout.contains(&format!("read {INSIDE}, published {INSIDE} (bfwin.order: 30, bfwin.payment: 30), dead-lettered 0, failed 0, not sent 0")),
        "{}",
        run.stdout
    );

    let all = read_all(broker, &topics, total + INSIDE);
    let (mut backfilled, relayed): (Vec<Record>, Vec<Record>) =
        all.into_iter().partition(|r| r.header(HEADER).is_some());
    assert_eq!(relayed.len(), total, "the relay's records");
    let want = ids_in_window(&e);
    assert_eq!(want.len(), INSIDE);
    let got: HashSet<String> = backfilled.iter().map(id_of).collect();
    assert_eq!(backfilled.len(), INSIDE, "one record per row in the window");
    assert_eq!(got, want, "backfilled ids are the window's");

    let by_id: HashMap<String, &Record> = relayed.iter().map(|r| (id_of(r), r)).collect();
    for b in &backfilled {
        let r = by_id[&id_of(b)];
        assert_eq!(b.header(HEADER), Some(&b"true"[..]));
        assert_eq!(b.topic, r.topic, "topic of {}", id_of(b));
        assert_eq!(b.key, r.key, "key of {}", id_of(b));
        assert_eq!(
            b.value_str(),
            r.value_str(),
            "value bytes of {} (envelope, occurredAt from created_at)",
            id_of(b)
        );
        let mut headers = r.headers.clone();
        headers.push((HEADER.to_owned(), b"true".to_vec()));
        assert_eq!(b.headers, headers, "headers of {}", id_of(b));
    }
    for b in &backfilled {
        assert_eq!(
            b.header("urgent"),
            Some(&b"t"[..]),
            "as pgoutput prints a boolean"
        );
        assert_eq!(
            b.header("origin"),
            Some(&b"10.0.0.1"[..]),
            "as pgoutput prints inet"
        );
    }
    assert!(
        backfilled.iter().any(|b| b.header("trace").is_some()),
        "the headers column reached the records"
    );

    // Per key: Kafka order is time order (rows were inserted newest first).
    backfilled.sort_by_key(|r| (r.topic.clone(), r.partition, r.offset));
    let mut per_key: HashMap<String, Vec<u64>> = HashMap::new();
    for b in &backfilled {
        let v: serde_json::Value = serde_json::from_str(b.value_str().unwrap()).unwrap();
        let i = v["payload"]["i"]
            .as_u64()
            .expect("payload.i in the envelope");
        per_key
            .entry(b.key_str().unwrap().to_owned())
            .or_default()
            .push(i);
    }
    assert_eq!(per_key.len(), 4);
    for (key, seq) in &per_key {
        let mut sorted = seq.clone();
        sorted.sort_unstable();
        assert_eq!(seq, &sorted, "key {key}: backfilled out of time order");
    }
}

#[test]
fn dry_run_counts_per_topic_and_sends_nothing() {
    let broker = shared();
    let e = env(broker.bootstrap(), "bfdry", &config("bfdry", ""));
    write_rows(&e);
    let run = backfill(
        &e.config,
        &["--since", SINCE, "--until", UNTIL, "--dry-run"],
    );
    assert_eq!(
        run.code,
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        run.stdout,
        run.stderr
    );
    assert!(
        run.stdout
            .starts_with("backfill dry run: public.outbox rows with created_at"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains(&format!(
            "read {INSIDE}, would publish {INSIDE} (bfdry.order: 30, bfdry.payment: 30), unmappable 0"
        )),
        "{}",
        run.stdout
    );
    // Without --until: everything from --since on, the 3 rows after the window too.
    let run = backfill(&e.config, &["--since", SINCE, "--dry-run"]);
    assert!(
        run.stdout
            .contains(&format!("read {}, would publish", INSIDE + 3)),
        "{}",
        run.stdout
    );
    // An empty window is a mistake, not zero rows.
    let run = backfill(
        &e.config,
        &["--since", UNTIL, "--until", SINCE, "--dry-run"],
    );
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(
        run.stderr.contains("is not after --since"),
        "{}",
        run.stderr
    );
    std::thread::sleep(Duration::from_secs(2));
    for t in ["bfdry.order", "bfdry.payment"] {
        assert_eq!(broker.record_count(t), 0, "{t} got records from a dry run");
    }
}

/// Ten rows in the window for one key; the fifth has a headers value that
/// is no JSON object, which the mapper refuses.
fn write_with_unmappable(e: &Env) -> String {
    e.pg.psql(
        "app",
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, headers, created_at) \
         SELECT 'order', 'agg-x', 'happened', jsonb_build_object('i', i), \
                CASE WHEN i = 4 THEN '[1, 2]'::jsonb END, \
                timestamptz '2026-12-01 10:00:00+00' + i * interval '1 second' \
         FROM generate_series(0, 9) AS i",
    );
    e.pg.psql("app", "SELECT id FROM outbox WHERE payload->>'i' = '4'")
        .trim()
        .to_owned()
}

#[test]
fn unmappable_row_follows_on_error_and_the_exit_code_says_so() {
    let broker = shared();
    let dlq = "[relay]\non_error = \"dead_letter\"\ndead_letter_topic = \"bfdlq.dlq\"\n";
    let e = env(broker.bootstrap(), "bfdlq", &config("bfdlq", dlq));
    let bad = write_with_unmappable(&e);

    // dead_letter: nine published in order, the tenth to the DLQ, exit 0.
    let run = backfill(&e.config, &["--since", SINCE, "--until", UNTIL]);
    assert_eq!(
        run.code,
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        run.stdout,
        run.stderr
    );
    assert!(
        run.stdout.contains(
            "read 10, published 9 (bfdlq.order: 9), dead-lettered 1, failed 0, not sent 0"
        ),
        "{}",
        run.stdout
    );
    let sent = broker.consume_all("bfdlq.order", 9, Duration::from_secs(30));
    assert_eq!(broker.record_count("bfdlq.order"), 9);
    let numbers: Vec<u64> = sent
        .iter()
        .map(|r| {
            assert_eq!(r.header(HEADER), Some(&b"true"[..]));
            serde_json::from_str::<serde_json::Value>(r.value_str().unwrap()).unwrap()["payload"]
                ["i"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(numbers, vec![0, 1, 2, 3, 5, 6, 7, 8, 9]);
    let dead = broker.consume_all("bfdlq.dlq", 1, Duration::from_secs(30));
    assert_eq!(broker.record_count("bfdlq.dlq"), 1);
    assert_eq!(id_of(&dead[0]), bad);
    assert_eq!(dead[0].key_str(), Some("agg-x"));
    assert_eq!(dead[0].header(HEADER), Some(&b"true"[..]));
    assert_eq!(dead[0].header("outboxd.error.kind"), Some(&b"mapping"[..]));

    // stop: the four rows before it are published, then exit 1.
    let stop = e.dir.path().join("stop.toml");
    let text = std::fs::read_to_string(&e.config)
        .unwrap()
        .replace("bfdlq.${aggregate_type}", "bfstop.${aggregate_type}")
        .replace("on_error = \"dead_letter\"", "on_error = \"stop\"");
    std::fs::write(&stop, text).unwrap();
    let run = backfill(&stop, &["--since", SINCE, "--until", UNTIL]);
    assert_eq!(
        run.code,
        Some(1),
        "stdout:\n{}\nstderr:\n{}",
        run.stdout,
        run.stderr
    );
    assert!(
        run.stdout.contains(
            "read 5, published 4 (bfstop.order: 4), dead-lettered 0, failed 0, not sent 1"
        ),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("relay.on_error = \"stop\""),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains(&bad),
        "the summary names the row: {}",
        run.stdout
    );
    assert!(run.stderr.contains("backfill incomplete"), "{}", run.stderr);
    assert_eq!(broker.record_count("bfstop.order"), 4);

    // A time column that does not exist: exit 1, the flag named.
    let run = backfill(&e.config, &["--since", SINCE, "--time-column", "sent_at"]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(
        run.stderr.contains("no column `sent_at`") && run.stderr.contains("--time-column"),
        "{}",
        run.stderr
    );
    // A time PostgreSQL cannot read: exit 1, the flag named.
    let run = backfill(&e.config, &["--since", "last tuesday"]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(
        run.stderr.contains("--since \"last tuesday\""),
        "{}",
        run.stderr
    );
}

/// The number after `label` in a summary line.
fn count(summary: &str, label: &str) -> u64 {
    let rest = summary
        .split_once(label)
        .unwrap_or_else(|| panic!("no {label:?} in {summary:?}"))
        .1;
    rest.trim_start()
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number after {label:?} in {summary:?}"))
}

/// Kafka refuses records whose timestamp is too far in the future
/// (`log.message.timestamp.after.max.ms`): with the timestamp column set
/// to `created_at`, rows dated ten days ahead cannot be delivered. The
/// backfill says so, exits 1, and its counts match what Kafka holds.
#[test]
fn refused_deliveries_are_counted_and_fail_the_backfill() {
    let broker = shared();
    let e = env(
        broker.bootstrap(),
        "bffail",
        &config("bffail", "timestamp = \"created_at\"\n"),
    );
    e.pg.psql(
        "app",
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at) \
         SELECT 'order', 'agg-' || i, 'happened', jsonb_build_object('i', i), \
                CASE WHEN i < 3 THEN now() - interval '1 minute' + i * interval '1 ms' \
                     ELSE now() + interval '10 days' + i * interval '1 ms' END \
         FROM generate_series(0, 6) AS i",
    );
    let run = backfill(&e.config, &["--since", "2000-01-01T00:00:00Z"]);
    assert_eq!(
        run.code,
        Some(1),
        "stdout:\n{}\nstderr:\n{}",
        run.stdout,
        run.stderr
    );
    let s = run.stdout.trim();
    let (read, published, dead, failed, not_sent) = (
        count(s, "read"),
        count(s, "published"),
        count(s, "dead-lettered"),
        count(s, "failed"),
        count(s, "not sent"),
    );
    assert_eq!(read, 7, "{s}");
    assert!(failed >= 1, "no failure counted: {s}");
    assert!(published <= 3, "future records counted as published: {s}");
    assert_eq!(published + dead + failed + not_sent, read, "{s}");
    assert!(s.contains("stopped: "), "{s}");
    assert!(run.stderr.contains("backfill incomplete"), "{}", run.stderr);
    // What the summary calls published is what Kafka has: no record lost
    // silently, none counted twice.
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(broker.record_count("bffail.order") as u64, published, "{s}");
    eprintln!("bffail: {s}");
}

/// A row whose record is over the producer's `message.max.bytes` (1.5 MB)
/// goes to the dead-letter topic without its value, as the relay sends it;
/// the rows around it are published.
#[test]
fn oversized_row_goes_to_the_dead_letter_topic_without_its_value() {
    let broker = shared();
    let dlq = "[relay]\non_error = \"dead_letter\"\ndead_letter_topic = \"bfbig.dlq\"\n";
    let e = env(broker.bootstrap(), "bfbig", &config("bfbig", dlq));
    e.pg.psql(
        "app",
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, created_at) \
         SELECT 'order', 'agg-1', 'happened', \
                CASE WHEN i = 1 THEN (SELECT jsonb_build_object('blob', string_agg(md5(n::text), '')) \
                                      FROM generate_series(1, 48000) n) \
                     ELSE jsonb_build_object('i', i) END, \
                timestamptz '2026-12-01 10:00:00+00' + i * interval '1 second' \
         FROM generate_series(0, 2) AS i",
    );
    let big =
        e.pg.psql("app", "SELECT id FROM outbox WHERE payload ? 'blob'");
    let run = backfill(&e.config, &["--since", SINCE, "--until", UNTIL]);
    assert_eq!(
        run.code,
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        run.stdout,
        run.stderr
    );
    assert!(
        run.stdout.contains(
            "read 3, published 2 (bfbig.order: 2), dead-lettered 1, failed 0, not sent 0"
        ),
        "{}",
        run.stdout
    );
    let dead = broker.consume_all("bfbig.dlq", 1, Duration::from_secs(30));
    assert_eq!(broker.record_count("bfbig.dlq"), 1);
    assert_eq!(id_of(&dead[0]), big.trim());
    assert_eq!(dead[0].value, None, "the value is left out");
    assert!(dead[0].header("outboxd.original.value_size").is_some());
    assert_eq!(dead[0].header("outboxd.error.kind"), Some(&b"delivery"[..]));
    assert_eq!(dead[0].header(HEADER), Some(&b"true"[..]));
    assert_eq!(broker.record_count("bfbig.order"), 2);
}

/// On a terminal (a pty from `script`) the backfill draws a progress bar
/// on stderr; piped, as in every other test here, it draws none. The
/// summary line comes either way.
#[test]
fn progress_bar_only_on_a_terminal() {
    let broker = shared();
    let e = env(broker.bootstrap(), "bftty", &config("bftty", ""));
    write_rows(&e);
    let command = format!(
        "{} backfill --config {} --since {SINCE} --until {UNTIL} --dry-run",
        bin(),
        e.config.display()
    );
    let out = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env("OUTBOXD_LOG", "warn")
        .output()
        .expect("run script");
    let tty = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{tty}");
    assert!(
        tty.contains(&format!("/{INSIDE} rows")),
        "no progress bar:\n{tty}"
    );
    assert!(tty.contains("would publish 60"), "no summary:\n{tty}");

    let piped = backfill(
        &e.config,
        &["--since", SINCE, "--until", UNTIL, "--dry-run"],
    );
    assert!(!piped.stderr.contains(" rows ("), "{}", piped.stderr);
    assert!(
        piped.stdout.contains("would publish 60"),
        "{}",
        piped.stdout
    );
}

/// One transaction's rows share `now()`: they must go out in the order they
/// were inserted, not by id (a random uuid). Ids here descend while the
/// rows' sequence numbers ascend, so ordering by id reverses them.
#[test]
fn rows_of_one_transaction_go_out_in_insertion_order() {
    let broker = shared();
    let e = env(
        broker.bootstrap(),
        "bforder",
        "[routing]\ntopic = \"bforder.${aggregate_type}\"\n",
    );
    e.pg.psql(
        "app",
        "BEGIN; \
         INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) \
         SELECT ('00000000-0000-0000-0000-' || lpad((100 - i)::text, 12, '0'))::uuid, \
                'order', 'o-1', 'step', jsonb_build_object('seq', i) \
         FROM generate_series(1, 20) AS i; \
         COMMIT;",
    );
    let run = backfill(
        &e.config,
        &["--since=2000-01-01T00:00:00Z", "--batch-size", "6"],
    );
    assert_eq!(
        run.code,
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        run.stdout,
        run.stderr
    );
    let got = read_all(broker, &["bforder.order"], 20);
    let seqs: Vec<u64> = got
        .iter()
        .map(|r| {
            serde_json::from_str::<serde_json::Value>(r.value_str().unwrap()).unwrap()["seq"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(seqs, (1..=20).collect::<Vec<u64>>());
}
