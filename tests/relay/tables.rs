//! Several outbox tables in one relay (`[[outbox]]`): two tables in two
//! schemas, with different column names and routing, written by concurrent
//! transactions that insert into both. One slot, one publication; each
//! event goes to its own table's topic with its own mapping, in per-key
//! order; the metrics carry a `table` label; `check` covers both tables.

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::harness::http::{free_port, get, Scrape};
use crate::harness::kafka::{shared, Record};
use crate::harness::outboxd::{bin, wait_with_timeout};
use crate::harness::relay::{confirmed_lsn, env, lsn_now, slot_active, Env, Relay};
use crate::harness::wait::wait_for;

const WRITERS: usize = 4;
const TXNS_PER_WRITER: usize = 60;
/// Keys per writer: a key is written by one writer only, so its commit
/// order is the order that writer wrote it.
const KEYS_PER_WRITER: usize = 3;

const TABLES: &str = "\
    CREATE SCHEMA orders; \
    CREATE TABLE orders.outbox (id uuid PRIMARY KEY DEFAULT gen_random_uuid(), \
        aggregate_type text NOT NULL, aggregate_id text NOT NULL, event_type text NOT NULL, \
        payload jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now()); \
    CREATE SCHEMA billing; \
    CREATE TABLE billing.events (event_id uuid PRIMARY KEY DEFAULT gen_random_uuid(), \
        account text NOT NULL, kind text NOT NULL, body jsonb NOT NULL); \
    DROP PUBLICATION outboxd";

fn tables_env(slot: &str, metrics_port: u16) -> Env {
    let extra = format!(
        "[metrics]\nlisten = \"127.0.0.1:{metrics_port}\"\n\
         [routing]\ntopic = \"{slot}.orders.${{aggregate_type}}\"\n\
         [[outbox]]\ntable = \"orders.outbox\"\n\
         [[outbox]]\ntable = {{ schema = \"billing\", name = \"events\" }}\n\
         [outbox.columns]\nid = \"event_id\"\nkey = \"account\"\naggregate_type = \"kind\"\n\
         event_type = \"kind\"\npayload = \"body\"\n\
         [outbox.routing]\ntopic = \"{slot}.billing\"\nadditional_headers = {{ kind = \"kind\" }}\n"
    );
    let e = env(shared().bootstrap(), slot, &extra);
    e.pg.psql("app", TABLES);
    e
}

/// Each writer commits transactions that insert one row in each table,
/// with a per-key sequence number in the payload. Returns the rows'
/// `(key, seq)` per table, by event id.
async fn write_both(e: &Env) -> [HashMap<String, (String, u64)>; 2] {
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let client = e.pg.client("app").await;
        tasks.push(tokio::spawn(async move {
            let mut client = client;
            let mut rows = [Vec::new(), Vec::new()];
            for n in 0..TXNS_PER_WRITER {
                let k = n % KEYS_PER_WRITER;
                let seq = (n / KEYS_PER_WRITER) as u64;
                let (order, account) = (format!("o{w}-{k}"), format!("a{w}-{k}"));
                let tx = client.transaction().await.unwrap();
                let body = serde_json::json!({ "seq": seq });
                let o = tx
                    .query_one(
                        "INSERT INTO orders.outbox (aggregate_type, aggregate_id, event_type, payload) \
                         VALUES ('order', $1, 'OrderPlaced', $2) RETURNING id::text",
                        &[&order, &body],
                    )
                    .await
                    .unwrap();
                let b = tx
                    .query_one(
                        "INSERT INTO billing.events (account, kind, body) VALUES ($1, 'Charged', $2) \
                         RETURNING event_id::text",
                        &[&account, &body],
                    )
                    .await
                    .unwrap();
                tx.commit().await.unwrap();
                rows[0].push((o.get::<_, String>(0), (order, seq)));
                rows[1].push((b.get::<_, String>(0), (account, seq)));
            }
            rows
        }));
    }
    let mut out = [HashMap::new(), HashMap::new()];
    for t in tasks {
        let [o, b] = t.await.unwrap();
        out[0].extend(o);
        out[1].extend(b);
    }
    out
}

fn header<'a>(r: &'a Record, name: &str) -> Option<&'a str> {
    r.header(name).and_then(|v| std::str::from_utf8(v).ok())
}

