//! Metric names, in one place, and the HTTP endpoint serving them with the
//! health checks.
//!
//! Every metric outboxd exports is declared here with its meaning; the table
//! in README.md is written from this list. Code records through these
//! constants and the helpers below, never with ad-hoc name strings.
//!
//! Files: `names` (every metric's name and meaning), `health` (the shared liveness/readiness state the relay updates),
//! `export` (gauges derived from it at scrape time, Debezium aliases),
//! `http` (the tiny HTTP/1.1 responder), `slot` (the slot sampler),
//! `kafka` (librdkafka statistics).

mod export;
pub(crate) mod health;
mod http;
pub(crate) mod kafka;
mod names;
pub mod slot;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use metrics::Counter;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

pub(crate) use health::Health;
pub(crate) use names::*;

use crate::source::assembler::IgnoredCounts;

/// Buckets for the latency histograms: 1 ms to 2 min, roughly x2.5 apart.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

/// Buckets for events per Kafka transaction: 1 to 100,000.
const TRANSACTION_EVENT_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 50.0, 100.0, 500.0, 1000.0, 2048.0, 5000.0, 10000.0, 100000.0,
];

/// How often histogram samples are folded in when nobody scrapes, so they
/// do not pile up in memory. The exporter keeps every sample (8 bytes, in
/// blocks of 64) until then, and the relay records two per event: every
/// 5 s, a drain at 40,000 events/s held up to 3.2 MiB of them (heaptrack
/// found 0.84 MiB in the heap's peak of one drain; docs/benchmarks.md,
/// "Histogram samples between upkeeps"). Every 500 ms it is at most
/// 0.3 MiB; folding costs the same per sample whenever it runs, and two
/// wake-ups a second are nothing to an idle relay.
const UPKEEP_INTERVAL: Duration = Duration::from_millis(500);

#[derive(Debug, thiserror::Error)]
#[error("cannot start the metrics endpoint on {addr} (metrics.listen): {reason}")]
pub struct MetricsError {
    pub addr: SocketAddr,
    pub reason: String,
}

