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
//! bench_produce BROKERS TOPIC COUNT --through-source [--ready-file F] < pg_recvlogical's pgoutput stream
//! ```
//!
//! Sends COUNT records in bursts of N (one burst per "transaction", keys as
//! the bench's writers pick them: N consecutive aggregates of 200 from a
//! random start), R/N bursts per second on average, as `pgbench -R`
//! schedules transactions: Poisson arrivals, and a late burst does not push
//! the next ones back. Each payload is the bench's
//! 374-byte JSON with `t` = the clock when its burst started, in
//! microseconds. Waits for every delivery report; exits 1 on a failed one.
//!
//! With `--through-source` it paces nothing and makes up nothing: it reads
//! `pg_recvlogical -f -` (pgoutput) on stdin and sends each of the first
//! COUNT outbox payloads as soon as its bytes arrive, unchanged, keyed by its
//! row's aggregate. That is the floor through the source: PostgreSQL's
//! hand-over to a replication client in series with the producer alone, per
//! record, which is the least any pgoutput relay's latency can be on the
//! host. It is not a relay: no decoding, no ordering beyond arrival, no
//! acknowledgement to the slot (pg_recvlogical confirms what it received).

use std::io::Read;
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
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Records per burst (the rows of one transaction).
    #[arg(long, default_value_t = 1)]
    txn: u64,
    /// Send the payloads of the pgoutput stream on stdin as they arrive,
    /// instead of making them up at --rate.
    #[arg(long)]
    through_source: bool,
    /// A file to create once the producer is connected, before anything
    /// is sent (with --through-source: before the writers may start).
    #[arg(long)]
    ready_file: Option<std::path::PathBuf>,
    brokers: String,
    topic: String,
    count: u64,
}

fn main() {
    let args = Args::parse();
    assert!(
        args.through_source || (args.rate > 0 && args.txn > 0),
        "--rate and --txn must be positive (or --through-source given)"
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
    if let Some(ready) = &args.ready_file {
        std::fs::write(ready, b"").expect("the ready file");
    }
    if args.through_source {
        let (sent, acked) = forward_stdin(&runtime, &mut sink, &args.topic, args.count);
        wait_reports(&runtime, &mut sink, acked, sent);
        return;
    }
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
            acked += send(&runtime, &mut sink, sent, &args.topic, &key, &payload);
            sent += 1;
        }
    }
    wait_reports(&runtime, &mut sink, acked, sent);
}

fn wait_reports(
    runtime: &tokio::runtime::Runtime,
    sink: &mut KafkaSink,
    mut acked: u64,
    sent: u64,
) {
    while acked < sent {
        acked += take_report(runtime, sink);
    }
}

/// Sends the first `count` outbox payloads of the pgoutput stream on stdin,
/// each as soon as the read that completes it returns. Returns how many it
/// sent and how many reports it took; exits 1 if the stream ends before
/// `count`.
fn forward_stdin(
    runtime: &tokio::runtime::Runtime,
    sink: &mut KafkaSink,
    topic: &str,
    count: u64,
) -> (u64, u64) {
    let mut stdin = std::io::stdin().lock();
    let mut buffer = Vec::with_capacity(1 << 16);
    let mut chunk = vec![0u8; 1 << 16];
    let mut sent = 0u64;
    let mut acked = 0u64;
    while sent < count {
        let n = match stdin.read(&mut chunk) {
            Ok(0) => {
                eprintln!("bench_produce: the stream ended after {sent} of {count} payloads");
                std::process::exit(1);
            }
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                eprintln!("bench_produce: reading stdin: {e}");
                std::process::exit(1);
            }
        };
        buffer.extend_from_slice(&chunk[..n]);
        let mut used = 0;
        while sent < count {
            let Some(found) = next_payload(&buffer[used..]) else {
                break;
            };
            let (start, end) = (used + found.start, used + found.end);
            let key = payload_key(&buffer[start..end]).to_string();
            acked += send(runtime, sink, sent, topic, &key, &buffer[start..end]);
            sent += 1;
            used = end;
        }
        // Keep what may be the start of a payload cut by this read.
        let keep_from = match find(&buffer[used..], PAYLOAD_START) {
            Some(at) => used + at.saturating_sub(4),
            None => buffer
                .len()
                .saturating_sub(PAYLOAD_START.len() + 4)
                .max(used),
        };
        buffer.drain(..keep_from);
    }
    (sent, acked)
}

/// How the bench's payload starts in pgoutput's text of the row (jsonb
/// prints its shortest key first).
const PAYLOAD_START: &[u8] = b"{\"t\": ";

/// The byte range of the next whole payload in `data`: pgoutput sends a
/// column's text after its 4-byte big-endian length.
fn next_payload(data: &[u8]) -> Option<std::ops::Range<usize>> {
    let mut from = 0;
    loop {
        let at = from + find(&data[from..], PAYLOAD_START)?;
        if at >= 4 {
            let len = u32::from_be_bytes(data[at - 4..at].try_into().expect("4 bytes")) as usize;
            if (PAYLOAD_START.len()..=PAYLOAD_BYTES * 4).contains(&len) {
                return (at + len <= data.len()).then_some(at..at + len);
            }
        }
        from = at + 1;
    }
}

/// The row's aggregate, as the writers compute it: (agg + g) % 200, where
/// the payload carries agg as "customer": "c-AGG" and g as the last eight
/// digits of "orderId".
fn payload_key(payload: &[u8]) -> u64 {
    let field = |name: &[u8]| -> u64 {
        let at = find(payload, name).map_or(payload.len(), |at| at + name.len());
        payload[at..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .fold(0, |n, b| n * 10 + u64::from(b - b'0'))
    };
    let agg = field(b"\"customer\": \"c-");
    let g = field(b"\"orderId\": \"") % 100_000_000;
    (agg + g) % AGGREGATES
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Sends record `n` (header `id` = n, which the consumer counts by),
/// taking delivery reports while the producer's queue is full. Returns how
/// many reports it took; exits 1 on a refused record.
fn send(
    runtime: &tokio::runtime::Runtime,
    sink: &mut KafkaSink,
    n: u64,
    topic: &str,
    key: &str,
    payload: &[u8],
) -> u64 {
    let id = n.to_string();
    let headers = [("id", Some(id.as_bytes()))];
    let mut reports = 0;
    loop {
        match sink.send(
            n,
            topic,
            Some(key.as_bytes()),
            Some(payload),
            &headers,
            None,
        ) {
            Ok(()) => return reports,
            Err(outboxd::sink::SendError::QueueFull) => reports += take_report(runtime, sink),
            Err(e) => {
                eprintln!("bench_produce: {e}");
                std::process::exit(1);
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A pgoutput column as the walsender sends it: 't', the text's length,
    /// the text.
    fn column(text: &[u8]) -> Vec<u8> {
        let mut out = vec![b't'];
        out.extend_from_slice(&(text.len() as u32).to_be_bytes());
        out.extend_from_slice(text);
        out
    }

    #[test]
    fn finds_whole_payloads_and_their_aggregates() {
        let text = payload(1_733_000_000_000_000, 100_000_003, 198);
        let mut stream = column(b"orders");
        stream.extend(column(&text));
        let found = next_payload(&stream).expect("a payload");
        assert_eq!(&stream[found.clone()], &text[..]);
        // orderId's last eight digits are g = 3; (198 + 3) % 200.
        assert_eq!(payload_key(&stream[found]), 1);
        // Cut anywhere inside, it is not found until it is whole.
        for cut in 1..stream.len() {
            assert!(next_payload(&stream[..cut]).is_none(), "cut at {cut}");
        }
    }
}
