//! Events written and read back: a writer that records what it committed
//! ([`write`]), and checks that read everything back from Kafka and say
//! what is missing, repeated or out of order ([`verify`]), quoting the
//! relays' per-event trail.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::harness::kafka::{KafkaBroker, Record};
use crate::harness::pg::PgCluster;
use crate::harness::relay::Env;
use outboxd::relay::EVENTS_TARGET;

/// Every entry of the ledger topic, in append order, with the broker's
/// timestamp (the append time on a `LogAppendTime` topic) in ms.
pub fn ledger_entries(
    broker: &KafkaBroker,
    topic: &str,
) -> Vec<(i64, outboxd::progress::ledger::LedgerEntry)> {
    // To the end: with exactly-once the offsets count commit markers too.
    let records = broker.consume_to_end(topic, Duration::from_secs(30));
    records
        .iter()
        .filter_map(|r| {
            let entry = outboxd::progress::ledger::LedgerEntry::from_json(r.value.as_deref()?)
                .unwrap_or_else(|e| panic!("ledger record at offset {}: {e}", r.offset));
            Some((r.timestamp.expect("ledger record timestamp"), entry))
        })
        .collect()
}

/// What `topics` hold once read to the end, split by who wrote it: per
/// event id, how many copies the relay wrote, and the ids `outboxd
/// backfill` re-sent (flagged by its header, on purpose).
pub struct Copies {
    pub relayed: HashMap<String, usize>,
    pub backfilled: HashSet<String>,
}

impl Copies {
    pub fn read<'a>(broker: &KafkaBroker, topics: impl IntoIterator<Item = &'a str>) -> Copies {
        let mut copies = Copies {
            relayed: HashMap::new(),
            backfilled: HashSet::new(),
        };
        for topic in topics {
            let records = tokio::task::block_in_place(|| {
                broker.consume_to_end(topic, Duration::from_secs(60))
            });
            for r in records {
                let id = String::from_utf8(r.header("id").expect("id header").to_vec()).unwrap();
                if r.header(outboxd::cli::backfill::BACKFILL_HEADER).is_some() {
                    copies.backfilled.insert(id);
                } else {
                    *copies.relayed.entry(id).or_default() += 1;
                }
            }
        }
        copies
    }

    /// Events the relay itself wrote more than once.
    pub fn repeated(&self) -> usize {
        self.relayed.values().filter(|&&n| n > 1).count()
    }
}

/// Milliseconds since the Unix epoch now (the broker runs on this clock).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// One committed event as the writer knows it.
#[derive(Debug, Clone)]
pub struct Sent {
    pub id: String,
    pub kind: &'static str,
    pub agg: String,
    pub seq: i64,
    pub topic: String,
    pub payload: String,
}

/// Writes `n` events for aggregates `aggs` in transactions of the given
/// sizes (cycled), some rolled back (not returned). Per-aggregate sequence
/// numbers come from `agg_seq` in the same transaction, locked in sorted
/// order: for one aggregate, sequence order is commit order.
/// Events are routed to `{topic_prefix}.{payment|order}`.
pub async fn write(
    client: &mut tokio_postgres::Client,
    topic_prefix: &str,
    aggs: &[String],
    n: usize,
    sizes: &[usize],
    rollback_every: usize,
) -> Vec<Sent> {
    let mut committed = Vec::new();
    let mut written = 0;
    let mut txn_no = 0;
    while written < n {
        let size = sizes[txn_no % sizes.len()].min(n - written);
        txn_no += 1;
        let rollback = rollback_every > 0 && txn_no % rollback_every == 0;
        // Pick aggregates for this transaction's rows.
        let picks: Vec<&String> = (0..size)
            .map(|i| &aggs[(txn_no * 31 + i * 7) % aggs.len()])
            .collect();
        let mut by_agg: BTreeMap<&String, usize> = BTreeMap::new();
        for a in &picks {
            *by_agg.entry(a).or_default() += 1;
        }
        let tx = client.transaction().await.unwrap();
        let mut rows = Vec::new();
        for (agg, count) in by_agg {
            let top: i64 = tx
                .query_one(
                    "INSERT INTO agg_seq (agg, n) VALUES ($1, $2) ON CONFLICT (agg) DO UPDATE SET n = agg_seq.n + $2 RETURNING n",
                    &[agg, &(count as i64)],
                )
                .await
                .unwrap()
                .get(0);
            for k in 0..count as i64 {
                let seq = top - count as i64 + 1 + k;
                let kind = if agg.starts_with('p') {
                    "payment"
                } else {
                    "order"
                };
                rows.push(Sent {
                    id: uuid::Uuid::new_v4().to_string(),
                    kind,
                    agg: agg.clone(),
                    seq,
                    topic: format!("{topic_prefix}.{kind}"),
                    payload: format!(
                        "{{\"agg\": \"{agg}\", \"seq\": {seq}, \"note\": \"Привет 🎉\"}}"
                    ),
                });
            }
        }
        let ids: Vec<&str> = rows.iter().map(|r| r.id.as_str()).collect();
        let aggs_: Vec<&str> = rows.iter().map(|r| r.agg.as_str()).collect();
        let types: Vec<&str> = rows.iter().map(|r| r.kind).collect();
        let payloads: Vec<&str> = rows.iter().map(|r| r.payload.as_str()).collect();
        tx.execute(
            "INSERT INTO outbox (id, aggregate_type, aggregate_id, event_type, payload) \
             SELECT i::uuid, t, a, t || '.happened', p::jsonb FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) AS u(i, a, t, p)",
            &[&ids, &aggs_, &types, &payloads],
        )
        .await
        .unwrap();
        if txn_no % 5 == 0 {
            tx.execute("INSERT INTO unpublished (note) VALUES ('noise')", &[])
                .await
                .unwrap();
        }
        if rollback {
            tx.rollback().await.unwrap();
            // The sequence rows rolled back too.
        } else {
            tx.commit().await.unwrap();
            written += size;
            committed.extend(rows);
        }
    }
    committed
}

