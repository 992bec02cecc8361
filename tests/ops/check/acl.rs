//! A Kafka ACL for a test. rust-rdkafka wraps no ACL admin call, so this
//! calls librdkafka's CreateAcls through rdkafka's own bindings.

use std::ffi::{c_char, CStr, CString};
use std::time::{Duration, Instant};

use rdkafka::admin::AdminClient;
use rdkafka::bindings as rd;
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;
use rdkafka::producer::{BaseProducer, Producer};
use rdkafka::types::RDKafkaErrorCode;

/// Server properties of a broker with ACLs that lets everyone do anything
/// on a resource without ACLs (so only what a test denies is denied).
pub const AUTHORIZER: &str =
    "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer\n\
     allow.everyone.if.no.acl.found=true";

/// Denies `User:ANONYMOUS` (every PLAINTEXT client) WRITE on the
/// transactional ids starting with `prefix`, and waits until the broker
/// applies it.
pub fn deny_transactional_ids(bootstrap: &str, prefix: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .expect("admin client");
    let name = CString::new(prefix).unwrap();
    let principal = CString::new("User:ANONYMOUS").unwrap();
    let host = CString::new("*").unwrap();
    let mut errstr = [0 as c_char; 512];
    let rk = admin.inner().native_ptr();
    // SAFETY: every pointer handed to librdkafka is valid for the call (the
    // CStrings and the buffer outlive it, `rk` lives as long as `admin`);
    // the binding, queue and event are destroyed once each, after their last
    // use; the result's array belongs to the event and is read before it
    // is destroyed.
    let outcome = unsafe {
        let mut binding = rd::rd_kafka_AclBinding_new(
            rd::rd_kafka_ResourceType_t::RD_KAFKA_RESOURCE_TRANSACTIONAL_ID,
            name.as_ptr(),
            rd::rd_kafka_ResourcePatternType_t::RD_KAFKA_RESOURCE_PATTERN_PREFIXED,
            principal.as_ptr(),
            host.as_ptr(),
            rd::rd_kafka_AclOperation_t::RD_KAFKA_ACL_OPERATION_WRITE,
            rd::rd_kafka_AclPermissionType_t::RD_KAFKA_ACL_PERMISSION_TYPE_DENY,
            errstr.as_mut_ptr(),
            errstr.len(),
        );
        assert!(
            !binding.is_null(),
            "AclBinding_new: {}",
            CStr::from_ptr(errstr.as_ptr()).to_string_lossy()
        );
        let queue = rd::rd_kafka_queue_new(rk);
        rd::rd_kafka_CreateAcls(rk, &mut binding, 1, std::ptr::null(), queue);
        let event = rd::rd_kafka_queue_poll(queue, 30_000);
        let outcome = if event.is_null() {
            Err("no CreateAcls result within 30 s".to_owned())
        } else if rd::rd_kafka_event_error(event)
            != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
        {
            Err(CStr::from_ptr(rd::rd_kafka_event_error_string(event))
                .to_string_lossy()
                .into_owned())
        } else {
            let result = rd::rd_kafka_event_CreateAcls_result(event);
            let mut n = 0;
            let acls = rd::rd_kafka_CreateAcls_result_acls(result, &mut n);
            (0..n)
                .map(|i| rd::rd_kafka_acl_result_error(*acls.add(i)))
                .find(|e| !e.is_null())
                .map_or(Ok(()), |e| {
                    Err(format!(
                        "{:?}",
                        RDKafkaErrorCode::from(rd::rd_kafka_error_code(e))
                    ))
                })
        };
        if !event.is_null() {
            rd::rd_kafka_event_destroy(event);
        }
        rd::rd_kafka_queue_destroy(queue);
        rd::rd_kafka_AclBinding_destroy(binding);
        outcome
    };
    outcome.unwrap_or_else(|e| panic!("CreateAcls: {e}"));

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
