//! A graceful stop: the session drains (the driver reads on only to the
//! end of the open transaction, and the loop waits for its acks), then
//! finishes the stream at a position the table watch vouches for and
//! tells the ledger its last word.

use std::time::Duration;

use tokio::time::Instant;

use super::mode::{DeliveryMode, Drain};
use super::parts::{Session, SessionEnd};
use super::telemetry::TelemetryEvent;
use crate::relay::error::RelayError;

/// Least time a graceful stop waits for the table watch to vouch for the
/// last acked position (beyond three status intervals): two looks on a
/// slow connection.
const MIN_SETTLE: Duration = Duration::from_secs(2);

impl<D: DeliveryMode> Session<'_, D> {
    /// A shutdown was asked for: drain until `relay.shutdown_timeout`.
    pub(super) fn start_draining(&mut self) {
        tracing::info!(
            in_flight = self.window.in_flight(),
            "shutdown requested; draining"
        );
        self.drain_deadline = Some(Instant::now() + self.settings.config.relay.shutdown_timeout);
        self.stream.source.drain();
    }

    /// Finishes once drained (or at the deadline), else turns on.
    pub(super) async fn drain_turn(
        &mut self,
        deadline: Instant,
    ) -> Result<Option<SessionEnd>, RelayError> {
        let drained = match D::drain(self).await? {
            Drain::End(end) => return Ok(Some(end)),
            Drain::Done => true,
            Drain::Going => false,
        };
        if drained || Instant::now() >= deadline {
            return self.finish(drained).await.map(Some);
        }
        self.active_turn().await
    }

    /// Confirms what the table watch vouches for of the acked position,
    /// finishes the stream there, and lets the mode have its last word.
    async fn finish(&mut self, drained: bool) -> Result<SessionEnd, RelayError> {
        let interval = self.settings.config.postgres.status_interval;
        let confirmed = self
            .table_watch
            .settle(self.confirmable(), interval * 3 + MIN_SETTLE)
            .await;
        tracing::info!(%confirmed, unacked = self.window.in_flight(), drained, "shutting down");
        self.stream.source.finish(confirmed).await?;
        let confirmed = self.stream.source.reported().confirmed;
        self.slot.confirmed(confirmed);
        self.telemetry.emit(TelemetryEvent::Finished { confirmed });
        D::finish(self, confirmed).await;
        Ok(SessionEnd::Shutdown)
    }
}
