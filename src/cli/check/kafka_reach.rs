//! `check`'s first Kafka question, do the brokers answer, and when they do
//! not, why: the client's context collects librdkafka's error texts while it
//! asks, and [`ConnectCause`] reads the cause out of them. A refusal (wrong
//! password, certificate, protocol) is certain at the first failed login, so
//! it is reported then, not at the end of the timeout.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::ClientContext;

use crate::config::Config;
use crate::sink::admin_client_config;
use crate::sink::connect_cause::{trim_librdkafka_text, ConnectCause};

/// One metadata request, short so that a refusal is noticed soon after it
/// is logged; asked again until the caller's timeout.
const ASK_EVERY: Duration = Duration::from_secs(1);
/// Error texts kept: enough for every broker of a bootstrap list to fail
/// once or twice; beyond that they only repeat.
const KEEP_TEXTS: usize = 64;

/// What the brokers answered.
#[derive(Debug)]
pub(super) enum Reach {
    /// This many brokers are in the metadata.
    Answered(usize),
    Failed {
        /// What librdkafka's texts tell, if anything.
        cause: Option<ConnectCause>,
        /// The text that told it (trimmed), to quote.
        said: Option<String>,
        /// The metadata request's own error.
        error: KafkaError,
    },
}

/// Collects librdkafka's error texts (its broker threads' `FAIL` log lines
/// and the error events) while the probe runs.
#[derive(Default)]
struct Watch {
    /// Whole texts: the cause may be in the part a quote leaves out (the
    /// state a connection failed in).
    texts: Mutex<Vec<String>>,
}

impl Watch {
    fn keep(&self, text: &str) {
        let mut texts = self.texts.lock().unwrap_or_else(|e| e.into_inner());
        let short = trim_librdkafka_text(text);
        let seen = texts.iter().any(|t| trim_librdkafka_text(t) == short);
        if texts.len() < KEEP_TEXTS && !seen {
            texts.push(text.to_owned());
        }
    }

    /// The most specific cause seen so far and the text that gave it,
    /// trimmed for quoting.
    fn cause(&self) -> Option<(ConnectCause, String)> {
        let texts = self.texts.lock().unwrap_or_else(|e| e.into_inner());
        let cause = ConnectCause::most_specific(texts.iter().map(String::as_str))?;
        let said = texts
            .iter()
            .find(|t| ConnectCause::classify(t) == Some(cause))?;
        Some((cause, trim_librdkafka_text(said).to_owned()))
    }
}

impl ConsumerContext for Watch {}

impl ClientContext for Watch {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        // `check` prints lines, not librdkafka's log: what matters is kept.
        if fac == "FAIL"
            || matches!(
                level,
                RDKafkaLogLevel::Emerg
                    | RDKafkaLogLevel::Alert
                    | RDKafkaLogLevel::Critical
                    | RDKafkaLogLevel::Error
            )
        {
            self.keep(message);
        }
    }

    fn error(&self, _: KafkaError, reason: &str) {
        self.keep(reason);
    }
}

/// Asks for the cluster's metadata until `timeout`, with the relay's client
/// settings plus `overrides`; stops early at a refusal.
pub(super) async fn reach(
    brokers: &str,
    cfg: &Config,
    overrides: &[(&str, &str)],
    timeout: Duration,
) -> Result<Reach, String> {
    let mut config =
        admin_client_config(brokers, &cfg.kafka.properties).map_err(|e| e.to_string())?;
    for (key, value) in overrides {
        config.set(*key, *value);
    }
    // A connection closed at the first request is logged at info.
    config.set_log_level(RDKafkaLogLevel::Info);
    // A consumer (no group, never subscribed), not an admin client: its
    // poll serves the main queue, where rdkafka routes librdkafka's log
    // lines and error events.
    let client: BaseConsumer<Watch> = config
        .create_with_context(Watch::default())
        .map_err(|e| format!("cannot create the Kafka client: {e}"))?;
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let answer = client.fetch_metadata(None, left.min(ASK_EVERY));
            let error = match answer {
                Ok(md) => return Reach::Answered(md.brokers().len()),
                Err(e) => e,
            };
            // No subscription: nothing but events to serve.
            let _ = client.poll(Duration::ZERO);
            let seen = client.context().cause();
            let refused = seen.as_ref().is_some_and(|(c, _)| c.is_refusal());
            if refused || Instant::now() >= deadline {
                let (cause, said) = seen.unzip();
                return Reach::Failed { cause, said, error };
            }
        }
    })
    .await
    .map_err(|e| format!("the Kafka probe did not finish: {e}"))
}

/// The cause to report for a certificate that failed verification without
/// saying why: asked again without host name verification, a broker that
/// then answers (or fails for another reason) has a certificate from a
/// trusted CA for another host.
pub(super) async fn unverified_certificate(
    brokers: &str,
    cfg: &Config,
    timeout: Duration,
) -> ConnectCause {
    let again = reach(
        brokers,
        cfg,
        &[("ssl.endpoint.identification.algorithm", "none")],
        timeout,
    )
    .await;
    match again {
        Ok(Reach::Answered(_)) => ConnectCause::HostName,
        Ok(Reach::Failed {
            cause: Some(ConnectCause::CertificateUnverified | ConnectCause::UnknownCa),
            ..
        }) => ConnectCause::UnknownCa,
        Ok(Reach::Failed {
            cause: Some(ConnectCause::CertificateExpired),
            ..
        }) => ConnectCause::CertificateExpired,
        // Past TLS this time (a login refused, say): only the name was wrong.
        Ok(Reach::Failed { cause: Some(c), .. }) if c.is_refusal() => ConnectCause::HostName,
        _ => ConnectCause::CertificateUnverified,
    }
}
