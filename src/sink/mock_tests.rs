//! [`KafkaSink`] and [`TopicManager`] against librdkafka's in-process mock
//! cluster: real producer, real protocol, no broker to start. The mock has
//! no CreateTopics, so topic creation is left to the real-broker tests.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rdkafka::mocking::MockCluster;
use rdkafka::types::{RDKafkaApiKey, RDKafkaErrorCode, RDKafkaRespErr};

use super::*;
use crate::config::KafkaConfig;
use crate::sink::error::SinkConfigError;

const NO_HEADERS: &[(&str, Option<&[u8]>)] = &[];

fn kafka(props: &[(&str, &str)]) -> KafkaConfig {
    KafkaConfig {
        properties: props
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
        ..KafkaConfig::default()
    }
}

async fn report(sink: &mut KafkaSink) -> DeliveryReport {
    tokio::time::timeout(Duration::from_secs(20), sink.next_report())
        .await
        .expect("no delivery report within 20 s")
        .expect("report channel closed")
}

/// Kafka's `Utils.murmur2`, which Java clients partition keys with.
fn murmur2(key: &[u8]) -> i32 {
    const M: u32 = 0x5bd1_e995;
    let mut h: u32 = 0x9747_b28c ^ key.len() as u32;
    let chunks = key.chunks_exact(4);
    let tail = chunks.remainder();
    for c in chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> 24;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M) ^ k;
    }
    if !tail.is_empty() {
        for (i, b) in tail.iter().enumerate() {
            h ^= u32::from(*b) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition a Java producer picks for `key`.
fn java_partition(key: &[u8], partitions: i32) -> i32 {
    (murmur2(key) & 0x7fff_ffff) % partitions
}

#[test]
fn murmur2_matches_kafka_test_vectors() {
    // From Kafka's UtilsTest.testMurmur2.
    assert_eq!(murmur2(b"21"), -973932308);
    assert_eq!(murmur2(b"foobar"), -790332482);
    assert_eq!(murmur2(b"a-little-bit-long-string"), -985981536);
    assert_eq!(murmur2(b"a-little-bit-longer-string"), -1486304829);
    assert_eq!(murmur2(b"abc"), 479470107);
}

#[tokio::test]
async fn delivers_every_record_in_order_on_java_partitions() {
    let mock = MockCluster::new(1).unwrap();
    mock.create_topic("orders", 3, 1).unwrap();
    let mut sink = KafkaSink::new(&mock.bootstrap_servers(), &kafka(&[])).unwrap();
    let n = 300u64;
    for id in 0..n {
        let key = format!("order-{}", id % 17);
        let headers = [("id", Some(id.to_string()))];
        sink.send(
            id,
            "orders",
            Some(key.as_bytes()),
            Some(b"{}"),
            &headers,
            Some(1_700_000_000_000),
        )
        .unwrap();
    }
    let mut by_id = HashMap::new();
    for _ in 0..n {
        let r = report(&mut sink).await;
        let d = r.result.unwrap_or_else(|f| panic!("id {}: {f}", r.id));
        assert!(by_id.insert(r.id, d).is_none(), "two reports for {}", r.id);
    }
    let mut last: HashMap<i32, i64> = HashMap::new();
    for id in 0..n {
        let d = by_id[&id];
        let key = format!("order-{}", id % 17);
        assert_eq!(d.partition, java_partition(key.as_bytes(), 3), "{key}");
        if let Some(prev) = last.insert(d.partition, d.offset) {
            assert!(d.offset > prev, "id {id}: offset {} after {prev}", d.offset);
        }
    }
    sink.flush(Duration::from_secs(5)).unwrap();
    assert!(sink.try_report().is_none());
    assert_eq!(sink.is_fatal(), None);
}

#[tokio::test]
async fn oversize_record_is_refused_at_send_alone() {
    let mock = MockCluster::new(1).unwrap();
    let mut sink = KafkaSink::new(&mock.bootstrap_servers(), &kafka(&[])).unwrap();
    let big = vec![b'x'; 1_100_000];
    match sink.send(1, "t", None, Some(&big), NO_HEADERS, None) {
        Err(SendError::Rejected {
            code,
            kind,
            message,
            ..
        }) => {
            assert_eq!(code, RDKafkaErrorCode::MessageSizeTooLarge);
            assert_eq!(kind, FailureKind::PerEvent);
            assert!(message.contains("message.max.bytes"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // Nothing was queued, so no report follows.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(sink.try_report().is_none());
}

#[tokio::test]
async fn broker_refusal_is_per_event_and_makes_the_producer_fatal() {
    let mock = MockCluster::new(1).unwrap();
    mock.create_topic("t", 1, 1).unwrap();
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE],
    );
    let mut sink = KafkaSink::new(&mock.bootstrap_servers(), &kafka(&[])).unwrap();
    sink.send(1, "t", Some(b"k"), Some(b"v"), NO_HEADERS, None)
        .unwrap();
    let r = report(&mut sink).await;
    assert_eq!(r.id, 1);
    let f = r.result.unwrap_err();
    assert_eq!(f.code, RDKafkaErrorCode::MessageSizeTooLarge);
    assert_eq!(f.kind, FailureKind::PerEvent);
    let fatal = sink.is_fatal().expect("gapless guarantee makes it fatal");
    assert!(fatal.contains("gap"), "{fatal}");
    match sink.send(2, "t", Some(b"k"), Some(b"v"), NO_HEADERS, None) {
        Err(SendError::Rejected { code, kind, .. }) => {
            assert_eq!(code, RDKafkaErrorCode::Fatal);
            assert_eq!(kind, FailureKind::Transport);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn unreachable_broker_times_out_as_transport() {
    let mock = MockCluster::new(1).unwrap();
    mock.broker_down(-1).unwrap();
    let mut sink = KafkaSink::new(
        &mock.bootstrap_servers(),
        &kafka(&[("message.timeout.ms", "300")]),
    )
    .unwrap();
    sink.send(7, "t", Some(b"k"), Some(b"v"), NO_HEADERS, None)
        .unwrap();
    let r = report(&mut sink).await;
    assert_eq!(r.id, 7);
    let f = r.result.unwrap_err();
    assert_eq!(f.code, RDKafkaErrorCode::MessageTimedOut);
    assert_eq!(f.kind, FailureKind::Transport);
}

#[tokio::test]
async fn purge_reports_every_record_as_transport() {
    let mock = MockCluster::new(1).unwrap();
    mock.broker_down(-1).unwrap();
    let mut sink = KafkaSink::new(&mock.bootstrap_servers(), &kafka(&[])).unwrap();
    // Headers as the relay holds them.
    let headers: Vec<crate::outbox::RecordHeader> = vec![
        (Arc::from("id"), Some(Bytes::from_static(b"1"))),
        (Arc::from("tenant"), None),
    ];
    for id in 0..3 {
        sink.send(id, "t", None, Some(b"v"), &headers, None)
            .unwrap();
    }
    sink.purge();
    let mut ids = Vec::new();
    for _ in 0..3 {
        let r = report(&mut sink).await;
        let f = r.result.unwrap_err();
        assert_eq!(f.code, RDKafkaErrorCode::PurgeQueue);
        assert_eq!(f.kind, FailureKind::Transport);
        ids.push(r.id);
    }
    ids.sort_unstable();
    assert_eq!(ids, [0, 1, 2]);
}

#[tokio::test]
async fn flush_waits_for_every_report() {
    let mock = MockCluster::new(1).unwrap();
    mock.create_topic("t", 1, 1).unwrap();
    let mut sink = KafkaSink::new(&mock.bootstrap_servers(), &kafka(&[])).unwrap();
    for id in 0..10 {
        sink.send(id, "t", None, Some(b"v"), NO_HEADERS, None)
            .unwrap();
    }
    sink.flush(Duration::from_secs(20)).unwrap();
    assert_eq!(sink.in_queue(), 0);
    let mut n = 0;
    while let Some(r) = sink.try_report() {
        assert!(r.result.is_ok(), "{r:?}");
        n += 1;
    }
    assert_eq!(n, 10);
}

#[test]
fn a_property_librdkafka_refuses_is_named() {
    let err = KafkaSink::new("127.0.0.1:1", &kafka(&[("no.such.property", "1")]))
        .err()
        .unwrap();
    match &err {
        SinkError::Config(SinkConfigError::Property { key, .. }) => {
            assert_eq!(key, "no.such.property")
        }
        other => panic!("{other:?}"),
    }
    assert!(err
        .to_string()
        .contains("kafka.properties.\"no.such.property\""));
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn topic_manager_finds_existing_and_refuses_missing_topics() {
    let mock = MockCluster::new(1).unwrap();
    mock.create_topic("exists", 2, 1).unwrap();
    let mut config = kafka(&[]);
    config.create_topics = false;
    let mut topics = TopicManager::new(&mock.bootstrap_servers(), &config).unwrap();
    topics.ensure("exists").await.unwrap();
    topics.ensure("exists").await.unwrap();
    for _ in 0..2 {
        // Asking twice: the first metadata request must not have made the
        // (auto-creating) mock broker create it.
        match topics.ensure("missing").await {
            Err(SinkError::MissingTopic { topic }) => assert_eq!(topic, "missing"),
            other => panic!("{other:?}"),
        }
    }
}

/// Sends records 1, 2 and 3 (one per request) to a one-partition topic
/// whose first produce request the broker refuses with NOT_LEADER, as one
/// that has not taken the partition on yet; returns each record's report.
async fn three_records_after_a_refused_request(
    properties: &[(&str, &str)],
) -> HashMap<u64, Result<Delivered, DeliveryFailure>> {
    let mock = MockCluster::new(1).unwrap();
    mock.create_topic("t", 1, 1).unwrap();
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION],
    );
    let mut props = vec![("batch.num.messages", "1"), ("linger.ms", "0")];
    props.extend_from_slice(properties);
    let mut sink = KafkaSink::new(&mock.bootstrap_servers(), &kafka(&props)).unwrap();
    for id in 1..=3u64 {
        sink.send(id, "t", Some(b"k"), Some(b"v"), NO_HEADERS, None)
            .unwrap();
    }
    let mut reports = HashMap::new();
    for _ in 0..3 {
        let r = report(&mut sink).await;
        reports.insert(r.id, r.result);
    }
    reports
}

/// The race behind KAFKA-15591 (fixed in Kafka 4.5): the first produce
/// request to a partition is refused with NOT_LEADER (the broker has not
/// applied the partition yet) while the next one, with later sequence
/// numbers, is accepted, since a broker before 4.5 takes any first sequence
/// from a producer it has no state for (the mock never checks sequences of
/// non-transactional producers, so it behaves the same). librdkafka then
/// "implicitly acks" the refused records as persisted, without an offset:
/// they were never written. Such a report must not count as delivered.
#[tokio::test]
async fn a_record_acked_only_implicitly_is_a_transport_failure() {
    // Up to 5 requests in flight, as a user with Kafka 4.5 may allow: the
    // second request is on its way before the first one's refusal is back.
    let reports =
        three_records_after_a_refused_request(&[("max.in.flight.requests.per.connection", "5")])
            .await;
    // Record 1 is not in the log: the later two hold offsets 0 and 1.
    let f = reports[&1].clone().expect_err("record 1 was never written");
    assert_eq!(f.kind, FailureKind::Transport, "{f}");
    assert!(f.message.contains("implicitly"), "{f}");
    assert_eq!(
        reports[&2],
        Ok(Delivered {
            partition: 0,
            offset: 0
        })
    );
    assert_eq!(
        reports[&3],
        Ok(Delivered {
            partition: 0,
            offset: 1
        })
    );
}

/// outboxd's default of one request in flight per broker: the same refusal
/// is retried before anything later goes out, so every record is written,
/// in order, and acked with its offset.
#[tokio::test]
async fn one_request_in_flight_keeps_a_refused_request_first() {
    let reports = three_records_after_a_refused_request(&[]).await;
    for id in 1..=3u64 {
        assert_eq!(
            reports[&id],
            Ok(Delivered {
                partition: 0,
                offset: id as i64 - 1
            }),
            "{reports:?}"
        );
    }
}
