//! Issue 37, `routing.value_format = "framed"`: the pass-through route of
//! Debezium's `BinaryDataConverter`. The service writes records framed by
//! confluent-kafka's own `AvroSerializer` into a bytea payload column; they
//! arrive byte-identical. A payload naming a schema id the registry does
//! not have, or without the magic byte, follows `relay.on_error`; each id
//! is asked of the registry once. A second relay of the same rows in
//! exactly-once mode, as binary CloudEvents, sends the same bytes once
//! each (read read_committed), with the content type and `dataschema` of
//! the schema each frame names.

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::http::{free_port, Scrape};
use crate::harness::kafka::{shared as broker, Record};
use crate::harness::python::{read_avro, write_avro};
use crate::harness::registry::shared as registry;
use crate::harness::relay::{confirmed_lsn, env, lsn_now, Env, Relay};
use crate::harness::wait::wait_for;

fn schema() -> Value {
    json!({"type": "record", "name": "Shipment", "namespace": "com.acme",
    "fields": [
        {"name": "seq", "type": "long"},
        {"name": "writer", "type": "int"},
        {"name": "carrier", "type": ["null", "string"], "default": null}
    ]})
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A relay reading `bin_outbox` (payload bytea) in the framed format.
fn framed_env(slot: &str, extra: &str) -> (Env, String) {
    let topic = format!("{slot}.shipments");
    let config = format!(
        "[outbox]\ntable = \"public.bin_outbox\"\n\
         [routing]\ntopic = \"{topic}\"\nvalue_format = \"framed\"\n\
         [schema_registry]\nurl = \"{}\"\n{extra}",
        registry().url()
    );
    let e = env(broker().bootstrap(), slot, &config);
    e.pg.psql(
        "app",
        "CREATE TABLE bin_outbox (id bigserial PRIMARY KEY, aggregate_type text NOT NULL, \
         aggregate_id text NOT NULL, event_type text NOT NULL, payload bytea); \
         ALTER PUBLICATION outboxd ADD TABLE bin_outbox",
    );
    (e, topic)
}

fn insert(e: &Env, key: &str, payloads: &[&[u8]]) {
    let values: Vec<String> = payloads
        .iter()
        .map(|p| format!("('shipment', '{key}', 'shipped', '\\x{}')", hex(p)))
        .collect();
    e.pg.psql(
        "app",
        &format!(
            "INSERT INTO bin_outbox (aggregate_type, aggregate_id, event_type, payload) VALUES {}",
            values.join(", ")
        ),
    );
}

/// `n` records of writer `w`, framed by confluent-kafka.
fn framed_records(topic: &str, w: usize, n: usize) -> Vec<Vec<u8>> {
    let values: Vec<Value> = (0..n)
        .map(|i| {
            json!({"seq": i, "writer": w,
                "carrier": if i % 2 == 0 { Value::Null } else { json!(format!("c{i}")) }})
        })
        .collect();
    write_avro(registry().url(), topic, &schema(), &values)
}

#[test]
fn framed_rows_arrive_byte_identical_and_bad_frames_go_to_the_dead_letter_topic() {
    const WRITERS: usize = 3;
    const PER_WRITER: usize = 100;
    let reg = registry();
    let slot = "regframed";
    let dlq = format!("{slot}.dlq");
    let port = free_port();
    let (e, topic) = framed_env(
        slot,
        &format!(
            "[relay]\non_error = \"dead_letter\"\ndead_letter_topic = \"{dlq}\"\n\
             [metrics]\nlisten = \"127.0.0.1:{port}\"\n"
        ),
    );
    let id = reg.register_avro(&format!("{topic}-value"), &schema());
    let written: Vec<Vec<Vec<u8>>> = (0..WRITERS)
        .map(|w| framed_records(&topic, w, PER_WRITER))
        .collect();
    assert_eq!(
        &written[0][0][..5],
        &[&[0u8][..], &id.to_be_bytes()[..]].concat()[..]
    );
    let relay = Relay::start(&e);
    // A second relay of the same rows (a slot of its own) in exactly-once
    // mode, as binary CloudEvents.
    let eos_port = free_port();
    let (eos, eos_topic, eos_dlq) = (
        format!("{slot}eos"),
        format!("{topic}.ce"),
        format!("{slot}.eos.dlq"),
    );
    e.pg.psql(
        "app",
        &format!("SELECT pg_create_logical_replication_slot('{eos}', 'pgoutput')"),
    );
    let config = std::fs::read_to_string(&e.config)
        .unwrap()
        .replacen(
            &format!("slot = \"{slot}\""),
            &format!("slot = \"{eos}\""),
            1,
        )
        .replacen(
            "topic_partitions = 3\n",
            &format!("topic_partitions = 3\nledger_topic = \"{eos}.ledger\"\n"),
            1,
        )
        .replacen(
            &format!("topic = \"{topic}\"\n"),
            &format!("topic = \"{eos_topic}\"\nformat = \"cloudevents-binary\"\n"),
            1,
        )
        .replacen(
            &format!("dead_letter_topic = \"{dlq}\"\n"),
            &format!("dead_letter_topic = \"{eos_dlq}\"\ndelivery = \"exactly-once\"\n"),
            1,
        )
        .replacen(&format!(":{port}\""), &format!(":{eos_port}\""), 1);
    let eos_config = e.dir.path().join("eos.toml");
    std::fs::write(&eos_config, config).unwrap();
    let eos_relay = Relay::start_config(&eos_config, e.dir.path(), &[], &[]);

    // An id no registry has given out, and JSON where a frame should be,
    // among the good rows of writer 0.
    let mut unknown = written[0][0].clone();
    unknown[1..5].copy_from_slice(&0x7fff_fff0u32.to_be_bytes());
    let not_framed = br#"{"seq": 1}"#.to_vec();
    std::thread::scope(|s| {
        for (w, rows) in written.iter().enumerate() {
            let e = &e;
            let (unknown, not_framed) = (&unknown, &not_framed);
            s.spawn(move || {
                for (i, chunk) in rows.chunks(10).enumerate() {
                    let refs: Vec<&[u8]> = chunk.iter().map(|r| &r[..]).collect();
                    insert(e, &format!("writer-{w}"), &refs);
                    if w == 0 && i == 3 {
                        insert(e, "writer-0", &[unknown]);
                        insert(e, "writer-0", &[not_framed]);
                    }
                }
            });
        }
    });

    let total = WRITERS * PER_WRITER;
    // Byte-identical, each key in the order written, none twice.
    let identical = |got: &[Record]| {
        for (w, rows) in written.iter().enumerate() {
            let key = format!("writer-{w}");
            let mut mine: Vec<_> = got
                .iter()
                .filter(|r| r.key_str() == Some(key.as_str()))
                .collect();
            mine.sort_by_key(|r| (r.partition, r.offset));
            let values: Vec<&[u8]> = mine.iter().map(|r| r.value.as_deref().unwrap()).collect();
            let expected: Vec<&[u8]> = rows.iter().map(|r| &r[..]).collect();
            assert!(
                values == expected,
                "writer {w}: the records differ from the rows"
            );
        }
    };
    let got = broker().consume_all(&topic, total, Duration::from_secs(120));
    assert_eq!(got.len(), total, "{}", relay.log());
    identical(&got);
    // And confluent-kafka reads them back.
    let decoded = read_avro(reg.url(), &topic, &got[..10]);
    assert!(decoded.iter().all(|d| d["schema_id"] == id), "{decoded:?}");

    // Exactly-once and CloudEvents binary: read read_committed, the same
    // bytes, once each; the content type of the frame's schema (Avro) and
    // the URL that serves it; every record decoded by confluent-kafka.
    let ce = broker().consume_all(&eos_topic, total, Duration::from_secs(120));
    assert_eq!(ce.len(), total, "{}", eos_relay.log());
    identical(&ce);
    let dataschema = format!("{}/schemas/ids/{id}", reg.url());
    for r in &ce {
        assert_eq!(r.header("content-type"), Some(&b"application/avro"[..]));
        assert_eq!(r.header("ce_dataschema"), Some(dataschema.as_bytes()));
        assert_eq!(r.header("ce_specversion"), Some(&b"1.0"[..]));
    }
    let mut seen = std::collections::HashSet::new();
    for d in read_avro(reg.url(), &eos_topic, &ce) {
        assert_eq!(d["schema_id"], id, "{d}");
        let row = (d["value"]["writer"].clone(), d["value"]["seq"].clone());
        assert!(seen.insert(row), "{d} twice");
    }
    assert_eq!(
        broker()
            .consume_all(&eos_dlq, 2, Duration::from_secs(60))
            .len(),
        2
    );
    assert!(
        Scrape::take(eos_port).value("outboxd_kafka_transactions_total", "outcome=\"committed\"")
            >= 1.0
    );
    drop(eos_relay);

    let dead = broker().consume_all(&dlq, 2, Duration::from_secs(60));
    assert_eq!(dead.len(), 2, "{}", relay.log());
    let reasons: Vec<String> = dead
        .iter()
        .map(|d| String::from_utf8(d.header("outboxd.error").unwrap().to_vec()).unwrap())
        .collect();
    assert!(
        reasons.iter().any(|r| r.contains(&format!(
            "names schema id {}, which the schema registry at {} does not have",
            0x7fff_fff0u32,
            reg.url()
        ))),
        "{reasons:?}"
    );
    assert!(
        reasons
            .iter()
            .any(|r| r.contains("the first byte is 0x7b, not the magic byte 0x00")),
        "{reasons:?}"
    );
    // One request per id: the good one, and the unknown one.
    let scrape = Scrape::take(port);
    assert_eq!(
        scrape.value("outboxd_schema_registry_requests_total", "outcome=\"ok\""),
        1.0
    );
    assert_eq!(
        scrape.value(
            "outboxd_schema_registry_requests_total",
            "outcome=\"not_found\""
        ),
        1.0
    );
    // Both bad rows counted as encode failures, with no subject to name.
    let mut failures = scrape.series("outboxd_value_encode_failures_total");
    failures.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(
        failures.len() == 2
            && failures[0].0.contains("reason=\"not_framed\"")
            && failures[1].0.contains("reason=\"unknown_schema_id\"")
            && failures.iter().all(|(_, v)| *v == 1.0),
        "{failures:?}"
    );
}

#[test]
fn a_framed_row_naming_an_unknown_schema_id_halts_the_relay_under_stop() {
    let slot = "regframedstop";
    let (e, topic) = framed_env(slot, "");
    registry().register_avro(&format!("{topic}-value"), &schema());
    let good = framed_records(&topic, 0, 3);
    let relay = Relay::start(&e);
    insert(&e, "k", &[&good[0]]);
    let before = lsn_now(&e.pg);
    let mut unknown = good[1].clone();
    unknown[1..5].copy_from_slice(&0x7fff_fff1u32.to_be_bytes());
    insert(&e, "k", &[&unknown]);
    insert(&e, "k", &[&good[2]]);
    let got = broker().consume_all(&topic, 1, Duration::from_secs(60));
    assert_eq!(got.len(), 1, "{}", relay.log());
    assert_eq!(got[0].value.as_deref(), Some(&good[0][..]));
    wait_for("the halt to be logged", Duration::from_secs(30), || {
        relay.log().contains("relay halted")
    });
    assert!(
        relay
            .log()
            .contains(&format!("names schema id {}", 0x7fff_fff1u32)),
        "{}",
        relay.log()
    );
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(broker().record_count(&topic), 1, "rows after it were sent");
    assert!(confirmed_lsn(&e.pg, slot) <= before);
}
