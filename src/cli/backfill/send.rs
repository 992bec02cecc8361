//! The Kafka side of a backfill: the relay's producer and topic manager,
//! records enqueued in read order from one task, every report awaited.
//!
//! Simpler than the relay's send path on purpose: there is no slot to keep
//! consistent, so the first failed delivery ends the backfill (what was not
//! acknowledged is counted, and running it again is safe) instead of
//! replacing the producer and resending.

use std::collections::HashMap;
use std::sync::Arc;

use rdkafka::types::RDKafkaErrorCode;

use super::error::BackfillError;
use super::mark::mark;
use super::summary::Summary;
use crate::config::Config;
use crate::outbox::{KafkaRecord, OutboxEvent, RecordMapper};
use crate::relay::{dead_letter_refused, dead_letter_unmappable};
use crate::sink::{FailureKind, KafkaSink, SendError, TopicManager};

/// What an in-flight record counts as once acknowledged.
enum Sent {
    Event(Arc<str>),
    DeadLetter,
}

pub(crate) struct Sender {
    sink: KafkaSink,
    topics: TopicManager,
    dead_letter_topic: Option<Arc<str>>,
    in_flight: HashMap<u64, Sent>,
    max_in_flight: usize,
    next_id: u64,
    /// The first failed delivery: nothing more is sent after it.
    failure: Option<String>,
}

impl Sender {
    pub(crate) fn new(
        cfg: &Config,
        dead_letter_topic: Option<Arc<str>>,
    ) -> Result<Sender, BackfillError> {
        let brokers = cfg.kafka.brokers.clone().unwrap_or_default();
        Ok(Sender {
            sink: KafkaSink::new(&brokers, &cfg.kafka)?,
            topics: TopicManager::new(&brokers, &cfg.kafka)?,
            dead_letter_topic,
            in_flight: HashMap::new(),
            max_in_flight: cfg.relay.max_in_flight_events.max(1),
            next_id: 0,
            failure: None,
        })
    }

    /// Maps and sends one event; `Err` says why the backfill must stop.
    pub(crate) async fn publish(
        &mut self,
        mapper: &mut RecordMapper,
        event: OutboxEvent,
        summary: &mut Summary,
    ) -> Result<(), String> {
        let record = match mapper.map(&event) {
            Ok(record) => mark(record),
            Err(e) => {
                let (key, id) = mapper.key_and_id(&event);
                let id_text = id
                    .as_deref()
                    .map(String::from_utf8_lossy)
                    .unwrap_or_default()
                    .into_owned();
                let Some(dlq) = &self.dead_letter_topic else {
                    return Err(format!(
                        "row with id {id_text:?} cannot be mapped ({e}) and relay.on_error = \"stop\""
                    ));
                };
                tracing::warn!(id = %id_text, error = %e, topic = &**dlq, "row cannot be mapped: dead-lettered");
                let copy = dead_letter_unmappable(&event, dlq, &e.to_string(), key, id);
                summary.unmappable += 1;
                return self
                    .send(mark(copy), Sent::DeadLetter, summary)
                    .await
                    .map_err(|r| format!("Kafka refused the dead-letter copy: {}", r.message))
                    .and_then(|()| self.failure.clone().map_or(Ok(()), Err));
            }
        };
        let topic = Arc::clone(&record.topic);
        match self.send(record.clone(), Sent::Event(topic), summary).await {
            Err(Refused { code, message }) => {
                // Refused alone at `send` (too large for the producer): the
                // relay's `on_error` policy, as for the relay.
                let Some(dlq) = self.dead_letter_topic.clone() else {
                    return Err(format!(
                        "Kafka refused the record of id {:?}: {message}, and relay.on_error = \"stop\"",
                        String::from_utf8_lossy(record.event_id.as_deref().unwrap_or_default())
                    ));
                };
                use RDKafkaErrorCode as C;
                let too_large = matches!(
                    code,
                    C::MessageSizeTooLarge | C::InvalidMessageSize | C::MessageBatchTooLarge
                );
                let error = format!("{message} ({code:?})");
                tracing::warn!(%error, topic = &*dlq, "Kafka refused a record: dead-lettered");
                // The relay's kind for a refused record.
                let copy =
                    dead_letter_refused(&record, &dlq, &event, "delivery", &error, too_large);
                self.send(copy, Sent::DeadLetter, summary)
                    .await
                    .map_err(|r| format!("Kafka refused the dead-letter copy too: {}", r.message))
            }
            Ok(()) => Ok(()),
        }
        .and_then(|()| self.failure.clone().map_or(Ok(()), Err))
    }

    /// Enqueues one record, waiting for reports while the queue (or
    /// `relay.max_in_flight_events`) is full.
    async fn send(
        &mut self,
        record: KafkaRecord,
        sent: Sent,
        summary: &mut Summary,
    ) -> Result<(), Refused> {
        if let Err(e) = self.topics.ensure(&record.topic).await {
            self.fail(e.to_string());
            return Ok(());
        }
        while self.in_flight.len() >= self.max_in_flight {
            self.next_report(summary).await;
        }
        loop {
            if self.failure.is_some() {
                return Ok(());
            }
            let id = self.next_id;
            match self.sink.send_record(id, &record) {
                Ok(()) => {
                    self.next_id += 1;
                    self.in_flight.insert(id, sent);
                    return Ok(());
                }
                Err(SendError::QueueFull) => self.next_report(summary).await,
                Err(SendError::Rejected {
                    code,
                    kind: FailureKind::PerEvent,
                    message,
                }) => return Err(Refused { code, message }),
                Err(e) => {
                    self.fail(e.to_string());
                    return Ok(());
                }
            }
        }
    }

    /// Waits for one delivery report and books it.
    async fn next_report(&mut self, summary: &mut Summary) {
        let Some(report) = self.sink.next_report().await else {
            self.fail("the Kafka producer stopped".into());
            // Nothing more will be reported: whatever was in flight failed.
            summary.failed += self.in_flight.len() as u64;
            self.in_flight.clear();
            return;
        };
        let Some(sent) = self.in_flight.remove(&report.id) else {
            return;
        };
        match (report.result, sent) {
            (Ok(_), Sent::Event(topic)) => {
                *summary.published.entry(topic.to_string()).or_default() += 1
            }
            (Ok(_), Sent::DeadLetter) => summary.dead_lettered += 1,
            (Err(failure), _) => {
                summary.failed += 1;
                self.fail(format!("delivery failed: {failure}"));
            }
        }
    }

    fn fail(&mut self, why: String) {
        if self.failure.is_none() {
            tracing::error!(error = %why, "backfill stops: nothing more is sent");
            self.failure = Some(why);
        }
    }

    /// Waits for every report, then adds the failure (if any) to `summary`.
    pub(crate) async fn finish(mut self, summary: &mut Summary) {
        while !self.in_flight.is_empty() {
            self.next_report(summary).await;
        }
        if let Some(why) = self.failure.take() {
            summary.stopped.get_or_insert(why);
        }
    }
}

/// Kafka refused the record itself at `send` (it stays healthy).
struct Refused {
    code: RDKafkaErrorCode,
    message: String,
}
