//! [`KafkaSink`]: one idempotent producer and the channel its delivery
//! reports arrive on.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, PurgeConfig, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;
use tokio::sync::mpsc::{self, UnboundedReceiver};

use super::config::{producer_config, QueueBound};
use super::delivery::{self, classify, DeliveryContext, DeliveryReport, FailureKind, StatsHook};
use super::error::{creation_error, SendError, SinkError};
use super::send_now::SendNow;
use crate::config::KafkaConfig;
use crate::outbox::KafkaRecord;

/// How often [`KafkaSink::flush`] looks at the queue: short next to the
/// 5 ms linger, long enough not to spin.
#[cfg(test)]
const FLUSH_CHECK_INTERVAL: Duration = Duration::from_millis(5);

/// Default statistics period when a hook wants them: fresher than a 15 s
/// scrape, and parsing the JSON every 5 s costs nothing worth measuring.
pub const STATS_INTERVAL_MS: &str = "5000";

/// How long [`KafkaSink::when_connected`] waits per look before checking
/// that the producer is still there.
const CONNECT_POLL: Duration = Duration::from_millis(500);

/// The producer side of the relay. librdkafka's polling thread (inside
/// [`ThreadedProducer`]) runs the delivery callbacks; their reports wait on an
/// unbounded channel, bounded in practice by the records the caller keeps in
/// flight (one report per record `send` accepted).
pub struct KafkaSink {
    /// Shared only with [`KafkaSink::when_connected`]'s watcher, which holds
    /// it for at most [`CONNECT_POLL`] at a time.
    producer: Arc<ThreadedProducer<DeliveryContext>>,
    reports: UnboundedReceiver<DeliveryReport>,
    /// Cuts `linger.ms` short when the relay has nothing more to send.
    send_now: Option<SendNow>,
}

impl KafkaSink {
    /// Creates the producer. Connects in the background: an unreachable
    /// broker shows up as delivery timeouts, not here.
    pub fn new(brokers: &str, kafka: &KafkaConfig) -> Result<KafkaSink, SinkError> {
        KafkaSink::with_stats(brokers, kafka, QueueBound::default(), None)
    }

    /// As [`KafkaSink::new`], handing librdkafka's statistics to `stats`
    /// every `statistics.interval.ms` ([`STATS_INTERVAL_MS`] unless
    /// `[kafka.properties]` sets it; "0" there turns them off), with the
    /// queue sized to the caller's in-flight `window`.
    pub(crate) fn with_stats(
        brokers: &str,
        kafka: &KafkaConfig,
        window: QueueBound,
        stats: Option<StatsHook>,
    ) -> Result<KafkaSink, SinkError> {
        KafkaSink::build(brokers, kafka, window, stats, None)
    }

    /// The producer, transactional with `transactional_id` when given.
    pub(super) fn build(
        brokers: &str,
        kafka: &KafkaConfig,
        window: QueueBound,
        stats: Option<StatsHook>,
        transactional_id: Option<&str>,
    ) -> Result<KafkaSink, SinkError> {
        let mut config = producer_config(brokers, &kafka.properties, window)?;
        if let Some(id) = transactional_id {
            config.set("transactional.id", id);
        }
        config.set_log_level(delivery::log_level());
        if stats.is_some() && !kafka.properties.contains_key("statistics.interval.ms") {
            config.set("statistics.interval.ms", STATS_INTERVAL_MS);
        }
        let linger_ms = linger_ms(&config);
        let (tx, reports) = mpsc::unbounded_channel();
        let producer = config
            .create_with_context(DeliveryContext::new(tx).with_stats(stats))
            .map_err(|e| creation_error("producer", e, &kafka.properties))?;
        let producer = Arc::new(producer);
        let send_now = SendNow::start(&producer, linger_ms);
        Ok(KafkaSink {
            producer,
            reports,
            send_now,
        })
    }

