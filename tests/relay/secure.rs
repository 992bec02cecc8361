//! Issue 40 §5: the relay on a secured broker, in each way of logging in
//! (SCRAM-SHA-256, SCRAM-SHA-512, PLAIN, mutual TLS, OAUTHBEARER), in both
//! delivery modes, granted exactly the least privilege of
//! [`grant_relay_least_privilege`]: `check` passes, 5,000 events from two
//! writers all arrive in per-key order, and the secret (password, key pass
//! phrase) is in none of the output, metrics or health answers.
//!
//! One broker for the whole module ([`secured`]); each run has its own
//! database, slot, topics, ledger topic and transactional id.

use std::time::{Duration, Instant};

use super::exactly_once::{spawn_writers, EXACTLY_ONCE};
use super::faults::join;
use super::standby::readyz_until;
use crate::harness::events::{payload_texts, verify_reading, ReadBack};
use crate::harness::http::{free_port, get};
use crate::harness::kafka_secure::{
    grant_relay_least_privilege, secured, Mode, RelayResources, PASSWORD_VAR,
};
use crate::harness::relay::{edit_config, env, use_ledger_topic, Relay};
use crate::ops::check::support::check_with;

/// The acceptance figure of issue 40.
const EVENTS: usize = 5_000;
const WRITERS: usize = 2;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Delivery {
    AtLeastOnce,
    ExactlyOnce,
}