/// What a read-back found.
#[derive(Debug, Default)]
pub struct Verdict {
    pub delivered: usize,
    pub duplicates: usize,
    /// Ids delivered more than once.
    pub duplicated_ids: HashSet<String>,
    /// Where each id was first read back: (partition, offset).
    pub first_at: HashMap<String, (i32, i64)>,
}

/// Reads every topic of `sent` back and checks: every committed event
/// arrived on its topic with key = aggregate, header id = event id, value
/// bytes = the payload as PostgreSQL printed it; no event that was not
/// committed; per aggregate, first deliveries in commit order.
///
/// `logs` is the directory of the relays' logs (the [`Env`]'s dir): when
/// events are missing, their lines of the per-event trail are quoted.
pub fn verify(
    broker: &KafkaBroker,
    sent: &[Sent],
    payload_text: &HashMap<String, String>,
    timeout: Duration,
    allow_duplicates: bool,
    logs: &Path,
) -> Verdict {
    verify_checking(
        broker,
        sent,
        payload_text,
        timeout,
        allow_duplicates,
        true,
        logs,
    )
}

/// [`verify`] of `env`'s events (their payload text read from its
/// database, its relays' logs quoted), no duplicates allowed; from a test's
/// async body.
pub fn verify_env(env: &Env, sent: &[Sent], timeout: Duration) -> Verdict {
    let texts = payload_texts(&env.pg);
    tokio::task::block_in_place(|| {
        verify(
            crate::harness::kafka::shared(),
            sent,
            &texts,
            timeout,
            false,
            env.dir.path(),
        )
    })
}

/// As [`verify`], without the order check when `check_order` is false: for
/// events that reached Kafka only through `outboxd backfill`, which sends
/// in `ORDER BY created_at, id` order, so two events of one aggregate in
/// one transaction (one `created_at`) go in the order of their random ids.
pub fn verify_checking(
    broker: &KafkaBroker,
    sent: &[Sent],
    payload_text: &HashMap<String, String>,
    timeout: Duration,
    allow_duplicates: bool,
    check_order: bool,
    logs: &Path,
) -> Verdict {
    verify_reading(
        broker,
        sent,
        payload_text,
        timeout,
        allow_duplicates,
        check_order,
        ReadBack::Count,
        logs,
    )
}

/// How [`verify_reading`] knows it read a topic whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadBack {
    /// As many records as the offsets count (at-least-once: no markers).
    Count,
    /// To each partition's end as `read_committed` sees it (exactly-once:
    /// offsets count commit markers and aborted records too).
    ToEnd,
}

