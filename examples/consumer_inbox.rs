//! The consumer's half of the outbox pattern: applies outbox events to its
//! own PostgreSQL exactly once, whatever Kafka redelivers.
//!
//! Events can come more than once: at-least-once (outboxd's default), a
//! relay restart resends what was not confirmed yet; in either delivery
//! mode a backfill sends rows again, and a consumer that dies or loses its
//! partitions in a rebalance reads again from its last committed offset.
//! So this consumer:
//!
//! 1. opens a transaction in its own database;
//! 2. inserts the event id (the `id` header) into `inbox`, whose primary
//!    key is that id, with `ON CONFLICT DO NOTHING`: no row inserted means
//!    the event was applied before, and the transaction ends there;
//! 3. applies the event's side effect in the same transaction (here the
//!    seed's payment example: a notification to send and a running total
//!    per user), and commits: the inbox row and the side effect exist
//!    together or not at all;
//! 4. only then commits the Kafka offset. Dying between 3 and 4 means the
//!    event comes again, and step 2 drops it.
//!
//! A Redis check-then-set (`GET processed:<id>`, handle, `SET`) does not do
//! this: two consumers (a rebalance) can both pass the check, and a crash
//! between the side effect and the `SET` applies it twice; the check and the
//! side effect are not one atomic step. See docs/consumers.md.
//!
//! It reads `read_committed`, so records of an aborted Kafka transaction
//! are never applied: with `relay.delivery = "exactly-once"` outboxd
//! writes in Kafka transactions, and an aborted one is sent again; at
//! least once, the setting costs nothing.
//!
//! ```text
//! consumer_inbox --brokers 127.0.0.1:9092 --group notifications \
//!     --topic outbox.event.payment --database-url postgresql://app@localhost/notifications
//! ```
//!
//! For the tests: `--idle-exit-s S` stops after S seconds without a record
//! (once partitions were assigned), `--crash-after-commits N` dies (abort,
//! as a kill would: no destructor, no offset commit) right after its Nth
//! database commit, before committing that offset. It prints one line per
//! event: `applied <id>` or `duplicate <id>`.

use std::time::Duration;

use clap::Parser;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use tokio_postgres::{Client, NoTls};

#[derive(Parser)]
#[command(about = "Apply outbox events to PostgreSQL exactly once (inbox table)")]
struct Args {
    #[arg(long)]
    brokers: String,
    /// Consumer group: consumers of one group share the partitions.
    #[arg(long)]
    group: String,
    #[arg(long, required = true)]
    topic: Vec<String>,
    /// The consumer's own database (tables are created if missing).
    #[arg(long)]
    database_url: String,
    /// Stop after this many seconds without a record (0: never).
    #[arg(long, default_value_t = 0)]
    idle_exit_s: u64,
    /// Die right after the Nth database commit, before its offset commit.
    #[arg(long)]
    crash_after_commits: Option<u64>,
    /// Any librdkafka consumer property, `key=value` (SASL, TLS,
    /// `session.timeout.ms`); repeat for several.
    #[arg(long = "property", value_parser = key_value)]
    properties: Vec<(String, String)>,
}

fn key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .ok_or_else(|| format!("{s:?} is not key=value"))
}

/// The consumer's own tables. `inbox` is the point: its primary key is the
/// event id. `notifications` and `payment_totals` stand for any side effect
/// in the same database; neither has a unique constraint that would hide a
/// second application, so the tests can see one.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS inbox (
    event_id     text        PRIMARY KEY,
    topic        text        NOT NULL,
    partition    int         NOT NULL,
    kafka_offset bigint      NOT NULL,
    backfill     boolean     NOT NULL,
    traceparent  text,
    processed_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS notifications (
    id         bigserial PRIMARY KEY,
    event_id   text      NOT NULL,
    payment_id text      NOT NULL,
    message    text      NOT NULL
);
CREATE TABLE IF NOT EXISTS payment_totals (
    user_id    text   PRIMARY KEY,
    paid_cents bigint NOT NULL,
    payments   int    NOT NULL
);
";

/// What the outbox record carries, as the relay sends it.
struct Event<'a> {
    /// The `id` header: the outbox row's id, the same on every copy.
    id: String,
    /// `eventType` (a `routing.additional_headers` entry by default).
    event_type: String,
    /// `outboxd.backfill: true` on copies sent by `outboxd backfill`.
    backfill: bool,
    /// W3C trace context, when the writer put one in the headers column.
    traceparent: Option<String>,
    payload: &'a [u8],
}

fn header<'a>(m: &'a BorrowedMessage<'_>, name: &str) -> Option<&'a [u8]> {
    m.headers()?
        .iter()
        .find(|h| h.key == name)
        .and_then(|h| h.value)
}

fn event<'a>(m: &'a BorrowedMessage<'_>) -> Result<Event<'a>, String> {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    Ok(Event {
        id: header(m, "id")
            .map(text)
            .ok_or("no `id` header: not an outbox record")?,
        event_type: header(m, "eventType").map(text).unwrap_or_default(),
        backfill: header(m, "outboxd.backfill") == Some(b"true"),
        traceparent: header(m, "traceparent").map(text),
        payload: m.payload().unwrap_or_default(),
    })
}

