//! A microbenchmark of the Avro encode, run by hand (it asserts only that
//! every payload encodes): `AVRO_BENCH_N=200000 cargo test --release --lib
//! outbox::avro::bench -- --ignored --nocapture`. It prints ns per event;
//! under `perf stat -e instructions`, two runs with different N give
//! instructions per event (their difference over the difference in N), a
//! figure the host's load does not change.

use std::hint::black_box;
use std::time::Instant;

use serde_json::json;

use super::AvroSchema;

/// scripts/lib/formats.sh's schema of the bench payload.
fn bench_schema() -> AvroSchema {
    AvroSchema::parse(
        &json!({"type": "record", "name": "OrderCreated", "namespace": "bench", "fields": [
            {"name": "t", "type": "long"}, {"name": "orderId", "type": "string"},
            {"name": "amount", "type": "string"}, {"name": "currency", "type": "string"},
            {"name": "customer", "type": "string"}, {"name": "note", "type": "string"}]})
        .to_string(),
    )
    .unwrap()
}

/// The bench payload (scripts/lib/workload.sh) as PostgreSQL's jsonb writes
/// it: 374 bytes, padded by the note.
fn bench_payload(i: usize) -> String {
    let head = format!(
        r#"{{"t": {}, "note": "", "amount": "100.50", "orderId": "{:010}", "currency": "RUB", "customer": "c-{:03}"}}"#,
        1_796_400_000_000_000u64 + i as u64,
        100_000_000 + i,
        i % 1000
    );
    let pad = "x".repeat(374 - head.len());
    head.replace(r#""note": """#, &format!(r#""note": "{pad}""#))
}

/// tests/registry/avro.rs's nested schema and payloads.
fn nested_schema() -> AvroSchema {
    AvroSchema::parse(
        &json!({
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
        .to_string(),
    )
    .unwrap()
}

fn nested_payload(i: usize) -> String {
    let placed = if i % 2 == 0 {
        json!("2026-12-04T20:22:42.123Z")
    } else {
        json!(1_796_400_000_123i64 + i as i64)
    };
    let address = match i % 3 {
        0 => json!(null),
        1 => json!({"city": format!("city-{i}")}),
        _ => json!({"city": "Zürich 🏔", "zip": "8001"}),
    };
    let tags: Vec<String> = (0..i % 4).map(|t| format!("t{t}")).collect();
    let status = ["NEW", "PAID", "SHIPPED"][i % 3];
    let mut p = json!({
        "seq": i, "writer": 3,
        "customer": {"name": format!("c-3-{i}"), "address": address},
        "status": status,
        "tags": tags,
        "attrs": {"w": 3, "i": i},
        "placed_at": placed,
        "ship_on": "2026-12-24",
        "total": format!("{}{:07}.{:02}", 1_234_567_893, i * 7, i % 100),
        "ref": format!("00000000-0000-4000-8000-{:06}{:06}", 3, i),
    });
    if i % 5 == 0 {
        p["note"] = json!(format!("note {i}"));
    }
    p.to_string()
}

fn run(name: &str, schema: &AvroSchema, payloads: &[String], n: usize) {
    let mut out = Vec::new();
    let start = Instant::now();
    for i in 0..n {
        out.clear();
        schema
            .encode(black_box(payloads[i % payloads.len()].as_bytes()), &mut out)
            .unwrap();
        black_box(&out);
    }
    let ns = start.elapsed().as_nanos() as f64 / n.max(1) as f64;
    println!("avro encode {name}: {n} events, {ns:.0} ns/event");
}

#[test]
#[ignore = "a benchmark, run by hand (see the module's comment)"]
fn encode_cost() {
    let n: usize = std::env::var("AVRO_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let only = std::env::var("AVRO_BENCH_PAYLOAD").unwrap_or_default();
    if only.is_empty() || only == "bench" {
        let payloads: Vec<String> = (0..64).map(bench_payload).collect();
        assert_eq!(payloads[0].len(), 374);
        run("bench payload", &bench_schema(), &payloads, n);
    }
    if only.is_empty() || only == "nested" {
        let payloads: Vec<String> = (0..64).map(nested_payload).collect();
        run("nested payload", &nested_schema(), &payloads, n);
    }
}
