//! The schema registry: the schemas of the registry value formats, fetched
//! over Confluent's REST API and cached by id and by subject/version, so that
//! in steady state no event costs a request (the
//! `outboxd_schema_registry_requests_total` metric counts them all).
//!
//! At the level of `sink` (I/O toward an outside service); what it fetches is
//! handed to the pure mapping in `outbox::avro` as parsed schemas.

mod client;
mod error;
mod register;
#[cfg(test)]
mod tests;
mod tls;

use std::collections::HashMap;
use std::sync::Arc;

use hyper::StatusCode;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};
use serde::Deserialize;

use crate::config::value_format::SchemaVersion;
use crate::config::{OutboxTable, SchemaRegistryConfig};
use crate::metrics::{SCHEMA_CACHE_ENTRIES, SCHEMA_REGISTRY_REQUESTS};
use crate::outbox::registered::{FramedSchema, RegisteredSchema, SchemaKind, SchemaSet};
use crate::outbox::registry_subjects;

pub use error::RegistryError;
pub(crate) use register::read_schema_files;

/// What a subject keeps as is in a URL path: RFC 3986's unreserved
/// characters; anything else (`/`, `:`, spaces, ...) is percent-encoded.
const PATH_SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// The `outcome` labels of `outboxd_schema_registry_requests_total`.
pub(crate) const OUTCOMES: [&str; 5] = ["ok", "not_found", "unauthorized", "error", "unavailable"];

/// `GET /subjects/{subject}/versions/{version}`.
#[derive(Deserialize)]
struct SubjectVersion {
    subject: String,
    version: u32,
    id: u32,
    schema: String,
    /// Absent for Avro (the registries' default); `JSON` for JSON Schema.
    #[serde(rename = "schemaType")]
    schema_type: Option<String>,
}

/// The registry and what it has answered so far.
pub struct SchemaRegistry {
    http: client::HttpClient,
    by_id: HashMap<u32, Arc<RegisteredSchema>>,
    by_version: HashMap<(String, u32), Arc<RegisteredSchema>>,
    /// Ids found by [`has_schema_id`](Self::has_schema_id) (their schemas
    /// are not parsed: a framed payload is sent as it is).
    ids_seen: HashMap<u32, FramedSchema>,
}

impl SchemaRegistry {
    pub fn new(config: &SchemaRegistryConfig) -> Result<SchemaRegistry, RegistryError> {
        Ok(SchemaRegistry {
            http: client::HttpClient::new(config)?,
            by_id: HashMap::new(),
            by_version: HashMap::new(),
            ids_seen: HashMap::new(),
        })
    }

    /// Schemas cached (by id).
    pub fn cached(&self) -> usize {
        self.by_id.len()
    }

    /// The subject's schema at `version`; a pinned version already fetched
    /// costs no request. `latest` always asks (it is asked at start, and
    /// again only when a payload does not fit).
    pub(crate) async fn resolve(
        &mut self,
        subject: &str,
        version: SchemaVersion,
    ) -> Result<Arc<RegisteredSchema>, RegistryError> {
        if let SchemaVersion::Number(n) = version {
            if let Some(s) = self.by_version.get(&(subject.to_owned(), n)) {
                return Ok(s.clone());
            }
        }
        let path = format!(
            "/subjects/{}/versions/{version}",
            utf8_percent_encode(subject, PATH_SEGMENT)
        );
        let answer = self
            .http
            .get(&path)
            .await
            .inspect_err(|_| count("unavailable"))?;
        match answer.status {
            StatusCode::OK => count("ok"),
            StatusCode::NOT_FOUND => {
                count("not_found");
                // Confluent's error codes: 40401 subject, 40402 version.
                let code = serde_json::from_slice::<serde_json::Value>(&answer.body)
                    .ok()
                    .and_then(|v| v["error_code"].as_u64());
                let url = answer.url.trim_end_matches('/').to_owned();
                return Err(match code {
                    Some(40402) => RegistryError::VersionNotFound {
                        url,
                        subject: subject.to_owned(),
                        version,
                    },
                    _ => RegistryError::SubjectNotFound {
                        url,
                        subject: subject.to_owned(),
                    },
                });
            }
            _ => return Err(failed(answer, format!("GET {path}"))),
        }
        let found: SubjectVersion =
            serde_json::from_slice(&answer.body).map_err(|e| RegistryError::Unexpected {
                url: answer.url.clone(),
                what: format!("GET {path}"),
                status: answer.status,
                body: format!("not a subject version: {e}"),
            })?;
        let bad = |reason: String| RegistryError::BadSchema {
            subject: found.subject.clone(),
            version: found.version,
            id: found.id,
            reason,
        };
        let schema = match self.by_id.get(&found.id) {
            Some(s) if s.subject == found.subject && s.version == found.version => s.clone(),
            _ => {
                let schema =
                    SchemaKind::parse(found.schema_type.as_deref(), &found.schema).map_err(bad)?;
                Arc::new(RegisteredSchema {
                    id: found.id,
                    subject: found.subject.clone(),
                    version: found.version,
                    schema,
                    url: answer.url.trim_end_matches('/').to_owned(),
                })
            }
        };
        self.by_id.insert(found.id, schema.clone());
        self.by_version
            .insert((found.subject.clone(), found.version), schema.clone());
        metrics::gauge!(SCHEMA_CACHE_ENTRIES).set(self.by_id.len() as f64);
        Ok(schema)
    }

