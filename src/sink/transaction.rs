//! The transactional producer (`relay.delivery = "exactly-once"`): a
//! [`KafkaSink`] made with a `transactional.id`, and its transaction calls.
//!
//! librdkafka blocks in `init`, `commit` and `abort` (a coordinator round
//! trip, and for `commit` a flush of every queued record first), so
//! [`TransactionControl`] runs them on tokio's blocking threads; `begin` only
//! changes local state. Delivery reports keep coming on the sink's channel
//! as usual: a report of a record in a transaction says the broker has it,
//! not that a `read_committed` consumer will ever see it. Only a committed
//! transaction makes its records visible; that meaning is the relay's to
//! keep (it withholds the reports until the commit).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::error::KafkaError;
use rdkafka::producer::{Producer, ThreadedProducer};
use rdkafka::types::RDKafkaErrorCode;

use super::config::QueueBound;
use super::delivery::{DeliveryContext, StatsHook};
use super::error::SinkError;
use super::producer::KafkaSink;
use crate::config::KafkaConfig;

/// Error codes that say another producer took this transactional id over
/// (or that this one's epoch is gone): nothing it sends becomes visible.
const FENCING: [RDKafkaErrorCode; 4] = [
    RDKafkaErrorCode::Fenced,
    RDKafkaErrorCode::ProducerFenced,
    RDKafkaErrorCode::InvalidProducerEpoch,
    RDKafkaErrorCode::TransactionCoordinatorFenced,
];

/// How long to wait before calling a transaction call again that came back
/// retriable: some come back at once (the coordinator not yet known).
const RESUME_PAUSE: Duration = Duration::from_millis(100);

/// The longest one `commit` or `abort` call blocks before it is resumed:
/// each resumption is logged, so an operator sees a commit that waits on the
/// brokers rather than a silent relay.
const CALL_STEP: Duration = Duration::from_secs(10);

/// The transaction calls librdkafka goes on with in the background when
/// they come back retriable (the time given ran out, the coordinator was not
/// reachable): only the same call may follow then, and it resumes the work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransactionCall {
    Commit,
    Abort,
}

impl fmt::Display for TransactionCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TransactionCall::Commit => "commit",
            TransactionCall::Abort => "abort",
        })
    }
}

/// Why a transaction call failed, as the relay must act on it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransactionError {
    /// Another instance initialised the same transactional id: this one must
    /// stop writing.
    #[error(
        "fenced: another outboxd initialised transactional id {transactional_id:?} (a standby \
         took over, or an instance with the same kafka.transactional_id started): {message}"
    )]
    Fenced {
        transactional_id: String,
        message: String,
    },
    /// The transaction cannot commit: abort it, send its records again.
    #[error("Kafka transaction failed ({code:?}): {message}")]
    Abortable {
        code: RDKafkaErrorCode,
        message: String,
    },
    /// A commit or abort still unfinished when its time ran out: librdkafka
    /// goes on with it, and refuses any other transaction call meanwhile
    /// (`Conflict`). A commit in this state may still succeed.
    #[error(
        "Kafka transaction {call} unfinished after {waited_s} s; librdkafka goes on with it \
         in the background: {message}"
    )]
    Unfinished {
        call: TransactionCall,
        waited_s: u64,
        message: String,
    },
    /// The producer cannot go on (e.g. the brokers do not support
    /// transactions, the id is not authorised, the timeout is above the
    /// broker's `transaction.max.timeout.ms`).
    #[error("Kafka transactional producer failed ({code:?}): {message}")]
    Fatal {
        code: RDKafkaErrorCode,
        message: String,
    },
}

/// A transaction call's error as librdkafka gave it.
#[derive(Debug)]
pub(super) struct CallFailure {
    code: RDKafkaErrorCode,
    message: String,
    fatal: bool,
    /// For `commit` and `abort`: the call goes on in the background and may
    /// be resumed by calling it again.
    retriable: bool,
}

