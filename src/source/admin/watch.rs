//! The outbox table's identity, observed on the SQL connection while a
//! relay streams it.
//!
//! pgoutput decides what to send by the catalog as it was at each change:
//! once the configured table has left the publication, or a new table took
//! its name, its inserts are simply not sent, and keepalives move the
//! stream on past them. So the relay may confirm a position only after it
//! has seen the table intact in a catalog snapshot taken *after* that
//! position was written. [`observe`] reads the server's WAL position first
//! and the catalog in a later statement (a new snapshot), which gives that
//! order; [`judge`] compares what it saw with the session's start.

use tokio_postgres::Client;

use super::error::{sql_err, AdminError};
use super::target::Target;
use crate::Lsn;

/// What makes the configured table the one whose inserts the stream carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TableIdentity {
    /// `None`: no table of that name.
    pub table_oid: Option<u32>,
    /// `None`: no publication of that name.
    pub publication_oid: Option<u32>,
    /// The `pg_publication_rel` row that adds the table to the publication:
    /// a new one means it left and was added again (events between were
    /// not published). `None` for `FOR ALL TABLES` or `TABLES IN SCHEMA`.
    pub membership_oid: Option<u32>,
    /// Listed in `pg_publication_tables` under its own name (for a
    /// partitioned table: published through its root).
    pub published: bool,
    pub publishes_inserts: bool,
}

/// One look at every outbox table, and the WAL position it vouches for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Observation {
    /// The server's WAL position, read before the catalog.
    pub lsn: Lsn,
    /// The server's clock at that moment, as PostgreSQL prints it: rows
    /// committed after it are the ones at risk if the next look fails.
    pub at: String,
    /// One per outbox table, in configuration order.
    pub identities: Vec<TableIdentity>,
}

/// Reads the WAL position, then (in later statements, so later snapshots)
/// each table's identity.
pub(crate) async fn observe(
    client: &Client,
    targets: &[Target<'_>],
) -> Result<Observation, AdminError> {
    let row = client
        .query_one(
            "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() \
                          ELSE pg_current_wal_lsn() END)::text, clock_timestamp()::text",
            &[],
        )
        .await
        .map_err(sql_err("reading the WAL position for the table watch"))?;
    let lsn: String = row.get(0);
    let lsn = lsn.parse().map_err(|_| AdminError::BadLsn { text: lsn })?;
    let at: String = row.get(1);
    let mut identities = Vec::with_capacity(targets.len());
    for t in targets {
        identities.push(identity(client, t).await?);
    }
    Ok(Observation {
        lsn,
        at,
        identities,
    })
}

async fn identity(client: &Client, t: &Target<'_>) -> Result<TableIdentity, AdminError> {
    let table = t.qualified_table();
    let row = client
        .query_one(
            "WITH t AS (SELECT to_regclass($1)::oid AS relid), \
                  p AS (SELECT oid, pubinsert FROM pg_publication WHERE pubname = $2) \
             SELECT (SELECT relid FROM t), (SELECT oid FROM p), \
                    (SELECT pr.oid FROM pg_publication_rel pr, p, t \
                      WHERE pr.prpubid = p.oid AND pr.prrelid = t.relid), \
                    EXISTS (SELECT 1 FROM pg_publication_tables \
                             WHERE pubname = $2 AND schemaname = $3 AND tablename = $4), \
                    coalesce((SELECT pubinsert FROM p), false)",
            &[&table, &t.publication, &t.table_schema, &t.table_name],
        )
        .await
        .map_err(sql_err("checking the outbox table's identity"))?;
    Ok(TableIdentity {
        table_oid: row.get(0),
        publication_oid: row.get(1),
        membership_oid: row.get(2),
        published: row.get(3),
        publishes_inserts: row.get(4),
    })
}

/// The first table (by index) whose identity changed since `start`.
pub(crate) fn judge_all(
    start: &[TableIdentity],
    now: &[TableIdentity],
) -> Result<(), (usize, TableChange)> {
    for (i, (s, n)) in start.iter().zip(now).enumerate() {
        judge(s, n).map_err(|c| (i, c))?;
    }
    Ok(())
}

/// The change to name when a first look found `first` and a second look,
/// in statements begun after the first, found `second`. One statement
/// reads the catalog through more than one snapshot (`to_regclass` and
/// `pg_publication_tables` through the catalog cache, the joins through the
/// statement's own), so a look that overlaps the change's commit can mix
/// its two sides and name the wrong change: CI saw a re-created table named
/// as one that left the publication, and 219 of 30,000 looks mixed under a
/// loop of re-creations. The second look names it. A second look that finds
/// the table intact keeps the first finding: a change undone at once still
/// kept the inserts made meanwhile out of the stream.
pub(crate) fn named_change(
    first: (usize, TableChange),
    second: Result<(), (usize, TableChange)>,
) -> (usize, TableChange) {
    second.err().unwrap_or(first)
}

/// How the table stopped being the one the stream carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TableChange {
    Dropped,
    /// Another table now has the name (dropped and created, or renamed).
    Replaced {
        old: u32,
        new: u32,
    },
    PublicationDropped,
    PublicationReplaced,
    /// Removed from the publication (or, partitioned, no longer published
    /// through its root).
    LeftPublication,
    /// Removed from the publication and added again.
    Republished,
    InsertsNotPublished,
}

