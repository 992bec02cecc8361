//! Test-only: one valid pgoutput message per message type (and per streamed
//! variant), written field by field from the PostgreSQL docs, with the value
//! each must decode to.

use bytes::Bytes;

use super::test_encoder::{stream_start, Buf};
use super::*;
use crate::Lsn;

pub(super) const XID: u32 = 742;
pub(super) const STREAM_XID: u32 = 9001;
pub(super) const REL: u32 = 16_385;
pub(super) const LSN1: Lsn = Lsn(0x16_B374_D848);
pub(super) const LSN2: Lsn = Lsn(0x16_B374_D8A0);
/// 2024-01-01T00:00:00Z in PostgreSQL microseconds.
pub(super) const TS1: i64 = 757_382_400_000_000;
pub(super) const TS2: i64 = TS1 + 1_500;

/// A valid message, the decoder state it needs, and what it decodes to.
pub(super) struct Fixture {
    pub(super) version: u32,
    pub(super) in_stream: bool,
    pub(super) bytes: Bytes,
    pub(super) expected: LogicalMessage,
}

fn fx(version: u32, in_stream: bool, buf: Buf, expected: LogicalMessage) -> Fixture {
    Fixture {
        version,
        in_stream,
        bytes: buf.bytes(),
        expected,
    }
}

pub(super) fn decoder(version: u32, in_stream: bool) -> Decoder {
    let mut d = Decoder::new(version);
    if in_stream {
        d.decode(stream_start(STREAM_XID)).expect("stream start");
    }
    d
}

pub(super) fn text(s: &'static str) -> TupleValue {
    TupleValue::Text(Bytes::from_static(s.as_bytes()))
}

fn row() -> TupleData {
    TupleData(vec![
        text("1"),
        TupleValue::Null,
        TupleValue::UnchangedToast,
        TupleValue::Binary(Bytes::from_static(&[0, 0, 0, 42])),
    ])
}

pub(super) fn row_bytes(b: Buf) -> Buf {
    b.i16(4)
        .u8(b't')
        .i32(1)
        .raw(b"1")
        .u8(b'n')
        .u8(b'u')
        .u8(b'b')
        .i32(4)
        .raw(&[0, 0, 0, 42])
}

fn key() -> TupleData {
    TupleData(vec![
        text("1"),
        TupleValue::Null,
        TupleValue::Null,
        TupleValue::Null,
    ])
}

fn key_bytes(b: Buf) -> Buf {
    b.i16(4)
        .u8(b't')
        .i32(1)
        .raw(b"1")
        .u8(b'n')
        .u8(b'n')
        .u8(b'n')
}

fn relation(xid: Option<u32>) -> Relation {
    Relation {
        xid,
        oid: REL,
        namespace: "public".into(),
        name: "outbox".into(),
        replica_identity: Relation::REPLICA_IDENTITY_DEFAULT,
        columns: vec![
            RelationColumn {
                flags: 1,
                name: "id".into(),
                type_oid: 20,
                type_modifier: -1,
            },
            RelationColumn {
                flags: 0,
                name: "payload".into(),
                type_oid: 3802,
                type_modifier: -1,
            },
        ],
    }
}

fn relation_bytes(b: Buf) -> Buf {
    b.u32(REL)
        .cstr("public")
        .cstr("outbox")
        .u8(b'd')
        .i16(2)
        .u8(1)
        .cstr("id")
        .u32(20)
        .i32(-1)
        .u8(0)
        .cstr("payload")
        .u32(3802)
        .i32(-1)
}

