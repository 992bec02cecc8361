//! `[kafka]` → librdkafka client configuration, as pure functions.
//!
//! Three kinds of property:
//! - **enforced**: what ordered, gap-free delivery rests on. Set last, so
//!   nothing overrides them, and a `[kafka.properties]` entry contradicting
//!   one (or one of the settings idempotence implies) is an error naming it.
//! - **defaults**: outboxd's choice where librdkafka's does not suit a relay;
//!   the user may override each, under any of its librdkafka names.
//! - **derived**: the relay's producer queue (`queue.buffering.max.messages`)
//!   is sized to the relay's in-flight window ([`QueueBound`]), since the
//!   relay never holds more than that unacked; librdkafka's own default is
//!   100,000 records. An override above the window is refused (raise the
//!   window instead); one below it is allowed (the relay then waits for room
//!   in the queue). Its bytes are bounded by `relay.max_in_flight_bytes`
//!   (see [`queue_bound`]).
//! - everything else in `[kafka.properties]` (SASL, SSL, timeouts, tuning)
//!   passes through untouched; librdkafka validates it when the client is
//!   created.

use std::collections::BTreeMap;

use rdkafka::ClientConfig;

use super::error::SinkConfigError;
use crate::config::relay::DEFAULT_MAX_IN_FLIGHT_EVENTS;
use crate::config::RelayConfig;

/// librdkafka's default `message.max.bytes`: the largest record the producer
/// accepts unless `[kafka.properties]` says otherwise.
const LIBRDKAFKA_MESSAGE_MAX_BYTES: u64 = 1_000_000;

/// The highest `queue.buffering.max.messages` every librdkafka 2.x accepts.
const MAX_QUEUE_MESSAGES: usize = 10_000_000;

/// The relay's in-flight window (`relay.max_in_flight_events`, see
/// `RelayConfig::window_events`): what the producer's queue is sized to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QueueBound {
    pub events: usize,
}

impl QueueBound {
    /// Exactly-once adds the position ledger's record to a full window.
    pub(crate) fn of(relay: &RelayConfig) -> QueueBound {
        let ledger = usize::from(relay.delivery == crate::config::DeliveryMode::ExactlyOnce);
        QueueBound {
            events: relay.window_events() + ledger,
        }
    }
}

impl Default for QueueBound {
    fn default() -> Self {
        QueueBound {
            events: DEFAULT_MAX_IN_FLIGHT_EVENTS,
        }
    }
}

/// Properties outboxd sets on the producer whatever the configuration says.
pub(crate) const ENFORCED: [(&str, &str); 3] = [
    // Retries cannot duplicate or reorder; implies acks=all, max.in.flight ≤ 5
    // and unlimited retries.
    ("enable.idempotence", "true"),
    // A batch that fails for good becomes a fatal error instead of a silent
    // gap in the partition (later batches would otherwise still land).
    ("enable.gapless.guarantee", "true"),
    // Keys land on the partitions Java clients (and Kafka Streams, Connect)
    // pick; librdkafka's default (consistent_random) hashes with CRC32.
    ("partitioner", "murmur2_random"),
];

/// outboxd's defaults: `(property, its librdkafka aliases, value)`. A default
/// applies only if the user set none of the names.
pub(crate) const DEFAULTS: [(&str, &[&str], &str); 7] = [
    // One produce request in flight per broker: a later request can then
    // never overtake a refused earlier one. Idempotence alone does not
    // prevent that before Kafka 4.5: a broker with no state for the producer
    // on a partition (new, or just empty) accepts the later one, and the
    // earlier one's records then land after it or, as far as librdkafka can
    // tell, never (KAFKA-15591; the sink treats those acks as failures).
    // Kafka Connect runs source connectors this way too. With Kafka 4.5 or
    // later, up to 5 is safe and pipelines better over a slow link.
    (
        "max.in.flight.requests.per.connection",
        &["max.in.flight"],
        "1",
    ),
    // librdkafka's own default since 1.9; pinned so batching does not change
    // under us: 5 ms costs little latency next to a commit and batches well.
    ("linger.ms", &["queue.buffering.max.ms"], "5"),
    // Outbox payloads are JSON, which compresses several-fold; lz4 is the
    // cheapest codec in CPU, is built into librdkafka and every client reads it.
    ("compression.type", &["compression.codec"], "lz4"),
    // librdkafka waits 300 s before failing a message. A relay does better to
    // give up after 30 s: it reconnects and resumes from the slot, which also
    // re-resolves the brokers.
    ("message.timeout.ms", &["delivery.timeout.ms"], "30000"),
    // Producer default is true: a metadata request for a missing topic makes
    // a broker with auto.create.topics.enable create it with the broker's
    // defaults. Topics are created by the TopicManager, with kafka.topic_*.
    ("allow.auto.create.topics", &[], "false"),
    // A broker behind a link that drops packets without a reset: requests
    // time out after 30 s (librdkafka: 60 s), in step with
    // message.timeout.ms, so the relay reconnects within about the time it
    // gives PostgreSQL (postgres.stream_timeout); keepalives let the kernel
    // notice an idle dead connection and keep NAT entries alive.
    ("socket.timeout.ms", &[], "30000"),
    ("socket.keepalive.enable", &[], "true"),
];

