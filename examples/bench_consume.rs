//! The measuring end of `scripts/bench.sh`: reads COUNT records from the
//! given topics (all partitions, from the beginning, no consumer group) and
//! prints one JSON line:
//!
//! ```json
//! {"count":50000,"expected":50000,"complete":true,"duplicates":0,
//!  "first_arrival_ms":…,"last_arrival_ms":…,"span_s":24.9,"throughput_eps":2008.1,
//!  "latency_ms":{"p50":12.1,"p95":30.2,"p99":55.0,"max":120.4,"mean":14.0},
//!  "record_latency_ms":{"p50":3.0,"p99":9.0,"max":20.0},
//!  "slow":{"over_ms":50.0,"count":120,"first_at_s":0.0,"last_at_s":0.2}}
//! ```
//!
//! Latency is the arrival wall clock minus the record timestamp: outboxd
//! stamps a record with its transaction's commit time, the polling relay with
//! `created_at`, so it is end-to-end, commit (or insert) to consumer. With
//! `--ts-field F` it is measured from the payload's JSON field F instead
//! (microseconds since the epoch, written by the writer's transaction): the
//! same start for every relay, whatever it puts in the record timestamp
//! (Debezium's EventRouter stamps its own processing time). Both clocks are
//! this machine's. `slow` says when the records over 50 ms arrived, in
//! seconds after the first arrival: a stall at the start (a producer still
//! learning its topic) or one in the middle. `record_latency_ms` is always from the record timestamp
//! (with `--ts-field` too): for outboxd, commit -> consumer. Duplicates are
//! counted by the `id` header.
//!
//! ```text
//! bench_consume [--create-partitions P] [--ready-file F] [--idle-timeout-s S] [--ts-field F]
//!               [--dump F] BROKERS COUNT TOPIC...
//! ```
//!
//! `--create-partitions` creates missing topics first (so the consumer is
//! attached before the first event is written); `--ready-file` is created
//! once the partitions are assigned. The consumer gives up after
//! `--idle-timeout-s` without a new record and reports what it got
//! (`"complete":false`, exit status 1). `--dump` writes one line per record,
//! `start_us arrival_us record_ts_ms partition`, in arrival order: to see
//! *when* the slow records came (a periodic stall is a relay's own work,
//! scattered ones the host's scheduling).

use std::collections::HashSet;
use std::io::Write as _;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

/// A record later than this counts as slow (see `slow` in the report).
const SLOW_MS: f64 = 50.0;

#[derive(Parser)]
#[command(about = "Consume COUNT records and report throughput and end-to-end latency")]
struct Args {
    /// Create missing topics with this many partitions before consuming.
    #[arg(long)]
    create_partitions: Option<i32>,
    /// File to create once all partitions are assigned.
    #[arg(long)]
    ready_file: Option<std::path::PathBuf>,
    /// Give up after this long without a new record.
    #[arg(long, default_value_t = 60)]
    idle_timeout_s: u64,
    /// Measure latency from this payload field (epoch microseconds), not the record timestamp.
    #[arg(long)]
    ts_field: Option<String>,
    /// Write one line per record to this file: start_us arrival_us record_ts_ms partition.
    #[arg(long)]
    dump: Option<std::path::PathBuf>,
    brokers: String,
    count: usize,
    #[arg(required = true)]
    topics: Vec<String>,
}

