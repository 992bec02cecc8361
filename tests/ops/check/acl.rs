//! A Kafka ACL for the check's tests (see `harness::kafka_acl`).

use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::types::RDKafkaErrorCode;

use crate::harness::kafka_acl;

pub use crate::harness::kafka_acl::AUTHORIZER;

/// Denies `User:ANONYMOUS` (every PLAINTEXT client) WRITE on the
/// transactional ids starting with `prefix`, and waits until the broker
/// applies it.
pub fn deny_transactional_ids(bootstrap: &str, prefix: &str) {
    kafka_acl::deny_anonymous(
        bootstrap,
        kafka_acl::Resource::RD_KAFKA_RESOURCE_TRANSACTIONAL_ID,
        prefix,
        kafka_acl::Pattern::RD_KAFKA_RESOURCE_PATTERN_PREFIXED,
        kafka_acl::Operation::RD_KAFKA_ACL_OPERATION_WRITE,
    );
    // Applied once a transactional producer under the prefix is refused.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("transactional.id", format!("{prefix}acl-wait"))
            .create()
            .expect("producer");
        match producer.init_transactions(Duration::from_secs(10)) {
            Err(KafkaError::Transaction(e))
                if e.code() == RDKafkaErrorCode::TransactionalIdAuthorizationFailed =>
            {
                return
            }
            other => assert!(
                Instant::now() < deadline,
                "the ACL was not applied within 30 s: {other:?}"
            ),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
