//! Which topic an event goes to: the `topic` column if set, else the first
//! matching rule's template, else `routing.topic`. Templates are compiled
//! once ([`TopicTemplate`]); rendered names are interned ([`TopicCache`]).

use std::sync::Arc;

use bytes::Bytes;

use crate::config::outbox::ColumnsConfig;
use crate::config::routing::{RoutingConfig, RoutingRule};
use crate::outbox::error::{
    MappingConfigError, MappingError, AGGREGATE_TYPE_SETTING, EVENT_TYPE_SETTING, TOPIC_SETTING,
};
use crate::outbox::event::ColumnValue;
use crate::outbox::fields::Fields;
use crate::outbox::topic::{TopicCache, TopicPart, TopicTemplate};

/// The routing settings, compiled.
#[derive(Debug)]
pub(super) struct Router {
    /// Slot of the `topic` column.
    column: Option<usize>,
    /// Slots of the columns rules match on, for errors.
    event_type: usize,
    aggregate_type: usize,
    default_topic: TopicTemplate,
    rules: Vec<(RoutingRule, TopicTemplate)>,
}

impl Router {
    /// Compiles `routing.topic` and then each rule's template; `slot_for`
    /// hands out the slots of the columns they use.
    pub(super) fn new(
        columns: &ColumnsConfig,
        routing: &RoutingConfig,
        column: Option<usize>,
        event_type: usize,
        aggregate_type: usize,
        mut slot_for: impl FnMut(&str) -> usize,
    ) -> Result<Router, MappingConfigError> {
        let mut compile = |key: String, template: &str| {
            TopicTemplate::compile(template, columns, &mut slot_for)
                .map_err(|reason| MappingConfigError::Invalid { key, reason })
        };
        let default_topic = compile("routing.topic".into(), &routing.topic)?;
        let rules = routing
            .rules
            .iter()
            .enumerate()
            .map(|(i, rule)| {
                let t = compile(format!("routing.rules[{i}].topic"), &rule.topic)?;
                Ok((rule.clone(), t))
            })
            .collect::<Result<Vec<_>, MappingConfigError>>()?;
        Ok(Router {
            column,
            event_type,
            aggregate_type,
            default_topic,
            rules,
        })
    }

    /// Which template a rule or the default gives these values: `Some(i)` for
    /// `routing.rules[i]`, `None` for `routing.topic`.
    #[cfg(test)]
    pub(super) fn rule_for(&self, event_type: &str, aggregate_type: &str) -> Option<usize> {
        self.rules
            .iter()
            .position(|(r, _)| r.matches(event_type, aggregate_type))
    }

    /// The `topic` column if set, else the first matching rule's template,
    /// else `routing.topic`. `scratch` is a reused buffer for rendering.
    pub(super) fn topic(
        &self,
        topics: &mut TopicCache,
        scratch: &mut Vec<u8>,
        f: &Fields<'_>,
        event_type: Option<&Bytes>,
        aggregate_type: Option<&Bytes>,
    ) -> Result<Arc<str>, MappingError> {
        let invalid = |name: &[u8], reason| MappingError::InvalidTopic {
            topic: String::from_utf8_lossy(name).into_owned(),
            reason,
        };
        if let Some(slot) = self.column {
            if let Some(name) = f.text(slot, TOPIC_SETTING, true)?.filter(|t| !t.is_empty()) {
                return topics.intern(name).map_err(|r| invalid(name, r));
            }
        }
        let template = self.template_for(f, event_type, aggregate_type)?;
        if let Some(fixed) = &template.fixed {
            return Ok(fixed.clone());
        }
        scratch.clear();
        for part in &template.parts {
            match part {
                TopicPart::Literal(l) => scratch.extend_from_slice(l.as_bytes()),
                TopicPart::Column { slot, placeholder } => match f.get(*slot) {
                    Some(ColumnValue::Text(v)) if !v.is_empty() => scratch.extend_from_slice(v),
                    _ => {
                        return Err(MappingError::TopicPlaceholder {
                            placeholder: placeholder.to_string(),
                        })
                    }
                },
            }
        }
        topics.intern(scratch).map_err(|r| invalid(scratch, r))
    }

    /// Which rule these values match: `Some(i)` for `routing.rules[i]`,
    /// `None` for none (whatever the `topic` column says).
    pub(super) fn rule_index(
        &self,
        f: &Fields<'_>,
        event_type: Option<&Bytes>,
        aggregate_type: Option<&Bytes>,
    ) -> Result<Option<usize>, MappingError> {
        if self.rules.is_empty() {
            return Ok(None);
        }
        let et = rule_text(f, event_type, self.event_type, EVENT_TYPE_SETTING)?;
        let at = rule_text(
            f,
            aggregate_type,
            self.aggregate_type,
            AGGREGATE_TYPE_SETTING,
        )?;
        Ok(self.rules.iter().position(|(r, _)| r.matches(et, at)))
    }

    fn template_for(
        &self,
        f: &Fields<'_>,
        event_type: Option<&Bytes>,
        aggregate_type: Option<&Bytes>,
    ) -> Result<&TopicTemplate, MappingError> {
        if self.rules.is_empty() {
            return Ok(&self.default_topic);
        }
        let et = rule_text(f, event_type, self.event_type, EVENT_TYPE_SETTING)?;
        let at = rule_text(
            f,
            aggregate_type,
            self.aggregate_type,
            AGGREGATE_TYPE_SETTING,
        )?;
        Ok(self
            .rules
            .iter()
            .find(|(r, _)| r.matches(et, at))
            .map_or(&self.default_topic, |(_, t)| t))
    }
}

/// A value rules match on, as text; NULL matches as "".
fn rule_text<'b>(
    f: &Fields<'_>,
    v: Option<&'b Bytes>,
    slot: usize,
    role: &str,
) -> Result<&'b str, MappingError> {
    match v {
        None => Ok(""),
        Some(b) => std::str::from_utf8(b).map_err(|_| MappingError::InvalidText {
            column: f.column(slot).to_string(),
            role: role.to_owned(),
        }),
    }
}
