//! The PostgreSQL half of `outboxd check`. Facts are gathered on one SQL
//! connection first, then the replication connection is tried, then every
//! verdict is worked out from the facts. The refusals `outboxd run` would
//! make are the same [`AdminError`]s it makes, word for word.

use crate::config::Config;
use crate::source::admin::{self, AdminError, Issue, ServerFacts, Target};
use crate::source::replication;
use crate::source::session::SourceSettings;

use super::line::{Line, Verdict};
use super::postgres_facts::{gather, Facts};

/// The checks of this half, in output order.
const NAMES: [&str; 10] = [
    "postgres",
    "server version",
    "wal_level",
    "replication slots",
    "wal senders",
    "privileges",
    "slot",
    "failover slot",
    "publication",
    "outbox columns",
];

/// Every line of this half as `skip`.
pub(crate) fn skipped(why: &str) -> Vec<Line> {
    NAMES.iter().map(|n| Line::skip(n, why)).collect()
}

/// The lines of this half, and PostgreSQL's system identifier when
/// IDENTIFY_SYSTEM answered (the default transactional id derives from it).
pub(crate) async fn check(cfg: &Config, s: &SourceSettings) -> (Vec<Line>, Option<String>) {
    let t = s.target();
    let (client, facts) = match admin::connect_sql(&s.conn).await {
        Ok(client) => {
            let facts = gather(&client, &t).await;
            (Some(client), facts)
        }
        Err(e) => (None, Err(e)),
    };
    let facts = match facts {
        Ok(f) => f,
        Err(e) => {
            let mut lines = skipped("PostgreSQL did not answer (see postgres)");
            lines[0] = Line::fail("postgres", e);
            return (lines, None);
        }
    };
    // Opened after the counting above, so our own walsender is not counted
    // as a busy one.
    let (connection, system_id) = replication_line(s).await;
    let f = &facts.server;
    let mut lines = vec![
        connection,
        if f.version_num < admin::MIN_SERVER_VERSION_NUM {
            Line::fail(
                "server version",
                AdminError::ServerTooOld {
                    version: f.version.clone(),
                },
            )
        } else {
            Line::ok("server version", format!("PostgreSQL {}", f.version))
        },
        if f.wal_level != "logical" {
            Line::fail(
                "wal_level",
                AdminError::WalLevel {
                    actual: f.wal_level.clone(),
                },
            )
        } else {
            Line::ok("wal_level", "logical")
        },
        slots_line(f, &t, facts.slot.is_some()),
        if f.used_senders >= f.max_senders {
            Line::fail(
                "wal senders",
                AdminError::NoFreeWalSenders {
                    max: f.max_senders,
                    used: f.used_senders,
                },
            )
        } else {
            Line::ok(
                "wal senders",
                format!(
                    "{} of max_wal_senders = {} busy",
                    f.used_senders, f.max_senders
                ),
            )
        },
        privileges_line(&facts, &t),
        slot_line(&facts, &t),
        failover_line(&facts, &t),
    ];
    // The table lines, once per outbox table: each must exist, be in the
    // publication and have its columns.
    for (table_cfg, target) in cfg.tables().iter().zip(s.targets()) {
        let table_facts =
            if target.table_schema == t.table_schema && target.table_name == t.table_name {
                None
            } else {
                match client.as_ref() {
                    Some(c) => Some(gather(c, &target).await),
                    None => None,
                }
            };
        let facts = match &table_facts {
            None => &facts,
            Some(Ok(f)) => f,
            Some(Err(e)) => {
                lines.push(Line::fail("publication", e));
                continue;
            }
        };
        if table_facts.is_some() {
            lines.push(privileges_line(facts, &target));
        }
        lines.push(publication_line(facts, &target));
        lines.push(super::columns::columns_line(table_cfg, facts, &target));
    }
    (lines, system_id)
}

/// The replication connection and IDENTIFY_SYSTEM: what `outboxd run` opens
/// after its SQL checks. It needs a free WAL sender, the REPLICATION
/// attribute, and a pg_hba.conf line for replication connections.
async fn replication_line(s: &SourceSettings) -> (Line, Option<String>) {
    let mut conn = match replication::connect(&s.conn).await {
        Ok(conn) => conn,
        Err(e) => {
            let line = Line::fail(
                "postgres",
                format!("the SQL connection works, the replication connection does not: {e}"),
            );
            return (line, None);
        }
    };
    let identity = conn.identify_system().await;
    conn.close().await;
    match identity {
        Ok(id) => (
            Line::ok(
                "postgres",
                format!(
                    "SQL and replication connections to {} (system {}, timeline {})",
                    s.conn.describe(),
                    id.system_id,
                    id.timeline
                ),
            ),
            Some(id.system_id),
        ),
        Err(e) => (
            Line::fail("postgres", format!("IDENTIFY_SYSTEM failed: {e}")),
            None,
        ),
    }
}

