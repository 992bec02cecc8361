//! The `rights` lines of `outboxd check`: for every topic known before the
//! first event (fixed routing topics, the dead-letter topic, the position
//! ledger), the ACL operations the principal lacks, from the authorised
//! operations Kafka reports (KIP-430), each with the `kafka-acls.sh`
//! command that grants it. Nothing is produced or created.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::admin::AdminClient;
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;

use crate::config::routing::{parse_template, TemplatePart};
use crate::config::Config;
use crate::sink::probe::describe_topics::authorized_operations;
use crate::sink::probe::topic_rights::{
    grant_command, judge, principal, Principal, Right, Rights, TopicRole,
};

use super::kafka::templates;
use super::line::Line;

const NAME: &str = "rights";

/// One DescribeTopics round trip, as the other probes allow.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A topic whose rights are checked: its name, where it is configured,
/// what it is to outboxd.
struct Checked {
    topic: String,
    setting: String,
    role: TopicRole,
}

/// The topics known at check time: templates without placeholders, the
/// dead-letter topic, the ledger; each (topic, role) once.
fn topics(cfg: &Config) -> Vec<Checked> {
    let mut out: Vec<Checked> = Vec::new();
    let fixed = templates(cfg).into_iter().filter(|(_, template)| {
        parse_template(template)
            .is_ok_and(|p| p.iter().all(|p| matches!(p, TemplatePart::Literal(_))))
    });
    let ledger = (
        "kafka.ledger_topic".to_owned(),
        cfg.kafka.ledger_topic.clone(),
    );
    for (setting, topic) in fixed.chain([ledger]) {
        let role = match setting.as_str() {
            "relay.dead_letter_topic" => TopicRole::DeadLetter,
            "kafka.ledger_topic" => TopicRole::Ledger,
            _ => TopicRole::Outbox,
        };
        if !out.iter().any(|c| c.topic == topic && c.role == role) {
            out.push(Checked {
                topic,
                setting,
                role,
            });
        }
    }
    out
}

pub(crate) async fn lines(
    admin: &Arc<AdminClient<DefaultClientContext>>,
    cfg: &Config,
    brokers: &str,
) -> Vec<Line> {
    let checked = topics(cfg);
    let names = unique_names(&checked);
    let answers = match authorized_operations(admin, &names, REQUEST_TIMEOUT).await {
        Ok(answers) => answers,
        Err(code) => return vec![request_failed(code)],
    };
    let who = principal(&cfg.kafka.properties);
    checked
        .iter()
        .filter_map(|c| {
            let (_, answer) = answers.iter().find(|(name, _)| *name == c.topic)?;
            Some(line(c, judge(c.role, answer), cfg, brokers, &who))
        })
        .collect()
}

/// Each topic once, in order: a topic of two roles (a route that is also
/// the dead-letter topic) is asked about once, as librdkafka refuses a
/// request naming a topic twice.
fn unique_names(checked: &[Checked]) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for c in checked {
        if !names.contains(&c.topic) {
            names.push(c.topic.clone());
        }
    }
    names
}

fn request_failed(code: RDKafkaErrorCode) -> Line {
    let why = format!("DescribeTopics failed: {code}");
    match code {
        RDKafkaErrorCode::UnsupportedVersion => Line::warn(
            NAME,
            format!(
                "{why}; the brokers cannot report a principal's rights (KIP-430 needs Kafka \
                 2.3 or newer): not checked"
            ),
        ),
        _ => Line::fail(NAME, why),
    }
}

fn role_name(role: TopicRole) -> &'static str {
    match role {
        TopicRole::Outbox => "outbox topic",
        TopicRole::DeadLetter => "dead-letter topic",
        TopicRole::Ledger => "ledger topic",
    }
}

fn labels(rights: &[Right]) -> String {
    rights
        .iter()
        .map(|r| r.label())
        .collect::<Vec<_>>()
        .join(", ")
}

