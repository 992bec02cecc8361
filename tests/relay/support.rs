//! Shared setup for the relay suite: a cluster, a broker, a writer that
//! records what it committed, `outboxd run` as a child process, and checks
//! that read everything back from Kafka.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::kafka::{KafkaBroker, Record};
use crate::harness::outboxd::bin;
use crate::harness::pg::{PgCluster, PgOptions};
use outboxd::relay::EVENTS_TARGET;

pub struct Env {
    pub pg: PgCluster,
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
}

/// A cluster with the migrations and a per-aggregate sequence table, and a
/// config pointing `outboxd run` at it and at `brokers`.
pub fn env(brokers: &str, slot: &str, extra: &str) -> Env {
    let pg = PgCluster::start(PgOptions::default());
    pg.create_database("app");
    pg.apply_migrations("app");
    pg.psql("app", "CREATE TABLE agg_seq (agg text PRIMARY KEY, n bigint NOT NULL DEFAULT 0); CREATE TABLE unpublished (id serial, note text)");
    pg.psql(
        "app",
        &format!("SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')"),
    );
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "{}?sslmode=disable",
        pg.url("postgres", Some("postgres"), "app")
    );
    let config = dir.path().join("outboxd.toml");
    // Each test routes to topics of its own on the shared broker.
    let routing = if extra.contains("[routing]") {
        String::new()
    } else {
        format!("[routing]\ntopic = \"{slot}.${{aggregate_type}}\"\n")
    };
    let text = format!(
        "[postgres]\nurl = \"{url}\"\nslot = \"{slot}\"\nstatus_interval = \"200ms\"\n\
         [kafka]\nbrokers = \"{brokers}\"\ntopic_partitions = 3\n{routing}{extra}\n"
    );
    std::fs::write(&config, text).unwrap();
    Env { pg, dir, config }
}

/// Replaces `from` (which must be there) with `to` in `env`'s config file,
/// e.g. another `status_interval` or a `ledger_topic` under `[kafka]`.
pub fn edit_config(env: &Env, from: &str, to: &str) {
    let text = std::fs::read_to_string(&env.config).unwrap();
    assert!(text.contains(from), "{from:?} not in the config:\n{text}");
    std::fs::write(&env.config, text.replacen(from, to, 1)).unwrap();
}

/// Makes the relay of `env` keep its position ledger in `topic` (one per
/// test, so a test reads back only its own entries).
pub fn use_ledger_topic(env: &Env, topic: &str) {
    edit_config(
        env,
        "topic_partitions = 3\n",
        &format!("topic_partitions = 3\nledger_topic = \"{topic}\"\n"),
    );
}

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

/// `outboxd run` as a child process; killed on drop.
pub struct Relay {
    pub child: Child,
    pub log: PathBuf,
}

impl Relay {
    pub fn start(env: &Env) -> Relay {
        Relay::start_with_env(env, &[])
    }

    /// Like [`start`](Self::start), with extra environment variables (for
    /// `${VAR}` references and `password_env` in the config).
    pub fn start_with_env(env: &Env, vars: &[(&str, &str)]) -> Relay {
        Relay::start_with(env, vars, &[])
    }

