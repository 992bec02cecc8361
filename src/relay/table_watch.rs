//! Confirmation gated on the outbox table's identity.
//!
//! Invariant: the slot is never confirmed past a position unless a look at
//! the catalog whose snapshot was taken after that position was written
//! found the table unchanged (same OID, still in the same publication for
//! inserts). Why: once the table leaves the publication or is replaced, its
//! inserts are not sent and keepalives carry the stream past them; the slot
//! must stay before them so that, once the table is published again, they
//! can be found and re-published.
//!
//! A look ([`admin::observe`]) is one prepared statement, made once per
//! connection on the task's own SQL connection, that reads every watched
//! table's identity and the server's WAL position: one round trip. Why that
//! keeps the vouched position honest:
//! - A look never vouches for the position it reads. Every snapshot the
//!   statement reads the catalog through (its own, and the catalog
//!   snapshot behind `to_regclass` and `pg_publication_tables`) is taken
//!   once the statement has begun, and the position is read while it runs,
//!   so a change committed in between lies below the position yet may be
//!   invisible to the look. The position becomes confirmable when the
//!   *next* look finds the tables intact ([`Observation::lsn`] of the last
//!   intact look is what the one after it raises the ceiling to).
//! - The next look's statement is sent after the previous one's answer
//!   came back, so every snapshot it reads through is taken after that
//!   position was read, hence after everything below it was written: the
//!   invariant's order, whichever of its snapshots a part of the statement
//!   used. What remains is the gap between a commit's WAL record and its
//!   visibility (the committing backend flushes its commit record, then
//!   leaves the running set and sends its catalog invalidations, a matter
//!   of microseconds unless it is descheduled): looks begin at least a busy
//!   period ([`BUSY_LOOKS_PER_INTERVAL`]) apart, by then it is visible.
//! - Reading the identities and the position together cannot make a look
//!   vouch for a mix of two catalog states: what it vouches for needs only
//!   that *all* its snapshots are later than the previous look's position,
//!   and they are. Within one statement a look overlapping a change's
//!   commit can see part of it (the mix `admin::named_change` exists for);
//!   that can name the wrong change, never confirm the wrong position, and
//!   a second look, a statement begun after the first ended, names it.
//! - The time a halt names the rows to re-publish from is the last intact
//!   look's `now()` (its transaction's start, before its snapshots), and
//!   the WAL position it names is the ceiling (read by an earlier look):
//!   both before any change that look did not see.
//!
//! When it looks: on a busy beat, [`BUSY_LOOKS_PER_INTERVAL`] per status
//! interval, while anything waits on the ceiling (the driver would confirm
//! more than it vouches for, [`ConfirmCeiling::waiting`]), while the WAL
//! moved since the previous look, after a failed look and after a change;
//! otherwise once per interval (an idle relay: one statement per interval).
//! A wait that begins between two idle looks wakes the task at once, or a
//! busy period after the last look began if that is later.
//!
//! The bound this gives (docs/guarantees.md): with status interval `T`, a
//! busy period `p = T / 4`, the longest look `L` and the driver's least gap
//! between status updates `g` (`MIN_STATUS_GAP`, 100 ms), a position
//! acknowledged at `t` is confirmed by `t + 2 max(p, L) + L + g`. The first
//! look that begins after `t` begins within `max(p, L)` (looks keep a fixed
//! beat, and one slower than the beat is followed at once) and reads a
//! position past it; the next begins `max(p, L)` later and vouches for it
//! when it ends, `L` after; the driver sends it within `g`. At `T = 1 s`
//! and looks of a few milliseconds, 0.61 s. A `kill -9` of the relay
//! repeats at most what was acknowledged in that window, and what it had
//! in flight. `outboxd_table_watch_look_seconds` shows `L`,
//! `outboxd_confirmation_lag_seconds` the lag itself.
//!
//! A failing SQL connection is an outage, not a change: the ceiling stops
//! rising, and the task reconnects at the next interval. An outage that
//! lasts ([`LOST_AFTER`]), or a server that says it is shutting down, ends
//! the session ([`TableWatch::lost`]): a frozen ceiling would otherwise hold
//! the walsender, and with it a fast shutdown of PostgreSQL, which waits for
//! the client to confirm everything sent (seen: `pg_ctl restart` gave up
//! after 60 s).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use metrics::Histogram;
use tokio::sync::{watch, Notify};
use tokio::time::Instant;
use tokio_postgres::Client;

