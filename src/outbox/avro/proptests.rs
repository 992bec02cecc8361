use std::collections::BTreeMap;

use apache_avro::types::Value;
use proptest::prelude::*;
use serde_json::json;

use super::json::{self as reader, Json};
use super::*;

fn record_schema() -> AvroSchema {
    AvroSchema::parse(
        &json!({"type": "record", "name": "P", "fields": [
            {"name": "i", "type": "int"},
            {"name": "l", "type": "long"},
            {"name": "s", "type": "string"},
            {"name": "o", "type": ["null", "string"], "default": null},
            {"name": "a", "type": {"type": "array", "items": "long"}},
            {"name": "m", "type": {"type": "map", "values": "int"}},
            {"name": "d", "type": {"type": "bytes", "logicalType": "decimal",
                "precision": 20, "scale": 3}}
        ]})
        .to_string(),
    )
    .unwrap()
}

/// `n / 10^scale` written exactly as a decimal literal.
fn decimal_text(n: i64, scale: u32) -> String {
    let sign = if n < 0 { "-" } else { "" };
    let digits = format!("{:0>width$}", n.unsigned_abs(), width = scale as usize + 1);
    let (int, frac) = digits.split_at(digits.len() - scale as usize);
    if scale == 0 {
        format!("{sign}{int}")
    } else {
        format!("{sign}{int}.{frac}")
    }
}

fn as_i128(bytes: &[u8]) -> i128 {
    let mut v: i128 = if bytes[0] & 0x80 != 0 { -1 } else { 0 };
    for &b in bytes {
        v = (v << 8) | i128::from(b);
    }
    v
}

proptest! {
    /// Any payload of the schema's shape encodes to a datum the Avro
    /// crate's reader decodes to exactly the payload's values.
    #[test]
    fn records_roundtrip(
        i in any::<i32>(),
        l in any::<i64>(),
        s in ".{0,20}",
        o in proptest::option::of(".{0,8}"),
        a in proptest::collection::vec(any::<i64>(), 0..5),
        m in proptest::collection::btree_map("[a-z]{1,4}", any::<i32>(), 0..4),
        d in -999_999_999_999_999i64..999_999_999_999_999,
        absent_o in any::<bool>(),
    ) {
        let mut payload = json!({"i": i, "l": l, "s": s, "a": a, "m": m, "d": decimal_text(d, 3)});
        if !absent_o {
            payload["o"] = json!(o);
        }
        let mut out = Vec::new();
        record_schema().encode(payload.to_string().as_bytes(), &mut out).unwrap();
        let decoded = apache_avro::from_avro_datum(&record_schema().root, &mut &out[..], None).unwrap();
        let Value::Record(f) = decoded else { panic!("a record") };
        prop_assert_eq!(&f[0].1, &Value::Int(i));
        prop_assert_eq!(&f[1].1, &Value::Long(l));
        prop_assert_eq!(&f[2].1, &Value::String(s));
        let o = if absent_o { None } else { o };
        let expected_o = match o {
            None => Value::Union(0, Box::new(Value::Null)),
            Some(t) => Value::Union(1, Box::new(Value::String(t))),
        };
        prop_assert_eq!(&f[3].1, &expected_o);
        prop_assert_eq!(&f[4].1, &Value::Array(a.into_iter().map(Value::Long).collect()));
        let Value::Map(got) = &f[5].1 else { panic!("a map") };
        let got: BTreeMap<String, Value> = got.clone().into_iter().collect();
        let want: BTreeMap<String, Value> = m.into_iter().map(|(k, v)| (k, Value::Int(v))).collect();
        prop_assert_eq!(got, want);
        let Value::Decimal(dec) = &f[6].1 else { panic!("a decimal") };
        let bytes: Vec<u8> = dec.try_into().unwrap();
        prop_assert_eq!(as_i128(&bytes), i128::from(d));
    }

    /// A decimal keeps every digit, written plainly, with trailing zeros or
    /// with an exponent.
    #[test]
    fn decimals_keep_every_digit(n in any::<i64>(), scale in 0u32..8, extra in 0u32..3) {
        let plain = decimal_text(n, scale);
        let bytes = decimal::unscaled_bytes(&plain, 38, scale as usize).unwrap();
        prop_assert_eq!(as_i128(&bytes), i128::from(n));
        let padded = if scale == 0 { format!("{plain}.{}", "0".repeat(extra as usize + 1)) }
            else { format!("{plain}{}", "0".repeat(extra as usize)) };
        let bytes = decimal::unscaled_bytes(&padded, 38, scale as usize).unwrap();
        prop_assert_eq!(as_i128(&bytes), i128::from(n));
        let exp = format!("{}e-{scale}", n);
        let bytes = decimal::unscaled_bytes(&exp, 38, scale as usize).unwrap();
        prop_assert_eq!(as_i128(&bytes), i128::from(n));
    }

    /// The number-keeping JSON reader reads what serde_json writes, strings
    /// and numbers alike.
    #[test]
    fn json_reader_agrees_with_serde_json(
        s in "\\PC{0,12}",
        f in any::<f64>().prop_filter("finite", |f| f.is_finite()),
        n in any::<i64>(),
    ) {
        let text = json!({"s": s, "f": f, "n": n, "a": [null, true, false]}).to_string();
        let parsed = reader::parse(&text).unwrap();
        let Json::Object(members) = parsed else { panic!("an object") };
        let get = |k: &str| members.iter().find(|(n, _)| n == k).unwrap().1.clone();
        prop_assert_eq!(get("s"), Json::String(s.into()));
        let Json::Number(ft) = get("f") else { panic!("a number") };
        prop_assert_eq!(ft.parse::<f64>().unwrap(), f);
        prop_assert_eq!(get("n"), Json::Number(&n.to_string()));
        prop_assert_eq!(get("a"), Json::Array(vec![Json::Null, Json::Bool(true), Json::Bool(false)]));
    }
}

#[test]
fn json_reader_refuses_what_is_not_json() {
    for bad in [
        "",
        "{",
        "[1,]",
        "01",
        "1.",
        "-",
        "\"\\x\"",
        "{\"a\":1,\"a\":2}",
        "nul",
        "[1] 2",
        "\"\\ud800\"",
        "1e",
    ] {
        assert!(reader::parse(bad).is_err(), "{bad:?} parsed");
    }
    assert_eq!(
        reader::parse(r#""a\u00e9\ud83d\ude00\n""#).unwrap(),
        Json::String("aé😀\n".into())
    );
}
