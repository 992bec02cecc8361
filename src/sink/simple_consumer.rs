//! [`SimpleConsumer`]: reads partitions without a consumer group, with
//! librdkafka's simple (legacy) consumer calls (`rd_kafka_consume_start_queue`,
//! `rd_kafka_consume_queue`).
//!
//! Why not `assign()`: in librdkafka (2.12) `assign()` belongs to the group
//! handle, which exists only with a `group.id`, and that handle looks up
//! its group coordinator as soon as the client starts (FindCoordinator),
//! whether or not anything is committed. A principal without DESCRIBE on
//! the group got GroupAuthorizationFailed logged as an ERROR at every start,
//! and needed a group ACL for nothing. A consumer created without a
//! `group.id` has no group handle: it never asks for a coordinator, and the
//! simple consumer calls fetch from the partitions' leaders only.
//! rust-rdkafka does not wrap these calls, hence the bindings here.

use std::ffi::CString;
use std::time::Duration;

use rdkafka::bindings as rd;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

/// One record, or the error librdkafka reported for a partition.
pub(super) enum Fetched<'a> {
    Record {
        partition: i32,
        offset: i64,
        key: Option<&'a [u8]>,
        payload: Option<&'a [u8]>,
    },
    Error {
        partition: i32,
        code: RDKafkaErrorCode,
    },
}

/// Partitions of one topic being read from their first offset, on one
/// queue. Dropping it stops them.
pub(super) struct SimpleConsumer<'c> {
    consumer: &'c BaseConsumer,
    topic: String,
    rkt: *mut rd::rd_kafka_topic_t,
    queue: *mut rd::rd_kafka_queue_t,
    started: Vec<i32>,
}

impl<'c> SimpleConsumer<'c> {
    /// Starts reading `partitions` of `topic` from the beginning.
    /// `consumer` must have been created without a `group.id`.
    pub(super) fn start(
        consumer: &'c BaseConsumer,
        topic: &str,
        partitions: &[i32],
    ) -> Result<Self, String> {
        let name = CString::new(topic).map_err(|e| e.to_string())?;
        let rk = consumer.client().native_ptr();
        // SAFETY: `rk` lives as long as `consumer`, which outlives `self`;
        // a null topic configuration means the defaults.
        let rkt = unsafe { rd::rd_kafka_topic_new(rk, name.as_ptr(), std::ptr::null_mut()) };
        if rkt.is_null() {
            return Err(format!("cannot open topic {topic}: {}", last_error()));
        }
        // SAFETY: as above.
        let queue = unsafe { rd::rd_kafka_queue_new(rk) };
        let mut reading = SimpleConsumer {
            consumer,
            topic: topic.to_owned(),
            rkt,
            queue,
            started: Vec::new(),
        };
        for &p in partitions {
            // SAFETY: `rkt` and `queue` are live until `drop`.
            let rc = unsafe {
                rd::rd_kafka_consume_start_queue(
                    reading.rkt,
                    p,
                    rd::RD_KAFKA_OFFSET_BEGINNING as i64,
                    reading.queue,
                )
            };
            if rc != 0 {
                return Err(format!(
                    "cannot start reading partition {p}: {}",
                    last_error()
                ));
            }
            reading.started.push(p);
        }
        Ok(reading)
    }

    /// The next record or error within `timeout`, handed to `f` (the record
    /// is librdkafka's until `f` returns). `None` when nothing came.
    pub(super) fn next<T>(&self, timeout: Duration, f: impl FnOnce(Fetched<'_>) -> T) -> Option<T> {
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: `queue` is live; a non-null message is ours to destroy.
        let m = unsafe { rd::rd_kafka_consume_queue(self.queue, ms) };
        if m.is_null() {
            return None;
        }
        // SAFETY: non-null, and valid until destroyed below.
        let msg = unsafe { &*m };
        let bytes = |ptr: *mut std::ffi::c_void, len: usize| {
            // SAFETY: librdkafka's pointer and length, valid with `msg`.
            (!ptr.is_null()).then(|| unsafe { std::slice::from_raw_parts(ptr as *const u8, len) })
        };
        let fetched = if msg.err == rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            Fetched::Record {
                partition: msg.partition,
                offset: msg.offset,
                key: bytes(msg.key, msg.key_len),
                payload: bytes(msg.payload, msg.len),
            }
        } else {
            Fetched::Error {
                partition: msg.partition,
                code: msg.err.into(),
            }
        };
        let out = f(fetched);
        // SAFETY: destroyed once, after its last use.
        unsafe { rd::rd_kafka_message_destroy(m) };
        Some(out)
    }

    /// The next offset to be handed on, per started partition: past the
    /// last record and past transaction markers, which are never handed on.
    pub(super) fn positions(&self) -> Vec<(i32, Option<i64>)> {
        let mut tpl = TopicPartitionList::new();
        for &p in &self.started {
            tpl.add_partition(&self.topic, p);
        }
        // SAFETY: `rk` is live; librdkafka fills in the list it is given.
        let err = unsafe { rd::rd_kafka_position(self.consumer.client().native_ptr(), tpl.ptr()) };
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Vec::new();
        }
        tpl.elements()
            .iter()
            .map(|e| match e.offset() {
                Offset::Offset(next) => (e.partition(), Some(next)),
                _ => (e.partition(), None),
            })
            .collect()
    }
}

impl Drop for SimpleConsumer<'_> {
    fn drop(&mut self) {
        // SAFETY: each handle was created above and is destroyed once, the
        // partitions stopped before the queue and the topic go.
        unsafe {
            for &p in &self.started {
                rd::rd_kafka_consume_stop(self.rkt, p);
            }
            rd::rd_kafka_queue_destroy(self.queue);
            rd::rd_kafka_topic_destroy(self.rkt);
        }
    }
}

fn last_error() -> RDKafkaErrorCode {
    // SAFETY: reads this thread's last librdkafka error.
    unsafe { rd::rd_kafka_last_error() }.into()
}
