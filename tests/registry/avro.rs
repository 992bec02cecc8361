//! Issue 37, `routing.value_format = "avro"`: rows relayed through a real
//! schema registry (Apicurio, one per test binary) and decoded by
//! confluent-kafka's own `AvroDeserializer` with a fresh registry client
//! (`harness::python::read_avro`). Rows that do not fit the schema follow
//! `relay.on_error`, and nothing else is lost.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::http::{free_port, Scrape};
use crate::harness::kafka::{shared as broker, Record};
use crate::harness::python::read_avro;
use crate::harness::registry::{shared as registry, Registry};
use crate::harness::relay::{confirmed_lsn, env, lsn_now, use_ledger_topic, Env, Relay};
use crate::harness::wait::wait_for;

/// Nested records, an optional union of a record, an optional string, an
/// enum, an array, a map, timestamp-millis, date, decimal and uuid.
pub(super) fn order_schema() -> Value {
    json!({
        "type": "record", "name": "Order", "namespace": "com.acme.orders",
        "fields": [
            {"name": "seq", "type": "long"},
            {"name": "writer", "type": "int"},
            {"name": "customer", "type": {"type": "record", "name": "Customer", "fields": [
                {"name": "name", "type": "string"},
                {"name": "address", "type": ["null", {"type": "record", "name": "Address", "fields": [
                    {"name": "city", "type": "string"},
                    {"name": "zip", "type": ["null", "string"], "default": null}
                ]}], "default": null}
            ]}},
            {"name": "status", "type": {"type": "enum", "name": "Status",
                "symbols": ["NEW", "PAID", "SHIPPED"]}},
            {"name": "tags", "type": {"type": "array", "items": "string"}},
            {"name": "attrs", "type": {"type": "map", "values": "long"}},
            {"name": "placed_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "ship_on", "type": {"type": "int", "logicalType": "date"}},
            {"name": "total", "type": {"type": "bytes", "logicalType": "decimal",
                "precision": 20, "scale": 2}},
            {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
            {"name": "note", "type": ["null", "string"], "default": null}
        ]
    })
}

const STATUSES: [&str; 3] = ["NEW", "PAID", "SHIPPED"];

/// Row `i` of writer `w`: its payload, and what the decoder should give
/// for it (see tests/python/read_avro.py for how types are shown).
pub(super) fn order(w: usize, i: usize) -> (Value, Value) {
    let placed_ms: i64 = 1_796_400_000_123 + (w * 100_000 + i) as i64;
    // Half as ISO 8601 text, half as epoch milliseconds.
    let placed = if i % 2 == 0 {
        json!(iso_ms(placed_ms))
    } else {
        json!(placed_ms)
    };
    // Digits a double would not keep.
    let total = format!("{}{:07}.{:02}", 1_234_567_890 + w, i * 7, i % 100);
    let uuid = format!("00000000-0000-4000-8000-{:06}{:06}", w, i);
    let address = match i % 3 {
        0 => Value::Null,
        1 => json!({"city": format!("city-{i}")}),
        _ => json!({"city": "Zürich 🏔", "zip": "8001"}),
    };
    let tags: Vec<String> = (0..i % 4).map(|t| format!("t{t}")).collect();
    let mut payload = json!({
        "seq": i, "writer": w,
        "customer": {"name": format!("c-{w}-{i}"), "address": address},
        "status": STATUSES[i % 3],
        "tags": tags,
        "attrs": {"w": w, "i": i},
        "placed_at": placed,
        "ship_on": "2026-12-24",
        "total": total,
        "ref": uuid,
    });
    if i % 5 == 0 {
        payload["note"] = json!(format!("note {i}"));
    }
    let mut address_out = address.clone();
    if i % 3 == 1 {
        address_out["zip"] = Value::Null;
    }
    let decoded = json!({
        "seq": i, "writer": w,
        "customer": {"name": format!("c-{w}-{i}"), "address": address_out},
        "status": STATUSES[i % 3],
        "tags": payload["tags"],
        "attrs": {"w": w, "i": i},
        "placed_at": placed_ms,
        "ship_on": "2026-12-24",
        "total": total,
        "ref": uuid,
        "note": if i % 5 == 0 { json!(format!("note {i}")) } else { Value::Null },
    });
    (payload, decoded)
}

/// Epoch milliseconds as `2026-12-04T07:20:00.123Z`.
fn iso_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil from days (Howard Hinnant).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms.rem_euclid(1000)
    )
}

