//! Issue 21: the CloudEvents formats and the trace context column, read
//! back from a real broker and parsed by clients no one here wrote (the
//! CloudEvents SDK's Kafka binding, OpenTelemetry's W3C propagator; see
//! `harness::python`). Values that cannot be relayed follow
//! `relay.on_error`, and nothing is lost.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{json, Value};

use crate::harness::kafka::{shared, Record};
use crate::harness::python::{read_records, Mode};
use crate::harness::relay::{confirmed_lsn, env, lsn_now, Env, Relay};
use crate::harness::wait::wait_for;

/// The trace context, extension and tenant columns, on `table`.
fn add_columns(e: &Env, table: &str) {
    e.pg.psql(
        "app",
        &format!("ALTER TABLE {table} ADD COLUMN trace text, ADD COLUMN tenant text, ADD COLUMN ext jsonb"),
    );
}

/// One row as written, and what a consumer should get from it.
struct Row {
    id: String,
    agg: String,
    event_type: String,
    payload: Option<String>,
    /// The trace context column, as SQL (`NULL` or a literal).
    trace_sql: String,
    /// (trace id, span id, sampled, tracestate) the row carries, if any.
    trace: Option<(String, String, bool, String)>,
    tenant: Option<String>,
    /// The extension column's JSON, if any.
    ext: Option<Value>,
}

fn hex(seed: &str, len: usize) -> String {
    // Deterministic, non-zero lower-case hex ids.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut out = String::new();
    while out.len() < len {
        for b in seed.bytes().chain(out.clone().bytes()) {
            h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
        }
        out.push_str(&format!("{h:016x}"));
    }
    out.truncate(len);
    out
}

fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// 24 varied rows: the three trace context forms (and none, and empty),
/// payloads of every JSON kind, unicode, an empty aggregate id (no
/// subject), extensions of each type.
fn varied_rows(prefix: &str) -> Vec<Row> {
    let payloads = [
        r#"{"amount": 1999, "currency": "EUR", "lines": [{"sku": "a", "qty": 2}]}"#,
        r#"{"note": "Привет 🎉 \"quoted\" \\ back"}"#,
        r#""just a string""#,
        "42",
        "[1, 2, 3]",
        "true",
    ];
    (0..24)
        .map(|i| {
            let trace_id = hex(&format!("{prefix}t{i}"), 32);
            let span_id = hex(&format!("{prefix}s{i}"), 16);
            let sampled = i % 2 == 0;
            let flags = if sampled { "01" } else { "00" };
            let tp = format!("00-{trace_id}-{span_id}-{flags}");
            let state = format!("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE{i}");
            let (trace_sql, trace) = match i % 5 {
                0 => (
                    quote(&tp),
                    Some((trace_id, span_id, sampled, String::new())),
                ),
                1 => (
                    quote(&json!({"traceparent": tp, "tracestate": state}).to_string()),
                    Some((trace_id, span_id, sampled, state)),
                ),
                2 => (
                    // As Debezium's tracing writes it: Properties.store.
                    quote(&format!(
                        "#Mon Nov 30 02:04:20 UTC 2026\ntraceparent={tp}\ntracestate={}\n",
                        state.replace('=', "\\=")
                    )),
                    Some((trace_id, span_id, sampled, state)),
                ),
                3 => ("NULL".to_owned(), None),
                _ => ("''".to_owned(), None),
            };
            Row {
                id: uuid::Uuid::new_v4().to_string(),
                agg: if i == 7 {
                    String::new()
                } else {
                    format!("agg-{}", i % 4)
                },
                event_type: format!("payment.{}", ["created", "completed", "refunded"][i % 3]),
                payload: Some(payloads[i % payloads.len()].to_owned()),
                trace_sql,
                trace,
                tenant: (i % 3 != 0).then(|| format!("tenant-{i}")),
                ext: match i % 4 {
                    0 => None,
                    1 => Some(json!({"region": "eu", "priority": i, "replayed": false})),
                    2 => Some(json!({"region": "us-east", "gone": null})),
                    _ => Some(json!({})),
                },
            }
        })
        .collect()
}

fn insert(e: &Env, table: &str, rows: &[Row]) {
    let opt = |v: &Option<String>| v.as_deref().map_or("NULL".to_owned(), quote);
    let values: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "({}, 'payment', {}, {}, {}::jsonb, {}, {}, {}::jsonb)",
                quote(&r.id),
                quote(&r.agg),
                quote(&r.event_type),
                opt(&r.payload),
                r.trace_sql,
                opt(&r.tenant),
                opt(&r.ext.as_ref().map(Value::to_string)),
            )
        })
        .collect();
    // A few transactions, so commit times differ.
    for chunk in values.chunks(5) {
        e.pg.psql(
            "app",
            &format!(
                "INSERT INTO {table} (id, aggregate_type, aggregate_id, event_type, payload, trace, tenant, ext) VALUES {}",
                chunk.join(", ")
            ),
        );
    }
}