use crate::metrics as m;
use crate::source::admin::{self, quote_ident, AdminError, Look, Observation, TableChange};
use crate::source::ceiling::ConfirmCeiling;
use crate::source::session::SourceSettings;
use crate::Lsn;

/// How long the watch may fail to look before the session ends: a few
/// looks, so a cut connection that reconnects at once is no outage.
const LOST_AFTER: Duration = Duration::from_secs(5);

/// Looks per `postgres.status_interval` while busy, on a fixed beat. A
/// commit becomes confirmable at the second look after it (the first reads
/// a WAL position past it, the next vouches for that position), so with
/// four looks per interval the slot trails a commit by at most half an
/// interval and a look or so (the module's bound), and a `kill -9` of the
/// relay repeats at most the events acknowledged in the last interval,
/// with room to spare (issue 8). With
/// two looks, each a half interval after the previous one *ended*, it was
/// one interval plus three looks, and the slot held positions written up
/// to 1.17 s before a kill at a 1 s interval, and more than one interval
/// of acks was repeated in 1 of 5 runs of `relay::faults::kill_9_repeats…`
/// (2 and 3 of 4 in earlier ones); with one look per interval, 1.45
/// intervals of acks. A look is one statement (issue 38: it was 2 + 2N
/// round trips, each preparing its query again).
const BUSY_LOOKS_PER_INTERVAL: u32 = 4;

/// SQLSTATEs of a server that is going away: admin_shutdown, crash_shutdown,
/// cannot_connect_now.
const SHUTTING_DOWN: [&str; 3] = ["57P01", "57P02", "57P03"];

/// The outbox tables as the first session of this process found them, and
/// the last look of any of its sessions that found them intact.
/// Every later session judges what it finds against them, not against its
/// own first look: a session that started after a change (a reconnect
/// between the change and the next look, or while the relay was halted)
/// would otherwise take the changed table for the configured one, name
/// another change, or, when the new table was published by then, stream on
/// past the events the change kept out of the stream. Its halt names the
/// rows to re-publish from that last intact look, which was before the
/// change, not from its own. A restart of the process, which every halt
/// names as part of the recovery, starts afresh.
#[derive(Debug, Default)]
pub(super) struct TableBaseline {
    identities: Option<Vec<admin::TableIdentity>>,
    last_intact: LastIntact,
}

/// The last intact look, written by each session's watch task.
#[derive(Debug, Clone, Default)]
struct LastIntact(Arc<Mutex<Option<Observation>>>);

impl LastIntact {
    fn get(&self) -> Option<Observation> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn set(&self, look: &Observation) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(look.clone());
    }
}

impl TableBaseline {
    /// Another instance streamed the slot meanwhile (this one stood by and
    /// takes it over): what it found then no longer speaks for the tables.
    pub(super) fn forget(&mut self) {
        *self = TableBaseline::default();
    }
}

/// What the watch has to tell the session.
pub(super) enum WatchNews {
    /// The table changed: halt, with this reason.
    Changed(String),
    /// The watch cannot look: end the session.
    Lost(AdminError),
}

/// What the watch task reports to the session.
#[derive(Debug, Clone, Default)]
struct WatchState {
    /// Set once the table changed: why, and what to do.
    changed: Option<String>,
    /// Set when the watch cannot look any more: why.
    lost: Option<String>,
    /// Looks completed; lets [`TableWatch::settle`] wait for the next one.
    looks: u64,
}

