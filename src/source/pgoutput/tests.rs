//! Decoder tests over the hand-built messages of `fixtures.rs` and a few
//! malformed ones.

use bytes::Bytes;

use super::fixtures::*;
use super::test_encoder::{stream_start, Buf};
use super::*;

#[test]
fn every_fixture_decodes_as_expected() {
    let all = fixtures();
    let tags: std::collections::BTreeSet<u8> = all.iter().map(|f| f.bytes[0]).collect();
    assert_eq!(tags.len(), 19, "a fixture for every message type");
    for f in &all {
        // Every later version decodes the message the same way.
        for version in f.version..=4 {
            let got = decoder(version, f.in_stream).decode(f.bytes.clone());
            assert_eq!(got.as_ref(), Ok(&f.expected), "v{version} {:?}", f.bytes);
        }
    }
}

#[test]
fn raw_bytes_match_the_docs() {
    // Spelled out without the builder, to check the builder too.
    let begin =
        b"B\x00\x00\x00\x16\xB3\x74\xD8\x48\x00\x02\xB0\xD5\xD4\xE9\x40\x00\x00\x00\x02\xE6";
    assert_eq!(
        Decoder::new(1).decode(Bytes::from_static(begin)),
        Ok(LogicalMessage::Begin(Begin {
            final_lsn: LSN1,
            commit_time: TS1,
            xid: XID
        }))
    );
    let insert = b"I\x00\x00\x40\x01N\x00\x02t\x00\x00\x00\x0242n";
    assert_eq!(
        Decoder::new(1).decode(Bytes::from_static(insert)),
        Ok(LogicalMessage::Insert(Insert {
            xid: None,
            relation_oid: REL,
            new: TupleData(vec![text("42"), TupleValue::Null]),
        }))
    );
}

#[test]
fn every_proper_prefix_is_an_error() {
    for f in fixtures() {
        for len in 0..f.bytes.len() {
            let got = decoder(f.version, f.in_stream).decode(f.bytes.slice(..len));
            if is_valid_prefix(&f, len) {
                assert!(got.is_ok(), "{len}-byte prefix of {:?}", f.bytes);
            } else {
                assert!(got.is_err(), "{len}-byte prefix of {:?}", f.bytes);
            }
        }
    }
}

#[test]
fn trailing_bytes_are_an_error() {
    for f in fixtures() {
        let mut long = f.bytes.to_vec();
        long.push(0);
        let got = decoder(f.version, f.in_stream).decode(long.into());
        assert!(
            matches!(got, Err(DecodeError::TrailingBytes { remaining: 1, .. })),
            "{:?}: {got:?}",
            f.expected
        );
    }
}

/// Whether `inner` lies within `outer`'s memory.
fn points_into(inner: &Bytes, outer: &Bytes) -> bool {
    let range = outer.as_ptr_range();
    !inner.is_empty() && range.contains(&inner.as_ptr()) && inner.len() <= outer.len()
}

#[test]
fn values_are_zero_copy_slices_of_the_input() {
    let input = row_bytes(Buf::new(b'I').u32(REL).u8(b'N')).bytes();
    let Ok(LogicalMessage::Insert(insert)) = Decoder::new(1).decode(input.clone()) else {
        panic!("insert");
    };
    let mut values = 0;
    for value in &insert.new.0 {
        if let TupleValue::Text(b) | TupleValue::Binary(b) = value {
            assert!(points_into(b, &input), "{value:?} was copied");
            values += 1;
        }
    }
    assert_eq!(values, 2);

    let input = Buf::new(b'M')
        .u8(1)
        .lsn(LSN1)
        .cstr("p")
        .i32(3)
        .raw(b"abc")
        .bytes();
    let Ok(LogicalMessage::Message(m)) = Decoder::new(1).decode(input.clone()) else {
        panic!("message");
    };
    assert!(points_into(&m.content, &input));
}

#[test]
fn stream_state_follows_start_and_stop() {
    let insert_in_stream = Buf::new(b'I')
        .u32(STREAM_XID)
        .u32(REL)
        .u8(b'N')
        .i16(0)
        .bytes();
    let insert = Buf::new(b'I').u32(REL).u8(b'N').i16(0).bytes();
    let mut d = Decoder::new(2);
    assert!(!d.in_stream());
    d.decode(stream_start(STREAM_XID)).unwrap();
    assert!(d.in_stream());
    let Ok(LogicalMessage::Insert(i)) = d.decode(insert_in_stream.clone()) else {
        panic!("streamed insert");
    };
    assert_eq!((i.xid, i.relation_oid), (Some(STREAM_XID), REL));
    // Without the xid the same change is too short.
    assert!(d.decode(insert.clone()).is_err());
    assert_eq!(
        d.decode(Buf::new(b'E').bytes()),
        Ok(LogicalMessage::StreamStop)
    );
    assert!(!d.in_stream());
    let Ok(LogicalMessage::Insert(i)) = d.decode(insert) else {
        panic!("insert");
    };
    assert_eq!((i.xid, i.relation_oid), (None, REL));
    assert!(d.decode(insert_in_stream).is_err());
}

