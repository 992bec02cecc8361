//! Topic names: templates compiled once, Kafka's naming rules, and the cache
//! that turns a resolved name into a shared `Arc<str>` without allocating when
//! the topic repeats.

use std::collections::HashMap;
use std::sync::Arc;

use crate::config::outbox::ColumnsConfig;
use crate::config::routing::{parse_template, TemplatePart, MAX_TOPIC_LEN};

/// Distinct topics remembered before the cache is emptied. Templates usually
/// yield a handful; a per-row `topic` column could yield many, so it is bounded.
pub(crate) const MAX_CACHED_TOPICS: usize = 4096;

/// A part of a compiled template. Column references are indices into the
/// mapper's list of columns (its "slots").
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TopicPart {
    Literal(Box<str>),
    Column {
        slot: usize,
        /// As written in the template, e.g. `${aggregate_type}`, for errors.
        placeholder: Box<str>,
    },
}

/// A parsed topic template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TopicTemplate {
    pub parts: Vec<TopicPart>,
    /// The topic when the template has no placeholders.
    pub fixed: Option<Arc<str>>,
}

impl TopicTemplate {
    /// Parses `template`, turning each `${role}` and `${column:<name>}` into
    /// the slot `slot_for(column)` hands out. Errors are reasons to append to
    /// the config key.
    pub(crate) fn compile(
        template: &str,
        columns: &ColumnsConfig,
        mut slot_for: impl FnMut(&str) -> usize,
    ) -> Result<TopicTemplate, String> {
        let mut parts = Vec::new();
        for part in parse_template(template)? {
            parts.push(match part {
                TemplatePart::Literal(l) => TopicPart::Literal(l.into()),
                TemplatePart::Role(role) => {
                    let column = columns.column_for_role(role).ok_or_else(|| {
                        format!(
                            "uses ${{{role}}} but outbox.columns.{role} is empty; \
                             set that column or change the template"
                        )
                    })?;
                    TopicPart::Column {
                        slot: slot_for(column),
                        placeholder: format!("${{{role}}}").into(),
                    }
                }
                TemplatePart::Column(column) => TopicPart::Column {
                    slot: slot_for(column),
                    placeholder: format!("${{column:{column}}}").into(),
                },
            });
        }
        let fixed = if parts.iter().all(|p| matches!(p, TopicPart::Literal(_))) {
            check_topic_name(template.as_bytes())
                .map_err(|r| format!("`{template}` is not a valid Kafka topic name: {r}"))?;
            Some(Arc::from(template))
        } else {
            None
        };
        Ok(TopicTemplate { parts, fixed })
    }
}

/// Why a name is not a valid Kafka topic, or `Ok`. Kafka allows 1 to 249 of
/// ASCII letters, digits, `.`, `_` and `-`, except `.` and `..`.
pub(crate) fn check_topic_name(name: &[u8]) -> Result<(), String> {
    if name.is_empty() {
        return Err("it is empty".to_owned());
    }
    if name.len() > MAX_TOPIC_LEN {
        return Err(format!(
            "it is {} characters long; the limit is {MAX_TOPIC_LEN}",
            name.len()
        ));
    }
    if name == b"." || name == b".." {
        return Err("`.` and `..` are reserved".to_owned());
    }
    if let Some(&c) = name
        .iter()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-')))
    {
        let shown = if c.is_ascii_graphic() || c == b' ' {
            format!("`{}`", c as char)
        } else {
            format!("byte 0x{c:02x}")
        };
        return Err(format!(
            "it contains {shown}; only letters, digits, '.', '_' and '-' are allowed"
        ));
    }
    Ok(())
}

/// Resolved topic names to shared strings.
#[derive(Debug, Default)]
pub(crate) struct TopicCache {
    map: HashMap<Box<[u8]>, Arc<str>>,
}

impl TopicCache {
    /// The shared string for `name`, checking it on first sight. Invalid
    /// names are not cached, so each use reports the error.
    pub(crate) fn intern(&mut self, name: &[u8]) -> Result<Arc<str>, String> {
        if let Some(t) = self.map.get(name) {
            return Ok(t.clone());
        }
        check_topic_name(name)?;
        // ASCII, checked above.
        let topic: Arc<str> = Arc::from(std::str::from_utf8(name).map_err(|e| e.to_string())?);
        if self.map.len() >= MAX_CACHED_TOPICS {
            self.map.clear();
        }
        self.map.insert(name.into(), topic.clone());
        Ok(topic)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topic_names() {
        assert!(check_topic_name(b"outbox.event.payment").is_ok());
        assert!(check_topic_name(b"A_b-9").is_ok());
        assert!(check_topic_name(&[b'a'; 249]).is_ok());
        assert!(check_topic_name(&[b'a'; 250]).unwrap_err().contains("249"));
        assert!(check_topic_name(b"").is_err());
        assert!(check_topic_name(b".").is_err());
        assert!(check_topic_name(b"..").is_err());
        assert!(check_topic_name(b"...").is_ok());
        assert!(check_topic_name(b"a b").unwrap_err().contains("` `"));
        assert!(check_topic_name(b"a/b").unwrap_err().contains("`/`"));
        assert!(check_topic_name("zahlungsausgänge".as_bytes())
            .unwrap_err()
            .contains("0xc3"));
    }

    #[test]
    fn compiles_templates() {
        let columns = ColumnsConfig::default();
        let mut names = Vec::new();
        let t = TopicTemplate::compile("a.${aggregate_type}.${column:tenant}", &columns, |c| {
            names.push(c.to_owned());
            names.len() - 1
        })
        .unwrap();
        assert_eq!(names, ["aggregate_type", "tenant"]);
        assert_eq!(t.fixed, None);
        assert_eq!(
            t.parts[1],
            TopicPart::Column {
                slot: 0,
                placeholder: "${aggregate_type}".into()
            }
        );
        let fixed = TopicTemplate::compile("payments", &columns, |_| 0).unwrap();
        assert_eq!(fixed.fixed.as_deref(), Some("payments"));
        assert!(TopicTemplate::compile("x.${timestamp}", &columns, |_| 0)
            .unwrap_err()
            .contains("outbox.columns.timestamp"));
        assert!(TopicTemplate::compile("..", &columns, |_| 0).is_err());
        assert!(TopicTemplate::compile("a b", &columns, |_| 0).is_err());
    }

    #[test]
    fn cache_shares_strings() {
        let mut c = TopicCache::default();
        let a = c.intern(b"payments").unwrap();
        let b = c.intern(b"payments").unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(&*a, "payments");
        assert!(c.intern(b"bad topic").is_err());
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn cache_is_bounded() {
        let mut c = TopicCache::default();
        for i in 0..=MAX_CACHED_TOPICS {
            c.intern(format!("t{i}").as_bytes()).unwrap();
        }
        assert!(c.len() <= MAX_CACHED_TOPICS);
    }
}
