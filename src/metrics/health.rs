//! [`Health`]: what `/readyz` and the derived gauges need to know, shared
//! between the relay (which writes it), the slot sampler, the Kafka
//! statistics callback and the HTTP endpoint (which read it).
//!
//! Plain atomics, written on the relay's hot path without locks; the two
//! mutexes are touched only on state changes. The state changes are also
//! where the one-line-per-change logs are written (outage start and end), so
//! whoever notices a change first logs it, once.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::Lsn;

/// `last_event_ms` before any event.
const NEVER: u64 = u64::MAX;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    Postgres,
    Kafka,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Postgres => "PostgreSQL",
            Side::Kafka => "Kafka",
        }
    }
}

pub struct Health {
    epoch: Instant,
    pub stall_threshold: Duration,
    pub max_in_flight_events: u64,
    /// The slot, when Debezium aliases are on (it is their `name` label).
    pub debezium_name: Option<String>,
    slot: String,
    postgres: AtomicBool,
    kafka: AtomicBool,
    /// This producer reported a transport failure: its statistics may still
    /// show a broker "UP" (a hung broker keeps its TCP connection), so only
    /// a delivery, or a new producer, may say Kafka is back.
    kafka_failed: AtomicBool,
    kafka_ever: AtomicBool,
    halted: Mutex<Option<String>>,
    /// A gap the position ledger found and the relay refuses to skip.
    gap: Mutex<Option<String>>,
    /// The authoriser refuses the ledger writes: why, until one succeeds.
    ledger_refused: Mutex<Option<String>>,
    /// Why the last PostgreSQL session failed, for `/readyz`.
    postgres_cause: Mutex<Option<String>>,
    /// Why Kafka last failed (a refusal, an unreachable broker), for
    /// `/readyz`, until Kafka acknowledges again.
    kafka_cause: Mutex<Option<String>>,
    /// Standing by: who holds the slot (`slot "x" is active on PID n`).
    standby: Mutex<Option<String>>,
    /// Why the schema registry's last request failed, until one succeeds.
    registry_cause: Mutex<Option<String>>,
    /// Start of the open outage per side, for the "ended after" line.
    outages: Mutex<[Option<Instant>; 2]>,
    in_flight: AtomicU64,
    confirmed: AtomicU64,
    /// Milliseconds since `epoch` when the confirmed position last moved.
    moved_ms: AtomicU64,
    /// Milliseconds since `epoch` when nothing was last seen pending.
    idle_ms: AtomicU64,
    /// Sampled end of WAL; 0 = unknown.
    server_lsn: AtomicU64,
    events_seen: AtomicU64,
    last_event_ms: AtomicU64,
    /// Commit-to-ack of the last acknowledged event; -1 = none yet.
    behind_ms: AtomicI64,
    /// Asks the slot sampler for a sample now: right after a (re)connect the
    /// last one is stale (e.g. taken before the slot existed).
    pub(super) resample: tokio::sync::Notify,
}