/// Producer-only librdkafka properties (`P` in librdkafka's
/// CONFIGURATION.md), left out of the admin client's configuration.
/// `allow.auto.create.topics` is enforced there instead.
const PRODUCER_ONLY: [&str; 33] = [
    "transactional.id",
    "transaction.timeout.ms",
    "enable.idempotence",
    "enable.gapless.guarantee",
    "queue.buffering.max.messages",
    "queue.buffering.max.kbytes",
    "queue.buffering.max.ms",
    "linger.ms",
    "message.send.max.retries",
    "retries",
    "queue.buffering.backpressure.threshold",
    "compression.codec",
    "compression.type",
    "compression.level",
    "batch.num.messages",
    "batch.size",
    "delivery.report.only.error",
    "dr_cb",
    "dr_msg_cb",
    "sticky.partitioning.linger.ms",
    "request.required.acks",
    "acks",
    "request.timeout.ms",
    "message.timeout.ms",
    "delivery.timeout.ms",
    "queuing.strategy",
    "produce.offset.report",
    "partitioner",
    "partitioner_cb",
    "msg_order_cmp",
    "allow.auto.create.topics",
    "max.in.flight.requests.per.connection",
    "max.in.flight",
];

/// The producer's configuration: `bootstrap.servers` from `kafka.brokers`,
/// the user's `[kafka.properties]`, [`DEFAULTS`] where unset, [`ENFORCED`].
pub(crate) fn client_config(
    brokers: &str,
    properties: &BTreeMap<String, String>,
) -> Result<ClientConfig, SinkConfigError> {
    let brokers = checked_brokers(brokers)?;
    check_properties(properties)?;
    let mut config = ClientConfig::new();
    for (key, value) in properties {
        config.set(key, value);
    }
    apply_defaults(&mut config, properties, |_| true);
    for (key, value) in ENFORCED {
        config.set(key, value);
    }
    config.set("bootstrap.servers", brokers);
    Ok(config)
}

/// The relay's producer: [`client_config`] with its queue sized to `window`
/// (see [`queue_bound`]).
pub(crate) fn producer_config(
    brokers: &str,
    properties: &BTreeMap<String, String>,
    window: QueueBound,
) -> Result<ClientConfig, SinkConfigError> {
    let mut config = client_config(brokers, properties)?;
    for (key, value) in queue_bound(properties, window)? {
        config.set(key, value);
    }
    Ok(config)
}

