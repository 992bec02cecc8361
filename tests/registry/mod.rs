//! The registry value formats (issue 37) against a real schema registry,
//! PostgreSQL and Kafka.

mod auto_register;
mod avro;
mod check;
mod live;
mod tls;
