//! Metric names, in one place, and the Prometheus endpoint.
//!
//! Every metric outboxd exports is declared here with its meaning; the table
//! in README.md is written from this list. Code records through the helpers
//! below, never with ad-hoc name strings.

use std::net::SocketAddr;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

/// Events handed to Kafka and acknowledged, by topic (counter).
pub const EVENTS_PUBLISHED: &str = "outboxd_events_published_total";
/// Bytes (key + value + headers) of acknowledged events, by topic (counter).
pub const BYTES_PUBLISHED: &str = "outboxd_bytes_published_total";
/// Outbox events decoded from the WAL (counter).
pub const EVENTS_SEEN: &str = "outboxd_events_seen_total";
/// Events sent to the dead-letter topic, by reason (counter).
pub const EVENTS_DEAD_LETTERED: &str = "outboxd_events_dead_lettered_total";
/// Failed deliveries, by error code and kind (counter).
pub const DELIVERY_FAILURES: &str = "outboxd_delivery_failures_total";
/// Reconnects of the whole pipeline, by cause (counter).
pub const RECONNECTS: &str = "outboxd_reconnects_total";
/// Transactions whose commit was read (counter).
pub const TRANSACTIONS: &str = "outboxd_transactions_total";
/// Events sent to Kafka and not yet acknowledged (gauge).
pub const IN_FLIGHT_EVENTS: &str = "outboxd_in_flight_events";
/// Bytes of those events (gauge).
pub const IN_FLIGHT_BYTES: &str = "outboxd_in_flight_bytes";
/// The slot position outboxd last confirmed, as a number (gauge).
pub const CONFIRMED_LSN: &str = "outboxd_confirmed_lsn";
/// The highest WAL position received from the server (gauge).
pub const RECEIVED_LSN: &str = "outboxd_received_lsn";
/// 1 while the relay is halted by a poison event under on_error = "stop" (gauge).
pub const HALTED: &str = "outboxd_halted";
/// Seconds from the PostgreSQL commit to the Kafka acknowledgement (histogram).
pub const COMMIT_TO_ACK_SECONDS: &str = "outboxd_commit_to_ack_seconds";

/// Buckets for the latency histogram: 1 ms to 2 min, roughly x2.5 apart.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

#[derive(Debug, thiserror::Error)]
#[error("cannot start the metrics endpoint on {addr} (metrics.listen): {reason}")]
pub struct MetricsError {
    pub addr: SocketAddr,
    pub reason: String,
}

/// Installs the global recorder and serves `/metrics` on `addr`. Must run
/// inside a tokio runtime.
pub fn serve(addr: SocketAddr) -> Result<(), MetricsError> {
    let err = |reason: String| MetricsError { addr, reason };
    PrometheusBuilder::new()
        .with_http_listener(addr)
        .set_buckets_for_metric(
            Matcher::Full(COMMIT_TO_ACK_SECONDS.to_string()),
            LATENCY_BUCKETS,
        )
        .map_err(|e| err(e.to_string()))?
        .install()
        .map_err(|e| err(e.to_string()))?;
    describe();
    Ok(())
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(EVENTS_PUBLISHED, "Events acknowledged by Kafka, by topic");
    describe_counter!(
        BYTES_PUBLISHED,
        Unit::Bytes,
        "Bytes of events acknowledged by Kafka, by topic"
    );
    describe_counter!(EVENTS_SEEN, "Outbox events decoded from the WAL");
    describe_counter!(
        EVENTS_DEAD_LETTERED,
        "Events sent to the dead-letter topic, by reason"
    );
    describe_counter!(
        DELIVERY_FAILURES,
        "Failed Kafka deliveries, by error code and kind"
    );
    describe_counter!(RECONNECTS, "Pipeline reconnects, by cause");
    describe_counter!(TRANSACTIONS, "Committed transactions read from the slot");
    describe_gauge!(
        IN_FLIGHT_EVENTS,
        "Events sent to Kafka and not yet acknowledged"
    );
    describe_gauge!(
        IN_FLIGHT_BYTES,
        Unit::Bytes,
        "Bytes of unacknowledged events"
    );
    describe_gauge!(CONFIRMED_LSN, "Slot position last confirmed to PostgreSQL");
    describe_gauge!(RECEIVED_LSN, "Highest WAL position received");
    describe_gauge!(HALTED, "1 while halted by a poison event (on_error = stop)");
    describe_histogram!(
        COMMIT_TO_ACK_SECONDS,
        Unit::Seconds,
        "PostgreSQL commit to Kafka acknowledgement"
    );
}

/// Sets an LSN gauge. f64 holds LSNs exactly up to 2^53 bytes (8 PiB of WAL).
pub fn gauge_lsn(name: &'static str, lsn: crate::Lsn) {
    metrics::gauge!(name).set(lsn.0 as f64);
}
