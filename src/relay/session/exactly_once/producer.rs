//! The transactional producer of exactly-once delivery: its transactions
//! hold whole database transactions in commit order, plus the position
//! ledger's entry for the last position each holds. It withholds the
//! reports of the open transaction and hands them over from
//! [`Transactional::commit`] or [`Transactional::abort`] only.
//!
//! The `transactional.id` is the ledger key, `outboxd-<system
//! identifier>/<database>/<slot>`, or `kafka.transactional_id`: the hot
//! standby of a slot has the same one, so initialising it when it takes over
//! fences the instance it replaces, and aborts what that one left open.

use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::super::mode::{producer, retire};
use crate::outbox::KafkaRecord;
use crate::progress::DeliveryId;
use crate::relay::error::RelayError;
use crate::relay::settings::RelaySettings;
use crate::sink::{
    DeliveryFailure, DeliveryReport, FailureKind, KafkaSink, SendError, TransactionCall,
    TransactionControl, TransactionError,
};

/// The delivery id of the ledger's record: no event has it (event ids count
/// up from 1).
const LEDGER_RECORD_ID: u64 = u64::MAX;

/// Bound on `init` and the flush inside a transaction. `commit` and `abort`
/// have the transaction timeout instead: the coordinator aborts a
/// transaction by itself after it, and until then librdkafka can finish
/// either call when the brokers come back.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the reports of a finished transaction may take to reach the
/// channel after the call returned (librdkafka has served them by then; this
/// only covers the hand-over).
const REPORTS_WAIT: Duration = Duration::from_secs(10);

/// How an abort ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::relay::session) enum AbortOutcome {
    /// The brokers aborted it: nothing of it is visible.
    Aborted,
    /// The abort call failed (e.g. a commit that timed out goes on in
    /// librdkafka and refuses it): the transaction may still commit. The
    /// next producer with the transactional id ends it one way or the
    /// other, and the next session's read of the ledger to its end finds
    /// out which.
    Unconfirmed(String),
}

/// The position ledger's record, for a transaction to hold.
pub(in crate::relay::session) struct LedgerRecord {
    pub(in crate::relay::session) topic: String,
    pub(in crate::relay::session) key: String,
    pub(in crate::relay::session) value: Vec<u8>,
}

pub(super) struct Transactional {
    sink: KafkaSink,
    control: TransactionControl,
    /// The open Kafka transaction, if any.
    open: Option<OpenTransaction>,
    /// How long a commit or an abort may take: `transaction.timeout.ms`.
    budget: Duration,
    /// A commit that came back unfinished: librdkafka goes on with it and
    /// refuses an abort, so none is asked for.
    unfinished_commit: bool,
    /// The commit call under way, on a task of its own: the session reads
    /// on meanwhile. The transaction stays open until it succeeded.
    committing: Option<JoinHandle<Result<(), TransactionError>>>,
    /// The flush under way inside the open transaction, on a task of its
    /// own so that waiting for it is cancel-safe (the watchdog races it),
    /// and since when.
    flushing: Option<(JoinHandle<Result<(), TransactionError>>, Instant)>,
}

/// How a commit call ended, for [`Transactional::committed`].
pub(in crate::relay::session) struct CommitCall(Result<(), TransactionError>);

struct OpenTransaction {
    /// Event records in it.
    records: usize,
    /// Reports its records owe, the ledger's included.
    owed: usize,
    began: Instant,
}

impl Transactional {
    /// Begins a transaction unless one is open.
    fn begin(&mut self) -> Result<&mut OpenTransaction, TransactionError> {
        if self.open.is_none() {
            self.control.begin()?;
        }
        Ok(self.open.get_or_insert_with(|| OpenTransaction {
            records: 0,
            owed: 0,
            began: Instant::now(),
        }))
    }

    /// The reports of the `owed` records of the transaction just ended, the
    /// ledger's left out; fewer if some never came.
    async fn collect(&mut self, owed: usize) -> Vec<DeliveryReport> {
        let mut reports = Vec::with_capacity(owed);
        let deadline = Instant::now() + REPORTS_WAIT;
        for _ in 0..owed {
            let report = match self.sink.try_report() {
                Some(r) => r,
                None => match tokio::time::timeout_at(deadline, self.sink.next_report()).await {
                    Ok(Some(r)) => r,
                    _ => break,
                },
            };
            if report.id != LEDGER_RECORD_ID {
                reports.push(report);
            }
        }
        reports
    }
}

