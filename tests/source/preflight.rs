//! Acceptance 5: every preflight and slot refusal, produced for real and its
//! message checked for the fix it names.

use std::time::Duration;

use super::support::{setup, setup_with};
use crate::harness::outboxd::{tail, write_config, TailOutput};
use crate::harness::pg::PgOptions;

fn fails_with(out: &TailOutput, needles: &[&str]) {
    assert!(
        !out.success,
        "expected failure, got {} events",
        out.events.len()
    );
    for n in needles {
        assert!(out.stderr.contains(n), "missing {n:?} in: {}", out.stderr);
    }
}

const T: Duration = Duration::from_secs(30);

#[test]
fn wal_level_replica_is_refused() {
    let s = setup_with(
        PgOptions {
            wal_level_logical: false,
            ..PgOptions::default()
        },
        "s",
        "",
    );
    fails_with(
        &tail(&s.config, &["--limit", "1"], T),
        &["wal_level is 'replica'", "wal_level = logical"],
    );
}

#[test]
fn full_slots_and_busy_senders_are_refused() {
    let opts = PgOptions {
        max_replication_slots: 1,
        max_wal_senders: 1,
        ..PgOptions::default()
    };
    let s = setup_with(opts, "second", "");
    s.pg.psql(
        "app",
        "SELECT pg_create_logical_replication_slot('first', 'pgoutput')",
    );
    fails_with(
        &tail(&s.config, &["--limit", "1"], T),
        &["max_replication_slots = 1", "\"second\""],
    );

    // The one WAL sender is taken by a tail on the first slot.
    let first = write_config(s.dir.path(), "first.toml", &url(&s), "first", "");
    let mut holder = std::process::Command::new(crate::harness::outboxd::bin())
        .args(["tail", "--config"])
        .arg(&first)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for(|| {
        s.pg.psql("app", "SELECT count(*) FROM pg_stat_replication")
            .trim()
            == "1"
    });
    fails_with(
        &tail(&first, &["--limit", "1"], T),
        &["max_wal_senders = 1"],
    );
    holder.kill().unwrap();
    holder.wait().unwrap();
}

fn url(s: &super::support::Setup) -> String {
    format!(
        "{}?sslmode=disable",
        s.pg.url("postgres", Some("postgres"), "app")
    )
}

fn wait_for(mut cond: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "condition not met in 30 s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn slot_problems_are_refused_with_the_fix() {
    let s = setup("s");
    let pg = &s.pg;
    let cfg = |name: &str, slot: &str, extra: &str| {
        write_config(s.dir.path(), name, &url(&s), slot, extra)
    };

    // Missing and not allowed to create.
    let c = cfg("missing.toml", "nope", "");
    std::fs::write(
        &c,
        std::fs::read_to_string(&c)
            .unwrap()
            .replace("[postgres]", "[postgres]\ncreate_slot = false"),
    )
    .unwrap();
    fails_with(
        &tail(&c, &["--limit", "1"], T),
        &["\"nope\" does not exist", "create_slot = true"],
    );

    // Physical slot, another plugin, another database.
    pg.psql(
        "app",
        "SELECT pg_create_physical_replication_slot('phys', true)",
    );
    fails_with(
        &tail(&cfg("phys.toml", "phys", ""), &["--limit", "1"], T),
        &["physical slot"],
    );
    pg.psql(
        "app",
        "SELECT pg_create_logical_replication_slot('td', 'test_decoding')",
    );
    fails_with(
        &tail(&cfg("td.toml", "td", ""), &["--limit", "1"], T),
        &["\"test_decoding\"", "not pgoutput"],
    );
    pg.psql(
        "postgres",
        "SELECT pg_create_logical_replication_slot('elsewhere', 'pgoutput')",
    );
    fails_with(
        &tail(&cfg("db.toml", "elsewhere", ""), &["--limit", "1"], T),
        &["belongs to database \"postgres\", not \"app\""],
    );

    // Active for another process: the message names its PID.
    let busy = cfg("busy.toml", "busy", "");
    let mut holder = std::process::Command::new(crate::harness::outboxd::bin())
        .args(["tail", "--config"])
        .arg(&busy)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    wait_for(|| {
        pg.psql(
            "app",
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'busy' AND active",
        )
        .trim()
            == "1"
    });
    let pid = pg
        .psql(
            "app",
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = 'busy'",
        )
        .trim()
        .to_string();
    fails_with(
        &tail(&busy, &["--limit", "1"], T),
        &[&format!("active for PID {pid}"), "pg_terminate_backend"],
    );
    holder.kill().unwrap();
    holder.wait().unwrap();
}

