//! Any name PostgreSQL allows for the outbox schema, table and publication
//! (spaces, double and single quotes, commas, mixed case, non-ASCII), and
//! nothing created before every check has passed.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use super::support::{setup, setup_with, text};
use crate::harness::outboxd::{tail, write_config};
use crate::harness::pg::{quote_ident, quote_literal, Auth, PgCluster, PgOptions};

const T: Duration = Duration::from_secs(60);

const SCHEMA: &str = "Sales";
const TABLE: &str = "Outbox \"Évènements\", v2";
const PUBLICATION: &str = "Pub \"Ü\", l'été";

/// A TOML basic string holding `s`.
fn toml_str(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

fn slots(pg: &crate::harness::pg::PgCluster) -> String {
    pg.psql(
        "app",
        "SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'logical'",
    )
    .trim()
    .to_string()
}

/// Streams one row of `schema`.`table` through publication `publication`
/// (created by outboxd), with `table_toml` as `outbox.table`.
async fn streams_one_row(
    slot: &str,
    schema: &str,
    table: &str,
    table_toml: &str,
    publication: &str,
) {
    let s = setup(slot);
    let pg = &s.pg;
    let (schema_sql, table_sql) = (quote_ident(schema), quote_ident(table));
    if (schema, table) != ("public", "outbox") {
        pg.batch(
            "app",
            &format!(
                "CREATE SCHEMA IF NOT EXISTS {schema_sql}; \
                 CREATE TABLE {schema_sql}.{table_sql} (LIKE public.outbox INCLUDING ALL)"
            ),
        )
        .await;
    }
    let url = format!(
        "{}?sslmode=disable",
        pg.url("postgres", Some("postgres"), "app")
    );
    let config = write_config(
        s.dir.path(),
        "names.toml",
        &url,
        slot,
        &format!("[outbox]\ntable = {table_toml}\n"),
    );
    // outboxd creates the publication (create_publication = true).
    let text_ = std::fs::read_to_string(&config).unwrap().replace(
        "publication = \"outboxd\"",
        &format!("publication = {}", toml_str(publication)),
    );
    std::fs::write(&config, text_).unwrap();

    let tail_config = config.clone();
    let tailing = std::thread::spawn(move || tail(&tail_config, &["--limit", "1"], T));
    let active =
        format!("SELECT count(*) FROM pg_replication_slots WHERE slot_name = '{slot}' AND active");
    let streaming = tokio::task::block_in_place(|| {
        let start = std::time::Instant::now();
        while pg.psql("app", &active).trim() != "1" {
            if tailing.is_finished() || start.elapsed() > T {
                return false;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        true
    });
    if !streaming {
        let out = tailing.join().unwrap();
        panic!("tail never streamed: {}", out.stderr);
    }
    let id = uuid::Uuid::new_v4().to_string();
    pg.client("app")
        .await
        .execute(
            &format!(
                "INSERT INTO {schema_sql}.{table_sql} (id, aggregate_type, aggregate_id, event_type, payload) \
                 VALUES ($1::text::uuid, 'order', 'o-1', 'order.placed', '{{\"n\": 1}}')"
            ),
            &[&id],
        )
        .await
        .unwrap();
    let out = tokio::task::block_in_place(|| tailing.join().unwrap());
    assert!(out.success, "{}", out.stderr);
    assert_eq!(out.events.len(), 1, "{}", out.stderr);
    assert_eq!(text(&out.events[0], "id"), id);
    let published = pg.psql(
        "app",
        &format!(
            "SELECT schemaname || '|' || tablename FROM pg_publication_tables WHERE pubname = {}",
            quote_literal(publication)
        ),
    );
    assert_eq!(published.trim(), format!("{schema}|{table}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odd_schema_table_and_publication_names_stream() {
    let table_toml = format!(
        "{{ schema = {}, name = {} }}",
        toml_str(SCHEMA),
        toml_str(TABLE)
    );
    streams_one_row("names", SCHEMA, TABLE, &table_toml, PUBLICATION).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn string_form_with_spaces_streams() {
    let table_toml = "\"Sales.Outbox Events\"";
    streams_one_row("spaces", "Sales", "Outbox Events", table_toml, "Outbox Pub").await;
}

/// START_REPLICATION's publication_names is a literal holding quoted
/// identifiers: a `"` in the name must be doubled inside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publication_with_a_double_quote_streams() {
    let table_toml = "\"public.outbox\"";
    streams_one_row("quoted", "public", "outbox", table_toml, "outbox \"main\"").await;
}

/// Opens a replication connection and leaves it waiting in authentication:
/// it holds one of the `max_wal_senders` WAL sender slots but is not in
/// `pg_stat_replication` yet, where outboxd's preflight counts them.
fn hold_a_wal_sender(pg: &PgCluster) -> TcpStream {
    let mut params = Vec::new();
    for (k, v) in [
        ("user", "postgres"),
        ("database", "app"),
        ("replication", "database"),
    ] {
        params.extend_from_slice(k.as_bytes());
        params.push(0);
        params.extend_from_slice(v.as_bytes());
        params.push(0);
    }
    params.push(0);
    let mut packet = ((params.len() + 8) as u32).to_be_bytes().to_vec();
    packet.extend_from_slice(&196608u32.to_be_bytes());
    packet.extend_from_slice(&params);
    let mut conn = TcpStream::connect(("127.0.0.1", pg.port())).unwrap();
    conn.write_all(&packet).unwrap();
    // The server's authentication request: the WAL sender slot is taken.
    let mut tag = [0u8; 1];
    conn.read_exact(&mut tag).unwrap();
    assert_eq!(tag[0], b'R', "expected an authentication request");
    conn
}

#[test]
fn a_refused_replication_connection_leaves_no_slot_or_publication_behind() {
    let opts = PgOptions {
        max_wal_senders: 1,
        ..PgOptions::default().with_auth(Auth::Scram)
    };
    let s = setup_with(opts, "leftover", "");
    let pg = &s.pg;
    let config = std::fs::read_to_string(&s.config)
        .unwrap()
        .replace("publication = \"outboxd\"", "publication = \"fresh\"");
    std::fs::write(&s.config, config).unwrap();
    let _held = hold_a_wal_sender(pg);
    let out = tail(&s.config, &["--limit", "1"], T);
    assert!(!out.success, "tail should fail");
    assert!(out.stderr.contains("max_wal_senders"), "{}", out.stderr);
    assert_eq!(slots(pg), "0", "a slot was left behind: {}", out.stderr);
    assert_eq!(
        pg.psql(
            "app",
            "SELECT count(*) FROM pg_publication WHERE pubname = 'fresh'"
        )
        .trim(),
        "0",
        "the publication was created: {}",
        out.stderr
    );
}
