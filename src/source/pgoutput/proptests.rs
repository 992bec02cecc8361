//! Properties: random valid messages round-trip through the test encoder, and
//! arbitrary or mutated bytes never panic the decoder, under every protocol
//! version and stream state.

use bytes::Bytes;
use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;

use super::test_encoder::{encode, needs_stream, stream_start};
use super::*;
use crate::Lsn;

/// Enough to exercise every message shape while keeping the suite to seconds.
const CASES: u32 = 2000;

/// Every tag pgoutput defines, so random input often gets past the tag.
const TAGS: &[u8] = b"BCORYIUDTMSEcAbPKrp";

fn lsn() -> impl Strategy<Value = Lsn> {
    any::<u64>().prop_map(Lsn)
}

fn name() -> impl Strategy<Value = String> {
    "[^\\x00]{0,10}"
}

fn payload() -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..12).prop_map(Bytes::from)
}

fn tuple() -> impl Strategy<Value = TupleData> {
    let value = prop_oneof![
        Just(TupleValue::Null),
        Just(TupleValue::UnchangedToast),
        payload().prop_map(TupleValue::Text),
        payload().prop_map(TupleValue::Binary),
    ];
    vec(value, 0..6).prop_map(TupleData)
}

fn old_tuple() -> impl Strategy<Value = OldTuple> {
    prop_oneof![
        tuple().prop_map(OldTuple::Key),
        tuple().prop_map(OldTuple::Full)
    ]
}

fn xid() -> impl Strategy<Value = Option<u32>> {
    option::of(any::<u32>())
}

fn column() -> impl Strategy<Value = RelationColumn> {
    (any::<u8>(), name(), any::<u32>(), any::<i32>()).prop_map(
        |(flags, name, type_oid, type_modifier)| RelationColumn {
            flags,
            name,
            type_oid,
            type_modifier,
        },
    )
}

/// Fields shared by the two-phase messages: (flags, lsn, lsn, time, xid, gid).
type TwoPhase = (u8, Lsn, Lsn, i64, u32, String);

fn two_phase() -> impl Strategy<Value = TwoPhase> {
    (
        any::<u8>(),
        lsn(),
        lsn(),
        any::<i64>(),
        any::<u32>(),
        name(),
    )
}

fn change() -> impl Strategy<Value = LogicalMessage> {
    use LogicalMessage as L;
    prop_oneof![
        (
            xid(),
            any::<u32>(),
            name(),
            name(),
            any::<u8>(),
            vec(column(), 0..4)
        )
            .prop_map(
                |(xid, oid, namespace, name, replica_identity, columns)| L::Relation(Relation {
                    xid,
                    oid,
                    namespace,
                    name,
                    replica_identity,
                    columns
                })
            ),
        (xid(), any::<u32>(), name(), name()).prop_map(|(xid, oid, namespace, name)| L::Type(
            TypeMessage {
                xid,
                oid,
                namespace,
                name
            }
        )),
        (xid(), any::<u32>(), tuple()).prop_map(|(xid, relation_oid, new)| L::Insert(Insert {
            xid,
            relation_oid,
            new
        })),
        (xid(), any::<u32>(), option::of(old_tuple()), tuple()).prop_map(
            |(xid, relation_oid, old, new)| L::Update(Update {
                xid,
                relation_oid,
                old,
                new
            })
        ),
        (xid(), any::<u32>(), old_tuple()).prop_map(|(xid, relation_oid, old)| L::Delete(Delete {
            xid,
            relation_oid,
            old
        })),
        (xid(), any::<u8>(), vec(any::<u32>(), 0..5)).prop_map(|(xid, options, relation_oids)| {
            L::Truncate(Truncate {
                xid,
                options,
                relation_oids,
            })
        }),
        (xid(), any::<bool>(), lsn(), name(), payload()).prop_map(
            |(xid, transactional, lsn, prefix, content)| L::Message(Message {
                xid,
                transactional,
                lsn,
                prefix,
                content
            })
        ),
    ]
}

fn transaction() -> impl Strategy<Value = LogicalMessage> {
    use LogicalMessage as L;
    prop_oneof![
        (lsn(), any::<i64>(), any::<u32>()).prop_map(|(final_lsn, commit_time, xid)| L::Begin(
            Begin {
                final_lsn,
                commit_time,
                xid
            }
        )),
        (any::<u8>(), lsn(), lsn(), any::<i64>()).prop_map(
            |(flags, commit_lsn, end_lsn, commit_time)| L::Commit(Commit {
                flags,
                commit_lsn,
                end_lsn,
                commit_time
            })
        ),
        (lsn(), name()).prop_map(|(commit_lsn, name)| L::Origin(Origin { commit_lsn, name })),
        (any::<u32>(), any::<bool>())
            .prop_map(|(xid, first_segment)| L::StreamStart(StreamStart { xid, first_segment })),
        Just(L::StreamStop),
        (any::<u32>(), any::<u8>(), lsn(), lsn(), any::<i64>()).prop_map(
            |(xid, flags, commit_lsn, end_lsn, commit_time)| L::StreamCommit(StreamCommit {
                xid,
                flags,
                commit_lsn,
                end_lsn,
                commit_time
            })
        ),
        (
            any::<u32>(),
            any::<u32>(),
            option::of((lsn(), any::<i64>()))
        )
            .prop_map(|(xid, subxid, abort)| L::StreamAbort(StreamAbort {
                xid,
                subxid,
                abort_lsn: abort.map(|a| a.0),
                abort_time: abort.map(|a| a.1),
            })),
    ]
}

