//! Issue 37, CloudEvents binary mode with a registry value format: the
//! value is the framed record (decoded by confluent-kafka), `content-type`
//! is the format's, and `ce_dataschema` is a URL the registry answers with
//! the schema.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::kafka::shared as broker;
use crate::harness::python::{read_avro, read_json_schema};
use crate::harness::registry::shared as registry;
use crate::harness::relay::{env, Relay};

const ROWS: usize = 60;

/// Relays `ROWS` payloads `{"seq": i}` in `value_format` as binary
/// CloudEvents, and checks the headers and the decoded values.
fn relay_cloudevents(slot: &str, value_format: &str, schema: &Value, content_type: &str) {
    let reg = registry();
    let topic = format!("{slot}.events");
    let e = env(
        broker().bootstrap(),
        slot,
        &format!(
            "[routing]\ntopic = \"{topic}\"\nvalue_format = \"{value_format}\"\n\
             format = \"cloudevents-binary\"\n[schema_registry]\nurl = \"{}\"\n",
            reg.url()
        ),
    );
    let subject = format!("{topic}-value");
    let id = if value_format == "avro" {
        reg.register_avro(&subject, schema)
    } else {
        reg.register_json_schema(&subject, schema)
    };
    let relay = Relay::start(&e);
    let values: Vec<String> = (0..ROWS)
        .map(|i| format!("('order', 'k{}', 'placed', '{{\"seq\": {i}}}')", i % 3))
        .collect();
    super::insert_rows(&e, &values);
    let got = broker().consume_all(&topic, ROWS, Duration::from_secs(60));
    assert_eq!(got.len(), ROWS, "{}", relay.log());
    let dataschema = format!("{}/schemas/ids/{id}", reg.url());
    for r in &got {
        assert_eq!(r.header("content-type"), Some(content_type.as_bytes()));
        assert_eq!(r.header("ce_dataschema"), Some(dataschema.as_bytes()));
        assert_eq!(r.header("ce_specversion"), Some(&b"1.0"[..]));
        assert!(r.header("ce_id").is_some());
    }
    // The dataschema URL serves the schema.
    let (status, body) = reg.request("GET", &format!("/schemas/ids/{id}"), None);
    assert_eq!(status, 200, "{body}");
    let served: Value = serde_json::from_str(body["schema"].as_str().unwrap()).unwrap();
    assert_eq!(&served, schema);

    let decoded = if value_format == "avro" {
        read_avro(reg.url(), &topic, &got)
    } else {
        read_json_schema(reg.url(), &topic, &got)
    };
    let seqs: HashSet<u64> = decoded
        .iter()
        .map(|d| {
            assert_eq!(d["schema_id"], id, "{d}");
            d["value"]["seq"].as_u64().unwrap_or_else(|| panic!("{d}"))
        })
        .collect();
    assert_eq!(seqs.len(), ROWS, "0 lost, 0 duplicates");
}

#[test]
fn cloudevents_binary_with_avro_says_application_avro_and_points_at_the_schema() {
    let schema = json!({"type": "record", "name": "Placed", "namespace": "com.acme",
        "fields": [{"name": "seq", "type": "long"}]});
    relay_cloudevents("regceavro", "avro", &schema, "application/avro");
}

#[test]
fn cloudevents_binary_with_json_schema_says_application_schema_json_and_points_at_the_schema() {
    let schema = json!({"type": "object", "properties": {"seq": {"type": "integer"}},
        "required": ["seq"]});
    relay_cloudevents(
        "regcejson",
        "json-schema",
        &schema,
        "application/schema+json",
    );
}
