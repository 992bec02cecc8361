//! Questions `outboxd check` asks the Kafka cluster, creating and producing
//! nothing: may a topic be created, does an idempotent producer get a
//! producer id (`producer_id`), do transactions work (`init_transactions`),
//! does the ledger topic keep enough copies (`ledger_replicas`), which
//! rights the principal has on a topic (`describe_topics` asks,
//! `topic_rights` judges).
//! The answers are facts; `cli::check` turns them into its lines.

pub(crate) mod describe_topics;
pub(crate) mod init_transactions;
pub(crate) mod ledger_replicas;
pub(crate) mod producer_id;
pub(crate) mod topic_rights;

use std::sync::Arc;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;

use crate::config::Config;
use crate::sink::config::admin_client_config;

/// One CreateTopics round trip, as the relay's topic manager allows.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The admin client `check` asks the cluster with, or why there is none.
pub(crate) fn admin_client(
    brokers: &str,
    cfg: &Config,
) -> Result<Arc<AdminClient<DefaultClientContext>>, String> {
    admin_client_config(brokers, &cfg.kafka.properties)
        .map_err(|e| e.to_string())
        .and_then(|c| {
            c.create::<AdminClient<DefaultClientContext>>()
                .map_err(|e| format!("cannot create the Kafka admin client: {e}"))
        })
        .map(Arc::new)
}

/// CreateTopics with `validate_only`: the broker runs every check (ACLs,
/// partitions, replication factor against live brokers, policies) and
/// creates nothing.
pub(crate) async fn validate_topic_creation(
    admin: &AdminClient<DefaultClientContext>,
    new: &NewTopic<'_>,
) -> Result<(), RDKafkaErrorCode> {
    let options = AdminOptions::new()
        .validate_only(true)
        .operation_timeout(Some(REQUEST_TIMEOUT))
        .request_timeout(Some(REQUEST_TIMEOUT));
    let results = admin
        .create_topics([new], &options)
        .await
        .map_err(|e| e.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail))?;
    for result in results {
        match result {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => return Err(code),
        }
    }
    Ok(())
}