/// Every written row exactly once on `records`, keyed and identified as
/// written, and per key in the order written.
fn check_table(what: &str, records: &[Record], written: &HashMap<String, (String, u64)>) {
    assert_eq!(records.len(), written.len(), "{what}: records read back");
    let mut by_key: HashMap<(String, i32), Vec<(i64, u64)>> = HashMap::new();
    for r in records {
        let id = header(r, "id").unwrap_or_else(|| panic!("{what}: a record without id"));
        let (key, seq) = written
            .get(id)
            .unwrap_or_else(|| panic!("{what}: record {id} was not written to this table"));
        assert_eq!(r.key_str(), Some(key.as_str()), "{what}: key of {id}");
        let value: serde_json::Value = serde_json::from_slice(r.value.as_deref().unwrap()).unwrap();
        assert_eq!(value["seq"].as_u64(), Some(*seq), "{what}: value of {id}");
        by_key
            .entry((key.clone(), r.partition))
            .or_default()
            .push((r.offset, *seq));
    }
    let ids: std::collections::HashSet<_> = records.iter().map(|r| header(r, "id")).collect();
    assert_eq!(ids.len(), written.len(), "{what}: duplicates");
    // One partition per key, and the sequence rising with the offset.
    let keys: std::collections::HashSet<_> = by_key.keys().map(|(k, _)| k.clone()).collect();
    assert_eq!(keys.len(), by_key.len(), "{what}: a key on two partitions");
    for ((key, _), mut seqs) in by_key {
        seqs.sort();
        let order: Vec<u64> = seqs.iter().map(|(_, s)| *s).collect();
        let want: Vec<u64> = (0..order.len() as u64).collect();
        assert_eq!(order, want, "{what}: order of key {key}");
    }
}

