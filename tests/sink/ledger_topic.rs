//! The position ledger's topic against the real broker: created compacted
//! with one partition, refused when it exists uncompacted or may not be
//! created, and read back as the last value per key, identities apart,
//! tombstones deleting. What is read back is checked against the raw
//! records a plain consumer sees, not only against what was written.

use std::time::Duration;

use outboxd::config::KafkaConfig;
use outboxd::progress::ledger::{LedgerEntry, LedgerIdentity, LEDGER_VERSION};
use outboxd::sink::{LedgerTopic, LedgerTopicError, ReadTo};
use outboxd::Lsn;
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::ClientConfig;

use crate::harness::kafka::shared;

fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

fn ledger(topic: &str, create_topics: bool) -> LedgerTopic {
    let kafka = KafkaConfig {
        brokers: Some(shared().bootstrap().to_owned()),
        create_topics,
        ledger_topic: topic.to_owned(),
        ..KafkaConfig::default()
    };
    LedgerTopic::new(shared().bootstrap(), &kafka).unwrap()
}

fn identity(system_identifier: &str, slot: &str) -> LedgerIdentity {
    LedgerIdentity {
        system_identifier: system_identifier.into(),
        database: "app".into(),
        slot: slot.into(),
    }
}

fn entry(id: &LedgerIdentity, lsn: u64) -> LedgerEntry {
    LedgerEntry {
        version: LEDGER_VERSION,
        system_identifier: id.system_identifier.clone(),
        database: id.database.clone(),
        slot: id.slot.clone(),
        timeline: 1,
        confirmed_lsn: Lsn(lsn),
        commit_time_us: Some(1_764_569_428_000_000 + lsn as i64),
        outboxd_version: "test".into(),
        written_at_us: lsn as i64,
        accepted_gaps: Vec::new(),
        inside: None,
        transactional: false,
    }
}

