//! `scripts/bench.sh`, run small: one binary in both delivery modes through
//! the A/B drains and the latency phase, on the suite's debug binaries.
//! Every performance claim rests on that script, and it broke once without
//! anyone noticing: for a day its exactly-once latency passes relayed
//! nothing, because each pass re-created its slot under the same name and
//! the relay rightly refused the new slot as a gap in its ledger.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use crate::harness::cargo::cargo;
use crate::harness::outboxd::bin;
use crate::harness::wait::last_lines;

#[test]
fn the_bench_runs_both_delivery_modes_through_its_drains_and_its_latency_phase() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let outboxd = PathBuf::from(bin());
    let bin_dir = outboxd.parent().expect("target/debug").to_path_buf();
    build_examples();
    let out = tempfile::Builder::new()
        .prefix("outboxd-bench-")
        .tempdir()
        .expect("temp dir");
    let started = Instant::now();
    // The smallest run that still has every step: a 500-event broker
    // warm-up, 2,000 events per drain, one round per shape, the produce
    // requests read 0.24 s after each drain (librdkafka's statistics every
    // 200 ms instead of every second), 1 s latency passes of one shape
    // (each relay's warm-up pass and its measured pass: two slots in turn;
    // 1,000 events, enough for a p99). A = at-least-once, B = exactly-once,
    // as in docs/benchmarks-journal.md's both-mode runs.
    let run = Command::new(root.join("scripts/bench.sh"))
        .args(["--baseline", "HEAD", "2000"])
        .current_dir(root)
        .env("BENCH_BIN_DIR", &bin_dir)
        .env("BENCH_BASELINE_BIN", &outboxd)
        .env("BENCH_HEAD_TOML", "[relay]\\ndelivery = \"exactly-once\"")
        .env("BENCH_SYSTEMS", "")
        .env("BENCH_AB_ROUNDS", "1 1")
        .env("BENCH_WARMUP_EVENTS", "500")
        .env("BENCH_AB_STATS_MS", "200")
        .env("BENCH_FLOOR_S", "1")
        .env("BENCH_FLOOR_SHAPES", "1")
        .env("BENCH_FLOOR_WARMUP_S", "1")
        .env("BENCH_DIR", out.path().join("run"))
        .env("BENCH_PLOT_DIR", out.path().join("plots"))
        .output()
        .expect("run scripts/bench.sh");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "scripts/bench.sh failed ({}):\n{}",
        run.status,
        last_lines(&stderr, 40)
    );
    eprintln!(
        "ops::bench: both modes, drains and latency in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let dir = out.path().join("run");

    // Every pass delivered all it was sent, in both modes.
    for phase in ["ab", "lat"] {
        let passes = pass_results(&dir.join(phase));
        assert!(
            passes.iter().any(|(name, _)| name.contains("-head-"))
                && passes.iter().any(|(name, _)| name.contains("-base-")),
            "{phase}: passes of both sides expected, found {:?}",
            passes.iter().map(|(n, _)| n).collect::<Vec<_>>()
        );
        for (name, json) in &passes {
            assert_eq!(
                json["complete"], true,
                "{phase}/{name} did not deliver everything: {json}"
            );
            // pg_recvlogical's receipt pass counts no duplicates.
            if let Some(duplicates) = json.get("duplicates") {
                assert_eq!(duplicates, 0, "{phase}/{name}: {json}");
            }
        }
    }
    // The tables have a figure in every cell the comparison reads.
    let ab = std::fs::read_to_string(dir.join("ab.md")).expect("ab.md");
    for shape in ["1-row", "100-row"] {
        let table = ab
            .split(&format!("in {shape} transactions"))
            .nth(1)
            .unwrap_or_else(|| panic!("no {shape} table in ab.md:\n{ab}"));
        let round = row(table, "1");
        // Events per produce request: /metrics was read after the
        // shortened statistics period too.
        for (cell, what) in [
            (1, "A ev/s"),
            (2, "B ev/s"),
            (4, "B/A"),
            (11, "A ev/request"),
            (12, "B ev/request"),
        ] {
            assert!(number(&round[cell]), "{shape} round 1 {what}: {round:?}");
        }
    }
    assert!(
        !ab.contains("REGRESSION"),
        "two configurations gate nothing:\n{ab}"
    );
    let latency = std::fs::read_to_string(dir.join("latency.md")).expect("latency.md");
    let header = row(&latency, "rows/txn");
    let cells = row(&latency, "1");
    // outboxd (B), its three floors and the baseline (A), by the header's
    // names (each p50 has its p99 next to it).
    for name in [
        "outboxd p50",
        "floor p50",
        "floor beside the source p50",
        "floor through the source p50",
        "baseline p50",
    ] {
        let p50 = header
            .iter()
            .position(|h| h == name)
            .unwrap_or_else(|| panic!("no column {name:?} in:\n{latency}"));
        for cell in [p50, p50 + 1] {
            assert!(
                number(&cells[cell]) && cells[cell].parse::<f64>().unwrap() > 0.0,
                "1-row latency, column {cell} ({name} or its p99): {cells:?}\n{latency}"
            );
        }
    }
}

/// The bench's helper programs are examples, which `cargo test --test main`
/// alone does not build: build them here (nothing to do after `cargo test`).
fn build_examples() {
    let out = cargo()
        .args(["build", "--locked", "--example", "polling_relay"])
        .args(["--example", "bench_consume", "--example", "bench_produce"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo build");
    assert!(
        out.status.success(),
        "cargo build of the bench's examples failed:\n{}",
        last_lines(&String::from_utf8_lossy(&out.stderr), 30)
    );
}

/// Each pass's consumer summary in `dir` (`<run>.json`), by run name.
fn pass_results(dir: &Path) -> Vec<(String, serde_json::Value)> {
    let mut passes: Vec<(String, serde_json::Value)> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            let json = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{}: {e}: {text}", p.display()));
            (p.file_stem().unwrap().to_string_lossy().into_owned(), json)
        })
        .collect();
    passes.sort_by(|a, b| a.0.cmp(&b.0));
    passes
}

/// The cells of the first Markdown table row whose first cell is `first`.
fn row(table: &str, first: &str) -> Vec<String> {
    table
        .lines()
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().replace(',', ""))
                .collect::<Vec<_>>()
        })
        .find(|cells| cells.first().is_some_and(|c| c == first))
        .unwrap_or_else(|| panic!("no row {first:?} in:\n{table}"))
}

fn number(cell: &str) -> bool {
    cell.parse::<f64>().is_ok_and(f64::is_finite)
}
