//! Issue 37 §2 `routing.auto_register`: a route's `routing.schema_file` is
//! registered under a subject that does not exist yet when the relay
//! starts, and the rows relayed with it decode with confluent-kafka's
//! `AvroDeserializer`. Without `auto_register` a missing subject still
//! stops the relay with the `curl` that registers it; `check` says what
//! `run` would register and registers nothing; a schema file that does not
//! parse is named. A `[[routing.rules]]` entry with a schema file of its
//! own (a JSON Schema) registers it under the rule's subject.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;

use super::avro::{avro_env, insert, order, order_schema};
use super::check::{check, line};
use crate::harness::kafka::shared as broker;
use crate::harness::python::{read_avro, read_json_schema};
use crate::harness::registry::shared as registry;
use crate::harness::relay::{edit_config, Env, Relay};

/// The relay stops at start, its log naming each of `needles`.
#[track_caller]
fn stops_naming(e: &Env, needles: &[&str]) {
    let mut relay = Relay::start(e);
    let status = relay
        .wait(Duration::from_secs(60))
        .expect("the relay stops at start");
    assert!(!status.success());
    let log = relay.log();
    for n in needles {
        assert!(log.contains(n), "{n}: {log}");
    }
}

/// Writes `per` rows for each of `writers` keys, numbered from `from`, and
/// checks that `total` records are on the topic, each decoding to its row
/// with schema `id`.
fn relay_and_decode(e: &Env, topic: &str, id: u64, writers: usize, from: usize, per: usize) {
    for w in 0..writers {
        let payloads: Vec<Value> = (from..from + per).map(|i| order(w, i).0).collect();
        insert(e, &format!("writer-{w}"), &payloads);
    }
    let total = writers * (from + per);
    let got = broker().consume_all(topic, total, Duration::from_secs(90));
    assert_eq!(got.len(), total);
    let decoded = read_avro(registry().url(), topic, &got);
    let mut seen: HashMap<(u64, u64), Value> = HashMap::new();
    for d in &decoded {
        assert!(d["error"].is_null(), "{d}");
        assert_eq!(d["schema_id"].as_u64(), Some(id), "{d}");
        let v = &d["value"];
        let k = (v["writer"].as_u64().unwrap(), v["seq"].as_u64().unwrap());
        assert!(seen.insert(k, v.clone()).is_none(), "{k:?} twice");
    }
    for w in 0..writers {
        for i in 0..from + per {
            assert_eq!(seen[&(w as u64, i as u64)], order(w, i).1, "row {w}/{i}");
        }
    }
}

fn paid_schema() -> Value {
    serde_json::json!({"type": "object", "properties": {"paid": {"type": "integer"}},
        "required": ["paid"], "additionalProperties": false})
}

/// Writes 10 `paid` events (round `round`), which the rule routes to
/// `topic`; checks every record there so far decodes with
/// confluent-kafka's `JSONDeserializer` with the subject's latest id (the
/// rule's file, registered as a JSON Schema); that id.
fn paid_relayed_and_decoded(e: &Env, topic: &str, subject: &str, round: u64) -> u64 {
    let values: Vec<String> = (0..10)
        .map(|i| format!("('order', 'p', 'paid', '{{\"paid\": {}}}')", round * 10 + i))
        .collect();
    super::insert_rows(e, &values);
    let total = 10 * (round as usize + 1);
    let got = broker().consume_all(topic, total, Duration::from_secs(60));
    assert_eq!(got.len(), total);
    let (_, found) =
        registry().request("GET", &format!("/subjects/{subject}/versions/latest"), None);
    assert_eq!(found["schemaType"], "JSON", "{found}");
    let id = found["id"].as_u64().unwrap();
    let mut paid: Vec<u64> = read_json_schema(registry().url(), topic, &got)
        .iter()
        .map(|d| {
            assert_eq!(d["schema_id"].as_u64(), Some(id), "{d}");
            d["value"]["paid"].as_u64().unwrap_or_else(|| panic!("{d}"))
        })
        .collect();
    paid.sort_unstable();
    assert_eq!(paid, (0..total as u64).collect::<Vec<_>>());
    id
}

