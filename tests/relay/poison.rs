//! Acceptance 7: an event Kafka refuses for itself (too large) follows
//! `relay.on_error`, and nothing else is lost.

use std::time::Duration;

use crate::harness::events::write;
use crate::harness::kafka::shared;
use crate::harness::relay::{confirmed_lsn, env, Relay};
use crate::harness::wait::wait_for;

/// Five small events, one of 1.5 MB (over the producer's and the broker's
/// default `message.max.bytes`), five small: each in its own transaction.
/// Returns the end-of-WAL position right after the big one committed.
fn write_with_poison(pg: &crate::harness::pg::PgCluster) -> outboxd::Lsn {
    let one = |n: usize| {
        format!("INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES ('p', 'a', 'small', '{{\"n\": {n}}}');")
    };
    for n in 0..5 {
        pg.psql("app", &one(n));
    }
    pg.psql(
        "app",
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         SELECT 'p', 'a', 'huge', jsonb_build_object('blob', string_agg(md5(i::text), '')) FROM generate_series(1, 48000) i",
    );
    let after_big: outboxd::Lsn = pg
        .psql("app", "SELECT pg_current_wal_lsn()")
        .trim()
        .parse()
        .unwrap();
    for n in 5..10 {
        pg.psql("app", &one(n));
    }
    after_big
}

fn small_numbers(records: &[crate::harness::kafka::Record]) -> Vec<u64> {
    records
        .iter()
        .map(|r| {
            serde_json::from_str::<serde_json::Value>(r.value_str().unwrap()).unwrap()["n"]
                .as_u64()
                .unwrap()
        })
        .collect()
}

#[test]
fn oversized_event_halts_the_relay_under_stop() {
    let broker = shared();
    let e = env(broker.bootstrap(), "poisonstop", "");
    let relay = Relay::start(&e);
    let after_big = write_with_poison(&e.pg);
    let got = broker.consume_all("poisonstop.p", 5, Duration::from_secs(60));
    assert_eq!(small_numbers(&got), vec![0, 1, 2, 3, 4]);
    wait_for("the halt to be logged", Duration::from_secs(30), || {
        relay.log().contains("relay halted")
    });
    let log = relay.log();
    assert!(
        log.contains("relay.on_error") && log.contains("MessageSizeTooLarge")
            || log.contains("too large"),
        "{log}"
    );
    // It stays put: nothing after the poison event, slot below it.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        broker.record_count("poisonstop.p"),
        5,
        "events after the poison one were published"
    );
    let confirmed = confirmed_lsn(&e.pg, "poisonstop");
    assert!(
        confirmed < after_big,
        "slot confirmed {confirmed} past the poison event (committed before {after_big})"
    );
}

#[test]
fn oversized_event_goes_to_the_dead_letter_topic() {
    let broker = shared();
    // A header from a column that is NULL in every row: the DLQ copy keeps
    // it, null-valued, as the refused record had it.
    let extra = "[relay]\non_error = \"dead_letter\"\ndead_letter_topic = \"poisondlq.dlq\"\n\
                 [routing]\ntopic = \"poisondlq.${aggregate_type}\"\n\
                 additional_headers = { tenant = \"tenant\" }\n";
    let e = env(broker.bootstrap(), "poisondlq", extra);
    e.pg.psql("app", "ALTER TABLE outbox ADD COLUMN tenant text");
    let relay = Relay::start(&e);
    let after_big = write_with_poison(&e.pg);
    let got = broker.consume_all("poisondlq.p", 10, Duration::from_secs(60));
    assert_eq!(
        small_numbers(&got),
        (0..10).collect::<Vec<_>>(),
        "{}",
        relay.log()
    );
    let dlq = broker.consume_all("poisondlq.dlq", 1, Duration::from_secs(60));
    assert_eq!(dlq.len(), 1, "{}", relay.log());
    let error = std::str::from_utf8(dlq[0].header("outboxd.error").expect("error header")).unwrap();
    assert!(
        error.contains("MessageSizeTooLarge") || error.to_lowercase().contains("too large"),
        "{error}"
    );
    assert_eq!(
        dlq[0].header("outboxd.original.topic"),
        Some(&b"poisondlq.p"[..])
    );
    assert!(dlq[0].header("id").is_some());
    assert_eq!(dlq[0].header_value("tenant"), Some(None));
    assert!(got.iter().all(|r| r.header_value("tenant") == Some(None)));
    wait_for(
        "slot to pass the poison event",
        Duration::from_secs(30),
        || confirmed_lsn(&e.pg, "poisondlq") >= after_big,
    );
}

/// Creates `topic` with a small broker-side `max.message.bytes`, so the
/// broker (not the producer) refuses the large record, and refuses the whole
/// batch it travels in.
fn create_small_topic(bootstrap: &str, topic: &str) {
    create_limited_topic(bootstrap, topic, 1, "20000");
}

