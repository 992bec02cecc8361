//! librdkafka statistics (`statistics.interval.ms`) to gauges, and to
//! [`Health`]'s view of the Kafka connection.

use std::sync::Arc;

use rdkafka::statistics::Statistics;

use super::health::Health;
use super::names::*;
use crate::sink::StatsHook;

/// The callback the relay hands its producer.
pub(crate) fn stats_hook(health: Arc<Health>) -> StatsHook {
    Arc::new(move |stats: &Statistics| record(stats, &health))
}

fn record(stats: &Statistics, health: &Health) {
    metrics::gauge!(KAFKA_OUTBOUND_QUEUE_MESSAGES).set(stats.msg_cnt as f64);
    metrics::gauge!(KAFKA_OUTBOUND_QUEUE_BYTES).set(stats.msg_size as f64);
    let mut any_up = false;
    for broker in stats.brokers.values() {
        // nodeid -1: the bootstrap placeholders and librdkafka's internal
        // broker; they stand for no real broker.
        if broker.nodeid < 0 {
            continue;
        }
        any_up |= broker.state == "UP";
        // Without requests in the window the average is 0, not a round trip.
        if let Some(rtt) = broker.rtt.as_ref().filter(|w| w.cnt > 0) {
            metrics::gauge!(KAFKA_BROKER_RTT_SECONDS, "broker" => broker.name.clone())
                .set(rtt.avg as f64 / 1e6);
        }
        let windows = [
            (KAFKA_QUEUE_LATENCY_SECONDS, &broker.int_latency),
            (KAFKA_REQUEST_QUEUE_LATENCY_SECONDS, &broker.outbuf_latency),
            (KAFKA_REQUEST_RTT_SECONDS, &broker.rtt),
        ];
        for (name, window) in windows {
            let Some(window) = window.as_ref().filter(|w| w.cnt > 0) else {
                continue;
            };
            for (quantile, us) in [("0.5", window.p50), ("0.99", window.p99)] {
                metrics::gauge!(name, "broker" => broker.name.clone(), "quantile" => quantile)
                    .set(us as f64 / 1e6);
            }
        }
        if let Some(&produce) = broker.req.get("Produce") {
            metrics::counter!(KAFKA_PRODUCE_REQUESTS, "broker" => broker.name.clone())
                .absolute(produce.max(0) as u64);
        }
    }
    if any_up {
        health.kafka_broker_up();
    }
}