/// `queue.buffering.max.messages` for a relay whose window is `window`,
/// where `[kafka.properties]` does not set it: the window's events. An
/// override above that is refused, naming it: it would bound nothing (the
/// relay never holds more unacknowledged), so the window is what to raise.
///
/// `queue.buffering.max.kbytes` stays librdkafka's (1 GiB): the relay stops
/// reading at `relay.max_in_flight_bytes` (plus the one event that crossed
/// it), which bounds the queue's bytes. Sized to that window, librdkafka
/// refused records long before it was reached (a 100-record queue of small
/// records was "full" at 80, in `relay::backpressure`). An override below
/// one record of `message.max.bytes` is refused: such a record never fits,
/// librdkafka answers "queue full" even to an empty queue, and the relay
/// would wait for room forever.
fn queue_bound(
    properties: &BTreeMap<String, String>,
    window: QueueBound,
) -> Result<Vec<(&'static str, String)>, SinkConfigError> {
    const MESSAGES: &str = "queue.buffering.max.messages";
    const KBYTES: &str = "queue.buffering.max.kbytes";
    let messages = window.events.clamp(1, MAX_QUEUE_MESSAGES);
    let mut derived = Vec::new();
    match properties.get(MESSAGES) {
        None => derived.push((MESSAGES, messages.to_string())),
        Some(v) => {
            if v.trim().parse::<u64>().is_ok_and(|n| n > messages as u64) {
                return Err(SinkConfigError::property(
                    MESSAGES,
                    v,
                    format!(
                        "above relay.max_in_flight_events ({messages}; in exactly-once at least \
                         relay.transaction_max_events, plus the ledger's record), which already \
                         bounds what the relay queues: raise relay.max_in_flight_events instead \
                         (a smaller value is fine: the relay then waits for room here)"
                    ),
                ));
            }
        }
    }
    let max_record = properties
        .get("message.max.bytes")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(LIBRDKAFKA_MESSAGE_MAX_BYTES);
    if let Some(v) = properties.get(KBYTES) {
        if v.trim()
            .parse::<u64>()
            .is_ok_and(|n| n.saturating_mul(1024) < max_record)
        {
            return Err(SinkConfigError::property(
                KBYTES,
                v,
                format!(
                    "below one record of message.max.bytes ({max_record} bytes): \
                     such a record never fits, and the relay would wait for room forever"
                ),
            ));
        }
    }
    Ok(derived)
}

/// The admin client's configuration (topic metadata and creation): the same
/// connection and security properties, none of the producer's, and never
/// broker-side auto-creation (a metadata request must not create the topic
/// it asks about).
pub(crate) fn admin_client_config(
    brokers: &str,
    properties: &BTreeMap<String, String>,
) -> Result<ClientConfig, SinkConfigError> {
    let brokers = checked_brokers(brokers)?;
    check_properties(properties)?;
    let mut config = ClientConfig::new();
    for (key, value) in properties {
        if !PRODUCER_ONLY.contains(&key.as_str()) {
            config.set(key, value);
        }
    }
    apply_defaults(&mut config, properties, |key| !PRODUCER_ONLY.contains(&key));
    config.set("allow.auto.create.topics", "false");
    config.set("bootstrap.servers", brokers);
    Ok(config)
}

/// Sets each of [`DEFAULTS`] that `applies` and the user set under none of
/// its names.
fn apply_defaults(
    config: &mut ClientConfig,
    properties: &BTreeMap<String, String>,
    applies: impl Fn(&str) -> bool,
) {
    for (key, aliases, value) in DEFAULTS {
        let set =
            properties.contains_key(key) || aliases.iter().any(|a| properties.contains_key(*a));
        if applies(key) && !set {
            config.set(key, value);
        }
    }
}

fn checked_brokers(brokers: &str) -> Result<&str, SinkConfigError> {
    let brokers = brokers.trim();
    if brokers.is_empty() {
        return Err(SinkConfigError::NoBrokers);
    }
    Ok(brokers)
}

fn check_properties(properties: &BTreeMap<String, String>) -> Result<(), SinkConfigError> {
    for (key, value) in properties {
        if let Some(reason) = contradiction(key, value) {
            return Err(SinkConfigError::property(key, value, reason));
        }
    }
    Ok(())
}

