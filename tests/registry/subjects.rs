//! Issue 37, subjects per event and value formats per rule: one table whose
//! rules send payments in Avro and invoices in JSON Schema, each event type
//! its own subject (`com.acme.${event_type}`, Confluent's
//! RecordNameStrategy), and the rest as plain JSON. Subjects met first at
//! run time are fetched once each: the registry's request count does not
//! grow with the events.

use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::http::{free_port, Scrape};
use crate::harness::kafka::shared as broker;
use crate::harness::python::{read_avro, read_json_schema};
use crate::harness::registry::shared as registry;
use crate::harness::relay::{env, Env, Relay};

fn insert(e: &Env, event_type: &str, payloads: &[Value]) {
    let values: Vec<String> = payloads
        .iter()
        .map(|p| format!("('acct', 'k', '{event_type}', '{p}'::jsonb)"))
        .collect();
    super::insert_rows(e, &values);
}

fn seqs(n: usize, extra: Value) -> Vec<Value> {
    (0..n)
        .map(|i| {
            let mut v = extra.clone();
            v["seq"] = json!(i);
            v
        })
        .collect()
}

#[test]
fn each_event_type_is_its_own_subject_fetched_once_and_rules_choose_the_format() {
    const N: usize = 40;
    let reg = registry();
    let slot = "regsubjects";
    let (orders, payments, invoices) = (
        format!("{slot}.orders"),
        format!("{slot}.payments"),
        format!("{slot}.invoices"),
    );
    let dlq = format!("{slot}.dlq");
    let port = free_port();
    let e = env(
        broker().bootstrap(),
        slot,
        &format!(
            "[routing]\ntopic = \"{orders}\"\nsubject = \"com.acme.{slot}.${{event_type}}\"\n\
             [[routing.rules]]\nevent_type_prefix = \"payment.\"\ntopic = \"{payments}\"\n\
             value_format = \"avro\"\n\
             [[routing.rules]]\nevent_type_prefix = \"invoice.\"\ntopic = \"{invoices}\"\n\
             value_format = \"json-schema\"\n\
             [schema_registry]\nurl = \"{}\"\n\
             [relay]\non_error = \"dead_letter\"\ndead_letter_topic = \"{dlq}\"\n\
             [metrics]\nlisten = \"127.0.0.1:{port}\"\n",
            reg.url()
        ),
    );
    let made = reg.register_avro(
        &format!("com.acme.{slot}.payment.made"),
        &json!({"type": "record", "name": "Made", "fields": [
            {"name": "seq", "type": "long"}, {"name": "amount", "type": "long"}]}),
    );
    let refunded = reg.register_avro(
        &format!("com.acme.{slot}.payment.refunded"),
        &json!({"type": "record", "name": "Refunded", "fields": [
            {"name": "seq", "type": "long"}, {"name": "reason", "type": "string"}]}),
    );
    let sent = reg.register_json_schema(
        &format!("com.acme.{slot}.invoice.sent"),
        // Apicurio tells a JSON Schema by its content: it wants a
        // `$schema` or `properties` to see one.
        &json!({"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
            "properties": {"seq": {"type": "integer"}, "to": {"type": "string"}},
            "required": ["seq", "to"]}),
    );
    let relay = Relay::start(&e);
    for round in 0..2 {
        insert(&e, "order.placed", &seqs(N / 2, json!({"round": round})));
        insert(&e, "payment.made", &seqs(N / 2, json!({"amount": 5})));
        insert(
            &e,
            "payment.refunded",
            &seqs(N / 2, json!({"reason": "late"})),
        );
        insert(&e, "invoice.sent", &seqs(N / 2, json!({"to": "a@b"})));
    }
    // No subject registered for it: the event's error, not the relay's.
    insert(&e, "payment.lost", &[json!({"seq": 0})]);

    let got = broker().consume_all(&orders, N, Duration::from_secs(60));
    assert_eq!(got.len(), N, "{}", relay.log());
    assert!(got
        .iter()
        .all(|r| serde_json::from_str::<Value>(r.value_str().unwrap()).is_ok()));

    let got = broker().consume_all(&payments, 2 * N, Duration::from_secs(60));
    assert_eq!(got.len(), 2 * N, "{}", relay.log());
    let decoded = read_avro(reg.url(), &payments, &got);
    let (mut n_made, mut n_refunded) = (0, 0);
    for d in &decoded {
        assert!(d["error"].is_null(), "{d}");
        if d["schema_id"] == made {
            assert_eq!(d["value"]["amount"], 5, "{d}");
            n_made += 1;
        } else {
            assert_eq!(d["schema_id"], refunded, "{d}");
            assert_eq!(d["value"]["reason"], "late", "{d}");
            n_refunded += 1;
        }
    }
    assert_eq!((n_made, n_refunded), (N, N));

    let got = broker().consume_all(&invoices, N, Duration::from_secs(60));
    assert_eq!(got.len(), N, "{}", relay.log());
    for d in read_json_schema(reg.url(), &invoices, &got) {
        assert_eq!(d["schema_id"], sent, "{d}");
        assert_eq!(d["value"]["to"], "a@b", "{d}");
    }

    let dead = broker().consume_all(&dlq, 1, Duration::from_secs(60));
    assert_eq!(dead.len(), 1, "{}", relay.log());
    let reason = String::from_utf8(dead[0].header("outboxd.error").unwrap().to_vec()).unwrap();
    assert!(
        reason.contains(&format!(
            "subject `com.acme.{slot}.payment.lost` does not exist"
        )) && reason.contains("curl -X POST"),
        "{reason}"
    );
    // Three subjects found and one missing, each asked once for 160 events.
    let scrape = Scrape::take(port);
    assert_eq!(
        scrape.value("outboxd_schema_registry_requests_total", "outcome=\"ok\""),
        3.0
    );
    assert_eq!(
        scrape.value(
            "outboxd_schema_registry_requests_total",
            "outcome=\"not_found\""
        ),
        1.0
    );
}
