//! Acceptance 1 and 8: everything committed arrives, routed, keyed, with
//! exact bytes and per-aggregate commit order; the seed-style table and the
//! envelope format; NULL columns placed as headers arrive as null values.

use std::time::Duration;

use crate::harness::events::{acked_positions, aggregates, payload_texts, verify, write};
use crate::harness::kafka::shared;
use crate::harness::relay::{env, Relay};
use crate::harness::wait::wait_for;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_thousand_events_arrive_exactly_in_per_aggregate_commit_order() {
    let broker = shared();
    let e = env(broker.bootstrap(), "e2e", "");
    let relay = Relay::start(&e);
    let aggs = aggregates(200);
    let mut handles = Vec::new();
    for w in 0..4 {
        let mut client = e.pg.client("app").await;
        let aggs = aggs.clone();
        let sizes: Vec<usize> = match w {
            0 => vec![1, 10, 1000],
            1 => vec![1000, 1, 100],
            2 => vec![10, 10, 500, 1],
            _ => vec![1, 1, 1, 250],
        };
        handles.push(tokio::spawn(async move {
            write(&mut client, "e2e", &aggs, 12_500, &sizes, 7).await
        }));
    }
    let mut sent = Vec::new();
    for h in handles {
        sent.extend(h.await.unwrap());
    }
    assert_eq!(sent.len(), 50_000);
    let logs = e.dir.path().to_path_buf();
    let texts = payload_texts(&e.pg);
    let dir = logs.clone();
    let v = tokio::task::spawn_blocking(move || {
        verify(broker, &sent, &texts, Duration::from_secs(300), false, &dir)
    })
    .await
    .unwrap_or_else(|e| panic!("{e:?}\nrelay log:\n{}", relay.log()));
    assert_eq!(v.delivered, 50_000, "relay log:\n{}", relay.log());
    // The per-event trail agrees with Kafka: each event acked exactly once
    // (no duplicates here), at the partition and offset it was read from.
    // The relay logs an ack a moment after Kafka has the record.
    let mut acked = acked_positions(&logs);
    wait_for("every ack in the trail", Duration::from_secs(30), || {
        acked = acked_positions(&logs);
        acked.len() >= 50_000
    });
    for (id, at) in &v.first_at {
        assert_eq!(acked.get(id), Some(&vec![*at]), "trail of {id}");
    }
    eprintln!(
        "e2e: {} events delivered, {} duplicates",
        v.delivered, v.duplicates
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_style_table_relays_through_the_column_mapping_as_the_seed_envelope() {
    let broker = shared();
    let extra = "[outbox]\ntable = \"public.outbox_seed\"\n[routing]\nvalue = \"envelope\"\n\
                 [[routing.rules]]\nevent_type_prefix = \"payment.\"\ntopic = \"payments\"\n";
    let e = env(broker.bootstrap(), "seed", extra);
    let seed_sql = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/migrations/examples/seed_outbox.sql"
    ))
    .unwrap();
    e.pg.psql("app", &seed_sql);
    e.pg.psql("app", "ALTER PUBLICATION outboxd ADD TABLE outbox_seed");
    let _relay = Relay::start(&e);
    let agg = "3f1c2a4e-9b7d-4c1e-8f00-000000000042";
    e.pg.psql(
        "app",
        &format!(
            "INSERT INTO outbox_seed (id, aggregate_type, aggregate_id, event_type, payload, created_at) VALUES \
             ('00000000-0000-4000-8000-000000000001', 'payment', '{agg}', 'payment.completed', '{{\"amount\": \"100.50\"}}', '2026-11-30 10:00:00.123+00')"
        ),
    );
    let records = broker.consume_all("payments", 1, Duration::from_secs(60));
    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_eq!(r.key_str(), Some(agg));
    assert_eq!(
        r.header("id"),
        Some(&b"00000000-0000-4000-8000-000000000001"[..])
    );
    assert_eq!(r.header("eventType"), Some(&b"payment.completed"[..]));
    assert_eq!(r.header("aggregateType"), Some(&b"payment"[..]));
    let v: serde_json::Value = serde_json::from_str(r.value_str().unwrap()).unwrap();
    assert_eq!(
        v,
        serde_json::json!({
            "id": "00000000-0000-4000-8000-000000000001",
            "type": "payment.completed",
            "aggregateId": agg,
            "aggregateType": "payment",
            "payload": {"amount": "100.50"},
            "occurredAt": v["occurredAt"].clone(),
        })
    );
    assert!(
        v["occurredAt"]
            .as_str()
            .unwrap()
            .starts_with("2026-11-30T10:00:00.123"),
        "{v}"
    );
}

/// Debezium's router sends a NULL `additional.placement=…:header` column as
/// a header with a null value; so does outboxd, read back here from the
/// broker: null, not absent and not empty. Rows and messages alike (in a
/// message an absent field is NULL).
#[test]
fn null_columns_placed_as_headers_arrive_as_null_valued_headers() {
    let broker = shared();
    let extra = "[routing]\ntopic = \"nullhdr.${aggregate_type}\"\n\
                 additional_headers = { eventType = \"event_type\", tenant = \"tenant\" }\n";
    let e = env(broker.bootstrap(), "nullhdr", extra);
    e.pg.psql("app", "ALTER TABLE outbox ADD COLUMN tenant text");
    let relay = Relay::start(&e);
    e.pg.psql(
        "app",
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, tenant) VALUES \
         ('t', 'a', 'null', '{}', NULL), ('t', 'a', 'empty', '{}', ''), ('t', 'a', 'acme', '{}', 'acme');\
         SELECT pg_logical_emit_message(true, 'outbox', \
           '{\"id\": \"m1\", \"aggregate_type\": \"t\", \"aggregate_id\": \"a\", \"event_type\": \"absent\", \"payload\": {}}');\
         SELECT pg_logical_emit_message(true, 'outbox', \
           '{\"id\": \"m2\", \"aggregate_type\": \"t\", \"aggregate_id\": \"a\", \"event_type\": \"json-null\", \"payload\": {}, \"tenant\": null}');",
    );
    let records = broker.consume_all("nullhdr.t", 5, Duration::from_secs(60));
    assert_eq!(records.len(), 5, "relay log:\n{}", relay.log());
    let tenant: Vec<(&str, Option<Option<&[u8]>>)> = records
        .iter()
        .map(|r| {
            let event_type = std::str::from_utf8(r.header("eventType").unwrap()).unwrap();
            (event_type, r.header_value("tenant"))
        })
        .collect();
    assert_eq!(
        tenant,
        [
            ("null", Some(None)),
            ("empty", Some(Some(&b""[..]))),
            ("acme", Some(Some(&b"acme"[..]))),
            ("absent", Some(None)),
            ("json-null", Some(None)),
        ]
    );
    // In Debezium's place and order: after `id` and the other placements.
    let names: Vec<&str> = records[0].headers.iter().map(|(n, _)| &**n).collect();
    assert_eq!(names, ["id", "eventType", "tenant"]);
    assert_eq!(records[0].null_headers, [2]);
}