/// As [`verify_checking`], reading as `read` says.
#[allow(clippy::too_many_arguments)]
pub fn verify_reading(
    broker: &KafkaBroker,
    sent: &[Sent],
    payload_text: &HashMap<String, String>,
    timeout: Duration,
    allow_duplicates: bool,
    check_order: bool,
    read: ReadBack,
    logs: &Path,
) -> Verdict {
    let by_id: HashMap<&str, &Sent> = sent.iter().map(|s| (s.id.as_str(), s)).collect();
    let topics: HashSet<&str> = sent.iter().map(|s| s.topic.as_str()).collect();
    let mut verdict = Verdict::default();
    let mut first_seen: HashSet<String> = HashSet::new();
    let mut per_agg: HashMap<String, Vec<i64>> = HashMap::new();
    let deadline = Instant::now() + timeout;
    for topic in topics {
        let want = sent.iter().filter(|s| s.topic == topic).count();
        // Read everything the topic holds, until every expected id is there
        // (duplicates make the topic longer than `want`): one reader that
        // goes on where it stopped, not the whole topic again each look.
        let mut reader = broker.topic_reader(topic, Duration::from_secs(60));
        let mut records: Vec<Record>;
        loop {
            records = match read {
                ReadBack::Count => {
                    let count = broker.record_count(topic).max(want);
                    reader.at_least(count, Duration::from_secs(60)).to_vec()
                }
                ReadBack::ToEnd => reader.read_to_end(Duration::from_secs(60)).to_vec(),
            };
            let ids: HashSet<&[u8]> = records.iter().filter_map(|r| r.header("id")).collect();
            if ids.len() >= want || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        // Kafka order within a partition; one aggregate lives in one partition.
        records.sort_by_key(|r| (r.partition, r.offset));
        for r in &records {
            let id = std::str::from_utf8(r.header("id").expect("id header"))
                .unwrap()
                .to_string();
            let s = by_id
                .get(id.as_str())
                .unwrap_or_else(|| panic!("event {id} on {topic} was never committed"));
            assert_eq!(s.topic, topic, "event {id} on the wrong topic");
            assert_eq!(r.key_str(), Some(s.agg.as_str()), "key of {id}");
            let expected_value = payload_text
                .get(&s.id)
                .map(String::as_str)
                .unwrap_or(&s.payload);
            assert_eq!(r.value_str(), Some(expected_value), "value bytes of {id}");
            assert_eq!(
                r.header("eventType")
                    .map(|h| std::str::from_utf8(h).unwrap().to_string()),
                Some(format!("{}.happened", s.kind))
            );
            if first_seen.insert(id.clone()) {
                per_agg.entry(s.agg.clone()).or_default().push(s.seq);
                verdict.first_at.insert(id.clone(), (r.partition, r.offset));
                verdict.delivered += 1;
            } else {
                verdict.duplicates += 1;
                verdict.duplicated_ids.insert(id.clone());
            }
        }
    }
    let missing: Vec<&Sent> = sent
        .iter()
        .filter(|s| !first_seen.contains(&s.id))
        .collect();
    if !missing.is_empty() {
        // Holes (loss) and tails (not delivered yet) need different fixes.
        let mut max_seen: HashMap<&str, i64> = HashMap::new();
        for (agg, seqs) in &per_agg {
            max_seen.insert(agg.as_str(), seqs.iter().copied().max().unwrap_or(0));
        }
        let holes = missing
            .iter()
            .filter(|m| max_seen.get(m.agg.as_str()).is_some_and(|&top| m.seq < top))
            .count();
        let example: Vec<(&str, i64)> = missing
            .iter()
            .take(5)
            .map(|m| (m.agg.as_str(), m.seq))
            .collect();
        // Where the log and what we read disagree, per partition.
        let topics: HashSet<&str> = missing.iter().map(|m| m.topic.as_str()).collect();
        let mut layout = String::new();
        for &topic in &topics {
            let records =
                broker.consume_all(topic, broker.record_count(topic), Duration::from_secs(20));
            layout.push_str(&format!(
                "\n{topic}: (partition, log start, high watermark) {:?}",
                broker.watermarks(topic)
            ));
            let mut per_partition: BTreeMap<i32, (usize, i64, i64)> = Default::default();
            for r in &records {
                let e = per_partition
                    .entry(r.partition)
                    .or_insert((0, i64::MAX, -1));
                e.0 += 1;
                e.1 = e.1.min(r.offset);
                e.2 = e.2.max(r.offset);
            }
            layout.push_str(&format!(
                "\n{topic}: watermark total {}, read {} as (partition: count, first offset, last offset) {per_partition:?}",
                broker.record_count(topic),
                records.len()
            ));
        }
        let ids: Vec<&str> = missing.iter().take(10).map(|m| m.id.as_str()).collect();
        let trail = event_trail(logs, &ids);
        // What the broker had to say about those topics, or about itself
        // (a fenced broker gives up its partitions for a while).
        let broker_log = broker.log_lines(
            |l| {
                l.contains(" WARN ")
                    || l.contains(" ERROR ")
                    || l.contains("fenc")
                    || topics.iter().any(|t| l.contains(t))
            },
            80,
        );
        panic!(
            "{} of {} committed events missing from Kafka ({holes} are holes below a delivered sequence number), e.g. {example:?}{layout}\nrelay trail of the first missing ids {ids:?}:\n{trail}\nbroker log (warnings, fencing, those topics; last 80 lines):\n{broker_log}",
            missing.len(),
            sent.len()
        );
    }
    for (agg, seqs) in per_agg.iter().filter(|_| check_order) {
        let expected: Vec<i64> = (1..=seqs.len() as i64).collect();
        assert_eq!(
            seqs, &expected,
            "aggregate {agg}: Kafka order differs from commit order"
        );
    }
    if !allow_duplicates && verdict.duplicates > 0 {
        // Which events came twice and what the relays said about them: a
        // repeat from a takeover or a restart reads differently from one
        // librdkafka sent twice.
        let mut ids: Vec<&str> = verdict.duplicated_ids.iter().map(String::as_str).collect();
        ids.sort_by_key(|id| verdict.first_at.get(*id).copied());
        ids.truncate(5);
        let first_at: Vec<(i32, i64)> = ids
            .iter()
            .filter_map(|id| verdict.first_at.get(*id).copied())
            .collect();
        let trail = event_trail(logs, &ids);
        panic!(
            "duplicates where none are allowed: {} records repeat {} of {} events; the first repeated ids {ids:?}, first read at (partition, offset) {first_at:?}\nrelay trail:\n{trail}",
            verdict.duplicates,
            verdict.duplicated_ids.len(),
            verdict.delivered
        );
    }
    verdict
}

/// The lines of the relays' per-event trail (every `relay-*.log` in `dir`)
/// that mention one of `ids`: whether each was sent and acked, and where.
pub fn event_trail(dir: &Path, ids: &[&str]) -> String {
    let mut out = String::new();
    for (name, text) in relay_logs(dir) {
        let mut mentioned = false;
        for line in text.lines() {
            if ids.iter().any(|id| line.contains(id)) {
                out.push_str(&format!("{name}: {line}\n"));
                mentioned = true;
            }
        }
        if !mentioned {
            out.push_str(&format!("{name}: (no line mentions them)\n"));
        }
        // And what that relay said otherwise (reconnects, errors), recent first.
        // (Not one line per Kafka transaction either: under load they
        // would push the session's own story out.)
        let rest: Vec<&str> = text
            .lines()
            .filter(|l| !l.contains(EVENTS_TARGET) && !l.contains("Kafka transaction committed"))
            .collect();
        out.push_str(&format!("{name}, last lines without the trail:\n"));
        for line in &rest[rest.len().saturating_sub(40)..] {
            out.push_str(&format!("  {line}\n"));
        }
    }
    if out.is_empty() {
        out.push_str("(no relay log)\n");
    }
    out
}

/// (file name, text) of every relay log (`relay-*.log`) in `dir`.
fn relay_logs(dir: &Path) -> Vec<(String, String)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().to_string();
            (name.starts_with("relay-") && name.ends_with(".log")).then(|| {
                let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
                (name, text)
            })
        })
        .collect()
}

