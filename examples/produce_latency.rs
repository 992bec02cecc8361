//! The producer's own latency floor: librdkafka and the broker alone, no
//! PostgreSQL and no relay, so a figure of the relay can be read against it.
//!
//! ```text
//! cargo run --release --example produce_latency -- BROKERS [OPTIONS] [key=value ...]
//!   --burst N      records per burst, sent back to back (default 1)
//!   --keys K       distinct keys, cycled (default 50; 1 = one partition)
//!   --bursts B     measured bursts, after 100 unmeasured (default 500)
//!   --pause-ms M   pause after each burst's last report (default 10)
//!   --send-now     cut linger.ms short after each burst, as the relay does
//!                  when it has caught up (rd_kafka_flush on another thread)
//! ```
//!
//! Each record's time runs from its burst's first `send` to its delivery
//! report. The producer is configured as outboxd's is by default
//! (idempotent, acks=all, lz4, linger.ms 5) except where `key=value` says
//! otherwise. Creates the topic `produce-latency` (6 partitions) if missing.
//!
//! Why it exists: librdkafka puts one partition in each produce request, and
//! a broker answers the requests of one connection one at a time. A burst
//! spread over several partitions therefore waits for several broker round
//! trips in a row, whatever the relay does.

use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::message::DeliveryResult;
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;

const TOPIC: &str = "produce-latency";
const PARTITIONS: i32 = 6;
const WARM_UP_BURSTS: u32 = 100;

struct Reports(Sender<Result<Instant, String>>);

impl ClientContext for Reports {}

impl ProducerContext for Reports {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        let report = match result {
            Ok(_) => Ok(Instant::now()),
            Err((e, _)) => Err(e.to_string()),
        };
        let _ = self.0.send(report);
    }
}

struct Options {
    brokers: String,
    burst: u32,
    keys: u32,
    bursts: u32,
    pause: Duration,
    send_now: bool,
    properties: Vec<(String, String)>,
}

fn options() -> Result<Options, String> {
    let mut args = std::env::args().skip(1);
    let brokers = args
        .next()
        .ok_or("usage: produce_latency BROKERS [OPTIONS] [key=value ...]")?;
    let mut o = Options {
        brokers,
        burst: 1,
        keys: 50,
        bursts: 500,
        pause: Duration::from_millis(10),
        send_now: false,
        properties: Vec::new(),
    };
    while let Some(arg) = args.next() {
        let mut number = |name: &str| -> Result<u32, String> {
            args.next()
                .and_then(|v| v.parse().ok())
                .filter(|v| *v > 0 || name == "--pause-ms")
                .ok_or(format!("{name} takes a positive number"))
        };
        match arg.as_str() {
            "--burst" => o.burst = number("--burst")?,
            "--keys" => o.keys = number("--keys")?,
            "--bursts" => o.bursts = number("--bursts")?,
            "--pause-ms" => o.pause = Duration::from_millis(number("--pause-ms")?.into()),
            "--send-now" => o.send_now = true,
            kv => {
                let (k, v) = kv
                    .split_once('=')
                    .ok_or(format!("unknown argument {kv:?}"))?;
                o.properties.push((k.to_owned(), v.to_owned()));
            }
        }
    }
    Ok(o)
}

fn create_topic(brokers: &str) -> Result<(), String> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .map_err(|e| e.to_string())?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| e.to_string())?;
    let topic = NewTopic::new(TOPIC, PARTITIONS, TopicReplication::Fixed(1));
    let results = rt
        .block_on(admin.create_topics(&[topic], &AdminOptions::new()))
        .map_err(|e| e.to_string())?;
    for result in results {
        match result {
            Ok(_) => {}
            Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((topic, code)) => return Err(format!("cannot create {topic}: {code:?}")),
        }
    }
    Ok(())
}

/// Cuts the linger short on request, as `sink::send_now` does.
fn send_now_thread(producer: Arc<ThreadedProducer<Reports>>) -> SyncSender<()> {
    let (wake, woken) = mpsc::sync_channel::<()>(1);
    std::thread::spawn(move || {
        while woken.recv().is_ok() {
            // SAFETY: the handle is alive for the call (held by `producer`);
            // rd_kafka_flush is thread-safe.
            unsafe { rdkafka::bindings::rd_kafka_flush(producer.client().native_ptr(), 5) };
        }
    });
    wake
}

fn run(o: &Options) -> Result<Vec<Duration>, String> {
    create_topic(&o.brokers)?;
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &o.brokers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("compression.type", "lz4");
    for (k, v) in &o.properties {
        config.set(k, v);
    }
    let (tx, reports): (_, Receiver<_>) = mpsc::channel();
    let producer: Arc<ThreadedProducer<Reports>> = Arc::new(
        config
            .create_with_context(Reports(tx))
            .map_err(|e| e.to_string())?,
    );
    let wake = o.send_now.then(|| send_now_thread(Arc::clone(&producer)));
    let payload = vec![b'x'; 374];
    let mut times = Vec::new();
    let mut n = 0u64;
    for burst in 0..WARM_UP_BURSTS + o.bursts {
        let started = Instant::now();
        for _ in 0..o.burst {
            let key = format!("aggregate-{}", n % u64::from(o.keys));
            n += 1;
            let record = BaseRecord::<_, _, ()>::to(TOPIC)
                .key(&key)
                .payload(&payload[..]);
            producer.send(record).map_err(|(e, _)| e.to_string())?;
        }
        if let Some(wake) = &wake {
            let _ = wake.try_send(());
        }
        for _ in 0..o.burst {
            let acked = reports
                .recv_timeout(Duration::from_secs(30))
                .map_err(|_| "no delivery report within 30 s".to_owned())??;
            if burst >= WARM_UP_BURSTS {
                times.push(acked.duration_since(started));
            }
        }
        std::thread::sleep(o.pause);
    }
    Ok(times)
}

fn main() {
    let o = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("produce_latency: {e}");
            std::process::exit(2);
        }
    };
    let mut times = match run(&o) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("produce_latency: {e}");
            std::process::exit(1);
        }
    };
    times.sort();
    let ms = |q: f64| times[((times.len() - 1) as f64 * q) as usize].as_secs_f64() * 1e3;
    println!(
        "burst {} keys {} send-now {} {:?}: {} records, send -> report p50 {:.2} p90 {:.2} p99 {:.2} max {:.2} ms",
        o.burst,
        o.keys,
        o.send_now,
        o.properties,
        times.len(),
        ms(0.5),
        ms(0.9),
        ms(0.99),
        ms(1.0)
    );
}
