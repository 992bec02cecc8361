//! Test-only: builds pgoutput bytes, field by field or from a message.
//!
//! The encoder mirrors PostgreSQL's `logicalrep_write_*` functions so that the
//! round-trip property checks the decoder against an independent writer; the
//! hand-written fixtures in `tests.rs` check both against the docs.

use bytes::Bytes;

use super::messages::*;
use crate::Lsn;

/// A byte builder whose methods name the wire types of the docs.
#[derive(Default)]
pub(super) struct Buf(pub(super) Vec<u8>);

impl Buf {
    pub(super) fn new(tag: u8) -> Self {
        Buf(vec![tag])
    }

    pub(super) fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }

    pub(super) fn i16(mut self, v: i16) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub(super) fn i32(mut self, v: i32) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub(super) fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub(super) fn i64(mut self, v: i64) -> Self {
        self.0.extend_from_slice(&v.to_be_bytes());
        self
    }

    pub(super) fn lsn(mut self, v: Lsn) -> Self {
        self.0.extend_from_slice(&v.0.to_be_bytes());
        self
    }

    pub(super) fn cstr(mut self, s: &str) -> Self {
        self.0.extend_from_slice(s.as_bytes());
        self.0.push(0);
        self
    }

    pub(super) fn raw(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(b);
        self
    }

    pub(super) fn opt_u32(self, v: Option<u32>) -> Self {
        match v {
            Some(v) => self.u32(v),
            None => self,
        }
    }

    /// An Int32 length followed by the bytes.
    pub(super) fn len_bytes(self, b: &[u8]) -> Self {
        self.i32(wire_len(b.len())).raw(b)
    }

    pub(super) fn tuple(self, t: &TupleData) -> Self {
        let mut out = self.i16(t.0.len().try_into().expect("column count"));
        for value in &t.0 {
            out = match value {
                TupleValue::Null => out.u8(b'n'),
                TupleValue::UnchangedToast => out.u8(b'u'),
                TupleValue::Text(b) => out.u8(b't').len_bytes(b),
                TupleValue::Binary(b) => out.u8(b'b').len_bytes(b),
            };
        }
        out
    }

    fn old_tuple(self, t: &OldTuple) -> Self {
        match t {
            OldTuple::Key(t) => self.u8(b'K').tuple(t),
            OldTuple::Full(t) => self.u8(b'O').tuple(t),
        }
    }

    pub(super) fn bytes(self) -> Bytes {
        Bytes::from(self.0)
    }
}

fn wire_len(n: usize) -> i32 {
    n.try_into().expect("length fits Int32")
}

