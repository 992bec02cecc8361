//! Prints records of Kafka topics from the beginning, as the demo's proof
//! that events arrived: `cargo run --example kafka_read -- BROKERS N TOPIC...`
//! exits after N records (or 60 s without new ones).

use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        eprintln!("usage: kafka_read BROKERS COUNT TOPIC...");
        std::process::exit(2);
    }
    let count: usize = args[1].parse().expect("COUNT is a number");
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &args[0])
        .set("group.id", format!("outboxd-demo-{}", std::process::id()))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let topics: Vec<&str> = args[2..].iter().map(String::as_str).collect();
    consumer.subscribe(&topics).expect("subscribe");
    let mut seen = 0;
    let mut last = Instant::now();
    while seen < count && last.elapsed() < Duration::from_secs(60) {
        let Some(result) = consumer.poll(Duration::from_millis(200)) else {
            continue;
        };
        let Ok(m) = result else { continue };
        last = Instant::now();
        seen += 1;
        let mut headers = Vec::new();
        if let Some(h) = m.headers() {
            for i in 0..h.count() {
                let header = h.get(i);
                let value = header
                    .value
                    .map(String::from_utf8_lossy)
                    .unwrap_or_default();
                headers.push(format!("{}={}", header.key, value));
            }
        }
        println!(
            "{} [partition {} offset {}] key={} {} value={}",
            m.topic(),
            m.partition(),
            m.offset(),
            m.key().map(String::from_utf8_lossy).unwrap_or_default(),
            headers.join(" "),
            m.payload().map(String::from_utf8_lossy).unwrap_or_default()
        );
    }
    if seen < count {
        eprintln!("kafka_read: only {seen} of {count} records arrived");
        std::process::exit(1);
    }
}
