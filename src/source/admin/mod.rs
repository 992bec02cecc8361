//! Slot and publication administration, and the preflight checks that turn
//! "it doesn't stream" into an error naming the fix. Runs on the ordinary SQL
//! connection: some managed services reject SQL on the walsender.

mod error;
mod inspect;
mod sql;
mod sql_tls;
mod target;
mod watch;

use std::time::Duration;

use tokio_postgres::Client;

use error::sql_err;
pub(crate) use error::AdminError;
pub(crate) use inspect::{
    publication_facts, qualified, server_facts, slot_lag_bytes, sync_facts, table_facts, type_fit,
    Issue, PublicationFacts, ServerFacts, SyncFacts, TableFacts, TypeFit,
};
pub use sql::connect_sql;
pub(crate) use target::{quote_ident, Target};
pub(crate) use watch::{
    judge_all, named_change, observe, prepare_look, Look, Observation, TableChange, TableIdentity,
};

use crate::source::replication::WalConnection;
use crate::Lsn;

/// Oldest server whose pgoutput and slot views outboxd relies on.
pub(crate) const MIN_SERVER_VERSION_NUM: i32 = 140000;
/// First server with failover slots (`pg_replication_slots.failover`).
pub(crate) const FAILOVER_SLOT_VERSION_NUM: i32 = 170000;

/// Server version, wal_level and the role's REPLICATION attribute.
pub(crate) async fn preflight(client: &Client) -> Result<(), AdminError> {
    let row = client
        .query_one(
            "SELECT current_setting('server_version_num')::int, current_setting('server_version'), \
                    current_setting('wal_level'), r.rolreplication OR r.rolsuper, current_user::text \
             FROM pg_roles r WHERE r.rolname = current_user",
            &[],
        )
        .await
        .map_err(sql_err("reading server settings"))?;
    check_server(row.get(0), row.get(1), row.get(2), row.get(3), row.get(4))?;
    let row = client
        .query_one(
            "SELECT current_setting('max_wal_senders')::bigint, \
                    (SELECT count(*) FROM pg_stat_replication)",
            &[],
        )
        .await
        .map_err(sql_err("counting WAL senders"))?;
    let (max, used): (i64, i64) = (row.get(0), row.get(1));
    if used >= max {
        return Err(AdminError::NoFreeWalSenders { max, used });
    }
    Ok(())
}

/// The server rules, pure so each refusal is unit-tested (a server older
/// than 14 cannot be started by the test suite).
pub(crate) fn check_server(
    version_num: i32,
    version: String,
    wal_level: String,
    can_replicate: bool,
    user: String,
) -> Result<(), AdminError> {
    if version_num < MIN_SERVER_VERSION_NUM {
        return Err(AdminError::ServerTooOld { version });
    }
    if wal_level != "logical" {
        return Err(AdminError::WalLevel { actual: wal_level });
    }
    if !can_replicate {
        return Err(AdminError::NoReplicationPrivilege { user });
    }
    Ok(())
}

/// Verifies the publication; `Ok(true)` when it is missing and outboxd
/// is to create it ([`create_publication`], once every check has passed).
///
/// A partitioned outbox is published through its root
/// (`publish_via_partition_root`): otherwise pgoutput names each row after
/// its partition, the relay would not recognise it as an outbox row, and the
/// slot would move past it. Published through the root, partitions attached
/// later are covered too.
pub(crate) async fn check_publication_ready(
    client: &Client,
    t: &Target<'_>,
) -> Result<bool, AdminError> {
    let table = t.qualified_table();
    let Some(relation) = client
        .query_opt(
            "SELECT c.relkind = 'p' FROM pg_class c WHERE c.oid = to_regclass($1)",
            &[&table],
        )
        .await
        .map_err(sql_err("looking up the outbox table"))?
    else {
        return Err(AdminError::TableMissing { table });
    };
    let partitioned: bool = relation.get(0);
    let publication = client
        .query_opt(
            "SELECT pubinsert, pubviaroot FROM pg_publication WHERE pubname = $1",
            &[&t.publication],
        )
        .await
        .map_err(sql_err("looking up the publication"))?;
    let Some(publication) = publication else {
        if !t.create_publication {
            return Err(AdminError::PublicationMissing {
                publication: t.publication.into(),
                table,
            });
        }
        return Ok(true);
    };
    check_publication(
        t,
        PublicationFlags {
            inserts: publication.get(0),
            via_root: publication.get(1),
            partitioned,
        },
    )?;
    let covered = client
        .query_opt(
            "SELECT 1 FROM pg_publication_tables WHERE pubname = $1 AND schemaname = $2 AND tablename = $3",
            &[&t.publication, &t.table_schema, &t.table_name],
        )
        .await
        .map_err(sql_err("checking the publication's tables"))?;
    if covered.is_none() {
        return Err(AdminError::PublicationMissingTable {
            publication: t.publication.into(),
            table,
        });
    }
    Ok(false)
}