fn line(c: &Checked, rights: Rights, cfg: &Config, brokers: &str, who: &Principal) -> Line {
    let at = format!("{} ({}, {})", c.topic, c.setting, role_name(c.role));
    let needed = c.role.rights();
    let grant = |missing: &[Right]| {
        format!(
            "grant it with {} ({}): {}",
            who.name,
            who.origin,
            grant_command(brokers, &who.name, missing, &c.topic)
        )
    };
    match rights {
        Rights::Granted => Line::ok(NAME, format!("{at}: {} granted", labels(needed))),
        Rights::Missing(missing) => Line::fail(
            NAME,
            format!(
                "{at}: the principal lacks {} (needs {}); {}",
                labels(&missing),
                labels(needed),
                grant(&missing)
            ),
        ),
        Rights::DescribeRefused => Line::fail(
            NAME,
            format!(
                "{at}: the principal lacks DESCRIBE (TopicAuthorizationFailed; Kafka tells \
                 nothing more about a topic without it, needs {}); {}",
                labels(needed),
                grant(needed)
            ),
        ),
        Rights::NoTopic if cfg.kafka.create_topics => Line::ok(
            NAME,
            format!(
                "{at}: does not exist yet; outboxd creates it (CREATE validated on the {} line); \
                 the rights it needs then ({}) can be read once it exists",
                if c.role == TopicRole::Ledger {
                    "ledger topic"
                } else {
                    "topics"
                },
                labels(needed)
            ),
        ),
        Rights::NoTopic => Line::skip(NAME, &format!("{at}: does not exist (see topics)")),
        Rights::NotReported => Line::warn(
            NAME,
            format!(
                "{at}: the brokers reported no authorised operations (KIP-430 needs Kafka 2.3 \
                 or newer): {} not checked",
                labels(needed)
            ),
        ),
        Rights::Unknown(code) => {
            Line::warn(NAME, format!("{at}: its rights could not be read: {code}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::check::line::Verdict;

    fn ledger() -> Checked {
        Checked {
            topic: "outboxd.positions".into(),
            setting: "kafka.ledger_topic".into(),
            role: TopicRole::Ledger,
        }
    }

    fn relay() -> Principal {
        Principal {
            name: "User:relay".into(),
            origin: "from kafka.properties.\"sasl.username\"",
        }
    }

    #[test]
    fn a_missing_right_fails_with_the_command_and_where_the_principal_comes_from() {
        let cfg = Config::default();
        let l = line(
            &ledger(),
            Rights::Missing(vec![Right::Read]),
            &cfg,
            "b:9092",
            &relay(),
        );
        assert_eq!(l.verdict, Verdict::Fail);
        assert!(l.detail.contains("lacks READ"), "{}", l.detail);
        assert!(l.detail.contains("sasl.username"), "{}", l.detail);
        assert!(
            l.detail.contains(
                "kafka-acls.sh --bootstrap-server b:9092 --add --allow-principal User:relay \
                 --operation Read --topic outboxd.positions"
            ),
            "{}",
            l.detail
        );
        let refused = line(&ledger(), Rights::DescribeRefused, &cfg, "b:9092", &relay());
        assert_eq!(refused.verdict, Verdict::Fail);
        assert!(
            refused.detail.contains(
                "--operation Read --operation Write --operation Describe --operation \
                 DescribeConfigs --topic outboxd.positions"
            ),
            "{}",
            refused.detail
        );
    }

    #[test]
    fn a_topic_of_two_roles_is_asked_about_once_and_judged_for_each() {
        let mut cfg = Config::default();
        cfg.relay.on_error = crate::config::OnError::DeadLetter;
        cfg.relay.dead_letter_topic = Some("orders".into());
        cfg.routing.topic = "orders".into();
        let checked = topics(&cfg);
        let roles: Vec<(&str, TopicRole)> =
            checked.iter().map(|c| (c.topic.as_str(), c.role)).collect();
        assert_eq!(
            roles,
            vec![
                ("orders", TopicRole::Outbox),
                ("orders", TopicRole::DeadLetter),
                ("outboxd.positions", TopicRole::Ledger),
            ]
        );
        assert_eq!(unique_names(&checked), vec!["orders", "outboxd.positions"]);
    }

    #[test]
    fn a_topic_still_to_create_is_fine_only_when_outboxd_creates_it() {
        let mut cfg = Config::default();
        cfg.kafka.create_topics = true;
        let l = line(&ledger(), Rights::NoTopic, &cfg, "b", &relay());
        assert_eq!(l.verdict, Verdict::Ok, "{}", l.detail);
        cfg.kafka.create_topics = false;
        let l = line(&ledger(), Rights::NoTopic, &cfg, "b", &relay());
        assert_eq!(l.verdict, Verdict::Skip, "{}", l.detail);
        let l = line(&ledger(), Rights::Granted, &cfg, "b", &relay());
        assert_eq!(l.verdict, Verdict::Ok, "{}", l.detail);
        let l = line(&ledger(), Rights::NotReported, &cfg, "b", &relay());
        assert_eq!(l.verdict, Verdict::Warn, "{}", l.detail);
    }
}
