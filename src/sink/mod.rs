//! The Kafka side: one idempotent producer, fed by one task, in WAL order.
//!
//! Why this shape:
//! - **One producer, one task, FIFO.** Records are enqueued with
//!   [`KafkaSink::send`] from the relay's single task in WAL order, never
//!   concurrently: the order of those calls is the order in each partition.
//!   (Sending from concurrent tasks, e.g. `FutureProducer::send` with a queue
//!   timeout, reorders records: rust-rdkafka #468.) A full local queue is
//!   [`SendError::QueueFull`]: wait for a report, then resend the same record
//!   before any later one.
//! - **The producer keeps order and leaves no gap.** Idempotence (implies
//!   acks=all, ≤ 5 in-flight requests, unlimited retries) keeps each
//!   partition in order across retries; the gapless guarantee turns a batch
//!   lost for good into a fatal error instead of a hole followed by later
//!   records; murmur2_random places keys where Java clients do. These are
//!   enforced by [`client_config`], which refuses any `[kafka.properties]`
//!   entry contradicting them.
//! - **Reports, not futures.** librdkafka's polling thread runs the delivery
//!   callback, which sends a [`DeliveryReport`] (the id given to `send`, and
//!   partition/offset or a [`DeliveryFailure`]) to an unbounded channel;
//!   [`KafkaSink::next_report`] reads it, cancel-safe. Reports for one
//!   partition come in send order; across partitions in any order, so the
//!   relay acknowledges by id.
//!
//! What a failure asks of the relay ([`FailureKind`]):
//! - `Transport` (timeouts, brokers down, fatal idempotence/gapless errors,
//!   purged records): librdkafka gave up on a record that may be fine, and
//!   may still deliver later ones. Stop confirming at that record, purge or
//!   drop the producer, drop the stream, reconnect, resume from the slot.
//! - `PerEvent` (too large, invalid, topic not authorized): this record will
//!   never be accepted as it is; apply the poison-event policy. Refused at
//!   [`KafkaSink::send`] (over `message.max.bytes`), the record is refused
//!   alone and nothing was queued. Refused by the broker, the producer is
//!   fatal as well (gapless guarantee), so the next send or report says
//!   `Transport`, and the refusal may cover innocent records: the broker
//!   refuses whole batches, and a broker-side `MessageSizeTooLarge` comes
//!   back for every record of the batch (checked against a real broker).
//!   (`InvalidRecord` is precise: the broker names the record, the others get
//!   `InvalidDifferentRecord`, which is `Transport`.) With the defaults this
//!   does not happen: librdkafka bounds a batch by `message.max.bytes`
//!   (1,000,000), below the topics' default `max.message.bytes` (1,048,588),
//!   so size is refused per record, at `send`. It does once a topic's limit
//!   is set below the producer's `message.max.bytes`.
//!
//! Files: `config` (properties, pure), `delivery` (reports and their
//! classification), `producer` ([`KafkaSink`]), `topics` ([`TopicManager`]),
//! `ledger_topic` ([`LedgerTopic`], the position ledger's topic),
//! `ledger_reader` (reading it back, through `simple_consumer`: no
//! consumer group), `ledger_error`, `topic_config` (DescribeConfigs with
//! the broker's per-topic error), `admin_refusal` (how
//! a refused admin request is met), `client_log` (librdkafka's log lines into tracing), `transaction` (the
//! transactional producer of `relay.delivery = "exactly-once"`), `error`.

mod admin_refusal;
mod client_log;
mod config;
pub(crate) mod connect_cause;
mod delivery;
pub(crate) mod error;
mod leaders;
mod ledger_error;
mod ledger_reader;
mod ledger_topic;
pub(crate) mod probe;
mod producer;
mod send_now;
mod simple_consumer;
mod topic_config;
mod topics;
mod transaction;

#[cfg(test)]
mod mock_tests;
#[cfg(test)]
mod transaction_mock_tests;

pub use client_log::QuietRdkafka;
pub(crate) use client_log::{clear_kafka_refusal, kafka_refusal};
pub(crate) use config::{admin_client_config, producer_config, QueueBound};
pub use delivery::{
    classify, Delivered, DeliveryContext, DeliveryFailure, DeliveryReport, FailureKind, StatsHook,
};
pub use error::SendError;
pub(crate) use error::SinkError;
pub(crate) use leaders::{fresh_leaders, Leaders};
pub use ledger_error::LedgerTopicError;
pub use ledger_reader::{LedgerReader, ReadTo};
pub(crate) use ledger_topic::LedgerWrite;
pub use ledger_topic::{
    inspect_ledger_topic, ledger_record, new_ledger_topic, LedgerTopic, LedgerTopicState,
    LEDGER_TOPIC_PARTITIONS,
};
pub use producer::{KafkaSink, STATS_INTERVAL_MS};
pub(crate) use topics::{describe_topic, TopicManager};
pub use transaction::{is_fencing, TransactionCall, TransactionControl, TransactionError};
