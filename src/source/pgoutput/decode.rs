//! Per-message parsers: one function per pgoutput message, each a straight
//! transcription of the field list in the PostgreSQL docs.
//!
//! Before a body is parsed, [`decode`] checks that the message may appear at
//! all: that the negotiated protocol version has it, and that it is on the
//! right side of a Stream Start/Stop boundary. Both matter because the layout
//! of later messages (the xid after the tag) depends on that state.

use bytes::Bytes;

use super::error::DecodeError;
use super::messages::*;
use super::reader::Reader;
use super::tuple::{read_new_tuple, read_old_tuple, read_tuple, KEY, NEW, OLD};

/// What decoding depends on besides the bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Context {
    pub(crate) protocol_version: u32,
    /// Between Stream Start and Stream Stop.
    pub(crate) in_stream: bool,
}

/// Where a message may appear relative to a stream block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placement {
    Anywhere,
    /// Transaction boundaries: never inside a stream block.
    OutsideStream,
    /// Only Stream Stop.
    InsideStream,
}

struct Spec {
    name: &'static str,
    /// First protocol version that has the message.
    since: u32,
    placement: Placement,
}

const fn spec(name: &'static str, since: u32, placement: Placement) -> Spec {
    Spec {
        name,
        since,
        placement,
    }
}

fn spec_of(tag: u8) -> Option<Spec> {
    use Placement::*;
    Some(match tag {
        b'B' => spec("Begin", 1, OutsideStream),
        b'C' => spec("Commit", 1, OutsideStream),
        // Stream Start is followed by the origin of the streamed transaction.
        b'O' => spec("Origin", 1, Anywhere),
        b'R' => spec("Relation", 1, Anywhere),
        b'Y' => spec("Type", 1, Anywhere),
        b'I' => spec("Insert", 1, Anywhere),
        b'U' => spec("Update", 1, Anywhere),
        b'D' => spec("Delete", 1, Anywhere),
        b'T' => spec("Truncate", 1, Anywhere),
        b'M' => spec("Message", 1, Anywhere),
        b'S' => spec("Stream Start", 2, OutsideStream),
        b'E' => spec("Stream Stop", 2, InsideStream),
        b'c' => spec("Stream Commit", 2, OutsideStream),
        b'A' => spec("Stream Abort", 2, OutsideStream),
        b'b' => spec("Begin Prepare", 3, OutsideStream),
        b'P' => spec("Prepare", 3, OutsideStream),
        b'K' => spec("Commit Prepared", 3, OutsideStream),
        b'r' => spec("Rollback Prepared", 3, OutsideStream),
        b'p' => spec("Stream Prepare", 3, OutsideStream),
        _ => return None,
    })
}

/// Decodes one complete message; `data` starts with the tag byte.
pub(crate) fn decode(data: Bytes, ctx: Context) -> Result<LogicalMessage, DecodeError> {
    let tag = *data.first().ok_or(DecodeError::Truncated {
        message: "pgoutput",
        needed: 1,
        remaining: 0,
    })?;
    let spec = spec_of(tag).ok_or(DecodeError::UnknownTag(tag))?;
    if ctx.protocol_version < spec.since {
        return Err(DecodeError::NotInProtocol {
            tag,
            required: spec.since,
            version: ctx.protocol_version,
        });
    }
    let misplaced = match spec.placement {
        Placement::Anywhere => false,
        Placement::OutsideStream => ctx.in_stream,
        Placement::InsideStream => !ctx.in_stream,
    };
    if misplaced {
        return Err(DecodeError::StreamBoundary {
            tag,
            in_stream: ctx.in_stream,
        });
    }

    let mut reader = Reader::new(data.slice(1..), spec.name);
    let message = body(tag, &mut reader, ctx)?;
    reader.finish()?;
    Ok(message)
}

