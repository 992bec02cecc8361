//! Producing the moment a topic is created. A broker publishes a new
//! partition in its metadata a moment before it takes writes; a first
//! produce request in that moment is refused, and before Kafka 4.5 a later
//! request that overtakes it is accepted (KAFKA-15591). librdkafka then
//! "implicitly acks" the refused records without their ever being written.
//! On this machine's broker (4.4), with 5 requests in flight, that happens
//! to a few records in every few topics. The sink must report those as
//! failures, never as delivered.

use std::collections::HashMap;
use std::time::Duration;

use outboxd::config::KafkaConfig;
use outboxd::sink::{FailureKind, KafkaSink};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::ClientConfig;

use crate::harness::kafka::shared;

const ROUNDS: usize = 20;
const RECORDS: u64 = 60;

/// Sends [`RECORDS`] records to each of [`ROUNDS`] topics the moment it is
/// created, and checks that every record reported delivered is in Kafka at
/// the reported place, and that per key the reported offsets follow the
/// order of sending. Returns (delivered, refused).
async fn produce_to_fresh_topics(properties: &[(&str, &str)]) -> (usize, usize) {
    let broker = shared();
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .create()
        .unwrap();
    let kafka = KafkaConfig {
        properties: properties
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..KafkaConfig::default()
    };
    let mut refused = 0;
    let mut delivered = 0;
    for round in 0..ROUNDS {
        let topic = format!("fresh-{round}-{}", uuid::Uuid::new_v4().simple());
        let mut sink = KafkaSink::new(broker.bootstrap(), &kafka).unwrap();
        // Created and used at once, the way a producer that creates topics
        // without waiting for them would.
        admin
            .create_topics(
                [&NewTopic::new(&topic, 3, TopicReplication::Fixed(1))],
                &AdminOptions::new(),
            )
            .await
            .unwrap();
        for id in 0..RECORDS {
            let key = format!("agg-{}", id % 9);
            let header = format!("{round}-{id}");
            sink.send(
                id,
                &topic,
                Some(key.as_bytes()),
                Some(b"{}"),
                &[("id", Some(header.as_bytes()))],
                None,
            )
            .unwrap();
        }
        let mut reported = HashMap::new();
        for _ in 0..RECORDS {
            let r = tokio::time::timeout(Duration::from_secs(120), sink.next_report())
                .await
                .expect("a report for every record")
                .unwrap();
            match r.result {
                Ok(d) => {
                    reported.insert(format!("{round}-{}", r.id), (d.partition, d.offset));
                }
                Err(f) => {
                    assert_eq!(f.kind, FailureKind::Transport, "{f}");
                    refused += 1;
                }
            }
        }
        let records = tokio::task::block_in_place(|| {
            broker.consume_all(&topic, broker.record_count(&topic), Duration::from_secs(30))
        });
        let in_log: HashMap<String, (i32, i64)> = records
            .iter()
            .map(|r| {
                let id = std::str::from_utf8(r.header("id").unwrap()).unwrap();
                (id.to_string(), (r.partition, r.offset))
            })
            .collect();
        for (id, at) in &reported {
            assert_eq!(
                in_log.get(id),
                Some(at),
                "record {id} reported delivered at {at:?} on {topic}"
            );
        }
        // Per key (one partition each), offsets in the order of sending.
        for key in 0..9 {
            let offsets: Vec<i64> = (0..RECORDS)
                .filter(|id| id % 9 == key)
                .filter_map(|id| reported.get(&format!("{round}-{id}")).map(|at| at.1))
                .collect();
            assert!(
                offsets.windows(2).all(|w| w[0] < w[1]),
                "key agg-{key} on {topic}: offsets {offsets:?} not in sending order"
            );
        }
        delivered += reported.len();
    }
    (delivered, refused)
}

/// Up to 5 requests in flight (what a user may allow with Kafka 4.5):
/// on 4.4 some implicit acks come back false, and are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_five_requests_in_flight_a_record_is_reported_delivered_only_where_kafka_wrote_it() {
    let (delivered, refused) = produce_to_fresh_topics(&[
        ("linger.ms", "0"),
        ("batch.num.messages", "1"),
        ("max.in.flight.requests.per.connection", "5"),
    ])
    .await;
    eprintln!(
        "fresh topics, 5 in flight: {delivered} records delivered where reported, {refused} implicit acks refused ({ROUNDS} topics)"
    );
}

/// outboxd's default, one request in flight per broker: nothing for the
/// race to reorder, so every record is delivered, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_defaults_every_record_is_delivered_in_order() {
    let (delivered, refused) =
        produce_to_fresh_topics(&[("linger.ms", "0"), ("batch.num.messages", "1")]).await;
    assert_eq!(refused, 0, "implicit acks with one request in flight");
    assert_eq!(delivered, ROUNDS * RECORDS as usize);
}
