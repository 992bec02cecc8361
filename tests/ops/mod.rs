//! Operations: metrics and health endpoints, `outboxd check`, exit codes and
//! secrets in the output of every subcommand, logs, and the
//! Prometheus dashboards and alert rules, against real servers.

pub(crate) mod check;
mod cli;
mod env_overrides;
mod helm;
mod ledger_check;
mod logs;
mod metrics;
mod prometheus;
mod readiness;