/// Parses the fields after the tag of a message `spec_of` knows.
fn body(tag: u8, r: &mut Reader, ctx: Context) -> Result<LogicalMessage, DecodeError> {
    Ok(match tag {
        b'B' => LogicalMessage::Begin(begin(r)?),
        b'C' => LogicalMessage::Commit(commit(r)?),
        b'O' => LogicalMessage::Origin(origin(r)?),
        b'R' => LogicalMessage::Relation(relation(r, ctx)?),
        b'Y' => LogicalMessage::Type(type_message(r, ctx)?),
        b'I' => LogicalMessage::Insert(insert(r, ctx)?),
        b'U' => LogicalMessage::Update(update(r, ctx)?),
        b'D' => LogicalMessage::Delete(delete(r, ctx)?),
        b'T' => LogicalMessage::Truncate(truncate(r, ctx)?),
        b'M' => LogicalMessage::Message(message(r, ctx)?),
        b'S' => LogicalMessage::StreamStart(stream_start(r)?),
        b'E' => LogicalMessage::StreamStop,
        b'c' => LogicalMessage::StreamCommit(stream_commit(r)?),
        b'A' => LogicalMessage::StreamAbort(stream_abort(r, ctx)?),
        b'b' => LogicalMessage::BeginPrepare(begin_prepare(r)?),
        b'P' => LogicalMessage::Prepare(prepare(r)?),
        b'K' => LogicalMessage::CommitPrepared(commit_prepared(r)?),
        b'r' => LogicalMessage::RollbackPrepared(rollback_prepared(r)?),
        b'p' => LogicalMessage::StreamPrepare(stream_prepare(r)?),
        _ => return Err(DecodeError::UnknownTag(tag)),
    })
}

/// The xid that changes carry inside a stream block (protocol >= 2).
fn stream_xid(r: &mut Reader, ctx: Context) -> Result<Option<u32>, DecodeError> {
    if ctx.in_stream && ctx.protocol_version >= 2 {
        r.u32().map(Some)
    } else {
        Ok(None)
    }
}

fn begin(r: &mut Reader) -> Result<Begin, DecodeError> {
    Ok(Begin {
        final_lsn: r.lsn()?,
        commit_time: r.i64()?,
        xid: r.u32()?,
    })
}

fn commit(r: &mut Reader) -> Result<Commit, DecodeError> {
    Ok(Commit {
        flags: r.u8()?,
        commit_lsn: r.lsn()?,
        end_lsn: r.lsn()?,
        commit_time: r.i64()?,
    })
}

fn origin(r: &mut Reader) -> Result<Origin, DecodeError> {
    Ok(Origin {
        commit_lsn: r.lsn()?,
        name: r.cstring("origin name")?,
    })
}

fn relation(r: &mut Reader, ctx: Context) -> Result<Relation, DecodeError> {
    let xid = stream_xid(r, ctx)?;
    let oid = r.u32()?;
    let namespace = r.cstring("relation namespace")?;
    let name = r.cstring("relation name")?;
    let replica_identity = r.u8()?;
    let count = r.len_i16("relation column count")?;
    // Smallest column: flags, empty name (NUL), type OID, type modifier.
    let mut columns = Vec::with_capacity(r.capacity_for(count, 1 + 1 + 4 + 4));
    for _ in 0..count {
        columns.push(RelationColumn {
            flags: r.u8()?,
            name: r.cstring("column name")?,
            type_oid: r.u32()?,
            type_modifier: r.i32()?,
        });
    }
    Ok(Relation {
        xid,
        oid,
        namespace,
        name,
        replica_identity,
        columns,
    })
}

fn type_message(r: &mut Reader, ctx: Context) -> Result<TypeMessage, DecodeError> {
    Ok(TypeMessage {
        xid: stream_xid(r, ctx)?,
        oid: r.u32()?,
        namespace: r.cstring("type namespace")?,
        name: r.cstring("type name")?,
    })
}

fn insert(r: &mut Reader, ctx: Context) -> Result<Insert, DecodeError> {
    Ok(Insert {
        xid: stream_xid(r, ctx)?,
        relation_oid: r.u32()?,
        new: read_new_tuple(r)?,
    })
}

fn update(r: &mut Reader, ctx: Context) -> Result<Update, DecodeError> {
    let xid = stream_xid(r, ctx)?;
    let relation_oid = r.u32()?;
    // The old image is optional, so the first marker decides what follows.
    let (old, new) = match r.u8()? {
        NEW => (None, read_tuple(r)?),
        marker @ (KEY | OLD) => (Some(read_old_tuple(marker, r)?), read_new_tuple(r)?),
        other => return Err(DecodeError::UnexpectedTupleMarker(other)),
    };
    Ok(Update {
        xid,
        relation_oid,
        old,
        new,
    })
}

