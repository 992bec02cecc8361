use apache_avro::types::Value;
use serde_json::json;

use super::error::EncodeError;
use super::*;

fn schema(s: serde_json::Value) -> AvroSchema {
    AvroSchema::parse(&s.to_string()).unwrap()
}

/// Encodes `payload` and decodes the datum back with the crate's reader.
fn roundtrip(schema: &AvroSchema, payload: &str) -> Value {
    let mut out = Vec::new();
    schema
        .encode(payload.as_bytes(), &mut out)
        .unwrap_or_else(|e| panic!("{payload}: {e}"));
    let mut rest = &out[..];
    let v = apache_avro::from_avro_datum(&schema.root, &mut rest, None).unwrap();
    assert!(rest.is_empty(), "the whole datum is read");
    v
}

fn error(schema: &AvroSchema, payload: &str) -> EncodeError {
    let mut out = Vec::new();
    schema.encode(payload.as_bytes(), &mut out).unwrap_err()
}

fn order_schema() -> AvroSchema {
    schema(json!({
        "type": "record", "name": "Order", "namespace": "com.acme",
        "fields": [
            {"name": "id", "type": "long"},
            {"name": "note", "type": ["null", "string"], "default": null},
            {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["NEW", "PAID"]}},
            {"name": "lines", "type": {"type": "array", "items": {
                "type": "record", "name": "Line", "fields": [
                    {"name": "sku", "type": "string"},
                    {"name": "qty", "type": "int", "default": 1}
                ]}}},
            {"name": "attrs", "type": {"type": "map", "values": "string"}, "default": {}},
            {"name": "total", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 2}},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
            {"name": "prev", "type": ["null", "Line"], "default": null}
        ]
    }))
}

#[test]
fn maps_records_unions_enums_arrays_maps_and_logical_types() {
    let s = order_schema();
    let v = roundtrip(
        &s,
        r#"{"id": 9007199254740993, "note": "gift", "status": "PAID",
            "lines": [{"sku": "a", "qty": 2}, {"sku": "b"}],
            "attrs": {"k": "v"}, "total": "1234567890.12",
            "at": "2026-12-04T20:22:42.123Z",
            "ref": "123e4567-e89b-12d3-a456-426614174000",
            "prev": {"sku": "z", "qty": 3}}"#,
    );
    let Value::Record(fields) = v else {
        panic!("a record: {v:?}")
    };
    let get = |n: &str| fields.iter().find(|(k, _)| k == n).unwrap().1.clone();
    // Above 2^53: a detour through f64 would have changed it.
    assert_eq!(get("id"), Value::Long(9_007_199_254_740_993));
    assert_eq!(
        get("note"),
        Value::Union(1, Box::new(Value::String("gift".into())))
    );
    assert_eq!(get("status"), Value::Enum(1, "PAID".into()));
    let Value::Array(lines) = get("lines") else {
        panic!()
    };
    assert_eq!(
        lines[1],
        Value::Record(vec![
            ("sku".into(), Value::String("b".into())),
            ("qty".into(), Value::Int(1)),
        ]),
        "an absent field takes its default"
    );
    assert_eq!(
        get("attrs"),
        Value::Map([("k".to_owned(), Value::String("v".into()))].into())
    );
    let Value::Decimal(d) = get("total") else {
        panic!()
    };
    let bytes: Vec<u8> = (&d).try_into().unwrap();
    let mut n: i128 = 0;
    for b in bytes {
        n = (n << 8) | i128::from(b);
    }
    assert_eq!(n, 123_456_789_012);
    assert_eq!(get("at"), Value::TimestampMillis(1_796_415_762_123));
    assert_eq!(
        get("ref"),
        Value::Uuid("123e4567-e89b-12d3-a456-426614174000".parse().unwrap())
    );
    assert!(matches!(get("prev"), Value::Union(1, _)));
}

#[test]
fn absent_optional_fields_take_their_defaults() {
    let s = order_schema();
    let v = roundtrip(
        &s,
        r#"{"id": 1, "status": "NEW", "lines": [], "total": 0.5,
            "at": 1796415762123, "ref": "123e4567-e89b-12d3-a456-426614174000"}"#,
    );
    let Value::Record(fields) = v else { panic!() };
    assert_eq!(fields[1].1, Value::Union(0, Box::new(Value::Null)));
    assert_eq!(fields[4].1, Value::Map(Default::default()));
    assert_eq!(fields[8].1, Value::Union(0, Box::new(Value::Null)));
}