    /// Calls `connected` (on a thread of its own) once the producer has its
    /// first metadata answer from a broker, which librdkafka asks for as
    /// soon as it starts: the earliest sign of a working connection, seconds
    /// before the first statistics. Never called if the sink is dropped
    /// first.
    pub fn when_connected(&self, connected: impl FnOnce() + Send + 'static) {
        let producer = Arc::downgrade(&self.producer);
        let watch = move || loop {
            let Some(producer) = producer.upgrade() else {
                return;
            };
            let asked = Instant::now();
            // `None` before the timeout: metadata came, without a cluster id
            // (a broker before Kafka 0.10).
            if producer.client().fetch_cluster_id(CONNECT_POLL).is_some()
                || asked.elapsed() < CONNECT_POLL / 2
            {
                connected();
                return;
            }
        };
        if let Err(e) = std::thread::Builder::new()
            .name("outboxd-kafka-connect".into())
            .spawn(watch)
        {
            tracing::debug!(error = %e, "cannot watch for the producer's first connection");
        }
    }

    /// Enqueues one record; its [`DeliveryReport`] carries `id`. A header
    /// value of `None` is sent as a null value (not an empty one).
    ///
    /// Must be called from ONE task, in WAL order, never concurrently: the
    /// order of these calls is the order within each partition. On
    /// [`SendError::QueueFull`] wait for a report, then send the same record
    /// again before any later one.
    pub fn send(
        &self,
        id: u64,
        topic: &str,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[(impl AsRef<str>, Option<impl AsRef<[u8]>>)],
        timestamp_ms: Option<i64>,
    ) -> Result<(), SendError> {
        if topic.contains('\0') {
            // rdkafka would panic turning it into a C string.
            return Err(SendError::Rejected {
                code: RDKafkaErrorCode::InvalidTopic,
                kind: FailureKind::PerEvent,
                message: format!("topic name {topic:?} contains a NUL character"),
            });
        }
        let mut record: BaseRecord<'_, [u8], [u8], Box<u64>> =
            BaseRecord::with_opaque_to(topic, Box::new(id));
        if let Some(key) = key {
            record = record.key(key);
        }
        if let Some(value) = value {
            record = record.payload(value);
        }
        if !headers.is_empty() {
            let mut owned = OwnedHeaders::new_with_capacity(headers.len());
            for (name, value) in headers {
                owned = owned.insert(Header {
                    key: name.as_ref(),
                    value: value.as_ref().map(AsRef::as_ref),
                });
            }
            record = record.headers(owned);
        }
        if let Some(ts) = timestamp_ms {
            record = record.timestamp(ts);
        }
        match self.producer.send(record) {
            Ok(()) => Ok(()),
            Err((e, _record)) => Err(self.send_error(e.rdkafka_error_code())),
        }
    }

    /// [`send`](Self::send) for a mapped record.
    pub(crate) fn send_record(&self, id: u64, record: &KafkaRecord) -> Result<(), SendError> {
        self.send(
            id,
            &record.topic,
            record.key.as_deref(),
            record.value.as_deref(),
            &record.headers,
            record.timestamp_ms,
        )
    }

    /// Nothing more is coming for now: what is queued goes out without
    /// waiting for `linger.ms` (see [`super::send_now`]). Never blocks.
    pub(crate) fn send_now(&self) {
        if let Some(send_now) = &self.send_now {
            send_now.request();
        }
    }

    fn send_error(&self, code: Option<RDKafkaErrorCode>) -> SendError {
        let code = code.unwrap_or(RDKafkaErrorCode::Fail);
        let message = match code {
            RDKafkaErrorCode::QueueFull => return SendError::QueueFull,
            RDKafkaErrorCode::MessageSizeTooLarge => "the record is larger than the producer's \
                message.max.bytes (kafka.properties.\"message.max.bytes\")"
                .to_owned(),
            RDKafkaErrorCode::Fatal => match self.is_fatal() {
                Some(reason) => format!("the producer failed fatally: {reason}"),
                None => delivery::describe(code),
            },
            _ => delivery::describe(code),
        };
        SendError::Rejected {
            code,
            kind: classify(code),
            message,
        }
    }