fn main() {
    let args = Args::parse();
    if let Some(partitions) = args.create_partitions {
        create_topics(&args.brokers, &args.topics, partitions);
    }
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &args.brokers)
        .set("group.id", format!("outboxd-bench-{}", std::process::id()))
        .set("enable.auto.commit", "false")
        // Only committed records (exactly-once): librdkafka's default, said.
        .set("isolation.level", "read_committed")
        .set("fetch.wait.max.ms", "50")
        .create()
        .expect("consumer");

    let mut assignment = TopicPartitionList::new();
    for topic in &args.topics {
        for partition in 0..partitions(&consumer, topic) {
            assignment
                .add_partition_offset(topic, partition, Offset::Beginning)
                .expect("partition offset");
        }
    }
    consumer.assign(&assignment).expect("assign");
    if let Some(path) = &args.ready_file {
        std::fs::write(path, b"").expect("ready file");
    }

    let mut latencies_ms: Vec<f64> = Vec::with_capacity(args.count);
    let mut record_latencies_ms: Vec<f64> = Vec::with_capacity(args.count);
    let mut ids: HashSet<Vec<u8>> = HashSet::with_capacity(args.count);
    let mut duplicates = 0u64;
    let mut first_arrival_us = None;
    let mut last_arrival_us = 0i64;
    let mut last_progress = Instant::now();
    let mut slow_at_us: Vec<i64> = Vec::new();
    let idle_timeout = Duration::from_secs(args.idle_timeout_s);
    let mut dump = args
        .dump
        .as_ref()
        .map(|path| std::io::BufWriter::new(std::fs::File::create(path).expect("dump file")));
    while latencies_ms.len() < args.count && last_progress.elapsed() < idle_timeout {
        let Some(result) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let message = match result {
            Ok(m) => m,
            Err(e) => {
                eprintln!("bench_consume: {e}");
                continue;
            }
        };
        let arrival_us = now_us();
        last_progress = Instant::now();
        first_arrival_us.get_or_insert(arrival_us);
        last_arrival_us = arrival_us;
        let start_us = match &args.ts_field {
            Some(field) => payload_us(message.payload(), field).unwrap_or_else(|| {
                eprintln!("bench_consume: a record without a numeric payload field {field}");
                std::process::exit(2);
            }),
            None => message.timestamp().to_millis().unwrap_or(arrival_us / 1000) * 1000,
        };
        let latency_ms = (arrival_us - start_us) as f64 / 1000.0;
        if latency_ms > SLOW_MS {
            slow_at_us.push(arrival_us);
        }
        latencies_ms.push(latency_ms);
        if let Some(out) = dump.as_mut() {
            let ts_ms = message.timestamp().to_millis().unwrap_or(-1);
            writeln!(
                out,
                "{start_us} {arrival_us} {ts_ms} {}",
                message.partition()
            )
            .expect("dump write");
        }
        // Also from the record timestamp, whatever --ts-field says: for
        // outboxd that is the commit time, so this is commit -> consumer.
        if let Some(ts_ms) = message.timestamp().to_millis() {
            record_latencies_ms.push((arrival_us - ts_ms * 1000) as f64 / 1000.0);
        }
        let id = message.headers().and_then(|headers| {
            headers
                .iter()
                .find(|h| h.key == "id")
                .and_then(|h| h.value.map(<[u8]>::to_vec))
        });
        if let Some(id) = id {
            if !ids.insert(id) {
                duplicates += 1;
            }
        }
    }

    if let Some(mut out) = dump.take() {
        out.flush().expect("dump flush");
    }
    let count = latencies_ms.len();
    let first_arrival_us = first_arrival_us.unwrap_or(0);
    let span_s = (last_arrival_us - first_arrival_us) as f64 / 1e6;
    let mean = if count > 0 {
        latencies_ms.iter().sum::<f64>() / count as f64
    } else {
        0.0
    };
    latencies_ms.sort_by(f64::total_cmp);
    record_latencies_ms.sort_by(f64::total_cmp);
    let complete = count >= args.count;
    let mut report = serde_json::json!({
        "count": count,
        "expected": args.count,
        "complete": complete,
        "duplicates": duplicates,
        "first_arrival_ms": first_arrival_us / 1000,
        "last_arrival_ms": last_arrival_us / 1000,
        "span_s": round3(span_s),
        "throughput_eps": if span_s > 0.0 { round3(count as f64 / span_s) } else { 0.0 },
        "latency_ms": {
            "p50": percentile(&latencies_ms, 0.50),
            "p95": percentile(&latencies_ms, 0.95),
            "p99": percentile(&latencies_ms, 0.99),
            "max": latencies_ms.last().copied().unwrap_or(0.0),
            "mean": round3(mean),
        },
        // Arrival minus the record timestamp (millisecond resolution, so up
        // to 1 ms high).
        "record_latency_ms": {
            "p50": percentile(&record_latencies_ms, 0.50),
            "p99": percentile(&record_latencies_ms, 0.99),
            "max": record_latencies_ms.last().copied().unwrap_or(0.0),
        },
    });
    let slow_at_s =
        |us: Option<&i64>| us.map_or(0.0, |us| round3((us - first_arrival_us) as f64 / 1e6));
    report["slow"] = serde_json::json!({
        "over_ms": SLOW_MS,
        "count": slow_at_us.len(),
        "first_at_s": slow_at_s(slow_at_us.first()),
        "last_at_s": slow_at_s(slow_at_us.last()),
    });
    println!("{report}");
    if !complete {
        eprintln!(
            "bench_consume: only {count} of {} records within the idle timeout",
            args.count
        );
        std::process::exit(1);
    }
}

/// Partitions of `topic`, waiting (up to 30 s) for it to exist.
fn partitions(consumer: &BaseConsumer, topic: &str) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(metadata) = consumer.fetch_metadata(Some(topic), Duration::from_secs(5)) {
            if let Some(t) = metadata.topics().iter().find(|t| t.name() == topic) {
                if t.error().is_none() && !t.partitions().is_empty() {
                    return t.partitions().len() as i32;
                }
            }
        }
        if Instant::now() > deadline {
            eprintln!("bench_consume: topic {topic} does not exist");
            std::process::exit(2);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn create_topics(brokers: &str, topics: &[String], partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("admin client");
    let new: Vec<NewTopic<'_>> = topics
        .iter()
        .map(|t| NewTopic::new(t, partitions, TopicReplication::Fixed(1)))
        .collect();
    let options = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let results = runtime
        .block_on(admin.create_topics(&new, &options))
        .expect("create topics");
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => {
                eprintln!("bench_consume: creating topic {name}: {code}");
                std::process::exit(2);
            }
        }
    }
}

/// The integer JSON field `field` of a payload.
fn payload_us(payload: Option<&[u8]>, field: &str) -> Option<i64> {
    let value: serde_json::Value = serde_json::from_slice(payload?).ok()?;
    value.get(field)?.as_i64()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    round3(sorted[rank.clamp(1, sorted.len()) - 1])
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_micros() as i64
}