/// One relay in `mode` and `delivery` on the secured broker, end to end.
async fn relays_with_least_privilege(mode: Mode, delivery: Delivery) {
    let kafka = tokio::task::block_in_place(secured);
    let started = Instant::now();
    let slot = format!(
        "sec_{}_{}",
        mode.tag(),
        if delivery == Delivery::ExactlyOnce {
            "eos"
        } else {
            "alo"
        }
    );
    let ledger = format!("{slot}-ledger");
    let tx_id = format!("{slot}-tx");
    let mut extra = format!("[kafka.properties]\n{}", kafka.properties(mode));
    if delivery == Delivery::ExactlyOnce {
        extra.push_str(EXACTLY_ONCE);
    }
    let e = env(kafka.bootstrap(mode), &slot, &extra);
    use_ledger_topic(&e, &ledger);
    edit_config(
        &e,
        "topic_partitions = 3\n",
        &format!("topic_partitions = 3\ntransactional_id = \"{tx_id}\"\n"),
    );
    let prefix = format!("{slot}.");
    tokio::task::block_in_place(|| {
        grant_relay_least_privilege(
            kafka,
            &mode.principal(),
            &RelayResources {
                topic_prefix: &prefix,
                ledger_topic: &ledger,
                transactional_id: (delivery == Delivery::ExactlyOnce).then_some(tx_id.as_str()),
            },
        )
    });

    // The ACLs take a moment to reach the authoriser: check until it passes.
    let env_vars = kafka.env();
    let mut kafka_lines = vec!["kafka", "ledger topic", "idempotence"];
    if delivery == Delivery::ExactlyOnce {
        kafka_lines.extend(["transactions", "transactional id"]);
    }
    let checked = tokio::task::block_in_place(|| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let out = check_with(Some(&e.config), &env_vars);
            let kafka_fine = kafka_lines.iter().all(|name| out.line(name).0 == "ok");
            if kafka_fine || Instant::now() > deadline {
                break out;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    for name in kafka_lines {
        let verdict = checked.line(name).0;
        assert_eq!(verdict, "ok", "{mode:?} {delivery:?}:\n{checked}");
    }
    let check_output = format!("{checked}");

    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut vars = env_vars.to_vec();
    vars.push(("OUTBOXD_METRICS__LISTEN", listen.as_str()));
    let relay = Relay::start_with_env(&e, &vars);
    let writers = spawn_writers(&e, &slot, EVENTS, WRITERS);
    let sent = join(writers).await;
    assert_eq!(sent.len(), EVENTS);
    let texts = payload_texts(&e.pg);
    let logs = e.dir.path().to_path_buf();
    let read = match delivery {
        Delivery::AtLeastOnce => ReadBack::Count,
        Delivery::ExactlyOnce => ReadBack::ToEnd,
    };
    let v = tokio::task::block_in_place(|| {
        verify_reading(
            &kafka.broker,
            &sent,
            &texts,
            Duration::from_secs(240),
            delivery == Delivery::AtLeastOnce,
            true,
            read,
            &logs,
        )
    });
    assert_eq!(v.delivered, EVENTS, "relay log:\n{}", relay.log());
    if delivery == Delivery::ExactlyOnce {
        assert_eq!(v.duplicates, 0);
    }
    let ready = tokio::task::block_in_place(|| {
        readyz_until(port, Duration::from_secs(30), |s, _| s == 200)
    });
    assert_eq!(ready.as_ref().map(|r| r.0), Some(200), "/readyz: {ready:?}");
    let metrics = tokio::task::block_in_place(|| get(port, "/metrics"))
        .map(|(_, body)| body)
        .unwrap_or_default();
    assert!(metrics.contains("outboxd_"), "no metrics: {metrics}");
    let log = relay.log();
    for (what, text) in [
        ("relay log", log.as_str()),
        ("check output", check_output.as_str()),
        ("/metrics", metrics.as_str()),
        ("/readyz", &format!("{ready:?}")),
    ] {
        assert!(
            !text.contains(kafka.secret()),
            "{mode:?} {delivery:?}: the secret is in the {what}"
        );
    }
    drop(relay);
    eprintln!(
        "secured {mode:?} {delivery:?}: {} of {EVENTS} events delivered, {} duplicates, \
         per-key order kept, in {:.1}s",
        v.delivered,
        v.duplicates,
        started.elapsed().as_secs_f64()
    );
}

/// Both delivery modes, one after the other (the broker is shared; two
/// relays of one mode at once would only slow each other down).
async fn both_delivery_modes(mode: Mode) {
    relays_with_least_privilege(mode, Delivery::AtLeastOnce).await;
    relays_with_least_privilege(mode, Delivery::ExactlyOnce).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_sha_256_relays_in_both_modes_with_least_privilege() {
    both_delivery_modes(Mode::ScramSha256).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_sha_512_relays_in_both_modes_with_least_privilege() {
    both_delivery_modes(Mode::ScramSha512).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_relays_in_both_modes_with_least_privilege() {
    both_delivery_modes(Mode::Plain).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_relays_in_both_modes_with_least_privilege() {
    both_delivery_modes(Mode::MutualTls).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oauthbearer_relays_in_both_modes_with_least_privilege() {
    both_delivery_modes(Mode::OAuthBearer).await;
}

/// Issue 40 §4: while Kafka refuses the relay's login, `/readyz` and the
/// log say so, naming the setting, and not PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_makes_readyz_name_kafka_and_the_setting() {
    let kafka = tokio::task::block_in_place(secured);
    let mode = Mode::ScramSha512;
    let slot = "sec_wrongpw";
    let extra = format!("[kafka.properties]\n{}", kafka.properties(mode));
    let e = env(kafka.bootstrap(mode), slot, &extra);
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let wrong = "not-the-password";
    let relay = Relay::start_with_env(
        &e,
        &[
            (PASSWORD_VAR, wrong),
            ("OUTBOXD_METRICS__LISTEN", listen.as_str()),
        ],
    );
    let named = |_: u16, body: &str| body.contains("Kafka") && body.contains("sasl.password");
    let answer = tokio::task::block_in_place(|| readyz_until(port, Duration::from_secs(60), named));
    eprintln!("/readyz with a wrong password: {answer:?}");
    let log = relay.log();
    assert!(
        answer
            .as_ref()
            .is_some_and(|(s, b)| *s == 503 && named(*s, b)),
        "/readyz: {answer:?}\nrelay log:\n{log}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("Kafka refused the connection") && l.contains("sasl.password")),
        "the log does not name Kafka's refusal and the setting:\n{log}"
    );
    for text in [log.as_str(), &format!("{answer:?}")] {
        assert!(!text.contains(wrong) && !text.contains(kafka.secret()));
    }
}
