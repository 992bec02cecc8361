//! Real clients that no one here wrote, to read records back with: the
//! CloudEvents SDK's Kafka binding and OpenTelemetry's W3C propagator,
//! from PyPI, in a venv that `scripts/python.sh` installs once into the
//! cache. `tests/python/read_records.py` hands them the records' exact
//! bytes as the broker returned them.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde_json::{json, Value};

use crate::harness::kafka::Record;

/// How the CloudEvents SDK is to read the records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `from_binary`.
    Binary,
    /// `from_structured`.
    Structured,
    /// No CloudEvent: only the trace context.
    None,
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The venv's interpreter, installed on first use.
fn python() -> &'static PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let out = Command::new(repo().join("scripts/python.sh"))
            .stderr(Stdio::inherit())
            .output()
            .expect("run scripts/python.sh");
        assert!(out.status.success(), "scripts/python.sh failed");
        PathBuf::from(String::from_utf8(out.stdout).unwrap().trim())
    })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// What the clients made of each record, in order: `event` (the
/// CloudEvent's attributes and `data`, `time` in ISO form), `error` (why
/// the SDK refused it) and `trace` (the propagator's span context).
pub fn read_records(mode: Mode, records: &[Record]) -> Vec<Value> {
    let request = json!({
        "mode": match mode {
            Mode::Binary => "binary",
            Mode::Structured => "structured",
            Mode::None => "none",
        },
        "records": records.iter().map(|r| json!({
            "key": r.key.as_deref().map(hex),
            "value": r.value.as_deref().map(hex),
            "headers": r.headers.iter().map(|(n, v)| json!([n, hex(v)])).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    });
    run_reader("read_records.py", &request, records.len())
}

/// What confluent-kafka's `AvroDeserializer` (with a fresh
/// `SchemaRegistryClient` on `registry`) makes of each record's value, in
/// order: `{"value": …, "schema_id": n}` or `{"error": …}`; see
/// `tests/python/read_avro.py` for how Avro types are shown.
pub fn read_avro(registry: &str, topic: &str, records: &[Record]) -> Vec<Value> {
    let request = json!({
        "registry": registry,
        "topic": topic,
        "values": records.iter().map(|r| r.value.as_deref().map(hex)).collect::<Vec<_>>(),
    });
    run_reader("read_avro.py", &request, records.len())
}

/// What confluent-kafka's `JSONDeserializer` (no schema of its own, a
/// fresh `SchemaRegistryClient` on `registry`: it fetches the writer schema
/// by the frame's id and validates the value with it) makes of each
/// record's value, in order: `{"value": …, "schema_id": n}` or
/// `{"error": …}`.
pub fn read_json_schema(registry: &str, topic: &str, records: &[Record]) -> Vec<Value> {
    let request = json!({
        "registry": registry,
        "topic": topic,
        "values": records.iter().map(|r| r.value.as_deref().map(hex)).collect::<Vec<_>>(),
    });
    run_reader("read_json_schema.py", &request, records.len())
}

/// `values` encoded by confluent-kafka's own `AvroSerializer` with `schema`
/// (already registered under `<topic>-value`: it is looked up, not
/// registered), framed in Confluent's wire format, as a service would write
/// them into a bytea payload column.
pub fn write_avro(registry: &str, topic: &str, schema: &Value, values: &[Value]) -> Vec<Vec<u8>> {
    let request = json!({
        "registry": registry,
        "topic": topic,
        "schema": schema.to_string(),
        "values": values,
    });
    run_reader("write_avro.py", &request, values.len())
        .iter()
        .map(|v| {
            let hex = v["framed"]
                .as_str()
                .unwrap_or_else(|| panic!("AvroSerializer refused a value: {v}"));
            (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect()
        })
        .collect()
}

/// Longest a reader may take: a few thousand records decode in seconds.
/// The scripts dump their threads' stacks to stderr 30 s before it
/// (tests/python/registry_client.py, `DUMP_AFTER_S`).
const READER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(180);

/// Runs `tests/python/<script>` on `request` (its stdin, as JSON) and reads
/// one JSON line per record back: there must be `records` of them.
fn run_reader(script: &str, request: &Value, records: usize) -> Vec<Value> {
    let mut child = Command::new(python())
        .arg(repo().join("tests/python").join(script))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {script}: {e}"));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(request.to_string().as_bytes())
        .unwrap();
    // A client that never hears back from the registry (seen once on a
    // loaded machine) would hang the test binary: it is killed instead,
    // and the test fails naming the script.
    let pid = child.id();
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if finished.recv_timeout(READER_TIMEOUT).is_err() {
            let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
        }
    });
    let out = child.wait_with_output().unwrap();
    let _ = done.send(());
    let _ = watchdog.join();
    assert!(
        out.status.success(),
        "{script} failed ({}; killed after {READER_TIMEOUT:?} if it got no answer):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // A request retried after a timeout (tests/python/registry_client.py)
    // is said on stderr: shown with the test's output.
    if !out.stderr.is_empty() {
        eprintln!("{script}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let results: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(results.len(), records, "{script}: one answer per record");
    results
}
