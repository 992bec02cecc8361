//! Replication commands over the simple query protocol: IDENTIFY_SYSTEM and
//! START_REPLICATION (which turns the connection into a `ReplicationStream`).

use postgres_protocol::message::backend::Message;
use postgres_protocol::message::frontend;

use super::connect::WalConnection;
use super::error::{ReplicationError, ServerError};
use super::framed::Frame;
use super::stream::ReplicationStream;
use crate::Lsn;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemIdentity {
    pub system_id: String,
    pub timeline: u32,
    pub xlogpos: Lsn,
    pub dbname: Option<String>,
}

/// What START_REPLICATION asks pgoutput for.
#[derive(Debug, Clone)]
pub(crate) struct StartOptions {
    pub slot: String,
    pub publication: String,
    pub start_lsn: Lsn,
    /// pgoutput protocol version. 1 = whole transactions at commit (the
    /// server spills big ones to disk itself).
    pub proto_version: u32,
    /// Ask for `pg_logical_emit_message` messages too.
    pub messages: bool,
}

/// Slot and publication names go into commands as quoted identifiers and
/// literals; reject anything that could need escaping beyond that.
pub(crate) fn validate_identifier(kind: &str, name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{kind} name {name:?} must be 1-63 characters of a-z, 0-9 and _"
        ))
    }
}

/// The START_REPLICATION command text for `opts`. `publication_names` is a
/// string literal holding a comma-separated list of identifiers: the name
/// is double-quoted as an identifier (so case, spaces, commas and quotes
/// survive), then that is quoted as a literal.
pub(crate) fn start_replication_command(opts: &StartOptions) -> String {
    let publication = format!("\"{}\"", opts.publication.replace('"', "\"\""));
    format!(
        "START_REPLICATION SLOT \"{}\" LOGICAL {} (proto_version '{}', publication_names '{}', messages '{}')",
        opts.slot,
        opts.start_lsn,
        opts.proto_version,
        publication.replace('\'', "''"),
        opts.messages
    )
}

impl WalConnection {
    /// Runs a command and returns its rows as text. For replication commands
    /// and the few SQL queries the walsender allows.
    pub(crate) async fn simple_query(
        &mut self,
        sql: &str,
    ) -> Result<Vec<Vec<Option<String>>>, ReplicationError> {
        frontend::query(sql, &mut self.framed.write_buf)
            .map_err(|e| self.framed.protocol_err(e.to_string()))?;
        self.framed.flush().await?;
        let mut rows = Vec::new();
        let mut error = None;
        loop {
            match self.framed.read_frame().await? {
                Frame::Other(Message::DataRow(body)) => {
                    let buf = body.buffer();
                    let mut row = Vec::new();
                    let mut ranges = body.ranges();
                    while let Ok(Some(range)) =
                        fallible_iterator::FallibleIterator::next(&mut ranges)
                    {
                        row.push(range.map(|r| String::from_utf8_lossy(&buf[r]).into_owned()));
                    }
                    rows.push(row);
                }
                Frame::Other(Message::ErrorResponse(body)) => {
                    error = Some(ServerError::from_body(&body))
                }
                Frame::Other(Message::ReadyForQuery(_)) => break,
                Frame::Other(_) => {}
                Frame::CopyBothResponse | Frame::CopyData(_) => {
                    return Err(self
                        .framed
                        .protocol_err("unexpected copy frame in simple query"))
                }
            }
        }
        match error {
            Some(e) => Err(self.framed.server_err(e)),
            None => Ok(rows),
        }
    }

    pub async fn identify_system(&mut self) -> Result<SystemIdentity, ReplicationError> {
        let rows = self.simple_query("IDENTIFY_SYSTEM").await?;
        let row = rows
            .first()
            .filter(|r| r.len() >= 4)
            .ok_or_else(|| self.framed.protocol_err("IDENTIFY_SYSTEM returned no row"))?;
        let field = |i: usize| row[i].clone().unwrap_or_default();
        Ok(SystemIdentity {
            system_id: field(0),
            timeline: field(1)
                .parse()
                .map_err(|_| self.framed.protocol_err("bad timeline"))?,
            xlogpos: field(2)
                .parse()
                .map_err(|_| self.framed.protocol_err("bad xlogpos"))?,
            dbname: row[3].clone(),
        })
    }

    /// The history file of `timeline` (`TIMELINE_HISTORY`, timelines after
    /// the first): a line per ancestor, `parent<TAB>switchpoint<TAB>reason`.
    pub(crate) async fn timeline_history(
        &mut self,
        timeline: u32,
    ) -> Result<String, ReplicationError> {
        let rows = self
            .simple_query(&format!("TIMELINE_HISTORY {timeline}"))
            .await?;
        let content = rows.first().and_then(|r| r.get(1).cloned().flatten());
        content.ok_or_else(|| {
            self.framed
                .protocol_err("TIMELINE_HISTORY returned no content")
        })
    }

    /// Starts streaming. The server resumes at max(`start_lsn`, the slot's
    /// confirmed_flush_lsn), so 0/0 means "where the slot is".
    pub(crate) async fn start_replication(
        mut self,
        opts: &StartOptions,
    ) -> Result<ReplicationStream, ReplicationError> {
        validate_identifier("slot", &opts.slot).map_err(|r| self.framed.protocol_err(r))?;
        let sql = start_replication_command(opts);
        frontend::query(&sql, &mut self.framed.write_buf)
            .map_err(|e| self.framed.protocol_err(e.to_string()))?;
        self.framed.flush().await?;
        loop {
            match self.framed.read_frame().await? {
                Frame::CopyBothResponse => {
                    return Ok(ReplicationStream::new(self.framed, opts.start_lsn))
                }
                Frame::Other(Message::ErrorResponse(body)) => {
                    let e = ServerError::from_body(&body);
                    return Err(self.framed.server_err(e));
                }
                Frame::Other(Message::NoticeResponse(_))
                | Frame::Other(Message::ParameterStatus(_)) => {}
                _ => {
                    return Err(self
                        .framed
                        .protocol_err("unexpected answer to START_REPLICATION"))
                }
            }
        }
    }

    pub async fn close(self) {
        self.framed.close().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_text_quotes_names() {
        let cmd = start_replication_command(&StartOptions {
            slot: "outboxd".into(),
            publication: "pub_1".into(),
            start_lsn: Lsn(0x1_0000_0010),
            proto_version: 1,
            messages: true,
        });
        assert_eq!(
            cmd,
            "START_REPLICATION SLOT \"outboxd\" LOGICAL 1/10 (proto_version '1', publication_names '\"pub_1\"', messages 'true')"
        );
    }

    #[test]
    fn publication_names_are_quoted_as_identifier_then_literal() {
        let cmd = start_replication_command(&StartOptions {
            slot: "s".into(),
            publication: "Pub \"1\", l'été".into(),
            start_lsn: Lsn::ZERO,
            proto_version: 1,
            messages: false,
        });
        assert!(
            cmd.contains("publication_names '\"Pub \"\"1\"\", l''été\"'"),
            "{cmd}"
        );
    }

    #[test]
    fn identifiers_are_restricted() {
        assert!(validate_identifier("slot", "outboxd_1").is_ok());
        for bad in ["", "Outboxd", "a\"b", "a b", &"x".repeat(64)] {
            assert!(validate_identifier("slot", bad).is_err(), "{bad}");
        }
    }
}