/// Creates the publication, through the partition root.
pub(crate) async fn create_publication(client: &Client, t: &Target<'_>) -> Result<(), AdminError> {
    let table = t
        .all_tables
        .iter()
        .map(|x| format!("{}.{}", quote_ident(&x.schema), quote_ident(&x.name)))
        .collect::<Vec<_>>()
        .join(", ");
    // Through the root for every table: harmless for a plain one, and
    // the same publication then serves it if it becomes partitioned.
    let sql = format!(
        "CREATE PUBLICATION {} FOR TABLE {} \
         WITH (publish = 'insert', publish_via_partition_root = true)",
        quote_ident(t.publication),
        table
    );
    match client.batch_execute(&sql).await {
        Ok(()) => {
            tracing::info!(publication = t.publication, tables = %table, "created publication")
        }
        // Another instance created it between our check and now.
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::DUPLICATE_OBJECT) => {}
        Err(e) => {
            return Err(AdminError::Sql {
                context: "creating the publication",
                source: e,
            })
        }
    }
    Ok(())
}

/// What decides whether an existing publication can carry the outbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PublicationFlags {
    /// `pubinsert`.
    pub inserts: bool,
    /// `pubviaroot`.
    pub via_root: bool,
    /// The outbox table is partitioned (`relkind = 'p'`).
    pub partitioned: bool,
}

/// The publication rules, pure so each refusal is unit-tested; shared by
/// `outboxd run` and `outboxd check`.
pub(crate) fn check_publication(t: &Target<'_>, f: PublicationFlags) -> Result<(), AdminError> {
    if !f.inserts {
        return Err(AdminError::PublicationNoInserts {
            publication: t.publication.into(),
        });
    }
    if f.partitioned && !f.via_root {
        return Err(AdminError::PublicationNotViaRoot {
            publication: t.publication.into(),
            table: t.qualified_table(),
        });
    }
    Ok(())
}

/// A slot as `pg_replication_slots` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SlotInfo {
    pub plugin: Option<String>,
    pub slot_type: String,
    pub database: Option<String>,
    pub active_pid: Option<i32>,
    pub wal_status: Option<String>,
    pub confirmed_flush_lsn: Option<Lsn>,
    pub restart_lsn: Option<Lsn>,
    /// `failover` (PostgreSQL 17+; `None` before).
    pub failover: Option<bool>,
    /// `synced`: a copy kept by a standby's slot sync (PostgreSQL 17+).
    pub synced: Option<bool>,
}

pub(crate) async fn slot_info(client: &Client, slot: &str) -> Result<Option<SlotInfo>, AdminError> {
    let row = client
        .query_opt(
            // Through to_jsonb: `failover` and `synced` exist from 17 on,
            // and are NULL here before.
            "SELECT plugin::text, slot_type, database::text, active_pid, wal_status, \
                    confirmed_flush_lsn::text, restart_lsn::text, \
                    (to_jsonb(s) ->> 'failover')::bool, (to_jsonb(s) ->> 'synced')::bool \
             FROM pg_replication_slots s WHERE slot_name = $1",
            &[&slot],
        )
        .await
        .map_err(sql_err("looking up the replication slot"))?;
    Ok(row.map(|r| SlotInfo {
        plugin: r.get(0),
        slot_type: r.get(1),
        database: r.get(2),
        active_pid: r.get(3),
        wal_status: r.get(4),
        confirmed_flush_lsn: r.get::<_, Option<String>>(5).and_then(|s| s.parse().ok()),
        restart_lsn: r.get::<_, Option<String>>(6).and_then(|s| s.parse().ok()),
        failover: r.get(7),
        synced: r.get(8),
    }))
}

