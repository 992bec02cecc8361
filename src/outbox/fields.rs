//! Column values by slot, from a table row or a parsed logical decoding
//! message, so everything after that reads both the same way.
//!
//! In a message an absent optional field counts as NULL; in a row a
//! configured column that is missing is an error, since it means the table
//! and the config disagree.

use bytes::Bytes;

use crate::outbox::error::MappingError;
use crate::outbox::event::{ColumnValue, Row};

/// Column values by slot, from a row or a parsed message.
pub(super) struct Fields<'a> {
    /// Slot -> column name, for errors.
    columns: &'a [Box<str>],
    values: Values<'a>,
}

enum Values<'a> {
    Row {
        row: &'a Row,
        index: &'a [Option<usize>],
    },
    Message(&'a [Option<ColumnValue>]),
}

impl<'a> Fields<'a> {
    /// A row's values; `index` is slot -> position in the row.
    pub(super) fn row(columns: &'a [Box<str>], row: &'a Row, index: &'a [Option<usize>]) -> Self {
        Fields {
            columns,
            values: Values::Row { row, index },
        }
    }

    /// A message's values by slot, `None` where the field is absent.
    pub(super) fn message(columns: &'a [Box<str>], values: &'a [Option<ColumnValue>]) -> Self {
        Fields {
            columns,
            values: Values::Message(values),
        }
    }

    /// `None` when the column is not in the row / the field not in the message.
    pub(super) fn get(&self, slot: usize) -> Option<&'a ColumnValue> {
        match self.values {
            Values::Row { row, index } => index[slot].and_then(|i| row.values.get(i)),
            Values::Message(values) => values[slot].as_ref(),
        }
    }

    /// The name of the column in `slot`, for errors.
    pub(super) fn column(&self, slot: usize) -> &'a str {
        &self.columns[slot]
    }

    fn is_message(&self) -> bool {
        matches!(self.values, Values::Message(_))
    }

    /// A column's text: `None` for NULL (or, in a message, an absent
    /// optional field).
    pub(super) fn text(
        &self,
        slot: usize,
        setting: &str,
        optional: bool,
    ) -> Result<Option<&'a Bytes>, MappingError> {
        match self.get(slot) {
            Some(ColumnValue::Text(b)) => Ok(Some(b)),
            Some(ColumnValue::Null) => Ok(None),
            Some(ColumnValue::UnchangedToast) => Err(MappingError::UnavailableValue {
                column: self.column(slot).to_string(),
            }),
            None if optional && self.is_message() => Ok(None),
            None => Err(MappingError::MissingColumn {
                column: self.column(slot).to_string(),
                role: setting.to_owned(),
            }),
        }
    }
}
