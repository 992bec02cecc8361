//! Issue 37 §3: the registry while the relay runs. A BACKWARD-compatible
//! version registered under load is used without a restart (a payload
//! that needs it makes the relay read the subject's latest version; a
//! version that every payload fits arrives with the periodic refresh), and
//! a registry cut off for 30 s under load makes `/readyz` 503 naming it,
//! confirms nothing past the event that waits for it, and loses nothing;
//! so do relays beside it that meet a per-event subject
//! (`com.acme.${event_type}`) or a framed schema id first during the cut.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::avro::{avro_env, avro_env_at, insert, order, order_schema};
use crate::harness::http::{free_port, get, Scrape};
use crate::harness::kafka::{shared as broker, Record};
use crate::harness::proxy::Proxy;
use crate::harness::python::{read_avro, write_avro};
use crate::harness::registry::shared as registry;
use crate::harness::relay::{confirmed_lsn, lsn_now, Env, Relay};
use crate::harness::wait::wait_for;

/// `order_schema` with `extra` optional fields (null by default) appended:
/// each such version can read what the one before wrote (BACKWARD).
fn order_schema_with(extra: &[&str]) -> Value {
    let mut schema = order_schema();
    let fields = schema["fields"].as_array_mut().unwrap();
    for name in extra {
        fields.push(json!({"name": name, "type": ["null", "string"], "default": null}));
    }
    schema
}

/// Decoded records: (writer, seq) -> (schema id, value).
type Decoded = HashMap<(u64, u64), (u64, Value)>;

/// Decoded records by (writer, seq): (schema id, value), checking that
/// every record decodes, none arrived twice and each key kept its order.
/// `dups_allowed`: at-least-once after a reconnect may repeat records.
fn decode_all(registry: &str, topic: &str, got: &[Record], dups_allowed: bool) -> (Decoded, usize) {
    let decoded = read_avro(registry, topic, got);
    let mut rows = HashMap::new();
    let mut dups = 0;
    let mut last: HashMap<(String, i32), u64> = HashMap::new();
    let mut ordered: Vec<(&Record, &Value)> = got.iter().zip(&decoded).collect();
    ordered.sort_by_key(|(r, _)| (r.partition, r.offset));
    for (record, d) in ordered {
        assert!(
            d["error"].is_null(),
            "the deserializer refused {record:?}: {d}"
        );
        let v = &d["value"];
        let key = (v["writer"].as_u64().unwrap(), v["seq"].as_u64().unwrap());
        let k = (record.key_str().unwrap().to_owned(), record.partition);
        if let Some(prev) = last.insert(k.clone(), key.1) {
            // A repeat starts over from an earlier row; otherwise the
            // order written.
            assert!(
                prev < key.1 || dups_allowed,
                "key {k:?}: row {} after {prev}",
                key.1
            );
        }
        let schema_id = d["schema_id"].as_u64().unwrap();
        if rows.insert(key, (schema_id, v.clone())).is_some() {
            assert!(dups_allowed, "row {key:?} arrived twice");
            dups += 1;
        }
    }
    (rows, dups)
}

