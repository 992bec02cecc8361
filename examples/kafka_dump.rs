//! Prints records of Kafka topics from the beginning as JSON lines, every
//! byte kept (hex), for comparing two producers record by record:
//! `cargo run --example kafka_dump -- BROKERS COUNT TOPIC...` (a topic
//! starting with `^` is a regular expression). Exits after COUNT records,
//! or 30 s without a new one; COUNT 0 reads until 8 s pass without one.
//! A record read again (a regex subscription rebalances as topics appear,
//! and without a group offset starts over) is printed once.
//!
//! ```json
//! {"topic":"t","partition":0,"offset":3,"key":"6b31","value":null,"headers":[["id","6531"]]}
//! ```

use std::collections::HashSet;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use serde_json::json;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        eprintln!("usage: kafka_dump BROKERS COUNT TOPIC...");
        std::process::exit(2);
    }
    let count: usize = args[1].parse().expect("COUNT is a number");
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &args[0])
        .set("group.id", format!("outboxd-dump-{}", std::process::id()))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("topic.metadata.refresh.interval.ms", "1000")
        .create()
        .expect("consumer");
    let topics: Vec<&str> = args[2..].iter().map(String::as_str).collect();
    consumer.subscribe(&topics).expect("subscribe");
    let (until_idle, idle) = match count {
        0 => (true, Duration::from_secs(8)),
        _ => (false, Duration::from_secs(30)),
    };
    let mut printed = HashSet::new();
    let (mut seen, mut last) = (0, Instant::now());
    while (until_idle || seen < count) && last.elapsed() < idle {
        let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        last = Instant::now();
        if !printed.insert((m.topic().to_owned(), m.partition(), m.offset())) {
            continue;
        }
        seen += 1;
        let headers: Vec<_> = m
            .headers()
            .map(|h| h.iter().map(|h| json!([h.key, h.value.map(hex)])).collect())
            .unwrap_or_default();
        let line = json!({
            "topic": m.topic(),
            "partition": m.partition(),
            "offset": m.offset(),
            "key": m.key().map(hex),
            "value": m.payload().map(hex),
            "headers": headers,
        });
        println!("{line}");
    }
    if !until_idle && seen < count {
        eprintln!("kafka_dump: {seen} of {count} records");
        std::process::exit(1);
    }
}
