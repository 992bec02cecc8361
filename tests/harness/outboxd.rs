//! Running the `outboxd` binary from tests, as a user would.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_outboxd")
}

/// Writes a config file with `[postgres] url/slot` plus `extra` TOML appended.
pub fn write_config(dir: &Path, name: &str, url: &str, slot: &str, extra: &str) -> PathBuf {
    let path = dir.join(name);
    let text = format!(
        "[postgres]\nurl = \"{url}\"\nslot = \"{slot}\"\npublication = \"outboxd\"\n{extra}\n"
    );
    std::fs::write(&path, text).expect("write config");
    path
}

pub struct TailOutput {
    pub events: Vec<Value>,
    pub stderr: String,
    pub success: bool,
}

/// Runs `outboxd tail` until it exits (`--limit`) or `timeout` passes (then
/// it is killed and the test will see fewer events than it asked for).
pub fn tail(config: &Path, args: &[&str], timeout: Duration) -> TailOutput {
    let mut child = Command::new(bin())
        .arg("tail")
        .arg("--config")
        .arg(config)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn outboxd tail");
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        BufReader::new(stdout)
            .lines()
            .map(|l| {
                serde_json::from_str::<Value>(&l.expect("read stdout"))
                    .expect("tail prints JSON lines")
            })
            .collect::<Vec<_>>()
    });
    let status = wait_with_timeout(&mut child, timeout);
    let events = reader.join().unwrap();
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut stderr);
    }
    TailOutput {
        events,
        stderr,
        success: status.map(|s| s.success()).unwrap_or(false),
    }
}

/// Waits for exit; kills the child after `timeout` and returns None.
pub fn wait_with_timeout(child: &mut Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Like [`wait_with_timeout`] but leaves a still-running child alone.
pub fn wait_with_timeout_keep(
    child: &mut Child,
    timeout: Duration,
) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            return Some(status);
        }
        if start.elapsed() > timeout {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
