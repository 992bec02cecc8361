//! The table's side: the rows of the range, read and mapped exactly as
//! `outboxd backfill` reads and maps them, kept as [`RowEntry`]s.

use std::collections::HashMap;
use std::sync::Arc;

use tokio_postgres::Client;

use super::entries::{RowEntry, UNMAPPABLE};
use super::error::AuditError;
use super::progress::ProgressReporter;
use super::spill::Sorter;
use crate::outbox::RecordMapper;
use crate::source::outbox_rows::RowReader;

/// The topics the rows route to, each with its index in the entries.
#[derive(Debug, Default)]
pub(crate) struct Topics {
    names: Vec<String>,
    index: HashMap<Arc<str>, u32>,
}

impl Topics {
    fn index_of(&mut self, topic: &Arc<str>) -> u32 {
        if let Some(&i) = self.index.get(topic) {
            return i;
        }
        let i = self.names.len() as u32;
        self.names.push(topic.to_string());
        self.index.insert(Arc::clone(topic), i);
        i
    }

    pub(crate) fn names(&self) -> &[String] {
        &self.names
    }
}

/// Learns topics from the table's oldest rows outside the range (a page of
/// them), for a range that has no rows: records stamped in the range on
/// those topics then tell deleted rows from a quiet range.
pub(crate) async fn sample_topics(
    client: &Client,
    mut reader: RowReader,
    mapper: &mut RecordMapper,
    topics: &mut Topics,
) -> Result<(), AuditError> {
    for event in reader.next_page(client).await? {
        if let Ok(record) = mapper.map(&event) {
            topics.index_of(&record.topic);
        }
    }
    Ok(())
}

/// Reads every row of the range in the reader's order (time column, then
/// storage order), which numbers them: the rank a key's records must
/// follow.
pub(crate) async fn read(
    client: &Client,
    reader: &mut RowReader,
    mapper: &mut RecordMapper,
    topics: &mut Topics,
    sorter: &mut Sorter<RowEntry>,
    progress: &impl ProgressReporter,
) -> Result<(), AuditError> {
    let mut rank = 0u64;
    loop {
        let page = reader.next_page(client).await?;
        if page.is_empty() {
            return Ok(());
        }
        progress.inc(page.len() as u64);
        for event in page {
            let entry = match mapper.map(&event) {
                Ok(record) => RowEntry {
                    id: record.event_id.as_deref().unwrap_or_default().to_vec(),
                    rank,
                    topic: topics.index_of(&record.topic),
                    key: record.key.as_deref().map(<[u8]>::to_vec),
                },
                Err(_) => {
                    let (key, id) = mapper.key_and_id(&event);
                    RowEntry {
                        id: id.as_deref().unwrap_or_default().to_vec(),
                        rank,
                        topic: UNMAPPABLE,
                        key: key.as_deref().map(<[u8]>::to_vec),
                    }
                }
            };
            rank += 1;
            sorter.push(entry).map_err(AuditError::Spill)?;
        }
    }
}
