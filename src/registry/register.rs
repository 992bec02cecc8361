//! `routing.auto_register`: the local schema file of a route registered
//! under its subjects when the relay starts (`POST
//! /subjects/{subject}/versions`), before the subjects' schemas are read.
//! For development: registering the same schema again is answered with its
//! existing id, a changed file becomes a new version if the subject's
//! compatibility level allows it.

use bytes::Bytes;
use hyper::StatusCode;
use percent_encoding::utf8_percent_encode;
use serde::Deserialize;

use super::{count, RegistryError, SchemaRegistry, PATH_SEGMENT};
use crate::config::value_format::{render_fixed_subject, ValueEncoding};
use crate::config::{OutboxTable, RoutingConfig};
use crate::outbox::avro::AvroSchema;

/// A route's schema file, read and parsed.
pub(crate) struct SchemaFile {
    /// As given in `routing.schema_file`, for messages.
    pub(crate) path: String,
    /// The schema text, sent as it is.
    text: String,
    /// `schemaType` for the registry; `None` = Avro (the default).
    schema_type: Option<&'static str>,
}

/// `routing.schema_file` of a route with `auto_register`, read and parsed
/// as the route's value format; `None` without `auto_register`.
pub(crate) fn read_schema_file(
    routing: &RoutingConfig,
) -> Result<Option<SchemaFile>, RegistryError> {
    let Some(path) = routing
        .schema_file
        .as_ref()
        .filter(|_| routing.auto_register)
    else {
        return Ok(None);
    };
    let shown = path.display().to_string();
    let err = |reason: String| RegistryError::Config {
        key: "routing.schema_file",
        reason: format!("{shown}: {reason}"),
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(format!("cannot be read: {e}")))?;
    let schema_type = match routing.value_format {
        ValueEncoding::Avro => {
            AvroSchema::parse(&text).map_err(|e| err(format!("is not an Avro schema: {e}")))?;
            None
        }
        _ => {
            serde_json::from_str::<serde_json::Value>(&text)
                .map_err(|e| err(format!("is not JSON: {e}")))?;
            Some("JSON")
        }
    };
    Ok(Some(SchemaFile {
        path: shown,
        text,
        schema_type,
    }))
}

/// `POST /subjects/{subject}/versions`'s answer.
#[derive(Deserialize)]
struct Registered {
    id: u32,
}

impl SchemaRegistry {
    /// Registers `file` under `subject`; its schema id.
    pub(crate) async fn register(
        &mut self,
        subject: &str,
        file: &SchemaFile,
    ) -> Result<u32, RegistryError> {
        let path = format!(
            "/subjects/{}/versions",
            utf8_percent_encode(subject, PATH_SEGMENT)
        );
        let mut body = serde_json::json!({ "schema": file.text });
        if let Some(t) = file.schema_type {
            body["schemaType"] = t.into();
        }
        let answer = self
            .http
            .post(&path, Bytes::from(body.to_string()))
            .await
            .inspect_err(|_| count("unavailable"))?;
        let refused = |answer: &super::client::Answer| RegistryError::NotRegistered {
            url: answer.url.clone(),
            subject: subject.to_owned(),
            file: file.path.clone(),
            status: answer.status,
            body: String::from_utf8_lossy(&answer.body[..answer.body.len().min(300)]).into_owned(),
        };
        match answer.status {
            StatusCode::OK => {
                count("ok");
                serde_json::from_slice::<Registered>(&answer.body)
                    .map(|r| r.id)
                    .map_err(|_| refused(&answer))
            }
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                count("unauthorized");
                Err(RegistryError::Unauthorized {
                    url: answer.url,
                    status: answer.status,
                })
            }
            _ => {
                count("error");
                Err(refused(&answer))
            }
        }
    }

    /// Registers the schema file of every table with `routing.auto_register`
    /// under each subject its routing can send to.
    pub(crate) async fn auto_register(
        &mut self,
        tables: &[OutboxTable],
    ) -> Result<(), RegistryError> {
        for t in tables {
            let Some(file) = read_schema_file(&t.routing)? else {
                continue;
            };
            for subject in subjects(&t.routing) {
                let id = self.register(&subject, &file).await?;
                tracing::warn!(
                    %subject,
                    schema_id = id,
                    file = %file.path,
                    "registered routing.schema_file (routing.auto_register = true: for \
                     development only)"
                );
            }
        }
        Ok(())
    }
}

/// The subjects a route with `auto_register` can send to: `routing.subject`
/// for `routing.topic` and each rule's topic (config validation keeps them
/// fixed), whatever the registry value format.
pub(super) fn subjects(routing: &RoutingConfig) -> Vec<String> {
    let mut subjects: Vec<String> = std::iter::once(&routing.topic)
        .chain(routing.rules.iter().map(|r| &r.topic))
        .map(|t| render_fixed_subject(&routing.subject, t))
        .collect();
    subjects.sort();
    subjects.dedup();
    subjects
}