#[test]
fn auto_register_registers_the_schema_file_under_a_new_subject_and_the_rows_decode() {
    let reg = registry();
    let (e, topic) = avro_env("regauto", reg, "");
    let subject = format!("{topic}-value");
    let dir = tempfile::tempdir().unwrap();
    let schema_file = dir.path().join("order.avsc");
    std::fs::write(&schema_file, order_schema().to_string()).unwrap();
    let latest = format!("/subjects/{subject}/versions/latest");
    assert_eq!(reg.request("GET", &latest, None).0, 404);

    // Without auto_register: the missing subject stops the relay, as before.
    stops_naming(
        &e,
        &[
            &format!("subject `{subject}` does not exist"),
            "curl -X POST",
        ],
    );

    // A rule with a schema file of its own (a JSON Schema, its value
    // format), registered under the rule's subject.
    let paid_topic = format!("{topic}.paid");
    let paid_subject = format!("{paid_topic}-value");
    let paid_file = dir.path().join("paid.json");
    std::fs::write(&paid_file, paid_schema().to_string()).unwrap();
    edit_config(
        &e,
        "value_format = \"avro\"",
        &format!(
            "value_format = \"avro\"\nauto_register = true\nschema_file = \"{}\"\n\
             [[routing.rules]]\nevent_type = \"paid\"\ntopic = \"{paid_topic}\"\n\
             value_format = \"json-schema\"\nschema_file = \"{}\"",
            schema_file.display(),
            paid_file.display()
        ),
    );
    // `check` tells what `run` would register, and registers nothing.
    let (_, text) = check(&e, &[], &[]);
    let register = line(&text, "warn", "register").join("\n");
    assert!(
        register.contains(&format!("would register {}", schema_file.display()))
            && register.contains(&format!("subject `{subject}`"))
            && register.contains("development only"),
        "{text}"
    );
    assert!(
        register.contains(&format!(
            "would register {} (routing.rules[0].schema_file) under subject `{paid_subject}`",
            paid_file.display()
        )),
        "{text}"
    );
    assert!(line(&text, "FAIL", "schema").is_empty(), "{text}");
    assert_eq!(reg.request("GET", &latest, None).0, 404, "check registered");
    let paid_latest = format!("/subjects/{paid_subject}/versions/latest");
    assert_eq!(
        reg.request("GET", &paid_latest, None).0,
        404,
        "check registered"
    );

    let relay = Relay::start(&e);
    crate::harness::wait::wait_for(
        "the relay to register the subject",
        Duration::from_secs(60),
        || reg.request("GET", &latest, None).0 == 200,
    );
    let (_, found) = reg.request("GET", &latest, None);
    let id = found["id"].as_u64().unwrap();
    assert_eq!(found["version"], 1, "{found}");
    relay_and_decode(&e, &topic, id, 3, 0, 100);
    let paid_id = paid_relayed_and_decoded(&e, &paid_topic, &paid_subject, 0);
    assert_ne!(paid_id, id);
    let log = relay.log();
    assert!(
        log.contains("registered routing.schema_file") && log.contains("development only"),
        "{log}"
    );
    drop(relay);

    // A restart registers the same file again: the same schema, no new
    // version.
    let relay = Relay::start(&e);
    relay_and_decode(&e, &topic, id, 3, 100, 20);
    assert_eq!(
        paid_relayed_and_decoded(&e, &paid_topic, &paid_subject, 1),
        paid_id
    );
    for s in [&subject, &paid_subject] {
        let (_, versions) = reg.request("GET", &format!("/subjects/{s}/versions"), None);
        assert_eq!(versions, serde_json::json!([1]), "{s}: {}", relay.log());
    }
    drop(relay);

    // A schema file that does not parse: named by check and run.
    std::fs::write(&schema_file, "{\"type\": \"record\", \"name\": \"Broken\"}").unwrap();
    let (out, text) = check(&e, &[], &[]);
    let failed = line(&text, "FAIL", "schema").join("\n");
    assert!(
        failed.contains("routing.schema_file") && failed.contains("order.avsc"),
        "{text}"
    );
    assert_eq!(out.status.code(), Some(1), "{text}");
    stops_naming(&e, &["routing.schema_file", "not an Avro schema"]);
}