impl From<KafkaError> for CallFailure {
    fn from(error: KafkaError) -> CallFailure {
        match &error {
            KafkaError::Transaction(e) => CallFailure {
                code: e.code(),
                message: e.string(),
                fatal: e.is_fatal(),
                retriable: e.is_retriable(),
            },
            other => CallFailure {
                code: other.rdkafka_error_code().unwrap_or(RDKafkaErrorCode::Fail),
                message: other.to_string(),
                fatal: false,
                retriable: false,
            },
        }
    }
}

impl TransactionError {
    fn from_kafka(error: KafkaError, ids: &Ids<'_>) -> TransactionError {
        TransactionError::from_failure(CallFailure::from(error), ids)
    }

    fn from_failure(f: CallFailure, ids: &Ids<'_>) -> TransactionError {
        TransactionError::from_parts(f.code, f.message, f.fatal, ids)
    }

    fn from_parts(
        code: RDKafkaErrorCode,
        message: String,
        fatal: bool,
        ids: &Ids<'_>,
    ) -> TransactionError {
        let transactional_id = ids.transactional_id;
        // An epoch error that is not fatal is librdkafka bumping the epoch
        // after the coordinator timed a transaction out (KIP-360): abort and
        // go on, nobody took the id over.
        let fenced = matches!(
            code,
            RDKafkaErrorCode::Fenced | RDKafkaErrorCode::ProducerFenced
        ) || (fatal && FENCING.contains(&code));
        if fenced {
            return TransactionError::Fenced {
                transactional_id: transactional_id.to_owned(),
                message,
            };
        }
        let message = match acl_hint(code, ids) {
            Some(hint) => format!("{message}; {hint}"),
            None => message,
        };
        if fatal {
            return TransactionError::Fatal { code, message };
        }
        // Retriable, abortable and state errors alike: the session aborts
        // and resumes from the ledger, which is what a commit whose outcome
        // is unknown needs anyway.
        TransactionError::Abortable { code, message }
    }
}

/// What a transaction error may name besides its code.
pub(super) struct Ids<'a> {
    pub(super) transactional_id: &'a str,
    /// The topic librdkafka last logged as refused to the transaction
    /// (its error does not name it).
    pub(super) refused_topic: Option<String>,
}

/// The ACL to grant when the authoriser refused a transaction call with
/// `code`.
fn acl_hint(code: RDKafkaErrorCode, ids: &Ids<'_>) -> Option<String> {
    let transactional_id = ids.transactional_id;
    match code {
        RDKafkaErrorCode::TransactionalIdAuthorizationFailed => Some(format!(
            "grant the principal WRITE and DESCRIBE on the transactional id: kafka-acls.sh \
             --bootstrap-server BROKER --add --allow-principal User:PRINCIPAL --operation Write \
             --operation Describe --transactional-id '{transactional_id}' \
             --resource-pattern-type prefixed"
        )),
        RDKafkaErrorCode::TopicAuthorizationFailed if ids.refused_topic.is_some() => {
            let topic = ids.refused_topic.as_deref().unwrap_or_default();
            Some(format!(
                "the principal may not write to topic `{topic}`: grant it WRITE on the topic: \
                 kafka-acls.sh --bootstrap-server BROKER --add --allow-principal User:PRINCIPAL \
                 --operation Write --topic {topic}"
            ))
        }
        RDKafkaErrorCode::TopicAuthorizationFailed => Some(
            "the principal may not write to a topic of this transaction (an outbox topic or \
             kafka.ledger_topic; librdkafka's log line `Failed to add partition \"<topic>\"` \
             names it, `outboxd check` names those it knows): grant it WRITE on the topic: \
             kafka-acls.sh --bootstrap-server BROKER --add --allow-principal User:PRINCIPAL \
             --operation Write --topic <topic>"
                .to_owned(),
        ),
        _ => None,
    }
}

/// Whether a producer's fatal error is a fencing.
pub fn is_fencing(code: RDKafkaErrorCode) -> bool {
    FENCING.contains(&code)
}

/// The transaction calls of a transactional [`KafkaSink`], each on a
/// blocking thread.
#[derive(Clone)]
pub struct TransactionControl {
    producer: Arc<ThreadedProducer<DeliveryContext>>,
    transactional_id: Arc<str>,
}

