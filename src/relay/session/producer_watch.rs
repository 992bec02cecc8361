//! The producer watchdog's I/O: when to wake for it, fresh metadata when
//! it asks, and handing a stuck producer to the delivery mode. What it
//! decides is [`Watchdog`](super::watchdog::Watchdog)'s (pure).

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::time::Instant;

use super::mode::{DeliveryMode, Step, Stuck};
use super::parts::Session;
use super::telemetry::TelemetryEvent;
use super::watchdog::Verdict;
use crate::sink::{fresh_leaders, Leaders};

/// How long the fresh metadata may take, for every topic together: the
/// loop waits for it (the driver keeps the walsender served meanwhile). A
/// cluster that cannot answer within it is in trouble of its own, which is
/// the producer's timeouts' to wait out.
const METADATA_TIMEOUT: Duration = Duration::from_secs(5);

impl<D: DeliveryMode> Session<'_, D> {
    /// When the loop must wake for the watchdog; `None`: not before
    /// something else happens.
    pub(super) fn watch_at(&mut self, now: Instant) -> Option<Instant> {
        let since = D::holding_since(self, now);
        match self.watchdog.check(now, since, None) {
            Verdict::Fine { look_at } => look_at,
            Verdict::AskLeaders | Verdict::ClusterTrouble | Verdict::Stuck { .. } => Some(now),
        }
    }

    /// The watchdog's wake-up: past the limit, asks fresh metadata whether
    /// the cluster has a leader for every partition the producer writes
    /// to, and gives the producer up if it has.
    pub(super) async fn watch_producer(&mut self) -> Step {
        let now = Instant::now();
        let since = D::holding_since(self, now);
        if self.watchdog.check(now, since, None) != Verdict::AskLeaders {
            return Ok(None);
        }
        let (holding, topics) = D::holding(self);
        let leaders = self.fresh_leaders(topics).await;
        let all_led = leaders.as_ref().is_ok_and(Leaders::all_led);
        let said = match &leaders {
            Ok(leaders) => leaders.to_string(),
            Err(e) => format!("no answer: {e}"),
        };
        // Reports are not taken meanwhile: what was held is still held.
        let now = Instant::now();
        match self.watchdog.check(now, since, Some(all_led)) {
            Verdict::Stuck { age } => {
                let stuck = Stuck {
                    age,
                    holding: &holding,
                    leaders: &said,
                };
                D::replace_stuck(self, stuck).await
            }
            Verdict::ClusterTrouble => {
                let age = since.map_or(Duration::ZERO, |s| now - s);
                self.telemetry.emit(TelemetryEvent::ClusterTrouble {
                    age,
                    holding: &holding,
                    leaders: &said,
                });
                Ok(None)
            }
            Verdict::Fine { .. } | Verdict::AskLeaders => Ok(None),
        }
    }

    /// Who leads each partition of `topics`, from a client made for the
    /// question (see [`fresh_leaders`]).
    async fn fresh_leaders(&self, topics: BTreeSet<String>) -> Result<Leaders, String> {
        let brokers = self.settings.brokers.clone();
        let kafka = self.settings.config.kafka.clone();
        let asked = tokio::task::spawn_blocking(move || {
            fresh_leaders(&brokers, &kafka, &topics, METADATA_TIMEOUT)
        });
        // The client's own timeout bounds the call; this one only guards
        // against a blocking pool that is slow to start it.
        match tokio::time::timeout(METADATA_TIMEOUT * 3, asked).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => Err(format!("the metadata request failed: {e}")),
            Err(_) => Err("the metadata request did not return".into()),
        }
    }
}
