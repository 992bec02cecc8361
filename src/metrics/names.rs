//! Every metric outboxd exports, by name, with its meaning: the table in
//! README.md is written from this list, and code records through these
//! constants, never with ad-hoc name strings.

/// Events handed to Kafka and acknowledged, by topic (counter).
pub(crate) const EVENTS_PUBLISHED: &str = "outboxd_events_published_total";
/// Bytes (key + value + headers) of acknowledged events, by topic (counter).
pub(crate) const BYTES_PUBLISHED: &str = "outboxd_bytes_published_total";
/// Outbox events decoded from the WAL (counter).
pub(crate) const EVENTS_SEEN: &str = "outboxd_events_seen_total";
/// Changes and messages the slot sent that are not events, by reason (counter).
pub(crate) const EVENTS_FILTERED: &str = "outboxd_events_filtered_total";
/// Events sent to the dead-letter topic, by reason (counter).
pub(crate) const EVENTS_DEAD_LETTERED: &str = "outboxd_events_dead_lettered_total";
/// Failed deliveries, by error code and kind (counter).
pub(crate) const DELIVERY_FAILURES: &str = "outboxd_delivery_failures_total";
/// Reconnects of the whole pipeline, by cause (counter).
pub(crate) const RECONNECTS: &str = "outboxd_reconnects_total";
/// Transactions whose commit was read (counter).
pub(crate) const TRANSACTIONS: &str = "outboxd_transactions_total";
/// Events sent to Kafka and not yet acknowledged (gauge).
pub(crate) const IN_FLIGHT_EVENTS: &str = "outboxd_in_flight_events";
/// Bytes of those events (gauge).
pub(crate) const IN_FLIGHT_BYTES: &str = "outboxd_in_flight_bytes";
/// The window's size in events (gauge): `relay.max_in_flight_events`, in
/// exactly-once at least `relay.transaction_max_events`.
pub(crate) const IN_FLIGHT_EVENTS_LIMIT: &str = "outboxd_in_flight_events_limit";
/// `relay.max_in_flight_bytes` (gauge).
pub(crate) const IN_FLIGHT_BYTES_LIMIT: &str = "outboxd_in_flight_bytes_limit";
/// The slot position outboxd last confirmed, as a number (gauge).
pub(crate) const CONFIRMED_LSN: &str = "outboxd_confirmed_lsn";
/// The highest WAL position received from the server (gauge).
pub(crate) const RECEIVED_LSN: &str = "outboxd_received_lsn";
/// 1 while the relay is halted by a poison event under on_error = "stop" (gauge).
pub(crate) const HALTED: &str = "outboxd_halted";
/// The position ledger's last written position: every event up to it is
/// acknowledged by Kafka (gauge).
pub(crate) const LEDGER_LSN: &str = "outboxd_ledger_lsn";
/// Ledger writes that did not make their entry durable, by `reason`:
/// `stuck` (no answer within `kafka.ledger_write_timeout`; the producer was
/// replaced), `timed_out` (librdkafka gave up) or `refused` (counter).
pub(crate) const LEDGER_WRITE_FAILURES: &str = "outboxd_ledger_write_failures_total";
/// Seconds the position ledger has not held the newest entry the relay
/// wants written: 0 while it does, about a round trip while a write goes
/// well; it grows while writes hang or fail (gauge).
pub(crate) const LEDGER_LAG_SECONDS: &str = "outboxd_ledger_lag_seconds";
/// 1 while the relay refuses to start over a gap the ledger found, else 0 (gauge).
pub(crate) const LEDGER_GAP: &str = "outboxd_ledger_gap";
/// Events not sent again on a (re)start because the ledger has them as relayed (counter).
pub(crate) const EVENTS_SKIPPED: &str = "outboxd_events_skipped_total";
/// 1 while standing by: another instance streams the slot and this one waits
/// to take over (gauge).
pub(crate) const STANDBY: &str = "outboxd_standby";
/// 1 while connected, by side: `postgres` or `kafka` (gauge).
pub(crate) const CONNECTED: &str = "outboxd_connected";
/// Seconds the confirmed position has stood still while events were pending (gauge).
pub(crate) const STALL_SECONDS: &str = "outboxd_stall_seconds";
/// Seconds the oldest position ready to confirm (acknowledged by Kafka, in
/// exactly-once committed) has waited for the slot to be confirmed past
/// it; 0 when nothing waits (gauge). What a `kill -9` would repeat.
pub(crate) const CONFIRMATION_LAG_SECONDS: &str = "outboxd_confirmation_lag_seconds";
/// How long after its commit the last acknowledged event was acknowledged,
/// while anything is pending; 0 when idle.
pub(crate) const DELIVERY_LAG_SECONDS: &str = "outboxd_delivery_lag_seconds";
/// Seconds one look of the table watch took: one statement, a reconnect
/// included when it needed one (histogram).
pub(crate) const TABLE_WATCH_LOOK_SECONDS: &str = "outboxd_table_watch_look_seconds";
/// Kafka transactions of `relay.delivery = "exactly-once"`, by `outcome`:
/// `committed` or `aborted` (counter).
pub(crate) const KAFKA_TRANSACTIONS: &str = "outboxd_kafka_transactions_total";
/// Events per committed Kafka transaction (histogram).
pub(crate) const KAFKA_TRANSACTION_EVENTS: &str = "outboxd_kafka_transaction_events";
/// Seconds a Kafka transaction's commit took, the flush of its records
/// included (histogram).
pub(crate) const KAFKA_TRANSACTION_COMMIT_SECONDS: &str =
    "outboxd_kafka_transaction_commit_seconds";
