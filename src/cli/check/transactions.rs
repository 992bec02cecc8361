//! The exactly-once half of `outboxd check` (`relay.delivery =
//! "exactly-once"`): the brokers run transactions, the transaction state log
//! can be written, the principal may use the transactional id, and the
//! producer's `transaction.timeout.ms` is within the brokers' maximum.
//!
//! The relay's own transactional id is never initialised here: that bumps
//! its epoch and fences a running outboxd (or a standby's next takeover).
//! The probe initialises a throwaway id instead, the relay's with
//! [`PROBE_SUFFIX`], and produces nothing. A prefixed ACL on the relay's id
//! covers both; one written for exactly the relay's id does not, and the
//! FAIL line says so. The probe's id stays in `__transaction_state` until
//! the brokers' `transactional.id.expiration.ms` (7 days by default).
//!
//! What can be read without the probe is read first, from the brokers'
//! configuration (DescribeConfigs) and `__transaction_state`'s metadata: a
//! state log that cannot be written would only make the probe wait out its
//! timeout.

use crate::config::kafka::DEFAULT_TRANSACTION_TIMEOUT_MS;
use crate::config::Config;
use crate::sink::probe::admin_client;
use crate::sink::probe::init_transactions::{
    init_transactions, transaction_facts, Probe, TransactionFacts, PROBE_TIMEOUT, STATE_LOG,
};
use crate::sink::{producer_config, QueueBound};

use super::line::{Line, Verdict};

/// The check's lines, in order.
pub(crate) const NAMES: [&str; 4] = [
    "transactions",
    "txn state log",
    "transactional id",
    "txn timeout",
];

/// Appended to the relay's transactional id for the probe's.
pub(crate) const PROBE_SUFFIX: &str = ".check";
/// Kafka's default `transaction.max.timeout.ms` (15 minutes).
const KAFKA_DEFAULT_MAX_TIMEOUT_MS: u64 = 900_000;

pub(crate) fn skipped(why: &str) -> Vec<Line> {
    NAMES.iter().map(|n| Line::skip(n, why)).collect()
}

/// The relay's transactional id and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TransactionalId {
    pub id: String,
    pub origin: &'static str,
}

/// The producer's timeouts the transactions depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timeouts {
    /// `transaction.timeout.ms`.
    pub transaction_ms: u64,
    /// Where it came from.
    pub origin: &'static str,
    /// `message.timeout.ms` as the relay's producer has it (outboxd's
    /// default 30000 unless `[kafka.properties]` sets it).
    pub message_ms: Option<u64>,
}

pub(crate) async fn check(
    brokers: String,
    cfg: Config,
    id: Result<TransactionalId, String>,
) -> Vec<Line> {
    let admin = match admin_client(&brokers, &cfg) {
        Ok(admin) => admin,
        Err(e) => {
            let mut lines = skipped("no Kafka client (see kafka)");
            lines[0] = Line::fail("transactions", e);
            return lines;
        }
    };
    let facts = transaction_facts(&admin).await;
    let timeouts = match configured_timeouts(&brokers, &cfg) {
        Ok(t) => t,
        Err(line) => {
            let mut lines = skipped("transaction.timeout.ms is not usable (see txn timeout)");
            lines[3] = line;
            return lines;
        }
    };
    let state_log = state_log_line(&facts);
    let probe = match &id {
        Ok(id) if state_log.verdict != Verdict::Fail => {
            init_transactions(&brokers, &cfg, &format!("{}{PROBE_SUFFIX}", id.id)).await
        }
        _ => Probe::NotRun,
    };
    decide(&cfg, &facts, state_log, timeouts, id, &probe)
}