/// Changes that carry the in-stream xid, outside (`None`) or inside a stream.
fn change_fixtures(xid: Option<u32>) -> Vec<Fixture> {
    use LogicalMessage as L;
    let (version, in_stream) = if xid.is_some() { (2, true) } else { (1, false) };
    let head = |tag| Buf::new(tag).opt_u32(xid);
    let f = |buf, expected| fx(version, in_stream, buf, expected);
    vec![
        f(relation_bytes(head(b'R')), L::Relation(relation(xid))),
        f(
            head(b'Y').u32(16_400).cstr("public").cstr("mood"),
            L::Type(TypeMessage {
                xid,
                oid: 16_400,
                namespace: "public".into(),
                name: "mood".into(),
            }),
        ),
        f(
            row_bytes(head(b'I').u32(REL).u8(b'N')),
            L::Insert(Insert {
                xid,
                relation_oid: REL,
                new: row(),
            }),
        ),
        f(
            row_bytes(head(b'U').u32(REL).u8(b'N')),
            L::Update(Update {
                xid,
                relation_oid: REL,
                old: None,
                new: row(),
            }),
        ),
        f(
            row_bytes(key_bytes(head(b'U').u32(REL).u8(b'K')).u8(b'N')),
            L::Update(Update {
                xid,
                relation_oid: REL,
                old: Some(OldTuple::Key(key())),
                new: row(),
            }),
        ),
        f(
            row_bytes(row_bytes(head(b'U').u32(REL).u8(b'O')).u8(b'N')),
            L::Update(Update {
                xid,
                relation_oid: REL,
                old: Some(OldTuple::Full(row())),
                new: row(),
            }),
        ),
        f(
            key_bytes(head(b'D').u32(REL).u8(b'K')),
            L::Delete(Delete {
                xid,
                relation_oid: REL,
                old: OldTuple::Key(key()),
            }),
        ),
        f(
            row_bytes(head(b'D').u32(REL).u8(b'O')),
            L::Delete(Delete {
                xid,
                relation_oid: REL,
                old: OldTuple::Full(row()),
            }),
        ),
        f(
            head(b'T').i32(2).u8(3).u32(REL).u32(REL + 1),
            L::Truncate(Truncate {
                xid,
                options: Truncate::CASCADE | Truncate::RESTART_IDENTITY,
                relation_oids: vec![REL, REL + 1],
            }),
        ),
        f(
            head(b'M')
                .u8(1)
                .lsn(LSN1)
                .cstr("outbox")
                .i32(5)
                .raw(b"hello"),
            L::Message(Message {
                xid,
                transactional: true,
                lsn: LSN1,
                prefix: "outbox".into(),
                content: Bytes::from_static(b"hello"),
            }),
        ),
        f(
            head(b'M').u8(0).lsn(LSN1).cstr("").i32(0),
            L::Message(Message {
                xid,
                transactional: false,
                lsn: LSN1,
                prefix: String::new(),
                content: Bytes::new(),
            }),
        ),
    ]
}

