//! The Kafka side: every record of the routed topics from the first offset
//! stamped at or after `--since` (offsets_for_times) to the end of each
//! partition as it was when reading began, `read_committed`, kept as
//! [`RecordEntry`]s.
//!
//! Why to the end and not to `--until`: a record's timestamp is its
//! transaction's commit time, which comes after the row's `created_at`,
//! and a backfilled copy is stamped when the backfill sent it. Records of
//! the range's rows can therefore sit anywhere after `--since`; records of
//! other rows are read too and set aside.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::entries::RecordEntry;
use super::error::AuditError;
use super::progress::ProgressReporter;
use super::spill::Sorter;
use crate::outbox::mapper::ID_HEADER;
use crate::outbox::BACKFILL_HEADER;

const METADATA_TIMEOUT: Duration = Duration::from_secs(30);
/// The audit gives up when no record arrives for this long while partitions
/// are still short of their end.
const STALL_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a partition's next fetch waits while the prefetch queue is
/// full (see [`consumer_config`]).
const FETCH_QUEUE_BACKOFF_MS: &str = "10";

/// The range in epoch milliseconds: `[since, until)`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TimeRange {
    pub since_ms: i64,
    pub until_ms: Option<i64>,
}

impl TimeRange {
    fn contains(&self, ms: i64) -> bool {
        ms >= self.since_ms && !matches!(self.until_ms, Some(u) if ms >= u)
    }
}

/// Counts of the records read, beside the entries.
#[derive(Debug, Default, Clone)]
pub(crate) struct RecordCounts {
    pub read: u64,
    /// Records without an `id` header: not outboxd's, not compared.
    pub without_id: u64,
    /// Topics that do not exist (every row routed there is missing).
    pub absent_topics: Vec<String>,
}

/// The consumer: the connection and security settings of `[kafka]`, no
/// group membership, nothing committed, `read_committed`, and small fetches
/// and prefetch queue (librdkafka's defaults, 50 MB fetches and a 64 MB
/// queue, would be most of the audit's memory). A fetch is decompressed
/// whole into the queue, past its limit: with compressible payloads a 4 MB
/// fetch was most of the audit's peak. With a queue that small it is full
/// whenever a fetch arrives, and librdkafka then postpones the partition's
/// next fetch by `fetch.queue.backoff.ms`, 1 s by default: the reader
/// waited on that, not on Kafka (docs/benchmarks.md, "The audit's memory").
pub(crate) fn consumer_config(mut base: ClientConfig) -> ClientConfig {
    // librdkafka wants a fetch to hold at least one message.max.bytes.
    let fetch = base
        .get("message.max.bytes")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0)
        .max(1 << 20);
    base.set("group.id", "outboxd-audit")
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        .set("isolation.level", "read_committed")
        .set("fetch.max.bytes", fetch.to_string())
        .set("queued.max.messages.kbytes", "4096")
        .set("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS);
    base
}