fn sql_text(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// The relay's config for `slot`: events to `<slot>.orders` in Avro, the
/// registry at `urls` (`schema_registry.url`).
pub(super) fn avro_env_at(slot: &str, urls: &str, extra: &str) -> (Env, String) {
    let topic = format!("{slot}.orders");
    let config = format!(
        "[routing]\ntopic = \"{topic}\"\nvalue_format = \"avro\"\n\
         [schema_registry]\nurl = \"{urls}\"\n{extra}"
    );
    (env(broker().bootstrap(), slot, &config), topic)
}

pub(super) fn avro_env(slot: &str, reg: &Registry, extra: &str) -> (Env, String) {
    avro_env_at(slot, reg.url(), extra)
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
    let (e, topic) = avro_env(
        slot,
        reg,
        &format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n{extra}"),
    );
    if extra.contains("exactly-once") {
        use_ledger_topic(&e, &format!("{slot}.ledger"));
    }
    let id = reg.register_avro(&format!("{topic}-value"), &order_schema());
    let relay = Relay::start(&e);

    let mut expected: HashMap<(usize, usize), Value> = HashMap::new();
    for w in 0..writers {
        for i in 0..per_writer {
            expected.insert((w, i), order(w, i).1);
        }
    }
    std::thread::scope(|s| {
        for w in 0..writers {
            let e = &e;
            s.spawn(move || {
                for batch in (0..per_writer).collect::<Vec<_>>().chunks(BATCH) {
                    let payloads: Vec<Value> = batch.iter().map(|&i| order(w, i).0).collect();
                    insert(e, &format!("writer-{w}"), &payloads);
                }
            });
        }
    });

    let total = writers * per_writer;
    // read_committed: in exactly-once mode only committed transactions.
    let got = broker().consume_all(&topic, total, Duration::from_secs(120));
    assert_eq!(got.len(), total, "{}", relay.log());
    let decoded = read_avro(reg.url(), &topic, &got);

    let mut seen = HashSet::new();
    let mut last_seq: HashMap<(String, i32), i64> = HashMap::new();
    let mut by_partition: Vec<(&Record, &Value)> = got.iter().zip(&decoded).collect();
    by_partition.sort_by_key(|(r, _)| (r.partition, r.offset));
    for (record, d) in by_partition {
        assert!(
            d["error"].is_null(),
            "the deserializer refused {record:?}: {d}"
        );
        assert_eq!(d["schema_id"], id, "{d}");
        let v = &d["value"];
        let (w, i) = (
            v["writer"].as_u64().unwrap() as usize,
            v["seq"].as_u64().unwrap() as usize,
        );
        assert_eq!(v, &expected[&(w, i)], "writer {w} row {i}");
        assert_eq!(record.key_str(), Some(format!("writer-{w}").as_str()));
        assert!(seen.insert((w, i)), "writer {w} row {i} arrived twice");
        // Per key (one partition each), in the order written.
        let k = (format!("writer-{w}"), record.partition);
        let prev = last_seq.insert(k, i as i64);
        assert!(
            prev.map_or(true, |p| p < i as i64),
            "writer {w}: row {i} after {prev:?}"
        );
    }
    assert_eq!(seen.len(), total, "0 lost");
    Scrape::take(port)
}

#[test]
fn avro_rows_from_four_writers_decode_with_confluents_deserializer_none_lost_in_key_order() {
    let started = std::time::Instant::now();
    let scrape = relay_orders("regavro", "", 4, 500);
    // The schema was asked for once at start, then once per
    // schema_registry.refresh_interval (30 s): none per event.
    let most = 1.0 + (started.elapsed().as_secs_f64() / 30.0).ceil();
    let ok = scrape.value("outboxd_schema_registry_requests_total", "outcome=\"ok\"");
    let all: f64 = scrape
        .series("outboxd_schema_registry_requests_total")
        .iter()
        .map(|(_, v)| v)
        .sum();
    assert!(
        ok >= 1.0 && all == ok && all <= most,
        "{ok} ok of {all}, at most {most}"
    );
}

#[test]
fn avro_rows_in_exactly_once_mode_decode_once_each_read_committed() {
    let scrape = relay_orders(
        "regavroeos",
        "[relay]\ndelivery = \"exactly-once\"\n",
        2,
        200,
    );
    assert!(scrape.value("outboxd_kafka_transactions_total", "outcome=\"committed\"") >= 1.0);
}

/// Two rows that fit, one that does not (`seq` is text), two that fit.
fn write_around_a_misfit(e: &Env) -> outboxd::Lsn {
    let good = |i: usize| order(0, i).0;
    insert(e, "k", &[good(0)]);
    insert(e, "k", &[good(1)]);
    let before = lsn_now(&e.pg);
    let mut bad = good(2);
    bad["seq"] = json!("two");
    insert(e, "k", &[bad]);
    insert(e, "k", &[good(3)]);
    insert(e, "k", &[good(4)]);
    before
}

fn seqs(reg: &Registry, topic: &str, records: &[Record]) -> Vec<u64> {
    read_avro(reg.url(), topic, records)
        .iter()
        .map(|d| d["value"]["seq"].as_u64().unwrap_or_else(|| panic!("{d}")))
        .collect()
}

#[test]
fn a_row_that_does_not_fit_its_schema_halts_the_relay_before_it_under_stop() {
    let reg = registry();
    let slot = "regavrostop";
    let (e, topic) = avro_env(slot, reg, "");
    let id = reg.register_avro(&format!("{topic}-value"), &order_schema());
    let relay = Relay::start(&e);
    let before = write_around_a_misfit(&e);
    let got = broker().consume_all(&topic, 2, Duration::from_secs(60));
    assert_eq!(seqs(reg, &topic, &got), [0, 1], "{}", relay.log());
    wait_for("the halt to be logged", Duration::from_secs(30), || {
        relay.log().contains("relay halted")
    });
    let log = relay.log();
    let event_id =
        e.pg.psql("app", "SELECT id FROM outbox WHERE payload->>'seq' = 'two'");
    for needle in [
        format!("event {}", event_id.trim()),
        "at $.seq the schema expects a long".to_owned(),
        format!("schema id {id} (subject `{topic}-value` version 1)"),
        "found the string \\\"two\\\"".to_owned(),
    ] {
        assert!(
            log.contains(&needle) || log.contains(&needle.replace("\\\"", "\"")),
            "{needle:?} not in the log:\n{log}"
        );
    }
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        broker().record_count(&topic),
        2,
        "rows after the misfit were published"
    );
    let confirmed = confirmed_lsn(&e.pg, slot);
    assert!(
        confirmed <= before,
        "slot confirmed {confirmed} past the misfit ({before})"
    );
}

