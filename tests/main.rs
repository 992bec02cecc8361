//! The integration suite: one test binary (one link on small machines), with
//! suites as submodules. Every test runs against real servers started by the
//! harness: a private PostgreSQL cluster per test and a real Kafka broker.

mod harness;
mod ops;
mod registry;
mod relay;
mod sink;
mod source;
