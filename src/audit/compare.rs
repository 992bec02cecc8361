//! The comparison itself, pure apart from the spill files: rows and records
//! both sorted by id are merged like a join, which yields what is missing,
//! doubled or misplaced; the first copy of each delivered event then goes
//! through a second sort by (topic, partition, key, offset), where each
//! key's records must come in the rows' order.

use std::io;

use serde::{Deserialize, Serialize};

use super::entries::{OrderEntry, RecordEntry, RowEntry, UNMAPPABLE};
use super::listing::Listing;
use super::spill::Sorter;

/// A record on another topic or with another key than the mapping gives
/// its row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Misplaced {
    pub id: String,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Option<String>,
    pub expected_topic: String,
    pub expected_key: Option<String>,
}

/// A record of a key read after a record of the same key whose row comes
/// later in commit order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct OutOfOrder {
    pub id: String,
    /// The event it came after although it was committed before it.
    pub after: String,
    pub key: String,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
}

/// What the comparison of one table found.
pub(crate) struct Findings {
    /// Rows in the range.
    pub rows: u64,
    /// Rows with a copy on their topic under their key.
    pub delivered: u64,
    pub missing: Listing<String>,
    /// Events the relay sent more than once (copies without the backfill
    /// header beyond the first).
    pub duplicates: Listing<String>,
    pub duplicate_copies: u64,
    /// Events with backfill copies besides their first copy.
    pub backfilled_again: Listing<String>,
    pub backfill_copies: u64,
    pub out_of_order: Listing<OutOfOrder>,
    pub misplaced: Listing<Misplaced>,
    /// Rows the mapper refuses (relay.on_error decides where they went).
    pub unmappable: Listing<String>,
    /// Rows whose id another row of the range has too: not compared.
    pub repeated_ids: u64,
    /// Records whose id is no row of the range.
    pub records_without_row: u64,
    /// Of those, records stamped inside the range: rows gone from the table.
    pub in_range_without_row: u64,
}

