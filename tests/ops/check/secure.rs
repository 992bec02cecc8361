//! Issue 40 §1: against the secured broker, `check` names why Kafka turned
//! it away and the setting to fix, within its timeout, and never prints the
//! secret: a wrong password, a CA that did not sign the broker's
//! certificate, a host name the certificate does not name, a client that
//! speaks TLS to a PLAINTEXT listener, a client certificate missing on the
//! mutual-TLS listener, a broker that is not there.

use std::time::{Duration, Instant};

use super::support::{check_with, env};
use crate::harness::http::free_port;
use crate::harness::kafka_secure::{secured, Mode, PASSWORD_VAR};
use crate::harness::pg::PgOptions;

/// `check`'s metadata timeout is 10 s; a second probe for a certificate
/// that failed without saying why may take as long again.
const WITHIN: Duration = Duration::from_secs(25);

struct Case {
    what: &'static str,
    brokers: String,
    properties: String,
    secret: String,
    /// Every one must be in the FAIL kafka line.
    needles: &'static [&'static str],
}

#[test]
fn each_refused_connection_is_named_with_the_setting_to_fix() {
    let kafka = secured();
    let e = env(PgOptions::default());
    let scram = kafka.properties(Mode::ScramSha512);
    let sasl_ssl = kafka.bootstrap(Mode::ScramSha512).to_owned();
    let ca = kafka.pki.ca().display().to_string();
    let other_ca = kafka.pki.other_ca().display().to_string();
    let port = sasl_ssl.rsplit(':').next().unwrap().to_owned();
    let cases = [
        Case {
            what: "wrong password",
            brokers: sasl_ssl.clone(),
            properties: scram.clone(),
            secret: "not-the-password".into(),
            needles: &["SASL authentication failed", "sasl.password"],
        },
        Case {
            what: "unknown CA",
            brokers: sasl_ssl.clone(),
            properties: scram.replace(&ca, &other_ca),
            secret: kafka.secret().into(),
            needles: &["not signed by a CA the client trusts", "ssl.ca.location"],
        },
        Case {
            what: "wrong host name",
            brokers: format!("localhost:{port}"),
            properties: scram.clone(),
            secret: kafka.secret().into(),
            needles: &[
                "does not name the host",
                "ssl.endpoint.identification.algorithm",
            ],
        },
        Case {
            what: "TLS to a PLAINTEXT listener",
            brokers: kafka.broker.bootstrap().to_owned(),
            properties: scram.clone(),
            secret: kafka.secret().into(),
            needles: &["another security protocol", "security.protocol"],
        },
        Case {
            what: "no client certificate on the mutual-TLS listener",
            brokers: kafka.bootstrap(Mode::MutualTls).to_owned(),
            properties: format!("\"security.protocol\" = \"SSL\"\n\"ssl.ca.location\" = {ca:?}\n"),
            secret: kafka.secret().into(),
            needles: &["refused the client certificate", "ssl.certificate.location"],
        },
        Case {
            what: "nothing listening",
            brokers: format!("127.0.0.1:{}", free_port()),
            properties: scram.clone(),
            secret: kafka.secret().into(),
            needles: &["no TCP connection", "kafka.brokers"],
        },
    ];
    let mut wrong = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let config = e.config(
            &format!("refused-{i}.toml"),
            &e.url("postgres", Some("postgres")),
            &case.brokers,
            "",
            &format!("[kafka.properties]\n{}", case.properties),
        );
        let started = Instant::now();
        let out = check_with(Some(&config), &[(PASSWORD_VAR, &case.secret)]);
        let took = started.elapsed();
        let kafka_line = out
            .lines()
            .into_iter()
            .find(|(_, name, _)| name == "kafka")
            .map(|(verdict, _, detail)| format!("{verdict} {detail}"))
            .unwrap_or_default();
        eprintln!("{}: {took:.1?}: {kafka_line}", case.what);
        let named =
            kafka_line.starts_with("FAIL") && case.needles.iter().all(|n| kafka_line.contains(n));
        if out.code != Some(1) || !named || took > WITHIN {
            wrong.push(format!(
                "{}: exit {:?} after {took:.1?}, kafka line {kafka_line:?}",
                case.what, out.code
            ));
        }
        for secret in [case.secret.as_str(), kafka.secret()] {
            assert!(
                !out.stdout.contains(secret) && !out.stderr.contains(secret),
                "{}: a secret in check's output:\n{out}",
                case.what
            );
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