/// The four lines, from the facts and the probe.
pub(crate) fn decide(
    cfg: &Config,
    facts: &TransactionFacts,
    state_log: Line,
    timeouts: Timeouts,
    id: Result<TransactionalId, String>,
    probe: &Probe,
) -> Vec<Line> {
    let probe_id = id.as_ref().map(|i| format!("{}{PROBE_SUFFIX}", i.id));
    let transactions = match (probe, &id) {
        (_, Err(why)) => Line::skip("transactions", why),
        (Probe::NotRun, _) => Line::skip(
            "transactions",
            "the transaction state log cannot be written (see txn state log)",
        ),
        (p, _) if p.coordinator_answered() => Line::ok(
            "transactions",
            format!(
                "the brokers answered the transactional requests of the check's own id {:?}; \
                 nothing was produced",
                probe_id.as_deref().unwrap_or_default()
            ),
        ),
        (Probe::Unsupported(e), _) => Line::fail(
            "transactions",
            format!(
                "the brokers do not support transactions: {e}; every broker must run Kafka 0.11 \
                 or newer (Kafka 2.5 or newer recommended), or set relay.delivery = \
                 \"at-least-once\""
            ),
        ),
        (Probe::NoCoordinator(e), _) => Line::fail(
            "transactions",
            format!(
                "no transaction coordinator registered the check's id within {}s: {e}; the \
                 brokers cannot write {STATE_LOG} (see txn state log) or are overloaded; their \
                 logs say which",
                PROBE_TIMEOUT.as_secs()
            ),
        ),
        (Probe::Failed(e), _) => Line::fail(
            "transactions",
            format!("initialising the check's transactional id failed: {e}"),
        ),
        _ => unreachable!("every probe outcome is covered above"),
    };
    // A registered id was written to the state log with its min.isr: the
    // probe's success settles it whatever the configuration could say.
    let state_log = match (probe.coordinator_answered(), state_log.verdict) {
        (true, Verdict::Warn) => Line::ok(
            "txn state log",
            format!("the probe's id was written to it ({})", state_log.detail),
        ),
        _ => state_log,
    };
    let transactional_id = match (&id, probe) {
        (Err(why), _) => Line::skip("transactional id", why),
        (Ok(id), Probe::Initialised) => Line::ok(
            "transactional id",
            format!(
                "{:?} ({}): the principal may use it; the check initialised {:?} instead, since \
                 initialising the relay's own id would fence a running outboxd",
                id.id,
                id.origin,
                probe_id.as_deref().unwrap_or_default()
            ),
        ),
        (Ok(id), Probe::Unauthorized(e)) => Line::fail(
            "transactional id",
            format!(
                "the principal may not use transactional id {:?}: {e}; grant it WRITE and \
                 DESCRIBE on the TransactionalId resource with a prefixed pattern {:?} (covering \
                 the relay's {:?} ({}) and this check's), e.g. kafka-acls.sh --add \
                 --allow-principal User:<outboxd's principal> --operation Write --operation \
                 Describe --transactional-id '{}' --resource-pattern-type prefixed",
                probe_id.as_deref().unwrap_or_default(),
                id.id,
                id.id,
                id.origin,
                id.id
            ),
        ),
        (Ok(_), _) => Line::skip(
            "transactional id",
            "the coordinator did not get as far as authorising it (see transactions)",
        ),
    };
    let timeout = timeout_line(cfg, facts, timeouts, probe);
    vec![transactions, state_log, transactional_id, timeout]
}

/// `transaction.timeout.ms` from `[kafka.properties]`, or librdkafka's
/// default, with where it came from, and the producer's message timeout.
fn configured_timeouts(brokers: &str, cfg: &Config) -> Result<Timeouts, Line> {
    let (transaction_ms, origin) = match cfg.kafka.properties.get("transaction.timeout.ms") {
        None => (DEFAULT_TRANSACTION_TIMEOUT_MS, "librdkafka's default"),
        Some(v) => match v.trim().parse::<u64>() {
            Ok(ms) => (ms, "kafka.properties"),
            Err(_) => {
                return Err(Line::fail(
                    "txn timeout",
                    format!(
                        "kafka.properties.\"transaction.timeout.ms\" = {v:?} is not a number of \
                         milliseconds; write e.g. \"60000\""
                    ),
                ))
            }
        },
    };
    // The relay's producer settings, outboxd's defaults included.
    let message_ms = producer_config(brokers, &cfg.kafka.properties, QueueBound::of(&cfg.relay))
        .ok()
        .and_then(|c| {
            ["message.timeout.ms", "delivery.timeout.ms"]
                .iter()
                .find_map(|k| c.get(k).and_then(|v| v.trim().parse::<u64>().ok()))
        });
    Ok(Timeouts {
        transaction_ms,
        origin,
        message_ms,
    })
}