fn check(e: &Env) -> (Option<i32>, String) {
    let mut child = Command::new(bin())
        .args(["check", "--config"])
        .arg(&e.config)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    let status = wait_with_timeout(&mut child, Duration::from_secs(90)).expect("check finished");
    (status.code(), out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tables_written_by_the_same_transactions_are_relayed_each_by_its_mapping() {
    let slot = "twotables";
    let port = free_port();
    let e = tables_env(slot, port);
    let (code, out) = tokio::task::block_in_place(|| check(&e));
    // Before the first run the publication does not exist yet (run creates
    // it); every other check passes.
    assert!(
        out.lines()
            .all(|l| !l.starts_with("FAIL") || l.starts_with("FAIL  publication")),
        "{code:?}\n{out}"
    );
    let relay = Relay::start(&e);
    tokio::task::block_in_place(|| {
        wait_for("the relay streaming", Duration::from_secs(60), || {
            slot_active(&e.pg, slot)
        })
    });
    let written = write_both(&e).await;
    let total = WRITERS * TXNS_PER_WRITER;
    let (orders, billing) = tokio::task::block_in_place(|| {
        let t = Duration::from_secs(90);
        (
            shared().consume_all(&format!("{slot}.orders.order"), total, t),
            shared().consume_all(&format!("{slot}.billing"), total, t),
        )
    });
    check_table("orders.outbox", &orders, &written[0]);
    check_table("billing.events", &billing, &written[1]);
    // Each by its own routing: the inherited default headers for orders,
    // the entry's own for billing.
    assert_eq!(header(&orders[0], "eventType"), Some("OrderPlaced"));
    assert_eq!(header(&orders[0], "kind"), None);
    assert_eq!(header(&billing[0], "kind"), Some("Charged"));
    assert_eq!(header(&billing[0], "eventType"), None);

    // One slot, one publication holding both tables (created by run).
    assert_eq!(
        e.pg.psql("app", "SELECT count(*) FROM pg_replication_slots")
            .trim(),
        "1"
    );
    assert_eq!(
        e.pg.psql(
            "app",
            "SELECT string_agg(schemaname || '.' || tablename, ',' ORDER BY schemaname, tablename) \
             FROM pg_publication_tables WHERE pubname = 'outboxd'"
        )
        .trim(),
        "billing.events,orders.outbox",
        "log:\n{}",
        relay.log()
    );
    assert_eq!(
        e.pg.psql("app", "SELECT count(*) FROM pg_publication")
            .trim(),
        "1"
    );

    // Per-table labels on /metrics.
    tokio::task::block_in_place(|| {
        wait_for(
            "per-table published counters",
            Duration::from_secs(30),
            || {
                let s = Scrape::take(port);
                s.get("outboxd_events_published_total", "table=\"orders.outbox\"")
                    == Some(total as f64)
                    && s.get("outboxd_events_published_total", "table=\"billing.events\"")
                        == Some(total as f64)
            },
        )
    });
    let s = Scrape::take(port);
    assert_eq!(
        s.get(
            "outboxd_events_dead_lettered_total",
            "table=\"billing.events\""
        ),
        Some(0.0)
    );

    // check (with the slot free again) passes for both tables; with one out
    // of the publication, it fails naming that table and the fix, and so
    // does run.
    drop(relay);
    tokio::task::block_in_place(|| {
        wait_for("the slot released", Duration::from_secs(30), || {
            !slot_active(&e.pg, slot)
        })
    });
    let (code, out) = tokio::task::block_in_place(|| check(&e));
    assert_eq!(code, Some(0), "{out}");
    e.pg.psql("app", "ALTER PUBLICATION outboxd DROP TABLE billing.events");
    let fix = "ALTER PUBLICATION \"outboxd\" ADD TABLE \"billing\".\"events\"";
    let (code, out) = tokio::task::block_in_place(|| check(&e));
    assert_eq!(code, Some(1), "{out}");
    let fails: Vec<&str> = out.lines().filter(|l| l.starts_with("FAIL")).collect();
    assert!(
        fails.iter().any(|l| l.contains(fix)),
        "no failure naming {fix}:\n{out}"
    );
    assert!(
        fails.iter().all(|l| !l.contains("orders")),
        "orders.outbox is fine:\n{out}"
    );
    let mut relay = Relay::start(&e);
    let status = tokio::task::block_in_place(|| relay.wait(Duration::from_secs(60)))
        .unwrap_or_else(|| panic!("outboxd run kept running; log:\n{}", relay.log()));
    assert!(!status.success(), "log:\n{}", relay.log());
    assert!(relay.log().contains(fix), "log:\n{}", relay.log());
}

/// The table watch covers every table: the second table leaving the
/// publication under the running relay halts it before that table's
/// events, naming the table and the fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_second_table_leaving_the_publication_halts_the_relay() {
    let slot = "twotableswatch";
    let port = free_port();
    let e = tables_env(slot, port);
    let relay = Relay::start(&e);
    tokio::task::block_in_place(|| {
        wait_for("the relay streaming", Duration::from_secs(60), || {
            get(port, "/readyz").is_some_and(|(status, _)| status == 200)
        })
    });
    tokio::task::block_in_place(|| {
        wait_for(
            "the relay relaying both tables",
            Duration::from_secs(60),
            || {
                e.pg.psql(
                "app",
                "INSERT INTO billing.events (account, kind, body) VALUES ('a', 'Warmup', '{}'); \
                 INSERT INTO orders.outbox (aggregate_type, aggregate_id, event_type, payload) \
                 VALUES ('order', 'o', 'Warmup', '{}')",
            );
                let s = Scrape::take(port);
                s.get("outboxd_events_published_total", "table=\"billing.events\"")
                    .is_some_and(|n| n > 0.0)
                    && s.get("outboxd_events_published_total", "table=\"orders.outbox\"")
                        .is_some_and(|n| n > 0.0)
            },
        )
    });
    e.pg.psql("app", "ALTER PUBLICATION outboxd DROP TABLE billing.events");
    let changed_at = lsn_now(&e.pg);
    e.pg.psql(
        "app",
        "INSERT INTO billing.events (account, kind, body) \
         SELECT 'a', 'Lost', '{}' FROM generate_series(1, 20)",
    );
    let readyz = || get(port, "/readyz").unwrap_or((0, "no answer".into()));
    tokio::task::block_in_place(|| {
        wait_for("a halt", Duration::from_secs(30), || readyz().0 == 503)
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (_, reason) = readyz();
    for needle in [
        "\"billing\".\"events\"",
        "ALTER PUBLICATION \"outboxd\" ADD TABLE \"billing\".\"events\"",
    ] {
        assert!(
            reason.contains(needle),
            "{needle:?} not in /readyz: {reason}"
        );
    }
    let confirmed = confirmed_lsn(&e.pg, slot);
    assert!(
        confirmed < changed_at,
        "the slot confirmed {confirmed}, past the change at {changed_at}; log:\n{}",
        relay.log()
    );
}
