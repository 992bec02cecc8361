//! The ledger's records: which relay an entry belongs to, the entry itself,
//! and its JSON form.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::Lsn;

/// The only format version this build writes and reads.
pub const LEDGER_VERSION: u32 = 1;

/// Which relay an entry belongs to: the PostgreSQL cluster (its system
/// identifier from IDENTIFY_SYSTEM), the database and the slot.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LedgerIdentity {
    /// Decimal, as IDENTIFY_SYSTEM returns it (a u64 that JSON numbers
    /// cannot carry exactly in every reader, so it stays text).
    pub system_identifier: String,
    pub database: String,
    pub slot: String,
}

impl LedgerIdentity {
    /// The record key: `<system_identifier>/<database>/<slot>`.
    pub fn key(&self) -> String {
        format!("{}/{}/{}", self.system_identifier, self.database, self.slot)
    }

    /// The identity a key names, or `None` when it is not one of ours.
    pub(crate) fn from_key(key: &str) -> Option<LedgerIdentity> {
        let (system_identifier, rest) = key.split_once('/')?;
        let (database, slot) = rest.rsplit_once('/')?;
        let digits =
            !system_identifier.is_empty() && system_identifier.bytes().all(|b| b.is_ascii_digit());
        let slot_ok = !slot.is_empty()
            && slot
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        (digits && slot_ok && !database.is_empty()).then(|| LedgerIdentity {
            system_identifier: system_identifier.to_owned(),
            database: database.to_owned(),
            slot: slot.to_owned(),
        })
    }
}

impl fmt::Display for LedgerIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "slot {:?} of database {:?} on system {}",
            self.slot, self.database, self.system_identifier
        )
    }
}

/// A range of WAL the operator accepted as not relayed
/// (`outboxd run --accept-gap`), kept so the ledger tells the whole story.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcceptedGap {
    /// The ledger's position when the gap was found: relayed up to here.
    #[serde(with = "lsn_text")]
    pub from_lsn: Lsn,
    /// Where relaying resumed (the new slot's or server's position).
    #[serde(with = "lsn_text")]
    pub to_lsn: Lsn,
    /// Commit time at `from_lsn`, when known.
    pub from_time_us: Option<i64>,
    pub accepted_at_us: i64,
}

/// One ledger record's value, version 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerEntry {
    pub version: u32,
    pub system_identifier: String,
    pub database: String,
    pub slot: String,
    pub timeline: u32,
    /// The commit **end** LSN (or idle keepalive position) up to which every
    /// event is acknowledged by Kafka: what the slot may be confirmed to.
    #[serde(with = "lsn_text")]
    pub confirmed_lsn: Lsn,
    /// Commit time of the last transaction at or below `confirmed_lsn`;
    /// `None` until the relay has seen one.
    pub commit_time_us: Option<i64>,
    /// The outboxd that wrote the entry (`CARGO_PKG_VERSION`).
    pub outboxd_version: String,
    /// Wall time of the writing.
    pub written_at_us: i64,
    #[serde(default)]
    pub accepted_gaps: Vec<AcceptedGap>,
    /// Exactly-once only: a database transaction larger than a Kafka
    /// transaction is split, and this says how far into it the entry's
    /// Kafka transaction reached, past `confirmed_lsn`. Left out otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inside: Option<InsideTransaction>,
    /// Exactly-once: written in the Kafka transaction that holds the events
    /// it vouches for. Such a relay never confirms the slot past its last
    /// committed entry, so a slot found past it means events are missing
    /// from Kafka, not that the ledger lags (`GapReason::SlotPastLedger`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub transactional: bool,
}

/// How far into a database transaction the relay got (exactly-once): its
/// first `events` outbox events, in WAL order, are in Kafka.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct InsideTransaction {
    /// The transaction's commit LSN (pgoutput's Begin `final_lsn`).
    #[serde(with = "lsn_text")]
    pub commit_lsn: Lsn,
    pub events: u32,
}

impl LedgerEntry {
    pub fn identity(&self) -> LedgerIdentity {
        LedgerIdentity {
            system_identifier: self.system_identifier.clone(),
            database: self.database.clone(),
            slot: self.slot.clone(),
        }
    }

    /// The record value.
    pub fn to_json(&self) -> Vec<u8> {
        // A struct of strings and numbers always serializes.
        serde_json::to_vec(self).expect("ledger entry serializes")
    }

    /// Parses a record value, refusing a version this build does not know.
    pub fn from_json(value: &[u8]) -> Result<LedgerEntry, LedgerFormatError> {
        #[derive(Deserialize)]
        struct Versioned {
            version: u32,
        }
        let Versioned { version } =
            serde_json::from_slice(value).map_err(|e| LedgerFormatError::Invalid(e.to_string()))?;
        if version != LEDGER_VERSION {
            return Err(LedgerFormatError::UnsupportedVersion {
                found: version,
                supported: LEDGER_VERSION,
            });
        }
        serde_json::from_slice(value).map_err(|e| LedgerFormatError::Invalid(e.to_string()))
    }
}

