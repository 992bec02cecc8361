//! librdkafka's log lines as structured tracing events, and the one line of
//! rdkafka's own that only repeats them.
//!
//! librdkafka writes `[thrd:127.0.0.1:9092/1]: 127.0.0.1:9092/1: Connect to
//! ... failed: Connection refused`; it reaches the log once, under target
//! `librdkafka`, with the facility (`fac = "FAIL"`) and the thread (for a
//! broker thread, the broker) as fields of their own. The error event that
//! follows goes to the client context's `error` callback; rdkafka 0.37 then
//! warns "Ignored event 'Error' on base producer poll" about that same event
//! (through the `log` crate), which says nothing the error did not.
//! [`QuietRdkafka`] drops that warning.
//!
//! A broker turning a client away (wrong password, certificate, protocol:
//! see [`ConnectCause`]) is only in these lines; librdkafka reports it
//! upwards as a transport failure. So they are read here: the refusal is
//! logged once with the setting to fix, and kept for `/readyz`
//! ([`kafka_refusal`]) until Kafka is reached again.

use std::sync::Mutex;

use rdkafka::config::RDKafkaLogLevel;
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

use super::connect_cause::{trim_librdkafka_text, ConnectCause};

/// The last refusal of this process's clients, as `/readyz` tells it.
/// Process-wide because librdkafka's log lines reach the clients' contexts,
/// which know nothing of the relay; one process runs one relay.
static REFUSAL: Mutex<Option<(ConnectCause, String)>> = Mutex::new(None);

/// One librdkafka log line as a tracing event under the `librdkafka` target.
pub(super) fn forward_log(level: RDKafkaLogLevel, fac: &str, message: &str) {
    // Every producer (so every reconnect) warns that the gapless guarantee
    // is experimental; we enforce it knowingly.
    let level = if fac == "CONFWARN" && message.contains("enable.gapless.guarantee") {
        RDKafkaLogLevel::Debug
    } else {
        level
    };
    if fac == "FAIL" {
        note_refusal(message);
    }
    let (thread, message) = split_thread(message);
    let thread = thread.unwrap_or_default();
    match level {
        RDKafkaLogLevel::Emerg
        | RDKafkaLogLevel::Alert
        | RDKafkaLogLevel::Critical
        | RDKafkaLogLevel::Error => {
            tracing::error!(target: "librdkafka", fac, thread, "{message}")
        }
        RDKafkaLogLevel::Warning => tracing::warn!(target: "librdkafka", fac, thread, "{message}"),
        RDKafkaLogLevel::Notice | RDKafkaLogLevel::Info => {
            tracing::info!(target: "librdkafka", fac, thread, "{message}")
        }
        RDKafkaLogLevel::Debug => tracing::debug!(target: "librdkafka", fac, thread, "{message}"),
    }
}

/// Keeps a broker's refusal for [`kafka_refusal`], and logs it when it is
/// not the one kept already.
fn note_refusal(message: &str) {
    let Some(cause) = ConnectCause::classify(message).filter(|c| c.is_refusal()) else {
        return;
    };
    let said = trim_librdkafka_text(message);
    let mut kept = REFUSAL.lock().unwrap_or_else(|e| e.into_inner());
    if !matches!(kept.as_ref(), Some((c, _)) if *c == cause) {
        tracing::error!(target: "outboxd::kafka", "Kafka refused the connection: {cause}");
    }
    *kept = Some((cause, refusal_text(cause, said)));
}

fn refusal_text(cause: ConnectCause, said: &str) -> String {
    format!("{cause} (librdkafka: {said})")
}

/// Why a broker last turned this process's clients away, with the setting
/// to fix; `None` when none did since Kafka was last reached.
pub(crate) fn kafka_refusal() -> Option<String> {
    let kept = REFUSAL.lock().unwrap_or_else(|e| e.into_inner());
    kept.as_ref().map(|(_, text)| text.clone())
}

/// Kafka was reached: an earlier refusal is history.
pub(crate) fn clear_kafka_refusal() {
    *REFUSAL.lock().unwrap_or_else(|e| e.into_inner()) = None;
}

/// `[thrd:NAME]: rest` → (`NAME`, `rest`); other lines are left whole.
fn split_thread(message: &str) -> (Option<&str>, &str) {
    message
        .strip_prefix("[thrd:")
        .and_then(|rest| rest.split_once("]: "))
        .map_or((None, message), |(thread, rest)| (Some(thread), rest))
}

/// A tracing layer that drops rdkafka's "Ignored event 'Error' on ... poll"
/// warnings: the error they are about was logged by the client context.
/// Only events from rdkafka's own modules are looked at.
pub struct QuietRdkafka;

impl<S: Subscriber> Layer<S> for QuietRdkafka {
    fn event_enabled(&self, event: &Event<'_>, _: Context<'_, S>) -> bool {
        // rdkafka logs through the `log` crate: such events carry the
        // target `log` and the real one in the field `log.target`.
        let target = event.metadata().target();
        if !(target == "log" || target.starts_with("rdkafka::")) {
            return true;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        let target = fields.log_target.as_deref().unwrap_or(target);
        !(target.starts_with("rdkafka::") && is_ignored_error_event(&fields.message))
    }
}

fn is_ignored_error_event(message: &str) -> bool {
    message.starts_with("Ignored event 'Error' on ")
}

/// The fields [`QuietRdkafka`] looks at.
#[derive(Default)]
struct Fields {
    message: String,
    log_target: Option<String>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.message = value.to_owned(),
            "log.target" => self.log_target = Some(value.to_owned()),
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_prefix_becomes_a_field() {
        assert_eq!(
            split_thread("[thrd:127.0.0.1:9/bootstrap]: 127.0.0.1:9/bootstrap: Connect failed"),
            (
                Some("127.0.0.1:9/bootstrap"),
                "127.0.0.1:9/bootstrap: Connect failed"
            )
        );
        assert_eq!(split_thread("no thread here"), (None, "no thread here"));
        assert_eq!(split_thread("[thrd:main"), (None, "[thrd:main"));
    }

    #[test]
    fn only_the_ignored_error_event_warning_is_dropped() {
        assert!(is_ignored_error_event(
            "Ignored event 'Error' on base producer poll"
        ));
        assert!(is_ignored_error_event(
            "Ignored event 'Error' on consumer poll"
        ));
        assert!(!is_ignored_error_event(
            "Failed to flush outstanding messages while dropping the producer"
        ));
    }
}