    /// The next delivery report. Cancel-safe. `None` only once the producer
    /// is gone.
    pub async fn next_report(&mut self) -> Option<DeliveryReport> {
        self.reports.recv().await
    }

    /// A delivery report that is ready now, if any (call in a loop to drain).
    pub(crate) fn try_report(&mut self) -> Option<DeliveryReport> {
        self.reports.try_recv().ok()
    }

    /// librdkafka's `outq_len`: records queued, in flight, or waiting for
    /// their report to be handed to the channel, plus any other client event
    /// (an error, a log line) the polling thread has yet to serve.
    pub(crate) fn in_queue(&self) -> i32 {
        self.producer.in_flight_count()
    }

    pub(super) fn producer(&self) -> Arc<ThreadedProducer<DeliveryContext>> {
        Arc::clone(&self.producer)
    }

    /// The code of librdkafka's fatal error, once it raised one.
    pub(super) fn fatal_code(&self) -> Option<RDKafkaErrorCode> {
        self.producer.client().fatal_error().map(|(code, _)| code)
    }

    /// The fatal error, once librdkafka raised one (e.g. the gapless
    /// guarantee could not be kept): this producer delivers nothing more.
    pub(crate) fn is_fatal(&self) -> Option<String> {
        if let Some((code, reason)) = self.producer.client().fatal_error() {
            return Some(format!("{reason} ({code:?})"));
        }
        self.producer.context().fatal()
    }

    /// Waits until every queued record has its report on the channel, or
    /// `timeout`. Blocks the calling thread (use at shutdown, or from
    /// `spawn_blocking`). Only the polling thread serves callbacks meanwhile,
    /// so reports keep their per-partition order.
    #[cfg(test)]
    pub(crate) fn flush(&self, timeout: Duration) -> Result<(), SinkError> {
        let deadline = Instant::now() + timeout;
        loop {
            let in_flight = self.in_queue();
            if in_flight == 0 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(SinkError::FlushTimeout { in_flight });
            }
            std::thread::sleep(FLUSH_CHECK_INTERVAL);
        }
    }

    /// Fails everything still queued (reports come back as `PurgeQueue`),
    /// leaving the requests already sent to their real outcome.
    pub(crate) fn purge_queued(&self) {
        self.producer
            .purge(PurgeConfig::default().queue().non_blocking());
    }

    /// Fails everything queued and in flight: their reports come back as
    /// `PurgeQueue` / `PurgeInflight` (`Transport`). For abandoning a
    /// producer after a transport failure without waiting for timeouts.
    pub(crate) fn purge(&self) {
        self.producer
            .purge(PurgeConfig::default().queue().inflight().non_blocking());
    }
}

/// The producer's effective `linger.ms` (librdkafka takes a fraction of a
/// millisecond; rounded up, so a linger is never cut to nothing by rounding).
fn linger_ms(config: &rdkafka::ClientConfig) -> u32 {
    ["linger.ms", "queue.buffering.max.ms"]
        .iter()
        .find_map(|name| config.get(name))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v > 0.0)
        .map_or(0, |v| v.ceil().min(f64::from(u32::MAX)) as u32)
}

#[cfg(test)]
mod tests {
    use super::linger_ms;

    fn with(props: &[(&str, &str)]) -> u32 {
        let mut c = rdkafka::ClientConfig::new();
        for (k, v) in props {
            c.set(*k, *v);
        }
        linger_ms(&c)
    }

    #[test]
    fn linger_is_read_under_either_name_and_rounded_up() {
        assert_eq!(with(&[("linger.ms", "5")]), 5);
        assert_eq!(with(&[("queue.buffering.max.ms", "20")]), 20);
        assert_eq!(with(&[("linger.ms", "0.5")]), 1);
        assert_eq!(with(&[("linger.ms", "0")]), 0);
        assert_eq!(with(&[]), 0);
        assert_eq!(with(&[("linger.ms", "soon")]), 0);
    }
}
