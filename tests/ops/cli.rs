//! The binary as operators run it: exit codes, and no secret in any output.
//! `run`, `tail`, `check`, `backfill` and `health` exit 2 on a configuration they
//! cannot use (a supervisor can tell that from an outage), and never print a
//! password, not even when quoting a broken line of the file. A halted
//! relay stops at once on SIGTERM.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::harness::kafka::shared;
use crate::harness::outboxd::{bin, tail};
use crate::harness::pg::{Auth, PgCluster, PgOptions};
use crate::harness::relay::{self, confirmed_lsn, lsn_now, Relay};
use crate::harness::wait::wait_for;

/// What one subcommand printed, and how it exited.
struct Output {
    code: Option<i32>,
    /// stdout and stderr together: a secret may leak through either.
    text: String,
}

fn outboxd(sub: &str, config: &Path, env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(bin());
    cmd.arg(sub).arg("--config").arg(config);
    if sub == "tail" {
        cmd.args(["--limit", "0"]);
    }
    if sub == "backfill" || sub == "audit" {
        cmd.args(["--since", "2026-12-01T00:00:00Z"]);
    }
    let out = cmd
        .envs(env.iter().copied())
        .env("OUTBOXD_LOG", "debug")
        .output()
        .expect("run outboxd");
    Output {
        code: out.status.code(),
        text: format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

const SUBCOMMANDS: [&str; 6] = ["run", "tail", "check", "backfill", "audit", "health"];

/// A TOML syntax error on the url line (the closing quote is missing), with
/// the password written into the file and substituted from the environment.
#[test]
fn syntax_error_on_the_url_line_prints_no_password() {
    // Nothing connects: the file is refused first.
    let dir = tempfile::tempdir().unwrap();
    let secret = "Hunter2-lit";
    let url = format!("postgresql://postgres:{secret}@127.0.0.1:1/app");
    let literal = dir.path().join("literal.toml");
    std::fs::write(
        &literal,
        format!("[postgres]\nurl = \"{url}\nslot = \"s\"\n[kafka]\nbrokers = \"127.0.0.1:9\"\n"),
    )
    .unwrap();
    let from_env = dir.path().join("env.toml");
    std::fs::write(
        &from_env,
        "[postgres]\nurl = \"${OUTBOXD_PG_URL}\nslot = \"s\"\n[kafka]\nbrokers = \"127.0.0.1:9\"\n",
    )
    .unwrap();
    let env_secret = "Hunter2-env";
    let env_url = format!("postgresql://postgres:{env_secret}@127.0.0.1:1/app");
    let env = [("OUTBOXD_PG_URL", env_url.as_str())];

    for sub in SUBCOMMANDS {
        for (config, vars, secret) in [
            (&literal, &[][..], secret),
            (&from_env, &env[..], env_secret),
        ] {
            let out = outboxd(sub, config, vars);
            assert!(
                !out.text.contains(secret),
                "outboxd {sub} printed the password of {}:\n{}",
                config.display(),
                out.text
            );
            // Still useful: where the error is, and what.
            assert!(out.text.contains("line 2"), "{sub}: {}", out.text);
            assert!(out.text.contains("url = \""), "{sub}: {}", out.text);
            assert_eq!(out.code, Some(2), "outboxd {sub}:\n{}", out.text);
        }
    }
}

/// Every way a configuration can be unusable exits 2 from each subcommand;
/// a usable one that fails against the server exits 1.
#[test]
fn bad_configuration_exits_2_and_a_failure_after_it_exits_1() {
    let pg = PgCluster::start(PgOptions::default().with_auth(Auth::Scram));
    pg.create_database("app");
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path
    };
    let url = format!("{}?sslmode=disable", pg.url("postgres", None, "app"));
    let brokers = "[kafka]\nbrokers = \"127.0.0.1:9\"\n";
    let bad = [
        dir.path().join("absent.toml"),
        write(
            "syntax.toml",
            format!("[postgres]\nurl = \"{url}\" x\n{brokers}"),
        ),
        write(
            "unknown.toml",
            format!("[postgres]\nurl = \"{url}\"\nslott = \"s\"\n{brokers}"),
        ),
        write(
            "invalid.toml",
            format!("[postgres]\nurl = \"{url}\"\nslot = \"Bad-Slot\"\n{brokers}"),
        ),
    ];
    // `check` reports this one on its config line and checks the rest (exit 1).
    let unset = write(
        "unset.toml",
        format!("[postgres]\nurl = \"{url}\"\npassword_env = \"OUTBOXD_TEST_UNSET_PW\"\n{brokers}"),
    );
    for sub in SUBCOMMANDS {
        let unset = (sub != "check").then_some(&unset);
        for config in bad.iter().chain(unset) {
            let out = outboxd(sub, config, &[]);
            assert_eq!(
                out.code,
                Some(2),
                "outboxd {sub} --config {}:\n{}",
                config.display(),
                out.text
            );
        }
    }

    // Usable configuration, wrong password: the server refuses, exit 1, and
    // the refusal does not repeat the password either.
    let wrong = write(
        "wrong.toml",
        format!(
            "[postgres]\nurl = \"{}?sslmode=disable\"\n{brokers}",
            pg.url("postgres", Some("Wrong-pw-123"), "app")
        ),
    );
    let out = outboxd("tail", &wrong, &[]);
    assert_eq!(out.code, Some(1), "{}", out.text);
    assert!(
        out.text.contains("password authentication failed"),
        "{}",
        out.text
    );
    assert!(!out.text.contains("Wrong-pw-123"), "{}", out.text);
}

/// A relay halted by a poison event (`relay.on_error = "stop"`, the default)
/// has nothing left to drain: SIGTERM ends it at once, not after
/// `relay.shutdown_timeout`, with exit 0 and the slot still before the
/// poison event.
#[test]
fn halted_relay_exits_at_once_on_sigterm() {
    let broker = shared();
    let e = relay::env(
        broker.bootstrap(),
        "haltterm",
        "[relay]\nshutdown_timeout = \"30s\"\n",
    );
    let mut relay = Relay::start(&e);
    let small = "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
                 VALUES ('p', 'a', 'small', '{}')";
    e.pg.psql("app", small);
    // 1.5 MB: over the producer's message.max.bytes, refused for itself.
    // Inside a transaction with a small event after it, so the halt comes
    // mid-transaction.
    e.pg.psql(
        "app",
        &format!(
            "BEGIN; INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
             SELECT 'p', 'a', 'huge', jsonb_build_object('blob', string_agg(md5(i::text), '')) \
             FROM generate_series(1, 48000) i; {small}; COMMIT;"
        ),
    );
    let after_poison = lsn_now(&e.pg);
    e.pg.psql("app", small);
    assert_eq!(
        broker
            .consume_all("haltterm.p", 1, Duration::from_secs(60))
            .len(),
        1
    );
    wait_for("the halt", Duration::from_secs(30), || {
        relay.log().contains("relay halted")
    });

    relay.signal("-TERM");
    let asked = Instant::now();
    let status = relay
        .wait(Duration::from_secs(20))
        .unwrap_or_else(|| panic!("still running 20 s after SIGTERM:\n{}", relay.log()));
    let took = asked.elapsed();
    eprintln!("halted relay stopped {took:?} after SIGTERM");
    assert!(
        took < Duration::from_secs(3),
        "took {took:?} to stop:\n{}",
        relay.log()
    );
    assert!(status.success(), "exit {status:?}:\n{}", relay.log());
    let confirmed = confirmed_lsn(&e.pg, "haltterm");
    assert!(
        confirmed < after_poison,
        "slot confirmed {confirmed}, past the poison event's transaction (ends by {after_poison})"
    );
    assert_eq!(broker.record_count("haltterm.p"), 1, "{}", relay.log());
}

/// A build without the `gssapi` feature refuses Kerberos before starting,
/// naming the feature, instead of librdkafka's "No provider for SASL
/// mechanism GSSAPI" at the first producer.
#[cfg(not(feature = "gssapi"))]
#[test]
fn gssapi_without_the_feature_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gssapi.toml");
    std::fs::write(
        &config,
        "[postgres]\nurl = \"postgresql://outboxd@127.0.0.1:1/app\"\n\
         [kafka]\nbrokers = \"127.0.0.1:9\"\n\
         [kafka.properties]\n\"security.protocol\" = \"SASL_PLAINTEXT\"\n\
         \"sasl.mechanisms\" = \"GSSAPI\"\n",
    )
    .unwrap();
    let out = outboxd("run", &config, &[]);
    assert_eq!(out.code, Some(2), "{}", out.text);
    assert!(
        out.text.contains("kafka.properties.\"sasl.mechanisms\""),
        "{}",
        out.text
    );
    assert!(out.text.contains("--features gssapi"), "{}", out.text);
}

