//! The Kafka half of `outboxd check`: the brokers answer, the topics known
//! before any event (no placeholders) exist or may be created, the position
//! ledger's topic is compacted or may be created so, and the cluster lets an
//! idempotent producer in.
//!
//! Creating nothing: the questions are asked by `sink::probe`.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::admin::{AdminClient, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaRespErr;

use crate::config::routing::{parse_template, TemplatePart};
use crate::config::{Config, OnError};
use crate::sink::probe::producer_id::{producer_id, ProducerIdError};
use crate::sink::probe::{admin_client, validate_topic_creation};
use crate::sink::{
    inspect_ledger_topic, new_ledger_topic, LedgerTopicError, LedgerTopicState, SinkError,
    LEDGER_TOPIC_PARTITIONS,
};

use super::kafka_reach::{self, Reach};
use super::line::Line;
use crate::sink::connect_cause::ConnectCause;
use crate::sink::probe::ledger_replicas;

/// One metadata round trip, as the relay's topic manager allows.
const METADATA_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) fn skipped(why: &str) -> Vec<Line> {
    vec![
        Line::skip("kafka", why),
        Line::skip("topics", why),
        Line::skip("ledger topic", why),
        Line::skip("idempotence", why),
        Line::skip("rights", why),
    ]
}

pub(crate) async fn check(brokers: String, cfg: Config) -> Vec<Line> {
    let admin = match admin_client(&brokers, &cfg) {
        Ok(admin) => admin,
        Err(e) => {
            let mut lines = skipped("no Kafka client (see kafka)");
            lines[0] = Line::fail("kafka", e);
            return lines;
        }
    };
    let reach = match kafka_reach::reach(&brokers, &cfg, METADATA_TIMEOUT).await {
        Ok(reach) => reach,
        Err(e) => {
            let mut lines = skipped("no Kafka client (see kafka)");
            lines[0] = Line::fail("kafka", e);
            return lines;
        }
    };
    match reach {
        Reach::Answered(n) => {
            let mut lines = vec![Line::ok(
                "kafka",
                format!("{n} broker(s) answered a metadata request via {brokers}"),
            )];
            lines.extend(topic_lines(&admin, &cfg).await);
            lines.push(ledger_line(&admin, &cfg).await);
            lines.push(idempotence_line(&brokers, &cfg).await);
            lines.extend(super::rights::lines(&admin, &cfg, &brokers).await);
            lines
        }
        Reach::Failed {
            cause: Some(cause),
            said,
            ..
        } if cause.is_refusal() => {
            let (cause, said) = match cause {
                // librdkafka's text for it blames ssl.ca.location whatever
                // the reason: not quoted once the reason is known.
                ConnectCause::CertificateUnverified => {
                    match kafka_reach::unverified_certificate(&brokers, &cfg, METADATA_TIMEOUT)
                        .await
                    {
                        ConnectCause::CertificateUnverified => (cause, said),
                        known => (known, None),
                    }
                }
                cause => (cause, said),
            };
            let mut lines = skipped("Kafka refused the connection (see kafka)");
            let said = said.map_or(String::new(), |s| format!(" (librdkafka: {s})"));
            lines[0] = Line::fail(
                "kafka",
                format!("kafka.brokers = {brokers:?}: {cause}{said}"),
            );
            lines
        }
        // Not a refusal: the broker may be down, or not up yet.
        Reach::Failed { cause, said, error } => {
            let why = match (cause, said) {
                (Some(cause), Some(said)) => format!("{cause} (librdkafka: {said})"),
                _ => error.to_string(),
            };
            let mut lines = skipped("Kafka did not answer (see kafka)");
            lines[0] = Line::fail(
                "kafka",
                format!(
                    "no metadata from kafka.brokers = {brokers:?} within {}s: {why}; check the \
                     addresses, that the brokers run and are reachable from here, and the security \
                     settings in [kafka.properties]",
                    METADATA_TIMEOUT.as_secs()
                ),
            );
            lines
        }
    }
}

/// Topic templates and where each is configured. Topics the relay may
/// write to: the default route, each rule's, and the dead-letter topic.
pub(super) fn templates(cfg: &Config) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut keys_seen = Vec::new();
    for t in cfg.tables() {
        // Entries inheriting `[routing]` share its templates: listed once.
        if keys_seen.contains(&t.routing_key) {
            continue;
        }
        let r = &t.routing;
        out.push((format!("{}.topic", t.routing_key), r.topic.clone()));
        for (i, rule) in r.rules.iter().enumerate() {
            out.push((
                format!("{}.rules[{i}].topic", t.routing_key),
                rule.topic.clone(),
            ));
        }
        keys_seen.push(t.routing_key);
    }
    if cfg.relay.on_error == OnError::DeadLetter {
        if let Some(t) = &cfg.relay.dead_letter_topic {
            out.push(("relay.dead_letter_topic".to_string(), t.clone()));
        }
    }
    out
}

async fn topic_lines(admin: &Arc<AdminClient<DefaultClientContext>>, cfg: &Config) -> Vec<Line> {
    let mut lines = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    for t in cfg.tables() {
        if let Some(column) = t.columns.column_for_role("topic") {
            lines.push(Line::ok(
                "topics",
                format!(
                    "column `{column}` ({}.columns.topic): decided per event",
                    t.key
                ),
            ));
        }
    }
    for (setting, template) in templates(cfg) {
        let fixed = parse_template(&template)
            .is_ok_and(|p| p.iter().all(|p| matches!(p, TemplatePart::Literal(_))));
        if !fixed {
            let note = if cfg.kafka.create_topics {
                ""
            } else {
                "; kafka.create_topics = false, so each must exist before its first event"
            };
            lines.push(Line::ok(
                "topics",
                format!("{template} ({setting}): decided per event{note}"),
            ));
            continue;
        }
        if seen.contains(&template) {
            continue;
        }
        seen.push(template.clone());
        lines.push(topic_line(admin, cfg, &template, &setting).await);
    }
    lines
}