/// Installs the global recorder and serves `/metrics`, `/healthz` and
/// `/readyz` on `addr`, answering from `health`. Must run inside a tokio
/// runtime. Binds before returning, so a taken port is an error here.
pub fn serve(addr: SocketAddr, health: Arc<Health>) -> Result<(), MetricsError> {
    let err = |reason: String| MetricsError { addr, reason };
    let listener = std::net::TcpListener::bind(addr)
        .and_then(|l| l.set_nonblocking(true).map(|()| l))
        .and_then(tokio::net::TcpListener::from_std)
        .map_err(|e| err(e.to_string()))?;
    let mut builder = PrometheusBuilder::new();
    let latencies = [
        COMMIT_TO_ACK_SECONDS,
        WAL_RECEIVE_TO_ACK_SECONDS,
        KAFKA_TRANSACTION_COMMIT_SECONDS,
        TABLE_WATCH_LOOK_SECONDS,
    ];
    for name in latencies {
        builder = builder
            .set_buckets_for_metric(Matcher::Full(name.to_string()), LATENCY_BUCKETS)
            .map_err(|e| err(e.to_string()))?;
    }
    builder = builder
        .set_buckets_for_metric(
            Matcher::Full(KAFKA_TRANSACTION_EVENTS.to_string()),
            TRANSACTION_EVENT_BUCKETS,
        )
        .map_err(|e| err(e.to_string()))?;
    let handle = builder.install_recorder().map_err(|e| err(e.to_string()))?;
    describe();
    metrics::gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(UPKEEP_INTERVAL).await;
            upkeep.run_upkeep();
        }
    });
    tokio::spawn(http::serve(listener, handle, health));
    tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
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
        EVENTS_FILTERED,
        "Changes and logical messages from the slot that are not events, by reason"
    );
    describe_counter!(
        EVENTS_DEAD_LETTERED,
        "Events sent to the dead-letter topic, by reason"
    );
    describe_counter!(
        DELIVERY_FAILURES,
        "Failed Kafka deliveries, by error code and kind"
    );
    describe_counter!(RECONNECTS, "Pipeline reconnects, by cause");
    describe_counter!(
        PRODUCER_REPLACEMENTS,
        "Kafka producers replaced, by reason (refused, stuck)"
    );
    describe_counter!(
        SCHEMA_REGISTRY_REQUESTS,
        "Requests to the schema registry, by outcome"
    );
    describe_gauge!(
        SCHEMA_CACHE_ENTRIES,
        "Schemas held from the schema registry, by id"
    );
    describe_counter!(
        ENCODE_FAILURES,
        "Payloads that do not fit their registered schema, or framed payloads that are no \
         frame or name an unknown schema id (subject empty), by subject and reason"
    );
    describe_counter!(TRANSACTIONS, "Committed transactions read from the slot");
    describe_counter!(
        KAFKA_TRANSACTIONS,
        "Kafka transactions (delivery = exactly-once), by outcome (committed, aborted)"
    );
    describe_histogram!(
        KAFKA_TRANSACTION_EVENTS,
        "Events per committed Kafka transaction"
    );
    describe_histogram!(
        KAFKA_TRANSACTION_COMMIT_SECONDS,
        Unit::Seconds,
        "Time a Kafka transaction's commit took, its records' flush included"
    );
    describe_counter!(
        FENCED,
        "Times another instance with the same transactional id fenced this one"
    );
    describe_gauge!(
        IN_FLIGHT_EVENTS,
        "Events sent to Kafka and not yet acknowledged"
    );
    describe_gauge!(
        IN_FLIGHT_BYTES,
        Unit::Bytes,
        "Bytes of unacknowledged events"
    );
    describe_gauge!(
        IN_FLIGHT_EVENTS_LIMIT,
        "relay.max_in_flight_events (in exactly-once at least relay.transaction_max_events)"
    );
    describe_gauge!(
        IN_FLIGHT_BYTES_LIMIT,
        Unit::Bytes,
        "relay.max_in_flight_bytes"
    );
    describe_gauge!(CONFIRMED_LSN, "Slot position last confirmed to PostgreSQL");
    describe_gauge!(RECEIVED_LSN, "Highest WAL position received");
    describe_gauge!(HALTED, "1 while halted by a poison event (on_error = stop)");
    describe_gauge!(
        LEDGER_LSN,
        "Position ledger's last written position (every event up to it acknowledged)"
    );
    describe_counter!(
        LEDGER_WRITE_FAILURES,
        "Position ledger writes that failed, by reason (stuck, timed_out, refused)"
    );
    describe_gauge!(
        LEDGER_LAG_SECONDS,
        Unit::Seconds,
        "Time the position ledger has not held the newest entry wanted (0: caught up)"
    );
    describe_gauge!(
        LEDGER_GAP,
        "1 while refusing to start over a gap the position ledger found"
    );
    describe_counter!(
        EVENTS_SKIPPED,
        "Events not sent again on a (re)start: at or below the ledger's position"
    );
    describe_gauge!(
        STANDBY,
        "1 while standing by for a slot another instance streams"
    );
    describe_gauge!(CONNECTED, "1 while connected, by side (postgres, kafka)");
    describe_gauge!(
        STALL_SECONDS,
        Unit::Seconds,
        "Time the confirmed position has stood still while events were pending"
    );
    describe_gauge!(
        CONFIRMATION_LAG_SECONDS,
        Unit::Seconds,
        "Wait of the oldest acknowledged position not yet confirmed to PostgreSQL (0: none waits)"
    );
    describe_gauge!(
        DELIVERY_LAG_SECONDS,
        Unit::Seconds,
        "Commit to Kafka acknowledgement of the last acknowledged event while events are pending (0: idle)"
    );
    describe_histogram!(
        TABLE_WATCH_LOOK_SECONDS,
        Unit::Seconds,
        "One look of the table watch at the outbox tables and the WAL position"
    );
    describe_histogram!(
        COMMIT_TO_ACK_SECONDS,
        Unit::Seconds,
        "PostgreSQL commit to Kafka acknowledgement"
    );
    describe_histogram!(
        WAL_RECEIVE_TO_ACK_SECONDS,
        Unit::Seconds,
        "Receipt of the event's WAL to Kafka acknowledgement"
    );
    describe_gauge!(SERVER_LSN, "The server's current WAL position (sampled)");
    describe_gauge!(
        SLOT_LAG_BYTES,
        Unit::Bytes,
        "Current WAL position minus the slot's confirmed_flush_lsn"
    );
    describe_gauge!(
        SLOT_RETAINED_WAL_BYTES,
        Unit::Bytes,
        "Current WAL position minus the slot's restart_lsn (WAL kept for the slot)"
    );
    describe_gauge!(SLOT_WAL_STATUS, "1 for the slot's current wal_status");
    describe_gauge!(
        SLOT_SAFE_WAL_SIZE_BYTES,
        Unit::Bytes,
        "WAL that can still be written before the slot is lost (NaN: no limit)"
    );
    describe_gauge!(SLOT_ACTIVE, "1 while the slot is being streamed");
    describe_gauge!(
        KAFKA_BROKER_RTT_SECONDS,
        Unit::Seconds,
        "Average request round trip per broker (librdkafka statistics)"
    );
    describe_gauge!(
        KAFKA_QUEUE_LATENCY_SECONDS,
        Unit::Seconds,
        "Wait of a record in the producer's queue before it goes into a request, by quantile (librdkafka int_latency)"
    );
    describe_gauge!(
        KAFKA_REQUEST_QUEUE_LATENCY_SECONDS,
        Unit::Seconds,
        "Wait of a request before it is written to the broker's socket, by quantile (librdkafka outbuf_latency)"
    );
    describe_gauge!(
        KAFKA_REQUEST_RTT_SECONDS,
        Unit::Seconds,
        "Request round trip per broker, by quantile (librdkafka rtt)"
    );
    describe_counter!(
        KAFKA_PRODUCE_REQUESTS,
        "Produce requests sent per broker (librdkafka statistics)"
    );
    describe_gauge!(
        KAFKA_OUTBOUND_QUEUE_MESSAGES,
        "Records in the producer's queues, not yet acknowledged"
    );
    describe_gauge!(
        KAFKA_OUTBOUND_QUEUE_BYTES,
        Unit::Bytes,
        "Bytes of records in the producer's queues"
    );
    describe_gauge!(BUILD_INFO, "Always 1; the version is a label");
}