/// What operators did: `tail --limit 1` on the slot `run` uses, to look at
/// the next event, then `run`. The event still reaches Kafka.
#[test]
fn run_relays_what_tail_printed() {
    let broker = shared();
    let e = relay::env(broker.bootstrap(), "tailthenrun", "");
    e.pg.psql(
        "app",
        "INSERT INTO outbox (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('t', 'a', 'peeked', '{\"n\": 1}')",
    );
    let before = confirmed_lsn(&e.pg, "tailthenrun");
    let peek = tail(&e.config, &["--limit", "1"], Duration::from_secs(60));
    assert!(peek.success, "{}", peek.stderr);
    assert_eq!(peek.events.len(), 1, "{}", peek.stderr);
    let moved = confirmed_lsn(&e.pg, "tailthenrun");

    let relay = Relay::start(&e);
    let got = broker.consume_all("tailthenrun.t", 1, Duration::from_secs(30));
    assert_eq!(
        got.len(),
        1,
        "the event tail printed was not relayed (tail moved the slot from {before} to {moved}):\n{}",
        relay.log()
    );
    assert_eq!(moved, before, "tail moved the slot");
    assert!(
        got[0].value_str().unwrap().contains("\"n\": 1"),
        "{:?}",
        got[0].value_str()
    );
}

