//! Hot standby: an instance that finds the slot streamed by another waits
//! for it and takes over when it is released.
//!
//! PostgreSQL lets one walsender stream a slot at a time, so a second
//! instance on the same slot cannot relay twice; it stands by instead.
//! Standing by is a state, not a failure: no session runs (no producer, no
//! table watch), one SQL connection reads `pg_replication_slots.active_pid`
//! every `relay.standby_poll_interval`, and only a released slot starts a
//! session. The wait is not a reconnect: no WARN per look, no backoff
//! growth, no `outboxd_reconnects_total`; [`Health`](crate::metrics::Health)
//! logs its start and the takeover once each and answers `/readyz` with
//! `standby: ...`.

use std::time::Duration;

use tokio::sync::watch;
use tokio_postgres::error::SqlState;
use tokio_postgres::Client;

use super::error::RelayError;
use super::settings::RelaySettings;
use super::telemetry::{RelayEvent, RelayTelemetry};
use crate::source::admin::{self, AdminError};
use crate::source::error::SourceError;
use crate::source::replication::ReplicationError;
use crate::source::session::SourceSettings;

/// Longest one look at the slot may take. A look that hangs (a dead link
/// the keepalives have not noticed yet) ends the wait, and the session
/// attempt that follows reports what is wrong.
const LOOK_TIMEOUT: Duration = Duration::from_secs(10);

pub(super) enum Wait {
    /// The slot is free (or could not be looked at): start a session.
    Released,
    /// Shutdown was requested while standing by.
    Stopped,
}

/// Another walsender holds the slot, by `e`: the slot check found it active,
/// or START_REPLICATION lost the race for it (SQLSTATE 55006, "replication
/// slot ... is active for PID n"). The PID when known.
pub(super) fn slot_holder(e: &RelayError) -> Option<Option<i32>> {
    match e {
        RelayError::Source(SourceError::Admin(AdminError::SlotActive { pid, .. })) => {
            Some(Some(*pid))
        }
        RelayError::Source(SourceError::Replication(ReplicationError::Server {
            error, ..
        })) if error.sqlstate() == SqlState::OBJECT_IN_USE => {
            // The PID ends the message (unless the server's lc_messages
            // translates it differently; then the first look finds it).
            Some(
                error
                    .message
                    .rsplit(' ')
                    .next()
                    .and_then(|w| w.parse().ok()),
            )
        }
        _ => None,
    }
}

/// Stands by until the slot is released or shutdown is requested.
pub(super) async fn wait(
    settings: &RelaySettings,
    telemetry: &RelayTelemetry,
    pid: Option<i32>,
    stop: &mut watch::Receiver<bool>,
) -> Wait {
    telemetry.emit(RelayEvent::StandingBy { pid });
    let every = settings.config.relay.standby_poll_interval;
    let mut client = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|s| *s) => return Wait::Stopped,
        }
        let look = tokio::time::timeout(LOOK_TIMEOUT, holder(&settings.source, &mut client));
        match look.await {
            Ok(Ok(Some(pid))) => telemetry.emit(RelayEvent::StandingBy { pid: Some(pid) }),
            Ok(Ok(None)) => return Wait::Released,
            Ok(Err(error)) => {
                tracing::debug!(%error, "standby: cannot look at the slot; trying to start a session");
                return Wait::Released;
            }
            Err(_) => {
                tracing::debug!(
                    "standby: no answer about the slot within {LOOK_TIMEOUT:?}; trying to start a session"
                );
                return Wait::Released;
            }
        }
    }
}

/// The PID of the walsender streaming the slot; `None` when nobody streams
/// it (or it is gone: the session attempt says what to do about that).
/// Keeps the SQL connection between looks.
async fn holder(
    source: &SourceSettings,
    client: &mut Option<Client>,
) -> Result<Option<i32>, AdminError> {
    let open = match client.take() {
        Some(c) if !c.is_closed() => c,
        _ => admin::connect_sql(&source.conn).await?,
    };
    let info = admin::slot_info(&open, &source.slot).await?;
    *client = Some(open);
    Ok(info.and_then(|i| i.active_pid))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::replication::error::ServerError;

    fn start_failed(code: &str, message: &str) -> RelayError {
        RelayError::Source(SourceError::Replication(ReplicationError::Server {
            server: "u@h:5432/db".into(),
            error: Box::new(ServerError {
                severity: "ERROR".into(),
                code: code.into(),
                message: message.into(),
                detail: None,
                hint: None,
            }),
        }))
    }

    #[test]
    fn a_held_slot_is_recognised_with_its_holder() {
        let checked = RelayError::Source(SourceError::Admin(AdminError::SlotActive {
            slot: "orders".into(),
            pid: 42,
        }));
        assert_eq!(slot_holder(&checked), Some(Some(42)));
        let raced = start_failed(
            "55006",
            "replication slot \"orders\" is active for PID 4711",
        );
        assert_eq!(slot_holder(&raced), Some(Some(4711)));
        let translated = start_failed("55006", "Replikationsslot wird verwendet");
        assert_eq!(slot_holder(&translated), Some(None));
        assert_eq!(slot_holder(&start_failed("57P01", "terminating")), None);
    }
}
