//! `outboxd tail`: print decoded outbox events as JSON lines, like
//! pg_recvlogical but decoded. It peeks: the slot does not move, because a
//! confirmed event is consumed, and `run` on the same slot would never relay
//! it. Only `confirm` (`--confirm`) confirms what was printed (whole
//! transactions only).

use std::io::Write;

use serde_json::{json, Map, Value};

use crate::outbox::{ColumnValue, EventKind, OutboxEvent};
use crate::source::assembler::SourceItem;
use crate::source::driver::{DriverOptions, Streamed};
use crate::source::error::SourceError;
use crate::source::replication::stream::DEFAULT_STREAM_TIMEOUT;
use crate::source::session::{SourceSession, SourceSettings};
use crate::Lsn;

#[derive(Debug, Clone, Default)]
pub struct TailOptions {
    /// Confirm the slot up to the last transaction printed in full. Off by
    /// default: confirming consumes the events from the slot `run` uses.
    pub confirm: bool,
    /// Stop after this many events (rounded up to whole transactions for
    /// confirmation: a cut transaction is printed in part, confirmed never).
    pub limit: Option<u64>,
    /// Status update interval.
    pub status_interval: std::time::Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum TailError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error("writing output: {0}")]
    Output(#[from] std::io::Error),
}

/// Runs until `limit` events were printed, or `stop` resolves (Ctrl-C).
pub async fn run(
    settings: &SourceSettings,
    opts: &TailOptions,
    out: &mut (dyn Write + Send),
    stop: impl std::future::Future<Output = ()>,
) -> Result<u64, TailError> {
    let session = SourceSession::open(settings).await?;
    let mut confirmed = session.start_lsn;
    let mut source = session.start(DriverOptions {
        status_interval: opts.status_interval,
        stream_timeout: DEFAULT_STREAM_TIMEOUT,
        ceiling: None,
        lag_gauge: None,
    });
    let mut pending: Vec<OutboxEvent> = Vec::new();
    let mut printed: u64 = 0;
    let limit = opts.limit.unwrap_or(u64::MAX);
    tokio::pin!(stop);
    let table = settings
        .tables
        .iter()
        .map(|t| format!("{}.{}", t.schema, t.name))
        .collect::<Vec<_>>()
        .join(", ");

    while printed < limit {
        let streamed = tokio::select! {
            biased;
            _ = &mut stop => break,
            s = source.recv() => s?,
        };
        match streamed {
            Streamed::Item {
                item: SourceItem::Event(e),
                ..
            } => pending.push(e),
            Streamed::Item {
                item: SourceItem::Checkpoint { lsn, .. },
                ..
            } => {
                let room = usize::try_from(limit - printed).unwrap_or(usize::MAX);
                let whole = pending.len() <= room;
                for e in pending.drain(..).take(room) {
                    writeln!(out, "{}", render(&e, lsn, &table))?;
                    printed += 1;
                }
                out.flush()?;
                // A transaction cut short by the limit is not confirmed,
                // so a later tail prints it again in full.
                if whole && opts.confirm {
                    confirmed = confirmed.max(lsn);
                }
            }
            // Between transactions (the driver says so), so nothing is
            // pending either.
            Streamed::Idle(wal_end) if opts.confirm && pending.is_empty() => {
                confirmed = confirmed.max(wal_end);
            }
            Streamed::Idle(_) | Streamed::Drained => {}
        }
        source.confirm(confirmed);
    }
    source.finish(confirmed).await?;
    Ok(printed)
}

/// One JSON line. `lsn` is the commit's end LSN.
pub(crate) fn render(e: &OutboxEvent, lsn: Lsn, table: &str) -> Value {
    let mut obj = Map::new();
    obj.insert("lsn".into(), json!(lsn.to_string()));
    obj.insert("xid".into(), json!(e.xid));
    obj.insert("commit_time_us".into(), json!(e.commit_time_us));
    match &e.kind {
        EventKind::Row(row) => {
            obj.insert("table".into(), json!(table));
            let mut cols = Map::new();
            for (info, value) in row.table.columns.iter().zip(&row.values) {
                let v = match value {
                    ColumnValue::Null => Value::Null,
                    ColumnValue::Text(b) => Value::String(String::from_utf8_lossy(b).into_owned()),
                    ColumnValue::UnchangedToast => json!({"unchanged_toast": true}),
                };
                cols.insert(info.name.clone(), v);
            }
            obj.insert("row".into(), Value::Object(cols));
        }
        EventKind::Message {
            transactional,
            prefix,
            content,
        } => {
            let content = match std::str::from_utf8(content) {
                Ok(s) => json!(s),
                Err(_) => {
                    json!({ "hex": content.iter().map(|b| format!("{b:02x}")).collect::<String>() })
                }
            };
            obj.insert(
                "message".into(),
                json!({"prefix": prefix, "content": content, "transactional": transactional}),
            );
        }
    }
    Value::Object(obj)
}