/// Times another instance with the same transactional id fenced this one (counter).
pub(crate) const FENCED: &str = "outboxd_fenced_total";
/// Seconds from the PostgreSQL commit to the Kafka acknowledgement (histogram).
pub(crate) const COMMIT_TO_ACK_SECONDS: &str = "outboxd_commit_to_ack_seconds";
/// Seconds from receiving the event's WAL to the Kafka acknowledgement (histogram).
pub(crate) const WAL_RECEIVE_TO_ACK_SECONDS: &str = "outboxd_wal_receive_to_ack_seconds";
/// The server's current WAL position, sampled (gauge).
pub(crate) const SERVER_LSN: &str = "outboxd_server_lsn";
/// Current WAL position minus the slot's confirmed_flush_lsn (gauge).
pub(crate) const SLOT_LAG_BYTES: &str = "outboxd_slot_lag_bytes";
/// Current WAL position minus the slot's restart_lsn: WAL the slot pins (gauge).
pub(crate) const SLOT_RETAINED_WAL_BYTES: &str = "outboxd_slot_retained_wal_bytes";
/// 1 for the slot's current wal_status, 0 for the others, by status (gauge).
pub(crate) const SLOT_WAL_STATUS: &str = "outboxd_slot_wal_status";
/// WAL that may still be written before the slot is lost (gauge; NaN = no limit).
pub(crate) const SLOT_SAFE_WAL_SIZE_BYTES: &str = "outboxd_slot_safe_wal_size_bytes";
/// 1 while a walsender streams the slot (ours or anyone's) (gauge).
pub(crate) const SLOT_ACTIVE: &str = "outboxd_slot_active";
/// Average request round trip per broker, from librdkafka statistics (gauge).
pub(crate) const KAFKA_BROKER_RTT_SECONDS: &str = "outboxd_kafka_broker_rtt_seconds";
/// A record's wait in the producer's queue before it goes into a request
/// (librdkafka's `int_latency`), p50 and p99 per broker (gauge).
pub(crate) const KAFKA_QUEUE_LATENCY_SECONDS: &str = "outboxd_kafka_queue_latency_seconds";
/// A request's wait in the broker connection's output buffer before it is
/// written to the socket (`outbuf_latency`), p50 and p99 per broker (gauge).
pub(crate) const KAFKA_REQUEST_QUEUE_LATENCY_SECONDS: &str =
    "outboxd_kafka_request_queue_latency_seconds";
