//! Tests of topic templates, rule matching and header column resolution.

use crate::config::outbox::ColumnsConfig;
use crate::config::routing::*;

#[test]
fn template_parts() {
    assert_eq!(
        parse_template("a.${aggregate_type}.${column:tenant}-x").unwrap(),
        [
            TemplatePart::Literal("a."),
            TemplatePart::Role("aggregate_type"),
            TemplatePart::Literal("."),
            TemplatePart::Column("tenant"),
            TemplatePart::Literal("-x"),
        ]
    );
}

#[test]
fn first_matching_rule_wins() {
    let r = RoutingConfig {
        rules: vec![
            RoutingRule {
                event_type: Some("payment.completed".into()),
                topic: "payments".into(),
                ..Default::default()
            },
            RoutingRule {
                event_type_prefix: Some("payment.".into()),
                topic: "payments-other".into(),
                ..Default::default()
            },
            RoutingRule {
                aggregate_type: Some("order".into()),
                topic: "orders".into(),
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    assert_eq!(
        r.topic_template_for("payment.completed", "order"),
        "payments"
    );
    assert_eq!(
        r.topic_template_for("payment.failed", "order"),
        "payments-other"
    );
    assert_eq!(r.topic_template_for("order.created", "order"), "orders");
    assert_eq!(r.topic_template_for("user.created", "user"), DEFAULT_TOPIC);
}

#[test]
fn resolve_column_prefers_roles() {
    let c = ColumnsConfig::default();
    assert_eq!(resolve_column(&c, "key"), "aggregate_id");
    assert_eq!(resolve_column(&c, "tenant"), "tenant");
    assert_eq!(resolve_column(&c, "timestamp"), "timestamp");
}
