//! The baseline outboxd replaces: the polling outbox relay of the original
//! design (`SELECT ... FOR UPDATE SKIP LOCKED` every second, publish, mark
//! `published_at`), written as a reasonably efficient Rust program so
//! `scripts/bench.sh` can compare the two side by side.
//!
//! ```text
//! cargo run --release --example polling_relay -- \
//!     --pg-url postgresql://postgres@127.0.0.1:5432/app --brokers 127.0.0.1:9092
//! ```
//!
//! The outbox table needs a `published_at` column (and, to keep the poll
//! cheap, a partial index on the unpublished rows):
//!
//! ```sql
//! ALTER TABLE outbox ADD COLUMN published_at timestamptz;
//! CREATE INDEX outbox_unpublished ON outbox (created_at) WHERE published_at IS NULL;
//! ```
//!
//! Each round, in one transaction: lock up to `--batch` unpublished rows
//! oldest first (`SKIP LOCKED`, so several relays may run), produce them with
//! an idempotent producer, wait until Kafka acknowledged every one, set
//! `published_at` and commit. A failed delivery rolls the round back; the rows
//! are retried on the next poll. When a round finds nothing it sleeps
//! `--poll-interval-ms` (the design's one second). Published rows stay in the
//! table until some cleanup job deletes them.
//!
//! Records look like outboxd's defaults: topic `outbox.event.<aggregate_type>`
//! (created with `--topic-partitions` if missing), key `aggregate_id`, value
//! the payload text, headers `id`, `eventType`, `aggregateType`, timestamp
//! `created_at`. The producer settings match outboxd's (idempotence,
//! `acks=all`, lz4, murmur2_random partitioning) except `linger.ms = 0`: a
//! round waits for its acks, so lingering would only lengthen every round.
//! SIGINT/SIGTERM finish the current round and exit.

use std::collections::HashSet;
use std::error::Error;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use tokio::sync::Notify;
use tokio_postgres::{Client, NoTls, Statement};

type BoxError = Box<dyn Error + Send + Sync>;

const SELECT: &str = "SELECT id::text, aggregate_id, event_type, aggregate_type, payload::text, \
     (extract(epoch FROM created_at) * 1000)::int8 AS created_ms \
     FROM outbox WHERE published_at IS NULL ORDER BY created_at \
     LIMIT $1 FOR UPDATE SKIP LOCKED";
const MARK: &str = "UPDATE outbox SET published_at = now() WHERE id = ANY($1::text[]::uuid[])";

#[derive(Parser)]
#[command(about = "Polling outbox relay (the baseline of scripts/bench.sh)")]
struct Args {
    /// libpq-style URL of the database holding `outbox`.
    #[arg(long)]
    pg_url: String,
    /// Kafka bootstrap brokers.
    #[arg(long)]
    brokers: String,
    /// Rows per round (the design's BATCH_SIZE).
    #[arg(long, default_value_t = 100)]
    batch: i64,
    /// Sleep after a round that found nothing (the design's POLL_INTERVAL_MS).
    #[arg(long, default_value_t = 1000)]
    poll_interval_ms: u64,
    /// Topic = prefix + aggregate_type, like outboxd's default template.
    #[arg(long, default_value = "outbox.event.")]
    topic_prefix: String,
    /// Partitions of topics this relay creates.
    #[arg(long, default_value_t = 1)]
    topic_partitions: i32,
}

