//! Shared setup for the source suite.

use std::path::PathBuf;

use crate::harness::outboxd::write_config;
use crate::harness::pg::{PgCluster, PgOptions};

pub struct Setup {
    pub pg: PgCluster,
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
}

/// A cluster with the migrations applied to database `app`, and a tail config
/// using slot `slot`.
pub fn setup(slot: &str) -> Setup {
    setup_with(PgOptions::default(), slot, "")
}

pub fn setup_with(opts: PgOptions, slot: &str, extra: &str) -> Setup {
    let pg = PgCluster::start(opts);
    pg.create_database("app");
    pg.apply_migrations("app");
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "{}?sslmode=disable",
        pg.url("postgres", Some("postgres"), "app")
    );
    let config = write_config(dir.path(), "outboxd.toml", &url, slot, extra);
    Setup { pg, dir, config }
}

/// Creates `slot` now, so that everything written afterwards is streamed.
pub fn create_slot(pg: &PgCluster, slot: &str) {
    pg.psql(
        "app",
        &format!("SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')"),
    );
}

pub fn confirmed_flush_lsn(pg: &PgCluster, slot: &str) -> String {
    pg.psql(
        "app",
        &format!("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = '{slot}'"),
    )
    .trim()
    .to_string()
}

/// The `row` object of a tail event.
pub fn row(e: &serde_json::Value) -> &serde_json::Map<String, serde_json::Value> {
    e["row"]
        .as_object()
        .unwrap_or_else(|| panic!("not a row event: {e}"))
}

pub fn text<'a>(e: &'a serde_json::Value, column: &str) -> &'a str {
    row(e)[column]
        .as_str()
        .unwrap_or_else(|| panic!("{column} is not text in {e}"))
}
