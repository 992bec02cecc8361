//! The producer watchdog's I/O: when to wake for it, fresh metadata when
//! it asks, and handing a stuck producer to the delivery mode. What it
//! decides is [`Watchdog`](super::watchdog::Watchdog)'s (pure).
//!
//! The loop's `select!` has the watchdog as one of its wake-ups. A wait on
//! the producer anywhere else (room in a full queue, a trial's reports or
//! flush, a commit the mode must see end before it goes on, the drain)
//! goes through [`Session::watched`], which races it against the same
//! wake-up: no wait on the producer outlasts `kafka.stuck_after` and the
//! two looks at the leaders, wherever the session is.

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::time::Instant;

use super::mode::{DeliveryMode, Step, Stuck};
use super::parts::{Session, SessionEnd};
use super::telemetry::TelemetryEvent;
use super::watchdog::Verdict;
use crate::relay::error::RelayError;
use crate::sink::{fresh_leaders, Leaders};

/// What one look of the watchdog's did.
enum Looked {
    Nothing,
    /// The producer was given up; the session ends when `Some`.
    Replaced(Option<SessionEnd>),
}

/// How long the fresh metadata may take, for every topic together: the
/// loop waits for it (the driver keeps the walsender served meanwhile). A
/// cluster that cannot answer within it is in trouble of its own, which is
/// the producer's timeouts' to wait out.
const METADATA_TIMEOUT: Duration = Duration::from_secs(5);

/// A wait on the producer, made afresh from the delivery mode after each
/// look of the watchdog's that found nothing to do: it must be cancel-safe.
pub(super) type ProducerWait<'x, T> = Pin<Box<dyn Future<Output = T> + Send + 'x>>;

/// How a [`Session::watched`] wait ended.
pub(super) enum Watched<T> {
    /// What was waited for came.
    Done(T),
    /// The watchdog gave the producer up meanwhile: what was waited for
    /// will not come from it. The session ends, or goes on with a fresh
    /// producer and what the old one held waiting to be sent again.
    Replaced(Option<SessionEnd>),
}

impl<D: DeliveryMode> Session<'_, D> {
    /// Waits for what `wait` makes of the delivery mode, racing the
    /// watchdog as the loop does: one producer wait, however long, ends
    /// with the stuck verdict as any wait in the loop's `select!` would.
    pub(super) async fn watched<T>(
        &mut self,
        wait: fn(&mut D) -> ProducerWait<'_, T>,
    ) -> Result<Watched<T>, RelayError> {
        loop {
            let watch_at = self.watch_at(Instant::now());
            let far = Instant::now() + Duration::from_secs(86400 * 365);
            tokio::select! {
                biased;
                // First: what came in time is no stuck producer.
                done = wait(&mut self.delivery) => return Ok(Watched::Done(done)),
                _ = tokio::time::sleep_until(watch_at.unwrap_or(far)), if watch_at.is_some() => {
                    if let Looked::Replaced(end) = self.look().await? {
                        return Ok(Watched::Replaced(end));
                    }
                }
            }
        }
    }

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
        Ok(match self.look().await? {
            Looked::Nothing => None,
            Looked::Replaced(end) => end,
        })
    }

    /// [`Session::watch_producer`], telling whether the producer was given
    /// up.
    async fn look(&mut self) -> Result<Looked, RelayError> {
        let now = Instant::now();
        let since = D::holding_since(self, now);
        if self.watchdog.check(now, since, None) != Verdict::AskLeaders {
            return Ok(Looked::Nothing);
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
                Ok(Looked::Replaced(D::replace_stuck(self, stuck).await?))
            }
            Verdict::ClusterTrouble => {
                let age = since.map_or(Duration::ZERO, |s| now - s);
                self.telemetry.emit(TelemetryEvent::ClusterTrouble {
                    age,
                    holding: &holding,
                    leaders: &said,
                });
                Ok(Looked::Nothing)
            }
            Verdict::Fine { .. } | Verdict::AskLeaders => Ok(Looked::Nothing),
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
