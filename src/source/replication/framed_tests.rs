//! Framing with messages skipped as they stream: cut anywhere, the frames
//! handed on are the same; a huge skipped message never grows the buffer;
//! malformed input is an error, never a panic.

use bytes::{BufMut, BytesMut};
use proptest::collection::vec;
use proptest::prelude::*;

use super::*;

fn framed(keep_prefix: Option<&str>) -> FramedConnection {
    let (socket, _peer) = tokio::io::duplex(64);
    let mut f = FramedConnection::new(Box::new(socket), "test".into());
    f.skip_messages(MessageSkip::new(keep_prefix));
    f
}

/// A CopyData frame around an XLogData payload.
fn copy_data(pgoutput: &[u8]) -> Vec<u8> {
    let mut b = BytesMut::new();
    b.put_u8(b'd');
    b.put_u32((4 + 25 + pgoutput.len()) as u32);
    b.put_u8(b'w');
    b.put_u64(0x100);
    b.put_u64(0x200);
    b.put_i64(0);
    b.put_slice(pgoutput);
    b.to_vec()
}

fn message(prefix: &str, content: &[u8]) -> Vec<u8> {
    let mut b = vec![b'M', 1];
    b.extend_from_slice(&0x150u64.to_be_bytes());
    b.extend_from_slice(prefix.as_bytes());
    b.push(0);
    b.extend_from_slice(&(content.len() as u32).to_be_bytes());
    b.extend_from_slice(content);
    b
}

fn keepalive() -> Vec<u8> {
    let mut b = BytesMut::new();
    b.put_u8(b'd');
    b.put_u32(4 + 18);
    b.put_u8(b'k');
    b.put_u64(0x300);
    b.put_i64(0);
    b.put_u8(1);
    b.to_vec()
}

/// What a consumer sees: CopyData payloads; anything else as its tag.
fn payloads(frames: Vec<Frame>) -> Vec<Vec<u8>> {
    frames
        .into_iter()
        .map(|f| match f {
            Frame::CopyData(b) => b.to_vec(),
            Frame::CopyBothResponse => b"W".to_vec(),
            Frame::Other(_) => b"?".to_vec(),
        })
        .collect()
}

/// The payload of a CopyData frame made by [`copy_data`].
fn payload(frame: &[u8]) -> Vec<u8> {
    frame[5..].to_vec()
}

/// A stream of every kind of frame, and what should come out of it.
fn sample() -> (Vec<u8>, Vec<Vec<u8>>) {
    let insert = copy_data(b"I\0\0\0\x01Nrow");
    let ours = copy_data(&message("outbox", b"an event"));
    let other = copy_data(&message("other", &[7; 300]));
    let empty_other = copy_data(&message("other", b""));
    let stream: Vec<u8> = [
        keepalive(),
        ours.clone(),
        other.clone(),
        insert.clone(),
        other,
        keepalive(),
    ]
    .concat();
    let expected = vec![
        payload(&keepalive()),
        payload(&ours),
        payload(&empty_other),
        payload(&insert),
        payload(&empty_other),
        payload(&keepalive()),
    ];
    (stream, expected)
}

#[test]
fn a_cut_at_any_byte_hands_on_the_same_frames() {
    let (stream, expected) = sample();
    for cut in 0..=stream.len() {
        let mut f = framed(Some("outbox"));
        f.feed(&stream[..cut]);
        let mut got = payloads(f.frames().unwrap());
        f.feed(&stream[cut..]);
        got.extend(payloads(f.frames().unwrap()));
        assert_eq!(got, expected, "cut at {cut}");
    }
    // One byte at a time.
    let mut f = framed(Some("outbox"));
    let mut got = Vec::new();
    for b in &stream {
        f.feed(std::slice::from_ref(b));
        got.extend(payloads(f.frames().unwrap()));
    }
    assert_eq!(got, expected);
}

#[test]
fn without_a_skip_every_frame_is_whole() {
    let (stream, _) = sample();
    let (socket, _peer) = tokio::io::duplex(64);
    let mut f = FramedConnection::new(Box::new(socket), "test".into());
    f.feed(&stream);
    let got = payloads(f.frames().unwrap());
    assert_eq!(got[2].len(), 25 + message("other", &[7; 300]).len());
}

#[test]
fn a_huge_skipped_message_never_grows_the_read_buffer() {
    const CONTENT: usize = 64 << 20;
    const CHUNK: usize = 64 * 1024;
    let mut f = framed(Some("outbox"));
    let header = message("other", b"");
    let mut frame = copy_data(&header);
    // The frame's length and the message's content length, as if followed
    // by CONTENT bytes.
    let frame_len = (frame.len() - 1 + CONTENT) as u32;
    frame[1..5].copy_from_slice(&frame_len.to_be_bytes());
    let n = frame.len();
    frame[n - 4..].copy_from_slice(&(CONTENT as u32).to_be_bytes());
    f.feed(&frame);
    let got = payloads(f.frames().unwrap());
    assert_eq!(got, vec![payload(&copy_data(&header))]);
    let chunk = vec![0xAB; CHUNK];
    let mut peak = f.read_capacity();
    for _ in 0..CONTENT / CHUNK {
        f.feed(&chunk);
        assert!(f.frames().unwrap().is_empty());
        peak = peak.max(f.read_capacity());
    }
    // The next frame comes through.
    f.feed(&keepalive());
    assert_eq!(payloads(f.frames().unwrap()), vec![payload(&keepalive())]);
    assert!(peak <= 2 * READ_BUF_CAPACITY, "read buffer grew to {peak}");
}

fn frame_strategy() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(keepalive()),
        (
            prop_oneof![Just("outbox"), Just("other"), Just("")],
            vec(any::<u8>(), 0..200)
        )
            .prop_map(|(p, c)| copy_data(&message(p, &c))),
        vec(any::<u8>(), 0..40).prop_map(|b| copy_data(&b)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// Any frames, cut into any chunks: the same as fed in one piece, and
    /// every skipped message comes out as its header with length 0.
    #[test]
    fn chunking_does_not_change_the_frames(
        frames in vec(frame_strategy(), 1..8),
        cuts in vec(1usize..64, 1..40),
    ) {
        let stream = frames.concat();
        let mut whole = framed(Some("outbox"));
        whole.feed(&stream);
        let expected = payloads(whole.frames().unwrap());
        prop_assert_eq!(expected.len(), frames.len());
        let mut f = framed(Some("outbox"));
        let mut got = Vec::new();
        let mut rest = &stream[..];
        for cut in cuts.iter().cycle() {
            if rest.is_empty() {
                break;
            }
            let (now, later) = rest.split_at((*cut).min(rest.len()));
            f.feed(now);
            got.extend(payloads(f.frames().unwrap()));
            rest = later;
        }
        prop_assert_eq!(got, expected);
    }

    /// Arbitrary bytes: frames or an error, never a panic.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in vec(any::<u8>(), 0..400), prefix in prop_oneof![Just(Some("outbox")), Just(None)]) {
        let mut f = framed(prefix);
        f.feed(&bytes);
        let _ = f.frames();
    }

    /// A message's bytes mutated: still no panic.
    #[test]
    fn mutated_messages_never_panic(
        content in vec(any::<u8>(), 0..50),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        let mut frame = copy_data(&message("other", &content));
        let i = at.index(frame.len());
        frame[i] = byte;
        let mut f = framed(Some("outbox"));
        f.feed(&frame);
        let _ = f.frames();
    }
}
