//! Delivery reports: librdkafka's per-message callback turned into
//! [`DeliveryReport`]s on a channel, each failure classified by what the relay
//! has to do about it; plus the client's error and log callbacks.

use std::ffi::CStr;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, DeliveryResult};
use rdkafka::producer::ProducerContext;
use rdkafka::statistics::Statistics;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Message};
use tokio::sync::mpsc::UnboundedSender;

pub(super) use super::client_log::forward_log;

/// The outcome of one record, identified by the id given to `send`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryReport {
    pub id: u64,
    pub result: Result<Delivered, DeliveryFailure>,
}

/// Where Kafka stored the record (acks=all: every in-sync replica has it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivered {
    pub partition: i32,
    pub offset: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryFailure {
    pub code: RDKafkaErrorCode,
    /// librdkafka's description, the broker's text when it sent one, and the
    /// fatal error when the producer died.
    pub message: String,
    pub kind: FailureKind,
}

impl fmt::Display for DeliveryFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({:?})", self.message, self.code)
    }
}

/// What a failed delivery asks of the relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// Kafka will never take this record as it is (too large, invalid, not
    /// authorized for its topic): retrying it unchanged cannot help, so the
    /// relay applies its poison-event policy. From the broker this also makes
    /// the producer fatal (the gapless guarantee turns a lost batch into a
    /// fatal error): check [`KafkaSink::is_fatal`](super::KafkaSink::is_fatal)
    /// or expect the next report to be `Transport`.
    ///
    /// Caveat: the broker refuses whole batches. A broker-side
    /// `MessageSizeTooLarge` is reported for every record of the batch,
    /// innocent ones included (see the module docs for how to keep that from
    /// happening); `InvalidRecord` names the culprit and the others get
    /// `InvalidDifferentRecord`, which is `Transport`.
    PerEvent,
    /// Anything else: timeouts, brokers down, fatal idempotence and gapless
    /// errors, purged messages. The record may be fine, but librdkafka gave up
    /// on it and may still deliver later ones: the relay must stop confirming,
    /// drop the producer and the stream, reconnect and resume from the slot.
    Transport,
}

/// Sorts a failure code into a [`FailureKind`]. Only errors tied to the
/// record itself are `PerEvent`; when unsure, `Transport`, which costs a
/// reconnect but never skips an event.
pub fn classify(code: RDKafkaErrorCode) -> FailureKind {
    use RDKafkaErrorCode as C;
    match code {
        // The record (or, broker-side, its batch) is over a size limit.
        C::MessageSizeTooLarge | C::InvalidMessageSize | C::MessageBatchTooLarge
        // The broker refused this record's content (e.g. no key on a
        // compacted topic) or timestamp, or found it corrupt.
        | C::InvalidRecord | C::InvalidMessage | C::InvalidTimestamp
        // The record's topic: not a valid name, or not ours to write.
        | C::InvalidTopic | C::TopicAuthorizationFailed => FailureKind::PerEvent,
        // Includes InvalidDifferentRecord: innocent records of a batch that
        // held an invalid one; they go again after the reconnect.
        _ => FailureKind::Transport,
    }
}

/// Receives librdkafka's parsed statistics (every `statistics.interval.ms`,
/// on librdkafka's thread): the metrics layer turns them into gauges.
pub type StatsHook = Arc<dyn Fn(&Statistics) + Send + Sync>;

/// The producer's context: sends each delivery report to the sink and keeps
/// the fatal error, if librdkafka raises one.
pub struct DeliveryContext {
    reports: UnboundedSender<DeliveryReport>,
    fatal_raised: AtomicBool,
    fatal_reason: Mutex<Option<String>>,
    /// The topic librdkafka last logged as refused to a transaction by the
    /// authoriser: the transaction's error does not name it.
    refused_topic: Mutex<Option<String>>,
    stats: Option<StatsHook>,
}