/// Why `key = value` cannot be allowed, if it cannot. Covers every librdkafka
/// name (aliases included) of a setting the guarantees rest on.
fn contradiction(key: &str, value: &str) -> Option<&'static str> {
    let v = value.trim().to_ascii_lowercase();
    let int = v.parse::<i64>().ok();
    match key {
        "bootstrap.servers" | "metadata.broker.list" => {
            Some("set the brokers with kafka.brokers instead, so there is one place to look")
        }
        "transactional.id" => Some(
            "set relay.delivery = \"exactly-once\" instead (and kafka.transactional_id \
             to choose the id): outboxd begins and commits the transactions itself",
        ),
        "enable.idempotence" if !is_true(&v) => Some(
            "must be true: without the idempotent producer a retried batch can be \
             duplicated or land after a later one",
        ),
        "enable.gapless.guarantee" if !is_true(&v) => Some(
            "must be true: without it a batch that fails for good leaves a gap \
             while later events of the same partition are still delivered",
        ),
        "acks" | "request.required.acks" if v != "all" && v != "-1" => Some(
            "must be all (or -1): the slot is confirmed on the acknowledgement, \
             which must mean every in-sync replica has the event",
        ),
        "max.in.flight.requests.per.connection" | "max.in.flight"
            if int.is_some_and(|n| n > 5) =>
        {
            Some("must be at most 5: the idempotent producer keeps order only up to 5 in-flight requests")
        }
        "retries" | "message.send.max.retries" if int == Some(0) => {
            Some("must not be 0: the idempotent producer needs to retry to keep order")
        }
        "partitioner" if v != "murmur2_random" => Some(
            "must be murmur2_random: any other partitioner puts keys on different \
             partitions than Java clients do",
        ),
        "delivery.report.only.error" if is_true(&v) => Some(
            "must be false: outboxd advances the slot from the reports of successful deliveries",
        ),
        "queuing.strategy" if v != "fifo" => {
            Some("must be fifo: any other strategy reorders events")
        }
        _ => None,
    }
}