fn two_phase_message() -> impl Strategy<Value = LogicalMessage> {
    use LogicalMessage as L;
    prop_oneof![
        two_phase().prop_map(|(_, prepare_lsn, end_lsn, prepare_time, xid, gid)| {
            L::BeginPrepare(BeginPrepare {
                prepare_lsn,
                end_lsn,
                prepare_time,
                xid,
                gid,
            })
        }),
        two_phase().prop_map(|(flags, prepare_lsn, end_lsn, prepare_time, xid, gid)| {
            L::Prepare(Prepare {
                flags,
                prepare_lsn,
                end_lsn,
                prepare_time,
                xid,
                gid,
            })
        }),
        two_phase().prop_map(|(flags, commit_lsn, end_lsn, commit_time, xid, gid)| {
            L::CommitPrepared(CommitPrepared {
                flags,
                commit_lsn,
                end_lsn,
                commit_time,
                xid,
                gid,
            })
        }),
        (two_phase(), any::<i64>()).prop_map(
            |(
                (flags, prepare_end_lsn, rollback_end_lsn, prepare_time, xid, gid),
                rollback_time,
            )| {
                L::RollbackPrepared(RollbackPrepared {
                    flags,
                    prepare_end_lsn,
                    rollback_end_lsn,
                    prepare_time,
                    rollback_time,
                    xid,
                    gid,
                })
            }
        ),
        two_phase().prop_map(|(flags, prepare_lsn, end_lsn, prepare_time, xid, gid)| {
            L::StreamPrepare(StreamPrepare {
                flags,
                prepare_lsn,
                end_lsn,
                prepare_time,
                xid,
                gid,
            })
        }),
    ]
}

fn any_message() -> impl Strategy<Value = LogicalMessage> {
    prop_oneof![change(), transaction(), two_phase_message()]
}

/// A decoder for `version`, inside a stream block when asked and possible.
fn decoder(version: u32, in_stream: bool) -> Decoder {
    let mut d = Decoder::new(version);
    if in_stream && (2..=4).contains(&version) {
        d.decode(stream_start(7)).expect("stream start");
    }
    d
}

/// Decodes `data` in every version and stream state. Whatever is accepted
/// must re-encode to bytes that decode to the same message: the decoder never
/// returns a value it could not have read.
fn decode_everywhere(data: &Bytes) -> Result<(), TestCaseError> {
    for version in 0..=5 {
        for in_stream in [false, true] {
            if let Ok(m) = decoder(version, in_stream).decode(data.clone()) {
                let again = decoder(version, in_stream).decode(encode(&m));
                prop_assert_eq!(again, Ok(m));
            }
        }
    }
    Ok(())
}

/// One edit of a valid message.
#[derive(Debug, Clone)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, u8),
    Remove(usize),
    Truncate(usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1..=u8::MAX).prop_map(|(i, x)| Mutation::Flip(i, x)),
        (any::<usize>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<usize>().prop_map(Mutation::Remove),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

fn mutate(bytes: &mut Vec<u8>, m: &Mutation) {
    if bytes.is_empty() {
        return;
    }
    let len = bytes.len();
    match *m {
        Mutation::Flip(i, x) => bytes[i % len] ^= x,
        Mutation::Insert(i, b) => bytes.insert(i % (len + 1), b),
        Mutation::Remove(i) => {
            bytes.remove(i % len);
        }
        Mutation::Truncate(i) => bytes.truncate(i % len),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, ..ProptestConfig::default() })]

    #[test]
    fn valid_messages_round_trip(m in any_message()) {
        let mut d = decoder(4, needs_stream(&m));
        prop_assert_eq!(d.decode(encode(&m)), Ok(m));
    }

    #[test]
    fn arbitrary_bytes_never_panic(
        tag in prop_oneof![any::<u8>(), proptest::sample::select(TAGS)],
        rest in vec(any::<u8>(), 0..64),
    ) {
        let mut data = vec![tag];
        data.extend(rest);
        decode_everywhere(&Bytes::from(data))?;
    }

    #[test]
    fn mutated_messages_never_panic(
        m in any_message(),
        mutations in vec(mutation(), 1..4),
    ) {
        let mut bytes = encode(&m).to_vec();
        for mutation in &mutations {
            mutate(&mut bytes, mutation);
        }
        decode_everywhere(&Bytes::from(bytes))?;
    }
}