impl DeliveryContext {
    pub(crate) fn new(reports: UnboundedSender<DeliveryReport>) -> DeliveryContext {
        DeliveryContext {
            reports,
            fatal_raised: AtomicBool::new(false),
            fatal_reason: Mutex::new(None),
            refused_topic: Mutex::new(None),
            stats: None,
        }
    }

    /// Hands statistics to `hook` (librdkafka only emits them when
    /// `statistics.interval.ms` is set).
    pub(crate) fn with_stats(mut self, hook: Option<StatsHook>) -> DeliveryContext {
        self.stats = hook;
        self
    }

    /// The fatal error librdkafka raised, if any: this producer delivers
    /// nothing more.
    pub(crate) fn fatal(&self) -> Option<String> {
        if !self.fatal_raised.load(Ordering::Acquire) {
            return None;
        }
        self.fatal_reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The topic librdkafka last logged as refused to a transaction.
    pub(crate) fn refused_topic(&self) -> Option<String> {
        self.refused_topic
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Keeps the first fatal error.
    fn raise_fatal(&self, reason: &str) {
        let mut kept = self.fatal_reason.lock().unwrap_or_else(|e| e.into_inner());
        if kept.is_none() {
            *kept = Some(reason.to_owned());
            self.fatal_raised.store(true, Ordering::Release);
        }
    }

    fn failure(&self, error: &KafkaError, message: &BorrowedMessage<'_>) -> DeliveryFailure {
        let code = error.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail);
        let mut text = describe(code);
        if let Some(detail) = produce_errstr(message) {
            if detail != text {
                text = format!("{text}: {detail}");
            }
        }
        if let Some(hint) = write_refused_hint(code, message.topic()) {
            text = format!("{text}; {hint}");
        }
        if matches!(
            code,
            RDKafkaErrorCode::Fatal | RDKafkaErrorCode::GaplessGuarantee
        ) {
            if let Some(reason) = self.fatal() {
                text = format!("{text}: {reason}");
            }
        }
        DeliveryFailure {
            code,
            message: text,
            kind: classify(code),
        }
    }
}

impl ClientContext for DeliveryContext {
    // rdkafka's default logs the whole structure at info; we export it.
    fn stats(&self, statistics: Statistics) {
        if let Some(hook) = &self.stats {
            hook(&statistics);
        }
    }

    fn log(&self, level: RDKafkaLogLevel, fac: &str, log_message: &str) {
        // librdkafka announces a fatal error with this log line (always
        // emitted, at LOG_EMERG) before it fails the records it concerns. The
        // error event that follows carries the underlying code (e.g.
        // GaplessGuarantee), not `Fatal`, so it cannot tell fatal apart.
        if let Some(topic) = refused_to_transaction(fac, log_message) {
            *self.refused_topic.lock().unwrap_or_else(|e| e.into_inner()) = Some(topic);
        }
        if fac == "FATAL" {
            self.raise_fatal(
                log_message
                    .strip_prefix("Fatal error: ")
                    .unwrap_or(log_message),
            );
        }
        forward_log(level, fac, log_message);
    }

    fn error(&self, error: KafkaError, reason: &str) {
        let code = error.rdkafka_error_code();
        if code == Some(RDKafkaErrorCode::Fatal) {
            self.raise_fatal(reason);
        }
        // Transport errors and the fatal error were logged by librdkafka
        // already; the records affected come back as reports.
        let logged = matches!(
            code,
            Some(
                RDKafkaErrorCode::BrokerTransportFailure
                    | RDKafkaErrorCode::AllBrokersDown
                    | RDKafkaErrorCode::Resolve
            )
        ) || self.fatal().is_some_and(|f| f.contains(reason));
        if logged {
            tracing::debug!(target: "librdkafka", %error, %reason, "Kafka producer error");
        } else {
            tracing::warn!(target: "librdkafka", %error, %reason, "Kafka producer error");
        }
    }
}

impl ProducerContext for DeliveryContext {
    /// The delivery id given to `send`.
    type DeliveryOpaque = Box<u64>;