#[test]
fn errors_name_the_field_path_and_the_expected_type() {
    let s = order_schema();
    let base =
        r#""status": "NEW", "total": "1", "at": 0, "ref": "123e4567-e89b-12d3-a456-426614174000""#;
    let e = error(
        &s,
        &format!(r#"{{"id": 1, {base}, "lines": [{{"sku": "a"}}, {{"sku": 5}}]}}"#),
    );
    assert_eq!(
        e.to_string(),
        "at $.lines[1].sku the schema expects a string: found the number 5"
    );
    let e = error(&s, &format!(r#"{{"id": "x", {base}, "lines": []}}"#));
    assert!(
        e.to_string()
            .starts_with("at $.id the schema expects a long"),
        "{e}"
    );
    let e = error(
        &s,
        &format!(r#"{{"id": 1, {base}, "lines": [], "extra": 1}}"#),
    );
    assert!(
        e.to_string()
            .contains("member \"extra\" is not one of them"),
        "{e}"
    );
    let e = error(&s, &format!(r#"{{{base}, "lines": []}}"#));
    assert!(
        e.to_string()
            .starts_with("at $.id the schema expects field `id`"),
        "{e}"
    );
    let e = error(&s, r#"{"id": 1, "status": "GONE"}"#);
    assert!(
        e.to_string()
            .contains("a symbol of enum com.acme.Status: NEW, PAID"),
        "{e}"
    );
    // Optional record: the error inside its one branch.
    let e = error(
        &s,
        &format!(r#"{{"id": 1, {base}, "lines": [], "prev": {{"sku": 1}}}}"#),
    );
    assert!(
        e.to_string()
            .starts_with("at $.prev.sku the schema expects a string"),
        "{e}"
    );
    assert!(matches!(error(&s, "{"), EncodeError::NotJson(_)));
    assert!(matches!(error(&s, "not json"), EncodeError::NotJson(_)));
}

#[test]
fn unions_take_the_first_branch_the_value_fits() {
    let s = schema(json!(["null", "int", "long", "string", "double"]));
    assert_eq!(roundtrip(&s, "5"), Value::Union(1, Box::new(Value::Int(5))));
    assert_eq!(
        roundtrip(&s, "5000000000"),
        Value::Union(2, Box::new(Value::Long(5_000_000_000)))
    );
    assert_eq!(
        roundtrip(&s, "1.5"),
        Value::Union(4, Box::new(Value::Double(1.5)))
    );
    assert_eq!(
        roundtrip(&s, r#""x""#),
        Value::Union(3, Box::new(Value::String("x".into())))
    );
    assert_eq!(
        roundtrip(&s, "null"),
        Value::Union(0, Box::new(Value::Null))
    );
    let e = error(&s, "true");
    assert_eq!(
        e.to_string(),
        "at $ the schema expects one of the union's branches [null, int, long, string, double]: \
         found a boolean"
    );
    let no_null = schema(json!(["int", "string"]));
    assert!(error(&no_null, "null").to_string().contains("found null"));
}

#[test]
fn bytes_fixed_and_logical_types() {
    let s = schema(json!({"type": "record", "name": "R", "fields": [
        {"name": "b", "type": "bytes"},
        {"name": "f", "type": {"type": "fixed", "name": "F4", "size": 4}},
        {"name": "d", "type": {"type": "int", "logicalType": "date"}},
        {"name": "t", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "lt", "type": {"type": "long", "logicalType": "local-timestamp-millis"}},
        {"name": "tm", "type": {"type": "int", "logicalType": "time-millis"}},
        {"name": "dec", "type": {"type": "fixed", "name": "D8", "size": 8,
            "logicalType": "decimal", "precision": 18, "scale": 4}},
        {"name": "dflt", "type": "bytes", "default": "\u{00ff}A"}
    ]}));
    let v = roundtrip(
        &s,
        r#"{"b": "AAEC", "f": "3q2+7w==", "d": "2026-12-04", "t": "2026-12-04T20:22:42.123456Z",
            "lt": "2026-12-04T20:22:42.5", "tm": "01:00:00.250", "dec": -12.5}"#,
    );
    let Value::Record(f) = v else { panic!() };
    assert_eq!(f[0].1, Value::Bytes(vec![0, 1, 2]));
    assert_eq!(f[1].1, Value::Fixed(4, vec![0xde, 0xad, 0xbe, 0xef]));
    assert_eq!(f[2].1, Value::Date(20_791));
    assert_eq!(f[3].1, Value::TimestampMicros(1_796_415_762_123_456));
    assert_eq!(f[4].1, Value::LocalTimestampMillis(1_796_415_762_500));
    assert_eq!(f[5].1, Value::TimeMillis(3_600_250));
    let Value::Decimal(d) = &f[6].1 else { panic!() };
    let bytes: Vec<u8> = d.try_into().unwrap();
    assert_eq!(i64::from_be_bytes(bytes.try_into().unwrap()), -125_000);
    assert_eq!(f[7].1, Value::Bytes(vec![0xff, b'A']));

    let bad = |field: &str, value: &str| {
        let mut p: serde_json::Map<String, serde_json::Value> = serde_json::from_str(
            r#"{"b": "", "f": "AAAAAA==", "d": 0, "t": 0, "lt": 0, "tm": 0, "dec": 0}"#,
        )
        .unwrap();
        p.insert(field.into(), serde_json::from_str(value).unwrap());
        error(&s, &serde_json::Value::Object(p).to_string()).to_string()
    };
    assert!(bad("f", r#""AAAA""#).contains("decodes to 3 bytes"));
    assert!(bad("b", r#""%%%""#).contains("is not base64"));
    assert!(bad("d", r#""2026-13-01""#).contains("a date"));
    assert!(bad("lt", r#""2026-12-04T20:22:42Z""#).contains("without a zone"));
    assert!(bad("t", r#""2026-12-04T20:22:42.1234567Z""#).contains("timestamp-micros"));
    assert!(bad("dec", "1.23456").contains("more than 4 decimal places"));
    assert!(bad("dec", "1e20").contains("precision"));
}

#[test]
fn named_types_are_found_across_namespaces() {
    let s = schema(json!({"type": "record", "name": "a.Outer", "fields": [
        {"name": "x", "type": {"type": "record", "name": "Inner", "fields": [
            {"name": "v", "type": "int"}]}},
        {"name": "y", "type": "a.Inner"},
        {"name": "z", "type": "Inner"}
    ]}));
    roundtrip(&s, r#"{"x": {"v": 1}, "y": {"v": 2}, "z": {"v": 3}}"#);
}

#[test]
fn a_union_branch_that_does_not_fit_leaves_nothing_behind() {
    // The first record branch takes `a` before it finds `c` is not its own.
    let s = schema(json!(["null",
        {"type": "record", "name": "A", "fields": [
            {"name": "a", "type": "int"}, {"name": "b", "type": "string", "default": "-"}]},
        {"type": "record", "name": "C", "fields": [
            {"name": "a", "type": "int"}, {"name": "c", "type": "long"}]}
    ]));
    assert_eq!(
        roundtrip(&s, r#"{"a": 1, "c": 2}"#),
        Value::Union(
            2,
            Box::new(Value::Record(vec![
                ("a".into(), Value::Int(1)),
                ("c".into(), Value::Long(2)),
            ]))
        )
    );
    assert_eq!(
        roundtrip(&s, r#"{"a": 1}"#),
        Value::Union(
            1,
            Box::new(Value::Record(vec![
                ("a".into(), Value::Int(1)),
                ("b".into(), Value::String("-".into())),
            ]))
        )
    );
}

#[test]
fn recursive_records_and_record_defaults() {
    let s = schema(json!({"type": "record", "name": "Node", "fields": [
        {"name": "v", "type": "int"},
        {"name": "inner", "type": {"type": "record", "name": "Inner", "fields": [
            {"name": "w", "type": "int", "default": 7},
            {"name": "tag", "type": ["string", "null"], "default": "x"}]},
            "default": {}},
        {"name": "next", "type": ["null", "Node"], "default": null}
    ]}));
    let inner = |w: i32, tag: &str| {
        Value::Record(vec![
            ("w".into(), Value::Int(w)),
            (
                "tag".into(),
                Value::Union(0, Box::new(Value::String(tag.into()))),
            ),
        ])
    };
    assert_eq!(
        roundtrip(
            &s,
            r#"{"v": 1, "next": {"v": 2, "inner": {"w": 3, "tag": "y"}}}"#
        ),
        Value::Record(vec![
            ("v".into(), Value::Int(1)),
            ("inner".into(), inner(7, "x")),
            (
                "next".into(),
                Value::Union(
                    1,
                    Box::new(Value::Record(vec![
                        ("v".into(), Value::Int(2)),
                        ("inner".into(), inner(3, "y")),
                        ("next".into(), Value::Union(0, Box::new(Value::Null))),
                    ]))
                )
            ),
        ])
    );
    assert_eq!(
        error(&s, r#"{"v": 1, "next": {"v": 2, "next": {"v": "3"}}}"#).to_string(),
        "at $.next.next.v the schema expects an int (32-bit integer): found the string \"3\""
    );
}