/// Rows `0..n` of `writer` (one key each), in batches, with `channel` set
/// when given (a field only version 2 on has).
fn write_rows(e: &crate::harness::relay::Env, writer: usize, n: usize, channel: Option<&str>) {
    for batch in (0..n).collect::<Vec<_>>().chunks(25) {
        let payloads: Vec<Value> = batch
            .iter()
            .map(|&i| {
                let mut p = order(writer, i).0;
                if let Some(c) = channel {
                    p["channel"] = json!(c);
                }
                p
            })
            .collect();
        insert(e, &format!("writer-{writer}"), &payloads);
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_backward_compatible_version_registered_under_load_is_used_without_restart() {
    let reg = registry();
    let slot = "regevolve";
    let port = free_port();
    let (e, topic) = avro_env(
        slot,
        reg,
        &format!("refresh_interval = \"1s\"\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n"),
    );
    let subject = format!("{topic}-value");
    let id1 = reg.register_avro(&subject, &order_schema());
    // Apicurio's default is NONE, where Confluent's is BACKWARD.
    reg.set_compatibility(Some(&subject), "BACKWARD");
    let relay = Relay::start(&e);

    // A version that is not BACKWARD (a new field without a default) is
    // refused: the level is in force.
    let mut breaking = order_schema();
    breaking["fields"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "required_new", "type": "string"}));
    let (status, body) = reg.request(
        "POST",
        &format!("/subjects/{subject}/versions"),
        Some(&json!({ "schema": breaking.to_string() })),
    );
    assert_eq!(status, 409, "a breaking version was accepted: {body}");

    // Phase 1 (writers 10..13): 4 × 500 rows of version 1, a batch every
    // 100 ms each. While they write and the relay sends, version 2 is
    // registered, and phase 2 (writers 20..23) writes rows with its new
    // field beside them.
    let (writers, per) = (4, 500);
    let (mut in_kafka_at_v2, mut id2) = (0, 0);
    let mut registered_at = Instant::now();
    std::thread::scope(|s| {
        for w in 0..writers {
            let e = &e;
            s.spawn(move || write_rows(e, 10 + w, per, None));
        }
        wait_for(
            "the relay to be busy with phase 1",
            Duration::from_secs(60),
            || broker().record_count(&topic) >= 200,
        );
        registered_at = Instant::now();
        in_kafka_at_v2 = broker().record_count(&topic);
        id2 = reg.register_avro(&subject, &order_schema_with(&["channel"]));
        for w in 0..writers {
            let e = &e;
            s.spawn(move || write_rows(e, 20 + w, per, Some("web")));
        }
    });
    assert!(in_kafka_at_v2 < writers * per, "phase 1 was over before v2");
    let total = 2 * writers * per;
    let got = broker().consume_all(&topic, total, Duration::from_secs(180));
    assert_eq!(got.len(), total, "{}", relay.log());

    // Phase 3: version 3 (another optional field), registered once all of
    // the above is in Kafka; rows of the version 2 shape fit every version,
    // and the refresh (every second) brings version 3 in.
    let id3 = reg.register_avro(&subject, &order_schema_with(&["channel", "region"]));
    std::thread::sleep(Duration::from_secs(4));
    write_rows(&e, 30, 50, Some("app"));
    let got = broker().consume_all(&topic, total + 50, Duration::from_secs(60));
    assert_eq!(got.len(), total + 50, "{}", relay.log());

    let (rows, _) = decode_all(reg.url(), &topic, &got, false);
    assert_eq!(rows.len(), total + 50, "0 lost");
    let mut ids: HashMap<u64, HashSet<u64>> = HashMap::new();
    for ((writer, seq), (id, v)) in &rows {
        let phase = writer / 10;
        ids.entry(phase).or_default().insert(*id);
        let expected = order((*writer) as usize, *seq as usize).1;
        for (field, want) in expected.as_object().unwrap() {
            assert_eq!(&v[field], want, "writer {writer} row {seq}: {field}");
        }
        match phase {
            // Written before version 2: it or version 2 (which reads them
            // too, its new field null) encodes them.
            1 => assert!([id1 as u64, id2 as u64].contains(id), "{id}"),
            2 => {
                assert_eq!(*id, id2 as u64, "writer {writer} row {seq}");
                assert_eq!(v["channel"], "web");
            }
            _ => {
                assert_eq!(*id, id3 as u64, "writer {writer} row {seq}");
                assert_eq!(v["channel"], "app");
                assert_eq!(v["region"], Value::Null);
            }
        }
    }
    let log = relay.log();
    assert!(log.contains("encodes from now on"), "{log}");
    let scrape = Scrape::take(port);
    let requests = scrape
        .series("outboxd_schema_registry_requests_total")
        .iter()
        .map(|(_, v)| v)
        .sum::<f64>();
    let seconds = registered_at.elapsed().as_secs_f64();
    eprintln!(
        "evolution: {} records, {in_kafka_at_v2} in Kafka when v2 was registered, ids by phase \
         {ids:?} (v1 {id1}, v2 {id2}, v3 {id3}), {requests} registry requests in all \
         ({seconds:.0} s since v2, refresh every 1 s)",
        got.len()
    );
    // The refresh and the re-reads: about one a second, none per event.
    assert!(requests < 10.0 + 2.0 * seconds + 10.0, "{requests}");
    assert_eq!(
        scrape.value("outboxd_schema_registry_cached_schemas", ""),
        3.0
    );
}

