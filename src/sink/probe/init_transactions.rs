//! Whether Kafka transactions work on the cluster, as `outboxd check` asks
//! before `relay.delivery = "exactly-once"`: the brokers' transaction
//! settings, `__transaction_state`'s metadata, and InitProducerId under a
//! throwaway transactional id (never the relay's own: initialising it bumps
//! its epoch and fences a running outboxd). Nothing is produced.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientContext;

use crate::config::Config;
use crate::sink::config::{producer_config, QueueBound};

/// The topic Kafka keeps transactions' state in.
pub(crate) const STATE_LOG: &str = "__transaction_state";
/// Metadata and DescribeConfigs round trips.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// InitProducerId: a healthy coordinator answers in well under a second; one
/// that cannot write its log makes librdkafka retry until this passes.
pub(crate) const PROBE_TIMEOUT: Duration = Duration::from_secs(15);

/// The brokers' transaction settings (DescribeConfigs of every broker),
/// combined the strict way: a transaction may land on any broker's
/// coordinator, so the lowest maximum and the highest requirements count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BrokerSettings {
    pub replication_factor: i32,
    pub min_isr: i32,
    pub max_timeout_ms: u64,
}

/// What the cluster looks like before the probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TransactionFacts {
    pub brokers: usize,
    /// `Err`: DescribeConfigs refused or failed (the reason).
    pub settings: Result<BrokerSettings, String>,
    /// `__transaction_state`: `None` when it does not exist yet, else the
    /// in-sync replica count of each partition; `Err`: metadata refused.
    pub state_log: Result<Option<Vec<usize>>, String>,
}

/// What initialising the throwaway transactional id said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Probe {
    /// Not run, because the state log cannot be written.
    NotRun,
    Initialised,
    /// The brokers do not know the transactional requests.
    Unsupported(String),
    /// No coordinator could register the id (state log not writable,
    /// brokers overloaded).
    NoCoordinator(String),
    /// TRANSACTIONAL_ID_AUTHORIZATION_FAILED.
    Unauthorized(String),
    /// INVALID_TRANSACTION_TIMEOUT.
    TimeoutRefused(String),
    Failed(String),
}

impl Probe {
    pub(crate) fn from_error(code: RDKafkaErrorCode, message: String) -> Probe {
        use RDKafkaErrorCode as C;
        let message = format!("{message} ({code:?})");
        match code {
            C::TransactionalIdAuthorizationFailed => Probe::Unauthorized(message),
            C::InvalidTransactionTimeout => Probe::TimeoutRefused(message),
            C::UnsupportedVersion | C::UnsupportedFeature | C::UnsupportedForMessageFormat => {
                Probe::Unsupported(message)
            }
            C::CoordinatorNotAvailable
            | C::NotCoordinator
            | C::CoordinatorLoadInProgress
            | C::NotEnoughReplicas
            | C::NotEnoughReplicasAfterAppend
            | C::OperationTimedOut
            | C::RequestTimedOut => Probe::NoCoordinator(message),
            _ => Probe::Failed(message),
        }
    }

    /// The coordinator answered InitProducerId (yes or no): transactions
    /// work on the cluster.
    pub(crate) fn coordinator_answered(&self) -> bool {
        matches!(
            self,
            Probe::Initialised | Probe::Unauthorized(_) | Probe::TimeoutRefused(_)
        )
    }
}

/// The cluster's transaction settings and state log, before the probe.
pub(crate) async fn transaction_facts(
    admin: &Arc<AdminClient<DefaultClientContext>>,
) -> TransactionFacts {
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
            return TransactionFacts {
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
    TransactionFacts {
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
pub(crate) async fn init_transactions(brokers: &str, cfg: &Config, probe_id: &str) -> Probe {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_errors_are_told_apart() {
        use RDKafkaErrorCode as C;
        let p = |c| Probe::from_error(c, "m".into());
        assert!(matches!(
            p(C::TransactionalIdAuthorizationFailed),
            Probe::Unauthorized(_)
        ));
        assert!(matches!(
            p(C::InvalidTransactionTimeout),
            Probe::TimeoutRefused(_)
        ));
        assert!(matches!(p(C::UnsupportedVersion), Probe::Unsupported(_)));
        assert!(matches!(
            p(C::CoordinatorNotAvailable),
            Probe::NoCoordinator(_)
        ));
        assert!(matches!(p(C::SaslAuthenticationFailed), Probe::Failed(_)));
    }
}