#[test]
fn stream_boundaries_in_the_wrong_place_are_errors() {
    let mut d = Decoder::new(4);
    assert_eq!(
        d.decode(Buf::new(b'E').bytes()),
        Err(DecodeError::StreamBoundary {
            tag: b'E',
            in_stream: false
        })
    );
    d.decode(stream_start(1)).unwrap();
    assert_eq!(
        d.decode(stream_start(2)),
        Err(DecodeError::StreamBoundary {
            tag: b'S',
            in_stream: true
        })
    );
    for f in fixtures() {
        let tag = f.bytes[0];
        if b"BCcAbPKrp".contains(&tag) {
            assert_eq!(
                d.decode(f.bytes.clone()),
                Err(DecodeError::StreamBoundary {
                    tag,
                    in_stream: true
                })
            );
        }
    }
    // Errors leave the state alone.
    assert!(d.in_stream());
}

#[test]
fn a_failed_stream_start_does_not_open_a_block() {
    let mut d = Decoder::new(2);
    assert!(d.decode(Buf::new(b'S').u32(1).bytes()).is_err());
    assert!(!d.in_stream());
}

#[test]
fn messages_newer_than_the_protocol_are_rejected() {
    for f in fixtures() {
        for version in 1..f.version {
            let tag = f.bytes[0];
            // In-stream changes exist in v1 in their plain form (see
            // `stream_state_follows_start_and_stop`); the v4 abort fields are
            // checked in `abort_fields_need_protocol_4`.
            if f.in_stream && tag != b'E' || tag == b'A' && f.version == 4 {
                continue;
            }
            let got = decoder(version, false).decode(f.bytes.clone());
            assert!(
                matches!(got, Err(DecodeError::NotInProtocol { required, version: v, .. })
                    if required == f.version && v == version),
                "{:?} in v{version}: {got:?}",
                f.expected
            );
        }
    }
}

#[test]
fn abort_fields_need_protocol_4() {
    let abort = Buf::new(b'A').u32(1).u32(2).lsn(LSN1).i64(TS1).bytes();
    assert!(matches!(
        Decoder::new(3).decode(abort.clone()),
        Err(DecodeError::TrailingBytes { remaining: 16, .. })
    ));
    let Ok(LogicalMessage::StreamAbort(a)) = Decoder::new(4).decode(abort) else {
        panic!("abort");
    };
    assert_eq!((a.abort_lsn, a.abort_time), (Some(LSN1), Some(TS1)));
}

#[test]
fn unsupported_protocol_versions_are_rejected() {
    for version in [0, 5, u32::MAX] {
        assert_eq!(
            Decoder::new(version).decode(Buf::new(b'B').lsn(LSN1).i64(TS1).u32(XID).bytes()),
            Err(DecodeError::UnsupportedProtocolVersion(version))
        );
    }
}

#[test]
fn empty_and_unknown_messages_are_rejected() {
    assert!(matches!(
        Decoder::new(1).decode(Bytes::new()),
        Err(DecodeError::Truncated { needed: 1, .. })
    ));
    for tag in [b'w', b'k', b'X', 0, 0xFF] {
        assert_eq!(
            Decoder::new(4).decode(Bytes::from(vec![tag, 0, 0])),
            Err(DecodeError::UnknownTag(tag))
        );
    }
}

