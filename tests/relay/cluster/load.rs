//! The load and the eyes of the cluster tests: writers committing 1-row
//! transactions at a steady rate, each event's commit time noted, and one
//! long-lived `read_committed` consumer that notes when it first saw each
//! event.

use std::collections::HashMap;
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
    writers: Vec<JoinHandle<Vec<Committed>>>,
    pub(super) started: Instant,
}

impl Load {
    pub(super) fn start(pg: &PgCluster, prefix: &str, writers: usize, rate: f64) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let url = pg.url("postgres", Some("postgres"), "app");
        let aggs = aggregates(40);
        let every = Duration::from_secs_f64(writers as f64 / rate);
        let writers = (0..writers)
            .map(|_| {
                let (stop, url, aggs, prefix) =
                    (stop.clone(), url.clone(), aggs.clone(), prefix.to_owned());
                tokio::spawn(async move {
                    let (mut client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                        .await
                        .unwrap();
                    tokio::spawn(conn);
                    let mut out = Vec::new();
                    let mut next = Instant::now();
                    while !stop.load(Ordering::Relaxed) {
                        for sent in write(&mut client, &prefix, &aggs, 1, &[1], 0).await {
                            out.push(Committed {
                                sent,
                                at_ms: now_ms(),
                            });
                        }
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
                    out
                })
            })
            .collect();
        Load {
            stop,
            writers,
            started: Instant::now(),
        }
    }

    /// Sleeps until `at` after the start.
    pub(super) async fn until(&self, at: Duration) {
        tokio::time::sleep(at.saturating_sub(self.started.elapsed())).await;
    }

    pub(super) fn writing(&self) -> usize {
        self.writers.iter().filter(|w| !w.is_finished()).count()
    }

    pub(super) async fn finish(self) -> Vec<Committed> {
        self.stop.store(true, Ordering::Relaxed);
        let mut out = Vec::new();
        for w in self.writers {
            out.extend(w.await.unwrap());
        }
        out
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

/// One `read_committed` consumer assigned to `topics` from their start for
/// the whole test, on its own thread.
pub(super) struct Watch {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<Seen>>>,
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
            .create()
            .expect("kafka consumer");
        let mut tpl = TopicPartitionList::new();
        for topic in topics {
            let md = consumer
                .fetch_metadata(Some(topic), Duration::from_secs(10))
                .expect("metadata of a test topic");
            for p in md.topics()[0].partitions() {
                tpl.add_partition_offset(topic, p.id(), Offset::Beginning)
                    .unwrap();
            }
        }
        consumer.assign(&tpl).expect("assign");
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Vec::new()));
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
                        seen.lock().unwrap().push(Seen {
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
            let seen = self.seen.lock().unwrap().clone();
            let ids: std::collections::HashSet<&str> = seen.iter().map(|s| s.id.as_str()).collect();
            if want.iter().all(|c| ids.contains(c.sent.id.as_str())) || Instant::now() > deadline {
                return seen;
            }
            drop(ids);
            std::thread::sleep(Duration::from_millis(200));
        }
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

/// What a run measured and found.
#[derive(Debug)]
pub(super) struct Figures {
    pub(super) committed: usize,
    pub(super) delivered: usize,
    pub(super) lost: usize,
    pub(super) duplicates: usize,
    pub(super) out_of_order: Vec<String>,
    /// The longest time between two consecutive broker appends (all
    /// partitions together) while the writers wrote.
    pub(super) append_gap: Duration,
    /// The longest time the consumer went without a new event while the
    /// writers wrote.
    pub(super) seen_gap: Duration,
    /// The longest commit → first `read_committed` sight of one event.
    pub(super) max_delay: Duration,
    pub(super) rate: f64,
}

/// Compares what was committed with what was seen. Per aggregate, the
/// first sights must follow the sequence (commit) order; Kafka order within
/// a partition is offset order.
pub(super) fn figures(committed: &[Committed], seen: &[Seen], load_ms: (i64, i64)) -> Figures {
    let by_id: HashMap<&str, &Committed> =
        committed.iter().map(|c| (c.sent.id.as_str(), c)).collect();
    let mut sorted: Vec<&Seen> = seen.iter().collect();
    sorted.sort_by_key(|s| (s.topic.clone(), s.partition, s.offset));
    let mut first: HashMap<&str, &Seen> = HashMap::new();
    let mut duplicates = 0;
    let mut per_agg: HashMap<&str, Vec<i64>> = HashMap::new();
    for s in &sorted {
        let c = by_id
            .get(s.id.as_str())
            .unwrap_or_else(|| panic!("event {} on {} was never committed", s.id, s.topic));
        if first.insert(s.id.as_str(), s).is_some() {
            duplicates += 1;
        } else {
            per_agg
                .entry(c.sent.agg.as_str())
                .or_default()
                .push(c.sent.seq);
        }
    }
    let out_of_order = per_agg
        .iter()
        .filter(|(_, seqs)| seqs.windows(2).any(|w| w[0] >= w[1]))
        .map(|(agg, _)| agg.to_string())
        .collect();
    let max_delay = committed
        .iter()
        .filter_map(|c| Some(first.get(c.sent.id.as_str())?.seen_ms - c.at_ms))
        .max()
        .unwrap_or(0);
    let gap = |mut times: Vec<i64>| {
        times.retain(|&t| t >= load_ms.0 && t <= load_ms.1);
        times.push(load_ms.0);
        times.push(load_ms.1);
        times.sort_unstable();
        let longest = times.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0);
        Duration::from_millis(longest.max(0) as u64)
    };
    let span = (load_ms.1 - load_ms.0).max(1) as f64 / 1000.0;
    Figures {
        committed: committed.len(),
        delivered: first.len(),
        lost: committed.len() - first.len(),
        duplicates,
        out_of_order,
        append_gap: gap(seen.iter().map(|s| s.appended_ms).collect()),
        seen_gap: gap(first.values().map(|s| s.seen_ms).collect()),
        max_delay: Duration::from_millis(max_delay.max(0) as u64),
        rate: committed.len() as f64 / span,
    }
}
