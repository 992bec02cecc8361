//! A real Prometheus server (Debian's `/usr/bin/prometheus`, installed by
//! `scripts/setup.sh`) on a free loopback port, and its HTTP API.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use super::http::{get, query_url};
use super::{free_port, poll};

/// A real Prometheus server on a free loopback port; killed on drop.
pub struct Prometheus {
    child: Child,
    addr: String,
    dir: tempfile::TempDir,
}

impl Prometheus {
    pub fn start(config: &str) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run prometheus: {e} (scripts/setup.sh installs Debian's `prometheus` package)")
            });
        let mut p = Prometheus { child, addr, dir };
        poll("Prometheus to be ready", Duration::from_secs(60), || {
            if let Ok(Some(status)) = p.child.try_wait() {
                panic!("prometheus exited ({status}):\n{}", p.log());
            }
            match get(&p.addr, "/-/ready") {
                Ok((200, _)) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        });
        p
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// GET an API path; the `data` of a `"status": "success"` answer, else
    /// the error Prometheus gave.
    pub fn api(&self, path: &str) -> Result<Value, String> {
        let (status, body) = get(&self.addr, path)?;
        let v: Value = serde_json::from_str(&body)
            .map_err(|e| format!("HTTP {status} {path}: not JSON ({e}): {body}"))?;
        if v["status"] == "success" {
            Ok(v["data"].clone())
        } else {
            Err(format!("{}: {}", v["errorType"], v["error"]))
        }
    }

    /// An instant query's result vector.
    pub fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let data = self.api(&query_url(expr))?;
        match data["resultType"].as_str() {
            Some("vector") => Ok(data["result"].as_array().cloned().unwrap_or_default()),
            // A scalar (none in our files so far) counts as one series.
            Some("scalar") => Ok(vec![data["result"].clone()]),
            other => Err(format!("unexpected result type {other:?}")),
        }
    }

    /// Active alerts (pending or firing), as (name, state, labels).
    pub fn alerts(&self) -> Vec<(String, String, BTreeMap<String, String>)> {
        let data = self.api("/api/v1/alerts").expect("alerts API");
        data["alerts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                let labels: BTreeMap<String, String> = a["labels"]
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
                    .collect();
                (
                    labels["alertname"].clone(),
                    a["state"].as_str().unwrap_or("").to_string(),
                    labels,
                )
            })
            .collect()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