impl std::fmt::Display for TableChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TableChange::Dropped => write!(f, "was dropped or renamed"),
            TableChange::Replaced { old, new } => write!(
                f,
                "was replaced: the name now belongs to another table (OID {old} became {new})"
            ),
            TableChange::PublicationDropped => write!(f, "lost its publication (dropped)"),
            TableChange::PublicationReplaced => {
                write!(f, "lost its publication (dropped and created again)")
            }
            TableChange::LeftPublication => write!(
                f,
                "left the publication (removed, or no longer published via the partition root)"
            ),
            TableChange::Republished => {
                write!(f, "was removed from the publication and added again")
            }
            TableChange::InsertsNotPublished => {
                write!(
                    f,
                    "is no longer published for inserts (publish option changed)"
                )
            }
        }
    }
}

/// The table as the session started with it versus now. Pure, so every
/// change is unit-tested.
pub(crate) fn judge(start: &TableIdentity, now: &TableIdentity) -> Result<(), TableChange> {
    let Some(oid) = now.table_oid else {
        return Err(TableChange::Dropped);
    };
    if let Some(old) = start.table_oid.filter(|old| *old != oid) {
        return Err(TableChange::Replaced { old, new: oid });
    }
    match now.publication_oid {
        None => return Err(TableChange::PublicationDropped),
        Some(p) if Some(p) != start.publication_oid => {
            return Err(TableChange::PublicationReplaced)
        }
        Some(_) => {}
    }
    if !now.publishes_inserts {
        return Err(TableChange::InsertsNotPublished);
    }
    if !now.published {
        return Err(TableChange::LeftPublication);
    }
    if now.membership_oid != start.membership_oid {
        return Err(TableChange::Republished);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_second_look_names_the_change_unless_it_found_the_table_intact() {
        let mixed = (0, TableChange::LeftPublication);
        let replaced = (
            0,
            TableChange::Replaced {
                old: 16400,
                new: 16420,
            },
        );
        assert_eq!(named_change(mixed, Err(replaced)), replaced);
        assert_eq!(named_change(mixed, Ok(())), mixed);
        let second_table = (1, TableChange::Dropped);
        assert_eq!(named_change(mixed, Err(second_table)), second_table);
    }

    fn intact() -> TableIdentity {
        TableIdentity {
            table_oid: Some(16400),
            publication_oid: Some(16410),
            membership_oid: Some(16411),
            published: true,
            publishes_inserts: true,
        }
    }

    #[test]
    fn an_unchanged_table_is_intact() {
        judge(&intact(), &intact()).unwrap();
    }

    #[test]
    fn every_change_is_named() {
        let cases = [
            (
                TableIdentity {
                    table_oid: None,
                    published: false,
                    membership_oid: None,
                    ..intact()
                },
                TableChange::Dropped,
            ),
            (
                TableIdentity {
                    table_oid: Some(16500),
                    ..intact()
                },
                TableChange::Replaced {
                    old: 16400,
                    new: 16500,
                },
            ),
            (
                TableIdentity {
                    publication_oid: None,
                    ..intact()
                },
                TableChange::PublicationDropped,
            ),
            (
                TableIdentity {
                    publication_oid: Some(1),
                    ..intact()
                },
                TableChange::PublicationReplaced,
            ),
            (
                TableIdentity {
                    published: false,
                    membership_oid: None,
                    ..intact()
                },
                TableChange::LeftPublication,
            ),
            (
                TableIdentity {
                    membership_oid: Some(16999),
                    ..intact()
                },
                TableChange::Republished,
            ),
            (
                TableIdentity {
                    publishes_inserts: false,
                    ..intact()
                },
                TableChange::InsertsNotPublished,
            ),
        ];
        for (now, change) in cases {
            assert_eq!(judge(&intact(), &now), Err(change), "{now:?}");
        }
    }
}