fn timeout_line(cfg: &Config, facts: &TransactionFacts, timeouts: Timeouts, probe: &Probe) -> Line {
    const NAME: &str = "txn timeout";
    let (configured, origin) = (timeouts.transaction_ms, timeouts.origin);
    let setting = format!("transaction.timeout.ms = {configured} ({origin})");
    let max_delay_ms = cfg.relay.transaction_max_delay.as_millis();
    let fix_high = |max: &str| {
        format!(
            "{setting} is above the brokers' transaction.max.timeout.ms{max}, so they refuse to \
             start a transaction; lower kafka.properties.\"transaction.timeout.ms\" to at most \
             that, or raise transaction.max.timeout.ms on the brokers"
        )
    };
    if let Ok(s) = &facts.settings {
        if configured > s.max_timeout_ms {
            return Line::fail(NAME, fix_high(&format!(" = {}", s.max_timeout_ms)));
        }
    }
    if let Probe::TimeoutRefused(e) = probe {
        return Line::fail(NAME, format!("{}: {e}", fix_high("")));
    }
    if let Some(message_ms) = timeouts.message_ms.filter(|m| *m > configured) {
        return Line::fail(
            NAME,
            format!(
                "{setting} is below message.timeout.ms = {message_ms}, which librdkafka refuses \
                 for a transactional producer; raise kafka.properties.\"transaction.timeout.ms\" \
                 to at least {message_ms}, or lower kafka.properties.\"message.timeout.ms\""
            ),
        );
    }
    if u128::from(configured) <= max_delay_ms {
        return Line::fail(
            NAME,
            format!(
                "{setting} is not above relay.transaction_max_delay ({max_delay_ms} ms): the \
                 coordinator would abort transactions before the relay commits them; keep it \
                 well above (librdkafka's default, 60000, suits delays up to seconds)"
            ),
        );
    }
    match &facts.settings {
        Ok(s) => Line::ok(
            NAME,
            format!(
                "{setting} <= the brokers' transaction.max.timeout.ms = {}",
                s.max_timeout_ms
            ),
        ),
        Err(e) => Line::warn(
            NAME,
            format!(
                "{setting}; the brokers' transaction.max.timeout.ms is unknown ({e}; Kafka's \
                 default is {KAFKA_DEFAULT_MAX_TIMEOUT_MS}){}",
                if probe.coordinator_answered() {
                    ", but a coordinator accepted it"
                } else {
                    ""
                }
            ),
        ),
    }
}

/// Whether `__transaction_state` can be written: it exists with enough
/// in-sync replicas in every partition, or the brokers can create it.
pub(crate) fn state_log_line(facts: &TransactionFacts) -> Line {
    const NAME: &str = "txn state log";
    let brokers = facts.brokers;
    let settings = match &facts.settings {
        Ok(s) => s,
        Err(e) => {
            return Line::warn(
                NAME,
                format!(
                    "cannot read the brokers' transaction.state.log.* settings ({e}); grant \
                     DESCRIBE_CONFIGS on the cluster to check them"
                ),
            )
        }
    };
    let (rf, min_isr) = (settings.replication_factor, settings.min_isr);
    let settings_text = format!(
        "transaction.state.log.replication.factor = {rf}, transaction.state.log.min.isr = \
         {min_isr}, {brokers} broker(s)"
    );
    match &facts.state_log {
        Ok(Some(isr)) => {
            let short = isr
                .iter()
                .filter(|n| i64::try_from(**n).unwrap_or(i64::MAX) < i64::from(min_isr))
                .count();
            if short > 0 {
                Line::fail(
                    NAME,
                    format!(
                        "{short} of {} partition(s) of {STATE_LOG} have fewer in-sync replicas \
                         than transaction.state.log.min.isr = {min_isr}, so transactions using \
                         them cannot start or commit; bring the missing brokers back, or lower \
                         transaction.state.log.min.isr on the brokers",
                        isr.len()
                    ),
                )
            } else {
                Line::ok(
                    NAME,
                    format!(
                        "{STATE_LOG} exists, {} partition(s), each with at least min.isr = \
                         {min_isr} in-sync replica(s)",
                        isr.len()
                    ),
                )
            }
        }
        Ok(None) if usize::try_from(rf).is_ok_and(|rf| rf > brokers) => Line::fail(
            NAME,
            format!(
                "{settings_text}: Kafka cannot create {STATE_LOG} with more replicas than \
                 brokers, so no transaction can start; set transaction.state.log.replication.factor \
                 to at most {brokers} (and transaction.state.log.min.isr to at most that) in the \
                 brokers' configuration, or add brokers"
            ),
        ),
        Ok(None) if min_isr > rf => Line::fail(
            NAME,
            format!(
                "{settings_text}: min.isr above the replication factor can never be met; lower \
                 transaction.state.log.min.isr to at most {rf} on the brokers"
            ),
        ),
        Ok(None) => Line::ok(
            NAME,
            format!("{STATE_LOG} does not exist yet and can be created: {settings_text}"),
        ),
        Err(e) => Line::warn(
            NAME,
            format!("{settings_text}; no metadata for {STATE_LOG}: {e}"),
        ),
    }
}

#[cfg(test)]
mod tests;