/// `payload` as PostgreSQL prints the jsonb, by id.
fn payload_texts(e: &Env, table: &str) -> HashMap<String, String> {
    e.pg.psql(
        "app",
        &format!("SELECT id || E'\\t' || payload::text FROM {table} WHERE payload IS NOT NULL"),
    )
    .lines()
    .filter_map(|l| l.split_once('\t'))
    .map(|(id, p)| (id.to_owned(), p.to_owned()))
    .collect()
}

/// The extension attributes a row should give: `tenant` from the config,
/// the rest from its JSON column (nulls left out; in binary mode every value
/// is a header, so a string).
fn expected_extensions(r: &Row, binary: bool) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    if let Some(t) = &r.tenant {
        m.insert("tenant".into(), json!(t));
    }
    if let Some(Value::Object(o)) = &r.ext {
        for (k, v) in o {
            let v = match v {
                Value::Null => continue,
                Value::String(_) => v.clone(),
                other if binary => json!(other.to_string()),
                other => other.clone(),
            };
            m.insert(k.clone(), v);
        }
    }
    m
}

/// Checks what the SDK and the propagator made of each record against the
/// rows. `source` is the expected `source`.
fn check_events(
    mode: Mode,
    records: &[Record],
    rows: &[Row],
    texts: &HashMap<String, String>,
    source: &str,
) {
    let parsed = read_records(mode, records);
    let by_id: HashMap<&str, &Row> = rows.iter().map(|r| (r.id.as_str(), r)).collect();
    let core = [
        "specversion",
        "id",
        "source",
        "type",
        "time",
        "subject",
        "datacontenttype",
        "partitionkey",
        "data",
    ];
    for (record, p) in records.iter().zip(&parsed) {
        assert!(p["error"].is_null(), "the SDK refused {record:?}: {p}");
        let ev = p["event"].as_object().expect("an event");
        let row = by_id[ev["id"].as_str().unwrap()];
        assert_eq!(ev["specversion"], "1.0");
        assert_eq!(ev["source"], source);
        assert_eq!(ev["type"], row.event_type.as_str());
        assert_eq!(ev["datacontenttype"], "application/json");
        // Key = aggregate id = the binding's partitionkey.
        assert_eq!(record.key_str(), Some(row.agg.as_str()));
        assert_eq!(ev["partitionkey"], row.agg.as_str());
        if row.agg.is_empty() {
            assert!(!ev.contains_key("subject"), "{ev:?}");
        } else {
            assert_eq!(ev["subject"], row.agg.as_str());
        }
        // time = the commit time, to the microsecond; the record's own
        // timestamp is the commit time in milliseconds.
        let time = chrono_ms(ev["time"].as_str().unwrap());
        assert_eq!(Some(time), record.timestamp, "{ev:?}");
        let payload = &texts[&row.id];
        let want: Value = serde_json::from_str(payload).unwrap();
        assert_eq!(ev["data"], want, "{ev:?}");
        if mode == Mode::Binary {
            // The value is the payload's bytes, untouched.
            assert_eq!(record.value_str(), Some(payload.as_str()));
        } else {
            // The payload is embedded verbatim, not re-serialised.
            let v = record.value_str().unwrap();
            assert!(v.ends_with(&format!(",\"data\":{payload}}}")), "{v}");
        }
        let extensions: serde_json::Map<String, Value> = ev
            .iter()
            .filter(|(k, _)| !core.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        assert_eq!(extensions, expected_extensions(row, mode == Mode::Binary));
        check_trace(&p["trace"], row);
    }
}

fn check_trace(got: &Value, row: &Row) {
    match &row.trace {
        None => assert!(got.is_null(), "{got}"),
        Some((trace_id, span_id, sampled, state)) => {
            assert_eq!(got["valid"], true, "{got}");
            assert_eq!(got["remote"], true, "{got}");
            assert_eq!(got["trace_id"], trace_id.as_str());
            assert_eq!(got["span_id"], span_id.as_str());
            assert_eq!(got["sampled"], *sampled);
            assert_eq!(got["tracestate"], state.as_str());
        }
    }
}

/// RFC 3339 `YYYY-MM-DDTHH:MM:SS[.ffffff]+00:00` (Python's isoformat) to ms.
fn chrono_ms(t: &str) -> i64 {
    let n = |r: std::ops::Range<usize>| t[r].parse::<i64>().unwrap();
    assert!(t.ends_with("+00:00"), "{t}");
    let (y, mo, d) = (n(0..4), n(5..7), n(8..10));
    let (h, mi, s) = (n(11..13), n(14..16), n(17..19));
    // isoformat leaves the fraction out when it is zero.
    let micros = if &t[19..20] == "." { n(20..26) } else { 0 };
    // Days from civil (Howard Hinnant).
    let yy = if mo <= 2 { y - 1 } else { y };
    let era = yy.div_euclid(400);
    let yoe = yy - era * 400;
    let doy = (153 * ((mo + 9) % 12) + 2) / 5 + d - 1;
    let days = era * 146_097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719_468;
    (days * 86_400 + h * 3600 + mi * 60 + s) * 1000 + micros / 1000
}

#[test]
fn cloudevents_in_both_modes_parse_with_the_sdk_and_traces_with_opentelemetry() {
    let broker = shared();
    let extra = "\
[[outbox]]
table = \"public.outbox\"
[outbox.columns]
trace_context = \"trace\"
ce_extensions = \"ext\"
[outbox.routing]
topic = \"fmt.binary\"
format = \"cloudevents-binary\"
[outbox.routing.cloudevents.extensions]
tenant = \"tenant\"

[[outbox]]
table = \"public.outbox_s\"
[outbox.columns]
trace_context = \"trace\"
ce_extensions = \"ext\"
[outbox.routing]
topic = \"fmt.structured\"
format = \"cloudevents-structured\"
tombstone_on_empty_payload = true
[outbox.routing.cloudevents]
source = \"//billing.example/outbox\"
extensions = { tenant = \"tenant\" }
";
    let e = env(broker.bootstrap(), "fmtce", extra);
    add_columns(&e, "outbox");
    e.pg.psql(
        "app",
        "CREATE TABLE outbox_s (LIKE outbox INCLUDING ALL); \
         ALTER TABLE outbox_s ALTER COLUMN payload DROP NOT NULL; \
         ALTER PUBLICATION outboxd ADD TABLE outbox_s",
    );
    let relay = Relay::start(&e);
    let binary_rows = varied_rows("b");
    let mut structured_rows = varied_rows("s");
    // A tombstone: a NULL payload with tombstone_on_empty_payload.
    structured_rows[5].payload = None;
    insert(&e, "outbox", &binary_rows);
    insert(&e, "outbox_s", &structured_rows);

    let binary = broker.consume_all("fmt.binary", 24, Duration::from_secs(90));
    assert_eq!(binary.len(), 24, "{}", relay.log());
    check_events(
        Mode::Binary,
        &binary,
        &binary_rows,
        &payload_texts(&e, "outbox"),
        "/outboxd/app/public.outbox",
    );

    let structured = broker.consume_all("fmt.structured", 24, Duration::from_secs(90));
    assert_eq!(structured.len(), 24, "{}", relay.log());
    let (tombstones, events): (Vec<Record>, Vec<Record>) =
        structured.into_iter().partition(|r| r.value.is_none());
    for r in &events {
        assert_eq!(
            r.header("content-type"),
            Some(&b"application/cloudevents+json"[..])
        );
    }
    let live: Vec<Row> = structured_rows
        .into_iter()
        .filter(|r| r.payload.is_some())
        .collect();
    check_events(
        Mode::Structured,
        &events,
        &live,
        &payload_texts(&e, "outbox_s"),
        "//billing.example/outbox",
    );
    // The tombstone has no value to hold a structured event: its
    // attributes are binary mode's headers, which the SDK reads.
    assert_eq!(tombstones.len(), 1);
    let t = &read_records(Mode::Binary, &tombstones)[0];
    assert!(t["error"].is_null(), "{t}");
    assert_eq!(t["event"]["source"], "//billing.example/outbox");
    assert_eq!(t["event"]["data"], Value::Null);
    assert!(t["event"].get("datacontenttype").is_none(), "{t}");
}

/// Five rows in their own transactions, the third `bad`; returns the WAL
/// position before the bad one.
fn write_around(e: &Env, bad_trace: &str, bad_ext: &str) -> outboxd::Lsn {
    let one = |n: usize, trace: &str, ext: &str| {
        format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload, trace, ext) \
             VALUES ('p', 'a', 'e', '{{\"n\": {n}}}', {trace}, {ext})"
        )
    };
    let good_trace = quote("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
    e.pg.psql("app", &one(0, &good_trace, "NULL"));
    e.pg.psql("app", &one(1, "NULL", "'{\"region\": \"eu\"}'"));
    let before = lsn_now(&e.pg);
    e.pg.psql("app", &one(2, bad_trace, bad_ext));
    e.pg.psql("app", &one(3, &good_trace, "NULL"));
    e.pg.psql("app", &one(4, "NULL", "NULL"));
    before
}

const BINARY: &str = "[outbox.columns]\ntrace_context = \"trace\"\nce_extensions = \"ext\"\n\
                      [routing]\ntopic = \"SLOT.out\"\nformat = \"cloudevents-binary\"\n";

fn numbers(records: &[Record]) -> Vec<u64> {
    records
        .iter()
        .map(|r| {
            serde_json::from_str::<Value>(r.value_str().unwrap()).unwrap()["n"]
                .as_u64()
                .unwrap()
        })
        .collect()
}

fn halts_before(slot: &str, bad_trace: &str, bad_ext: &str, needle: &str) {
    let broker = shared();
    let e = env(broker.bootstrap(), slot, &BINARY.replace("SLOT", slot));
    add_columns(&e, "outbox");
    let relay = Relay::start(&e);
    let before = write_around(&e, bad_trace, bad_ext);
    let topic = format!("{slot}.out");
    let got = broker.consume_all(&topic, 2, Duration::from_secs(60));
    assert_eq!(numbers(&got), [0, 1], "{}", relay.log());
    wait_for("the halt to be logged", Duration::from_secs(30), || {
        relay.log().contains("relay halted")
    });
    let log = relay.log();
    assert!(log.contains(needle), "{needle:?} not in the log:\n{log}");
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        broker.record_count(&topic),
        2,
        "events after the bad row were published"
    );
    let confirmed = confirmed_lsn(&e.pg, slot);
    assert!(
        confirmed <= before,
        "slot confirmed {confirmed} past the bad row (written after {before})"
    );
}

