//! A real schema registry for integration tests: Apicurio Registry with
//! in-memory storage, run through `scripts/registry.sh`, spoken to through
//! its Confluent-compatible API (`/apis/ccompat/v7`) as outboxd does.
//!
//! * [`shared()`] — one registry per test binary, started on first use (about
//!   5 s). Subjects are global: use unique subject names (the tests' topics
//!   are unique already).
//!
//! Apicurio differs from Confluent's registry in two ways the tests care
//! about: its default compatibility is NONE (Confluent's is BACKWARD; set it
//! with [`Registry::set_compatibility`]), and schema ids are global and may
//! skip numbers.
//!
//! The script's watchdog stops the JVM and removes its temp dir when the
//! test process exits, so no registry outlives its test binary.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde_json::{json, Value};

pub struct Registry {
    dir: tempfile::TempDir,
    /// `http://127.0.0.1:PORT/apis/ccompat/v7`
    url: String,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/registry.sh")
}

impl Registry {
    /// Starts a registry on a free loopback port in a fresh temp dir and
    /// waits until it is ready. Panics with the script's output if it does
    /// not come up.
    pub fn start() -> Registry {
        let dir = tempfile::Builder::new()
            .prefix("outboxd-registry-")
            .tempdir()
            .expect("temp dir for the registry");
        let out = Command::new("bash")
            .arg(script())
            .arg("start")
            .arg(dir.path())
            .env("REGISTRY_PARENT_PID", std::process::id().to_string())
            // The shared registry is never dropped: the watchdog cleans up.
            .env("REGISTRY_WATCHDOG_RMDIR", "1")
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script().display()));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "scripts/registry.sh start failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let url = stdout.trim().lines().last().unwrap_or("").to_owned();
        assert!(
            url.starts_with("http://127.0.0.1:"),
            "unexpected output from scripts/registry.sh start: {url:?}"
        );
        Registry { dir, url }
    }

    /// The base URL a client is given (`schema_registry.url`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The registry's log, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    /// `METHOD path` with an optional JSON body: (HTTP status, parsed body).
    pub fn request(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let mut cmd = Command::new("curl");
        cmd.args(["-sS", "--max-time", "10", "-X", method])
            .args(["-H", "Content-Type: application/vnd.schemaregistry.v1+json"])
            .args(["-w", "\n%{http_code}"])
            .arg(format!("{}{path}", self.url))
            .stdin(Stdio::null());
        if let Some(b) = body {
            cmd.args(["--data-binary", &b.to_string()]);
        }
        let out = cmd.output().expect("run curl");
        assert!(
            out.status.success(),
            "curl {method} {path}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).expect("UTF-8 answer");
        let (body, status) = text.rsplit_once('\n').expect("status line");
        let value = serde_json::from_str(body).unwrap_or(Value::String(body.to_owned()));
        (status.trim().parse().expect("HTTP status"), value)
    }

    /// Registers an Avro schema under `subject`; its global id.
    pub fn register_avro(&self, subject: &str, schema: &Value) -> u32 {
        let (status, body) = self.request(
            "POST",
            &format!("/subjects/{subject}/versions"),
            Some(&json!({ "schema": schema.to_string() })),
        );
        assert_eq!(status, 200, "registering {subject}: {body}");
        body["id"].as_u64().expect("id") as u32
    }

    /// Registers a JSON Schema (`schemaType` JSON) under `subject`; its
    /// global id.
    pub fn register_json_schema(&self, subject: &str, schema: &Value) -> u32 {
        let (status, body) = self.request(
            "POST",
            &format!("/subjects/{subject}/versions"),
            Some(&json!({ "schema": schema.to_string(), "schemaType": "JSON" })),
        );
        assert_eq!(status, 200, "registering {subject}: {body}");
        body["id"].as_u64().expect("id") as u32
    }

    /// `PUT /config/{subject}` (or the global config with `None`).
    pub fn set_compatibility(&self, subject: Option<&str>, level: &str) {
        let path = subject.map_or("/config".to_owned(), |s| format!("/config/{s}"));
        let (status, body) = self.request("PUT", &path, Some(&json!({ "compatibility": level })));
        assert_eq!(status, 200, "setting compatibility: {body}");
    }
}

/// One registry per test binary, started on first use.
pub fn shared() -> &'static Registry {
    static SHARED: OnceLock<Registry> = OnceLock::new();
    SHARED.get_or_init(Registry::start)
}
