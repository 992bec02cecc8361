//! [`describe_topic_config`]: one topic's configuration (DescribeConfigs),
//! or the broker's error for that topic.
//!
//! Why not rust-rdkafka's `describe_configs`: its result (0.37) reports
//! every resource as `Ok` and drops the resource's error, so a topic the
//! principal may not describe (or one the broker asked does not know yet)
//! comes back as a configuration with no entries. That is how a missing
//! `cleanup.policy` was once read as "delete" about a topic outboxd had
//! just created compacted. Hence librdkafka's calls, here.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::admin::AdminClient;
use rdkafka::bindings as rd;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientContext;

/// Each entry's value (`None` for a sensitive or unset one) by name.
pub(crate) type TopicConfig = BTreeMap<String, Option<String>>;

/// DescribeConfigs for `topic`, within `timeout`. `Err` is the request's
/// error, or the broker's for this topic (e.g. TopicAuthorizationFailed
/// without DESCRIBE_CONFIGS, UnknownTopicOrPartition from a broker that
/// has not applied a new topic yet).
pub(crate) async fn describe_topic_config<C: ClientContext + 'static>(
    admin: &Arc<AdminClient<C>>,
    topic: &str,
    timeout: Duration,
) -> Result<TopicConfig, RDKafkaErrorCode> {
    let (admin, topic) = (Arc::clone(admin), topic.to_owned());
    tokio::task::spawn_blocking(move || describe_blocking(&admin, &topic, timeout))
        .await
        .unwrap_or(Err(RDKafkaErrorCode::Fail))
}

/// A librdkafka object destroyed with its destructor when dropped.
pub(super) struct Owned<T>(pub(super) *mut T, pub(super) unsafe extern "C" fn(*mut T));

impl<T> Drop for Owned<T> {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: created by librdkafka, destroyed once, here.
            unsafe { (self.1)(self.0) }
        }
    }
}

fn describe_blocking<C: ClientContext>(
    admin: &AdminClient<C>,
    topic: &str,
    timeout: Duration,
) -> Result<TopicConfig, RDKafkaErrorCode> {
    let name = CString::new(topic).map_err(|_| RDKafkaErrorCode::InvalidTopic)?;
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    let rk = admin.inner().native_ptr();
    // SAFETY: `rk` lives as long as `admin`; every object made here is
    // destroyed by its `Owned` after the last use of what it owns (the
    // event owns the result and its resources).
    unsafe {
        let resource = Owned(
            rd::rd_kafka_ConfigResource_new(
                rd::rd_kafka_ResourceType_t::RD_KAFKA_RESOURCE_TOPIC,
                name.as_ptr(),
            ),
            rd::rd_kafka_ConfigResource_destroy,
        );
        let options = Owned(
            rd::rd_kafka_AdminOptions_new(
                rk,
                rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBECONFIGS,
            ),
            rd::rd_kafka_AdminOptions_destroy,
        );
        let mut errstr = [0 as std::ffi::c_char; 256];
        rd::rd_kafka_AdminOptions_set_request_timeout(
            options.0,
            ms,
            errstr.as_mut_ptr(),
            errstr.len(),
        );
        let queue = Owned(rd::rd_kafka_queue_new(rk), rd::rd_kafka_queue_destroy);
        let mut resources = [resource.0];
        rd::rd_kafka_DescribeConfigs(rk, resources.as_mut_ptr(), 1, options.0, queue.0);
        // The request's own timeout ends it first; the margin is for the
        // answer to reach the queue.
        let event = Owned(
            rd::rd_kafka_queue_poll(queue.0, ms.saturating_add(1000)),
            rd::rd_kafka_event_destroy,
        );
        if event.0.is_null() {
            return Err(RDKafkaErrorCode::OperationTimedOut);
        }
        let err = rd::rd_kafka_event_error(event.0);
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Err(err.into());
        }
        let result = rd::rd_kafka_event_DescribeConfigs_result(event.0);
        if result.is_null() {
            return Err(RDKafkaErrorCode::Fail);
        }
        let mut n = 0;
        let answered = rd::rd_kafka_DescribeConfigs_result_resources(result, &mut n);
        if n == 0 || answered.is_null() {
            return Err(RDKafkaErrorCode::Fail);
        }
        let answer = *answered;
        let err = rd::rd_kafka_ConfigResource_error(answer);
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Err(err.into());
        }
        let mut count = 0;
        let entries = rd::rd_kafka_ConfigResource_configs(answer, &mut count);
        let text = |p: *const std::ffi::c_char| {
            (!p.is_null()).then(|| CStr::from_ptr(p).to_string_lossy().into_owned())
        };
        let mut config = TopicConfig::new();
        for i in 0..count {
            let entry = *entries.add(i);
            if let Some(name) = text(rd::rd_kafka_ConfigEntry_name(entry)) {
                config.insert(name, text(rd::rd_kafka_ConfigEntry_value(entry)));
            }
        }
        Ok(config)
    }
}