pub(super) struct TableWatch {
    ceiling: ConfirmCeiling,
    state: watch::Receiver<WatchState>,
    /// Asks the task for a look now instead of at the next interval.
    hurry: Arc<Notify>,
    /// The change was told to the session (it is told once).
    change_told: bool,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TableWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TableWatch {
    /// Takes the table's identity now (the session has just checked it is
    /// published) and starts watching it against `baseline` (set from this
    /// look in the process's first session). Nothing above `start` is
    /// confirmable until the first look after this one.
    pub(super) async fn start(
        settings: &SourceSettings,
        start: Lsn,
        interval: Duration,
        baseline: &mut TableBaseline,
    ) -> Result<TableWatch, AdminError> {
        // Named apart from the other SQL connections, for pg_stat_activity.
        let mut settings = settings.clone();
        settings.conn.application_name = format!("{}-watch", settings.conn.application_name);
        let settings = &settings;
        let look_seconds = metrics::histogram!(m::TABLE_WATCH_LOOK_SECONDS);
        let began = Instant::now();
        let client = admin::connect_sql(&settings.conn).await?;
        let targets: Vec<_> = settings.targets().collect();
        let look = admin::prepare_look(&client, &targets).await?;
        let first = admin::observe(&client, &look).await?;
        look_seconds.record(began.elapsed().as_secs_f64());
        let (tx, state) = watch::channel(WatchState::default());
        let ceiling = ConfirmCeiling::new(start);
        let hurry = Arc::new(Notify::new());
        let identities = baseline
            .identities
            .get_or_insert_with(|| first.identities.clone())
            .clone();
        // The session checked the table a moment ago; if it changed since,
        // or since an earlier session, this first look already says so.
        let mut last_intact = first.clone();
        if let Err(found) = admin::judge_all(&identities, &first.identities) {
            if let Some(earlier) = baseline.last_intact.get() {
                last_intact = earlier;
            }
            let (i, change) = match admin::observe(&client, &look).await {
                Ok(again) => {
                    admin::named_change(found, admin::judge_all(&identities, &again.identities))
                }
                Err(_) => found,
            };
            tx.send_modify(|s| s.changed = Some(reason(settings, i, change, start, &last_intact)));
        } else {
            baseline.last_intact.set(&first);
        }
        let task = tokio::spawn(watch_loop(Looker {
            settings: settings.clone(),
            conn: Some((client, look)),
            look_seconds,
            previous_lsn: first.lsn,
            start: identities,
            last_intact,
            shared_intact: baseline.last_intact.clone(),
            ceiling: ceiling.clone(),
            tx,
            hurry: Arc::clone(&hurry),
            interval,
            failing: false,
            last_look: Instant::now(),
        }));
        Ok(TableWatch {
            ceiling,
            state,
            hurry,
            change_told: false,
            task,
        })
    }

    pub(super) fn ceiling(&self) -> ConfirmCeiling {
        self.ceiling.clone()
    }

    /// How far the last intact look vouches for the tables.
    pub(super) fn vouched(&self) -> Lsn {
        self.ceiling.get()
    }

    /// Resolves when the table changed (with the halt reason) or the watch
    /// cannot look any more (see [`LOST_AFTER`]). Cancel-safe.
    pub(super) async fn news(&mut self) -> WatchNews {
        loop {
            {
                let state = self.state.borrow_and_update();
                if let Some(cause) = state.lost.clone() {
                    return WatchNews::Lost(AdminError::WatchLost { cause });
                }
                if let Some(reason) = state.changed.clone().filter(|_| !self.change_told) {
                    self.change_told = true;
                    return WatchNews::Changed(reason);
                }
            }
            if self.state.changed().await.is_err() {
                // The task ended without news (it does not): never.
                std::future::pending::<()>().await;
            }
        }
    }

    /// At a graceful stop: looks at once, as often as needed (at most
    /// `timeout`) for the ceiling to reach `target`, so that everything
    /// acked is confirmed. Returns what may be confirmed.
    pub(super) async fn settle(&self, target: Lsn, timeout: Duration) -> Lsn {
        let mut state = self.state.clone();
        let settled = async {
            while self.ceiling.get() < target && state.borrow().changed.is_none() {
                self.hurry.notify_one();
                if state.changed().await.is_err() {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(timeout, settled).await;
        target.min(self.ceiling.get())
    }
}

struct Looker {
    settings: SourceSettings,
    /// The connection and the look prepared on it.
    conn: Option<(Client, Look)>,
    look_seconds: Histogram,
    /// The WAL position the last successful look read: one that reads the
    /// same found no WAL written since.
    previous_lsn: crate::Lsn,
    /// Each table's identity at the start, in configuration order.
    start: Vec<admin::TableIdentity>,
    /// The latest look that found the table intact.
    last_intact: Observation,
    /// [`TableBaseline`]'s copy of it, for the sessions after this one.
    shared_intact: LastIntact,
    ceiling: ConfirmCeiling,
    tx: watch::Sender<WatchState>,
    hurry: Arc<Notify>,
    interval: Duration,
    /// The last look failed (an outage, logged once).
    failing: bool,
    /// When the last look succeeded (or the watch started).
    last_look: Instant,
}

/// What a failed look means for the watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failed {
    /// Look again, on the busy beat.
    Retry,
    /// The server is shutting down, or has not answered for too long: the
    /// watch ends, and its session with it.
    Lost,
}

impl Looker {
    /// Tells of a failed look (once per outage), drops the connection, and
    /// says whether the watch goes on.
    fn look_failed(&mut self, e: AdminError) -> Failed {
        if !self.failing {
            tracing::warn!(error = %e, "table watch: cannot look at the outbox table; \
                confirmation waits until PostgreSQL answers again");
        }
        self.failing = true;
        self.conn = None;
        let shutting_down = match &e {
            AdminError::Connect { error, .. } | AdminError::Sql { source: error, .. } => error
                .as_db_error()
                .is_some_and(|db| SHUTTING_DOWN.contains(&db.code().code())),
            _ => false,
        };
        if shutting_down || self.last_look.elapsed() >= LOST_AFTER.max(self.interval * 3) {
            self.tx.send_modify(|s| {
                s.lost = Some(e.to_string());
                s.looks += 1;
            });
            return Failed::Lost;
        }
        self.tx.send_modify(|s| s.looks += 1);
        Failed::Retry
    }
}

async fn watch_loop(mut l: Looker) {
    // After a change the ceiling stays where it is; looking goes on only to
    // notice a server going away (see `lost`).
    let mut changed = l.tx.borrow().changed.is_some();
    let busy_period = l.interval / BUSY_LOOKS_PER_INTERVAL;
    let mut wants = l.ceiling.wants();
    // The first look (in `start`) read a position nothing has vouched for.
    let mut busy = true;
    let mut look_began = Instant::now();
    loop {
        let next_look = look_began
            + if busy || changed {
                busy_period
            } else {
                l.interval
            };
        tokio::select! {
            _ = tokio::time::sleep_until(next_look) => {}
            _ = l.hurry.notified() => {}
            // Idle, and the driver may now want what the ceiling holds
            // back: the busy beat again, at once if a busy period passed.
            wanted = wants.changed(), if !(busy || changed) => {
                if wanted.is_err() {
                    // The ceiling is gone with its session: never.
                    std::future::pending::<()>().await;
                }
                busy = l.ceiling.waiting();
                continue;
            }
        }
        // Looks start on a fixed beat, not a period after the last one
        // ended: a slow look (seen: 350 ms under load) would otherwise
        // stretch every period, and a commit waits for two of them.
        look_began = Instant::now();
        let now = match l.look().await {
            // A terminated backend says 57P01 like a server shutting down,
            // or the connection is simply found closed when the FATAL
            // arrived first. Only a new connection tells them apart: a
            // server shutting down refuses it (57P03), and that ends the
            // watch below.
            Err(e) if l.conn.is_none() && (terminated(&e) || closed(&e)) => {
                tracing::info!("table watch: its SQL connection closed; reconnecting");
                l.look().await
            }
            other => other,
        };
        let now = match now {
            Ok(now) => now,
            Err(e) => {
                busy = true;
                if l.look_failed(e) == Failed::Lost {
                    return;
                }
                continue;
            }
        };
        l.last_look = Instant::now();
        if std::mem::take(&mut l.failing) {
            tracing::info!("table watch: looking at the outbox table again");
        }
        let wal_moved = now.lsn != std::mem::replace(&mut l.previous_lsn, now.lsn);
        if changed {
            continue;
        }
        match admin::judge_all(&l.start, &now.identities) {
            Ok(()) => {
                l.ceiling.raise(l.last_intact.lsn);
                l.shared_intact.set(&now);
                l.last_intact = now;
                l.tx.send_modify(|s| s.looks += 1);
                // Nothing waits and nothing was written: the next look can
                // wait an interval (or until something waits).
                busy = wal_moved || l.ceiling.waiting();
            }
            Err(found) => {
                let (i, change) = match l.look().await {
                    Ok(again) => {
                        admin::named_change(found, admin::judge_all(&l.start, &again.identities))
                    }
                    Err(_) => found,
                };
                let reason = reason(&l.settings, i, change, l.ceiling.get(), &l.last_intact);
                l.tx.send_modify(|s| {
                    s.changed = Some(reason);
                    s.looks += 1;
                });
                changed = true;
            }
        }
    }
}

/// The watch's own backend was terminated (`pg_terminate_backend`, or a
/// shutdown) while it asked something.
fn terminated(e: &AdminError) -> bool {
    matches!(e, AdminError::Sql { source, .. }
        if source.as_db_error().is_some_and(|db| db.code().code() == "57P01"))
}

/// The watch's connection was found closed while it asked something.
fn closed(e: &AdminError) -> bool {
    matches!(e, AdminError::Sql { source, .. } if source.is_closed())
}

impl Looker {
    /// One look; on a new connection, which it prepares the look on first.
    async fn look(&mut self) -> Result<Observation, AdminError> {
        let began = Instant::now();
        let (client, look) = match self.conn.take() {
            Some((c, look)) if !c.is_closed() => (c, look),
            previous => {
                if previous.is_some() {
                    tracing::info!("table watch: its SQL connection closed; reconnecting");
                }
                let client = admin::connect_sql(&self.settings.conn).await?;
                let targets: Vec<_> = self.settings.targets().collect();
                let look = admin::prepare_look(&client, &targets).await?;
                (client, look)
            }
        };
        let now = admin::observe(&client, &look).await?;
        self.conn = Some((client, look));
        self.look_seconds.record(began.elapsed().as_secs_f64());
        Ok(now)
    }
}

/// The halt reason: what changed, what was kept, how to recover.
fn reason(
    s: &SourceSettings,
    table: usize,
    change: TableChange,
    kept: Lsn,
    last: &Observation,
) -> String {
    let t = s
        .targets()
        .nth(table)
        .expect("a change names a watched table");
    let table = admin::qualified(&t);
    let publication = quote_ident(&s.publication);
    // A new publication needs every outbox table, not only the changed one.
    let all = s
        .targets()
        .map(|t| admin::qualified(&t))
        .collect::<Vec<_>>()
        .join(", ");
    let fix = match change {
        TableChange::PublicationDropped | TableChange::PublicationReplaced => format!(
            "CREATE PUBLICATION {publication} FOR TABLE {all} \
             WITH (publish = 'insert', publish_via_partition_root = true) if it is gone"
        ),
        TableChange::InsertsNotPublished => {
            format!("ALTER PUBLICATION {publication} SET (publish = 'insert')")
        }
        _ => format!(
            "ALTER PUBLICATION {publication} ADD TABLE {table} (for a partitioned table also \
             SET (publish_via_partition_root = true))"
        ),
    };
    format!(
        "outbox table {table} {change} while outboxd streamed publication {publication}: its inserts \
         since then are not in the replication stream, so the relay stopped and confirmed nothing \
         past {kept}. To recover: {fix}, restart outboxd, then re-publish the outbox rows committed \
         since {} (WAL position {kept}); they were not relayed",
        last.at
    )
}