fn slots_line(f: &ServerFacts, t: &Target<'_>, slot_exists: bool) -> Line {
    let used = format!(
        "{} of max_replication_slots = {} in use",
        f.used_slots, f.max_slots
    );
    if slot_exists {
        Line::ok(
            "replication slots",
            format!("{used}, {:?} among them", t.slot),
        )
    } else if !t.create_slot {
        Line::ok(
            "replication slots",
            format!("{used}; outboxd creates none (create_slot = false)"),
        )
    } else if f.used_slots >= f.max_slots {
        Line::fail(
            "replication slots",
            AdminError::NoFreeSlots {
                slot: t.slot.into(),
                max: f.max_slots,
            },
        )
    } else {
        Line::ok(
            "replication slots",
            format!("{used}; one is free for {:?}", t.slot),
        )
    }
}

fn privileges_line(facts: &Facts, t: &Target<'_>) -> Line {
    let f = &facts.server;
    let table = admin::qualified(t);
    let mut findings = Vec::new();
    let mut fine = vec![if f.superuser {
        "superuser"
    } else {
        "REPLICATION"
    }
    .to_string()];
    if !f.superuser && !f.replication {
        findings.push((
            Verdict::Fail,
            AdminError::NoReplicationPrivilege {
                user: f.user.clone(),
            }
            .to_string(),
        ));
    }
    if let Some(tf) = &facts.table {
        if tf.can_select {
            fine.push(format!("SELECT on {table}"));
        } else {
            findings.push((
                Verdict::Warn,
                Issue::NoSelect {
                    user: f.user.clone(),
                    table: table.clone(),
                }
                .to_string(),
            ));
        }
        // CREATE PUBLICATION ... FOR TABLE needs both; only asked when
        // outboxd would have to create it.
        if facts.publication.is_none() && t.create_publication {
            let mut missing = Vec::new();
            if !tf.can_create_in_database {
                missing.push(format!("CREATE on database {:?}", f.database));
            }
            if !tf.owned {
                missing.push(format!("ownership of {table}"));
            }
            if missing.is_empty() {
                fine.push("may create the publication".into());
            } else {
                findings.push((
                    Verdict::Fail,
                    Issue::CannotCreatePublication {
                        user: f.user.clone(),
                        publication: t.publication.into(),
                        missing: format!("it lacks {}", missing.join(" and ")),
                    }
                    .to_string(),
                ));
            }
        }
    }
    Line::worst(
        "privileges",
        findings,
        format!("role {:?}: {}", f.user, fine.join(", ")),
    )
}

fn slot_line(facts: &Facts, t: &Target<'_>) -> Line {
    let Some(info) = &facts.slot else {
        return if t.create_slot {
            Line::ok(
                "slot",
                format!(
                    "{:?} does not exist yet; outboxd will create it (pgoutput)",
                    t.slot
                ),
            )
        } else {
            Line::fail(
                "slot",
                AdminError::SlotMissing {
                    slot: t.slot.into(),
                },
            )
        };
    };
    if let Err(e) = admin::check_slot(t.slot, &facts.server.database, info) {
        return Line::fail("slot", e);
    }
    let wal_status = info.wal_status.as_deref().unwrap_or("unknown");
    let lag = facts
        .lag_bytes
        .map_or_else(|| "unknown".to_string(), |b| format!("{b} bytes"));
    let state = format!(
        "{:?}: pgoutput, database {:?}, not active, wal_status {wal_status}, confirmed {}, lag {lag}",
        t.slot,
        info.database.as_deref().unwrap_or_default(),
        info.confirmed_flush_lsn
            .map_or_else(|| "unknown".to_string(), |l| l.to_string()),
    );
    if wal_status == "unreserved" {
        let issue = Issue::SlotUnreserved {
            slot: t.slot.into(),
        };
        return Line::warn("slot", format!("{issue} ({state})"));
    }
    Line::ok("slot", state)
}