/// Verifies the slot is usable by us: `Ok(None)` when it is missing and
/// outboxd is to create it ([`create_slot`], once every check has passed).
pub(crate) async fn check_slot_ready(
    client: &Client,
    t: &Target<'_>,
) -> Result<Option<SlotInfo>, AdminError> {
    let database = current_database(client).await?;
    if t.failover_slot {
        let row = client
            .query_one(
                "SELECT current_setting('server_version_num')::int, current_setting('server_version')",
                &[],
            )
            .await
            .map_err(sql_err("reading the server version"))?;
        check_failover_supported(row.get(0), row.get(1))?;
    }
    if let Some(info) = slot_info(client, t.slot).await? {
        check_slot(t.slot, &database, &info)?;
        return Ok(Some(info));
    }
    if !t.create_slot {
        return Err(AdminError::SlotMissing {
            slot: t.slot.into(),
        });
    }
    let row = client
        .query_one(
            "SELECT current_setting('max_replication_slots')::bigint, (SELECT count(*) FROM pg_replication_slots)",
            &[],
        )
        .await
        .map_err(sql_err("counting replication slots"))?;
    let (max, used): (i64, i64) = (row.get(0), row.get(1));
    if used >= max {
        return Err(AdminError::NoFreeSlots {
            slot: t.slot.into(),
            max,
        });
    }
    Ok(None)
}

/// Creates the slot (pgoutput) and verifies what was created.
pub(crate) async fn create_slot(client: &Client, t: &Target<'_>) -> Result<SlotInfo, AdminError> {
    let database = current_database(client).await?;
    // The fifth argument (failover) exists from PostgreSQL 17 on;
    // check_slot_ready refused failover_slot on older servers already.
    let created = if t.failover_slot {
        client
            .query_one(
                "SELECT pg_create_logical_replication_slot($1, 'pgoutput', false, false, true)",
                &[&t.slot],
            )
            .await
    } else {
        client
            .query_one(
                "SELECT pg_create_logical_replication_slot($1, 'pgoutput')",
                &[&t.slot],
            )
            .await
    };
    match created {
        Ok(_) => tracing::info!(slot = t.slot, "created replication slot"),
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::DUPLICATE_OBJECT) => {}
        Err(e)
            if e.code() == Some(&tokio_postgres::error::SqlState::CONFIGURATION_LIMIT_EXCEEDED) =>
        {
            return Err(AdminError::NoFreeSlots {
                slot: t.slot.into(),
                max: max_replication_slots(client).await?,
            })
        }
        Err(e) => {
            return Err(AdminError::Sql {
                context: "creating the replication slot",
                source: e,
            })
        }
    }
    let info = slot_info(client, t.slot)
        .await?
        .ok_or_else(|| AdminError::SlotMissing {
            slot: t.slot.into(),
        })?;
    check_slot(t.slot, &database, &info)?;
    Ok(info)
}

/// `postgres.failover_slot` needs PostgreSQL 17; pure so it is unit-tested.
pub(crate) fn check_failover_supported(
    version_num: i32,
    version: String,
) -> Result<(), AdminError> {
    if version_num < FAILOVER_SLOT_VERSION_NUM {
        return Err(AdminError::FailoverUnsupported { version });
    }
    Ok(())
}

/// With `postgres.failover_slot`, makes an existing slot a failover slot.
/// `ALTER_REPLICATION_SLOT` is a replication command (PostgreSQL 17 has no
/// SQL function for it), so it runs on the walsender connection, before
/// START_REPLICATION.
pub(crate) async fn ensure_failover(
    conn: &mut WalConnection,
    t: &Target<'_>,
    mut info: SlotInfo,
) -> Result<SlotInfo, AdminError> {
    if !t.failover_slot || info.failover == Some(true) {
        return Ok(info);
    }
    conn.simple_query(&alter_failover_command(t.slot))
        .await
        .map_err(|error| AdminError::FailoverAlter {
            slot: t.slot.into(),
            error: Box::new(error),
        })?;
    tracing::info!(slot = t.slot, "made the replication slot a failover slot");
    info.failover = Some(true);
    Ok(info)
}

/// Slot names are validated (`[a-z0-9_]`) before they get here.
pub(crate) fn alter_failover_command(slot: &str) -> String {
    format!(
        "ALTER_REPLICATION_SLOT {} ( FAILOVER true )",
        quote_ident(slot)
    )
}

async fn current_database(client: &Client) -> Result<String, AdminError> {
    Ok(client
        .query_one("SELECT current_database()::text", &[])
        .await
        .map_err(sql_err("reading the database name"))?
        .get(0))
}

async fn max_replication_slots(client: &Client) -> Result<i64, AdminError> {
    Ok(client
        .query_one(
            "SELECT current_setting('max_replication_slots')::bigint",
            &[],
        )
        .await
        .map_err(sql_err("reading max_replication_slots"))?
        .get(0))
}