/// Request round trip (`rtt`), p50 and p99 per broker (gauge).
pub(crate) const KAFKA_REQUEST_RTT_SECONDS: &str = "outboxd_kafka_request_rtt_seconds";
/// Produce requests sent, per broker (counter): with the published events,
/// how full the requests are.
pub(crate) const KAFKA_PRODUCE_REQUESTS: &str = "outboxd_kafka_produce_requests_total";
/// Records in the producer's queues, not yet acknowledged (gauge).
pub(crate) const KAFKA_OUTBOUND_QUEUE_MESSAGES: &str = "outboxd_kafka_outbound_queue_messages";
/// Their bytes (gauge).
pub(crate) const KAFKA_OUTBOUND_QUEUE_BYTES: &str = "outboxd_kafka_outbound_queue_bytes";
/// Requests to the schema registry, by `outcome`: `ok`, `not_found`,
/// `unauthorized`, `error` (another answer) or `unavailable` (no answer,
/// or 5xx) (counter). Flat while events flow: schemas are cached.
pub(crate) const SCHEMA_REGISTRY_REQUESTS: &str = "outboxd_schema_registry_requests_total";
/// Schemas the relay holds from the registry, by id (gauge).
pub(crate) const SCHEMA_CACHE_ENTRIES: &str = "outboxd_schema_registry_cached_schemas";
/// Payloads that could not be encoded with their schema, after the one
/// re-read of a `latest` subject, by `subject` (the route) and `reason`
/// (`not_json`, `mismatch`, `encode`) (counter).
pub(crate) const ENCODE_FAILURES: &str = "outboxd_value_encode_failures_total";
/// Kafka producers the relay replaced, by `reason`: `refused` (a record the
/// broker refused ended it) or `stuck` (the watchdog, `kafka.stuck_after`:
/// unacknowledged too long while every partition had a leader) (counter).
pub(crate) const PRODUCER_REPLACEMENTS: &str = "outboxd_kafka_producer_replacements_total";
/// The `reason` labels of [`PRODUCER_REPLACEMENTS`].
pub(crate) const PRODUCER_REPLACEMENT_REASONS: [&str; 2] = ["refused", "stuck"];
/// Always 1, labelled with the version (gauge).
pub(crate) const BUILD_INFO: &str = "outboxd_build_info";

/// Debezium's streaming metrics (behind `metrics.debezium_aliases`).
pub(crate) const DBZ_MILLISECONDS_BEHIND_SOURCE: &str = "debezium_metrics_MilliSecondsBehindSource";
pub(crate) const DBZ_TOTAL_NUMBER_OF_EVENTS_SEEN: &str = "debezium_metrics_TotalNumberOfEventsSeen";
pub(crate) const DBZ_QUEUE_REMAINING_CAPACITY: &str = "debezium_metrics_QueueRemainingCapacity";
pub(crate) const DBZ_CONNECTED: &str = "debezium_metrics_Connected";
pub(crate) const DBZ_MILLISECONDS_SINCE_LAST_EVENT: &str =
    "debezium_metrics_MilliSecondsSinceLastEvent";

/// `reason` values of [`EVENTS_FILTERED`], in [`Filtered`]'s order.
pub(crate) const FILTERED_REASONS: [&str; 5] = [
    "other_table",
    "outbox_update",
    "outbox_delete",
    "outbox_truncate",
    "other_prefix_message",
];

/// `status` values of [`SLOT_WAL_STATUS`] (pg_replication_slots.wal_status).
pub(crate) const WAL_STATUSES: [&str; 4] = ["reserved", "extended", "unreserved", "lost"];