#[test]
fn invalidated_slot_is_refused() {
    let opts = PgOptions::default()
        .with_conf("max_slot_wal_keep_size", "1MB")
        .with_conf("min_wal_size", "32MB");
    let s = setup_with(opts, "lost", "");
    s.pg.psql(
        "app",
        "SELECT pg_create_logical_replication_slot('lost', 'pgoutput')",
    );
    s.pg.psql("app", "CREATE TABLE filler (x text)");
    for _ in 0..4 {
        s.pg.psql("app", "INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 5000); SELECT pg_switch_wal(); CHECKPOINT;");
    }
    assert_eq!(
        s.pg.psql(
            "app",
            "SELECT wal_status FROM pg_replication_slots WHERE slot_name = 'lost'"
        )
        .trim(),
        "lost"
    );
    fails_with(
        &tail(&s.config, &["--limit", "1"], T),
        &["wal_status = 'lost'", "pg_drop_replication_slot('lost')"],
    );
}

#[test]
fn role_and_publication_problems_are_refused() {
    let s = setup("s");
    let pg = &s.pg;
    pg.create_role("norepl", "pw", "");
    pg.psql("app", "GRANT SELECT ON outbox TO norepl");
    let u = format!("{}?sslmode=disable", pg.url("norepl", Some("pw"), "app"));
    let c = write_config(s.dir.path(), "norepl.toml", &u, "s", "");
    fails_with(
        &tail(&c, &["--limit", "1"], T),
        &[
            "\"norepl\" lacks the REPLICATION attribute",
            "ALTER ROLE \"norepl\" REPLICATION",
        ],
    );

    // write_config puts `publication = "outboxd"` first; a second key would be
    // a TOML error, so these configs are written whole.
    let write = |name: &str, publication: &str, create: bool, table: &str| {
        let path = s.dir.path().join(name);
        std::fs::write(
            &path,
            format!(
                "[postgres]\nurl = \"{}\"\nslot = \"s\"\npublication = \"{publication}\"\ncreate_publication = {create}\n[outbox]\ntable = \"{table}\"\n",
                url(&s)
            ),
        )
        .unwrap();
        path
    };
    fails_with(
        &tail(
            &write("nopub.toml", "absent", false, "public.outbox"),
            &["--limit", "1"],
            T,
        ),
        &[
            "publication \"absent\" does not exist",
            "CREATE PUBLICATION \"absent\" FOR TABLE \"public\".\"outbox\"",
        ],
    );
    pg.psql(
        "app",
        "CREATE TABLE other (id int); CREATE PUBLICATION wrongtable FOR TABLE other",
    );
    fails_with(
        &tail(
            &write("wrongtable.toml", "wrongtable", false, "public.outbox"),
            &["--limit", "1"],
            T,
        ),
        &[
            "does not include \"public\".\"outbox\"",
            "ALTER PUBLICATION \"wrongtable\" ADD TABLE",
        ],
    );
    pg.psql(
        "app",
        "CREATE PUBLICATION noinsert FOR TABLE outbox WITH (publish = 'update')",
    );
    fails_with(
        &tail(
            &write("noinsert.toml", "noinsert", false, "public.outbox"),
            &["--limit", "1"],
            T,
        ),
        &["does not publish inserts"],
    );
    fails_with(
        &tail(
            &write("notable.toml", "outboxd", false, "public.missing"),
            &["--limit", "1"],
            T,
        ),
        &["\"public\".\"missing\" does not exist", "outbox.table"],
    );
}
