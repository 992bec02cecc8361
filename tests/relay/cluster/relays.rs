//! The relays of a run: one per delivery mode, side by side on the same
//! database, so both meet the same load and the same fault. Each has its
//! own slot (both decode the same WAL), its own topics and its own ledger,
//! and a live consumer of its topics.

use std::time::Duration;

use crate::harness::http::{free_port, get, Scrape};
use crate::harness::kafka_cluster::KafkaCluster;
use crate::harness::relay::{confirmed_lsn, env, lsn_now, Env, Relay};

use super::load::Watch;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    AtLeastOnce,
    ExactlyOnce,
}

impl Mode {
    pub(super) fn name(self) -> &'static str {
        match self {
            Mode::AtLeastOnce => "at-least-once",
            Mode::ExactlyOnce => "exactly-once",
        }
    }

    /// The slot, and the prefix of the topics, of this mode's relay in the
    /// run called `run`.
    pub(super) fn slot(self, run: &str) -> String {
        match self {
            Mode::AtLeastOnce => format!("{run}alo"),
            Mode::ExactlyOnce => format!("{run}eos"),
        }
    }
}

pub(super) struct Side {
    pub(super) mode: Mode,
    pub(super) slot: String,
    pub(super) relay: Relay,
    pub(super) watch: Watch,
    /// Where the relay serves `/metrics`.
    pub(super) metrics_port: u16,
}

/// What the relay's own metrics counted so far: acknowledged events, and
/// the events and count of its committed Kafka transactions (exactly-once).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Counted {
    pub(super) at: Option<std::time::Instant>,
    pub(super) acked: f64,
    pub(super) txn_events: f64,
    pub(super) txns: f64,
}

impl Side {
    /// One scrape of the relay's `/metrics`; all zero (and no time) when it
    /// does not answer, so a phase's figures then say nothing rather than
    /// something false.
    pub(super) fn counted(&self) -> Counted {
        let Some((200, _)) = get(self.metrics_port, "/metrics") else {
            return Counted::default();
        };
        let s = Scrape::take(self.metrics_port);
        let n = |name: &str| s.get(name, "").unwrap_or(0.0);
        Counted {
            at: Some(std::time::Instant::now()),
            acked: n("outboxd_events_published_total"),
            txn_events: n("outboxd_kafka_transaction_events_sum"),
            txns: n("outboxd_kafka_transaction_events_count"),
        }
    }
}

impl Counted {
    /// Acknowledged events a second between `self` and a later `end`, and
    /// the mean events per Kafka transaction committed meanwhile (None
    /// without one).
    pub(super) fn rates(&self, end: &Counted) -> Option<(f64, Option<f64>)> {
        let secs = (end.at? - self.at?).as_secs_f64();
        let txns = end.txns - self.txns;
        Some((
            (end.acked - self.acked) / secs,
            (txns > 0.0).then(|| (end.txn_events - self.txn_events) / txns),
        ))
    }
}

/// A database with the outbox and a slot per mode, and a config for
/// `brokers` that [`start`] makes each mode's from; the events written to it
/// are routed to `{slot}.payment` and `{slot}.order`.
pub(super) fn database(brokers: &str, run: &str) -> Env {
    let e = env(brokers, &Mode::AtLeastOnce.slot(run), "");
    e.pg.psql(
        "app",
        &format!(
            "SELECT pg_create_logical_replication_slot('{}', 'pgoutput')",
            Mode::ExactlyOnce.slot(run)
        ),
    );
    e
}

/// The relay of `mode` on `e`'s database, its topics made beforehand (3
/// partitions, replication factor 3, the broker's append time as record
/// timestamp), its ledger topic made by outboxd with replication factor 3.
pub(super) fn start(c: &KafkaCluster, e: &Env, run: &str, mode: Mode) -> Side {
    let base = std::fs::read_to_string(&e.config).unwrap();
    let metrics_port = free_port();
    let template = Mode::AtLeastOnce.slot(run);
    let slot = mode.slot(run);
    let ledger = format!("{slot}.ledger.{}", uuid::Uuid::new_v4().simple());
    let text =
        base.replace(
            &format!("slot = \"{template}\""),
            &format!("slot = \"{slot}\""),
        )
        .replace(
            &format!("topic = \"{template}."),
            &format!("topic = \"{slot}."),
        )
        .replace(
            "topic_partitions = 3\n",
            &format!(
                "topic_partitions = 3\ntopic_replication_factor = -1\n\
                 ledger_topic = \"{ledger}\"\nledger_replication_factor = 3\n"
            ),
        ) + &format!(
            "[relay]\ndelivery = \"{}\"\nreconnect_backoff_max = \"1s\"\n\
             [metrics]\nlisten = \"127.0.0.1:{metrics_port}\"\n",
            mode.name()
        );
    let config = e.dir.path().join(format!("{slot}.toml"));
    std::fs::write(&config, text).unwrap();
    let topics: Vec<String> = ["payment", "order"]
        .iter()
        .map(|k| format!("{slot}.{k}"))
        .collect();
    for t in &topics {
        c.create_topic(t, 3, &[("message.timestamp.type", "LogAppendTime")]);
    }
    Side {
        mode,
        watch: Watch::start(c.bootstrap(), &topics),
        slot,
        relay: Relay::start_config(&config, e.dir.path(), &[], &[]),
        metrics_port,
    }
}

/// Waits until the relay confirmed its slot to the end of the WAL.
pub(super) fn caught_up(e: &Env, side: &Side) {
    let slot = &side.slot;
    let end = lsn_now(&e.pg);
    let deadline = std::time::Instant::now() + Duration::from_secs(180);
    while confirmed_lsn(&e.pg, slot) < end {
        assert!(
            std::time::Instant::now() < deadline && !side.relay.exited(),
            "the relay did not confirm {slot} to {end} (exited: {}):\n{}",
            side.relay.exited(),
            side.relay.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