/// Encodes `m` as PostgreSQL would; `xid: Some` fields are written as the
/// in-stream xid, so decode those with a decoder inside a stream block.
pub(super) fn encode(m: &LogicalMessage) -> Bytes {
    use LogicalMessage as L;
    let buf = match m {
        L::Begin(m) => Buf::new(b'B')
            .lsn(m.final_lsn)
            .i64(m.commit_time)
            .u32(m.xid),
        L::Commit(m) => Buf::new(b'C')
            .u8(m.flags)
            .lsn(m.commit_lsn)
            .lsn(m.end_lsn)
            .i64(m.commit_time),
        L::Origin(m) => Buf::new(b'O').lsn(m.commit_lsn).cstr(&m.name),
        L::Relation(m) => {
            let mut b = Buf::new(b'R')
                .opt_u32(m.xid)
                .u32(m.oid)
                .cstr(&m.namespace)
                .cstr(&m.name)
                .u8(m.replica_identity)
                .i16(m.columns.len().try_into().expect("column count"));
            for c in &m.columns {
                b = b
                    .u8(c.flags)
                    .cstr(&c.name)
                    .u32(c.type_oid)
                    .i32(c.type_modifier);
            }
            b
        }
        L::Type(m) => Buf::new(b'Y')
            .opt_u32(m.xid)
            .u32(m.oid)
            .cstr(&m.namespace)
            .cstr(&m.name),
        L::Insert(m) => Buf::new(b'I')
            .opt_u32(m.xid)
            .u32(m.relation_oid)
            .u8(b'N')
            .tuple(&m.new),
        L::Update(m) => {
            let b = Buf::new(b'U').opt_u32(m.xid).u32(m.relation_oid);
            let b = match &m.old {
                Some(old) => b.old_tuple(old),
                None => b,
            };
            b.u8(b'N').tuple(&m.new)
        }
        L::Delete(m) => Buf::new(b'D')
            .opt_u32(m.xid)
            .u32(m.relation_oid)
            .old_tuple(&m.old),
        L::Truncate(m) => {
            let mut b = Buf::new(b'T')
                .opt_u32(m.xid)
                .i32(wire_len(m.relation_oids.len()))
                .u8(m.options);
            for oid in &m.relation_oids {
                b = b.u32(*oid);
            }
            b
        }
        L::Message(m) => Buf::new(b'M')
            .opt_u32(m.xid)
            .u8(m.transactional.into())
            .lsn(m.lsn)
            .cstr(&m.prefix)
            .len_bytes(&m.content),
        L::StreamStart(m) => Buf::new(b'S').u32(m.xid).u8(m.first_segment.into()),
        L::StreamStop => Buf::new(b'E'),
        L::StreamCommit(m) => Buf::new(b'c')
            .u32(m.xid)
            .u8(m.flags)
            .lsn(m.commit_lsn)
            .lsn(m.end_lsn)
            .i64(m.commit_time),
        L::StreamAbort(m) => {
            let b = Buf::new(b'A').u32(m.xid).u32(m.subxid);
            match (m.abort_lsn, m.abort_time) {
                (Some(lsn), Some(time)) => b.lsn(lsn).i64(time),
                (None, None) => b,
                _ => panic!("abort_lsn and abort_time are sent together"),
            }
        }
        L::BeginPrepare(m) => Buf::new(b'b')
            .lsn(m.prepare_lsn)
            .lsn(m.end_lsn)
            .i64(m.prepare_time)
            .u32(m.xid)
            .cstr(&m.gid),
        L::Prepare(m) => Buf::new(b'P')
            .u8(m.flags)
            .lsn(m.prepare_lsn)
            .lsn(m.end_lsn)
            .i64(m.prepare_time)
            .u32(m.xid)
            .cstr(&m.gid),
        L::CommitPrepared(m) => Buf::new(b'K')
            .u8(m.flags)
            .lsn(m.commit_lsn)
            .lsn(m.end_lsn)
            .i64(m.commit_time)
            .u32(m.xid)
            .cstr(&m.gid),
        L::RollbackPrepared(m) => Buf::new(b'r')
            .u8(m.flags)
            .lsn(m.prepare_end_lsn)
            .lsn(m.rollback_end_lsn)
            .i64(m.prepare_time)
            .i64(m.rollback_time)
            .u32(m.xid)
            .cstr(&m.gid),
        L::StreamPrepare(m) => Buf::new(b'p')
            .u8(m.flags)
            .lsn(m.prepare_lsn)
            .lsn(m.end_lsn)
            .i64(m.prepare_time)
            .u32(m.xid)
            .cstr(&m.gid),
    };
    buf.bytes()
}

/// Whether `m` must be decoded inside a stream block: it carries the
/// in-stream xid, or it is Stream Stop.
pub(super) fn needs_stream(m: &LogicalMessage) -> bool {
    use LogicalMessage as L;
    match m {
        L::Relation(m) => m.xid.is_some(),
        L::Type(m) => m.xid.is_some(),
        L::Insert(m) => m.xid.is_some(),
        L::Update(m) => m.xid.is_some(),
        L::Delete(m) => m.xid.is_some(),
        L::Truncate(m) => m.xid.is_some(),
        L::Message(m) => m.xid.is_some(),
        L::StreamStop => true,
        _ => false,
    }
}

/// A Stream Start frame, to open a stream block on a decoder.
pub(super) fn stream_start(xid: u32) -> Bytes {
    Buf::new(b'S').u32(xid).u8(1).bytes()
}