impl Health {
    pub(crate) fn new(config: &Config) -> Health {
        Health {
            epoch: Instant::now(),
            stall_threshold: config.metrics.stall_threshold,
            max_in_flight_events: config.relay.window_events() as u64,
            debezium_name: config
                .metrics
                .debezium_aliases
                .then(|| config.postgres.slot.clone()),
            slot: config.postgres.slot.clone(),
            postgres: AtomicBool::new(false),
            kafka: AtomicBool::new(false),
            kafka_failed: AtomicBool::new(false),
            kafka_ever: AtomicBool::new(false),
            halted: Mutex::new(None),
            gap: Mutex::new(None),
            ledger_refused: Mutex::new(None),
            postgres_cause: Mutex::new(None),
            kafka_cause: Mutex::new(None),
            standby: Mutex::new(None),
            registry_cause: Mutex::new(None),
            outages: Mutex::new([None, None]),
            in_flight: AtomicU64::new(0),
            confirmed: AtomicU64::new(0),
            moved_ms: AtomicU64::new(0),
            idle_ms: AtomicU64::new(0),
            server_lsn: AtomicU64::new(0),
            events_seen: AtomicU64::new(0),
            last_event_ms: AtomicU64::new(NEVER),
            behind_ms: AtomicI64::new(-1),
            resample: tokio::sync::Notify::new(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// A replication stream is open (after standing by: taken over).
    pub(crate) fn postgres_up(&self) {
        self.postgres.store(true, Relaxed);
        *self
            .postgres_cause
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = None;
        if self.lock_standby().take().is_some() {
            tracing::info!(slot = %self.slot, "taking over slot {}", self.slot);
        }
        self.resample.notify_one();
        self.outage_ended(Side::Postgres);
    }

    /// The stream is gone. `cause` = PostgreSQL failed (starts an outage,
    /// which ends a standby: the outage is what to report now);
    /// `None` = closed on purpose (shutdown, or a Kafka-side reconnect).
    pub(crate) fn postgres_down(&self, cause: Option<&str>) {
        self.postgres.store(false, Relaxed);
        if let Some(cause) = cause {
            *self.lock_standby() = None;
            *self
                .postgres_cause
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Some(cause.replace('\n', " "));
            self.outage_started(Side::Postgres, cause);
        }
    }

    /// Kafka acknowledged a record, or a fresh producer reached a broker (its
    /// first metadata answer, or its statistics show a connection).
    pub(crate) fn kafka_up(&self) {
        // The hot path (every ack) is one load.
        if self.kafka.load(Relaxed) {
            return;
        }
        self.kafka_failed.store(false, Relaxed);
        self.kafka.store(true, Relaxed);
        crate::sink::clear_kafka_refusal();
        *self.kafka_cause.lock().unwrap_or_else(|e| e.into_inner()) = None;
        if !self.kafka_ever.swap(true, Relaxed) {
            tracing::info!("connected to Kafka");
        }
        self.outage_ended(Side::Kafka);
    }

    /// A delivery failed for transport reasons, or Kafka could not be reached.
    pub(crate) fn kafka_down(&self, cause: &str) {
        self.kafka_failed.store(true, Relaxed);
        self.kafka.store(false, Relaxed);
        *self.kafka_cause.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(cause.replace('\n', " "));
        self.outage_started(Side::Kafka, cause);
    }

    /// A new producer: its statistics are to be believed again.
    pub(crate) fn new_producer(&self) {
        self.kafka_failed.store(false, Relaxed);
    }

    /// From librdkafka statistics, or a new producer's first metadata
    /// answer: some broker connection is up. Only ever marks Kafka up:
    /// brokers close idle connections, which is no outage.
    pub(crate) fn kafka_broker_up(&self) {
        if !self.kafka_failed.load(Relaxed) {
            self.kafka_up();
        }
    }

    /// Another instance streams the slot (held by `pid`, when known) and
    /// this one waits to take it over. The wait is logged once, when it
    /// starts; a new holder (another standby won the race) is no new line.
    pub(crate) fn stand_by(&self, pid: Option<i32>) {
        let holder = match pid {
            Some(pid) => format!("slot {:?} is active on PID {pid}", self.slot),
            None => format!("slot {:?} is active", self.slot),
        };
        let mut standby = self.lock_standby();
        if standby.is_none() {
            tracing::info!(slot = %self.slot, pid, "standing by: {holder}; taking over when it is released");
        }
        *standby = Some(holder);
    }

    /// Who holds the slot while this instance stands by; `None` otherwise.
    pub(crate) fn standby(&self) -> Option<String> {
        self.lock_standby().clone()
    }

    fn lock_standby(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.standby.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn outage_started(&self, side: Side, cause: &str) {
        let mut outages = self.outages.lock().unwrap_or_else(|e| e.into_inner());
        let slot = &mut outages[side as usize];
        if slot.is_none() {
            *slot = Some(Instant::now());
            tracing::warn!(%cause, "{} outage started", side.name());
        }
    }

    fn outage_ended(&self, side: Side) {
        let started = self.outages.lock().unwrap_or_else(|e| e.into_inner())[side as usize].take();
        if let Some(started) = started {
            let secs = started.elapsed().as_secs_f64();
            tracing::info!(
                outage_seconds = secs,
                "{} outage ended after {secs:.1}s",
                side.name()
            );
        }
    }

    /// The schema registry answered (after failing: the outage is over).
    pub(crate) fn registry_up(&self) {
        if let Some(cause) = self.lock_registry().take() {
            tracing::info!(%cause, "the schema registry answers again");
        }
    }

    /// The schema registry cannot be reached or answers 5xx: not ready
    /// until it answers again, since a new schema version, or a payload
    /// that needs one, waits for it.
    pub(crate) fn registry_down(&self, cause: &str) {
        let mut slot = self.lock_registry();
        if slot.is_none() {
            tracing::warn!(%cause, "schema registry outage started");
        }
        *slot = Some(cause.replace('\n', " "));
    }

    fn lock_registry(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.registry_cause
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// The authoriser refuses the ledger writes (`Some`), or a write went
    /// through (`None`). Events still flow meanwhile, but without the
    /// ledger a lost slot would go unnoticed: not ready.
    pub(crate) fn set_ledger_refused(&self, refused: Option<String>) {
        *self
            .ledger_refused
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = refused.map(|r| r.replace('\n', " "));
    }

    /// A gap in the relayed WAL (see `progress::ledger`): not ready, with
    /// the recovery, until it is accepted.
    pub(crate) fn set_gap(&self, gap: Option<String>) {
        *self.gap.lock().unwrap_or_else(|e| e.into_inner()) = gap;
    }

    pub(crate) fn set_halted(&self, reason: Option<String>) {
        *self.halted.lock().unwrap_or_else(|e| e.into_inner()) = reason;
    }

    /// The relay's progress: called on every turn of its loop, so the time
    /// of the last idle moment is close to exact.
    pub(crate) fn progress(&self, in_flight: usize, confirmed: Lsn) {
        self.progress_at(self.now_ms(), in_flight as u64, confirmed);
    }

    fn progress_at(&self, now: u64, in_flight: u64, confirmed: Lsn) {
        self.in_flight.store(in_flight, Relaxed);
        if self.confirmed.swap(confirmed.0, Relaxed) != confirmed.0 {
            self.moved_ms.store(now, Relaxed);
        }
        if !self.pending() {
            self.idle_ms.store(now, Relaxed);
        }
    }

    /// The session ended: nothing is in flight any more (it will be read
    /// again), and the stream is closed.
    pub(crate) fn session_ended(&self) {
        self.in_flight.store(0, Relaxed);
        self.postgres.store(false, Relaxed);
    }

    /// The sampled end of WAL, `None` when it could not be read.
    pub(crate) fn set_server_lsn(&self, lsn: Option<Lsn>) {
        self.server_lsn.store(lsn.map_or(0, |l| l.0), Relaxed);
    }

    pub(crate) fn event_seen(&self) {
        self.events_seen.fetch_add(1, Relaxed);
        self.last_event_ms.store(self.now_ms(), Relaxed);
    }

    /// An event was acknowledged `behind_ms` after its commit.
    pub(crate) fn acked(&self, behind_ms: i64) {
        self.behind_ms.store(behind_ms, Relaxed);
    }

    /// Events are waiting: sent and unacknowledged, or in WAL the relay has
    /// not confirmed yet (known from the last slot sample).
    fn pending(&self) -> bool {
        let server = self.server_lsn.load(Relaxed);
        self.in_flight.load(Relaxed) > 0 || server > self.confirmed.load(Relaxed)
    }

    /// How long the confirmed position has stood still while something was
    /// pending; zero when idle, and while standing by (the slot's progress
    /// is the active instance's to report).
    pub(crate) fn stall(&self) -> Duration {
        if self.lock_standby().is_some() {
            return Duration::ZERO;
        }
        self.stall_at(self.now_ms())
    }

    fn stall_at(&self, now: u64) -> Duration {
        if !self.pending() {
            self.idle_ms.store(now, Relaxed);
            return Duration::ZERO;
        }
        // Counted from when things became pending, not from the last move
        // before an idle hour.
        let since = self.moved_ms.load(Relaxed).max(self.idle_ms.load(Relaxed));
        Duration::from_millis(now.saturating_sub(since))
    }

    /// `Ok` when ready to serve: both sides connected, not halted, not
    /// stalled beyond the threshold; else the reason, on one line.
    pub(crate) fn readiness(&self) -> Result<(), String> {
        if let Some(reason) = &*self.halted.lock().unwrap_or_else(|e| e.into_inner()) {
            return Err(format!("halted: {}", reason.replace('\n', " ")));
        }
        if let Some(gap) = &*self.gap.lock().unwrap_or_else(|e| e.into_inner()) {
            return Err(format!("gap: {}", gap.replace('\n', " ")));
        }
        if let Some(holder) = self.standby() {
            return Err(format!("standby: {holder}"));
        }
        // Before the connections: a session the registry ended leaves
        // PostgreSQL disconnected until the reconnect, and the registry is
        // the cause worth naming.
        if let Some(cause) = &*self.lock_registry() {
            return Err(format!("schema registry unavailable: {cause}"));
        }
        // Before PostgreSQL: a relay that cannot log in to Kafka never opens
        // its replication stream, and the stream is not what to fix.
        if !self.kafka_connected() {
            if let Some(refusal) = crate::sink::kafka_refusal() {
                return Err(format!("not connected to Kafka: {refusal}"));
            }
        }
        if let Some(refused) = &*self
            .ledger_refused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
        {
            return Err(format!("position ledger not written: {refused}"));
        }
        let kafka_cause = self
            .kafka_cause
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if !self.postgres_connected() {
            return Err(
                match (
                    &*self
                        .postgres_cause
                        .lock()
                        .unwrap_or_else(|e| e.into_inner()),
                    kafka_cause,
                ) {
                    (Some(cause), _) => format!("not connected to PostgreSQL: {cause}"),
                    // The stream was closed for a Kafka-side reconnect:
                    // Kafka's failure is the one to fix.
                    (None, Some(cause)) => format!("Kafka failed: {cause}"),
                    (None, None) => {
                        "not connected to PostgreSQL (no replication stream open)".into()
                    }
                },
            );
        }
        if !self.kafka_connected() {
            return Err(match kafka_cause {
                Some(cause) => format!("Kafka failed: {cause}"),
                None => "not connected to Kafka (no acknowledgement or broker connection since the last failure)".into(),
            });
        }
        let stall = self.stall();
        if stall > self.stall_threshold {
            return Err(format!(
                "stalled: the slot's confirmed position has not moved for {}s while events are pending (metrics.stall_threshold = {}s)",
                stall.as_secs(),
                self.stall_threshold.as_secs_f64()
            ));
        }
        Ok(())
    }

    pub(crate) fn postgres_connected(&self) -> bool {
        self.postgres.load(Relaxed)
    }

    pub(crate) fn kafka_connected(&self) -> bool {
        self.kafka.load(Relaxed)
    }

    pub(crate) fn in_flight(&self) -> u64 {
        self.in_flight.load(Relaxed)
    }

    pub(crate) fn events_seen(&self) -> u64 {
        self.events_seen.load(Relaxed)
    }

    /// Milliseconds since the last event was read, `None` before the first.
    pub(crate) fn since_last_event_ms(&self) -> Option<u64> {
        let last = self.last_event_ms.load(Relaxed);
        (last != NEVER).then(|| self.now_ms().saturating_sub(last))
    }

    /// How far the relay is behind its writers: the commit-to-ack of the
    /// last acknowledged event while anything is pending. Zero when idle (a
    /// relay that caught up is not behind, however late its last event
    /// was) and while standing by. A relay that stops acknowledging keeps
    /// its last figure; the stall gauge covers that case.
    pub(crate) fn delivery_lag(&self) -> Duration {
        if self.lock_standby().is_some() || !self.pending() {
            return Duration::ZERO;
        }
        Duration::from_millis(self.behind_ms().unwrap_or(0) as u64)
    }

    /// Commit-to-ack of the last acknowledged event, `None` before the first.
    pub(crate) fn behind_ms(&self) -> Option<i64> {
        let v = self.behind_ms.load(Relaxed);
        (v >= 0).then_some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health() -> Health {
        let mut cfg = Config::default();
        cfg.metrics.stall_threshold = Duration::from_secs(5);
        Health::new(&cfg)
    }

    #[test]
    fn idle_is_never_stalled() {
        let h = health();
        h.progress_at(1_000, 0, Lsn(100));
        assert_eq!(h.stall_at(3_600_000), Duration::ZERO);
    }

    #[test]
    fn stall_counts_from_when_events_became_pending() {
        let h = health();
        h.progress_at(1_000, 0, Lsn(100));
        // An hour idle, then events go out and nothing is acknowledged.
        h.progress_at(3_600_000, 0, Lsn(100));
        h.progress_at(3_600_010, 5, Lsn(100));
        assert_eq!(h.stall_at(3_602_000), Duration::from_secs(2));
        // The position moves: the clock restarts.
        h.progress_at(3_603_000, 5, Lsn(200));
        assert_eq!(h.stall_at(3_604_000), Duration::from_secs(1));
        // All acknowledged and confirmed: idle again.
        h.progress_at(3_605_000, 0, Lsn(300));
        assert_eq!(h.stall_at(3_700_000), Duration::ZERO);
    }

    #[test]
    fn unread_backlog_counts_as_pending_until_confirmed_past_it() {
        let h = health();
        h.progress_at(1_000, 0, Lsn(100));
        h.set_server_lsn(Some(Lsn(500)));
        assert_eq!(h.stall_at(4_000), Duration::from_secs(3));
        h.progress_at(4_500, 0, Lsn(500));
        assert_eq!(h.stall_at(9_000), Duration::ZERO);
        // Unknown end of WAL (sampler failing) is not a backlog.
        h.set_server_lsn(None);
        h.progress_at(10_000, 0, Lsn(400));
        assert_eq!(h.stall_at(20_000), Duration::ZERO);
    }

    #[test]
    fn delivery_lag_is_the_last_acks_while_pending_and_zero_when_idle() {
        let h = health();
        assert_eq!(h.delivery_lag(), Duration::ZERO, "nothing acknowledged yet");
        // A minute behind: the backlog's events are acknowledged 60 s after
        // their commits while more waits.
        h.progress_at(1_000, 40, Lsn(100));
        h.acked(60_000);
        assert_eq!(h.delivery_lag(), Duration::from_secs(60));
        // Unread WAL alone is pending too.
        h.progress_at(2_000, 0, Lsn(200));
        h.set_server_lsn(Some(Lsn(900)));
        assert_eq!(h.delivery_lag(), Duration::from_secs(60));
        // Caught up: the last event's lateness no longer says anything.
        h.progress_at(3_000, 0, Lsn(900));
        assert_eq!(h.delivery_lag(), Duration::ZERO);
        // New events, acknowledged promptly.
        h.progress_at(4_000, 3, Lsn(900));
        h.acked(12);
        assert_eq!(h.delivery_lag(), Duration::from_millis(12));
        h.stand_by(Some(123));
        assert_eq!(h.delivery_lag(), Duration::ZERO, "standing by");
    }

    #[test]
    fn readiness_names_the_first_problem() {
        let h = health();
        assert!(h.readiness().unwrap_err().contains("PostgreSQL"));
        h.postgres_up();
        assert!(h.readiness().unwrap_err().contains("Kafka"));
        h.kafka_up();
        h.readiness().unwrap();
        h.kafka_down("delivery failed: timed out");
        // A hung broker's statistics do not bring it back; a delivery does.
        h.kafka_broker_up();
        assert!(!h.kafka_connected());
        h.kafka_up();
        assert!(h.kafka_connected());
        h.set_halted(Some("poison\nevent".into()));
        assert_eq!(h.readiness().unwrap_err(), "halted: poison event");
        h.set_halted(None);
        h.readiness().unwrap();
    }

    #[test]
    fn readiness_names_the_registry_until_it_answers_again() {
        let h = health();
        h.postgres_up();
        h.kafka_up();
        h.registry_down("the schema registry at http://r:8081/ cannot be reached: refused");
        let reason = h.readiness().unwrap_err();
        assert!(
            reason
                .starts_with("schema registry unavailable: the schema registry at http://r:8081/"),
            "{reason}"
        );
        h.registry_up();
        h.readiness().unwrap();
    }

    #[test]
    fn standby_is_not_ready_and_not_stalled_until_it_takes_over() {
        let mut cfg = Config::default();
        cfg.postgres.slot = "orders".into();
        cfg.metrics.stall_threshold = Duration::from_millis(10);
        let h = Health::new(&cfg);
        // The sampler sees WAL the slot has not confirmed: a backlog, but
        // the active instance's.
        h.set_server_lsn(Some(Lsn(500)));
        h.stand_by(Some(123));
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(
            h.readiness().unwrap_err(),
            "standby: slot \"orders\" is active on PID 123"
        );
        assert_eq!(h.stall(), Duration::ZERO);
        // Another standby won a race: the new holder is shown.
        h.stand_by(Some(456));
        assert!(h.readiness().unwrap_err().ends_with("PID 456"));
        h.postgres_up();
        h.kafka_up();
        assert_eq!(h.standby(), None);
        h.progress(0, Lsn(500));
        h.readiness().unwrap();
        // An outage ends a standby: it is the outage that is reported.
        h.stand_by(None);
        h.postgres_down(Some("connection refused"));
        assert!(h
            .readiness()
            .unwrap_err()
            .starts_with("not connected to PostgreSQL"));
    }

    #[test]
    fn readiness_names_kafkas_cause_while_the_stream_is_closed_for_it() {
        let h = health();
        h.postgres_up();
        h.kafka_up();
        // A Kafka-side reconnect closes the stream on purpose.
        h.kafka_down("delivery failed: Topic authorization failed; grant it WRITE");
        h.postgres_down(None);
        let reason = h.readiness().unwrap_err();
        assert!(
            reason.starts_with("Kafka failed: delivery failed"),
            "{reason}"
        );
        assert!(reason.contains("grant it WRITE"), "{reason}");
        h.postgres_up();
        assert!(h.readiness().unwrap_err().starts_with("Kafka failed"));
        // PostgreSQL's own failure comes first.
        h.postgres_down(Some("password authentication failed"));
        assert!(h.readiness().unwrap_err().contains("PostgreSQL"));
        h.postgres_up();
        h.kafka_up();
        h.readiness().unwrap();
        h.postgres_down(None);
        assert!(h
            .readiness()
            .unwrap_err()
            .contains("no replication stream open"));
    }

    #[test]
    fn readiness_fails_when_stalled_beyond_the_threshold() {
        let mut cfg = Config::default();
        cfg.metrics.stall_threshold = Duration::from_millis(10);
        let h = Health::new(&cfg);
        h.postgres_up();
        h.kafka_up();
        h.progress(3, Lsn(1));
        std::thread::sleep(Duration::from_millis(30));
        let reason = h.readiness().unwrap_err();
        assert!(reason.starts_with("stalled:"), "{reason}");
    }
}