impl Transactional {
    /// Makes the producer and initialises its transactions: only a session
    /// that holds the slot gets here, so a standby fences nobody.
    pub(super) async fn open(
        settings: &RelaySettings,
        ledger_key: &str,
    ) -> Result<Self, RelayError> {
        let kafka = &settings.config.kafka;
        let id = match &kafka.transactional_id {
            Some(id) => id.clone(),
            None => kafka.default_transactional_id(ledger_key),
        };
        let (sink, control) = producer(settings, Some(&id))?;
        let control = control.expect("a transactional id gives a transaction control");
        if let Err(e) = control.init(&kafka.ledger_topic, CALL_TIMEOUT).await {
            retire(sink);
            return Err(RelayError::Transaction(e));
        }
        tracing::info!(transactional_id = %id, "Kafka transactions initialised (relay.delivery = \"exactly-once\")");
        Ok(Transactional {
            sink,
            control,
            open: None,
            budget: kafka.transaction_timeout(),
            unfinished_commit: false,
            committing: None,
            flushing: None,
        })
    }

    /// Sends one record inside the open transaction (beginning one if none
    /// is open).
    pub(super) fn send(&mut self, id: DeliveryId, record: &KafkaRecord) -> Result<(), SendError> {
        if let Err(e) = self.begin() {
            return Err(SendError::Rejected {
                code: rdkafka::types::RDKafkaErrorCode::Fatal,
                kind: FailureKind::Transport,
                message: e.to_string(),
            });
        }
        self.sink.send_record(id.get(), record)?;
        if let Some(open) = &mut self.open {
            open.records += 1;
            open.owed += 1;
        }
        Ok(())
    }

    /// The open Kafka transaction's records and when it began; `None` when
    /// none is open.
    pub(super) fn open_transaction(&self) -> Option<(usize, Instant)> {
        self.open.as_ref().map(|o| (o.records, o.began))
    }

    /// Sends `ledger`, the position ledger's record for what the open
    /// transaction holds (beginning one if none is open), and starts its
    /// commit on a task of its own: see [`Transactional::commit_call`].
    pub(super) fn start_commit(&mut self, ledger: LedgerRecord) -> Result<(), TransactionError> {
        debug_assert!(self.committing.is_none(), "one commit at a time");
        let no_headers: &[(&str, Option<&[u8]>)] = &[];
        self.begin()?;
        let sent = self.sink.send(
            LEDGER_RECORD_ID,
            &ledger.topic,
            Some(ledger.key.as_bytes()),
            Some(&ledger.value),
            no_headers,
            None,
        );
        if let Err(e) = sent {
            return Err(TransactionError::Abortable {
                code: rdkafka::types::RDKafkaErrorCode::Fail,
                message: format!("cannot send the position ledger's entry: {e}"),
            });
        }
        if let Some(open) = &mut self.open {
            open.owed += 1;
        }
        let (control, budget) = (self.control.clone(), self.budget);
        self.committing = Some(tokio::spawn(async move { control.commit(budget).await }));
        Ok(())
    }

    /// Leaves the commit under way to itself (the watchdog found it stuck):
    /// its task goes on until the commit ends or a newer producer with the
    /// transactional id fences this one, and nobody waits for it. No abort
    /// is asked for either: librdkafka refuses one while the commit goes on,
    /// and this producer is given up.
    pub(super) fn abandon_commit(&mut self) {
        if self.committing.take().is_some() {
            self.unfinished_commit = true;
        }
    }

    /// Whether a commit is under way: nothing may be sent until it ended.
    pub(super) fn committing(&self) -> bool {
        self.committing.is_some()
    }