#[test]
fn invalid_utf8_names_are_rejected() {
    let bad = b"\xC3\x28";
    let cases = [
        (Buf::new(b'O').lsn(LSN1).raw(bad).u8(0), 1, "origin name"),
        (
            Buf::new(b'R')
                .u32(REL)
                .cstr("public")
                .raw(bad)
                .u8(0)
                .u8(b'd')
                .i16(0),
            1,
            "relation name",
        ),
        (
            Buf::new(b'R')
                .u32(REL)
                .cstr("public")
                .cstr("t")
                .u8(b'd')
                .i16(1)
                .u8(0)
                .raw(bad)
                .u8(0)
                .u32(23)
                .i32(-1),
            1,
            "column name",
        ),
        (
            Buf::new(b'Y').u32(1).raw(bad).u8(0).cstr("t"),
            1,
            "type namespace",
        ),
        (
            Buf::new(b'M').u8(0).lsn(LSN1).raw(bad).u8(0).i32(0),
            1,
            "message prefix",
        ),
        (
            Buf::new(b'b')
                .lsn(LSN1)
                .lsn(LSN2)
                .i64(TS1)
                .u32(XID)
                .raw(bad)
                .u8(0),
            3,
            "gid",
        ),
    ];
    for (buf, version, field) in cases {
        assert_eq!(
            Decoder::new(version).decode(buf.bytes()),
            Err(DecodeError::InvalidUtf8 { field })
        );
    }
}

#[test]
fn names_need_their_nul() {
    assert_eq!(
        Decoder::new(1).decode(Buf::new(b'O').lsn(LSN1).raw(b"pg_1").bytes()),
        Err(DecodeError::MissingNul {
            field: "origin name"
        })
    );
}

#[test]
fn tuple_markers_are_checked() {
    let insert_with_key = Buf::new(b'I').u32(REL).u8(b'K').i16(0).bytes();
    assert_eq!(
        Decoder::new(1).decode(insert_with_key),
        Err(DecodeError::UnexpectedTupleMarker(b'K'))
    );
    let update_bad = Buf::new(b'U').u32(REL).u8(b'X').i16(0).bytes();
    assert_eq!(
        Decoder::new(1).decode(update_bad),
        Err(DecodeError::UnexpectedTupleMarker(b'X'))
    );
    // Old image followed by another old image instead of 'N'.
    let update_twice = Buf::new(b'U')
        .u32(REL)
        .u8(b'K')
        .i16(0)
        .u8(b'O')
        .i16(0)
        .bytes();
    assert_eq!(
        Decoder::new(1).decode(update_twice),
        Err(DecodeError::UnexpectedTupleMarker(b'O'))
    );
    let delete_new = Buf::new(b'D').u32(REL).u8(b'N').i16(0).bytes();
    assert_eq!(
        Decoder::new(1).decode(delete_new),
        Err(DecodeError::UnexpectedTupleMarker(b'N'))
    );
    let bad_kind = Buf::new(b'I').u32(REL).u8(b'N').i16(1).u8(b'z').bytes();
    assert_eq!(
        Decoder::new(1).decode(bad_kind),
        Err(DecodeError::UnknownTupleKind(b'z'))
    );
}

#[test]
fn forged_counts_and_lengths_fail_cleanly() {
    let cases = [
        Buf::new(b'T').i32(i32::MAX).u8(0).u32(1),
        Buf::new(b'T').i32(-1).u8(0),
        Buf::new(b'R')
            .u32(REL)
            .cstr("s")
            .cstr("t")
            .u8(b'd')
            .i16(i16::MAX),
        Buf::new(b'R').u32(REL).cstr("s").cstr("t").u8(b'd').i16(-1),
        Buf::new(b'M')
            .u8(0)
            .lsn(LSN1)
            .cstr("p")
            .i32(i32::MAX)
            .raw(b"abc"),
        Buf::new(b'M').u8(0).lsn(LSN1).cstr("p").i32(-5),
        Buf::new(b'I').u32(REL).u8(b'N').i16(i16::MAX),
        Buf::new(b'I')
            .u32(REL)
            .u8(b'N')
            .i16(1)
            .u8(b't')
            .i32(i32::MIN),
    ];
    for buf in cases {
        let got = Decoder::new(1).decode(buf.bytes());
        assert!(
            matches!(
                got,
                Err(DecodeError::Truncated { .. } | DecodeError::NegativeLength { .. })
            ),
            "{got:?}"
        );
    }
}

#[test]
fn errors_read_well() {
    assert_eq!(
        DecodeError::UnknownTag(b'x').to_string(),
        "unknown pgoutput message tag 'x'"
    );
    assert_eq!(
        DecodeError::UnknownTag(0).to_string(),
        "unknown pgoutput message tag '\\x00'"
    );
    assert_eq!(
        DecodeError::StreamBoundary {
            tag: b'E',
            in_stream: false
        }
        .to_string(),
        "message 'E' is not valid outside a stream block"
    );
    assert_eq!(
        DecodeError::Truncated {
            message: "Begin",
            needed: 8,
            remaining: 3
        }
        .to_string(),
        "Begin message truncated: needed 8 more bytes, 3 left"
    );
}
