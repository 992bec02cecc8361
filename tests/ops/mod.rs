//! Operations: metrics and health endpoints, `outboxd check`, exit codes and
//! secrets in the output of every subcommand, logs, and the
//! Prometheus dashboards and alert rules, against real servers.

mod check;
mod cli;
mod helm;
mod logs;
mod metrics;
mod prometheus;
mod readiness;
