//! `check`'s first Kafka question, do the brokers answer, and when they do
//! not, why: the client's context collects librdkafka's error texts while it
//! asks, and [`ConnectCause`] reads the cause out of them. A refusal (wrong
//! password, certificate, protocol) is certain at the first failed login, so
//! it is reported then, not at the end of the timeout.

use std::ffi::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::bindings as rd;
use rdkafka::client::Client;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaType;
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
/// settings; stops early at a refusal.
pub(super) async fn reach(brokers: &str, cfg: &Config, timeout: Duration) -> Result<Reach, String> {
    let mut config =
        admin_client_config(brokers, &cfg.kafka.properties).map_err(|e| e.to_string())?;
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
/// librdkafka saying why: asked again with a certificate verification
/// callback, which sees OpenSSL's verdict (expired, another host, unknown
/// issuer) and keeps the first failure; the verdict itself is OpenSSL's, as
/// without the callback.
pub(super) async fn unverified_certificate(
    brokers: &str,
    cfg: &Config,
    timeout: Duration,
) -> ConnectCause {
    const UNKNOWN: ConnectCause = ConnectCause::CertificateUnverified;
    let Some(client) = certificate_watching_client(brokers, cfg) else {
        return UNKNOWN;
    };
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let answered = client.fetch_metadata(None, left.min(ASK_EVERY)).is_ok();
            let code = client.context().first_error.load(Ordering::Acquire);
            if code != 0 {
                return ConnectCause::from_x509_error(code).unwrap_or(UNKNOWN);
            }
            if answered || Instant::now() >= deadline {
                return UNKNOWN;
            }
        }
    })
    .await
    .unwrap_or(UNKNOWN)
}

/// A client with the relay's settings whose certificate verification
/// callback keeps OpenSSL's first failure in its [`CertWatch`].
fn certificate_watching_client(brokers: &str, cfg: &Config) -> Option<Client<CertWatch>> {
    let config = admin_client_config(brokers, &cfg.kafka.properties).ok()?;
    let native = config.create_native_config().ok()?;
    // SAFETY: `native` is a valid configuration, and `verify_certificate`
    // matches the callback type librdkafka declares.
    unsafe {
        rd::rd_kafka_conf_set_ssl_cert_verify_cb(native.ptr(), Some(verify_certificate));
    }
    Client::new(
        &config,
        native,
        RDKafkaType::RD_KAFKA_CONSUMER,
        CertWatch::default(),
    )
    .ok()
}

/// The first failed certificate verification (OpenSSL's `X509_V_ERR_*`)
/// of [`unverified_certificate`]'s client; 0 while none failed.
#[derive(Default)]
struct CertWatch {
    first_error: AtomicI32,
}

impl ClientContext for CertWatch {
    // Its texts are the first probe's again: not wanted twice.
    fn log(&self, _: RDKafkaLogLevel, _: &str, _: &str) {}
    fn error(&self, _: KafkaError, _: &str) {}
}

/// librdkafka's certificate verification callback, called by a broker
/// thread for each certificate of the chain with OpenSSL's verdict so far:
/// keeps the verdict (accepts what OpenSSL accepts, refuses the rest).
unsafe extern "C" fn verify_certificate(
    _: *mut rd::rd_kafka_t,
    _: *const c_char,
    _: i32,
    x509_error: *mut c_int,
    _: c_int,
    _: *const c_char,
    _: usize,
    _: *mut c_char,
    _: usize,
    opaque: *mut c_void,
) -> c_int {
    // SAFETY: librdkafka passes a valid pointer to the verdict.
    let code = unsafe { *x509_error };
    if code == 0 {
        return 1;
    }
    // SAFETY: the opaque pointer is the one rdkafka's `Client` set, its
    // context: a `CertWatch` that lives as long as the client whose broker
    // threads call this.
    let watch = unsafe { &*(opaque as *const CertWatch) };
    let _ = watch
        .first_error
        .compare_exchange(0, code, Ordering::AcqRel, Ordering::Acquire);
    0
}
