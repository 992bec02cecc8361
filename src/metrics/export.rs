//! Gauges derived from [`Health`], set right before each scrape is rendered:
//! time-based values (stall, time since the last event) are exact at scrape
//! time, and the relay pays nothing for them.

use super::health::Health;
use super::names::*;

pub(super) fn refresh(health: &Health) {
    let flag = |b: bool| if b { 1.0 } else { 0.0 };
    metrics::gauge!(CONNECTED, "side" => "postgres").set(flag(health.postgres_connected()));
    metrics::gauge!(CONNECTED, "side" => "kafka").set(flag(health.kafka_connected()));
    metrics::gauge!(STANDBY).set(flag(health.standby().is_some()));
    metrics::gauge!(STALL_SECONDS).set(health.stall().as_secs_f64());
    metrics::gauge!(DELIVERY_LAG_SECONDS).set(health.delivery_lag().as_secs_f64());
    if let Some(slot) = &health.debezium_name {
        debezium(health, slot);
    }
}

/// Debezium's streaming metrics as its JMX exporter names them, for
/// dashboards and alerts written against a Debezium PostgreSQL connector.
/// Debezium's -1 stands for "no event yet".
fn debezium(health: &Health, slot: &str) {
    let labels = [
        ("plugin", "postgres".to_string()),
        ("context", "streaming".to_string()),
        ("name", slot.to_string()),
    ];
    let behind = health.behind_ms().map_or(-1.0, |v| v as f64);
    metrics::gauge!(DBZ_MILLISECONDS_BEHIND_SOURCE, &labels).set(behind);
    metrics::gauge!(DBZ_TOTAL_NUMBER_OF_EVENTS_SEEN, &labels).set(health.events_seen() as f64);
    let remaining = health
        .max_in_flight_events
        .saturating_sub(health.in_flight());
    metrics::gauge!(DBZ_QUEUE_REMAINING_CAPACITY, &labels).set(remaining as f64);
    let connected = if health.postgres_connected() {
        1.0
    } else {
        0.0
    };
    metrics::gauge!(DBZ_CONNECTED, &labels).set(connected);
    let since = health.since_last_event_ms().map_or(-1.0, |v| v as f64);
    metrics::gauge!(DBZ_MILLISECONDS_SINCE_LAST_EVENT, &labels).set(since);
}