/// Sets an LSN gauge. f64 holds LSNs exactly up to 2^53 bytes (8 PiB of WAL).
pub(crate) fn gauge_lsn(name: &'static str, lsn: crate::Lsn) {
    metrics::gauge!(name).set(lsn.0 as f64);
}

/// Turns the assembler's running [`IgnoredCounts`] into increments of
/// [`EVENTS_FILTERED`]. One per session (the counts restart with the
/// assembler); sampled, not called per change, so filtering stays free.
pub(crate) struct Filtered {
    counters: [Counter; 5],
    last: IgnoredCounts,
}

impl Filtered {
    /// Registers every reason, so each series exists (at 0) from the start.
    pub(crate) fn new() -> Filtered {
        Filtered {
            counters: FILTERED_REASONS.map(|r| metrics::counter!(EVENTS_FILTERED, "reason" => r)),
            last: IgnoredCounts::default(),
        }
    }

    pub(crate) fn update(&mut self, now: IgnoredCounts) {
        let pairs = [
            (now.other_table_changes, self.last.other_table_changes),
            (now.outbox_updates, self.last.outbox_updates),
            (now.outbox_deletes, self.last.outbox_deletes),
            (now.outbox_truncates, self.last.outbox_truncates),
            (now.other_prefix_messages, self.last.other_prefix_messages),
        ];
        for (counter, (now, last)) in self.counters.iter().zip(pairs) {
            if now > last {
                counter.increment(now - last);
            }
        }
        self.last = now;
    }
}

impl Default for Filtered {
    fn default() -> Self {
        Filtered::new()
    }
}