/// The slot rules, pure so every refusal is unit-tested.
pub(crate) fn check_slot(slot: &str, database: &str, info: &SlotInfo) -> Result<(), AdminError> {
    if info.slot_type != "logical" {
        return Err(AdminError::SlotNotLogical { slot: slot.into() });
    }
    if let Some(plugin) = info.plugin.as_deref().filter(|p| *p != "pgoutput") {
        return Err(AdminError::SlotWrongPlugin {
            slot: slot.into(),
            plugin: plugin.into(),
        });
    }
    if let Some(db) = info.database.as_deref().filter(|d| *d != database) {
        return Err(AdminError::SlotWrongDatabase {
            slot: slot.into(),
            database: db.into(),
            expected: database.into(),
        });
    }
    if info.wal_status.as_deref() == Some("lost") {
        return Err(AdminError::SlotLost { slot: slot.into() });
    }
    if let Some(pid) = info.active_pid {
        return Err(AdminError::SlotActive {
            slot: slot.into(),
            pid,
        });
    }
    Ok(())
}

/// The server's `wal_sender_timeout` (0 = disabled). Status updates must be
/// sent well within it.
pub(crate) async fn wal_sender_timeout(client: &Client) -> Result<Duration, AdminError> {
    let ms: i64 = client
        .query_one(
            "SELECT setting::bigint FROM pg_settings WHERE name = 'wal_sender_timeout'",
            &[],
        )
        .await
        .map_err(sql_err("reading wal_sender_timeout"))?
        .get(0);
    Ok(Duration::from_millis(ms.max(0) as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy() -> SlotInfo {
        SlotInfo {
            plugin: Some("pgoutput".into()),
            slot_type: "logical".into(),
            database: Some("app".into()),
            active_pid: None,
            wal_status: Some("reserved".into()),
            confirmed_flush_lsn: Some(Lsn(1)),
            restart_lsn: Some(Lsn(1)),
            failover: None,
            synced: None,
        }
    }

    #[test]
    fn failover_slots_need_postgresql_17() {
        check_failover_supported(170002, "17.2".into()).unwrap();
        let err = check_failover_supported(160004, "16.4".into())
            .unwrap_err()
            .to_string();
        assert!(err.contains("postgres.failover_slot"), "{err}");
        assert!(err.contains("16.4"), "{err}");
        assert_eq!(
            alter_failover_command("outboxd"),
            "ALTER_REPLICATION_SLOT \"outboxd\" ( FAILOVER true )"
        );
    }

    #[test]
    fn accepts_a_healthy_slot() {
        check_slot("s", "app", &healthy()).unwrap();
    }

    #[test]
    fn refuses_each_unusable_slot_with_the_fix() {
        let cases: Vec<(SlotInfo, &str)> = vec![
            (
                SlotInfo {
                    slot_type: "physical".into(),
                    plugin: None,
                    ..healthy()
                },
                "physical",
            ),
            (
                SlotInfo {
                    plugin: Some("wal2json".into()),
                    ..healthy()
                },
                "wal2json",
            ),
            (
                SlotInfo {
                    database: Some("other".into()),
                    ..healthy()
                },
                "belongs to database \"other\"",
            ),
            (
                SlotInfo {
                    wal_status: Some("lost".into()),
                    ..healthy()
                },
                "wal_status = 'lost'",
            ),
            (
                SlotInfo {
                    active_pid: Some(4242),
                    ..healthy()
                },
                "active for PID 4242",
            ),
        ];
        for (info, needle) in cases {
            let msg = check_slot("s", "app", &info).unwrap_err().to_string();
            assert!(msg.contains(needle), "{msg}");
            assert!(msg.contains("\"s\""), "names the slot: {msg}");
        }
    }

    #[test]
    fn server_rules_name_the_fix() {
        check_server(150004, "15.4".into(), "logical".into(), true, "u".into()).unwrap();
        let old =
            check_server(130012, "13.12".into(), "logical".into(), true, "u".into()).unwrap_err();
        assert!(
            old.to_string().contains("PostgreSQL 13.12 is too old"),
            "{old}"
        );
        assert!(old.to_string().contains("14 or newer"), "{old}");
        let wal =
            check_server(150004, "15.4".into(), "replica".into(), true, "u".into()).unwrap_err();
        assert!(wal.to_string().contains("wal_level = logical"), "{wal}");
        let role =
            check_server(150004, "15.4".into(), "logical".into(), false, "app".into()).unwrap_err();
        assert!(
            role.to_string().contains("ALTER ROLE \"app\" REPLICATION"),
            "{role}"
        );
    }

    #[test]
    fn quotes_identifiers() {
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
    }
}
