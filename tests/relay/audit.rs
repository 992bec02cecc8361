//! `outboxd audit` against the real thing: each verdict with the right ids
//! and the right exit code. The complete range and the unpublished rows
//! (the slot advanced past them while the relay was stopped) come from the
//! relay itself; duplicates, a swapped pair and misplaced records are
//! written to Kafka by the test, as the relay would write them plus the
//! fault, so the ids are known exactly.

use std::collections::HashSet;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::ClientConfig;
use serde_json::Value;

use crate::harness::events::{aggregates, payload_texts, verify, write, Sent};
use crate::harness::kafka::{shared, KafkaBroker};
use crate::harness::outboxd::bin;
use crate::harness::relay::{env, Env, Relay};
use crate::harness::wait::wait_for;

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}\n{}", self.stdout, self.stderr))
    }
}

fn outboxd(config: &Path, command: &str, args: &[&str]) -> Run {
    let out = Command::new(bin())
        .args([command, "--config"])
        .arg(config)
        .args(args)
        .env("OUTBOXD_LOG", "warn")
        .output()
        .expect("run outboxd");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn audit(config: &Path, args: &[&str]) -> Run {
    outboxd(config, "audit", args)
}

fn audit_json(config: &Path, args: &[&str]) -> (Run, Value) {
    let mut all = args.to_vec();
    all.extend(["--format", "json"]);
    let run = audit(config, &all);
    let v = run.json();
    (run, v)
}

/// PostgreSQL's clock now, as text a `--since` takes.
fn pg_now(e: &Env) -> String {
    e.pg.psql("app", "SELECT now()::text").trim().to_owned()
}

fn ids(v: &Value) -> HashSet<String> {
    v["ids"]
        .as_array()
        .unwrap_or_else(|| panic!("no ids in {v}"))
        .iter()
        .map(|i| i.as_str().unwrap().to_owned())
        .collect()
}

fn sent_ids(sent: &[Sent]) -> HashSet<String> {
    sent.iter().map(|s| s.id.clone()).collect()
}

fn says(run: &Run, needle: &str) {
    assert!(
        run.stdout.contains(needle),
        "{needle:?} not in the report:\n{}\nstderr:\n{}",
        run.stdout,
        run.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_complete_range_exits_0_and_an_empty_or_deleted_range_says_so() {
    let broker = shared();
    let e = env(broker.bootstrap(), "audok", "");
    let since = pg_now(&e);
    let relay = Relay::start(&e);
    let mut client = e.pg.client("app").await;
    let sent = write(&mut client, "audok", &aggregates(10), 300, &[1, 10, 3], 7).await;
    let texts = payload_texts(&e.pg);
    let logs = e.dir.path().to_path_buf();
    tokio::task::block_in_place(|| {
        verify(broker, &sent, &texts, Duration::from_secs(60), true, &logs)
    });
    let until = pg_now(&e);

    let run = audit(&e.config, &["--since", &since, "--until", &until]);
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    says(&run, "rows 300, delivered 300, missing 0, duplicated 0");
    says(&run, "out of order 0, wrong key or topic 0");
    says(&run, "verdict: complete");
    says(&run, "audit: 1 table, 300 rows, 300 delivered, 0 missing");
    // Fetched 7 rows at a time (the rows of a transaction share their time
    // and span fetches): the same verdict.
    let run = audit(
        &e.config,
        &["--since", &since, "--until", &until, "--batch-size", "7"],
    );
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    says(&run, "rows 300, delivered 300, missing 0, duplicated 0");
    says(&run, "out of order 0, wrong key or topic 0");

    // On a terminal (a pty from `script`) it shows progress on stderr, and
    // still ends with the summary.
    let command = format!(
        "{} audit --config {} --since '{since}' --until '{until}'",
        bin(),
        e.config.display()
    );
    let tty = Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .env("OUTBOXD_LOG", "warn")
        .output()
        .expect("run script");
    let tty = String::from_utf8_lossy(&tty.stdout);
    assert!(tty.contains("rows of public.outbox"), "no progress:\n{tty}");
    assert!(
        tty.contains("audit: 1 table, 300 rows"),
        "no summary:\n{tty}"
    );
    assert!(
        !run.stderr.contains("rows of"),
        "progress without a terminal: {}",
        run.stderr
    );

    let (run, v) = audit_json(&e.config, &["--since", &since, "--until", &until]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    let t = &v["tables"][0];
    assert_eq!(v["delivery_mode"], "at-least-once");
    assert_eq!(v["exit_code"], 0);
    assert_eq!(t["verdict"], "complete", "{t}");
    assert_eq!(
        (t["rows"].as_u64(), t["delivered"].as_u64()),
        (Some(300), Some(300))
    );
    assert_eq!(t["missing"]["count"], 0);
    assert!(ids(&t["missing"]).is_empty());
    let mut topics: Vec<&str> = t["topics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    topics.sort_unstable();
    assert_eq!(topics, ["audok.order", "audok.payment"]);

    // A range with no rows and no records says so, and exits 0.
    let run = audit(
        &e.config,
        &[
            "--since",
            "2001-01-01T00:00:00Z",
            "--until",
            "2001-01-02T00:00:00Z",
        ],
    );
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    says(&run, "no rows in the range");

    // Events written with the insert-then-delete helper leave no rows: the
    // audit cannot compare, says why and how to keep rows, exit 3.
    let deleted_since = pg_now(&e);
    e.pg.psql(
        "app",
        "SELECT outbox_emit('order', 'ord-1', 'order.happened', jsonb_build_object('i', i)) \
         FROM generate_series(1, 20) AS i",
    );
    tokio::task::block_in_place(|| {
        wait_for("the deleted rows' records", Duration::from_secs(60), || {
            broker.record_count("audok.order")
                >= sent.iter().filter(|s| s.kind == "order").count() + 20
        })
    });
    drop(relay);
    let run = audit(&e.config, &["--since", &deleted_since]);
    assert_eq!(run.code, Some(3), "{}\n{}", run.stdout, run.stderr);
    says(&run, "cannot audit");
    says(&run, "20 records are stamped inside it");
    says(&run, "keep => true");
    says(&run, "Keeping rows to backfill from");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_the_slot_skipped_are_missing_by_id_until_a_backfill_brings_them() {
    let broker = shared();
    let slot = "audgap";
    let e = env(broker.bootstrap(), slot, "");
    let aggs = aggregates(6);
    let since = pg_now(&e);
    let mut relay = Relay::start(&e);
    let mut client = e.pg.client("app").await;
    let before = write(&mut client, slot, &aggs, 120, &[1, 5], 0).await;
    let texts = payload_texts(&e.pg);
    let logs = e.dir.path().to_path_buf();
    tokio::task::block_in_place(|| {
        verify(
            broker,
            &before,
            &texts,
            Duration::from_secs(60),
            true,
            &logs,
        );
        relay.signal("-TERM");
        assert!(
            relay
                .wait(Duration::from_secs(60))
                .is_some_and(|s| s.success()),
            "{}",
            relay.log()
        );
    });
    // Committed while the relay is stopped, then skipped: a DBA moves the
    // slot past them.
    let skipped = write(&mut client, slot, &aggs, 45, &[1, 4], 0).await;
    e.pg.psql(
        "app",
        &format!("SELECT pg_replication_slot_advance('{slot}', pg_current_wal_lsn())"),
    );
    let until = pg_now(&e);

    let (run, v) = audit_json(&e.config, &["--since", &since, "--until", &until]);
    assert_eq!(run.code, Some(1), "{}\n{}", run.stdout, run.stderr);
    let t = &v["tables"][0];
    assert_eq!(t["verdict"], "incomplete", "{t}");
    assert_eq!(
        (t["rows"].as_u64(), t["delivered"].as_u64()),
        (Some(165), Some(120))
    );
    assert_eq!(t["missing"]["count"], 45);
    assert_eq!(
        ids(&t["missing"]),
        sent_ids(&skipped),
        "the missing ids are the skipped rows"
    );
    assert_eq!(t["out_of_order"]["count"], 0);
    assert_eq!(t["duplicates"]["count"], 0);
    // The text report names the first 20 and how to get the rest.
    let run = audit(&e.config, &["--since", &since, "--until", &until]);
    assert_eq!(run.code, Some(1));
    says(&run, "rows 165, delivered 120, missing 45");
    says(&run, "and 25 more (--format json lists all)");
    says(&run, "verdict: INCOMPLETE (45 missing)");
    says(&run, "After an incident");
    let shown: Vec<&str> = run
        .stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("missing (45): "))
        .unwrap_or_else(|| panic!("no missing line:\n{}", run.stdout))
        .split(", ")
        .take(20)
        .collect();
    assert!(
        shown.iter().all(|id| sent_ids(&skipped).contains(*id)),
        "{shown:?}"
    );

    // The way back: backfill the range, then the relay goes on. The audit
    // passes, with the backfill's second copies counted apart.
    let back = outboxd(
        &e.config,
        "backfill",
        &["--since", &since, "--until", &until],
    );
    assert_eq!(back.code, Some(0), "{}\n{}", back.stdout, back.stderr);
    let relay = Relay::start(&e);
    let after = write(&mut client, slot, &aggs, 30, &[1, 3], 0).await;
    let mut all = before.clone();
    all.extend(skipped.iter().cloned());
    all.extend(after.iter().cloned());
    let texts = payload_texts(&e.pg);
    tokio::task::block_in_place(|| {
        verify(broker, &all, &texts, Duration::from_secs(60), true, &logs)
    });
    drop(relay);
    let (run, v) = audit_json(&e.config, &["--since", &since]);
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    let t = &v["tables"][0];
    assert_eq!(t["verdict"], "complete", "{t}");
    assert_eq!(
        (t["rows"].as_u64(), t["delivered"].as_u64()),
        (Some(195), Some(195))
    );
    assert_eq!(
        t["duplicates"]["count"], 0,
        "backfill copies are not the relay's duplicates"
    );
    assert_eq!(t["backfill_copies"]["count"], 120);
    assert_eq!(ids(&t["backfill_copies"]), sent_ids(&before));
    assert_eq!(t["out_of_order"]["count"], 0);
}

/// Rows for the forged cases: 40 events, ids `…0001` to `…0040`, one per
/// second from 10:00, key `agg-{i % 4}`, type `order` for even i and
/// `payment` for odd i.
fn write_rows(e: &Env) {
    e.pg.psql(
        "app",
        "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, created_at) \
         SELECT ('00000000-0000-0000-0000-' || lpad(i::text, 12, '0'))::uuid, \
                CASE WHEN i % 2 = 0 THEN 'order' ELSE 'payment' END, 'agg-' || i % 4, 'happened', \
                jsonb_build_object('i', i), \
                timestamptz '2026-12-01 10:00:00+00' + i * interval '1 second' \
         FROM generate_series(1, 40) AS i",
    );
}

fn id(i: u32) -> String {
    format!("00000000-0000-0000-0000-{i:012}")
}

/// One record as the relay would write row `i`, optionally on another
/// topic, under another key, or flagged as a backfill copy.
struct Forged {
    i: u32,
    topic: Option<String>,
    key: Option<String>,
    backfill: bool,
}

fn row(i: u32) -> Forged {
    Forged {
        i,
        topic: None,
        key: None,
        backfill: false,
    }
}

/// Writes `records` in order, each to partition `i % 4 % 3` (a key's
/// records share one), as one idempotent producer.
fn produce(broker: &KafkaBroker, prefix: &str, records: &[Forged]) {
    for t in ["order", "payment"] {
        broker.create_topic(&format!("{prefix}.{t}"), 3);
    }
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .set("enable.idempotence", "true")
        .create()
        .unwrap();
    for r in records {
        let kind = if r.i % 2 == 0 { "order" } else { "payment" };
        let topic = r.topic.clone().unwrap_or(format!("{prefix}.{kind}"));
        let key = r.key.clone().unwrap_or(format!("agg-{}", r.i % 4));
        let mut headers = rdkafka::message::OwnedHeaders::new().insert(rdkafka::message::Header {
            key: "id",
            value: Some(&id(r.i)),
        });
        if r.backfill {
            headers = headers.insert(rdkafka::message::Header {
                key: "outboxd.backfill",
                value: Some("true"),
            });
        }
        let value = format!("{{\"i\": {}}}", r.i);
        producer
            .send(
                BaseRecord::to(&topic)
                    .partition((r.i % 4 % 3) as i32)
                    .key(&key)
                    .payload(&value)
                    .headers(headers),
            )
            .unwrap_or_else(|(e, _)| panic!("produce: {e}"));
        producer.poll(Duration::ZERO);
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

const SINCE: &str = "2026-12-01T10:00:00Z";
const UNTIL: &str = "2026-12-01T11:00:00Z";

#[test]
fn records_produced_twice_pass_at_least_once_and_fail_exactly_once() {
    let broker = shared();
    let e = env(broker.bootstrap(), "auddup", "");
    write_rows(&e);
    let mut records: Vec<Forged> = (1..=40).map(row).collect();
    // 5 and 6 twice, 7 three times: the relay's own copies.
    records.extend([row(5), row(6), row(7), row(7)]);
    // A backfill copy of 8: counted apart.
    records.push(Forged {
        backfill: true,
        ..row(8)
    });
    // Extra copies of 10 under another key and of 11 on another topic.
    records.push(Forged {
        key: Some("agg-x".into()),
        ..row(10)
    });
    records.push(Forged {
        topic: Some("auddup.order".into()),
        ..row(11)
    });
    produce(broker, "auddup", &records);

    let (run, v) = audit_json(&e.config, &["--since", SINCE, "--until", UNTIL]);
    assert_eq!(run.code, Some(0), "{}\n{}", run.stdout, run.stderr);
    let t = &v["tables"][0];
    assert_eq!(t["verdict"], "complete", "{t}");
    assert_eq!(
        (t["rows"].as_u64(), t["delivered"].as_u64()),
        (Some(40), Some(40))
    );
    assert_eq!(t["duplicates"]["count"], 3);
    assert_eq!(t["duplicates"]["copies"], 4);
    assert_eq!(ids(&t["duplicates"]), HashSet::from([id(5), id(6), id(7)]));
    assert_eq!(t["backfill_copies"]["count"], 1);
    assert_eq!(ids(&t["backfill_copies"]), HashSet::from([id(8)]));
    let wrong = t["wrong_key_or_topic"]["records"].as_array().unwrap();
    assert_eq!(wrong.len(), 2, "{wrong:?}");
    assert_eq!(wrong[0]["id"], id(10));
    assert_eq!(
        (wrong[0]["key"].as_str(), wrong[0]["expected_key"].as_str()),
        (Some("agg-x"), Some("agg-2"))
    );
    assert_eq!(wrong[1]["id"], id(11));
    assert_eq!(
        (
            wrong[1]["topic"].as_str(),
            wrong[1]["expected_topic"].as_str()
        ),
        (Some("auddup.order"), Some("auddup.payment"))
    );
    assert_eq!(t["missing"]["count"], 0);
    assert_eq!(t["out_of_order"]["count"], 0);

    let run = audit(&e.config, &["--since", SINCE, "--until", UNTIL]);
    assert_eq!(run.code, Some(0));
    says(
        &run,
        "duplicated 3 (4 extra copies), backfill copies 1 (of 1 events)",
    );
    says(&run, "wrong key or topic 2");

    // Exactly-once: the relay's duplicates fail the audit, the backfill
    // copy does not.
    let (run, v) = audit_json(
        &e.config,
        &["--since", SINCE, "--until", UNTIL, "--mode", "exactly-once"],
    );
    assert_eq!(run.code, Some(1), "{}\n{}", run.stdout, run.stderr);
    assert_eq!(v["delivery_mode"], "exactly-once");
    assert_eq!(v["tables"][0]["reasons"][0], "3 duplicated (exactly-once)");
}

#[test]
fn a_keys_swapped_records_are_out_of_order_naming_both() {
    let broker = shared();
    let e = env(broker.bootstrap(), "audswap", "");
    write_rows(&e);
    // 9 and 13 (key agg-1, topic payment) swapped; everything else in order.
    let order: Vec<u32> = (1..=40)
        .map(|i| match i {
            9 => 13,
            13 => 9,
            i => i,
        })
        .collect();
    let records: Vec<Forged> = order.into_iter().map(row).collect();
    produce(broker, "audswap", &records);

    let (run, v) = audit_json(&e.config, &["--since", SINCE, "--until", UNTIL]);
    assert_eq!(run.code, Some(1), "{}\n{}", run.stdout, run.stderr);
    let t = &v["tables"][0];
    assert_eq!(t["verdict"], "incomplete", "{t}");
    assert_eq!(t["reasons"][0], "1 out of order");
    assert_eq!(t["missing"]["count"], 0);
    assert_eq!(t["duplicates"]["count"], 0);
    let late = &t["out_of_order"]["records"].as_array().unwrap();
    assert_eq!(late.len(), 1, "{late:?}");
    assert_eq!(late[0]["id"], id(9));
    assert_eq!(late[0]["after"], id(13));
    assert_eq!(late[0]["key"], "agg-1");
    assert_eq!(late[0]["topic"], "audswap.payment");

    let run = audit(&e.config, &["--since", SINCE, "--until", UNTIL]);
    assert_eq!(run.code, Some(1));
    says(&run, "out of order (1):");
    says(&run, &format!("{} (key agg-1, audswap.payment[1]", id(9)));
    says(&run, &format!("after {}, committed later", id(13)));

    // Fetched a few rows at a time, the last fetch short (3) or empty (4):
    // the rows keep their order across fetches.
    for batch in ["3", "4"] {
        let (run, v) = audit_json(
            &e.config,
            &["--since", SINCE, "--until", UNTIL, "--batch-size", batch],
        );
        assert_eq!(run.code, Some(1), "{}\n{}", run.stdout, run.stderr);
        let t = &v["tables"][0];
        assert_eq!(t["rows"].as_u64(), Some(40), "{t}");
        let late = &t["out_of_order"]["records"].as_array().unwrap();
        assert_eq!(late.len(), 1, "{late:?}");
        assert_eq!(
            (&late[0]["id"], &late[0]["after"]),
            (&id(9).into(), &id(13).into())
        );
    }
}