    /// A compatibility level (`BACKWARD`, `NONE`, ...): the subject's own,
    /// or the registry's global one with `None`. `Ok(None)` when the
    /// subject has no level of its own (Confluent's 40408), so the global
    /// one applies.
    pub(crate) async fn compatibility(
        &mut self,
        subject: Option<&str>,
    ) -> Result<Option<String>, RegistryError> {
        let path = match subject {
            Some(s) => format!("/config/{}", utf8_percent_encode(s, PATH_SEGMENT)),
            None => "/config".to_owned(),
        };
        let answer = self
            .http
            .get(&path)
            .await
            .inspect_err(|_| count("unavailable"))?;
        match answer.status {
            StatusCode::OK => {
                count("ok");
                let body: serde_json::Value =
                    serde_json::from_slice(&answer.body).unwrap_or_default();
                // Confluent answers `compatibilityLevel`; some registries
                // `compatibility`.
                Ok(body["compatibilityLevel"]
                    .as_str()
                    .or_else(|| body["compatibility"].as_str())
                    .map(str::to_owned))
            }
            StatusCode::NOT_FOUND if subject.is_some() => {
                count("not_found");
                Ok(None)
            }
            _ => Err(failed(answer, format!("GET {path}"))),
        }
    }

    /// Whether the registry has a schema with `id` (`GET /schemas/ids/{id}`),
    /// for framed payloads, with its content type and URL: `Ok(Err(url))`
    /// when the registry at `url` answered it has none. An id found once
    /// costs no more requests.
    pub(crate) async fn has_schema_id(
        &mut self,
        id: u32,
    ) -> Result<Result<FramedSchema, String>, RegistryError> {
        if let Some(s) = self.by_id.get(&id) {
            return Ok(Ok(FramedSchema::new(
                id,
                Some(s.schema.type_name()),
                &s.url,
            )));
        }
        if let Some(s) = self.ids_seen.get(&id) {
            return Ok(Ok(s.clone()));
        }
        let path = format!("/schemas/ids/{id}");
        let answer = self
            .http
            .get(&path)
            .await
            .inspect_err(|_| count("unavailable"))?;
        let url = answer.url.trim_end_matches('/').to_owned();
        match answer.status {
            StatusCode::OK => {
                count("ok");
                let body: serde_json::Value =
                    serde_json::from_slice(&answer.body).unwrap_or_default();
                let found = FramedSchema::new(id, body["schemaType"].as_str(), &url);
                self.ids_seen.insert(id, found.clone());
                Ok(Ok(found))
            }
            StatusCode::NOT_FOUND => {
                count("not_found");
                Ok(Err(url))
            }
            _ => Err(failed(answer, format!("GET {path}"))),
        }
    }

    /// The schemas every table's routing names, fetched now (for the relay's
    /// start); empty when no table uses a registry value format.
    pub(crate) async fn schemas_for(
        &mut self,
        tables: &[OutboxTable],
    ) -> Result<SchemaSet, RegistryError> {
        let mut set = SchemaSet::new();
        for t in tables {
            for subject in registry_subjects(&t.routing, &t.columns) {
                if let std::collections::hash_map::Entry::Vacant(slot) = set.entry(subject) {
                    let schema = self.resolve(slot.key(), t.routing.schema_version).await?;
                    tracing::info!(
                        subject = %slot.key(),
                        version = schema.version,
                        schema_id = schema.id,
                        "schema from the registry"
                    );
                    slot.insert(schema);
                }
            }
        }
        Ok(set)
    }
}

/// The subjects of the routes that follow `routing.schema_version =
/// "latest"`: read again for a newer version while the relay runs.
pub(crate) fn latest_subjects(tables: &[OutboxTable]) -> Vec<String> {
    let mut subjects: Vec<String> = tables
        .iter()
        .filter(|t| t.routing.schema_version == SchemaVersion::Latest)
        .flat_map(|t| registry_subjects(&t.routing, &t.columns))
        .collect();
    subjects.sort();
    subjects.dedup();
    subjects
}

/// An answer that is neither what was asked for nor a "not found" the
/// caller reads: counted, and the error that names it.
fn failed(answer: client::Answer, what: String) -> RegistryError {
    match answer.status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
            count("unauthorized");
            RegistryError::Unauthorized {
                url: answer.url,
                status: answer.status,
            }
        }
        status => {
            count("error");
            RegistryError::Unexpected {
                url: answer.url,
                what,
                status,
                body: String::from_utf8_lossy(&answer.body[..answer.body.len().min(300)])
                    .into_owned(),
            }
        }
    }
}

fn count(outcome: &'static str) {
    metrics::counter!(SCHEMA_REGISTRY_REQUESTS, "outcome" => outcome).increment(1);
}