    /// Like [`start_with_env`](Self::start_with_env), with extra arguments
    /// to `outboxd run` (e.g. `--accept-gap`).
    pub fn start_with(env: &Env, vars: &[(&str, &str)], args: &[&str]) -> Relay {
        let log = env
            .dir
            .path()
            .join(format!("relay-{}.log", uuid::Uuid::new_v4()));
        let child = Command::new(bin())
            .args(["run", "--config"])
            .arg(&env.config)
            .args(args)
            // The per-event trail lets a failed read-back say whether the
            // relay sent a missing event and where Kafka said it put it.
            .env("OUTBOXD_LOG", "info,outboxd=debug,outboxd::events=trace")
            .envs(vars.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn outboxd run");
        crate::harness::watchdog::watch(
            crate::harness::watchdog::Target::Pid(child.id()),
            "KILL",
            None,
        );
        Relay { child, log }
    }

    /// The process's peak resident memory so far (VmHWM), in KiB; 0 once
    /// it is gone.
    pub fn peak_rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    /// Whether the process has ended (a zombie until it is waited for).
    pub fn exited(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))
            .ok()
            .and_then(|stat| {
                // The state follows the command name, which is in brackets.
                let (_, rest) = stat.rsplit_once(") ")?;
                rest.chars().next()
            })
            .map_or(true, |state| matches!(state, 'Z' | 'X'))
    }

    /// How long ago the relay last wrote to its log (per-event trail
    /// included): a stuck relay is told apart from a slow one.
    pub fn silent_for(&self) -> Duration {
        std::fs::metadata(&self.log)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .unwrap_or_default()
    }

    /// The relay's log without the per-event trail (see [`event_trail`]).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| !l.contains(EVENTS_TARGET))
            .fold(String::new(), |mut out, l| {
                out.push_str(l);
                out.push('\n');
                out
            })
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig}");
    }

    /// Waits for exit up to `timeout`; None if still running.
    pub fn wait(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        crate::harness::outboxd::wait_with_timeout_keep(&mut self.child, timeout)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
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
        // (duplicates make the topic longer than `want`).
        let mut records: Vec<Record>;
        loop {
            records = match read {
                ReadBack::Count => {
                    let count = broker.record_count(topic).max(want);
                    broker.consume_all(topic, count, Duration::from_secs(60))
                }
                ReadBack::ToEnd => broker.consume_to_end(topic, Duration::from_secs(60)),
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
            let mut per_partition: std::collections::BTreeMap<i32, (usize, i64, i64)> =
                Default::default();
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
        let broker_log: Vec<String> = broker
            .log()
            .lines()
            .filter(|l| {
                l.contains(" WARN ")
                    || l.contains(" ERROR ")
                    || l.contains("fenc")
                    || topics.iter().any(|t| l.contains(t))
            })
            .map(str::to_owned)
            .collect();
        let broker_log = broker_log[broker_log.len().saturating_sub(80)..].join("\n");
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

/// The commit time a relay's gap error names in `outboxd backfill --since`.
pub fn named_since(log: &str) -> String {
    log.split("--since '")
        .nth(1)
        .and_then(|rest| rest.split('\'').next())
        .unwrap_or_else(|| panic!("no --since time in:\n{log}"))
        .to_owned()
}

/// Runs `outboxd backfill --since` from 10 s before `since` (for
/// transactions open at that moment), as the gap error advises; panics
/// unless it succeeds.
pub fn backfill_from(pg: &PgCluster, config: &Path, since: &str) -> std::process::Output {
    let earlier = pg.psql(
        "app",
        &format!("SELECT (timestamptz '{since}' - interval '10 seconds')::text"),
    );
    let out = Command::new(bin())
        .args(["backfill", "--config"])
        .arg(config)
        .args(["--since", earlier.trim()])
        .env("OUTBOXD_LOG", "info")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "backfill failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// PostgreSQL's text for each payload (jsonb normalises spacing), by id.
pub fn payload_texts(pg: &PgCluster) -> HashMap<String, String> {
    // The rows are kept in the table (no delete) so their text can be read.
    pg.psql("app", "SELECT id || E'\\t' || payload::text FROM outbox")
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .map(|(id, p)| (id.to_string(), p.to_string()))
        .collect()
}

/// Starts a relay, commits `n` events, and stops it with SIGTERM (exit 0)
/// once the slot is confirmed to the end: the ledger holds them all.
pub async fn relayed_then_stopped(
    e: &Env,
    client: &mut tokio_postgres::Client,
    slot: &str,
    aggs: &[String],
    n: usize,
) -> Vec<Sent> {
    let mut relay = Relay::start(e);
    let sent = write(client, slot, aggs, n, &[1, 10], 0).await;
    let end = lsn_now(&e.pg);
    tokio::task::block_in_place(|| {
        wait_for(
            "the slot confirmed to the end",
            Duration::from_secs(120),
            || confirmed_lsn(&e.pg, slot) >= end,
        );
        relay.signal("-TERM");
        assert!(
            relay
                .wait(Duration::from_secs(30))
                .is_some_and(|s| s.success()),
            "{}",
            relay.log()
        );
    });
    sent
}

/// The server's current WAL position.
pub fn lsn_now(pg: &PgCluster) -> outboxd::Lsn {
    pg.psql("app", "SELECT pg_current_wal_lsn()")
        .trim()
        .parse()
        .unwrap()
}

pub fn confirmed_lsn(pg: &PgCluster, slot: &str) -> outboxd::Lsn {
    pg.psql(
        "app",
        &format!("SELECT confirmed_flush_lsn FROM pg_replication_slots WHERE slot_name = '{slot}'"),
    )
    .trim()
    .parse()
    .unwrap()
}

/// A walsender streams the slot (a relay or `outboxd tail` holds it).
pub fn slot_active(pg: &PgCluster, slot: &str) -> bool {
    pg.psql(
        "app",
        &format!("SELECT active FROM pg_replication_slots WHERE slot_name = '{slot}'"),
    )
    .trim()
        == "t"
}

pub fn wait_for(what: &str, timeout: Duration, cond: impl FnMut() -> bool) {
    wait_for_or(what, timeout, cond, String::new)
}

/// As [`wait_for`], the failure message ending with `context()`: what the
/// system showed when the wait ran out.
pub fn wait_for_or(
    what: &str,
    timeout: Duration,
    mut cond: impl FnMut() -> bool,
    context: impl FnOnce() -> String,
) {
    let start = Instant::now();
    while !cond() {
        if start.elapsed() >= timeout {
            let context = context();
            if context.is_empty() {
                panic!("timed out after {timeout:?} waiting for {what}");
            }
            // Said again after a long context, whose end is what CI shows.
            panic!("timed out after {timeout:?} waiting for {what}\n{context}\n^ timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The last `n` lines of `text`, for failure messages.
pub fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
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

/// SIGKILLs the postmaster, waits until its backends are gone (they notice
/// the postmaster's death and exit; the shared memory must be free before
/// the next start), starts the server again (crash recovery).
pub fn kill_postmaster(pg: &PgCluster) {
    let pid = std::fs::read_to_string(pg.data_dir().join("postmaster.pid")).unwrap();
    let pid = pid.lines().next().unwrap().trim().to_owned();
    let children = std::process::Command::new("pgrep")
        .args(["-P", &pid])
        .output()
        .unwrap();
    let children: Vec<String> = String::from_utf8_lossy(&children.stdout)
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    let killed = std::process::Command::new("kill")
        .args(["-9", &pid])
        .status()
        .unwrap();
    assert!(killed.success(), "kill -9 {pid}");
    wait_for("the backends to exit", Duration::from_secs(30), || {
        std::iter::once(&pid).chain(&children).all(|p| {
            !std::process::Command::new("kill")
                .args(["-0", p])
                .stderr(std::process::Stdio::null())
                .status()
                .unwrap()
                .success()
        })
    });
    pg.start_again();
}