impl Findings {
    pub(crate) fn new(keep_all: bool) -> Findings {
        Findings {
            rows: 0,
            delivered: 0,
            missing: Listing::new(keep_all),
            duplicates: Listing::new(keep_all),
            duplicate_copies: 0,
            backfilled_again: Listing::new(keep_all),
            backfill_copies: 0,
            out_of_order: Listing::new(keep_all),
            misplaced: Listing::new(keep_all),
            unmappable: Listing::new(keep_all),
            repeated_ids: 0,
            records_without_row: 0,
            in_range_without_row: 0,
        }
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Merges rows and records (each sorted by id) into `f`, and hands the first
/// copy of every delivered event to `order`.
pub(crate) fn join(
    rows: impl Iterator<Item = io::Result<RowEntry>>,
    records: impl Iterator<Item = io::Result<RecordEntry>>,
    topics: &[String],
    f: &mut Findings,
    order: &mut Sorter<OrderEntry>,
) -> io::Result<()> {
    let mut records = records.peekable();
    let mut copies: Vec<RecordEntry> = Vec::new();
    let mut last_id: Option<Vec<u8>> = None;
    let topic_name = |i: u32| topics.get(i as usize).cloned().unwrap_or_default();
    for row in rows {
        let row = row?;
        f.rows += 1;
        if last_id.as_deref() == Some(&row.id[..]) {
            f.repeated_ids += 1;
            continue;
        }
        // Records of ids before this row's: no row in the range.
        copies.clear();
        loop {
            let next = match records.peek() {
                None => break,
                Some(Err(_)) => return Err(records.next().expect("peeked").unwrap_err()),
                Some(Ok(next)) => next,
            };
            if next.id < row.id {
                f.records_without_row += 1;
                f.in_range_without_row += u64::from(next.in_range);
                records.next();
            } else if next.id == row.id {
                copies.push(records.next().expect("peeked")?);
            } else {
                break;
            }
        }
        let id = text(&row.id);
        if row.topic == UNMAPPABLE {
            f.unmappable.push(id.clone())?;
            last_id = Some(row.id);
            continue;
        }
        // Copies consumers of the row's topic and key see, and the others.
        let mut good: Vec<&RecordEntry> = Vec::new();
        for c in &copies {
            if c.topic == row.topic && c.key == row.key {
                good.push(c);
            } else {
                f.misplaced.push(Misplaced {
                    id: id.clone(),
                    topic: topic_name(c.topic),
                    partition: c.partition,
                    offset: c.offset,
                    key: c.key.as_deref().map(text),
                    expected_topic: topic_name(row.topic),
                    expected_key: row.key.as_deref().map(text),
                })?;
            }
        }
        let Some(first) = good.iter().min_by_key(|c| (c.partition, c.offset)) else {
            f.missing.push(id)?;
            last_id = Some(row.id);
            continue;
        };
        f.delivered += 1;
        let relayed = good.iter().filter(|c| !c.backfill).count() as u64;
        let backfilled = good.len() as u64 - relayed;
        if relayed > 1 {
            f.duplicate_copies += relayed - 1;
            f.duplicates.push(id.clone())?;
        }
        // Backfill copies beyond the first copy of the event.
        let extra = if relayed > 0 {
            backfilled
        } else {
            backfilled - 1
        };
        if extra > 0 {
            f.backfill_copies += extra;
            f.backfilled_again.push(id.clone())?;
        }
        order.push(OrderEntry {
            topic: first.topic,
            partition: first.partition,
            key: row.key.clone().unwrap_or_default(),
            offset: first.offset,
            rank: row.rank,
            id: row.id.clone(),
        })?;
        last_id = Some(row.id);
    }
    for r in records {
        let r = r?;
        f.records_without_row += 1;
        f.in_range_without_row += u64::from(r.in_range);
    }
    Ok(())
}

/// Reads the first copies sorted by (topic, partition, key, offset): within
/// each key, a rank below the highest one seen before is a record read
/// after one committed later.
pub(crate) fn check_order(
    entries: impl Iterator<Item = io::Result<OrderEntry>>,
    topics: &[String],
    f: &mut Findings,
) -> io::Result<()> {
    // (topic, partition, key) of the group, its highest rank and that id.
    let mut group: Option<(u32, i32, Vec<u8>)> = None;
    let mut highest: (u64, Vec<u8>) = (0, Vec::new());
    for e in entries {
        let e = e?;
        let same = group
            .as_ref()
            .is_some_and(|(t, p, k)| *t == e.topic && *p == e.partition && *k == e.key);
        if !same {
            group = Some((e.topic, e.partition, e.key.clone()));
            highest = (e.rank, e.id);
            continue;
        }
        if e.rank < highest.0 {
            f.out_of_order.push(OutOfOrder {
                id: text(&e.id),
                after: text(&highest.1),
                key: text(&e.key),
                topic: topics.get(e.topic as usize).cloned().unwrap_or_default(),
                partition: e.partition,
                offset: e.offset,
            })?;
        } else {
            highest = (e.rank, e.id);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, rank: u64, topic: u32, key: &str) -> RowEntry {
        RowEntry {
            id: id.into(),
            rank,
            topic,
            key: Some(key.into()),
        }
    }

    fn rec(id: &str, topic: u32, offset: i64, key: &str, backfill: bool) -> RecordEntry {
        RecordEntry {
            id: id.into(),
            topic,
            partition: 0,
            offset,
            key: Some(key.into()),
            backfill,
            in_range: true,
        }
    }

    /// Runs both passes as the audit does, sorting in memory.
    fn audit(mut rows: Vec<RowEntry>, mut records: Vec<RecordEntry>) -> Findings {
        rows.sort();
        records.sort();
        let topics = vec!["t.order".to_owned(), "t.payment".to_owned()];
        let mut f = Findings::new(true);
        let mut order = Sorter::new(usize::MAX);
        join(
            rows.into_iter().map(Ok),
            records.into_iter().map(Ok),
            &topics,
            &mut f,
            &mut order,
        )
        .unwrap();
        check_order(order.finish().unwrap(), &topics, &mut f).unwrap();
        f
    }

    fn ids(l: &Listing<String>) -> Vec<&str> {
        l.first().iter().map(String::as_str).collect()
    }

    #[test]
    fn a_complete_range_finds_nothing() {
        let rows = vec![
            row("a", 0, 0, "k1"),
            row("b", 1, 0, "k1"),
            row("c", 2, 1, "k2"),
        ];
        let records = vec![
            rec("a", 0, 0, "k1", false),
            rec("b", 0, 1, "k1", false),
            rec("c", 1, 0, "k2", false),
            rec("z", 0, 2, "k9", false),
        ];
        let f = audit(rows, records);
        assert_eq!((f.rows, f.delivered), (3, 3));
        assert!(f.missing.is_empty() && f.duplicates.is_empty() && f.out_of_order.is_empty());
        assert!(f.misplaced.is_empty() && f.backfilled_again.is_empty());
        assert_eq!(f.records_without_row, 1);
    }

    #[test]
    fn missing_duplicated_and_backfilled_events_are_told_apart() {
        let rows = vec![
            row("a", 0, 0, "k"),
            row("b", 1, 0, "k"),
            row("c", 2, 0, "k"),
            row("d", 3, 0, "k"),
            row("e", 4, 0, "k"),
        ];
        let records = vec![
            rec("a", 0, 0, "k", false),
            rec("a", 0, 1, "k", false),
            rec("a", 0, 9, "k", false),
            // b: never delivered; c: only by backfill, twice; d: relayed
            // and backfilled; e: relayed.
            rec("c", 0, 2, "k", true),
            rec("c", 0, 3, "k", true),
            rec("d", 0, 4, "k", false),
            rec("d", 0, 6, "k", true),
            rec("e", 0, 5, "k", false),
        ];
        let f = audit(rows, records);
        assert_eq!(f.delivered, 4);
        assert_eq!(ids(&f.missing), ["b"]);
        assert_eq!(ids(&f.duplicates), ["a"]);
        assert_eq!(f.duplicate_copies, 2);
        assert_eq!(ids(&f.backfilled_again), ["c", "d"]);
        assert_eq!(f.backfill_copies, 2);
        // First copies: a@0, c@2, d@4, e@5: in rank order.
        assert!(f.out_of_order.is_empty(), "{:?}", f.out_of_order.first());
    }

    #[test]
    fn swapped_records_of_a_key_name_the_late_one() {
        let rows = vec![
            row("a", 0, 0, "k"),
            row("b", 1, 0, "k"),
            row("c", 2, 0, "k"),
            row("x", 3, 0, "other"),
        ];
        let records = vec![
            rec("a", 0, 0, "k", false),
            rec("c", 0, 1, "k", false),
            rec("b", 0, 2, "k", false),
            // Another key in between, in its own order: no violation.
            rec("x", 0, 3, "other", false),
        ];
        let f = audit(rows, records);
        assert_eq!(f.out_of_order.count(), 1);
        let v = &f.out_of_order.first()[0];
        assert_eq!((v.id.as_str(), v.after.as_str(), v.offset), ("b", "c", 2));
        assert!(f.missing.is_empty());
    }

    #[test]
    fn wrong_topic_or_key_is_misplaced_and_missing_without_a_good_copy() {
        let rows = vec![
            row("a", 0, 0, "k"),
            row("b", 1, 0, "k"),
            row("u", 2, UNMAPPABLE, "k"),
        ];
        let records = vec![
            rec("a", 1, 0, "k", false),
            rec("b", 0, 0, "k", false),
            rec("b", 0, 1, "wrong", false),
        ];
        let f = audit(rows, records);
        assert_eq!(ids(&f.missing), ["a"]);
        assert_eq!(f.delivered, 1);
        assert_eq!(f.misplaced.count(), 2);
        let m = &f.misplaced.first()[0];
        assert_eq!(
            (m.topic.as_str(), m.expected_topic.as_str()),
            ("t.payment", "t.order")
        );
        assert_eq!(f.misplaced.first()[1].key.as_deref(), Some("wrong"));
        assert_eq!(ids(&f.unmappable), ["u"]);
    }
}
