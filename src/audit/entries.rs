//! What the audit keeps of each row and each record: the few fields the
//! comparison needs, in the order each pass sorts them.

use std::io::{self, Read, Write};

use super::spill::{
    read_bytes, read_first_u32, read_opt_bytes, read_u32, read_u64, write_bytes, write_opt_bytes,
    Entry,
};

/// Topic index of a row the mapper refuses (it goes to no topic).
pub(crate) const UNMAPPABLE: u32 = u32::MAX;

/// One outbox row: its id, its place in commit order as the table tells it
/// (time column, then storage order: what backfill sends by), and where
/// the mapping sends it. Sorted by id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct RowEntry {
    pub id: Vec<u8>,
    pub rank: u64,
    /// Index in the audit's topic list, or [`UNMAPPABLE`].
    pub topic: u32,
    pub key: Option<Vec<u8>>,
}

impl Entry for RowEntry {
    fn encode(&self, out: &mut impl Write) -> io::Result<()> {
        write_bytes(out, &self.id)?;
        out.write_all(&self.rank.to_le_bytes())?;
        out.write_all(&self.topic.to_le_bytes())?;
        write_opt_bytes(out, self.key.as_deref())
    }

    fn decode(input: &mut impl Read) -> io::Result<Option<Self>> {
        let Some(n) = read_first_u32(input)? else {
            return Ok(None);
        };
        let mut id = vec![0; n as usize];
        input.read_exact(&mut id)?;
        Ok(Some(RowEntry {
            id,
            rank: read_u64(input)?,
            topic: read_u32(input)?,
            key: read_opt_bytes(input)?,
        }))
    }

    fn heap_size(&self) -> usize {
        self.id.len() + self.key.as_ref().map_or(0, Vec::len)
    }
}

/// One Kafka record of a routed topic. Sorted by id, then where it is.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct RecordEntry {
    pub id: Vec<u8>,
    pub topic: u32,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    /// It has the `outboxd.backfill` header.
    pub backfill: bool,
    /// Its timestamp is inside the audited range.
    pub in_range: bool,
}

impl Entry for RecordEntry {
    fn encode(&self, out: &mut impl Write) -> io::Result<()> {
        write_bytes(out, &self.id)?;
        out.write_all(&self.topic.to_le_bytes())?;
        out.write_all(&self.partition.to_le_bytes())?;
        out.write_all(&self.offset.to_le_bytes())?;
        write_opt_bytes(out, self.key.as_deref())?;
        out.write_all(&[u8::from(self.backfill) | u8::from(self.in_range) << 1])
    }

    fn decode(input: &mut impl Read) -> io::Result<Option<Self>> {
        let Some(n) = read_first_u32(input)? else {
            return Ok(None);
        };
        let mut id = vec![0; n as usize];
        input.read_exact(&mut id)?;
        let topic = read_u32(input)?;
        let partition = read_u32(input)? as i32;
        let offset = read_u64(input)? as i64;
        let key = read_opt_bytes(input)?;
        let mut flags = [0];
        input.read_exact(&mut flags)?;
        Ok(Some(RecordEntry {
            id,
            topic,
            partition,
            offset,
            key,
            backfill: flags[0] & 1 != 0,
            in_range: flags[0] & 2 != 0,
        }))
    }

    fn heap_size(&self) -> usize {
        self.id.len() + self.key.as_ref().map_or(0, Vec::len)
    }
}

/// The first copy of a delivered event, for the order check: sorted by
/// partition, key and offset, each key's records then come in the order a
/// consumer reads them, and their ranks must grow.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct OrderEntry {
    pub topic: u32,
    pub partition: i32,
    pub key: Vec<u8>,
    pub offset: i64,
    pub rank: u64,
    pub id: Vec<u8>,
}

impl Entry for OrderEntry {
    fn encode(&self, out: &mut impl Write) -> io::Result<()> {
        write_bytes(out, &self.key)?;
        out.write_all(&self.topic.to_le_bytes())?;
        out.write_all(&self.partition.to_le_bytes())?;
        out.write_all(&self.offset.to_le_bytes())?;
        out.write_all(&self.rank.to_le_bytes())?;
        write_bytes(out, &self.id)
    }

    fn decode(input: &mut impl Read) -> io::Result<Option<Self>> {
        let Some(n) = read_first_u32(input)? else {
            return Ok(None);
        };
        let mut key = vec![0; n as usize];
        input.read_exact(&mut key)?;
        Ok(Some(OrderEntry {
            key,
            topic: read_u32(input)?,
            partition: read_u32(input)? as i32,
            offset: read_u64(input)? as i64,
            rank: read_u64(input)?,
            id: read_bytes(input)?,
        }))
    }

    fn heap_size(&self) -> usize {
        self.id.len() + self.key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip<T: Entry + Clone + std::fmt::Debug>(entries: &[T]) -> Vec<T> {
        let mut buf = Vec::new();
        for e in entries {
            e.encode(&mut buf).unwrap();
        }
        let mut r = &buf[..];
        let mut out = Vec::new();
        while let Some(e) = T::decode(&mut r).unwrap() {
            out.push(e);
        }
        out
    }

    #[test]
    fn entries_survive_a_run() {
        let rows = vec![
            RowEntry {
                id: b"a".to_vec(),
                rank: 7,
                topic: 2,
                key: Some(b"k".to_vec()),
            },
            RowEntry {
                id: Vec::new(),
                rank: u64::MAX,
                topic: UNMAPPABLE,
                key: None,
            },
        ];
        assert_eq!(round_trip(&rows), rows);
        let records = vec![
            RecordEntry {
                id: b"id-1".to_vec(),
                topic: 0,
                partition: -1,
                offset: i64::MAX,
                key: None,
                backfill: true,
                in_range: false,
            },
            RecordEntry {
                id: b"id-2".to_vec(),
                topic: 3,
                partition: 5,
                offset: 0,
                key: Some(Vec::new()),
                backfill: false,
                in_range: true,
            },
        ];
        assert_eq!(round_trip(&records), records);
        let order = vec![OrderEntry {
            topic: 1,
            partition: 2,
            key: b"agg".to_vec(),
            offset: 42,
            rank: 3,
            id: b"x".to_vec(),
        }];
        assert_eq!(round_trip(&order), order);
    }
}
