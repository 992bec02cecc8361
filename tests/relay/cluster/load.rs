//! The load and the eyes of the cluster tests: writers committing 1-row
//! transactions at a steady rate, each event's commit time noted, and one
//! long-lived `read_committed` consumer that notes when it first saw each
//! event.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};
use tokio::task::JoinHandle;

use crate::harness::events::{aggregates, now_ms, write, Sent};
use crate::harness::pg::PgCluster;

/// A committed event and when its commit returned (ms since the epoch: at
/// most a round trip after the commit itself).
pub(super) struct Committed {
    pub(super) sent: Sent,
    pub(super) at_ms: i64,
}

/// `writers` connections, together about `rate` events a second, each in
/// its own transaction, until [`Load::finish`].
pub(super) struct Load {
    stop: Arc<AtomicBool>,
    writers: Vec<JoinHandle<()>>,
    /// Every event committed so far, as the writers go.
    committed: Arc<Mutex<Vec<Committed>>>,
}

impl Load {
    pub(super) fn start(pg: &PgCluster, prefix: &str, writers: usize, rate: f64) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let committed = Arc::new(Mutex::new(Vec::new()));
        let url = pg.url("postgres", Some("postgres"), "app");
        let aggs = aggregates(40);
        let every = Duration::from_secs_f64(writers as f64 / rate);
        let writers = (0..writers)
            .map(|_| {
                let (stop, url, aggs, prefix, out) = (
                    stop.clone(),
                    url.clone(),
                    aggs.clone(),
                    prefix.to_owned(),
                    committed.clone(),
                );
                tokio::spawn(async move {
                    let (mut client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                        .await
                        .unwrap();
                    tokio::spawn(conn);
                    let mut next = Instant::now();
                    while !stop.load(Ordering::Relaxed) {
                        let sent = write(&mut client, &prefix, &aggs, 1, &[1], 0).await;
                        let at_ms = now_ms();
                        out.lock()
                            .unwrap()
                            .extend(sent.into_iter().map(|sent| Committed { sent, at_ms }));
                        next += every;
                        let now = Instant::now();
                        if next > now {
                            tokio::time::sleep(next - now).await;
                        } else if now - next > Duration::from_secs(1) {
                            // Behind by more than a second: do not burst
                            // to catch up, the rate is what it could be.
                            next = now;
                        }
                    }
                })
            })
            .collect();
        Load {
            stop,
            writers,
            committed,
        }
    }

    /// How many events whose commit returned by `at_ms` `watch` has not
    /// seen yet.
    pub(super) fn unseen_by(&self, watch: &Watch, at_ms: i64) -> usize {
        let committed = self.committed.lock().unwrap();
        let seen = watch.seen.lock().unwrap();
        committed
            .iter()
            .filter(|c| c.at_ms <= at_ms && !seen.ids.contains(&c.sent.id))
            .count()
    }

    pub(super) fn writing(&self) -> usize {
        self.writers.iter().filter(|w| !w.is_finished()).count()
    }

    pub(super) async fn finish(self) -> Vec<Committed> {
        self.stop.store(true, Ordering::Relaxed);
        for w in self.writers {
            w.await.unwrap();
        }
        std::mem::take(&mut *self.committed.lock().unwrap())
    }
}

/// One record as the live consumer saw it.
#[derive(Debug, Clone)]
pub(super) struct Seen {
    pub(super) id: String,
    pub(super) partition: i32,
    pub(super) offset: i64,
    pub(super) topic: String,
    /// When the consumer got it (ms since the epoch).
    pub(super) seen_ms: i64,
    /// The broker's append time (the topics are `LogAppendTime`).
    pub(super) appended_ms: i64,
}

#[derive(Default)]
struct Sightings {
    all: Vec<Seen>,
    ids: HashSet<String>,
}