#[test]
fn an_invalid_trace_context_halts_the_relay_before_its_row_under_stop() {
    halts_before(
        "fmtstoptrace",
        "'00-00000000000000000000000000000000-b7ad6b7169203331-01'",
        "NULL",
        "trace id is all zeros",
    );
}

#[test]
fn an_invalid_extension_name_halts_the_relay_before_its_row_under_stop() {
    halts_before(
        "fmtstopext",
        "NULL",
        "'{\"Tenant_ID\": \"x\"}'",
        "only lower-case letters",
    );
}

#[test]
fn invalid_trace_contexts_and_extension_names_go_to_the_dead_letter_topic() {
    let broker = shared();
    let slot = "fmtdlq";
    let extra = format!(
        "{}[relay]\non_error = \"dead_letter\"\ndead_letter_topic = \"fmtdlq.dlq\"\n",
        BINARY.replace("SLOT", slot)
    );
    let e = env(broker.bootstrap(), slot, &extra);
    add_columns(&e, "outbox");
    let relay = Relay::start(&e);
    // Two bad rows: a traceparent of version ff, and a good one with an
    // extension named against the spec's rule.
    write_around(
        &e,
        "'ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'",
        "NULL",
    );
    write_around(
        &e,
        "'00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01'",
        "'{\"data\": \"reserved\"}'",
    );
    let end = lsn_now(&e.pg);
    let got = broker.consume_all("fmtdlq.out", 8, Duration::from_secs(60));
    assert_eq!(numbers(&got), [0, 1, 3, 4, 0, 1, 3, 4], "{}", relay.log());
    // The good ones are CloudEvents with a trace the propagator reads.
    for p in read_records(Mode::Binary, &got) {
        assert!(p["error"].is_null(), "{p}");
        if !p["trace"].is_null() {
            assert_eq!(p["trace"]["trace_id"], "0af7651916cd43dd8448eb211c80319c");
            assert_eq!(p["trace"]["span_id"], "b7ad6b7169203331");
        }
    }
    let dlq = broker.consume_all("fmtdlq.dlq", 2, Duration::from_secs(60));
    assert_eq!(dlq.len(), 2, "{}", relay.log());
    let reason =
        |r: &Record| String::from_utf8(r.header("outboxd.error").unwrap().to_vec()).unwrap();
    assert!(
        reason(&dlq[0]).contains("outbox.columns.trace_context"),
        "{}",
        reason(&dlq[0])
    );
    assert!(
        reason(&dlq[0]).contains("version `ff`"),
        "{}",
        reason(&dlq[0])
    );
    assert!(
        reason(&dlq[1]).contains("`data` is a CloudEvents context attribute"),
        "{}",
        reason(&dlq[1])
    );
    for r in &dlq {
        assert_eq!(r.header("outboxd.error.kind"), Some(&b"mapping"[..]));
        assert_eq!(r.key_str(), Some("a"));
        // The row itself, column by column: nothing is lost.
        let row: Value = serde_json::from_str(r.value_str().unwrap()).unwrap();
        assert_eq!(row["payload"], "{\"n\": 2}");
    }
    wait_for(
        "the slot to pass the bad rows",
        Duration::from_secs(30),
        || confirmed_lsn(&e.pg, slot) >= end,
    );
}