/// A relay beside the test's own on the same database, with a slot and a
/// publication `name` of its own, reading `table` only with `routing` (the
/// keys after `[routing]`), its metrics on `ports.1` (`ports.0`: the test
/// relay's); the rest of the config (the proxied registry, the backoff) is
/// the test relay's.
fn side_relay(e: &Env, name: &str, table: &str, routing: &str, ports: (u16, u16)) -> Relay {
    let config = std::fs::read_to_string(&e.config).unwrap();
    let (routing_at, schema_registry_at) = (
        config.find("[routing]\n").unwrap(),
        config.find("[schema_registry]\n").unwrap(),
    );
    let config = format!(
        "{}[outbox]\ntable = \"{table}\"\n[routing]\n{routing}\n{}",
        &config[..routing_at],
        &config[schema_registry_at..]
    );
    let slot_at = config.find("slot = \"").unwrap();
    let slot_end = slot_at + config[slot_at..].find('\n').unwrap();
    let config = format!(
        "{}slot = \"{name}\"\npublication = \"{name}\"{}",
        &config[..slot_at],
        &config[slot_end..]
    )
    .replacen(&format!(":{}\"", ports.0), &format!(":{}\"", ports.1), 1);
    let path = e.dir.path().join(format!("{name}.toml"));
    std::fs::write(&path, config).unwrap();
    let relay = Relay::start_config(&path, e.dir.path(), &[], &[]);
    wait_for(
        "the side relay's /readyz 200",
        Duration::from_secs(60),
        || get(ports.1, "/readyz").is_some_and(|(s, _)| s == 200),
    );
    relay
}

/// Rows of `events_outbox` (key `e`): (event type, writer, seq), the
/// payload `order(writer, seq)` with `channel` set for `Shipped`.
fn insert_events(e: &Env, rows: &[(&str, usize, usize)]) {
    let values: Vec<String> = rows
        .iter()
        .map(|(event_type, w, i)| {
            let mut p = order(*w, *i).0;
            if *event_type == "Shipped" {
                p["channel"] = json!("depot");
            }
            format!(
                "('order', 'e', '{event_type}', '{}'::jsonb)",
                p.to_string().replace('\'', "''")
            )
        })
        .collect();
    e.pg.psql(
        "app",
        &format!(
            "INSERT INTO events_outbox (aggregate_type, aggregate_id, event_type, payload) \
             VALUES {}",
            values.join(", ")
        ),
    );
}

/// A framed record schema for the `bin_outbox` rows, `extra` an optional
/// field more (another schema, another id).
fn shipment_schema(extra: Option<&str>) -> Value {
    let mut fields = vec![json!({"name": "seq", "type": "long"})];
    if let Some(name) = extra {
        fields.push(json!({"name": name, "type": ["null", "string"], "default": null}));
    }
    json!({"type": "record", "name": "Shipment", "namespace": "com.acme.outage", "fields": fields})
}

fn insert_framed(e: &Env, frames: &[Vec<u8>]) {
    let values: Vec<String> = frames
        .iter()
        .map(|f| {
            let hex: String = f.iter().map(|b| format!("{b:02x}")).collect();
            format!("('shipment', 'f', 'shipped', '\\x{hex}')")
        })
        .collect();
    e.pg.psql(
        "app",
        &format!(
            "INSERT INTO bin_outbox (aggregate_type, aggregate_id, event_type, payload) VALUES {}",
            values.join(", ")
        ),
    );
}

