//! Acceptance 1: under concurrent, messy writes `tail` yields exactly the
//! committed outbox rows, each once, in commit order, with exact values.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde_json::{json, Value};
use tokio_postgres::Client;

use super::support::{create_slot, setup, text};
use crate::harness::outboxd::tail;

#[derive(Debug, Clone)]
struct Expected {
    aggregate_id: String,
    event_type: String,
    payload: Value,
    headers: Option<Value>,
}

struct Rows {
    ids: Vec<String>,
    rows: Vec<Expected>,
}

fn rows(writer: usize, tag: &str, n: usize) -> Rows {
    let mut out = Rows {
        ids: Vec::new(),
        rows: Vec::new(),
    };
    for i in 0..n {
        out.ids.push(uuid::Uuid::new_v4().to_string());
        out.rows.push(Expected {
            aggregate_id: format!("agg-{writer}-{}", i % 7),
            event_type: format!("{tag}.happened"),
            payload: json!({"writer": writer, "tag": tag, "i": i}),
            headers: if i % 3 == 0 {
                Some(json!({"trace": format!("t{i}")}))
            } else {
                None
            },
        });
    }
    out
}

async fn insert(c: &impl tokio_postgres::GenericClient, r: &Rows) {
    let agg: Vec<&str> = r.rows.iter().map(|e| e.aggregate_id.as_str()).collect();
    let et: Vec<&str> = r.rows.iter().map(|e| e.event_type.as_str()).collect();
    let payload: Vec<String> = r.rows.iter().map(|e| e.payload.to_string()).collect();
    let headers: Vec<Option<String>> = r
        .rows
        .iter()
        .map(|e| e.headers.as_ref().map(|h| h.to_string()))
        .collect();
    c.execute(
        "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload, headers) \
         SELECT id::uuid, 'test', a, e, p::jsonb, h::jsonb \
         FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[]) AS t(id, a, e, p, h)",
        &[&r.ids, &agg, &et, &payload, &headers],
    )
    .await
    .expect("insert outbox rows");
}

/// One writer's workload; returns its committed rows in commit order.
async fn writer(client: Client, w: usize) -> Vec<(String, Expected)> {
    let mut committed: Vec<(String, Expected)> = Vec::new();
    let keep = |r: Rows, committed: &mut Vec<(String, Expected)>| {
        committed.extend(r.ids.into_iter().zip(r.rows))
    };
    let mut c = client;
    for round in 0..40 {
        // Ten rows in one transaction, with a write to an unpublished table.
        let r = rows(w, &format!("ten{round}"), 10);
        let tx = c.transaction().await.unwrap();
        insert(&tx, &r).await;
        tx.execute("INSERT INTO unpublished (note) VALUES ('x')", &[])
            .await
            .unwrap();
        tx.commit().await.unwrap();
        keep(r, &mut committed);
        // Single-row transactions.
        for k in 0..4 {
            let r = rows(w, &format!("one{round}-{k}"), 1);
            insert(&c, &r).await;
            keep(r, &mut committed);
        }
        if round % 4 == 0 {
            c.execute("INSERT INTO unpublished (note) VALUES ('alone')", &[])
                .await
                .unwrap();
        }
        if round % 5 == 0 {
            let tx = c.transaction().await.unwrap();
            insert(&tx, &rows(w, "rolledback", 10)).await;
            tx.rollback().await.unwrap();
        }
        if round % 7 == 0 {
            let (a, b, d) = (rows(w, "sp-a", 5), rows(w, "sp-b", 5), rows(w, "sp-c", 3));
            let mut tx = c.transaction().await.unwrap();
            insert(&tx, &a).await;
            {
                let sp = tx.savepoint("sp").await.unwrap();
                insert(&sp, &b).await;
                sp.rollback().await.unwrap();
            }
            insert(&tx, &d).await;
            tx.commit().await.unwrap();
            keep(a, &mut committed);
            keep(d, &mut committed);
        }
        if round % 9 == 0 {
            let gid = format!("w{w}-r{round}");
            let r = rows(w, "prepared", 4);
            c.batch_execute("BEGIN").await.unwrap();
            insert(&c, &r).await;
            c.batch_execute(&format!("PREPARE TRANSACTION '{gid}'"))
                .await
                .unwrap();
            c.batch_execute(&format!("COMMIT PREPARED '{gid}'"))
                .await
                .unwrap();
            keep(r, &mut committed);
            c.batch_execute("BEGIN").await.unwrap();
            insert(&c, &rows(w, "prepared-rolledback", 4)).await;
            c.batch_execute(&format!("PREPARE TRANSACTION '{gid}-rb'"))
                .await
                .unwrap();
            c.batch_execute(&format!("ROLLBACK PREPARED '{gid}-rb'"))
                .await
                .unwrap();
        }
        if round % 6 == 0 {
            // Updates and deletes of committed outbox rows are not events.
            let (id, _) = committed.last().unwrap().clone();
            c.execute(
                "UPDATE outbox SET event_type = 'changed' WHERE id = $1::text::uuid",
                &[&id],
            )
            .await
            .unwrap();
            c.execute("DELETE FROM outbox WHERE id = $1::text::uuid", &[&id])
                .await
                .unwrap();
        }
        if round % 8 == 0 {
            // The outbox_emit pattern: insert and delete in one transaction.
            let r = rows(w, "insert-delete", 1);
            let tx = c.transaction().await.unwrap();
            insert(&tx, &r).await;
            tx.execute("DELETE FROM outbox WHERE id = $1::text::uuid", &[&r.ids[0]])
                .await
                .unwrap();
            tx.commit().await.unwrap();
            keep(r, &mut committed);
        }
        if round == 10 || round == 30 {
            let r = rows(w, &format!("big{round}"), 1000);
            let tx = c.transaction().await.unwrap();
            insert(&tx, &r).await;
            tx.commit().await.unwrap();
            keep(r, &mut committed);
        }
    }
    committed
}

