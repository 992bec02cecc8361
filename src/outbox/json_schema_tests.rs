use serde_json::json;

use super::*;
use crate::outbox::registered::{framed_id, RegisteredSchema, SchemaKind};

fn schema(s: serde_json::Value) -> JsonSchema {
    JsonSchema::parse(&s.to_string()).unwrap()
}

fn refusal(s: &JsonSchema, payload: &str) -> (String, String, String) {
    match s.validate(payload.as_bytes()).unwrap_err() {
        EncodeError::Invalid {
            pointer,
            keyword,
            reason,
        } => (pointer, keyword, reason),
        other => panic!("{payload}: {other:?}"),
    }
}

fn order_schema(draft: &str) -> serde_json::Value {
    json!({
        "$schema": draft,
        "type": "object",
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "lines": {"type": "array", "items": {"$ref": "#/definitions/line"}},
            "status": {"enum": ["NEW", "PAID"]}
        },
        "required": ["id", "lines"],
        "additionalProperties": false,
        "definitions": {"line": {
            "type": "object",
            "properties": {"qty": {"type": "integer", "minimum": 1}},
            "required": ["qty"]
        }}
    })
}

#[test]
fn draft_07_and_2020_12_name_the_pointer_and_the_keyword() {
    for draft in [
        "http://json-schema.org/draft-07/schema#",
        "https://json-schema.org/draft/2020-12/schema",
    ] {
        let s = schema(order_schema(draft));
        s.validate(br#"{"id": "6a2f41a3-c54c-fce8-32d2-0324e1c32e22", "lines": [{"qty": 2}], "status": "NEW"}"#)
            .unwrap_or_else(|e| panic!("{draft}: {e}"));
        let (pointer, keyword, reason) = refusal(
            &s,
            r#"{"id": "6a2f41a3-c54c-fce8-32d2-0324e1c32e22", "lines": [{"qty": 2}, {"qty": 0}]}"#,
        );
        assert_eq!(
            (pointer.as_str(), keyword.as_str()),
            ("/lines/1/qty", "minimum"),
            "{draft}: {reason}"
        );
        let (pointer, keyword, _) =
            refusal(&s, r#"{"id": "6a2f41a3-c54c-fce8-32d2-0324e1c32e22"}"#);
        assert_eq!(
            (pointer.as_str(), keyword.as_str()),
            ("", "required"),
            "{draft}"
        );
        let (pointer, keyword, reason) = refusal(
            &s,
            r#"{"id": "6a2f41a3-c54c-fce8-32d2-0324e1c32e22", "lines": [], "extra": 1}"#,
        );
        assert_eq!(
            (pointer.as_str(), keyword.as_str()),
            ("", "additionalProperties"),
            "{draft}"
        );
        assert!(reason.contains("extra"), "{reason}");
        let (pointer, keyword, _) = refusal(
            &s,
            r#"{"id": "6a2f41a3-c54c-fce8-32d2-0324e1c32e22", "lines": [], "status": "LOST"}"#,
        );
        assert_eq!(
            (pointer.as_str(), keyword.as_str()),
            ("/status", "enum"),
            "{draft}"
        );
    }
}

#[test]
fn without_schema_keyword_draft_07_applies() {
    // Draft-07 ignores `prefixItems` (2020-12 only) and honours array `items`.
    let s = schema(
        json!({"type": "array", "items": [{"type": "string"}], "prefixItems": [{"type": "integer"}]}),
    );
    s.validate(br#"["a", 1]"#).unwrap();
    let (pointer, keyword, _) = refusal(&s, "[1]");
    assert_eq!((pointer.as_str(), keyword.as_str()), ("/0", "type"));
}

#[test]
fn nothing_is_loaded_from_outside_the_schema() {
    for reference in [
        "http://127.0.0.1:9/other.json",
        "file:///etc/passwd",
        "other.json",
    ] {
        let e = JsonSchema::parse(&json!({"$ref": reference}).to_string()).unwrap_err();
        assert!(
            e.contains("loads no remote or local references"),
            "{reference}: {e}"
        );
    }
    assert!(JsonSchema::parse("{").unwrap_err().contains("not JSON"));
}

#[test]
fn a_payload_that_is_not_json_is_told_so() {
    let s = schema(json!({}));
    assert!(matches!(s.validate(b"{oops"), Err(EncodeError::NotJson(_))));
}

#[test]
fn frames_keep_the_payload_bytes() {
    let r = RegisteredSchema {
        id: 0x0102_0304,
        subject: "t-value".into(),
        version: 1,
        schema: SchemaKind::parse(Some("JSON"), r#"{"type": "object"}"#).unwrap(),
        url: "http://r:1".into(),
    };
    assert_eq!(r.by_id_url(), "http://r:1/schemas/ids/16909060");
    // Spacing and member order stay as written.
    let payload = br#"{ "b":1,  "a" : [2] }"#;
    let framed = r.encode_framed(payload).unwrap();
    assert_eq!(&framed[..5], &[0, 1, 2, 3, 4]);
    assert_eq!(&framed[5..], payload);
    assert_eq!(framed_id(&framed), Ok(0x0102_0304));
    let e = r.encode_framed(b"[1]").unwrap_err().to_string();
    assert!(e.contains("`type` keyword"), "{e}");

    let avro = RegisteredSchema {
        schema: SchemaKind::parse(None, r#""long""#).unwrap(),
        ..r
    };
    // 3 as a zig-zag varint is 6.
    assert_eq!(avro.encode_framed(b"3").unwrap(), vec![0, 1, 2, 3, 4, 6]);
}

#[test]
fn framed_ids_need_the_magic_byte_and_four_bytes() {
    assert_eq!(framed_id(&[0, 0, 0, 0, 7, 9, 9]), Ok(7));
    assert_eq!(framed_id(&[0, 0, 0, 0, 7]), Ok(7));
    assert!(framed_id(&[0, 0, 1]).unwrap_err().contains("too short"));
    assert!(framed_id(&[]).unwrap_err().contains("too short"));
    assert!(framed_id(b"{\"a\":1}").unwrap_err().contains("0x7b"));
}

#[test]
fn unknown_schema_types_are_refused() {
    let e = SchemaKind::parse(Some("PROTOBUF"), "syntax = \"proto3\";").unwrap_err();
    assert!(e.contains("PROTOBUF"), "{e}");
}

#[test]
fn formats_are_asserted_up_to_2019_09_and_only_annotate_in_2020_12() {
    let s = schema(json!({"$schema": "http://json-schema.org/draft-07/schema#", "format": "date"}));
    let (pointer, keyword, _) = refusal(&s, r#""2026-13-01""#);
    assert_eq!((pointer.as_str(), keyword.as_str()), ("", "format"));
    let s = schema(
        json!({"$schema": "https://json-schema.org/draft/2020-12/schema", "format": "date"}),
    );
    s.validate(br#""2026-13-01""#).unwrap();
}

#[test]
fn a_false_subschema_is_named_by_where_it_sits() {
    let s = schema(json!({"properties": {"legacy": false}}));
    s.validate(br#"{"other": 1}"#).unwrap();
    let (pointer, keyword, _) = refusal(&s, r#"{"legacy": 1}"#);
    assert_eq!(pointer, "/legacy");
    assert_eq!(keyword, "false (schema location /properties/legacy)");
}