impl TransactionControl {
    pub fn transactional_id(&self) -> &str {
        &self.transactional_id
    }

    /// What an error of this producer's may name.
    fn ids(&self) -> Ids<'_> {
        Ids {
            transactional_id: &self.transactional_id,
            refused_topic: self.producer.context().refused_topic(),
        }
    }

    /// Registers the id with its coordinator, fencing any older producer
    /// with it and aborting what that one left open.
    ///
    /// `topic` (one that exists) is asked about first, twice: a producer
    /// just made has no connection to a broker the cluster named, and
    /// librdkafka, finding none for its coordinator lookup, tries again only
    /// on a 500 ms timer, a wait that was half of some exactly-once starts.
    /// The first answer may come from the bootstrap connection, which the
    /// lookup does not use once the cluster's brokers are known; the second
    /// one comes from a named broker (docs/benchmarks.md, "Exactly-once
    /// start-up").
    pub async fn init(&self, topic: &str, timeout: Duration) -> Result<(), TransactionError> {
        let topic = topic.to_owned();
        self.blocking(move |p| {
            // Only a connection is wanted: a failure here is init's to
            // report, so it is not waited for long either.
            let wait = timeout.min(Duration::from_secs(5));
            for _ in 0..2 {
                let _ = p.client().fetch_metadata(Some(&topic), wait);
            }
            p.init_transactions(timeout)
        })
        .await
    }

    /// Begins a transaction: local, does not block.
    pub fn begin(&self) -> Result<(), TransactionError> {
        self.producer
            .begin_transaction()
            .map_err(|e| TransactionError::from_kafka(e, &self.ids()))
    }

    /// Flushes every queued record and commits the transaction, for at most
    /// `budget` (see [`TransactionControl::resumed`]).
    pub async fn commit(&self, budget: Duration) -> Result<(), TransactionError> {
        self.resumed(TransactionCall::Commit, budget, CALL_STEP, commit_now)
            .await
    }

    /// Sends everything queued and waits for its reports, inside the open
    /// transaction: a record sent between two flushes travels alone.
    pub async fn flush(&self, timeout: Duration) -> Result<(), TransactionError> {
        self.blocking(move |p| flush_now(p, timeout)).await
    }

    /// Aborts the transaction, for at most `budget`: what it holds never
    /// becomes visible; queued records come back purged.
    pub async fn abort(&self, budget: Duration) -> Result<(), TransactionError> {
        self.resumed(TransactionCall::Abort, budget, CALL_STEP, abort_now)
            .await
    }

    /// Calls `call` (commit or abort), `step` at a time, until it ends or
    /// `budget` is spent. A retriable error means librdkafka goes on with
    /// the call in the background and refuses any other transaction call
    /// meanwhile (`Conflict`): the relay once answered a timed-out commit
    /// with an abort that could not happen, and dropped the producer
    /// mid-commit. Calling it again resumes it, as librdkafka asks.
    pub(super) async fn resumed(
        &self,
        which: TransactionCall,
        budget: Duration,
        step: Duration,
        call: CallFn,
    ) -> Result<(), TransactionError> {
        let started = tokio::time::Instant::now();
        let deadline = started + budget;
        loop {
            let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
            let timeout = remaining.min(step);
            let producer = Arc::clone(&self.producer);
            let failure = match tokio::task::spawn_blocking(move || call(&producer, timeout)).await
            {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(failure)) => failure,
                Err(e) => {
                    return Err(TransactionError::Fatal {
                        code: RDKafkaErrorCode::Fail,
                        message: format!("the transaction {which} did not finish: {e}"),
                    })
                }
            };
            // `Conflict`: another call goes on, which calling this one
            // again does not move.
            if !failure.retriable || failure.fatal || failure.code == RDKafkaErrorCode::Conflict {
                return Err(TransactionError::from_failure(failure, &self.ids()));
            }
            if tokio::time::Instant::now() + RESUME_PAUSE >= deadline {
                return Err(TransactionError::Unfinished {
                    call: which,
                    waited_s: started.elapsed().as_secs(),
                    message: failure.message,
                });
            }
            tracing::info!(
                call = %which,
                waited_s = started.elapsed().as_secs(),
                error = %failure.message,
                "Kafka transaction {which} not finished yet; resuming it"
            );
            tokio::time::sleep(RESUME_PAUSE).await;
        }
    }

    async fn blocking(
        &self,
        call: impl FnOnce(&ThreadedProducer<DeliveryContext>) -> Result<(), KafkaError> + Send + 'static,
    ) -> Result<(), TransactionError> {
        let producer = Arc::clone(&self.producer);
        let joined = tokio::task::spawn_blocking(move || call(&producer)).await;
        match joined {
            Ok(result) => result.map_err(|e| TransactionError::from_kafka(e, &self.ids())),
            Err(e) => Err(TransactionError::Fatal {
                code: RDKafkaErrorCode::Fail,
                message: format!("the transaction call did not finish: {e}"),
            }),
        }
    }
}

