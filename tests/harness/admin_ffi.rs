//! The admin requests the rdkafka crate does not wrap (ACLs, SCRAM
//! credentials, leader elections), made through librdkafka's C API. Each
//! is the same round: queue the request on a queue of its own, wait for its
//! one result event, check the request's own error, then read the
//! per-resource results; only the first and the last step differ.

use std::ffi::CStr;

use rdkafka::bindings as rd;

/// One admin request on `rk`: `send` queues it on the queue it is given,
/// `read` turns the result event into the outcome once the request-level
/// error is known to be none. `what` names the call in the errors: no
/// result within `timeout_ms`, or the request's own error.
///
/// # Safety
/// `rk` is a live client handle for the whole call; `send` queues exactly
/// one admin request on the queue and nothing else; `read` keeps no pointer
/// into the event (it is destroyed when `read` returns).
pub unsafe fn admin_result<T>(
    rk: *mut rd::rd_kafka_t,
    what: &str,
    timeout_ms: i32,
    send: impl FnOnce(*mut rd::rd_kafka_queue_t),
    read: impl FnOnce(*mut rd::rd_kafka_event_t) -> Result<T, String>,
) -> Result<T, String> {
    // SAFETY: the caller's contract above; the queue and the event are
    // destroyed once each, after their last use.
    unsafe {
        let queue = rd::rd_kafka_queue_new(rk);
        send(queue);
        let event = rd::rd_kafka_queue_poll(queue, timeout_ms);
        let outcome = if event.is_null() {
            Err(format!("no {what} result within {} s", timeout_ms / 1000))
        } else if rd::rd_kafka_event_error(event)
            != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
        {
            Err(CStr::from_ptr(rd::rd_kafka_event_error_string(event))
                .to_string_lossy()
                .into_owned())
        } else {
            read(event)
        };
        if !event.is_null() {
            rd::rd_kafka_event_destroy(event);
        }
        rd::rd_kafka_queue_destroy(queue);
        outcome
    }
}