/// Rows whose values are hard to carry: Cyrillic, emoji, nested jsonb, a
/// TOASTed 200 KB payload, NULL headers.
fn special_rows() -> Rows {
    let big: String = (0..25_000)
        .map(|i| format!("{:08x}", (i as u64).wrapping_mul(2654435761)))
        .collect();
    let mut r = Rows {
        ids: Vec::new(),
        rows: Vec::new(),
    };
    for (agg, et, payload, headers) in [
        (
            "платёж-42",
            "платёж.оплачен",
            json!({"сумма": "100.50", "валюта": "RUB", "emoji": "🎉💳"}),
            None,
        ),
        (
            "🚀",
            "nested",
            json!({"a": {"b": [1, 2, {"c": null, "d": [true, false]}]}, "e": "\"quoted\" \\ back"}),
            Some(json!({"x": ["y"]})),
        ),
        ("toast", "big", json!({"blob": big}), None),
    ] {
        r.ids.push(uuid::Uuid::new_v4().to_string());
        r.rows.push(Expected {
            aggregate_id: agg.into(),
            event_type: et.into(),
            payload,
            headers,
        });
    }
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_yields_exactly_the_committed_rows_in_commit_order() {
    let s = setup("exact");
    s.pg.batch(
        "app",
        "CREATE TABLE unpublished (id serial PRIMARY KEY, note text)",
    )
    .await;
    create_slot(&s.pg, "exact");

    let specials = special_rows();
    insert(&s.pg.client("app").await, &specials).await;
    let mut handles = Vec::new();
    for w in 0..4 {
        let client = s.pg.client("app").await;
        handles.push(tokio::spawn(writer(client, w)));
    }
    let mut expected: HashMap<String, Expected> = specials
        .ids
        .iter()
        .cloned()
        .zip(specials.rows.clone())
        .collect();
    let mut per_writer: Vec<Vec<String>> = Vec::new();
    for h in handles {
        let committed = h.await.unwrap();
        per_writer.push(committed.iter().map(|(id, _)| id.clone()).collect());
        expected.extend(committed);
    }
    let total = expected.len();
    assert!(total >= 10_000, "workload too small: {total}");

    let config = s.config.clone();
    let out = tokio::task::spawn_blocking(move || {
        tail(
            &config,
            // Confirmed, so the sentinel below is the next event.
            &["--limit", &total.to_string(), "--confirm"],
            Duration::from_secs(180),
        )
    })
    .await
    .unwrap();
    assert!(out.success, "tail failed: {}", out.stderr);
    assert_eq!(out.events.len(), total, "stderr: {}", out.stderr);

    // Each committed row once, nothing else, values exact.
    let mut seen = HashSet::new();
    for e in &out.events {
        let id = text(e, "id").to_string();
        assert!(seen.insert(id.clone()), "row {id} delivered twice");
        let exp = expected
            .get(&id)
            .unwrap_or_else(|| panic!("row {id} was never committed: {e}"));
        assert_eq!(text(e, "aggregate_id"), exp.aggregate_id);
        assert_eq!(text(e, "event_type"), exp.event_type);
        assert_eq!(text(e, "aggregate_type"), "test");
        let payload: Value = serde_json::from_str(text(e, "payload")).unwrap();
        assert_eq!(payload, exp.payload, "payload of {id}");
        let headers = e["row"]["headers"]
            .as_str()
            .map(|h| serde_json::from_str::<Value>(h).unwrap());
        assert_eq!(headers, exp.headers, "headers of {id}");
        assert_eq!(e["table"], "public.outbox");
    }

    // Commit order: the commit end LSN never goes down, a transaction's rows
    // are contiguous, and each writer's rows come in its commit order.
    let lsns: Vec<outboxd::Lsn> = out
        .events
        .iter()
        .map(|e| e["lsn"].as_str().unwrap().parse().unwrap())
        .collect();
    assert!(
        lsns.windows(2).all(|w| w[0] <= w[1]),
        "commit LSNs went backwards"
    );
    let mut closed_xids = HashSet::new();
    for pair in out.events.windows(2) {
        if pair[0]["xid"] != pair[1]["xid"] {
            assert!(
                closed_xids.insert(pair[0]["xid"].as_u64().unwrap()),
                "transaction split: {}",
                pair[0]["xid"]
            );
        }
    }
    let position: HashMap<&str, usize> = out
        .events
        .iter()
        .enumerate()
        .map(|(i, e)| (text(e, "id"), i))
        .collect();
    for (w, ids) in per_writer.iter().enumerate() {
        let pos: Vec<usize> = ids.iter().map(|id| position[id.as_str()]).collect();
        assert!(
            pos.windows(2).all(|p| p[0] < p[1]),
            "writer {w}'s rows out of commit order"
        );
    }

    // Nothing left behind: the next event is the next write.
    let sentinel = rows(9, "sentinel", 1);
    insert(&s.pg.client("app").await, &sentinel).await;
    let config = s.config.clone();
    let next = tokio::task::spawn_blocking(move || {
        tail(&config, &["--limit", "1"], Duration::from_secs(60))
    })
    .await
    .unwrap();
    assert_eq!(next.events.len(), 1, "{}", next.stderr);
    assert_eq!(text(&next.events[0], "id"), sentinel.ids[0]);
    eprintln!("exact_rows: {total} committed rows relayed exactly once in commit order");
}