/// librdkafka's flush, called directly: rdkafka's `flush` polls the queue
/// for up to 100 ms at a time on this thread beside librdkafka's polling
/// thread (see [`commit_now`]); librdkafka's own, with delivery reports as
/// events, waits on its message count.
fn flush_now(
    producer: &ThreadedProducer<DeliveryContext>,
    timeout: Duration,
) -> Result<(), KafkaError> {
    let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: the handle is the live producer's, kept alive by `producer`
    // for the whole call; rd_kafka_flush is thread-safe.
    let err =
        unsafe { rdkafka::bindings::rd_kafka_flush(producer.client().native_ptr(), timeout_ms) };
    match RDKafkaErrorCode::from(err) {
        RDKafkaErrorCode::NoError => Ok(()),
        code => Err(KafkaError::Flush(code)),
    }
}

/// Which transaction call `resumed` makes.
pub(super) type CallFn =
    fn(&ThreadedProducer<DeliveryContext>, Duration) -> Result<(), CallFailure>;

/// librdkafka's abort.
pub(super) fn abort_now(
    producer: &ThreadedProducer<DeliveryContext>,
    timeout: Duration,
) -> Result<(), CallFailure> {
    producer
        .abort_transaction(timeout)
        .map_err(CallFailure::from)
}

/// librdkafka's commit, called directly. rdkafka's `commit_transaction`
/// first flushes in a loop that polls the producer's queue for up to 100 ms
/// at a time on this thread, while librdkafka's polling thread takes the
/// events it waits for: a commit took tens of milliseconds more than its
/// round trips, and exactly-once drained at less than half at-least-once's
/// rate (docs/benchmarks.md, "Exactly-once's commit called directly").
/// librdkafka flushes by itself before committing and, with delivery
/// reports as events (as rdkafka configures them), waits on its message
/// count without polling.
pub(super) fn commit_now(
    producer: &ThreadedProducer<DeliveryContext>,
    timeout: Duration,
) -> Result<(), CallFailure> {
    use rdkafka::bindings as rd;
    let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: the handle is the live producer's, kept alive by `producer`
    // for the whole call; the error, when there is one, is read and then
    // destroyed once, here.
    unsafe {
        let error = rd::rd_kafka_commit_transaction(producer.client().native_ptr(), timeout_ms);
        if error.is_null() {
            return Ok(());
        }
        let code = RDKafkaErrorCode::from(rd::rd_kafka_error_code(error));
        let message = std::ffi::CStr::from_ptr(rd::rd_kafka_error_string(error))
            .to_string_lossy()
            .into_owned();
        let fatal = rd::rd_kafka_error_is_fatal(error) != 0;
        let retriable = rd::rd_kafka_error_is_retriable(error) != 0;
        rd::rd_kafka_error_destroy(error);
        Err(CallFailure {
            code,
            message,
            fatal,
            retriable,
        })
    }
}