/// The `acked` lines of the relays' per-event trail (every `relay-*.log`
/// in `dir`): event id → every (partition, offset) Kafka reported for it.
pub fn acked_positions(dir: &Path) -> HashMap<String, Vec<(i32, i64)>> {
    let mut out: HashMap<String, Vec<(i32, i64)>> = HashMap::new();
    for (_, text) in relay_logs(dir) {
        for line in text.lines() {
            if !(line.contains(EVENTS_TARGET) && line.contains(" acked ")) {
                continue;
            }
            let field = |name: &str| {
                line.split_whitespace()
                    .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
                    .unwrap_or_else(|| panic!("no {name} in trail line {line:?}"))
            };
            out.entry(field("event_id").to_string()).or_default().push((
                field("partition").parse().unwrap(),
                field("offset").parse().unwrap(),
            ));
        }
    }
    out
}

/// PostgreSQL's text for each payload (jsonb normalises spacing), by id.
pub fn payload_texts(pg: &PgCluster) -> HashMap<String, String> {
    payload_texts_in(pg, "app")
}

/// [`payload_texts`] of database `db`.
pub fn payload_texts_in(pg: &PgCluster, db: &str) -> HashMap<String, String> {
    // The rows are kept in the table (no delete) so their text can be read.
    pg.psql(db, "SELECT id || E'\\t' || payload::text FROM outbox")
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(id, p)| (id.to_string(), p.to_string()))
        .collect()
}

pub fn aggregates(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            if i % 2 == 0 {
                format!("pay-{i}")
            } else {
                format!("ord-{i}")
            }
        })
        .collect()
}
