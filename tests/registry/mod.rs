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