#[test]
fn a_registry_cut_off_for_30s_under_load_makes_readyz_503_naming_it_and_loses_nothing() {
    let reg = registry();
    let slot = "regoutage";
    let port = free_port();
    // The relay reaches the registry through a proxy the test can cut; the
    // test itself talks to the registry directly.
    let url = url::Url::parse(reg.url()).unwrap();
    let upstream = SocketAddr::from(([127, 0, 0, 1], url.port().unwrap()));
    let proxy = Proxy::start(upstream);
    let mut proxied = url.clone();
    proxied.set_port(Some(proxy.port())).unwrap();
    let (e, topic) = avro_env_at(
        slot,
        proxied.as_str(),
        &format!(
            "refresh_interval = \"1s\"\nrequest_timeout = \"2s\"\n\
             [relay]\nreconnect_backoff_max = \"4s\"\n\
             [metrics]\nlisten = \"127.0.0.1:{port}\"\n"
        ),
    );
    let subject = format!("{topic}-value");
    let id1 = reg.register_avro(&subject, &order_schema());
    reg.set_compatibility(Some(&subject), "BACKWARD");
    let relay = Relay::start(&e);
    wait_for("/readyz 200", Duration::from_secs(60), || {
        get(port, "/readyz").is_some_and(|(s, _)| s == 200)
    });

    // Beside it, through the same proxy: a relay with per-event subjects
    // (RecordNameStrategy), and a relay of framed rows. Each meets a
    // subject or a schema id before the cut, and another one first during
    // it (both registered before it, never used).
    e.pg.psql(
        "app",
        "CREATE TABLE events_outbox (LIKE outbox INCLUDING ALL); \
         CREATE TABLE bin_outbox (id bigserial PRIMARY KEY, aggregate_type text NOT NULL, \
         aggregate_id text NOT NULL, event_type text NOT NULL, payload bytea)",
    );
    let (subj_port, bin_port) = (free_port(), free_port());
    let (subj_slot, bin_slot) = (format!("{slot}subj"), format!("{slot}bin"));
    let (subj_topic, bin_topic) = (format!("{slot}.events"), format!("{slot}.framed"));
    let placed_id = reg.register_avro(&format!("com.acme.{slot}.Placed"), &order_schema());
    let shipped_id = reg.register_avro(
        &format!("com.acme.{slot}.Shipped"),
        &order_schema_with(&["channel"]),
    );
    let frames = |n: &str, schema: &Value, values: Vec<Value>| {
        let subject = format!("{slot}.{n}");
        reg.register_avro(&format!("{subject}-value"), schema);
        write_avro(reg.url(), &subject, schema, &values)
    };
    let (known_frames, new_frame) = (
        frames(
            "bin1",
            &shipment_schema(None),
            (0..10).map(|i| json!({"seq": i})).collect(),
        ),
        frames(
            "bin2",
            &shipment_schema(Some("depot")),
            vec![json!({"seq": 100, "depot": "north"})],
        ),
    );
    let subj_relay = side_relay(
        &e,
        &subj_slot,
        "public.events_outbox",
        &format!(
            "topic = \"{subj_topic}\"\nvalue_format = \"avro\"\n\
             subject = \"com.acme.{slot}.${{event_type}}\""
        ),
        (port, subj_port),
    );
    let bin_relay = side_relay(
        &e,
        &bin_slot,
        "public.bin_outbox",
        &format!("topic = \"{bin_topic}\"\nvalue_format = \"framed\""),
        (port, bin_port),
    );
    insert_events(&e, &(0..5).map(|i| ("Placed", 50, i)).collect::<Vec<_>>());
    insert_framed(&e, &known_frames[..5]);
    wait_for(
        "the side relays' rows before the cut",
        Duration::from_secs(60),
        || broker().record_count(&subj_topic) >= 5 && broker().record_count(&bin_topic) >= 5,
    );

    // Load: 4 writers, a batch of 10 rows every 100 ms each, throughout.
    let stop = AtomicBool::new(false);
    let written: Vec<AtomicUsize> = (0..4).map(|_| AtomicUsize::new(0)).collect();
    let mut readyz = Vec::new();
    let (mut confirmed_during, mut after_late) = (outboxd::Lsn::ZERO, outboxd::Lsn::ZERO);
    let (mut after_subject, mut after_frame) = (outboxd::Lsn::ZERO, outboxd::Lsn::ZERO);
    let mut side_readyz = Vec::new();
    let mut side_confirmed = (outboxd::Lsn::ZERO, outboxd::Lsn::ZERO);
    let mut id2 = 0;
    std::thread::scope(|s| {
        for (w, count) in written.iter().enumerate() {
            let (e, stop) = (&e, &stop);
            s.spawn(move || {
                let mut i = 0;
                while !stop.load(Ordering::SeqCst) {
                    let payloads: Vec<Value> = (i..i + 10).map(|i| order(w, i).0).collect();
                    insert(e, &format!("writer-{w}"), &payloads);
                    i += 10;
                    count.store(i, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(100));
                }
            });
        }
        std::thread::sleep(Duration::from_secs(5));
        proxy.black_hole();
        let cut_at = Instant::now();
        // A subject and a schema id the side relays meet first now, and
        // rows after each that must wait for them.
        insert_events(&e, &[("Shipped", 51, 0)]);
        after_subject = lsn_now(&e.pg);
        insert_events(&e, &(5..10).map(|i| ("Placed", 50, i)).collect::<Vec<_>>());
        insert_framed(&e, &[new_frame[0].clone()]);
        after_frame = lsn_now(&e.pg);
        insert_framed(&e, &known_frames[5..]);
        // Registered while the relay cannot see it, and a row that needs
        // it: the relay must ask, and wait for, the registry.
        id2 = reg.register_avro(&subject, &order_schema_with(&["channel"]));
        let mut late = order(9, 0).0;
        late["channel"] = json!("late");
        insert(&e, "late", &[late]);
        after_late = lsn_now(&e.pg);
        while cut_at.elapsed() < Duration::from_secs(30) {
            readyz.push((cut_at.elapsed().as_secs(), get(port, "/readyz")));
            side_readyz.push((
                cut_at.elapsed().as_secs(),
                get(subj_port, "/readyz"),
                get(bin_port, "/readyz"),
            ));
            std::thread::sleep(Duration::from_secs(1));
        }
        confirmed_during = confirmed_lsn(&e.pg, slot);
        side_confirmed = (
            confirmed_lsn(&e.pg, &subj_slot),
            confirmed_lsn(&e.pg, &bin_slot),
        );
        proxy.heal();
        std::thread::sleep(Duration::from_secs(10));
        stop.store(true, Ordering::SeqCst);
    });
    // Nothing at or past the row that waited for the registry was
    // confirmed while it waited.
    assert!(
        confirmed_during < after_late,
        "slot confirmed {confirmed_during} past the row that waited ({after_late})"
    );
    // 503 naming the registry from a few seconds in (the refresh asks
    // every second, each request waits up to 2 s) to the end of the cut.
    let not_ready: Vec<_> = readyz
        .iter()
        .filter(|(_, r)| {
            r.as_ref()
                .is_some_and(|(s, b)| *s == 503 && b.contains("schema registry"))
        })
        .collect();
    let late_ones = readyz.iter().filter(|(t, _)| *t >= 8).count();
    assert!(
        not_ready.iter().filter(|(t, _)| *t >= 8).count() == late_ones && late_ones > 0,
        "/readyz during the cut: {readyz:?}\n{}",
        relay.log()
    );
    wait_for("/readyz 200 again", Duration::from_secs(60), || {
        get(port, "/readyz").is_some_and(|(s, _)| s == 200)
    });

    let total: usize = written
        .iter()
        .map(|c| c.load(Ordering::SeqCst))
        .sum::<usize>()
        + 1;
    wait_for("every row in Kafka", Duration::from_secs(120), || {
        broker().record_count(&topic) >= total
    });
    let got = broker().consume_all(
        &topic,
        broker().record_count(&topic),
        Duration::from_secs(60),
    );
    let (rows, dups) = decode_all(reg.url(), &topic, &got, true);
    assert_eq!(rows.len(), total, "0 lost\n{}", relay.log());
    for (w, count) in written.iter().enumerate() {
        for i in 0..count.load(Ordering::SeqCst) {
            let (id, v) = &rows[&(w as u64, i as u64)];
            assert!([id1 as u64, id2 as u64].contains(id), "{id}");
            assert_eq!(v["seq"], i);
        }
    }
    let (id, v) = &rows[&(9, 0)];
    assert_eq!((*id, &v["channel"]), (id2 as u64, &json!("late")));
    let scrape = Scrape::take(port);
    let reconnects = scrape.value("outboxd_reconnects_total", "cause=\"schema_registry\"");
    assert!(reconnects >= 1.0, "{reconnects}");
    assert!(relay.log().contains("schema registry outage started"));

    // The side relays: each waited at the row that needed the registry,
    // said so on /readyz, and caught up on its own.
    assert!(
        side_confirmed.0 < after_subject && side_confirmed.1 < after_frame,
        "confirmed {side_confirmed:?} past the rows that waited ({after_subject}, {after_frame})"
    );
    let registry_down = |r: &Option<(u16, String)>| {
        r.as_ref()
            .is_some_and(|(s, b)| *s == 503 && b.contains("schema registry"))
    };
    let late_side: Vec<_> = side_readyz.iter().filter(|(t, _, _)| *t >= 8).collect();
    assert!(
        !late_side.is_empty()
            && late_side
                .iter()
                .all(|(_, s, b)| registry_down(s) && registry_down(b)),
        "side relays' /readyz during the cut: {side_readyz:?}\n{}\n{}",
        subj_relay.log(),
        bin_relay.log()
    );
    wait_for(
        "the side relays' rows in Kafka",
        Duration::from_secs(60),
        || broker().record_count(&subj_topic) >= 11 && broker().record_count(&bin_topic) >= 11,
    );
    let events = broker().consume_all(
        &subj_topic,
        broker().record_count(&subj_topic),
        Duration::from_secs(60),
    );
    let (by_row, _) = decode_all(reg.url(), &subj_topic, &events, true);
    let mut expected: Vec<(u64, u64)> = (0..10).map(|i| (50, i)).collect();
    expected.push((51, 0));
    let mut keys: Vec<_> = by_row.keys().copied().collect();
    keys.sort_unstable();
    assert_eq!(keys, expected, "0 lost\n{}", subj_relay.log());
    for (k, (id, v)) in &by_row {
        let want = if k.0 == 51 { shipped_id } else { placed_id };
        assert_eq!(*id, want as u64, "{k:?}");
        assert_eq!(
            v["channel"],
            if k.0 == 51 {
                json!("depot")
            } else {
                Value::Null
            }
        );
    }
    let framed = broker().consume_all(
        &bin_topic,
        broker().record_count(&bin_topic),
        Duration::from_secs(60),
    );
    let sent: HashSet<&[u8]> = framed.iter().map(|r| r.value.as_deref().unwrap()).collect();
    let written: HashSet<&[u8]> = known_frames
        .iter()
        .chain(&new_frame)
        .map(|f| &f[..])
        .collect();
    assert_eq!(
        sent,
        written,
        "0 lost, bytes unchanged\n{}",
        bin_relay.log()
    );
    for (name, port, relay) in [
        ("subjects", subj_port, &subj_relay),
        ("framed", bin_port, &bin_relay),
    ] {
        let reconnects =
            Scrape::take(port).value("outboxd_reconnects_total", "cause=\"schema_registry\"");
        assert!(
            reconnects >= 1.0 && !relay.exited(),
            "{name}: {reconnects}\n{}",
            relay.log()
        );
    }
    eprintln!(
        "outage: {total} rows, {} records ({dups} repeated after {reconnects} reconnects), \
         /readyz during the cut: {} of {} samples 503 naming the registry",
        got.len(),
        not_ready.len(),
        readyz.len()
    );
}