#[test]
fn a_row_that_does_not_fit_its_schema_goes_to_the_dead_letter_topic() {
    let reg = registry();
    let slot = "regavrodlq";
    let dlq = format!("{slot}.dlq");
    let port = free_port();
    // A first URL that refuses connections: the next one is tried. No
    // periodic refresh: the only request after the start is the re-read.
    let (e, topic) = avro_env_at(
        slot,
        &format!("http://127.0.0.1:{}, {}", free_port(), reg.url()),
        &format!(
            "refresh_interval = \"0s\"\n\
             [relay]\non_error = \"dead_letter\"\ndead_letter_topic = \"{dlq}\"\n\
             [metrics]\nlisten = \"127.0.0.1:{port}\"\n"
        ),
    );
    reg.register_avro(&format!("{topic}-value"), &order_schema());
    let relay = Relay::start(&e);
    write_around_a_misfit(&e);
    let got = broker().consume_all(&topic, 4, Duration::from_secs(60));
    assert_eq!(seqs(reg, &topic, &got), [0, 1, 3, 4], "{}", relay.log());
    let dead = broker().consume_all(&dlq, 1, Duration::from_secs(60));
    assert_eq!(dead.len(), 1, "{}", relay.log());
    let reason = String::from_utf8(dead[0].header("outboxd.error").unwrap().to_vec()).unwrap();
    assert!(
        reason.contains("at $.seq the schema expects a long"),
        "{reason}"
    );
    assert!(
        reason.contains(&format!("subject `{topic}-value` version 1")),
        "{reason}"
    );
    // The row as it is (the relay's dead-letter form: column -> text), the
    // payload among it.
    let row: Value = serde_json::from_str(dead[0].value_str().unwrap()).unwrap();
    let payload: Value = serde_json::from_str(row["payload"].as_str().unwrap()).unwrap();
    assert_eq!(payload["seq"], "two");
    // The subject (at `latest`) was read once more before the row was given
    // up on, and the failure counted by subject and reason.
    let scrape = Scrape::take(port);
    assert_eq!(
        scrape.value("outboxd_schema_registry_requests_total", "outcome=\"ok\""),
        2.0
    );
    let failures = scrape.series("outboxd_value_encode_failures_total");
    assert!(
        failures.len() == 1
            && failures[0]
                .0
                .contains(&format!("subject=\"{topic}-value\""))
            && failures[0].0.contains("reason=\"mismatch\"")
            && failures[0].1 == 1.0,
        "{failures:?}"
    );
}

#[test]
fn a_subject_missing_from_the_registry_stops_the_relay_naming_it() {
    let reg = registry();
    let slot = "regavromissing";
    let (e, topic) = avro_env(slot, reg, "");
    let mut relay = Relay::start(&e);
    let status = relay
        .wait(Duration::from_secs(60))
        .expect("the relay stops");
    assert!(!status.success());
    let log = relay.log();
    assert!(
        log.contains(&format!("subject `{topic}-value` does not exist"))
            && log.contains("curl -X POST"),
        "{log}"
    );
}
