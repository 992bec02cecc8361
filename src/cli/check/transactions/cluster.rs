//! What `outboxd check` learns from the cluster for the exactly-once lines:
//! the brokers' transaction settings, `__transaction_state`'s metadata, and
//! the probe's InitProducerId under the throwaway transactional id.

use std::sync::Arc;

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientContext;

use super::{BrokerSettings, Facts, Probe, PROBE_TIMEOUT, REQUEST_TIMEOUT, STATE_LOG};
use crate::config::Config;
use crate::sink::{producer_config, QueueBound};

pub(super) async fn facts(admin: &Arc<AdminClient<DefaultClientContext>>) -> Facts {
    let metadata = {
        let admin = Arc::clone(admin);
        tokio::task::spawn_blocking(move || {
            let md = admin
                .inner()
                .fetch_metadata(Some(STATE_LOG), REQUEST_TIMEOUT)?;
            let ids: Vec<i32> = md.brokers().iter().map(|b| b.id()).collect();
            let topic = md.topics().first().map(|t| {
                let isr: Vec<usize> = t.partitions().iter().map(|p| p.isr().len()).collect();
                (t.error(), isr)
            });
            Ok::<_, KafkaError>((ids, topic))
        })
        .await
        .unwrap_or(Err(KafkaError::Canceled))
    };
    let (ids, topic) = match metadata {
        Ok(m) => m,
        Err(e) => {
            let e = format!("no metadata: {e}");
            return Facts {
                brokers: 0,
                settings: Err(e.clone()),
                state_log: Err(e),
            };
        }
    };
    let state_log = match topic {
        None => Ok(None),
        Some((None, isr)) => Ok(Some(isr)),
        Some((Some(code), _)) => match RDKafkaErrorCode::from(code) {
            RDKafkaErrorCode::UnknownTopicOrPartition => Ok(None),
            // Being created: as good as existing for a coordinator.
            RDKafkaErrorCode::LeaderNotAvailable => Ok(None),
            code => Err(format!("{code:?}")),
        },
    };
    Facts {
        brokers: ids.len(),
        settings: broker_settings(admin, &ids).await,
        state_log,
    }
}

async fn broker_settings(
    admin: &AdminClient<DefaultClientContext>,
    ids: &[i32],
) -> Result<BrokerSettings, String> {
    let options = AdminOptions::new().request_timeout(Some(REQUEST_TIMEOUT));
    let specs: Vec<ResourceSpecifier<'_>> = ids
        .iter()
        .map(|id| ResourceSpecifier::Broker(*id))
        .collect();
    let results = admin
        .describe_configs(&specs, &options)
        .await
        .map_err(|e| e.to_string())?;
    let mut combined: Option<BrokerSettings> = None;
    for result in results {
        let resource = result.map_err(|code| format!("DescribeConfigs: {code:?}"))?;
        let value = |name: &str| -> Result<i64, String> {
            resource
                .get(name)
                .and_then(|e| e.value.as_deref())
                .ok_or_else(|| format!("{name} not reported"))?
                .parse::<i64>()
                .map_err(|e| format!("{name}: {e}"))
        };
        let this = BrokerSettings {
            replication_factor: i32::try_from(value("transaction.state.log.replication.factor")?)
                .map_err(|e| e.to_string())?,
            min_isr: i32::try_from(value("transaction.state.log.min.isr")?)
                .map_err(|e| e.to_string())?,
            max_timeout_ms: u64::try_from(value("transaction.max.timeout.ms")?)
                .map_err(|e| e.to_string())?,
        };
        combined = Some(match combined {
            None => this,
            Some(c) => BrokerSettings {
                replication_factor: c.replication_factor.max(this.replication_factor),
                min_isr: c.min_isr.max(this.min_isr),
                max_timeout_ms: c.max_timeout_ms.min(this.max_timeout_ms),
            },
        });
    }
    combined.ok_or_else(|| "no broker described".to_owned())
}

/// Keeps the probe's librdkafka logs and errors off the check's output:
/// its outcome is the line.
struct Quiet;

impl ClientContext for Quiet {
    fn log(&self, _: RDKafkaLogLevel, _: &str, _: &str) {}
    fn error(&self, _: KafkaError, _: &str) {}
}

impl ProducerContext for Quiet {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &rdkafka::producer::DeliveryResult<'_>, _: ()) {}
}

/// Initialises transactions under `probe_id` with the relay's producer
/// settings; produces nothing.
pub(super) async fn run_probe(brokers: &str, cfg: &Config, probe_id: &str) -> Probe {
    let mut config =
        match producer_config(brokers, &cfg.kafka.properties, QueueBound::of(&cfg.relay)) {
            Ok(c) => c,
            Err(e) => return Probe::Failed(e.to_string()),
        };
    config.set("transactional.id", probe_id);
    let producer: BaseProducer<Quiet> = match config.create_with_context(Quiet) {
        Ok(p) => p,
        Err(e) => return Probe::Failed(format!("cannot create the producer: {e}")),
    };
    tokio::task::spawn_blocking(move || {
        let outcome = producer.init_transactions(PROBE_TIMEOUT);
        // Dropping joins librdkafka's threads: here, not on the runtime.
        drop(producer);
        match outcome {
            Ok(()) => Probe::Initialised,
            Err(KafkaError::Transaction(e)) => Probe::from_error(e.code(), e.string()),
            Err(e) => Probe::from_error(
                e.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail),
                e.to_string(),
            ),
        }
    })
    .await
    .unwrap_or_else(|e| Probe::Failed(e.to_string()))
}