fn delete(r: &mut Reader, ctx: Context) -> Result<Delete, DecodeError> {
    let xid = stream_xid(r, ctx)?;
    let relation_oid = r.u32()?;
    let marker = r.u8()?;
    Ok(Delete {
        xid,
        relation_oid,
        old: read_old_tuple(marker, r)?,
    })
}

fn truncate(r: &mut Reader, ctx: Context) -> Result<Truncate, DecodeError> {
    let xid = stream_xid(r, ctx)?;
    let count = r.len_i32("truncated relation count")?;
    let options = r.u8()?;
    let mut relation_oids = Vec::with_capacity(r.capacity_for(count, 4));
    for _ in 0..count {
        relation_oids.push(r.u32()?);
    }
    Ok(Truncate {
        xid,
        options,
        relation_oids,
    })
}

fn message(r: &mut Reader, ctx: Context) -> Result<Message, DecodeError> {
    let xid = stream_xid(r, ctx)?;
    let flags = r.u8()?;
    let lsn = r.lsn()?;
    let prefix = r.cstring("message prefix")?;
    let len = r.len_i32("message content length")?;
    Ok(Message {
        xid,
        transactional: flags & 1 != 0,
        lsn,
        prefix,
        content: r.bytes(len)?,
    })
}

fn stream_start(r: &mut Reader) -> Result<StreamStart, DecodeError> {
    Ok(StreamStart {
        xid: r.u32()?,
        first_segment: r.u8()? != 0,
    })
}

fn stream_commit(r: &mut Reader) -> Result<StreamCommit, DecodeError> {
    Ok(StreamCommit {
        xid: r.u32()?,
        flags: r.u8()?,
        commit_lsn: r.lsn()?,
        end_lsn: r.lsn()?,
        commit_time: r.i64()?,
    })
}

fn stream_abort(r: &mut Reader, ctx: Context) -> Result<StreamAbort, DecodeError> {
    let xid = r.u32()?;
    let subxid = r.u32()?;
    // Protocol 4 adds the abort LSN and time only for `streaming = parallel`,
    // and the decoder cannot know that option: their presence decides. With
    // protocol < 4 leftover bytes stay an error (reported by `finish`).
    let (abort_lsn, abort_time) = if ctx.protocol_version >= 4 && r.remaining() > 0 {
        (Some(r.lsn()?), Some(r.i64()?))
    } else {
        (None, None)
    };
    Ok(StreamAbort {
        xid,
        subxid,
        abort_lsn,
        abort_time,
    })
}

fn begin_prepare(r: &mut Reader) -> Result<BeginPrepare, DecodeError> {
    Ok(BeginPrepare {
        prepare_lsn: r.lsn()?,
        end_lsn: r.lsn()?,
        prepare_time: r.i64()?,
        xid: r.u32()?,
        gid: r.cstring("gid")?,
    })
}

fn prepare(r: &mut Reader) -> Result<Prepare, DecodeError> {
    Ok(Prepare {
        flags: r.u8()?,
        prepare_lsn: r.lsn()?,
        end_lsn: r.lsn()?,
        prepare_time: r.i64()?,
        xid: r.u32()?,
        gid: r.cstring("gid")?,
    })
}

fn commit_prepared(r: &mut Reader) -> Result<CommitPrepared, DecodeError> {
    Ok(CommitPrepared {
        flags: r.u8()?,
        commit_lsn: r.lsn()?,
        end_lsn: r.lsn()?,
        commit_time: r.i64()?,
        xid: r.u32()?,
        gid: r.cstring("gid")?,
    })
}

fn rollback_prepared(r: &mut Reader) -> Result<RollbackPrepared, DecodeError> {
    Ok(RollbackPrepared {
        flags: r.u8()?,
        prepare_end_lsn: r.lsn()?,
        rollback_end_lsn: r.lsn()?,
        prepare_time: r.i64()?,
        rollback_time: r.i64()?,
        xid: r.u32()?,
        gid: r.cstring("gid")?,
    })
}

fn stream_prepare(r: &mut Reader) -> Result<StreamPrepare, DecodeError> {
    Ok(StreamPrepare {
        flags: r.u8()?,
        prepare_lsn: r.lsn()?,
        end_lsn: r.lsn()?,
        prepare_time: r.i64()?,
        xid: r.u32()?,
        gid: r.cstring("gid")?,
    })
}
