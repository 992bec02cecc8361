//! The registry value formats (issue 37) against a real schema registry,
//! PostgreSQL and Kafka.

mod auto_register;
mod avro;
mod check;
mod cloudevents;
mod framed;
mod json_schema;
mod live;
mod subjects;
mod tls;

use crate::harness::relay::Env;

/// Inserts outbox rows in one statement; each of `values` is one row's
/// `(aggregate_type, aggregate_id, event_type, payload)` tuple in SQL.
fn insert_rows(e: &Env, values: &[String]) {
    e.pg.psql(
        "app",
        &format!(
            "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) VALUES {}",
            values.join(", ")
        ),
    );
}
