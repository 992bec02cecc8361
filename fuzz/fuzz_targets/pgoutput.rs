//! Fuzzes the pgoutput decoder: `cargo +nightly fuzz run pgoutput`.
//!
//! Each input is decoded as one message under every protocol version, both
//! outside and (from version 2, where streaming exists) inside a stream
//! block. The decoder must return `Ok` or `Err`, never panic or abort.

#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use outboxd::source::pgoutput::Decoder;

/// A valid Stream Start (xid 1, first segment) that opens a stream block, so
/// that the in-stream layout (xid after the tag) is fuzzed too.
const STREAM_START: &[u8] = &[b'S', 0, 0, 0, 1, 1];

fuzz_target!(|data: &[u8]| {
    let data = Bytes::copy_from_slice(data);
    for version in 1..=4u32 {
        let _ = Decoder::new(version).decode(data.clone());

        if version >= 2 {
            let mut decoder = Decoder::new(version);
            decoder
                .decode(Bytes::from_static(STREAM_START))
                .expect("a valid Stream Start decodes in protocol >= 2");
            assert!(decoder.in_stream());
            let _ = decoder.decode(data.clone());
        }
    }
});
