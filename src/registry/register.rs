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
use crate::config::auto_register::{schema_file_routes, SchemaFileRoute};
use crate::config::value_format::ValueEncoding;
use crate::config::{OutboxTable, RoutingConfig};
use crate::outbox::avro::AvroSchema;

/// A route's schema file, read and parsed, and the subject it goes under.
pub(crate) struct SchemaFile {
    pub(crate) subject: String,
    /// As given in the config, for messages.
    pub(crate) path: String,
    /// The key that names it (`routing.schema_file` or
    /// `routing.rules[i].schema_file`), for messages.
    pub(crate) key: String,
    /// The schema text, sent as it is.
    text: String,
    /// `schemaType` for the registry; `None` = Avro (the default).
    pub(super) schema_type: Option<&'static str>,
}

/// The schema files of a routing with `auto_register`, one per subject,
/// each read and parsed as its route's value format; empty without
/// `auto_register`.
pub(crate) fn read_schema_files(routing: &RoutingConfig) -> Result<Vec<SchemaFile>, RegistryError> {
    schema_file_routes(routing)
        .into_iter()
        .map(read_schema_file)
        .collect()
}

fn read_schema_file(route: SchemaFileRoute<'_>) -> Result<SchemaFile, RegistryError> {
    let shown = route.path.display().to_string();
    let err = |reason: String| RegistryError::Config {
        key: route.key.clone(),
        reason: format!("{shown}: {reason}"),
    };
    let text =
        std::fs::read_to_string(route.path).map_err(|e| err(format!("cannot be read: {e}")))?;
    let schema_type = match route.encoding {
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
    Ok(SchemaFile {
        subject: route.subject,
        path: shown,
        key: route.key,
        text,
        schema_type,
    })
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
            file: format!("{} {}", file.key, file.path),
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

    /// Registers the schema files of every table with
    /// `routing.auto_register`, each under its route's subject.
    pub(crate) async fn auto_register(
        &mut self,
        tables: &[OutboxTable],
    ) -> Result<(), RegistryError> {
        for t in tables {
            for file in read_schema_files(&t.routing)? {
                let id = self.register(&file.subject, &file).await?;
                tracing::warn!(
                    subject = %file.subject,
                    schema_id = id,
                    file = %file.path,
                    key = %file.key,
                    "registered routing.schema_file (routing.auto_register = true: for \
                     development only)"
                );
            }
        }
        Ok(())
    }
}