impl KafkaSink {
    /// A sink whose producer is transactional with `transactional_id`.
    /// Transactions are initialised separately ([`TransactionControl::init`]).
    pub(crate) fn transactional(
        brokers: &str,
        kafka: &KafkaConfig,
        window: QueueBound,
        stats: Option<StatsHook>,
        transactional_id: &str,
    ) -> Result<(KafkaSink, TransactionControl), SinkError> {
        let sink = KafkaSink::build(brokers, kafka, window, stats, Some(transactional_id))?;
        let control = TransactionControl {
            producer: sink.producer(),
            transactional_id: Arc::from(transactional_id),
        };
        Ok((sink, control))
    }

    /// Whether the producer's fatal error is a fencing.
    pub(crate) fn fenced(&self) -> bool {
        self.fatal_code().is_some_and(is_fencing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(transactional_id: &str) -> Ids<'_> {
        Ids {
            transactional_id,
            refused_topic: None,
        }
    }

    #[test]
    fn a_refusal_by_the_authoriser_names_the_acl() {
        use RDKafkaErrorCode as C;
        let id = TransactionError::from_parts(
            C::TransactionalIdAuthorizationFailed,
            "Failed to acquire transactional PID".into(),
            true,
            &ids("outboxd-1/app/s"),
        );
        assert!(matches!(id, TransactionError::Fatal { .. }), "{id:?}");
        let text = id.to_string();
        assert!(
            text.contains("--transactional-id 'outboxd-1/app/s' --resource-pattern-type prefixed"),
            "{text}"
        );
        let topic = TransactionError::from_parts(
            C::TopicAuthorizationFailed,
            "Failed to add partition(s) to transaction".into(),
            false,
            &ids("x"),
        );
        assert!(
            matches!(topic, TransactionError::Abortable { .. }),
            "{topic:?}"
        );
        assert!(
            topic.to_string().contains("grant it WRITE on the topic"),
            "{topic}"
        );
        let named = TransactionError::from_parts(
            C::TopicAuthorizationFailed,
            "Failed to add partition(s) to transaction".into(),
            false,
            &Ids {
                transactional_id: "x",
                refused_topic: Some("orders".into()),
            },
        );
        assert!(
            named
                .to_string()
                .contains("--operation Write --topic orders"),
            "{named}"
        );
        let other =
            TransactionError::from_parts(C::RequestTimedOut, "slow".into(), false, &ids("x"));
        assert!(!other.to_string().contains("grant"), "{other}");
    }

    #[test]
    fn fencing_codes_are_told_apart_from_other_failures() {
        for code in FENCING {
            assert!(is_fencing(code), "{code:?}");
        }
        for code in [
            RDKafkaErrorCode::Fatal,
            RDKafkaErrorCode::MessageTimedOut,
            RDKafkaErrorCode::FencedLeaderEpoch,
        ] {
            assert!(!is_fencing(code), "{code:?}");
        }
    }

    #[test]
    fn an_epoch_error_fences_only_when_fatal() {
        let parts = |code, fatal| TransactionError::from_parts(code, "m".into(), fatal, &ids("x"));
        let bumped = parts(RDKafkaErrorCode::InvalidProducerEpoch, false);
        assert!(
            matches!(bumped, TransactionError::Abortable { .. }),
            "{bumped:?}"
        );
        let fatal = parts(RDKafkaErrorCode::InvalidProducerEpoch, true);
        assert!(
            matches!(fatal, TransactionError::Fenced { .. }),
            "{fatal:?}"
        );
        let fenced = parts(RDKafkaErrorCode::ProducerFenced, false);
        assert!(
            matches!(fenced, TransactionError::Fenced { .. }),
            "{fenced:?}"
        );
    }

    #[test]
    fn a_flush_timeout_is_abortable_and_a_fencing_names_the_id() {
        let e = TransactionError::from_kafka(
            KafkaError::Flush(RDKafkaErrorCode::MessageTimedOut),
            &ids("x"),
        );
        assert!(matches!(e, TransactionError::Abortable { .. }), "{e:?}");
        let e = TransactionError::Fenced {
            transactional_id: "outboxd-1/app/s".into(),
            message: "producer fenced".into(),
        };
        assert!(e.to_string().contains("\"outboxd-1/app/s\""), "{e}");
    }
}