struct Stats {
    events: u64,
    rounds: u64,
    empty_rounds: u64,
    failed_rounds: u64,
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = Args::parse();
    if let Err(e) = run(args).await {
        eprintln!("polling_relay: {e}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> Result<(), BoxError> {
    let mut kafka = ClientConfig::new();
    kafka
        .set("bootstrap.servers", &args.brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("partitioner", "murmur2_random")
        .set("compression.type", "lz4")
        // A round waits for all its acks before the next one starts, so
        // lingering would only add to every round: send at once (records
        // still batch behind the requests in flight).
        .set("linger.ms", "0")
        .set("message.timeout.ms", "30000")
        .set("allow.auto.create.topics", "false");
    let producer: FutureProducer = kafka.create()?;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &args.brokers)
        .create()?;

    let stop = Arc::new(AtomicBool::new(false));
    let wake = Arc::new(Notify::new());
    {
        let (stop, wake) = (stop.clone(), wake.clone());
        tokio::spawn(async move {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("SIGTERM handler");
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            stop.store(true, Ordering::SeqCst);
            wake.notify_one();
        });
    }

    let mut pg = tokio_postgres::Config::from_str(&args.pg_url)?;
    if pg.get_application_name().is_none() {
        pg.application_name("polling_relay");
    }
    let poll_interval = Duration::from_millis(args.poll_interval_ms);
    let mut known_topics = HashSet::new();
    let mut stats = Stats {
        events: 0,
        rounds: 0,
        empty_rounds: 0,
        failed_rounds: 0,
    };
    let started = Instant::now();
    eprintln!(
        "polling_relay: batch {} poll interval {:?}",
        args.batch, poll_interval
    );

    // Like the design's worker loop: any error is logged and the loop goes on
    // after a pause; a lost connection is opened again.
    while !stop.load(Ordering::SeqCst) {
        let (mut client, connection) = match pg.connect(NoTls).await {
            Ok(c) => c,
            Err(e) => {
                eprintln!("polling_relay: connect: {e}");
                pause(&wake, poll_interval).await;
                continue;
            }
        };
        let conn_task = tokio::spawn(async move {
            if let Err(e) = connection.await {
                eprintln!("polling_relay: connection: {e}");
            }
        });
        let result = poll_loop(
            &args,
            &mut client,
            &producer,
            &admin,
            &mut known_topics,
            &mut stats,
            &stop,
            &wake,
        )
        .await;
        drop(client);
        let _ = conn_task.await;
        if let Err(e) = result {
            eprintln!("polling_relay: {e}");
            pause(&wake, poll_interval).await;
        }
    }
    producer.flush(Duration::from_secs(30))?;
    eprintln!(
        "polling_relay: stopped after {:.1}s: {} events in {} rounds ({} empty, {} failed)",
        started.elapsed().as_secs_f64(),
        stats.events,
        stats.rounds,
        stats.empty_rounds,
        stats.failed_rounds
    );
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn poll_loop(
    args: &Args,
    client: &mut Client,
    producer: &FutureProducer,
    admin: &AdminClient<DefaultClientContext>,
    known_topics: &mut HashSet<String>,
    stats: &mut Stats,
    stop: &AtomicBool,
    wake: &Notify,
) -> Result<(), BoxError> {
    let poll_interval = Duration::from_millis(args.poll_interval_ms);
    let select: Statement = client.prepare(SELECT).await?;
    let mark: Statement = client.prepare(MARK).await?;
    while !stop.load(Ordering::SeqCst) {
        stats.rounds += 1;
        let tx = client.transaction().await?;
        let rows = tx.query(&select, &[&args.batch]).await?;
        if rows.is_empty() {
            tx.commit().await?;
            stats.empty_rounds += 1;
            pause(wake, poll_interval).await;
            continue;
        }

        let mut ids = Vec::with_capacity(rows.len());
        let mut topics = Vec::with_capacity(rows.len());
        for row in &rows {
            let aggregate_type: &str = row.get(3);
            topics.push(format!("{}{}", args.topic_prefix, aggregate_type));
        }
        for topic in &topics {
            if !known_topics.contains(topic) {
                ensure_topic(admin, topic, args.topic_partitions).await?;
                known_topics.insert(topic.clone());
            }
        }

        let mut deliveries = Vec::with_capacity(rows.len());
        let mut failed = None;
        for (row, topic) in rows.iter().zip(&topics) {
            let id: &str = row.get(0);
            let aggregate_id: &str = row.get(1);
            let event_type: &str = row.get(2);
            let aggregate_type: &str = row.get(3);
            let payload: &str = row.get(4);
            let created_ms: i64 = row.get(5);
            let headers = OwnedHeaders::new_with_capacity(3)
                .insert(Header {
                    key: "id",
                    value: Some(id),
                })
                .insert(Header {
                    key: "eventType",
                    value: Some(event_type),
                })
                .insert(Header {
                    key: "aggregateType",
                    value: Some(aggregate_type),
                });
            let record = FutureRecord::to(topic)
                .key(aggregate_id)
                .payload(payload)
                .timestamp(created_ms)
                .headers(headers);
            match producer.send_result(record) {
                Ok(delivery) => deliveries.push(delivery),
                Err((e, _)) => {
                    failed = Some(e.to_string());
                    break;
                }
            }
            ids.push(id.to_string());
        }
        for delivery in deliveries {
            match delivery.await {
                Ok(Ok(_)) => {}
                Ok(Err((e, _))) => failed = failed.or(Some(e.to_string())),
                Err(_) => failed = failed.or(Some("delivery canceled".to_string())),
            }
        }
        if let Some(e) = failed {
            // Nothing is marked: the whole round is retried on the next poll
            // (events Kafka did take are then sent again, as in the design).
            tx.rollback().await?;
            stats.failed_rounds += 1;
            eprintln!("polling_relay: publish failed, round rolled back: {e}");
            pause(wake, poll_interval).await;
            continue;
        }
        tx.execute(&mark, &[&ids]).await?;
        tx.commit().await?;
        stats.events += ids.len() as u64;
    }
    Ok(())
}

async fn ensure_topic(
    admin: &AdminClient<DefaultClientContext>,
    topic: &str,
    partitions: i32,
) -> Result<(), BoxError> {
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    for result in admin.create_topics([&new], &options).await? {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => return Err(format!("creating topic {name}: {code}").into()),
        }
    }
    Ok(())
}

async fn pause(wake: &Notify, interval: Duration) {
    tokio::select! {
        _ = tokio::time::sleep(interval) => {}
        _ = wake.notified() => {}
    }
}