/// Reads the records of `topics` (their index in the entries is their
/// position) into `sorter`.
pub(crate) fn read(
    config: &ClientConfig,
    topics: &[String],
    range: TimeRange,
    sorter: &mut Sorter<RecordEntry>,
    progress: &impl ProgressReporter,
) -> Result<RecordCounts, AuditError> {
    let kafka = |what: &'static str| {
        move |e: rdkafka::error::KafkaError| AuditError::Kafka {
            what,
            message: e.to_string(),
        }
    };
    let consumer: BaseConsumer = config.create().map_err(kafka("creating the consumer"))?;
    let mut counts = RecordCounts::default();
    let mut wanted = TopicPartitionList::new();
    for topic in topics {
        let md = consumer
            .fetch_metadata(Some(topic), METADATA_TIMEOUT)
            .map_err(kafka("reading topic metadata"))?;
        match md.topics().iter().find(|t| t.name() == topic) {
            Some(t) if t.error().is_none() && !t.partitions().is_empty() => {
                for p in t.partitions() {
                    wanted
                        .add_partition_offset(topic, p.id(), Offset::Offset(range.since_ms))
                        .map_err(kafka("listing partitions"))?;
                }
            }
            _ => counts.absent_topics.push(topic.clone()),
        }
    }
    if wanted.count() == 0 {
        return Ok(counts);
    }
    let starts = consumer
        .offsets_for_times(wanted, METADATA_TIMEOUT)
        .map_err(kafka("looking up offsets by time (offsets_for_times)"))?;
    // (topic index, partition, end) of the partitions with records to read.
    let mut ends: Vec<(u32, i32, i64)> = Vec::new();
    let mut assign = TopicPartitionList::new();
    let mut total = 0u64;
    for e in starts.elements() {
        let Some(index) = topics.iter().position(|t| t == e.topic()) else {
            continue;
        };
        let (_, high) = consumer
            .fetch_watermarks(e.topic(), e.partition(), METADATA_TIMEOUT)
            .map_err(kafka("reading the partitions' ends (watermarks)"))?;
        // No offset: nothing stamped at or after --since.
        let Offset::Offset(start) = e.offset() else {
            continue;
        };
        if start >= high {
            continue;
        }
        total += (high - start) as u64;
        ends.push((index as u32, e.partition(), high));
        assign
            .add_partition_offset(e.topic(), e.partition(), Offset::Offset(start))
            .map_err(kafka("listing partitions"))?;
    }
    progress.start_phase("records", Some(total));
    if ends.is_empty() {
        return Ok(counts);
    }
    consumer
        .assign(&assign)
        .map_err(kafka("assigning partitions"))?;
    let mut last_progress = Instant::now();
    while !ends.is_empty() {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                last_progress = Instant::now();
                let Some(index) = topics.iter().position(|t| t == m.topic()) else {
                    continue;
                };
                let (partition, offset) = (m.partition(), m.offset());
                let (mut id, mut backfill) = (None, false);
                if let Some(headers) = m.headers() {
                    for h in headers.iter() {
                        if id.is_none() && h.key == ID_HEADER {
                            id = h.value.map(<[u8]>::to_vec);
                        } else if h.key == BACKFILL_HEADER {
                            backfill = true;
                        }
                    }
                }
                counts.read += 1;
                progress.inc(1);
                match id {
                    None => counts.without_id += 1,
                    Some(id) => sorter
                        .push(RecordEntry {
                            id,
                            topic: index as u32,
                            partition,
                            offset,
                            key: m.key().map(<[u8]>::to_vec),
                            backfill,
                            in_range: m.timestamp().to_millis().is_some_and(|t| range.contains(t)),
                        })
                        .map_err(AuditError::Spill)?,
                }
                let index = index as u32;
                ends.retain(|&(t, p, high)| !(t == index && p == partition && offset + 1 >= high));
            }
            Some(Err(e)) => tracing::debug!(error = %e, "audit read: retrying"),
            None => {
                // Transaction markers and aborted records are never
                // delivered: the position passes them.
                if let Ok(position) = consumer.position() {
                    for e in position.elements() {
                        if let (Offset::Offset(next), Some(t)) =
                            (e.offset(), topics.iter().position(|t| t == e.topic()))
                        {
                            let t = t as u32;
                            ends.retain(|&(q, p, high)| {
                                !(q == t && p == e.partition() && next >= high)
                            });
                        }
                    }
                }
                if !ends.is_empty() && last_progress.elapsed() > STALL_TIMEOUT {
                    let left: Vec<String> = ends
                        .iter()
                        .map(|(t, p, high)| format!("{}[{p}] (end {high})", topics[*t as usize]))
                        .collect();
                    return Err(AuditError::Kafka {
                        what: "reading the topics to their end",
                        message: format!(
                            "no record for {}s while these partitions were not read to their end: {}",
                            STALL_TIMEOUT.as_secs(),
                            left.join(", ")
                        ),
                    });
                }
            }
        }
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_is_half_open() {
        let r = TimeRange {
            since_ms: 10,
            until_ms: Some(20),
        };
        assert!(!r.contains(9) && r.contains(10) && r.contains(19) && !r.contains(20));
        let open = TimeRange {
            since_ms: 10,
            until_ms: None,
        };
        assert!(open.contains(i64::MAX) && !open.contains(9));
    }

    #[test]
    fn a_fetch_holds_the_largest_message() {
        let mut base = ClientConfig::new();
        assert_eq!(
            consumer_config(base.clone()).get("fetch.max.bytes"),
            Some("1048576")
        );
        base.set("message.max.bytes", "10000000");
        let c = consumer_config(base);
        assert_eq!(c.get("fetch.max.bytes"), Some("10000000"));
        assert_eq!(c.get("isolation.level"), Some("read_committed"));
        assert_eq!(c.get("fetch.queue.backoff.ms"), Some("10"));
    }
}