/// Creates `topic` with `partitions` and the broker-side `max.message.bytes`.
fn create_limited_topic(bootstrap: &str, topic: &str, partitions: i32, max_message_bytes: &str) {
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let t = NewTopic::new(topic, partitions, TopicReplication::Fixed(1))
        .set("max.message.bytes", max_message_bytes);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let res = rt
        .block_on(admin.create_topics([&t], &AdminOptions::new()))
        .unwrap();
    assert!(res.iter().all(|r| r.is_ok()), "{res:?}");
    wait_for("topic metadata", Duration::from_secs(30), || {
        shared().record_count(topic) == 0 && {
            use rdkafka::consumer::{BaseConsumer, Consumer};
            let c: BaseConsumer = rdkafka::ClientConfig::new()
                .set("bootstrap.servers", bootstrap)
                .create()
                .unwrap();
            c.fetch_metadata(Some(topic), Duration::from_secs(5))
                .map(|m| {
                    m.topics()
                        .first()
                        .is_some_and(|t| t.error().is_none() && !t.partitions().is_empty())
                })
                .unwrap_or(false)
        }
    });
}

#[test]
fn batch_mates_of_a_broker_refused_record_are_not_dead_lettered() {
    let broker = shared();
    let extra = "[relay]\non_error = \"dead_letter\"\ndead_letter_topic = \"poisonbatch.dlq\"\n\
                 [kafka.properties]\n\"linger.ms\" = \"200\"\n\"compression.type\" = \"none\"\n";
    let e = env(broker.bootstrap(), "poisonbatch", extra);
    create_small_topic(broker.bootstrap(), "poisonbatch.p");
    // One transaction: small events around a 64 KB one, so they share a
    // producer batch with it (linger.ms = 200).
    e.pg.psql(
        "app",
        "BEGIN;\n\
         INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) SELECT 'p', 'a', 'small', jsonb_build_object('n', i) FROM generate_series(0, 9) i;\n\
         INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) SELECT 'p', 'a', 'huge', jsonb_build_object('blob', string_agg(md5(i::text), '')) FROM generate_series(1, 2000) i;\n\
         INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) SELECT 'p', 'a', 'small', jsonb_build_object('n', i) FROM generate_series(10, 19) i;\n\
         COMMIT;",
    );
    let relay = Relay::start(&e);
    // Replays repeat delivered events (duplicates are allowed); every small
    // event must be there, in order of first appearance.
    let mut firsts = Vec::new();
    wait_for("all 20 small events", Duration::from_secs(90), || {
        let got = broker.consume_all(
            "poisonbatch.p",
            broker.record_count("poisonbatch.p").max(1),
            Duration::from_secs(5),
        );
        firsts.clear();
        for n in small_numbers(&got) {
            if !firsts.contains(&n) {
                firsts.push(n);
            }
        }
        firsts.len() == 20
    });
    assert_eq!(firsts, (0..20).collect::<Vec<_>>(), "{}", relay.log());
    let dlq = broker.consume_all("poisonbatch.dlq", 2, Duration::from_secs(10));
    assert_eq!(
        dlq.len(),
        1,
        "only the large event belongs in the DLQ; log:\n{}",
        relay.log()
    );
    assert_eq!(dlq[0].header("eventType"), Some(&b"huge"[..]));
    assert!(dlq[0].header("outboxd.original.value_size").is_some());
}

/// A non-transactional message arrives with its own checkpoint; when it
/// cannot be mapped under `stop`, that checkpoint must not be confirmed.
#[test]
fn unmappable_message_under_stop_is_not_confirmed() {
    let broker = shared();
    let e = env(broker.bootstrap(), "poisonmsg", "");
    let relay = Relay::start(&e);
    let lsn: outboxd::Lsn =
        e.pg.psql(
            "app",
            "SELECT pg_logical_emit_message(false, 'outbox', 'not a JSON object')",
        )
        .trim()
        .parse()
        .unwrap();
    wait_for("the halt to be logged", Duration::from_secs(30), || {
        relay.log().contains("relay halted")
    });
    e.pg.psql(
        "app",
        "CREATE TABLE later (x int); INSERT INTO later VALUES (1)",
    );
    std::thread::sleep(Duration::from_secs(3));
    let confirmed = confirmed_lsn(&e.pg, "poisonmsg");
    assert!(
        confirmed <= lsn,
        "slot confirmed {confirmed} past the unmappable message at {lsn}"
    );
}