    fn delivery(&self, result: &DeliveryResult<'_>, id: Box<u64>) {
        let result = match result {
            Ok(m) if m.offset() >= 0 => Ok(Delivered {
                partition: m.partition(),
                offset: m.offset(),
            }),
            Ok(_) => Err(implicit_ack()),
            Err((e, m)) => Err(self.failure(e, m)),
        };
        // The receiver is gone only while the sink is being dropped.
        let _ = self.reports.send(DeliveryReport { id: *id, result });
    }
}

/// A success report without an offset. librdkafka "implicitly acks" records
/// still waiting to be retried once a later batch of their partition
/// succeeds, assuming the broker would not have taken the later batch
/// without them. A broker before Kafka 4.5 does take it when it has no state
/// for the producer on that partition, e.g. on a partition created moments
/// ago whose first request was refused with NOT_LEADER (KAFKA-15591): the
/// records were never written. So such an ack proves nothing, and the relay
/// must send the record again (a duplicate at worst) instead of confirming
/// past it.
fn implicit_ack() -> DeliveryFailure {
    DeliveryFailure {
        code: RDKafkaErrorCode::Inconsistent,
        message: "Kafka acknowledged the record only implicitly, without an offset (a later \
                  batch of its partition succeeded while it waited to be retried); it may \
                  never have been written, so it is sent again"
            .to_owned(),
        kind: FailureKind::Transport,
    }
}

/// librdkafka's description of a code, without the variant name that
/// `Display` puts first ("Broker: Message size too large").
pub(super) fn describe(code: RDKafkaErrorCode) -> String {
    let full = code.to_string();
    full.strip_prefix(&format!("{code:?} ("))
        .and_then(|rest| rest.strip_suffix(')'))
        .map(str::to_owned)
        .unwrap_or(full)
}

/// The topic of librdkafka's log line about a partition the authoriser
/// refused to add to a transaction (`ADDPARTS`: `Failed to add partition
/// "orders" [0] to transaction: Broker: Topic authorization failed`).
fn refused_to_transaction(fac: &str, line: &str) -> Option<String> {
    if fac != "ADDPARTS" || !line.contains("Topic authorization failed") {
        return None;
    }
    let (_, rest) = line.split_once("Failed to add partition \"")?;
    let (topic, _) = rest.split_once('"')?;
    Some(topic.to_owned())
}

/// The ACL to grant when the broker refused a produce to `topic` with
/// `code`: the authoriser refuses the topic, not the record, so the failure
/// names the right instead of leaving "Topic authorization failed" to be
/// read as a bad event.
pub(super) fn write_refused_hint(code: RDKafkaErrorCode, topic: &str) -> Option<String> {
    (code == RDKafkaErrorCode::TopicAuthorizationFailed).then(|| {
        format!(
            "the principal may not write to topic `{topic}`: grant it WRITE on the topic: \
             kafka-acls.sh --bootstrap-server BROKER --add --allow-principal User:PRINCIPAL \
             --operation Write --topic {topic}"
        )
    })
}

/// The per-message error text librdkafka keeps for a failed produce (the
/// broker's message, or which record of the batch was invalid).
fn produce_errstr(message: &BorrowedMessage<'_>) -> Option<String> {
    // SAFETY: `message.ptr()` is the delivery report's live message, borrowed
    // for this callback. The function returns NULL or a NUL-terminated string
    // owned by that message, which we copy before returning.
    let text = unsafe {
        let ptr = rdkafka::bindings::rd_kafka_message_produce_errstr(message.ptr());
        if ptr.is_null() {
            return None;
        }
        CStr::from_ptr(ptr).to_string_lossy().trim().to_owned()
    };
    (!text.is_empty()).then_some(text)
}

/// The most verbose level the tracing subscriber wants from librdkafka.
/// (rdkafka would ask the `log` crate, which has no logger here.)
pub(super) fn log_level() -> RDKafkaLogLevel {
    use tracing::Level;
    if tracing::enabled!(target: "librdkafka", Level::DEBUG) {
        RDKafkaLogLevel::Debug
    } else if tracing::enabled!(target: "librdkafka", Level::INFO) {
        RDKafkaLogLevel::Info
    } else if tracing::enabled!(target: "librdkafka", Level::WARN) {
        RDKafkaLogLevel::Warning
    } else {
        RDKafkaLogLevel::Error
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use RDKafkaErrorCode as C;

    #[test]
    fn the_topic_refused_to_a_transaction_is_read_from_librdkafkas_log() {
        let line = "TxnCoordinator/1: Failed to add partition \"rights.order\" [0] to \
                    transaction: Broker: Topic authorization failed";
        assert_eq!(
            refused_to_transaction("ADDPARTS", line).as_deref(),
            Some("rights.order")
        );
        let other = "TxnCoordinator/1: Failed to add partition \"l\" [0] to transaction: \
                     Broker: Operation not attempted";
        assert_eq!(refused_to_transaction("ADDPARTS", other), None);
        assert_eq!(refused_to_transaction("FATAL", line), None);
    }

    #[test]
    fn a_refused_write_names_the_acl_and_nothing_else_does() {
        let hint = write_refused_hint(C::TopicAuthorizationFailed, "orders").unwrap();
        assert!(hint.contains("grant it WRITE on the topic"), "{hint}");
        assert!(hint.contains("--operation Write --topic orders"), "{hint}");
        assert_eq!(write_refused_hint(C::MessageSizeTooLarge, "orders"), None);
    }

    #[test]
    fn record_level_errors_are_per_event() {
        for code in [
            C::MessageSizeTooLarge,
            C::InvalidMessageSize,
            C::MessageBatchTooLarge,
            C::InvalidRecord,
            C::InvalidMessage,
            C::InvalidTimestamp,
            C::InvalidTopic,
            C::TopicAuthorizationFailed,
        ] {
            assert_eq!(classify(code), FailureKind::PerEvent, "{code:?}");
        }
    }

    #[test]
    fn everything_else_is_transport() {
        for code in [
            C::MessageTimedOut,
            C::Fatal,
            C::GaplessGuarantee,
            C::OutOfOrderSequenceNumber,
            C::UnknownProducerId,
            C::InvalidProducerEpoch,
            C::PurgeQueue,
            C::PurgeInflight,
            C::AllBrokersDown,
            C::BrokerTransportFailure,
            C::NotEnoughReplicas,
            C::NotLeaderForPartition,
            C::UnknownTopicOrPartition,
            C::UnknownTopic,
            C::ClusterAuthorizationFailed,
            C::SaslAuthenticationFailed,
            C::InvalidDifferentRecord,
            C::QueueFull,
            C::Fail,
        ] {
            assert_eq!(classify(code), FailureKind::Transport, "{code:?}");
        }
    }

    #[test]
    fn describe_drops_the_variant_name() {
        assert_eq!(
            describe(C::MessageSizeTooLarge),
            "Broker: Message size too large"
        );
        assert_eq!(describe(C::MessageTimedOut), "Local: Message timed out");
    }

    #[test]
    fn fatal_error_is_kept_from_the_log_line_or_the_error_event() {
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let cx = DeliveryContext::new(tx);
        assert_eq!(cx.fatal(), None);
        cx.error(
            KafkaError::Global(C::BrokerTransportFailure),
            "1/1 brokers are down",
        );
        cx.log(RDKafkaLogLevel::Error, "FAIL", "Connect failed");
        assert_eq!(cx.fatal(), None);
        cx.log(
            RDKafkaLogLevel::Emerg,
            "FATAL",
            "Fatal error: Local: Gap-less ordering would not be guaranteed if proceeding: x",
        );
        let want = "Local: Gap-less ordering would not be guaranteed if proceeding: x";
        assert_eq!(cx.fatal().as_deref(), Some(want));
        // The first one is kept.
        cx.error(KafkaError::Global(C::Fatal), "another");
        assert_eq!(cx.fatal().as_deref(), Some(want));

        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let cx = DeliveryContext::new(tx);
        cx.error(KafkaError::Global(C::Fatal), "from the event");
        assert_eq!(cx.fatal().as_deref(), Some("from the event"));
    }
}
