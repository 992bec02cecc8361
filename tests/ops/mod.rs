//! Operations: metrics and health endpoints, `outboxd check`, logs, and the
//! Prometheus dashboards and alert rules, against real servers.

mod check;
mod helm;
mod logs;
mod metrics;
mod prometheus;
mod readiness;