/// Acceptance (issue 9, point 8): records the broker refuses among a steady
/// stream are isolated on a fresh producer, not through reconnects with a
/// growing backoff: the stream keeps going, the refused ones reach the DLQ
/// within seconds, and at most the in-flight window is sent twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_records_in_a_stream_are_dead_lettered_without_reconnects() {
    use crate::harness::events::{aggregates, payload_texts, verify};
    const GOOD: usize = 10_000;
    const REFUSED: usize = 5;
    const WINDOW: usize = 1_000;
    let broker = shared();
    // batch.size below the topics' limit: only the big records are refused,
    // not batches of small ones.
    let extra = format!(
        "[relay]\non_error = \"dead_letter\"\ndead_letter_topic = \"refused.dlq\"\n\
         max_in_flight_events = {WINDOW}\n\
         [kafka.properties]\n\"batch.size\" = \"50000\"\n\"compression.type\" = \"none\"\n"
    );
    let e = env(broker.bootstrap(), "refused", &extra);
    tokio::task::block_in_place(|| {
        for kind in ["payment", "order"] {
            create_limited_topic(broker.bootstrap(), &format!("refused.{kind}"), 3, "100000");
        }
    });
    let relay = Relay::start(&e);
    let aggs = aggregates(50);
    let mut client = e.pg.client("app").await;
    let mut sent = Vec::new();
    let mut refused_ids = Vec::new();
    for k in 0..REFUSED {
        sent.extend(
            write(
                &mut client,
                "refused",
                &aggs,
                GOOD / REFUSED,
                &[1, 10, 50],
                0,
            )
            .await,
        );
        // ~330 kB: under the producer's message.max.bytes, over the topic's.
        let id = uuid::Uuid::new_v4().to_string();
        client
            .execute(
                "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) \
                 SELECT $1::text::uuid, 'payment', $2, 'payment.huge', \
                 jsonb_build_object('blob', string_agg(md5(i::text), '')) FROM generate_series(1, 10000) i",
                &[&id, &format!("huge-{k}")],
            )
            .await
            .unwrap();
        refused_ids.push(id);
    }
    let written = std::time::Instant::now();
    let texts = payload_texts(&e.pg);
    let dir = e.dir.path().to_path_buf();
    let (v, dlq) = tokio::task::spawn_blocking(move || {
        let v = verify(broker, &sent, &texts, Duration::from_secs(600), true, &dir);
        let dlq = broker.consume_all("refused.dlq", REFUSED, Duration::from_secs(600));
        (v, dlq)
    })
    .await
    .unwrap_or_else(|err| panic!("{err:?}\nrelay log:\n{}", relay.log()));
    let took = written.elapsed();
    let log = relay.log();
    let reconnects = log.matches("relay interrupted").count();
    let outages = log.matches("Kafka outage started").count();
    eprintln!(
        "refused: {} good delivered, {} duplicates, {} dead-lettered, {reconnects} reconnects, \
         {outages} Kafka outages, {:.1}s after the last write",
        v.delivered,
        v.duplicates,
        dlq.len(),
        took.as_secs_f64()
    );
    assert_eq!(v.delivered, GOOD);
    let mut dead: Vec<(String, String)> = dlq
        .iter()
        .map(|r| {
            (
                r.key_str().expect("DLQ record key").to_string(),
                std::str::from_utf8(r.header("id").expect("DLQ record id header"))
                    .unwrap()
                    .to_string(),
            )
        })
        .collect();
    dead.sort();
    let want: Vec<(String, String)> = refused_ids
        .iter()
        .enumerate()
        .map(|(k, id)| (format!("huge-{k}"), id.clone()))
        .collect();
    assert_eq!(dead, want, "DLQ (key, id)");
    assert_eq!(reconnects, 0, "a refusal cost a reconnect:\n{log}");
    assert_eq!(outages, 0, "a refusal counted as a Kafka outage:\n{log}");
    assert!(
        v.duplicates <= WINDOW,
        "{} duplicates, more than the in-flight window",
        v.duplicates
    );
    assert!(
        took < Duration::from_secs(30),
        "took {took:?} after the last write"
    );
}

/// Issue 9, point 8: a row that cannot be mapped (its aggregate type makes
/// an invalid topic name) still reaches the DLQ with its key and `id`
/// header, and the raw row as JSON; the relay goes on.
#[test]
fn unmappable_row_is_dead_lettered_with_its_key_id_and_row() {
    let broker = shared();
    let extra = "[relay]\non_error = \"dead_letter\"\ndead_letter_topic = \"poisonrow.dlq\"\n";
    let e = env(broker.bootstrap(), "poisonrow", extra);
    let relay = Relay::start(&e);
    let id = "00000000-0000-4000-8000-0000000000aa";
    e.pg.psql(
        "app",
        &format!(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('{id}', 'no/such topic', 'agg-7', 'broken', '{{\"n\": 1}}'); \
             INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             VALUES ('p', 'agg-7', 'fine', '{{\"n\": 2}}')"
        ),
    );
    let good = broker.consume_all("poisonrow.p", 1, Duration::from_secs(60));
    assert_eq!(small_numbers(&good), vec![2], "{}", relay.log());
    let dlq = broker.consume_all("poisonrow.dlq", 1, Duration::from_secs(60));
    assert_eq!(dlq.len(), 1, "{}", relay.log());
    let r = &dlq[0];
    assert_eq!(r.key_str(), Some("agg-7"));
    assert_eq!(r.header("id"), Some(id.as_bytes()));
    assert_eq!(r.header("outboxd.error.kind"), Some(&b"mapping"[..]));
    let row: serde_json::Value = serde_json::from_str(r.value_str().unwrap()).unwrap();
    assert_eq!(row["id"], id);
    assert_eq!(row["aggregate_type"], "no/such topic");
    assert_eq!(row["aggregate_id"], "agg-7");
    assert_eq!(row["payload"], "{\"n\": 1}");
    assert_eq!(row["headers"], serde_json::Value::Null);
}
