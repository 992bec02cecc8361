//! A topic read to its end again and again by one long-lived
//! `read_committed` client: each read goes on from where the last one
//! stopped, so a test that waits for records to arrive pays for the new
//! ones only, not for a new client, its metadata and a fetch of the whole
//! topic each time (a second or two under load, and more connections to
//! the broker each look).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;

use crate::harness::kafka::{assign_from_start, to_record, KafkaBroker, Record};

pub struct TopicReader {
    consumer: BaseConsumer,
    topic: String,
    partitions: Vec<i32>,
    /// Partition → the offset at which it last reported its end, while no
    /// record came after.
    at_end: HashMap<i32, i64>,
    records: Vec<Record>,
}

impl KafkaBroker {
    /// A reader of `topic` from its beginning; it waits up to `timeout` for
    /// the topic's metadata (the code under test may create it).
    pub fn topic_reader(&self, topic: &str, timeout: Duration) -> TopicReader {
        let consumer = self.reader(
            &format!("outboxd-harness-reader-{}", std::process::id()),
            true,
            100,
        );
        let partitions = assign_from_start(&consumer, topic, Instant::now() + timeout)
            .unwrap_or_else(|| panic!("topic_reader({topic}): no metadata in {timeout:?}"));
        TopicReader {
            consumer,
            topic: topic.to_string(),
            partitions,
            at_end: HashMap::new(),
            records: Vec::new(),
        }
    }
}

impl TopicReader {
    /// Reads on until every partition is at its end as `read_committed`
    /// sees it now (its last stable offset), or `timeout`; every record
    /// read so far, in (partition, offset) order. The client reports a
    /// partition's end once per offset: one that reported it, took what the
    /// client had fetched since, and whose log has not grown since, is at
    /// its end without another report.
    pub fn read_to_end(&mut self, timeout: Duration) -> &[Record] {
        let deadline = Instant::now() + timeout;
        let mut done: HashSet<i32> = HashSet::new();
        // What the client fetched meanwhile first.
        while let Some(event) = self.next(Duration::from_millis(200)) {
            self.take(event, &mut done);
        }
        for &p in &self.partitions {
            let grown = self
                .consumer
                .fetch_watermarks(&self.topic, p, Duration::from_secs(10))
                .map_or(true, |(_, high)| {
                    self.at_end.get(&p).map_or(true, |&end| high > end)
                });
            if !grown {
                done.insert(p);
            }
        }
        while done.len() < self.partitions.len() && Instant::now() < deadline {
            if let Some(event) = self.next(Duration::from_millis(200)) {
                self.take(event, &mut done);
            }
        }
        self.records.sort_by_key(|r| (r.partition, r.offset));
        &self.records
    }

    /// The client's next event, owned.
    fn next(&self, wait: Duration) -> Option<Result<Record, KafkaError>> {
        self.consumer
            .poll(wait)
            .map(|event| event.map(|m| to_record(&m)))
    }

    fn take(&mut self, event: Result<Record, KafkaError>, done: &mut HashSet<i32>) {
        match event {
            Ok(r) => {
                self.at_end.remove(&r.partition);
                done.remove(&r.partition);
                self.records.push(r);
            }
            Err(KafkaError::PartitionEOF(p)) => {
                // The log's end now (commit markers and open transactions
                // included): while it stays there, so does this partition.
                if let Ok((_, high)) =
                    self.consumer
                        .fetch_watermarks(&self.topic, p, Duration::from_secs(10))
                {
                    self.at_end.insert(p, high);
                }
                done.insert(p);
            }
            Err(e) => eprintln!("topic_reader({}): {e}", self.topic),
        }
    }

    /// Reads on until it holds at least `n` records, or `timeout`; every
    /// record read so far, in (partition, offset) order.
    pub fn at_least(&mut self, n: usize, timeout: Duration) -> &[Record] {
        let deadline = Instant::now() + timeout;
        while self.records.len() < n && Instant::now() < deadline {
            if let Some(event) = self.next(Duration::from_millis(200)) {
                self.take(event, &mut HashSet::new());
            }
        }
        self.records.sort_by_key(|r| (r.partition, r.offset));
        &self.records
    }
}
