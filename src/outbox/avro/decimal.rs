//! Avro `decimal` from a JSON number's or string's text, exactly: the
//! digits are scaled as text and turned into the big-endian two's-complement
//! integer Avro stores, with no floating point on the way. A value with more
//! decimal places than the schema's scale, or more digits than its
//! precision, is refused rather than rounded.

/// The unscaled integer of `text` at `scale`, as big-endian two's complement
/// bytes (at least one byte).
pub(super) fn unscaled_bytes(
    text: &str,
    precision: usize,
    scale: usize,
) -> Result<Vec<u8>, String> {
    let (negative, body) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let (mantissa, exponent) = match body.find(['e', 'E']) {
        Some(i) => {
            let exp: i64 = body[i + 1..]
                .parse()
                .map_err(|_| format!("`{text}` is not a decimal number"))?;
            (&body[..i], exp)
        }
        None => (body, 0),
    };
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    if int_part.is_empty() && frac_part.is_empty()
        || !int_part
            .bytes()
            .chain(frac_part.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return Err(format!("`{text}` is not a decimal number"));
    }
    let mut digits: Vec<u8> = int_part
        .bytes()
        .chain(frac_part.bytes())
        .map(|b| b - b'0')
        .collect();
    // value = digits × 10^shift; the unscaled value is digits × 10^(shift + scale).
    let shift = exponent
        .checked_sub(frac_part.len() as i64)
        .and_then(|s| s.checked_add(scale as i64))
        .ok_or_else(|| format!("`{text}`: exponent out of range"))?;
    if shift < 0 {
        let drop = usize::try_from(-shift).unwrap_or(usize::MAX);
        let cut = digits.len().saturating_sub(drop);
        if digits[cut..].iter().any(|&d| d != 0) {
            return Err(format!(
                "`{text}` has more than {scale} decimal places (the schema's scale); it is not \
                 rounded"
            ));
        }
        digits.truncate(cut);
    }
    let first = digits.iter().position(|&d| d != 0).unwrap_or(digits.len());
    digits.drain(..first);
    if shift > 0 && !digits.is_empty() {
        let add = usize::try_from(shift).unwrap_or(usize::MAX);
        if digits.len().saturating_add(add) > precision {
            return Err(too_many(text, precision));
        }
        digits.resize(digits.len() + add, 0);
    }
    if digits.len() > precision {
        return Err(too_many(text, precision));
    }
    Ok(twos_complement(&digits, negative && !digits.is_empty()))
}

fn too_many(text: &str, precision: usize) -> String {
    format!("`{text}` has more than {precision} digits (the schema's precision)")
}

/// Decimal digits (most significant first) as big-endian two's complement.
fn twos_complement(digits: &[u8], negative: bool) -> Vec<u8> {
    // Base-256 magnitude, most significant byte first.
    let mut mag: Vec<u8> = Vec::new();
    for &d in digits {
        let mut carry = u32::from(d);
        for b in mag.iter_mut().rev() {
            let v = u32::from(*b) * 10 + carry;
            *b = (v & 0xff) as u8;
            carry = v >> 8;
        }
        while carry > 0 {
            mag.insert(0, (carry & 0xff) as u8);
            carry >>= 8;
        }
    }
    // Room for the sign bit.
    if mag.first().map_or(true, |b| b & 0x80 != 0) {
        mag.insert(0, 0);
    }
    if negative {
        for b in mag.iter_mut() {
            *b = !*b;
        }
        for b in mag.iter_mut().rev() {
            let (v, overflow) = b.overflowing_add(1);
            *b = v;
            if !overflow {
                break;
            }
        }
    }
    mag
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int(bytes: &[u8]) -> i128 {
        let mut v: i128 = if bytes[0] & 0x80 != 0 { -1 } else { 0 };
        for &b in bytes {
            v = (v << 8) | i128::from(b);
        }
        v
    }

    #[test]
    fn scales_exactly() {
        assert_eq!(int(&unscaled_bytes("123.45", 10, 2).unwrap()), 12345);
        assert_eq!(int(&unscaled_bytes("-123.45", 10, 2).unwrap()), -12345);
        assert_eq!(int(&unscaled_bytes("7", 10, 2).unwrap()), 700);
        assert_eq!(int(&unscaled_bytes("1.5e2", 10, 2).unwrap()), 15000);
        assert_eq!(int(&unscaled_bytes("12.300", 10, 2).unwrap()), 1230);
        assert_eq!(int(&unscaled_bytes("-0.00", 10, 2).unwrap()), 0);
        assert_eq!(int(&unscaled_bytes("-128", 3, 0).unwrap()), -128);
        assert_eq!(int(&unscaled_bytes("255", 3, 0).unwrap()), 255);
        // 38 digits (Java BigDecimal's usual precision) survive whole.
        let big = "12345678901234567890123456.789012345678";
        assert_eq!(
            int(&unscaled_bytes(big, 38, 12).unwrap()),
            12345678901234567890123456789012345678
        );
    }

    #[test]
    fn refuses_rounding_and_overflow() {
        assert!(unscaled_bytes("1.234", 10, 2)
            .unwrap_err()
            .contains("decimal places"));
        assert!(unscaled_bytes("123456", 5, 0)
            .unwrap_err()
            .contains("precision"));
        assert!(unscaled_bytes("1e400", 5, 0)
            .unwrap_err()
            .contains("precision"));
        assert!(unscaled_bytes("abc", 5, 0).is_err());
        assert!(unscaled_bytes("", 5, 0).is_err());
    }
}