async fn topic_line(
    admin: &Arc<AdminClient<DefaultClientContext>>,
    cfg: &Config,
    topic: &str,
    setting: &str,
) -> Line {
    let state = crate::sink::describe_topic(admin, topic).await;
    let at = format!("{topic} ({setting})");
    match state {
        Err(source) => Line::fail(
            "topics",
            SinkError::Metadata {
                topic: topic.into(),
                source,
            },
        ),
        Ok(Some((None, partitions))) => {
            Line::ok("topics", format!("{at}: exists, {partitions} partition(s)"))
        }
        Ok(None) | Ok(Some((Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART), _))) => {
            if !cfg.kafka.create_topics {
                return Line::fail(
                    "topics",
                    SinkError::MissingTopic {
                        topic: topic.into(),
                    },
                );
            }
            let new = NewTopic::new(
                topic,
                cfg.kafka.topic_partitions,
                TopicReplication::Fixed(cfg.kafka.topic_replication_factor),
            );
            match validate_topic_creation(admin, &new).await {
                Ok(()) => Line::ok(
                    "topics",
                    format!(
                        "{at}: does not exist yet; the cluster accepts creating it with {} \
                         partition(s), replication factor {} (validated, not created)",
                        cfg.kafka.topic_partitions, cfg.kafka.topic_replication_factor
                    ),
                ),
                Err(code) => Line::fail(
                    "topics",
                    SinkError::CreateTopic {
                        topic: topic.into(),
                        code,
                    },
                ),
            }
        }
        // Being created right now: as good as existing for the relay.
        Ok(Some((Some(RDKafkaRespErr::RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE), _))) => Line::ok(
            "topics",
            format!("{at}: exists, partitions still electing leaders"),
        ),
        Ok(Some((Some(err), _))) => Line::fail(
            "topics",
            SinkError::Topic {
                topic: topic.into(),
                code: err.into(),
            },
        ),
    }
}

/// The position ledger's topic (`kafka.ledger_topic`): compacted, or
/// missing and creatable so (validated, not created).
async fn ledger_line(admin: &Arc<AdminClient<DefaultClientContext>>, cfg: &Config) -> Line {
    const NAME: &str = "ledger topic";
    let topic = cfg.kafka.ledger_topic.as_str();
    let at = format!("{topic} (kafka.ledger_topic)");
    match inspect_ledger_topic(admin, topic).await {
        Ok(LedgerTopicState::Compacted { partitions }) => {
            let fine = format!("{at}: exists, compacted, {partitions} partition(s)");
            let judged = ledger_replicas::replication(admin, topic)
                .await
                .map(|r| ledger_replicas::judge(r, cfg.kafka.ledger_replication_factor));
            match judged {
                Ok(Ok(None)) => Line::ok(NAME, fine),
                Ok(Ok(Some(warning))) => Line::warn(NAME, format!("{fine}; {warning}")),
                Ok(Err(refused)) => Line::fail(NAME, format!("{fine}; {refused}")),
                Err(unknown) => Line::warn(
                    NAME,
                    format!("{fine}; its replication could not be checked: {unknown}"),
                ),
            }
        }
        Ok(LedgerTopicState::NotCompacted { policy }) => Line::fail(
            NAME,
            LedgerTopicError::NotCompacted {
                topic: topic.into(),
                policy,
            },
        ),
        Ok(LedgerTopicState::Missing) if !cfg.kafka.create_topics => Line::fail(
            NAME,
            LedgerTopicError::Missing {
                topic: topic.into(),
            },
        ),
        Ok(LedgerTopicState::Missing) => {
            let new = new_ledger_topic(topic, cfg.kafka.ledger_replication_factor);
            match validate_topic_creation(admin, &new).await {
                Ok(()) => Line::ok(
                    NAME,
                    format!(
                        "{at}: does not exist yet; the cluster accepts creating it compacted with \
                         {LEDGER_TOPIC_PARTITIONS} partition(s), {} (validated, not created)",
                        match cfg.kafka.ledger_replication_factor {
                            -1 => "the broker's default replication factor".to_owned(),
                            n => format!("replication factor {n}"),
                        }
                    ),
                ),
                Err(code) => Line::fail(
                    NAME,
                    SinkError::CreateTopic {
                        topic: topic.into(),
                        code,
                    },
                ),
            }
        }
        Err(e) => Line::fail(NAME, e),
    }
}

async fn idempotence_line(brokers: &str, cfg: &Config) -> Line {
    match producer_id(brokers, cfg).await {
        Ok(()) => Line::ok(
            "idempotence",
            "an idempotent producer (the relay's settings) was given a producer id; nothing was produced",
        ),
        Err(ProducerIdError::Refused(reason)) => Line::fail(
            "idempotence",
            format!(
                "the cluster did not let an idempotent producer in: {reason}; grant the principal \
                 IDEMPOTENT_WRITE on the cluster (Kafka < 3.0) or WRITE on the topics, and check \
                 that every broker runs Kafka 0.11 or newer"
            ),
        ),
        Err(e) => Line::fail("idempotence", e),
    }
}
