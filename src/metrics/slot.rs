//! The slot sampler: every `metrics.slot_sample_interval`, and right after
//! the relay (re)connects, one query on its own SQL connection reads the end
//! of WAL and the slot's row from `pg_replication_slots`. The lag it shows is PostgreSQL's own view, so it
//! is right even when the relay is down or wedged, which is when it matters.

use std::sync::Arc;
use std::time::Duration;

use metrics::Gauge;
use tokio::task::JoinHandle;
use tokio_postgres::Client;

use super::health::Health;
use super::names::*;
use crate::source::admin::connect_sql;
use crate::source::replication::ConnParams;
use crate::Lsn;

/// On a standby (PostgreSQL 16+ can decode there) the end of WAL is what
/// has been received, not written.
const SAMPLE_SQL: &str = "SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_receive_lsn() \
                                 ELSE pg_current_wal_lsn() END::text, \
                            s.slot_name IS NOT NULL, s.confirmed_flush_lsn::text, s.restart_lsn::text, \
                            s.wal_status, s.safe_wal_size, coalesce(s.active, false) \
                          FROM (SELECT 1) AS one LEFT JOIN pg_replication_slots s ON s.slot_name = $1";

/// One sample.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    server: Option<Lsn>,
    exists: bool,
    confirmed: Option<Lsn>,
    restart: Option<Lsn>,
    wal_status: Option<String>,
    safe_wal_size: Option<i64>,
    active: bool,
}

struct Gauges {
    server: Gauge,
    lag: Gauge,
    retained: Gauge,
    status: [Gauge; 4],
    safe: Gauge,
    active: Gauge,
}

impl Gauges {
    fn new() -> Gauges {
        Gauges {
            server: metrics::gauge!(SERVER_LSN),
            lag: metrics::gauge!(SLOT_LAG_BYTES),
            retained: metrics::gauge!(SLOT_RETAINED_WAL_BYTES),
            status: WAL_STATUSES.map(|s| metrics::gauge!(SLOT_WAL_STATUS, "status" => s)),
            safe: metrics::gauge!(SLOT_SAFE_WAL_SIZE_BYTES),
            active: metrics::gauge!(SLOT_ACTIVE),
        }
    }

    fn set(&self, s: &Sample) {
        let diff = |to: Option<Lsn>| match (s.server, to) {
            (Some(server), Some(to)) => server.0.saturating_sub(to.0) as f64,
            _ => f64::NAN,
        };
        if let Some(server) = s.server {
            self.server.set(server.0 as f64);
        }
        self.lag.set(diff(s.confirmed));
        self.retained.set(diff(s.restart));
        for (gauge, name) in self.status.iter().zip(WAL_STATUSES) {
            let current = s.wal_status.as_deref() == Some(name);
            gauge.set(if current { 1.0 } else { 0.0 });
        }
        // NULL: max_slot_wal_keep_size = -1, the slot may retain any amount.
        self.safe
            .set(s.safe_wal_size.map_or(f64::NAN, |v| v as f64));
        self.active.set(if s.active { 1.0 } else { 0.0 });
    }
}

/// Starts sampling `slot` in the background; runs for the life of the process.
pub fn spawn_sampler(
    conn: ConnParams,
    slot: String,
    every: Duration,
    health: Arc<Health>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let gauges = Gauges::new();
        let mut client: Option<Client> = None;
        let mut failing = false;
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = health.resample.notified() => ticks.reset(),
            }
            // A hung server must not hang the sampler past the next tick.
            let limit = every.max(Duration::from_secs(5));
            let result = tokio::time::timeout(limit, sample(&conn, &slot, &mut client)).await;
            let result = result.unwrap_or_else(|_| Err("timed out".into()));
            match result {
                Ok(s) => {
                    if failing {
                        tracing::info!(%slot, "slot sampling recovered");
                        failing = false;
                    }
                    if !s.exists {
                        tracing::debug!(%slot, "slot not found by the sampler");
                    }
                    gauges.set(&s);
                    health.set_server_lsn(s.server);
                }
                Err(error) => {
                    client = None;
                    // Unknown is not a backlog: keep /readyz to what is known.
                    health.set_server_lsn(None);
                    if !failing {
                        tracing::warn!(%slot, %error, "cannot sample the slot; retrying every {every:?}");
                        failing = true;
                    }
                }
            }
        }
    })
}

async fn sample(
    conn: &ConnParams,
    slot: &str,
    client: &mut Option<Client>,
) -> Result<Sample, String> {
    let c = match client {
        Some(c) if !c.is_closed() => c,
        _ => client.insert(connect_sql(conn).await.map_err(|e| e.to_string())?),
    };
    let row = c
        .query_one(SAMPLE_SQL, &[&slot])
        .await
        .map_err(|e| e.to_string())?;
    let lsn = |i: usize| row.get::<_, Option<String>>(i).and_then(|t| t.parse().ok());
    Ok(Sample {
        server: lsn(0),
        exists: row.get(1),
        confirmed: lsn(2),
        restart: lsn(3),
        wal_status: row.get(4),
        safe_wal_size: row.get(5),
        active: row.get(6),
    })
}