/// One `read_committed` consumer assigned to `topics` from their start for
/// the whole test, on its own thread.
pub(super) struct Watch {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Sightings>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watch {
    pub(super) fn start(bootstrap: &str, topics: &[String]) -> Watch {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set(
                "group.id",
                format!("cluster-watch-{}", uuid::Uuid::new_v4()),
            )
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .set("fetch.wait.max.ms", "50")
            // A leader cut off answers nothing: with librdkafka's 60 s
            // default the watch would wait that long for its own fetch
            // before it asked who leads now, and charge the relay with it.
            .set("socket.timeout.ms", "5000")
            .create()
            .expect("kafka consumer");
        let mut tpl = TopicPartitionList::new();
        for topic in topics {
            for p in partitions(&consumer, topic) {
                tpl.add_partition_offset(topic, p, Offset::Beginning)
                    .unwrap();
            }
        }
        consumer.assign(&tpl).expect("assign");
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Sightings::default()));
        let thread = {
            let (stop, seen) = (stop.clone(), seen.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    // Brokers going away and coming back: it goes on.
                    if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
                        let id = m
                            .headers()
                            .and_then(|hs| hs.iter().find(|h| h.key == "id")?.value)
                            .map(|v| String::from_utf8_lossy(v).into_owned())
                            .expect("id header");
                        let mut seen = seen.lock().unwrap();
                        seen.ids.insert(id.clone());
                        seen.all.push(Seen {
                            id,
                            partition: m.partition(),
                            offset: m.offset(),
                            topic: m.topic().to_owned(),
                            seen_ms: now_ms(),
                            appended_ms: m.timestamp().to_millis().unwrap_or(0),
                        });
                    }
                }
            })
        };
        Watch {
            stop,
            seen,
            thread: Some(thread),
        }
    }

    /// Waits until every id of `want` was seen, or `timeout`; what was seen.
    pub(super) fn wait_for(&self, want: &[Committed], timeout: Duration) -> Vec<Seen> {
        let deadline = Instant::now() + timeout;
        loop {
            {
                let seen = self.seen.lock().unwrap();
                if want.iter().all(|c| seen.ids.contains(&c.sent.id)) || Instant::now() > deadline {
                    return seen.all.clone();
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// The partitions of `topic`, once the broker that answers knows them: an
/// answer without them (a broker that has not applied the topic yet) is
/// asked again, never taken for a topic without partitions; a watch
/// assigned to none would count every event lost.
fn partitions(consumer: &BaseConsumer, topic: &str) -> Vec<i32> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = consumer.fetch_metadata(Some(topic), Duration::from_secs(10));
        let known = answer.as_ref().ok().and_then(|md| {
            let t = md.topics().iter().find(|t| t.name() == topic)?;
            let ps: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
            (t.error().is_none() && !ps.is_empty()).then_some(ps)
        });
        if let Some(ps) = known {
            return ps;
        }
        assert!(
            Instant::now() < deadline,
            "no partitions of {topic} in the metadata after 30 s: {:?}",
            answer.map(|md| md
                .topics()
                .iter()
                .map(|t| (t.name().to_owned(), t.error()))
                .collect::<Vec<_>>())
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What one mode showed over one phase of the run (a fault and its
/// aftermath): the events committed in it and how they fared.
#[derive(Debug)]
pub(super) struct Figures {
    pub(super) committed: usize,
    pub(super) delivered: usize,
    pub(super) lost: usize,
    /// Records beyond the first of an event committed in the phase.
    pub(super) duplicates: usize,
    /// The longest time between two consecutive broker appends (all
    /// partitions together) within the phase.
    pub(super) append_gap: Duration,
    /// The longest time the consumer went without a new event within the
    /// phase.
    pub(super) seen_gap: Duration,
    /// The longest commit → first `read_committed` sight of one event
    /// committed in the phase.
    pub(super) max_delay: Duration,
    pub(super) rate: f64,
}

/// The first sight of each event (in offset order) and how many records
/// repeat it.
pub(super) struct Sighted<'a> {
    first: HashMap<&'a str, &'a Seen>,
    repeats: HashMap<&'a str, usize>,
}

pub(super) fn sighted(seen: &[Seen]) -> Sighted<'_> {
    let mut sorted: Vec<&Seen> = seen.iter().collect();
    sorted.sort_by_key(|s| (&s.topic, s.partition, s.offset));
    let mut first: HashMap<&str, &Seen> = HashMap::new();
    let mut repeats: HashMap<&str, usize> = HashMap::new();
    for s in sorted {
        if first.contains_key(s.id.as_str()) {
            *repeats.entry(s.id.as_str()).or_default() += 1;
        } else {
            first.insert(s.id.as_str(), s);
        }
    }
    Sighted { first, repeats }
}

/// Which record of an event stands for it when order is judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OrderBy {
    /// Its first record: the order a consumer reading along sees.
    FirstCopy,
    /// Its last record: the order a consumer sees that lets a repeat
    /// overwrite what it kept of an event.
    LastCopy,
}

/// Aggregates whose events, each taken by the copy `by` names, are out of their
/// commit order (Kafka order within a partition is offset order; one
/// aggregate lives in one partition), over the whole run; panics on a
/// record nobody committed.
pub(super) fn out_of_order(committed: &[Committed], seen: &[Seen], by: OrderBy) -> Vec<String> {
    let by_id: HashMap<&str, &Committed> =
        committed.iter().map(|c| (c.sent.id.as_str(), c)).collect();
    let mut sorted: Vec<&Seen> = seen.iter().collect();
    sorted.sort_by_key(|s| (&s.topic, s.partition, s.offset));
    // In offset order: the first record of an id is its first insert, the
    // last is its last overwrite.
    let mut stands: HashMap<&str, (usize, &Committed)> = HashMap::new();
    for (at, s) in sorted.iter().enumerate() {
        let c = by_id
            .get(s.id.as_str())
            .unwrap_or_else(|| panic!("event {} on {} was never committed", s.id, s.topic));
        match by {
            OrderBy::FirstCopy => {
                stands.entry(s.id.as_str()).or_insert((at, c));
            }
            OrderBy::LastCopy => {
                stands.insert(s.id.as_str(), (at, c));
            }
        }
    }
    let mut per_agg: HashMap<&str, Vec<(usize, i64)>> = HashMap::new();
    for (at, c) in stands.into_values() {
        per_agg
            .entry(c.sent.agg.as_str())
            .or_default()
            .push((at, c.sent.seq));
    }
    per_agg
        .into_iter()
        .filter_map(|(agg, mut events)| {
            events.sort_unstable();
            events
                .windows(2)
                .any(|w| w[0].1 >= w[1].1)
                .then(|| agg.to_string())
        })
        .collect()
}

/// The figures of the events committed within `window` (ms since the
/// epoch, both ends in), and of the gaps within it.
pub(super) fn figures(
    committed: &[Committed],
    seen: &[Seen],
    sighted: &Sighted<'_>,
    window: (i64, i64),
) -> Figures {
    let inside = |t: i64| t >= window.0 && t <= window.1;
    let mine: Vec<&Committed> = committed.iter().filter(|c| inside(c.at_ms)).collect();
    let firsts: Vec<&Seen> = mine
        .iter()
        .filter_map(|c| sighted.first.get(c.sent.id.as_str()).copied())
        .collect();
    let duplicates = mine
        .iter()
        .filter_map(|c| sighted.repeats.get(c.sent.id.as_str()))
        .sum();
    let max_delay = mine
        .iter()
        .filter_map(|c| Some(sighted.first.get(c.sent.id.as_str())?.seen_ms - c.at_ms))
        .max()
        .unwrap_or(0);
    let gap = |mut times: Vec<i64>| {
        times.retain(|&t| inside(t));
        times.push(window.0);
        times.push(window.1);
        times.sort_unstable();
        let longest = times.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
        Duration::from_millis(longest.max(0) as u64)
    };
    let span = (window.1 - window.0).max(1) as f64 / 1000.0;
    Figures {
        committed: mine.len(),
        delivered: firsts.len(),
        lost: mine.len() - firsts.len(),
        duplicates,
        append_gap: gap(seen.iter().map(|s| s.appended_ms).collect()),
        seen_gap: gap(sighted.first.values().map(|s| s.seen_ms).collect()),
        max_delay: Duration::from_millis(max_delay.max(0) as u64),
        rate: mine.len() as f64 / span,
    }
}

/// The order check itself, on records made up for it: a re-sent event's
/// first copy ahead of an earlier event (what a producer that timed a
/// record out and went on with later ones leaves) breaks the order by
/// first copy only; a stale copy after the re-sent run breaks it by last
/// copy only.
#[test]
fn order_by_first_or_last_copy() {
    let committed: Vec<Committed> = (1..=3)
        .map(|seq| Committed {
            sent: Sent {
                id: format!("e{seq}"),
                kind: "k",
                agg: "a".into(),
                seq,
                topic: "t".into(),
                payload: String::new(),
            },
            at_ms: 0,
        })
        .collect();
    let at = |offsets: &[(&str, i64)]| -> Vec<Seen> {
        offsets
            .iter()
            .map(|&(id, offset)| Seen {
                id: id.into(),
                partition: 0,
                offset,
                topic: "t".into(),
                seen_ms: 0,
                appended_ms: 0,
            })
            .collect()
    };
    let check = |seen: &[Seen]| {
        [OrderBy::FirstCopy, OrderBy::LastCopy].map(|by| out_of_order(&committed, seen, by).len())
    };
    let in_order = at(&[("e1", 0), ("e2", 1), ("e3", 2)]);
    assert_eq!(check(&in_order), [0, 0]);
    let overtaken = at(&[("e3", 0), ("e1", 1), ("e2", 2), ("e3", 3)]);
    assert_eq!(check(&overtaken), [1, 0]);
    let stale_last = at(&[("e1", 0), ("e2", 1), ("e3", 2), ("e1", 3)]);
    assert_eq!(check(&stale_last), [0, 1]);
}
