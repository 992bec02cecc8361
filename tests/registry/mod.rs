//! The registry value formats (issue 37) against a real schema registry,
//! PostgreSQL and Kafka.

mod avro;
mod check;
mod live;
mod tls;
