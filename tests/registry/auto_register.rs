//! Issue 37 §2 `routing.auto_register`: a route's `routing.schema_file` is
//! registered under a subject that does not exist yet when the relay
//! starts, and the rows relayed with it decode with confluent-kafka's
//! `AvroDeserializer`. Without `auto_register` a missing subject still
//! stops the relay with the `curl` that registers it; `check` says what
//! `run` would register and registers nothing; a schema file that does not
//! parse is named.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;

use super::avro::{avro_env, insert, order, order_schema};
use super::check::{check, line};
use crate::harness::kafka::shared as broker;
use crate::harness::python::read_avro;
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

    edit_config(
        &e,
        "value_format = \"avro\"",
        &format!(
            "value_format = \"avro\"\nauto_register = true\nschema_file = \"{}\"",
            schema_file.display()
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
    assert!(line(&text, "FAIL", "schema").is_empty(), "{text}");
    assert_eq!(reg.request("GET", &latest, None).0, 404, "check registered");

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
    let (_, versions) = reg.request("GET", &format!("/subjects/{subject}/versions"), None);
    assert_eq!(versions, serde_json::json!([1]), "{}", relay.log());
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