async fn cleanup_policy(topic: &str) -> Option<String> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", shared().bootstrap())
        .create()
        .unwrap();
    let described = admin
        .describe_configs([&ResourceSpecifier::Topic(topic)], &AdminOptions::new())
        .await
        .unwrap();
    let resource = described.into_iter().next().unwrap().unwrap();
    resource.get("cleanup.policy").and_then(|e| e.value.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_topic_is_created_compacted_with_one_partition() {
    let topic = unique("ledger-created");
    let l = ledger(&topic, true);
    l.ensure().await.unwrap();
    // Ensuring again finds it as it is.
    l.ensure().await.unwrap();
    assert_eq!(cleanup_policy(&topic).await.as_deref(), Some("compact"));
    let partitions = tokio::task::block_in_place(|| shared().partitions(&topic));
    assert_eq!(partitions, vec![0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_uncompacted_ledger_topic_is_refused_with_the_fix() {
    let topic = unique("ledger-absent");
    let err = ledger(&topic, false).ensure().await.unwrap_err();
    assert!(matches!(err, LedgerTopicError::Missing { .. }), "{err}");
    let text = err.to_string();
    for needle in [
        "kafka.ledger_topic",
        "cleanup.policy=compact",
        "kafka.create_topics = true",
    ] {
        assert!(text.contains(needle), "{needle:?} not in: {text}");
    }
    tokio::task::block_in_place(|| assert!(shared().record_count(&topic) == 0));

    // An ordinary topic (cleanup.policy=delete) under the ledger's name:
    // with or without create_topics, outboxd refuses rather than use it.
    let plain = unique("ledger-plain");
    tokio::task::block_in_place(|| shared().create_topic(&plain, 1));
    for create in [true, false] {
        let err = ledger(&plain, create).ensure().await.unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(&err, LedgerTopicError::NotCompacted { policy, .. } if policy == "delete"),
            "{text}"
        );
        assert!(
            text.contains("--add-config cleanup.policy=compact"),
            "{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn last_value_per_key_wins_and_identities_do_not_mix() {
    let topic = unique("ledger-values");
    let l = ledger(&topic, true);
    l.ensure().await.unwrap();
    let a = identity("7443001228541284437", "outboxd");
    let other_server = identity("7000000000000000001", "outboxd");
    let other_slot = identity("7443001228541284437", "second");
    assert_eq!(
        l.reader().latest(&a, ReadTo::End).await.unwrap(),
        None,
        "empty topic"
    );
    let writes = [
        entry(&a, 0x100),
        entry(&other_server, 0x9_0000_0000),
        entry(&a, 0x200),
        entry(&other_slot, 0x50),
        entry(&a, 0x300),
    ];
    for e in &writes {
        l.write(e).await.unwrap();
    }
    assert_eq!(
        l.reader().latest(&a, ReadTo::End).await.unwrap(),
        Some(writes[4].clone())
    );
    assert_eq!(
        l.reader().latest(&other_server, ReadTo::End).await.unwrap(),
        Some(writes[1].clone())
    );
    assert_eq!(
        l.reader().latest(&other_slot, ReadTo::End).await.unwrap(),
        Some(writes[3].clone())
    );
    let mut same_slot = l
        .reader()
        .entries_for("app", "outboxd", ReadTo::End)
        .await
        .unwrap();
    same_slot.sort_by_key(|e| e.confirmed_lsn);
    assert_eq!(same_slot, vec![writes[4].clone(), writes[1].clone()]);

    // Every write is a record keyed by its identity, as any consumer sees it.
    let records = tokio::task::block_in_place(|| {
        shared().consume_all(&topic, writes.len() + 1, Duration::from_secs(5))
    });
    assert_eq!(records.len(), writes.len());
    for (r, e) in records.iter().zip(&writes) {
        assert_eq!(r.key_str(), Some(e.identity().key().as_str()));
        assert_eq!(
            LedgerEntry::from_json(r.value.as_deref().unwrap()).unwrap(),
            *e
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tombstone_deletes_and_a_newer_format_is_refused_only_for_its_key() {
    let topic = unique("ledger-tombstone");
    let l = ledger(&topic, true);
    l.ensure().await.unwrap();
    let a = identity("1", "outboxd");
    let b = identity("2", "outboxd");
    l.write(&entry(&a, 10)).await.unwrap();
    l.write(&entry(&b, 20)).await.unwrap();
    l.delete(&a).await.unwrap();
    assert_eq!(l.reader().latest(&a, ReadTo::End).await.unwrap(), None);
    assert_eq!(
        l.reader().latest(&b, ReadTo::End).await.unwrap(),
        Some(entry(&b, 20))
    );
    let keys: Vec<String> = l
        .reader()
        .read_all(ReadTo::End)
        .await
        .unwrap()
        .into_keys()
        .collect();
    assert_eq!(keys, vec![b.key()]);
    // Written again after the tombstone, it is back.
    l.write(&entry(&a, 30)).await.unwrap();
    assert_eq!(
        l.reader().latest(&a, ReadTo::End).await.unwrap(),
        Some(entry(&a, 30))
    );

    // A newer outboxd's entry for another slot does not stop this one; for
    // this slot it is refused, naming the version.
    let future = identity("3", "elsewhere");
    let mut json: serde_json::Value = serde_json::from_slice(&entry(&future, 1).to_json()).unwrap();
    json["version"] = 2.into();
    produce_raw(&topic, &future.key(), json.to_string().as_bytes()).await;
    assert_eq!(
        l.reader().latest(&a, ReadTo::End).await.unwrap(),
        Some(entry(&a, 30))
    );
    assert_eq!(
        l.reader()
            .entries_for("app", "outboxd", ReadTo::End)
            .await
            .unwrap()
            .len(),
        2
    );
    let err = l
        .reader()
        .latest(&future, ReadTo::End)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("format version 2"), "{err}");
    let err = l
        .reader()
        .entries_for("app", "elsewhere", ReadTo::End)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("upgrade"), "{err}");
}

async fn produce_raw(topic: &str, key: &str, value: &[u8]) {
    use rdkafka::producer::{FutureProducer, FutureRecord};
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", shared().bootstrap())
        .create()
        .unwrap();
    producer
        .send(
            FutureRecord::to(topic).key(key).payload(value),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
}

/// A transaction of another transactional writer (`writer`, a fresh id),
/// left open on `topic` with one record in it: a relay stopped between its
/// entry and EndTxn.
async fn open_transaction_on(topic: &str, writer: &str) -> rdkafka::producer::BaseProducer {
    let (topic, writer) = (topic.to_owned(), writer.to_owned());
    tokio::task::spawn_blocking(move || {
        shared().open_transaction(&unique(&writer), &topic, writer.as_bytes(), b"{}")
    })
    .await
    .unwrap()
}

/// A fresh ledger topic (named after `name`) holding an entry of `a` at
/// 0x100, then another relay's transaction left open (stopped between its
/// entry and EndTxn), then `a`'s entry at 0x200. Returns the topic, `a` and
/// the other relay's producer, to end its transaction with.
async fn entries_around_an_open_transaction(
    name: &str,
) -> (LedgerTopic, LedgerIdentity, rdkafka::producer::BaseProducer) {
    let topic = unique(name);
    let l = ledger(&topic, true);
    l.ensure().await.unwrap();
    let a = identity("7443001228541284437", "outboxd");
    l.write(&entry(&a, 0x100)).await.unwrap();
    let other = open_transaction_on(&topic, "other-relay").await;
    l.write(&entry(&a, 0x200)).await.unwrap();
    (l, a, other)
}

/// Another relay's commit under way on the shared ledger topic (its entry
/// written, the transaction still open) hides every entry committed after
/// it from a `read_committed` reader. A read to the stable offset then
/// misses the newest entry without an error: a standby that checked its
/// start that way repeated the fenced instance's last transaction (466
/// events in one run). A read to the end waits for the open transaction
/// and finds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_committed_behind_an_open_transaction_is_found_by_a_read_to_the_end() {
    use rdkafka::producer::Producer;
    let (l, a, other) = entries_around_an_open_transaction("ledger-open-txn").await;
    let newest = entry(&a, 0x200);

    let stable = l.reader().latest(&a, ReadTo::Stable).await.unwrap();
    assert_eq!(
        stable,
        Some(entry(&a, 0x100)),
        "the stable offset hides what was committed after the open transaction"
    );
    // The open transaction ends a second into the read to the end.
    let resolving = tokio::task::spawn_blocking(move || {
        std::thread::sleep(Duration::from_secs(1));
        other.abort_transaction(Duration::from_secs(30)).unwrap();
    });
    let started = std::time::Instant::now();
    let to_end = l.reader().latest(&a, ReadTo::End).await.unwrap();
    resolving.await.unwrap();
    assert_eq!(to_end, Some(newest), "the read to the end missed an entry");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "the read to the end returned before the open transaction was resolved ({:?})",
        started.elapsed()
    );
}

/// A transaction left open on the ledger topic for longer than a read to
/// the end waits (30 s by default, 3 s here) fails the read with what holds
/// it: the partition, the offset a `read_committed` reader stops at, the end
/// it waited for, and the Kafka tool that names the producer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_held_by_an_open_transaction_names_the_partition_and_its_offsets() {
    use rdkafka::producer::Producer;
    let (l, a, other) = entries_around_an_open_transaction("ledger-held").await;

    let started = std::time::Instant::now();
    let err = l
        .reader()
        .clone()
        .with_read_timeout(Duration::from_secs(3))
        .latest(&a, ReadTo::End)
        .await
        .unwrap_err()
        .to_string();
    let waited = started.elapsed();
    tokio::task::spawn_blocking(move || other.abort_transaction(Duration::from_secs(30)))
        .await
        .unwrap()
        .unwrap();
    // Offsets: 0 the first entry, 1 the open transaction's record, 2 the
    // second entry; the end is 3.
    assert!(
        err.contains("not read to the end within 3s: partition 0 is readable to offset 1 of 3"),
        "{err}"
    );
    assert!(
        waited >= Duration::from_secs(3),
        "the read gave up before its timeout ({waited:?}): {err}"
    );
    assert!(
        err.contains("describe-producers --topic ledger-held-"),
        "{err}"
    );
}