pub(super) fn fixtures() -> Vec<Fixture> {
    use LogicalMessage as L;
    let mut all = change_fixtures(None);
    all.extend(change_fixtures(Some(STREAM_XID)));
    all.extend([
        fx(
            1,
            false,
            Buf::new(b'B').lsn(LSN1).i64(TS1).u32(XID),
            L::Begin(Begin {
                final_lsn: LSN1,
                commit_time: TS1,
                xid: XID,
            }),
        ),
        fx(
            1,
            false,
            Buf::new(b'C').u8(0).lsn(LSN1).lsn(LSN2).i64(TS1),
            L::Commit(Commit {
                flags: 0,
                commit_lsn: LSN1,
                end_lsn: LSN2,
                commit_time: TS1,
            }),
        ),
        fx(
            1,
            false,
            Buf::new(b'O').lsn(LSN1).cstr("pg_16389"),
            L::Origin(Origin {
                commit_lsn: LSN1,
                name: "pg_16389".into(),
            }),
        ),
        // Origin follows Stream Start inside the block.
        fx(
            2,
            true,
            Buf::new(b'O').lsn(LSN1).cstr("pg_16389"),
            L::Origin(Origin {
                commit_lsn: LSN1,
                name: "pg_16389".into(),
            }),
        ),
        fx(
            2,
            false,
            Buf::new(b'S').u32(STREAM_XID).u8(1),
            L::StreamStart(StreamStart {
                xid: STREAM_XID,
                first_segment: true,
            }),
        ),
        fx(
            2,
            false,
            Buf::new(b'S').u32(STREAM_XID).u8(0),
            L::StreamStart(StreamStart {
                xid: STREAM_XID,
                first_segment: false,
            }),
        ),
        fx(2, true, Buf::new(b'E'), L::StreamStop),
        fx(
            2,
            false,
            Buf::new(b'c')
                .u32(STREAM_XID)
                .u8(0)
                .lsn(LSN1)
                .lsn(LSN2)
                .i64(TS1),
            L::StreamCommit(StreamCommit {
                xid: STREAM_XID,
                flags: 0,
                commit_lsn: LSN1,
                end_lsn: LSN2,
                commit_time: TS1,
            }),
        ),
        fx(
            2,
            false,
            Buf::new(b'A').u32(STREAM_XID).u32(STREAM_XID + 1),
            L::StreamAbort(StreamAbort {
                xid: STREAM_XID,
                subxid: STREAM_XID + 1,
                abort_lsn: None,
                abort_time: None,
            }),
        ),
        fx(
            4,
            false,
            Buf::new(b'A')
                .u32(STREAM_XID)
                .u32(STREAM_XID)
                .lsn(LSN2)
                .i64(TS2),
            L::StreamAbort(StreamAbort {
                xid: STREAM_XID,
                subxid: STREAM_XID,
                abort_lsn: Some(LSN2),
                abort_time: Some(TS2),
            }),
        ),
        fx(
            3,
            false,
            Buf::new(b'b')
                .lsn(LSN1)
                .lsn(LSN2)
                .i64(TS1)
                .u32(XID)
                .cstr("gid-1"),
            L::BeginPrepare(BeginPrepare {
                prepare_lsn: LSN1,
                end_lsn: LSN2,
                prepare_time: TS1,
                xid: XID,
                gid: "gid-1".into(),
            }),
        ),
        fx(
            3,
            false,
            Buf::new(b'P')
                .u8(0)
                .lsn(LSN1)
                .lsn(LSN2)
                .i64(TS1)
                .u32(XID)
                .cstr("gid-1"),
            L::Prepare(Prepare {
                flags: 0,
                prepare_lsn: LSN1,
                end_lsn: LSN2,
                prepare_time: TS1,
                xid: XID,
                gid: "gid-1".into(),
            }),
        ),
        fx(
            3,
            false,
            Buf::new(b'K')
                .u8(0)
                .lsn(LSN1)
                .lsn(LSN2)
                .i64(TS2)
                .u32(XID)
                .cstr("gid-1"),
            L::CommitPrepared(CommitPrepared {
                flags: 0,
                commit_lsn: LSN1,
                end_lsn: LSN2,
                commit_time: TS2,
                xid: XID,
                gid: "gid-1".into(),
            }),
        ),
        fx(
            3,
            false,
            Buf::new(b'r')
                .u8(0)
                .lsn(LSN1)
                .lsn(LSN2)
                .i64(TS1)
                .i64(TS2)
                .u32(XID)
                .cstr("gid-1"),
            L::RollbackPrepared(RollbackPrepared {
                flags: 0,
                prepare_end_lsn: LSN1,
                rollback_end_lsn: LSN2,
                prepare_time: TS1,
                rollback_time: TS2,
                xid: XID,
                gid: "gid-1".into(),
            }),
        ),
        fx(
            3,
            false,
            Buf::new(b'p')
                .u8(0)
                .lsn(LSN1)
                .lsn(LSN2)
                .i64(TS1)
                .u32(STREAM_XID)
                .cstr("gid-2"),
            L::StreamPrepare(StreamPrepare {
                flags: 0,
                prepare_lsn: LSN1,
                end_lsn: LSN2,
                prepare_time: TS1,
                xid: STREAM_XID,
                gid: "gid-2".into(),
            }),
        ),
    ]);
    all
}

/// Stream Abort with protocol 4 is the one message whose shorter form is also
/// valid: without the parallel-apply fields (tag, xid, subxid = 9 bytes).
pub(super) fn is_valid_prefix(f: &Fixture, len: usize) -> bool {
    f.version >= 4 && f.bytes.first() == Some(&b'A') && len == 9
}
