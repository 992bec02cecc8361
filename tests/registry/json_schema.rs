//! Issue 37, `routing.value_format = "json-schema"`: rows checked against a
//! JSON Schema registered in a real registry (Apicurio, one per test
//! binary), framed, and decoded by confluent-kafka's own `JSONDeserializer`
//! with a fresh registry client, which validates each value again with the
//! writer schema it fetches by id. A row the schema rejects follows
//! `relay.on_error`, and nothing else is lost.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::http::{free_port, Scrape};
use crate::harness::kafka::{shared as broker, Record};
use crate::harness::python::read_json_schema;
use crate::harness::registry::shared as registry;
use crate::harness::relay::{env, use_ledger_topic, Env, Relay};

/// Draft 2020-12: nested objects, a `$ref` into `$defs`, an enum, arrays,
/// a pattern, numeric bounds, nullable fields, no extra members.
pub(super) fn order_schema() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "Order",
        "type": "object",
        "properties": {
            "seq": {"type": "integer", "minimum": 0},
            "writer": {"type": "integer"},
            "customer": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "address": {"oneOf": [{"type": "null"}, {"$ref": "#/$defs/address"}]}
                },
                "required": ["name"]
            },
            "status": {"enum": ["NEW", "PAID", "SHIPPED"]},
            "lines": {"type": "array", "items": {"$ref": "#/$defs/line"}},
            "total": {"type": "string", "pattern": "^[0-9]+\\.[0-9]{2}$"},
            "note": {"type": ["string", "null"]}
        },
        "required": ["seq", "writer", "customer", "status", "lines", "total"],
        "additionalProperties": false,
        "$defs": {
            "address": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                "required": ["city"]
            },
            "line": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
                "required": ["sku", "qty"],
                "additionalProperties": false
            }
        }
    })
}

const STATUSES: [&str; 3] = ["NEW", "PAID", "SHIPPED"];

/// Row `i` of writer `w`.
pub(super) fn order(w: usize, i: usize) -> Value {
    let address = match i % 3 {
        0 => Value::Null,
        1 => json!({"city": format!("city-{i}")}),
        _ => json!({"city": "Zürich 🏔", "zip": "8001"}),
    };
    let lines: Vec<Value> = (0..i % 4)
        .map(|l| json!({"sku": format!("sku-{l}"), "qty": l + 1}))
        .collect();
    let mut payload = json!({
        "seq": i, "writer": w,
        "customer": {"name": format!("c-{w}-{i}"), "address": address},
        "status": STATUSES[i % 3],
        "lines": lines,
        // Digits a double would not keep, as text.
        "total": format!("{}{:07}.{:02}", 1_234_567_890 + w, i * 7, i % 100),
    });
    if i % 5 == 0 {
        payload["note"] = json!(format!("note {i} \"quoted\""));
    }
    payload
}

