//! `routing.format` and `[routing.cloudevents]`: whether records are plain
//! outbox records or CloudEvents 1.0.2 in one of the Kafka protocol
//! binding's two content modes, and the attributes that are configured
//! rather than read from the row.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::config::error::ConfigError;
use crate::config::outbox::ColumnsConfig;

/// `datacontenttype` (the `content-type` header in binary mode) when
/// `routing.cloudevents.data_content_type` is not set: outbox payloads are
/// JSON.
pub(crate) const DEFAULT_DATA_CONTENT_TYPE: &str = "application/json";

/// Context attributes of CloudEvents 1.0.2 (required and optional), which an
/// extension may not reuse, and `data`/`data_base64`, the JSON format's
/// members for the data. `partitionkey` is the Kafka binding's partitioning
/// extension, carried by the record key (the aggregate id) already.
const RESERVED_NAMES: [&str; 11] = [
    "specversion",
    "id",
    "source",
    "type",
    "datacontenttype",
    "dataschema",
    "subject",
    "time",
    "data",
    "data_base64",
    "partitionkey",
];

/// How an event is laid out in its Kafka record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EventFormat {
    /// The outbox record as Debezium's router makes it: the payload (or the
    /// envelope) as the value, metadata in `id`/`eventType`/... headers.
    #[default]
    Plain,
    /// A CloudEvent in binary content mode: attributes in `ce_*` headers,
    /// the payload as the value, unchanged.
    CloudeventsBinary,
    /// A CloudEvent in structured content mode: one
    /// `application/cloudevents+json` value with the payload as `data`.
    CloudeventsStructured,
}

impl EventFormat {
    pub(crate) fn is_cloudevents(self) -> bool {
        self != EventFormat::Plain
    }
}

/// `[routing.cloudevents]`: used by the two CloudEvents formats.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CloudEventsConfig {
    /// `source` of every event of the table; "" = the default,
    /// `/outboxd/<database>/<schema>.<table>`.
    pub source: String,
    /// `datacontenttype`; "" = `application/json`.
    pub data_content_type: String,
    /// Extension attribute name -> column role or column name.
    pub extensions: BTreeMap<String, String>,
}

impl CloudEventsConfig {
    /// The `datacontenttype` of the events.
    pub(crate) fn data_content_type(&self) -> &str {
        Some(self.data_content_type.as_str())
            .filter(|t| !t.is_empty())
            .unwrap_or(DEFAULT_DATA_CONTENT_TYPE)
    }

    pub(crate) fn validate(
        &self,
        format: EventFormat,
        columns: &ColumnsConfig,
    ) -> Result<(), ConfigError> {
        if !format.is_cloudevents() {
            if let Some(key) = [
                (!self.source.is_empty()).then_some("routing.cloudevents.source"),
                (!self.extensions.is_empty()).then_some("routing.cloudevents.extensions"),
                (!self.data_content_type.is_empty())
                    .then_some("routing.cloudevents.data_content_type"),
                columns
                    .column_for_role("ce_extensions")
                    .map(|_| "outbox.columns.ce_extensions"),
            ]
            .into_iter()
            .flatten()
            .next()
            {
                return Err(ConfigError::invalid(
                    key,
                    "is used only by the CloudEvents formats; set routing.format = \
                     \"cloudevents-binary\" or \"cloudevents-structured\", or remove it",
                ));
            }
            return Ok(());
        }
        if self.source.chars().any(char::is_whitespace) {
            return Err(ConfigError::invalid(
                "routing.cloudevents.source",
                format!(
                    "`{}` is not a URI reference (it has white space); percent-encode it, \
                     e.g. /billing/outbox%20events",
                    self.source
                ),
            ));
        }
        if self.data_content_type.contains(['\r', '\n']) {
            return Err(ConfigError::invalid(
                "routing.cloudevents.data_content_type",
                "must be one media type, e.g. \"application/json\"",
            ));
        }
        for (name, column) in &self.extensions {
            let key = format!("routing.cloudevents.extensions.{name}");
            check_extension_name(name).map_err(|r| ConfigError::invalid(&key, r))?;
            if column.is_empty() {
                return Err(ConfigError::invalid(
                    key,
                    "must name a column role or a column; remove the entry to drop the attribute",
                ));
            }
        }
        Ok(())
    }
}

/// The CloudEvents 1.0.2 rule for an extension attribute's name: lower-case
/// ASCII letters and digits only, not one of the spec's own attribute names
/// (nor `data`, `data_base64`, or `partitionkey`, which the record key
/// carries). Names over 20 characters are allowed: the spec only advises
/// against them.
pub(crate) fn check_extension_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("an extension attribute needs a name".into());
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    {
        return Err(format!(
            "`{}` is not a CloudEvents attribute name: only lower-case letters a-z and digits \
             0-9 are allowed",
            name.escape_debug()
        ));
    }
    if RESERVED_NAMES.contains(&name) {
        return Err(format!(
            "`{name}` is a CloudEvents context attribute (or the record key's partitionkey) \
             that outboxd sets; give the extension another name"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extension_names_follow_the_spec() {
        for good in [
            "tenant",
            "comexampleext1",
            "x",
            "a1b2",
            "averyveryverylongextensionname",
        ] {
            assert_eq!(check_extension_name(good), Ok(()), "{good}");
        }
        for bad in [
            "",
            "Tenant",
            "tenant_id",
            "tenant-id",
            "té",
            "a b",
            "id",
            "time",
            "data",
            "partitionkey",
        ] {
            assert!(check_extension_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn cloudevents_keys_need_a_cloudevents_format() {
        let ce = CloudEventsConfig {
            source: "/x".into(),
            ..Default::default()
        };
        let e = ce
            .validate(EventFormat::Plain, &ColumnsConfig::default())
            .unwrap_err();
        assert_eq!(e.key(), Some("routing.cloudevents.source"));
        ce.validate(EventFormat::CloudeventsBinary, &ColumnsConfig::default())
            .unwrap();
        let columns = ColumnsConfig {
            ce_extensions: "ext".into(),
            ..Default::default()
        };
        let e = CloudEventsConfig::default()
            .validate(EventFormat::Plain, &columns)
            .unwrap_err();
        assert_eq!(e.key(), Some("outbox.columns.ce_extensions"));
    }

    #[test]
    fn bad_extension_names_name_their_key() {
        let ce = CloudEventsConfig {
            extensions: [("Tenant".to_owned(), "tenant".to_owned())].into(),
            ..Default::default()
        };
        let e = ce
            .validate(
                EventFormat::CloudeventsStructured,
                &ColumnsConfig::default(),
            )
            .unwrap_err();
        assert_eq!(e.key(), Some("routing.cloudevents.extensions.Tenant"));
        assert!(e.to_string().contains("lower-case"), "{e}");
    }
}
