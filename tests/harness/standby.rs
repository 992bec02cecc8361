//! A physical streaming standby of a [`PgCluster`], for failover tests
//! (PostgreSQL 17 failover slots).
//!
//! The test binaries hold only initdb, pg_ctl and postgres (no
//! pg_basebackup), so the standby starts from a cold copy of the primary's
//! data directory: the primary is stopped (fast), copied and started again.
//! The standby then streams through a physical slot of the primary
//! (`primary_slot_name`), with `hot_standby_feedback` and, from 17 on,
//! `sync_replication_slots`, which needs a `dbname` in `primary_conninfo`.
#![allow(dead_code)]

use std::process::Command;
use std::time::{Duration, Instant};

use super::pg::{quote_literal, PgCluster, SUPERUSER, SUPERUSER_PASSWORD};

/// Starts a standby of `primary`, streaming through the physical slot
/// `physical_slot` (created here), and waits until it streams.
pub fn start_standby(primary: &PgCluster, physical_slot: &str) -> PgCluster {
    primary.psql(
        "postgres",
        &format!(
            "SELECT pg_create_physical_replication_slot({})",
            quote_literal(physical_slot)
        ),
    );
    primary.stop();
    let source = primary.data_dir().to_path_buf();
    let copy = |standby: &PgCluster| {
        let data = standby.data_dir();
        // -a keeps the owner (the unprivileged server user when run as root).
        let out = Command::new("cp")
            .arg("-a")
            .arg(&source)
            .arg(data)
            .output()
            .expect("run cp");
        assert!(
            out.status.success(),
            "copying the primary's data directory: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // The primary's slots are its own: a same-named logical slot would
        // stop slot synchronisation, and the physical one is of no use here.
        for entry in std::fs::read_dir(data.join("pg_replslot")).unwrap() {
            std::fs::remove_dir_all(entry.unwrap().path()).unwrap();
        }
        let _ = std::fs::remove_file(data.join("postmaster.opts"));
        std::fs::write(data.join("standby.signal"), "").unwrap();
        let conninfo = format!(
            "host={} port={} user={SUPERUSER} password={SUPERUSER_PASSWORD} dbname=postgres application_name={physical_slot}",
            primary.host(),
            primary.port()
        );
        let mut conf = format!(
            "\n# --- tests/harness/standby.rs ---\n\
             unix_socket_directories = {}\n\
             primary_conninfo = {}\n\
             primary_slot_name = {}\n\
             hot_standby_feedback = on\n",
            quote_literal(&standby.socket_dir().display().to_string()),
            quote_literal(&conninfo),
            quote_literal(physical_slot),
        );
        if primary.major() >= 17 {
            // The primary's own list would name a slot the standby lacks
            // once promoted.
            conf.push_str("sync_replication_slots = on\nsynchronized_standby_slots = ''\n");
        }
        let auto = data.join("postgresql.auto.conf");
        let mut text = std::fs::read_to_string(&auto).unwrap_or_default();
        text.push_str(&conf);
        std::fs::write(&auto, text).unwrap();
    };
    let standby = PgCluster::start_from(primary.options().clone(), copy);
    primary.start_again();
    wait(Duration::from_secs(60), "the standby to stream", || {
        primary.psql(
            "postgres",
            &format!(
                "SELECT count(*) FROM pg_replication_slots WHERE slot_name = {} AND active",
                quote_literal(physical_slot)
            ),
        ) == "1"
    });
    standby
}

/// Lists `physical_slot` in the primary's `synchronized_standby_slots`
/// (PostgreSQL 17+): logical walsenders of failover slots send nothing the
/// standby has not received, so a promoted standby is never behind them.
pub fn synchronize_standby_slot(primary: &PgCluster, physical_slot: &str) {
    primary.psql(
        "postgres",
        &format!(
            "ALTER SYSTEM SET synchronized_standby_slots = {}",
            quote_literal(physical_slot)
        ),
    );
    primary.reload();
}

/// `pg_ctl promote`, waiting until the server accepts writes.
pub fn promote(standby: &PgCluster) {
    let out = standby.pg_ctl(&["-w", "-t", "60", "promote"]);
    standby.check(&out, "pg_ctl promote");
    wait(
        Duration::from_secs(60),
        "the promoted standby to accept writes",
        || standby.psql("postgres", "SELECT pg_is_in_recovery()") == "f",
    );
}

fn wait(timeout: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}