fn sql_text(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

pub(super) fn json_schema_env(slot: &str, extra: &str) -> (Env, String) {
    let topic = format!("{slot}.orders");
    let config = format!(
        "[routing]\ntopic = \"{topic}\"\nvalue_format = \"json-schema\"\n\
         [schema_registry]\nurl = \"{}\"\n{extra}",
        registry().url()
    );
    (env(broker().bootstrap(), slot, &config), topic)
}

pub(super) fn insert(e: &Env, key: &str, payloads: &[Value]) {
    let values: Vec<String> = payloads
        .iter()
        .map(|p| {
            format!(
                "('order', {}, 'placed', {}::jsonb)",
                sql_text(key),
                sql_text(&p.to_string())
            )
        })
        .collect();
    super::insert_rows(e, &values);
}

/// Relays `writers` × `per_writer` orders written concurrently (each writer
/// its own key) with `extra` config, decodes every record with
/// confluent-kafka and checks it against its row: 0 lost, 0 duplicates,
/// per-key order. Returns the relay's metrics scrape at the end.
fn relay_orders(slot: &str, extra: &str, writers: usize, per_writer: usize) -> Scrape {
    const BATCH: usize = 25;
    let reg = registry();
    let port = free_port();
    let (e, topic) = json_schema_env(
        slot,
        &format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n{extra}"),
    );
    if extra.contains("exactly-once") {
        use_ledger_topic(&e, &format!("{slot}.ledger"));
    }
    let id = reg.register_json_schema(&format!("{topic}-value"), &order_schema());
    let relay = Relay::start(&e);
    std::thread::scope(|s| {
        for w in 0..writers {
            let e = &e;
            s.spawn(move || {
                for batch in (0..per_writer).collect::<Vec<_>>().chunks(BATCH) {
                    let payloads: Vec<Value> = batch.iter().map(|&i| order(w, i)).collect();
                    insert(e, &format!("writer-{w}"), &payloads);
                }
            });
        }
    });

    let total = writers * per_writer;
    // read_committed: in exactly-once mode only committed transactions.
    let got = broker().consume_all(&topic, total, Duration::from_secs(120));
    assert_eq!(got.len(), total, "{}", relay.log());
    let decoded = read_json_schema(reg.url(), &topic, &got);

    let mut seen = HashSet::new();
    let mut last_seq: HashMap<(String, i32), u64> = HashMap::new();
    let mut by_partition: Vec<(&Record, &Value)> = got.iter().zip(&decoded).collect();
    by_partition.sort_by_key(|(r, _)| (r.partition, r.offset));
    for (record, d) in by_partition {
        assert!(
            d["error"].is_null(),
            "the deserializer refused {record:?}: {d}"
        );
        assert_eq!(d["schema_id"], id, "{d}");
        let v = &d["value"];
        let (w, i) = (v["writer"].as_u64().unwrap(), v["seq"].as_u64().unwrap());
        assert_eq!(v, &order(w as usize, i as usize), "writer {w} row {i}");
        assert_eq!(record.key_str(), Some(format!("writer-{w}").as_str()));
        assert!(seen.insert((w, i)), "writer {w} row {i} arrived twice");
        let prev = last_seq.insert((format!("writer-{w}"), record.partition), i);
        assert!(
            prev.map_or(true, |p| p < i),
            "writer {w}: row {i} after {prev:?}"
        );
    }
    assert_eq!(seen.len(), total, "0 lost");
    Scrape::take(port)
}

#[test]
fn json_schema_rows_from_four_writers_decode_with_confluents_deserializer_none_lost_in_key_order() {
    let scrape = relay_orders("regjson", "", 4, 500);
    // The schema was asked for once, at start: none per event.
    assert_eq!(
        scrape
            .get("outboxd_schema_registry_requests_total", "")
            .unwrap_or(0.0),
        1.0
    );
}

#[test]
fn json_schema_rows_in_exactly_once_mode_decode_once_each_read_committed() {
    let scrape = relay_orders(
        "regjsoneos",
        "[relay]\ndelivery = \"exactly-once\"\n",
        2,
        150,
    );
    assert!(scrape.value("outboxd_kafka_transactions_total", "outcome=\"committed\"") >= 1.0);
}

#[test]
fn a_row_its_json_schema_rejects_goes_to_the_dead_letter_topic_naming_pointer_and_keyword() {
    let reg = registry();
    let slot = "regjsondlq";
    let dlq = format!("{slot}.dlq");
    let (e, topic) = json_schema_env(
        slot,
        &format!("[relay]\non_error = \"dead_letter\"\ndead_letter_topic = \"{dlq}\"\n"),
    );
    let id = reg.register_json_schema(&format!("{topic}-value"), &order_schema());
    let relay = Relay::start(&e);
    let mut bad = order(0, 7);
    bad["lines"][2]["qty"] = json!(0);
    for p in [order(0, 5), order(0, 6), bad, order(0, 8)] {
        insert(&e, "k", &[p]);
    }
    let got = broker().consume_all(&topic, 3, Duration::from_secs(60));
    let seqs: Vec<u64> = read_json_schema(reg.url(), &topic, &got)
        .iter()
        .map(|d| d["value"]["seq"].as_u64().unwrap_or_else(|| panic!("{d}")))
        .collect();
    assert_eq!(seqs, [5, 6, 8], "{}", relay.log());
    let dead = broker().consume_all(&dlq, 1, Duration::from_secs(60));
    assert_eq!(dead.len(), 1, "{}", relay.log());
    let reason = String::from_utf8(dead[0].header("outboxd.error").unwrap().to_vec()).unwrap();
    let event_id =
        e.pg.psql("app", "SELECT id FROM outbox WHERE payload->>'seq' = '7'");
    for needle in [
        format!("event {}", event_id.trim()),
        "at JSON pointer \"/lines/2/qty\" the schema's `minimum` keyword fails".to_owned(),
        format!("schema id {id} (subject `{topic}-value` version 1)"),
    ] {
        assert!(reason.contains(&needle), "{needle:?} not in {reason}");
    }
    let row: Value = serde_json::from_str(dead[0].value_str().unwrap()).unwrap();
    let payload: Value = serde_json::from_str(row["payload"].as_str().unwrap()).unwrap();
    assert_eq!(payload["lines"][2]["qty"], 0);
}