/// Issue 40: the secrets of each Kafka security mode (a SASL password, the
/// client key's pass phrase), from the environment, are in no output of
/// `check` with debug logs, whether the broker takes them or not, nor in
/// the error quoting a broken line of the file that holds their reference.
#[test]
fn kafka_secrets_of_every_security_mode_are_in_no_output() {
    use crate::harness::kafka_secure::{secured, Mode, PASSWORD_VAR};
    let kafka = secured();
    let dir = tempfile::tempdir().unwrap();
    let wrong = "Hunter2-kafka";
    for mode in Mode::ALL {
        let properties = kafka.properties(mode);
        let text = format!(
            "[postgres]\nurl = \"postgresql://postgres@127.0.0.1:1/app\"\nslot = \"s\"\n\
             [kafka]\nbrokers = \"{}\"\n[kafka.properties]\n{properties}",
            kafka.bootstrap(mode)
        );
        let config = dir.path().join(format!("{}.toml", mode.tag()));
        std::fs::write(&config, &text).unwrap();
        // The reference's closing quote missing: the line is quoted.
        let broken = dir.path().join(format!("{}-broken.toml", mode.tag()));
        let reference = format!("\"${{{PASSWORD_VAR}}}\"");
        let unclosed = text.replacen(&reference, &reference[..reference.len() - 1], 1);
        std::fs::write(&broken, unclosed).unwrap();
        for secret in [kafka.secret(), wrong] {
            for config in [&config, &broken] {
                let out = outboxd("check", config, &[(PASSWORD_VAR, secret)]);
                assert!(
                    !out.text.contains(secret),
                    "check ({mode:?}) printed the secret with {}:\n{}",
                    config.display(),
                    out.text
                );
                assert!(matches!(out.code, Some(1 | 2)), "{mode:?}: {}", out.text);
            }
        }
    }
}
