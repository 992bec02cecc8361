//! Tests of the trace context column's three forms and the W3C checks.

use super::*;

const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

fn ok(text: &str) -> Option<TraceContext> {
    parse(&Bytes::copy_from_slice(text.as_bytes())).unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn err(text: &str) -> TraceContextError {
    parse(&Bytes::copy_from_slice(text.as_bytes())).expect_err(text)
}

fn pair(c: Option<TraceContext>) -> (String, Option<String>) {
    let c = c.expect("a context");
    (
        String::from_utf8(c.traceparent.to_vec()).unwrap(),
        c.tracestate.map(|s| String::from_utf8(s.to_vec()).unwrap()),
    )
}

#[test]
fn empty_and_null_are_no_context() {
    assert_eq!(ok(""), None);
    assert_eq!(ok("  \n"), None);
    assert_eq!(ok("null"), None);
}

#[test]
fn a_bare_traceparent() {
    assert_eq!(pair(ok(TP)), (TP.into(), None));
    assert_eq!(pair(ok(&format!(" {TP}\n"))), (TP.into(), None));
}

#[test]
fn a_json_object() {
    let text = format!(
        r#"{{"traceparent": "{TP}", "tracestate": "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"}}"#
    );
    assert_eq!(
        pair(ok(&text)),
        (
            TP.into(),
            Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE".into())
        )
    );
    let text = format!(r#"{{"traceparent": "{TP}", "tracestate": null, "baggage": "x=1"}}"#);
    assert_eq!(pair(ok(&text)), (TP.into(), None));
    let text = format!(r#"{{"traceparent": "{TP}", "tracestate": ""}}"#);
    assert_eq!(pair(ok(&text)), (TP.into(), None));
    assert_eq!(
        err(r#"{"tracestate": "a=b"}"#),
        TraceContextError::MissingTraceparent
    );
    assert!(matches!(
        err(r#"{"traceparent": 12}"#),
        TraceContextError::Unreadable(_)
    ));
    assert!(matches!(err("{not json"), TraceContextError::Unreadable(_)));
}

#[test]
fn debezium_properties_text() {
    // As Properties.store writes it: a date comment, '=' escaped in values.
    let text = format!("#Mon Nov 30 02:04:20 UTC 2026\ntraceparent={TP}\ntracestate=rojo\\=00f067aa0ba902b7,congo\\=t61rcWkgMzE\n");
    assert_eq!(
        pair(ok(&text)),
        (
            TP.into(),
            Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE".into())
        )
    );
    // The other separators, CRLF, a continuation and a \u escape.
    let text = format!(
        "! comment\r\n  traceparent : {}\\\r\n   {}\r\ntracestate\\u003dx k=v\r\n",
        &TP[..20],
        &TP[20..]
    );
    let (tp, _) = pair(ok(&text));
    assert_eq!(tp, TP);
    let text = "#Mon Nov 30 02:04:20 UTC 2026\nuber-trace-id=abc\\:def\\:0\\:1\n";
    assert_eq!(err(text), TraceContextError::MissingTraceparent);
}

#[test]
fn properties_reader_follows_java() {
    let p = properties("a=1\nb : 2\nc 3\n\\ d\\=x=4\n# x=5\n e\\\n  f=6\nmulti=a\\\\\n");
    let p: Vec<(&str, &str)> = p.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(
        p,
        [
            ("a", "1"),
            ("b", "2"),
            ("c", "3"),
            (" d=x", "4"),
            ("ef", "6"),
            ("multi", "a\\")
        ]
    );
}

#[test]
fn invalid_traceparents_are_refused() {
    use TraceContextError::*;
    assert_eq!(
        err("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7"),
        Length(52)
    );
    assert_eq!(err(&format!("{TP}-00")), Length(58));
    assert_eq!(err(&TP.replacen("00", "ff", 1)), Version("ff".into()));
    assert_eq!(err(&TP.replacen("00", "0x", 1)), Version("0x".into()));
    assert_eq!(err(&TP.replace("4bf92f35", "4BF92F35")), Field("trace id"));
    assert_eq!(err(&TP.replace("00f067aa", "00f067ag")), Field("parent id"));
    assert_eq!(err(&TP.replace("-01", "-1z")), Field("trace flags"));
    assert_eq!(err(&TP.replace("-00f0", "_00f0")), Field("parent id"));
    assert_eq!(
        err("00-00000000000000000000000000000000-00f067aa0ba902b7-01"),
        ZeroTraceId
    );
    assert_eq!(
        err("00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"),
        ZeroParentId
    );
    assert!(matches!(err("garbage"), Length(7)));
}

#[test]
fn future_versions_follow_the_spec() {
    let v1 = TP.replacen("00", "01", 1);
    assert_eq!(pair(ok(&v1)).0, v1);
    assert_eq!(
        pair(ok(&format!("{v1}-what-comes"))).0,
        format!("{v1}-what-comes")
    );
    assert_eq!(err(&format!("{v1}x")), TraceContextError::Trailing);
}

#[test]
fn tracestate_follows_the_grammar() {
    let with = |ts: &str| format!(r#"{{"traceparent": "{TP}", "tracestate": "{ts}"}}"#);
    for good in [
        "rojo=00f067aa0ba902b7",
        "rojo=1, congo=2 ,,",
        "tenant1@vendor=x y",
        "a_b-c*d/e=~",
    ] {
        ok(&with(good));
    }
    for bad in [
        "rojo",
        "Rojo=1",
        "1abc=1",
        "rojo=",
        "rojo=a=b",
        "rojo=1,rojo=2",
        "t@toolongsystemid=1",
    ] {
        assert!(
            matches!(err(&with(bad)), TraceContextError::Tracestate(_)),
            "{bad}"
        );
    }
    let many: Vec<String> = (0..33).map(|i| format!("k{i}=v")).collect();
    assert!(matches!(
        err(&with(&many.join(","))),
        TraceContextError::Tracestate(_)
    ));
    let max: Vec<String> = (0..32).map(|i| format!("k{i}=v")).collect();
    ok(&with(&max.join(",")));
}