/// Applies one event in one transaction; `false` if it was applied before.
async fn apply(db: &mut Client, m: &BorrowedMessage<'_>, e: &Event<'_>) -> Result<bool, String> {
    let sql = |e: tokio_postgres::Error| e.to_string();
    let tx = db.transaction().await.map_err(sql)?;
    let inserted = tx
        .execute(
            "INSERT INTO inbox (event_id, topic, partition, kafka_offset, backfill, traceparent) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (event_id) DO NOTHING",
            &[
                &e.id,
                &m.topic(),
                &m.partition(),
                &m.offset(),
                &e.backfill,
                &e.traceparent,
            ],
        )
        .await
        .map_err(sql)?;
    if inserted == 0 {
        // Seen before: nothing to do (dropping `tx` rolls back).
        return Ok(false);
    }
    if e.event_type == "payment.completed" {
        let p: serde_json::Value =
            serde_json::from_slice(e.payload).map_err(|err| format!("payload: {err}"))?;
        let field = |k: &str| p.get(k).cloned().unwrap_or_default();
        let payment_id = field("paymentId").as_str().unwrap_or_default().to_owned();
        let user_id = field("userId").as_str().unwrap_or_default().to_owned();
        let amount = field("amount").as_i64().unwrap_or_default();
        let currency = field("currency").as_str().unwrap_or_default().to_owned();
        // The SMS itself is sent by this service's own outbox relay from
        // this row: a call to an SMS gateway cannot join a transaction.
        tx.execute(
            "INSERT INTO notifications (event_id, payment_id, message) VALUES ($1, $2, $3)",
            &[
                &e.id,
                &payment_id,
                &format!("Payment of {amount} {currency} received"),
            ],
        )
        .await
        .map_err(sql)?;
        tx.execute(
            "INSERT INTO payment_totals (user_id, paid_cents, payments) VALUES ($1, $2, 1) \
             ON CONFLICT (user_id) DO UPDATE SET paid_cents = payment_totals.paid_cents + $2, \
             payments = payment_totals.payments + 1",
            &[&user_id, &amount],
        )
        .await
        .map_err(sql)?;
    }
    tx.commit().await.map_err(sql)?;
    Ok(true)
}

#[tokio::main]
async fn main() -> Result<(), String> {
    let args = Args::parse();
    let (mut db, conn) = tokio_postgres::connect(&args.database_url, NoTls)
        .await
        .map_err(|e| format!("database: {e}"))?;
    tokio::spawn(conn);
    db.batch_execute(SCHEMA)
        .await
        .map_err(|e| format!("schema: {e}"))?;

    let mut config = ClientConfig::new();
    for (k, v) in &args.properties {
        config.set(k, v);
    }
    let consumer: StreamConsumer = config
        .set("bootstrap.servers", &args.brokers)
        .set("group.id", &args.group)
        // Offsets are committed by hand, after the database transaction.
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        .create()
        .map_err(|e| format!("consumer: {e}"))?;
    let topics: Vec<&str> = args.topic.iter().map(String::as_str).collect();
    consumer
        .subscribe(&topics)
        .map_err(|e| format!("subscribe: {e}"))?;

    let mut commits = 0u64;
    loop {
        let wait = match args.idle_exit_s {
            0 => Duration::MAX,
            s => Duration::from_secs(s),
        };
        let m = match tokio::time::timeout(wait, consumer.recv()).await {
            Err(_) if consumer.assignment().is_ok_and(|a| a.count() > 0) => break,
            Err(_) => continue,
            Ok(Err(e)) => {
                eprintln!("kafka: {e}");
                continue;
            }
            Ok(Ok(m)) => m,
        };
        let e = match event(&m) {
            Ok(e) => e,
            Err(why) => {
                eprintln!(
                    "skipping {}[{}]@{}: {why}",
                    m.topic(),
                    m.partition(),
                    m.offset()
                );
                consumer
                    .commit_message(&m, CommitMode::Async)
                    .unwrap_or_else(|e| eprintln!("offset commit: {e}"));
                continue;
            }
        };
        // A failed transaction is not skipped: exit, and the supervisor's
        // restart reads the event again from the last committed offset.
        let applied = apply(&mut db, &m, &e).await?;
        println!("{} {}", if applied { "applied" } else { "duplicate" }, e.id);
        if applied {
            commits += 1;
            if args.crash_after_commits == Some(commits) {
                eprintln!("crashing after database commit {commits}, before its offset commit");
                std::process::abort();
            }
        }
        // After the transaction. Failing here (the partition was revoked in
        // a rebalance) is harmless: the next owner reads the event again and
        // the inbox drops it.
        consumer
            .commit_message(&m, CommitMode::Async)
            .unwrap_or_else(|e| eprintln!("offset commit: {e}"));
    }
    consumer
        .commit_consumer_state(CommitMode::Sync)
        .unwrap_or_else(|e| eprintln!("final offset commit: {e}"));
    Ok(())
}