/// librdkafka's spelling of a true boolean.
fn is_true(v: &str) -> bool {
    matches!(v, "true" | "t" | "1")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn rejected(key: &str, value: &str) -> String {
        let err = client_config("b:9092", &props(&[(key, value)])).unwrap_err();
        match &err {
            SinkConfigError::Property { key: k, .. } => assert_eq!(k, key),
            other => panic!("{other:?}"),
        }
        let text = err.to_string();
        assert!(
            text.starts_with(&format!("kafka.properties.\"{key}\"")),
            "{text}"
        );
        text
    }

    #[test]
    fn enforced_values_and_brokers_are_set() {
        let c = client_config(" b1:9092,b2:9092 ", &BTreeMap::new()).unwrap();
        assert_eq!(c.get("bootstrap.servers"), Some("b1:9092,b2:9092"));
        assert_eq!(c.get("enable.idempotence"), Some("true"));
        assert_eq!(c.get("enable.gapless.guarantee"), Some("true"));
        assert_eq!(c.get("partitioner"), Some("murmur2_random"));
        assert_eq!(c.get("statistics.interval.ms"), None);
        assert_eq!(c.get("transactional.id"), None);
    }

    #[test]
    fn the_producer_queue_is_sized_to_the_window() {
        let c = producer_config("b:9092", &BTreeMap::new(), QueueBound::default()).unwrap();
        assert_eq!(
            c.get("queue.buffering.max.messages"),
            Some(DEFAULT_MAX_IN_FLIGHT_EVENTS.to_string().as_str())
        );
        assert_eq!(c.get("queue.buffering.max.kbytes"), None);
        let window = QueueBound { events: 500 };
        let c = producer_config("b:9092", &BTreeMap::new(), window).unwrap();
        assert_eq!(c.get("queue.buffering.max.messages"), Some("500"));
        // Smaller than the window: allowed, the relay waits for room.
        let c = producer_config(
            "b:9092",
            &props(&[("queue.buffering.max.messages", "100")]),
            window,
        )
        .unwrap();
        assert_eq!(c.get("queue.buffering.max.messages"), Some("100"));
        // The ledger's producer and the check's probe are not sized.
        let c = client_config("b:9092", &BTreeMap::new()).unwrap();
        assert_eq!(c.get("queue.buffering.max.messages"), None);
    }

    #[test]
    fn a_queue_that_contradicts_the_window_is_refused_naming_the_key() {
        let refused = |key: &str, value: &str| {
            let err = producer_config("b:9092", &props(&[(key, value)]), QueueBound::default())
                .unwrap_err();
            let text = err.to_string();
            assert!(
                text.starts_with(&format!("kafka.properties.\"{key}\"")),
                "{text}"
            );
            text
        };
        let text = refused("queue.buffering.max.messages", "100000");
        assert!(text.contains("relay.max_in_flight_events (1536;"), "{text}");
        let text = refused("queue.buffering.max.kbytes", "100");
        assert!(text.contains("message.max.bytes (1000000 bytes)"), "{text}");
    }

    #[test]
    fn defaults_apply_when_unset() {
        let c = client_config("b:9092", &BTreeMap::new()).unwrap();
        assert_eq!(c.get("linger.ms"), Some("5"));
        assert_eq!(c.get("compression.type"), Some("lz4"));
        assert_eq!(c.get("message.timeout.ms"), Some("30000"));
        assert_eq!(c.get("allow.auto.create.topics"), Some("false"));
        assert_eq!(c.get("max.in.flight.requests.per.connection"), Some("1"));
        assert_eq!(c.get("socket.timeout.ms"), Some("30000"));
        assert_eq!(c.get("socket.keepalive.enable"), Some("true"));
        // The admin client's connections face the same dead links.
        let admin = admin_client_config("b:9092", &BTreeMap::new()).unwrap();
        assert_eq!(admin.get("socket.timeout.ms"), Some("30000"));
        assert_eq!(admin.get("socket.keepalive.enable"), Some("true"));
    }

    #[test]
    fn user_overrides_a_default() {
        let c = client_config(
            "b:9092",
            &props(&[("linger.ms", "50"), ("message.timeout.ms", "3000")]),
        )
        .unwrap();
        assert_eq!(c.get("linger.ms"), Some("50"));
        assert_eq!(c.get("message.timeout.ms"), Some("3000"));
    }

    #[test]
    fn an_alias_suppresses_the_default_instead_of_racing_it() {
        let c = client_config(
            "b:9092",
            &props(&[
                ("queue.buffering.max.ms", "50"),
                ("compression.codec", "zstd"),
                ("delivery.timeout.ms", "60000"),
            ]),
        )
        .unwrap();
        assert_eq!(c.get("linger.ms"), None);
        assert_eq!(c.get("queue.buffering.max.ms"), Some("50"));
        assert_eq!(c.get("compression.type"), None);
        assert_eq!(c.get("compression.codec"), Some("zstd"));
        assert_eq!(c.get("message.timeout.ms"), None);
        assert_eq!(c.get("delivery.timeout.ms"), Some("60000"));
    }

    #[test]
    fn security_and_tuning_pass_through() {
        let p = props(&[
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "SCRAM-SHA-512"),
            ("sasl.username", "relay"),
            ("sasl.password", "secret"),
            ("ssl.ca.location", "/etc/ca.pem"),
            ("client.id", "outboxd-1"),
            ("batch.size", "65536"),
        ]);
        let c = client_config("b:9092", &p).unwrap();
        for (k, v) in &p {
            assert_eq!(c.get(k), Some(v.as_str()), "{k}");
        }
    }

    #[test]
    fn values_agreeing_with_a_guarantee_are_accepted() {
        for (k, v) in [
            ("enable.idempotence", "true"),
            ("enable.idempotence", "True"),
            ("enable.gapless.guarantee", "1"),
            ("acks", "all"),
            ("acks", "-1"),
            ("request.required.acks", "ALL"),
            ("max.in.flight.requests.per.connection", "5"),
            ("max.in.flight", "1"),
            ("retries", "10"),
            ("message.send.max.retries", "2147483647"),
            ("partitioner", "murmur2_random"),
            ("delivery.report.only.error", "false"),
            ("queuing.strategy", "fifo"),
        ] {
            let c = client_config("b:9092", &props(&[(k, v)]))
                .unwrap_or_else(|e| panic!("{k}={v}: {e}"));
            assert_eq!(
                c.get(k),
                ENFORCED.iter().find(|e| e.0 == k).map(|e| e.1).or(Some(v))
            );
        }
    }

    #[test]
    fn contradicting_properties_are_rejected_with_their_key() {
        assert!(rejected("enable.idempotence", "false").contains("idempotent"));
        assert!(rejected("enable.gapless.guarantee", "false").contains("gap"));
        assert!(rejected("acks", "1").contains("all"));
        assert!(rejected("request.required.acks", "0").contains("all"));
        assert!(rejected("max.in.flight.requests.per.connection", "6").contains("at most 5"));
        assert!(rejected("max.in.flight", "100").contains("at most 5"));
        assert!(rejected("retries", "0").contains("retry"));
        assert!(rejected("message.send.max.retries", "0").contains("retry"));
        assert!(rejected("partitioner", "consistent_random").contains("Java clients"));
        assert!(rejected("partitioner", "murmur2").contains("Java clients"));
        assert!(rejected("transactional.id", "relay-1").contains("relay.delivery"));
        assert!(rejected("bootstrap.servers", "x:9092").contains("kafka.brokers"));
        assert!(rejected("metadata.broker.list", "x:9092").contains("kafka.brokers"));
        assert!(rejected("delivery.report.only.error", "true").contains("successful"));
        assert!(rejected("queuing.strategy", "lifo").contains("reorders"));
    }

    #[test]
    fn rejection_shows_the_value() {
        let text = rejected("acks", "1");
        assert!(text.contains("= \"1\""), "{text}");
    }

    #[test]
    fn empty_brokers_are_rejected() {
        assert_eq!(
            client_config("  ", &BTreeMap::new()).unwrap_err(),
            SinkConfigError::NoBrokers
        );
        assert!(SinkConfigError::NoBrokers
            .to_string()
            .contains("kafka.brokers"));
    }

    #[test]
    fn admin_config_keeps_connection_drops_producer_properties() {
        let p = props(&[
            ("security.protocol", "SSL"),
            ("ssl.ca.location", "/ca.pem"),
            ("client.id", "outboxd"),
            ("linger.ms", "50"),
            ("acks", "all"),
            ("allow.auto.create.topics", "true"),
        ]);
        let c = admin_client_config("b:9092", &p).unwrap();
        assert_eq!(c.get("bootstrap.servers"), Some("b:9092"));
        assert_eq!(c.get("security.protocol"), Some("SSL"));
        assert_eq!(c.get("ssl.ca.location"), Some("/ca.pem"));
        assert_eq!(c.get("client.id"), Some("outboxd"));
        assert_eq!(c.get("allow.auto.create.topics"), Some("false"));
        for key in ["linger.ms", "acks", "enable.idempotence", "partitioner"] {
            assert_eq!(c.get(key), None, "{key}");
        }
    }

    #[test]
    fn admin_config_rejects_the_same_contradictions() {
        let err = admin_client_config("b:9092", &props(&[("acks", "1")])).unwrap_err();
        assert!(err.to_string().contains("kafka.properties.\"acks\""));
    }

    /// librdkafka itself accepts every name and value we set (no typo in an
    /// enforced or default property, lz4 is built in).
    #[test]
    fn librdkafka_accepts_the_configuration() {
        let c = client_config("127.0.0.1:1", &props(&[("sasl.mechanism", "PLAIN")])).unwrap();
        let native = c.create_native_config().unwrap();
        assert_eq!(native.get("compression.codec").unwrap(), "lz4");
        assert_eq!(native.get("enable.gapless.guarantee").unwrap(), "true");
        admin_client_config("127.0.0.1:1", &BTreeMap::new())
            .unwrap()
            .create_native_config()
            .unwrap();
        // The queue bound at both ends of what a window can be.
        for window in [
            QueueBound::default(),
            QueueBound { events: 1 },
            QueueBound { events: usize::MAX },
        ] {
            let native = producer_config("127.0.0.1:1", &BTreeMap::new(), window)
                .unwrap()
                .create_native_config()
                .unwrap();
            assert!(native.get("queue.buffering.max.messages").is_ok());
        }
    }

    /// SASL PLAIN, SCRAM and OAUTHBEARER are built into librdkafka (with
    /// OpenSSL), so a producer using them starts without libsasl2; Kerberos
    /// (Cyrus SASL) is compiled in only with the `gssapi` feature. librdkafka
    /// picks the mechanism's provider when the client is created, so that is
    /// what is tried.
    #[test]
    fn builtin_sasl_mechanisms_need_no_libsasl2() {
        use rdkafka::producer::BaseProducer;
        for mechanism in ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] {
            let p = props(&[
                ("security.protocol", "SASL_PLAINTEXT"),
                ("sasl.mechanisms", mechanism),
                ("sasl.username", "u"),
                ("sasl.password", "p"),
            ]);
            client_config("127.0.0.1:1", &p)
                .unwrap()
                .create::<BaseProducer>()
                .unwrap_or_else(|e| panic!("{mechanism}: {e}"));
        }
        if !cfg!(feature = "gssapi") {
            let p = props(&[
                ("security.protocol", "SASL_PLAINTEXT"),
                ("sasl.mechanisms", "GSSAPI"),
            ]);
            let err = client_config("127.0.0.1:1", &p)
                .unwrap()
                .create::<BaseProducer>()
                .map(drop)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("No provider for SASL mechanism GSSAPI"),
                "{err}"
            );
        }
    }
}