/// Whether the slot survives a failover to a standby (PostgreSQL 17 failover
/// slots), and what this server shows of its synchronisation.
fn failover_line(facts: &Facts, t: &Target<'_>) -> Line {
    let f = &facts.server;
    let Some(sync) = &facts.sync else {
        if t.failover_slot {
            return Line::fail(
                "failover slot",
                AdminError::FailoverUnsupported {
                    version: f.version.clone(),
                },
            );
        }
        return Line::ok(
            "failover slot",
            format!(
                "no (PostgreSQL {} has no failover slots): a failover to a standby loses the slot",
                f.version
            ),
        );
    };
    let is_failover = facts.slot.as_ref().and_then(|s| s.failover) == Some(true);
    let state = match &facts.slot {
        None if t.failover_slot => format!("{:?} will be created as a failover slot", t.slot),
        None => format!(
            "{:?} will be created without failover (postgres.failover_slot = false)",
            t.slot
        ),
        Some(_) if is_failover => format!("{:?} is a failover slot", t.slot),
        Some(_) => format!("{:?} is not a failover slot", t.slot),
    };
    if !t.failover_slot {
        return Line::ok("failover slot", format!("{state}; a failover to a standby loses it (set postgres.failover_slot = true to keep it)"));
    }
    if facts.slot.is_some() && !is_failover {
        // ALTER_REPLICATION_SLOT needs the REPLICATION attribute, as
        // streaming does.
        if !f.superuser && !f.replication {
            return Line::fail(
                "failover slot",
                format!(
                    "{state}, and role {:?} cannot alter it (no REPLICATION attribute): run \
                     ALTER_REPLICATION_SLOT {} ( FAILOVER true ) as its owner, or set postgres.failover_slot = false",
                    f.user, t.slot
                ),
            );
        }
    }
    let state = if facts.slot.is_some() && !is_failover {
        format!("{state}; outboxd makes it one at start (ALTER_REPLICATION_SLOT)")
    } else {
        state
    };
    if sync.in_recovery {
        let synced = facts.slot.as_ref().and_then(|s| s.synced) == Some(true);
        // A synchronised slot cannot be streamed until this server is
        // promoted: outboxd run belongs on the primary.
        return Line::warn(
            "failover slot",
            format!(
                "{state}; this server is a standby, the slot is {}synchronised from the primary here \
                 (synced = {synced}); outboxd streams from the primary: list both hosts in postgres.url \
                 with target_session_attrs=read-write",
                if synced { "" } else { "not " }
            ),
        );
    }
    if sync.standby_slots.is_empty() {
        return Line::warn(
            "failover slot",
            format!(
                "{state}; synchronized_standby_slots is empty on this primary: the relay may be sent \
                 changes a standby has not received, and after promoting it the slot would be ahead \
                 of the new primary; list the standby's physical slot in synchronized_standby_slots"
            ),
        );
    }
    Line::ok(
        "failover slot",
        format!(
            "{state}; synchronized_standby_slots = {:?}: the relay is only sent what those standbys have",
            sync.standby_slots
        ),
    )
}

fn publication_line(facts: &Facts, t: &Target<'_>) -> Line {
    let table = admin::qualified(t);
    let publication = t.publication.to_string();
    let Some(table_facts) = &facts.table else {
        return Line::fail("publication", AdminError::TableMissing { table });
    };
    let Some(p) = &facts.publication else {
        return if t.create_publication {
            Line::ok(
                "publication",
                format!("{publication:?} does not exist yet; outboxd will create it for {table}, inserts only"),
            )
        } else {
            Line::fail(
                "publication",
                AdminError::PublicationMissing { publication, table },
            )
        };
    };
    let flags = admin::PublicationFlags {
        inserts: p.publishes_inserts,
        via_root: p.via_root,
        partitioned: table_facts.partitioned,
    };
    if let Err(e) = admin::check_publication(t, flags) {
        return Line::fail("publication", e);
    }
    if !p.covers_table {
        return Line::fail(
            "publication",
            AdminError::PublicationMissingTable { publication, table },
        );
    }
    if let Some(filter) = &p.row_filter {
        return Line::warn(
            "publication",
            Issue::RowFilter {
                publication,
                table,
                filter: filter.clone(),
            },
        );
    }
    Line::ok(
        "publication",
        format!("{publication:?} covers {table} and publishes inserts"),
    )
}
