//! Operations: metrics and health endpoints, `outboxd check`, exit codes and
//! secrets in the output of every subcommand, logs, and the
//! Prometheus dashboards and alert rules, the container image built and run,
//! the plain release build without libcurl headers, and a small run of the
//! benchmark script, against real servers.

mod bench;
pub(crate) mod check;
mod cli;
mod delivery_lag;
mod env_overrides;
mod helm;
mod image;
mod ledger_check;
mod logs;
mod metrics;
mod plain_build;
mod prometheus;
mod readiness;
