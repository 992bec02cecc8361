//! The transactional producer's commit and abort against librdkafka's mock
//! cluster, with its broker taken down mid-commit: the cases a real broker
//! gives only now and then (a paused or restarted broker).

use std::time::Duration;

use rdkafka::mocking::MockCluster;
use rdkafka::producer::DefaultProducerContext;
use rdkafka::types::RDKafkaErrorCode;

use super::config::QueueBound;
use super::producer::KafkaSink;
use super::transaction::{
    abort_now, commit_now, TransactionCall, TransactionControl, TransactionError,
};
use crate::config::KafkaConfig;

const NO_HEADERS: &[(&str, Option<&[u8]>)] = &[];

/// A transactional sink on `mock` with one record sent in an open
/// transaction on topic `t`.
async fn one_record_open(
    mock: &MockCluster<'_, DefaultProducerContext>,
) -> (KafkaSink, TransactionControl) {
    mock.create_topic("t", 1, 1).unwrap();
    let (sink, control) = KafkaSink::transactional(
        &mock.bootstrap_servers(),
        &KafkaConfig::default(),
        QueueBound::default(),
        None,
        "outboxd-test",
    )
    .unwrap();
    control.init("t", Duration::from_secs(20)).await.unwrap();
    control.begin().unwrap();
    sink.send(1, "t", Some(b"k"), Some(b"v"), NO_HEADERS, None)
        .unwrap();
    (sink, control)
}

async fn report_of(sink: &mut KafkaSink) -> crate::sink::delivery::DeliveryReport {
    tokio::time::timeout(Duration::from_secs(20), sink.next_report())
        .await
        .expect("no delivery report within 20 s")
        .expect("report channel closed")
}

/// The broker down for 3 s while a commit waits on it, in 1 s calls: each
/// comes back retriable and is called again, and the commit succeeds once
/// the broker is back. Abandoned after its first call, as the relay did, it
/// left librdkafka refusing the abort that followed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_that_waits_on_a_downed_broker_is_resumed_until_it_succeeds() {
    let mock = MockCluster::new(1).unwrap();
    let (mut sink, control) = one_record_open(&mock).await;
    mock.broker_down(1).unwrap();
    let started = std::time::Instant::now();
    let commit = {
        let control = control.clone();
        tokio::spawn(async move {
            control
                .resumed(
                    TransactionCall::Commit,
                    Duration::from_secs(30),
                    Duration::from_secs(1),
                    commit_now,
                )
                .await
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !commit.is_finished(),
        "the commit ended with the broker down"
    );
    mock.broker_up(1).unwrap();
    let result = commit.await.unwrap();
    assert_eq!(result, Ok(()));
    assert!(started.elapsed() >= Duration::from_secs(3));
    let report = report_of(&mut sink).await;
    assert!(report.result.is_ok(), "{report:?}");
}

/// A commit still waiting when its budget runs out says so (`Unfinished`),
/// and librdkafka then refuses an abort: the call goes on in the background,
/// and calling the commit again once the broker is back finishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_unfinished_within_its_budget_refuses_an_abort_and_resumes_later() {
    let mock = MockCluster::new(1).unwrap();
    let (_sink, control) = one_record_open(&mock).await;
    mock.broker_down(1).unwrap();
    let budget = Duration::from_secs(2);
    let step = Duration::from_secs(1);
    let unfinished = control
        .resumed(TransactionCall::Commit, budget, step, commit_now)
        .await;
    assert!(
        matches!(
            unfinished,
            Err(TransactionError::Unfinished {
                call: TransactionCall::Commit,
                ..
            })
        ),
        "{unfinished:?}"
    );
    let abort = control
        .resumed(TransactionCall::Abort, budget, step, abort_now)
        .await;
    let Err(TransactionError::Abortable {
        code: RDKafkaErrorCode::Conflict,
        message,
    }) = abort
    else {
        panic!("an abort during an unfinished commit: {abort:?}");
    };
    assert!(message.contains("commit_transaction"), "{message}");
    mock.broker_up(1).unwrap();
    let resumed = control
        .resumed(
            TransactionCall::Commit,
            Duration::from_secs(30),
            step,
            commit_now,
        )
        .await;
    assert_eq!(resumed, Ok(()));
}