    /// Resolves once the commit under way ended (never while none is);
    /// cancel-safe. Hand what it returns to [`Transactional::committed`]
    /// at once.
    pub(super) async fn commit_call(&mut self) -> CommitCall {
        let Some(call) = &mut self.committing else {
            return std::future::pending().await;
        };
        CommitCall(call.await.unwrap_or_else(|e| {
            Err(TransactionError::Fatal {
                code: rdkafka::types::RDKafkaErrorCode::Fail,
                message: format!("the transaction commit did not finish: {e}"),
            })
        }))
    }

    /// The commit's end: the reports of its records, every one an ack; or
    /// why it failed, the transaction still open (to abort).
    pub(super) async fn committed(
        &mut self,
        call: CommitCall,
    ) -> Result<Vec<DeliveryReport>, TransactionError> {
        self.committing = None;
        if let Err(e) = call.0 {
            if let TransactionError::Unfinished {
                call: TransactionCall::Commit,
                ..
            } = e
            {
                self.unfinished_commit = true;
            }
            return Err(e);
        }
        let owed = self.open.take().map_or(0, |o| o.owed);
        Ok(self.collect(owed).await)
    }

    /// Aborts the open Kafka transaction: nothing of it becomes visible,
    /// and the reports of its records come back, every one a failure.
    pub(super) async fn abort(&mut self) -> (Vec<DeliveryReport>, AbortOutcome) {
        let Some(open) = self.open.take() else {
            return (Vec::new(), AbortOutcome::Aborted);
        };
        let outcome = if self.unfinished_commit {
            // The session ends and drops the producer: the commit's outcome
            // is the coordinator's, which the next session's ledger read
            // to the end finds out.
            AbortOutcome::Unconfirmed(
                "not asked: the commit was still going on inside librdkafka and may still \
                 succeed"
                    .into(),
            )
        } else {
            match self.control.abort(self.budget).await {
                Ok(()) => AbortOutcome::Aborted,
                Err(e) => AbortOutcome::Unconfirmed(e.to_string()),
            }
        };
        let aborted = DeliveryFailure {
            code: rdkafka::types::RDKafkaErrorCode::PurgeQueue,
            message: "the Kafka transaction holding it was aborted".into(),
            kind: FailureKind::Transport,
        };
        let mut reports = self.collect(open.owed).await;
        for report in &mut reports {
            if report.result.is_ok() {
                report.result = Err(aborted.clone());
            }
        }
        (reports, outcome)
    }

    /// Sends everything handed over and waits for its reports to be in
    /// (they still wait for the commit): a record sent between two flushes
    /// is alone in its produce request. Starts the flush unless one is
    /// under way; [`Transactional::flush_call`] waits for it.
    pub(super) fn start_flush(&mut self) {
        if self.open.is_none() || self.flushing.is_some() {
            return;
        }
        let control = self.control.clone();
        let call = tokio::spawn(async move { control.flush(CALL_TIMEOUT).await });
        self.flushing = Some((call, Instant::now()));
    }

    /// Resolves once the flush under way ended (at once when none is);
    /// cancel-safe.
    pub(super) async fn flush_call(&mut self) -> Result<(), TransactionError> {
        let Some((call, _)) = &mut self.flushing else {
            return Ok(());
        };
        let ended = call.await;
        self.flushing = None;
        ended.unwrap_or_else(|e| {
            Err(TransactionError::Fatal {
                code: rdkafka::types::RDKafkaErrorCode::Fail,
                message: format!("the flush inside the Kafka transaction did not finish: {e}"),
            })
        })
    }

    /// Since when the flush under way has been waited for, if one is.
    pub(super) fn flushing_since(&self) -> Option<Instant> {
        self.flushing.as_ref().map(|(_, since)| *since)
    }

    /// Leaves the flush under way to itself (the watchdog found it
    /// stuck): it ends by `CALL_TIMEOUT` at the latest, and the producer is
    /// given up.
    pub(super) fn abandon_flush(&mut self) {
        self.flushing = None;
    }

    /// Another producer with this one's transactional id fenced it.
    pub(super) fn fenced(&self) -> Option<TransactionError> {
        self.sink.fenced().then(|| TransactionError::Fenced {
            transactional_id: self.control.transactional_id().to_owned(),
            message: self.sink.is_fatal().unwrap_or_default(),
        })
    }
}