/// A ledger record this build cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerFormatError {
    #[error(
        "ledger entry has format version {found}, this outboxd reads only version {supported}: \
         it was written by a newer outboxd; upgrade this one (or point kafka.ledger_topic at \
         another topic)"
    )]
    UnsupportedVersion { found: u32, supported: u32 },
    #[error("ledger entry is not valid JSON of version 1: {0}")]
    Invalid(String),
}

/// Microseconds since the Unix epoch as ISO 8601 UTC with milliseconds, for
/// messages.
pub fn format_time_us(us: i64) -> String {
    let mut buf = Vec::new();
    crate::outbox::record::write_iso8601_ms(&mut buf, us.div_euclid(1000));
    String::from_utf8(buf).unwrap_or_default()
}

/// LSNs as PostgreSQL's `X/Y` text in JSON.
mod lsn_text {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(lsn: &Lsn, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(lsn)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Lsn, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn entry(lsn: u64) -> LedgerEntry {
        LedgerEntry {
            version: LEDGER_VERSION,
            system_identifier: "7443001228541284437".into(),
            database: "app".into(),
            slot: "outboxd".into(),
            timeline: 1,
            confirmed_lsn: Lsn(lsn),
            commit_time_us: Some(1_764_569_428_123_456),
            outboxd_version: "0.1.0".into(),
            written_at_us: 1_764_569_429_000_000,
            accepted_gaps: vec![AcceptedGap {
                from_lsn: Lsn(0x100),
                to_lsn: Lsn(0x2_0000_0000),
                from_time_us: None,
                accepted_at_us: 5,
            }],
            inside: None,
            transactional: false,
        }
    }

    #[test]
    fn key_round_trips_also_with_a_slash_in_the_database_name() {
        for database in ["app", "a/b", "/x/"] {
            let id = LedgerIdentity {
                system_identifier: "7443001228541284437".into(),
                database: database.into(),
                slot: "outboxd_1".into(),
            };
            assert_eq!(LedgerIdentity::from_key(&id.key()), Some(id.clone()));
        }
        for foreign in ["", "x/app/s", "1/app/S", "1//s", "1/app/", "12/app"] {
            assert_eq!(LedgerIdentity::from_key(foreign), None, "{foreign}");
        }
    }

    #[test]
    fn entry_round_trips_as_documented_json() {
        let e = entry(0x1_01A2_B3C8);
        let json: serde_json::Value = serde_json::from_slice(&e.to_json()).unwrap();
        assert_eq!(json["version"], 1);
        assert_eq!(json["confirmed_lsn"], "1/1A2B3C8");
        assert_eq!(json["system_identifier"], "7443001228541284437");
        assert_eq!(json["accepted_gaps"][0]["to_lsn"], "2/0");
        assert_eq!(LedgerEntry::from_json(&e.to_json()).unwrap(), e);
        assert!(json.get("inside").is_none(), "left out when none");
        let split = LedgerEntry {
            inside: Some(InsideTransaction {
                commit_lsn: Lsn(0x1_0200_0000),
                events: 10_000,
            }),
            transactional: true,
            ..e
        };
        assert!(json.get("transactional").is_none(), "left out when false");
        let json: serde_json::Value = serde_json::from_slice(&split.to_json()).unwrap();
        assert_eq!(json["inside"]["commit_lsn"], "1/2000000");
        assert_eq!(json["inside"]["events"], 10_000);
        assert_eq!(json["transactional"], true);
        assert_eq!(LedgerEntry::from_json(&split.to_json()).unwrap(), split);
    }

    #[test]
    fn unknown_fields_are_ignored_and_gaps_default_to_none() {
        let mut json: serde_json::Value = serde_json::from_slice(&entry(1).to_json()).unwrap();
        json["added_later"] = "x".into();
        json.as_object_mut().unwrap().remove("accepted_gaps");
        let parsed = LedgerEntry::from_json(json.to_string().as_bytes()).unwrap();
        assert!(parsed.accepted_gaps.is_empty());
        assert_eq!(parsed.confirmed_lsn, Lsn(1));
    }

    #[test]
    fn a_future_version_is_refused_with_the_fix() {
        let mut json: serde_json::Value = serde_json::from_slice(&entry(1).to_json()).unwrap();
        json["version"] = 2.into();
        json["confirmed_lsn"] = serde_json::json!({"new": "shape"});
        let err = LedgerEntry::from_json(json.to_string().as_bytes()).unwrap_err();
        assert_eq!(
            err,
            LedgerFormatError::UnsupportedVersion {
                found: 2,
                supported: 1
            }
        );
        assert!(err.to_string().contains("upgrade"), "{err}");
    }

    #[test]
    fn garbage_is_invalid() {
        for bad in [&b"not json"[..], br#"{"version":1}"#, br#"{"version":"1"}"#] {
            assert!(matches!(
                LedgerEntry::from_json(bad),
                Err(LedgerFormatError::Invalid(_))
            ));
        }
        let mut json: serde_json::Value = serde_json::from_slice(&entry(1).to_json()).unwrap();
        json["confirmed_lsn"] = "nope".into();
        assert!(LedgerEntry::from_json(json.to_string().as_bytes()).is_err());
    }

    #[test]
    fn times_format_for_messages() {
        assert_eq!(
            format_time_us(1_764_569_428_123_456),
            "2025-12-01T06:10:28.123Z"
        );
    }
}
