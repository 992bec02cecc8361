//! Avro's binary encoding of its two building blocks: a `long` (zig-zag,
//! then 7 bits a byte, low bits first; an `int` is written the same way)
//! and length-prefixed bytes (`bytes` and `string`).

/// Appends `v` as an Avro `long` (or `int`).
pub(super) fn write_long(v: i64, out: &mut Vec<u8>) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

/// Appends `b` as Avro `bytes` (a `string` is its UTF-8 bytes).
pub(super) fn write_bytes(b: &[u8], out: &mut Vec<u8>) {
    write_long(b.len() as i64, out);
    out.extend_from_slice(b);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longs_are_zig_zag_varints() {
        let enc = |v: i64| {
            let mut out = Vec::new();
            write_long(v, &mut out);
            out
        };
        assert_eq!(enc(0), [0]);
        assert_eq!(enc(-1), [1]);
        assert_eq!(enc(1), [2]);
        assert_eq!(enc(-64), [0x7f]);
        assert_eq!(enc(64), [0x80, 0x01]);
        assert_eq!(
            enc(i64::MIN),
            [0xff; 9].iter().copied().chain([1]).collect::<Vec<_>>()
        );
        for v in [0, 1, -1, 300, -300, i64::from(i32::MIN), i64::MAX, i64::MIN] {
            let mut theirs = Vec::new();
            apache_avro::to_avro_datum(
                &apache_avro::Schema::Long,
                apache_avro::types::Value::Long(v),
            )
            .map(|d| theirs = d)
            .unwrap();
            assert_eq!(enc(v), theirs, "{v}");
        }
    }
}
