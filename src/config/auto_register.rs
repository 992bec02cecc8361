//! `routing.auto_register` and `routing.schema_file`: a local schema
//! registered under the route's subject when the relay starts, for
//! development (in production a team registers and evolves its schemas
//! itself, under the registry's compatibility rules).
//!
//! The file is read and parsed when the relay starts (and by `outboxd
//! check`), not here: the config is also loaded by commands that never use
//! it.

use crate::config::error::ConfigError;
use crate::config::outbox::ColumnsConfig;
use crate::config::routing::RoutingConfig;
use crate::config::value_format::{is_fixed_topic, parse_subject, SubjectPart, ValueEncoding};

pub(crate) fn validate(
    routing: &RoutingConfig,
    columns: &ColumnsConfig,
) -> Result<(), ConfigError> {
    if !routing.auto_register {
        if routing.schema_file.is_some() {
            return Err(ConfigError::invalid(
                "routing.schema_file",
                "is read only with routing.auto_register = true (development only); remove it \
                 or set routing.auto_register",
            ));
        }
        return Ok(());
    }
    match routing.value_format {
        ValueEncoding::Avro | ValueEncoding::JsonSchema => {}
        ValueEncoding::Json => {
            return Err(ConfigError::invalid(
                "routing.auto_register",
                "needs a registry value format (routing.value_format = \"avro\"); \"json\" uses \
                 no schema",
            ))
        }
        ValueEncoding::Framed => {
            return Err(ConfigError::invalid(
                "routing.auto_register",
                "cannot be used with routing.value_format = \"framed\": the producer that \
                 frames the rows registers their schema",
            ))
        }
    }
    if routing.schema_file.is_none() {
        return Err(ConfigError::invalid(
            "routing.schema_file",
            "must name the local schema file (.avsc or .json) that routing.auto_register = \
             true registers at start",
        ));
    }
    // Registered before the first event, so the subject must follow from
    // the config alone.
    let parts = parse_subject(&routing.subject)
        .map_err(|reason| ConfigError::invalid("routing.subject", reason))?;
    let fixed_topics = columns.column_for_role("topic").is_none()
        && std::iter::once(&routing.topic)
            .chain(routing.rules.iter().map(|r| &r.topic))
            .all(|t| is_fixed_topic(t));
    let per_event = parts.iter().any(|p| match p {
        SubjectPart::Literal(_) => false,
        SubjectPart::Topic => !fixed_topics,
        SubjectPart::Role(_) | SubjectPart::Column(_) => true,
    });
    if per_event {
        return Err(ConfigError::invalid(
            "routing.subject",
            format!(
                "`{}` varies per event, and routing.auto_register = true registers \
                 routing.schema_file at start: use a fixed subject (or ${{topic}} with fixed \
                 topics)",
                routing.subject
            ),
        ));
    }
    Ok(())
}
