//! [`authorized_operations`]: what the cluster lets this client do on each
//! of some topics (KIP-430, DescribeTopics with
//! `include_authorized_operations`), creating and producing nothing.
//!
//! rust-rdkafka 0.37 wraps neither DescribeTopics nor its option, hence
//! librdkafka's calls, here (as `sink::topic_config` does for
//! DescribeConfigs).

use std::ffi::{c_char, CStr, CString};
use std::sync::Arc;
use std::time::Duration;

use rdkafka::admin::AdminClient;
use rdkafka::bindings as rd;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientContext;

use crate::sink::topic_config::Owned;

pub(crate) use rd::rd_kafka_AclOperation_t as AclOperation;

/// What the cluster said about one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TopicAnswer {
    /// The operations the principal may perform on it; `None` when the
    /// broker did not report them (older than Kafka 2.3).
    Described(Option<Vec<AclOperation>>),
    /// The broker's error for this topic: UnknownTopicOrPartition when it
    /// does not exist, TopicAuthorizationFailed without DESCRIBE (Kafka
    /// does not tell such a principal whether the topic exists).
    Refused(RDKafkaErrorCode),
}

/// DescribeTopics for `topics` with their authorised operations, within
/// `timeout`: one answer per topic, in the order asked. `Err` is the
/// request's own error (no broker answered, a refused request).
pub(crate) async fn authorized_operations<C: ClientContext + 'static>(
    admin: &Arc<AdminClient<C>>,
    topics: &[String],
    timeout: Duration,
) -> Result<Vec<(String, TopicAnswer)>, RDKafkaErrorCode> {
    let (admin, topics) = (Arc::clone(admin), topics.to_vec());
    tokio::task::spawn_blocking(move || describe_blocking(&admin, &topics, timeout))
        .await
        .unwrap_or(Err(RDKafkaErrorCode::Fail))
}

fn describe_blocking<C: ClientContext>(
    admin: &AdminClient<C>,
    topics: &[String],
    timeout: Duration,
) -> Result<Vec<(String, TopicAnswer)>, RDKafkaErrorCode> {
    if topics.is_empty() {
        return Ok(Vec::new());
    }
    let names: Vec<CString> = topics
        .iter()
        .map(|t| CString::new(t.as_str()).map_err(|_| RDKafkaErrorCode::InvalidTopic))
        .collect::<Result<_, _>>()?;
    let mut pointers: Vec<*const c_char> = names.iter().map(|n| n.as_ptr()).collect();
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    let rk = admin.inner().native_ptr();
    // SAFETY: `rk` lives as long as `admin`; the names and their pointer
    // array outlive the calls that read them (the collection copies them);
    // every object made here is destroyed by its `Owned` after the last use
    // of what it owns (the event owns the result, its descriptions and
    // their operation arrays, all read before it is dropped); an error
    // returned by a setter is ours to destroy.
    unsafe {
        let collection = Owned(
            rd::rd_kafka_TopicCollection_of_topic_names(pointers.as_mut_ptr(), pointers.len()),
            rd::rd_kafka_TopicCollection_destroy,
        );
        let options = Owned(
            rd::rd_kafka_AdminOptions_new(
                rk,
                rd::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBETOPICS,
            ),
            rd::rd_kafka_AdminOptions_destroy,
        );
        let mut errstr = [0 as c_char; 256];
        rd::rd_kafka_AdminOptions_set_request_timeout(
            options.0,
            ms,
            errstr.as_mut_ptr(),
            errstr.len(),
        );
        let refused = rd::rd_kafka_AdminOptions_set_include_authorized_operations(options.0, 1);
        if !refused.is_null() {
            let code = rd::rd_kafka_error_code(refused);
            rd::rd_kafka_error_destroy(refused);
            return Err(code.into());
        }
        let queue = Owned(rd::rd_kafka_queue_new(rk), rd::rd_kafka_queue_destroy);
        rd::rd_kafka_DescribeTopics(rk, collection.0, options.0, queue.0);
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
        let result = rd::rd_kafka_event_DescribeTopics_result(event.0);
        if result.is_null() {
            return Err(RDKafkaErrorCode::Fail);
        }
        let mut n = 0;
        let described = rd::rd_kafka_DescribeTopics_result_topics(result, &mut n);
        let mut answers = Vec::with_capacity(n);
        for i in 0..n {
            let description = *described.add(i);
            let name = rd::rd_kafka_TopicDescription_name(description);
            if name.is_null() {
                continue;
            }
            let name = CStr::from_ptr(name).to_string_lossy().into_owned();
            let error = rd::rd_kafka_TopicDescription_error(description);
            let code = if error.is_null() {
                rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
            } else {
                rd::rd_kafka_error_code(error)
            };
            if code != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                answers.push((name, TopicAnswer::Refused(code.into())));
                continue;
            }
            let mut count = 0;
            let operations =
                rd::rd_kafka_TopicDescription_authorized_operations(description, &mut count);
            let operations = (!operations.is_null())
                .then(|| std::slice::from_raw_parts(operations, count).to_vec());
            answers.push((name, TopicAnswer::Described(operations)));
        }
        // In the order asked; a topic the answer left out is an error.
        Ok(topics
            .iter()
            .map(|t| {
                let answer = answers
                    .iter()
                    .find(|(name, _)| name == t)
                    .map_or(TopicAnswer::Refused(RDKafkaErrorCode::Fail), |(_, a)| {
                        a.clone()
                    });
                (t.clone(), answer)
            })
            .collect())
    }
}
