//! The latency floor of `scripts/bench.sh`: the relay's own producer
//! (`outboxd::sink::KafkaSink`, so the same librdkafka settings: idempotent,
//! acks=all, lz4, murmur2_random) with `linger.ms` 0, and nothing else: no
//! PostgreSQL, no walsender, no relay. It sends what the bench's writers
//! write, at the same pace and in the same shape, to the same broker, and
//! the same consumer (`bench_consume --ts-field t`) times it. What outboxd
//! adds to that is outboxd's (and the source's) share of the latency.
//!
//! ```text
//! bench_produce BROKERS TOPIC COUNT --rate R --txn N
//! ```
//!
//! Sends COUNT records in bursts of N (one burst per "transaction", keys as
//! the bench's writers pick them: N consecutive aggregates of 200 from a
//! random start), R/N bursts per second on average, as `pgbench -R`
//! schedules transactions: Poisson arrivals, and a late burst does not push
//! the next ones back. Each payload is the bench's
//! 374-byte JSON with `t` = the clock when its burst started, in
//! microseconds. Waits for every delivery report; exits 1 on a failed one.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use outboxd::config::KafkaConfig;
use outboxd::sink::KafkaSink;

/// The bench's payload size (scripts/lib/workload.sh).
const PAYLOAD_BYTES: usize = 374;
const AGGREGATES: u64 = 200;

#[derive(Parser)]
#[command(about = "The relay's producer alone, at the bench's pace: the latency floor")]
struct Args {
    /// Events per second.
    #[arg(long)]
    rate: u64,
    /// Records per burst (the rows of one transaction).
    #[arg(long, default_value_t = 1)]
    txn: u64,
    brokers: String,
    topic: String,
    count: u64,
}

fn main() {
    let args = Args::parse();
    assert!(
        args.rate > 0 && args.txn > 0,
        "--rate and --txn must be positive"
    );
    let mut kafka = KafkaConfig::default();
    kafka.properties.insert("linger.ms".into(), "0".into());
    let mut sink = KafkaSink::new(&args.brokers, &kafka).expect("producer");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    // Connected before anything is timed, as a relay that has been running
    // is (librdkafka asks for the producer id as soon as it connects).
    let (connected, wait) = std::sync::mpsc::channel();
    sink.when_connected(move || {
        let _ = connected.send(());
    });
    if wait.recv_timeout(Duration::from_secs(30)).is_err() {
        eprintln!("bench_produce: no broker answered within 30 s");
        std::process::exit(1);
    }
    std::thread::sleep(Duration::from_millis(200));
    let bursts = args.count.div_ceil(args.txn);
    let mean_gap_s = args.txn as f64 / args.rate as f64;
    let mut due = Instant::now();
    let mut random = XorShift(now_us() as u64 | 1);
    let mut sent = 0u64;
    let mut acked = 0u64;
    for _ in 0..bursts {
        // Exponential gaps: a Poisson process of the given mean rate.
        let uniform = (random.next() >> 11) as f64 / (1u64 << 53) as f64;
        due += Duration::from_secs_f64(-(1.0 - uniform).ln() * mean_gap_s);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let agg = random.next() % AGGREGATES;
        let t = now_us();
        for g in 1..=args.txn.min(args.count - sent) {
            let key = ((agg + g) % AGGREGATES).to_string();
            let payload = payload(t, sent, agg);
            let id = sent.to_string();
            let headers = [("id", Some(id.as_bytes()))];
            loop {
                match sink.send(
                    sent,
                    &args.topic,
                    Some(key.as_bytes()),
                    Some(&payload),
                    &headers,
                    None,
                ) {
                    Ok(()) => break,
                    Err(outboxd::sink::SendError::QueueFull) => {
                        acked += take_report(&runtime, &mut sink);
                    }
                    Err(e) => {
                        eprintln!("bench_produce: {e}");
                        std::process::exit(1);
                    }
                }
            }
            sent += 1;
        }
    }
    while acked < sent {
        acked += take_report(&runtime, &mut sink);
    }
}

/// The writers' `random(...)` without a dependency.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// One delivery report: 1, or exit on a failure.
fn take_report(runtime: &tokio::runtime::Runtime, sink: &mut KafkaSink) -> u64 {
    match runtime.block_on(sink.next_report()) {
        Some(report) => match report.result {
            Ok(_) => 1,
            Err(failure) => {
                eprintln!("bench_produce: delivery failed: {failure}");
                std::process::exit(1);
            }
        },
        None => {
            eprintln!("bench_produce: the producer stopped");
            std::process::exit(1);
        }
    }
}

/// The bench's payload: its fields, padded by `note` to 374 bytes.
fn payload(t: i64, n: u64, agg: u64) -> Vec<u8> {
    let head = format!(
        "{{\"t\": {t}, \"note\": \"\", \"amount\": \"100.50\", \"orderId\": \"{:010}\", \"currency\": \"RUB\", \"customer\": \"c-{agg:03}\"}}",
        n % 10_000_000_000
    );
    let pad = PAYLOAD_BYTES.saturating_sub(head.len());
    head.replacen(
        "\"note\": \"\"",
        &format!("\"note\": \"{}\"", "x".repeat(pad)),
        1,
    )
    .into_bytes()
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_micros() as i64
}
