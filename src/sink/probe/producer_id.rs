//! Whether the cluster lets an idempotent producer in, as `outboxd check`
//! asks: a producer with the relay's settings that never produces. An
//! idempotent producer asks for a producer id (InitProducerId) as soon as
//! it reaches a broker; a cluster that refuses it (no IDEMPOTENT_WRITE, no
//! WRITE on any topic) makes librdkafka raise a fatal error. librdkafka has
//! no API for "the id was assigned", so the probe watches its `eos` debug
//! log for the state change to `Assigned`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, Producer, ProducerContext};
use rdkafka::ClientContext;

use crate::config::Config;
use crate::sink::config::{producer_config, QueueBound};
use crate::sink::error::{SinkConfigError, SinkError};

/// For the producer id: a reachable cluster answers in well under a second.
const PRODUCER_ID_TIMEOUT: Duration = Duration::from_secs(10);
/// Between two looks at the probe's state.
const PROBE_POLL: Duration = Duration::from_millis(100);

/// Why the probe got no producer id.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProducerIdError {
    /// The relay's producer settings are refused.
    #[error(transparent)]
    Config(#[from] SinkConfigError),
    /// librdkafka would not create the producer.
    #[error(transparent)]
    Client(SinkError),
    /// The cluster refused the id, or gave none in time: why.
    #[error("{0}")]
    Refused(String),
}

/// Watches the idempotence state machine in librdkafka's debug log.
#[derive(Default)]
struct Watch {
    assigned: AtomicBool,
}

impl ClientContext for Watch {
    fn log(&self, _: RDKafkaLogLevel, fac: &str, message: &str) {
        // "Idempotent producer state change WaitPID -> Assigned"
        if fac == "IDEMPSTATE" && message.ends_with("-> Assigned") {
            self.assigned.store(true, Ordering::Release);
        }
    }

    fn error(&self, _: KafkaError, _: &str) {}
}

impl ProducerContext for Watch {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &rdkafka::producer::DeliveryResult<'_>, _: ()) {}
}

/// `Ok` once an idempotent producer with the relay's settings was given a
/// producer id; nothing is produced.
pub(crate) async fn producer_id(brokers: &str, cfg: &Config) -> Result<(), ProducerIdError> {
    // The relay's own producer configuration, so a property it would refuse
    // or that breaks the connection shows up here too.
    let window = QueueBound::of(&cfg.relay);
    let mut config = producer_config(brokers, &cfg.kafka.properties, window)?;
    config
        .set("debug", "eos")
        .set_log_level(RDKafkaLogLevel::Debug);
    let producer: BaseProducer<Watch> =
        config.create_with_context(Watch::default()).map_err(|e| {
            ProducerIdError::Client(SinkError::Client {
                client: "producer",
                source: e,
            })
        })?;
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + PRODUCER_ID_TIMEOUT;
        loop {
            // Serves the log events the probe watches.
            producer.poll(PROBE_POLL);
            if let Some((code, reason)) = producer.client().fatal_error() {
                return Err(format!("{reason} ({code:?})"));
            }
            if producer.context().assigned.load(Ordering::Acquire) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "no producer id within {}s",
                    PRODUCER_ID_TIMEOUT.as_secs()
                ));
            }
        }
    })
    .await
    .unwrap_or_else(|e| Err(e.to_string()))
    .map_err(ProducerIdError::Refused)
}
