//! The outbox table's identity, observed on the SQL connection while a
//! relay streams it.
//!
//! pgoutput decides what to send by the catalog as it was at each change:
//! once the configured table has left the publication, or a new table took
//! its name, its inserts are simply not sent, and keepalives move the
//! stream on past them. So the relay may confirm a position only after it
//! has seen the table intact in a catalog snapshot taken *after* that
//! position was written. A look ([`observe`]) is one prepared statement
//! that reads every table's identity and the server's WAL position; the
//! position is read after the statement's snapshot was taken, so a look
//! never vouches for its own position, only a later look does (see
//! `relay::table_watch` for the argument). [`judge`] compares what it saw
//! with the session's start.

use tokio_postgres::{Client, Statement};

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

/// One look at every outbox table, and the WAL position a later look may
/// vouch for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Observation {
    /// The server's WAL position, read after the look's catalog snapshot
    /// was taken: the *next* look's snapshot is later than it.
    pub lsn: Lsn,
    /// When the look's transaction began (`now()`), as PostgreSQL prints
    /// it: before any snapshot the look read the catalog through, so a
    /// change it did not see was committed after this time, and the rows
    /// committed after it are the ones at risk if the next look finds a
    /// change.
    pub at: String,
    /// One per outbox table, in configuration order.
    pub identities: Vec<TableIdentity>,
}

/// A look, prepared once per connection: the statement and its arguments
/// (the watched tables, in configuration order).
pub(crate) struct Look {
    statement: Statement,
    tables: Vec<String>,
    publications: Vec<String>,
    schemas: Vec<String>,
    names: Vec<String>,
}

/// Every watched table's identity, one row each in configuration order,
/// and the WAL position (an uncorrelated sub-select: an InitPlan, evaluated
/// once per execution, so every row carries the same position). `now()` is
/// the transaction's start, which precedes its snapshots.
const LOOK_SQL: &str = "\
    SELECT (SELECT CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() \
                        ELSE pg_current_wal_lsn() END)::text, \
           now()::text, \
           t.relid, p.oid, \
           (SELECT pr.oid FROM pg_publication_rel pr \
             WHERE pr.prpubid = p.oid AND pr.prrelid = t.relid), \
           EXISTS (SELECT 1 FROM pg_publication_tables pt \
                    WHERE pt.pubname = t.pub AND pt.schemaname = t.sch AND pt.tablename = t.nam), \
           coalesce(p.pubinsert, false) \
      FROM (SELECT u.n, to_regclass(u.tbl)::oid AS relid, u.pub, u.sch, u.nam \
              FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) \
                   WITH ORDINALITY AS u(tbl, pub, sch, nam, n)) t \
      LEFT JOIN pg_publication p ON p.pubname = t.pub \
     ORDER BY t.n";

/// Prepares the look on `client` (one round trip, once per connection).
pub(crate) async fn prepare_look(
    client: &Client,
    targets: &[Target<'_>],
) -> Result<Look, AdminError> {
    let statement = client
        .prepare(LOOK_SQL)
        .await
        .map_err(sql_err("preparing the table watch's look"))?;
    Ok(Look {
        statement,
        tables: targets.iter().map(Target::qualified_table).collect(),
        publications: targets.iter().map(|t| t.publication.to_owned()).collect(),
        schemas: targets.iter().map(|t| t.table_schema.to_owned()).collect(),
        names: targets.iter().map(|t| t.table_name.to_owned()).collect(),
    })
}

/// One look: every table's identity and the WAL position, in one round
/// trip, on the connection `look` was prepared on.
pub(crate) async fn observe(client: &Client, look: &Look) -> Result<Observation, AdminError> {
    let rows = client
        .query(
            &look.statement,
            &[&look.tables, &look.publications, &look.schemas, &look.names],
        )
        .await
        .map_err(sql_err("looking at the outbox tables for the table watch"))?;
    let first = match rows.first() {
        Some(first) if rows.len() == look.tables.len() => first,
        _ => {
            return Err(AdminError::LookRows {
                rows: rows.len(),
                tables: look.tables.len(),
            })
        }
    };
    let lsn: String = first.get(0);
    let lsn = lsn.parse().map_err(|_| AdminError::BadLsn { text: lsn })?;
    let at: String = first.get(1);
    let identities = rows
        .iter()
        .map(|row| TableIdentity {
            table_oid: row.get(2),
            publication_oid: row.get(3),
            membership_oid: row.get(4),
            published: row.get(5),
            publishes_inserts: row.get(6),
        })
        .collect();
    Ok(Observation {
        lsn,
        at,
        identities,
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
