//! Why the registry could not give a schema: shared by the registry's cache
//! and its HTTP client.

use hyper::StatusCode;

use crate::config::value_format::SchemaVersion;

/// Why the registry could not give a schema.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("{key}: {reason}")]
    Config { key: String, reason: String },
    /// Cannot connect, times out, or answers 5xx: worth retrying.
    #[error("the schema registry at {url} cannot be reached: {reason}")]
    Unavailable { url: String, reason: String },
    /// TLS refused for a reason a retry does not fix; `reason` names the
    /// settings.
    #[error("TLS with the schema registry at {url} ({key}): {reason}")]
    Tls {
        url: String,
        key: &'static str,
        reason: String,
    },
    #[error(
        "the schema registry at {url} refused the request ({status}): check \
         schema_registry.username and schema_registry.password"
    )]
    Unauthorized { url: String, status: StatusCode },
    #[error(
        "subject `{subject}` does not exist in the schema registry at {url} (routing.subject); \
         register its schema first, e.g.: curl -X POST -H 'Content-Type: \
         application/vnd.schemaregistry.v1+json' --data '{{\"schema\": \"<the schema as an \
         escaped JSON string>\"}}' {url}/subjects/{subject}/versions (for a JSON Schema, add \
         \"schemaType\": \"JSON\" beside \"schema\"; Avro is the default)"
    )]
    SubjectNotFound { url: String, subject: String },
    #[error(
        "subject `{subject}` has no version {version} in the schema registry at {url} \
         (routing.schema_version)"
    )]
    VersionNotFound {
        url: String,
        subject: String,
        version: SchemaVersion,
    },
    #[error("subject `{subject}` version {version} (schema id {id}): {reason}")]
    BadSchema {
        subject: String,
        version: u32,
        id: u32,
        reason: String,
    },
    /// `routing.auto_register`: the registry would not take the file.
    #[error(
        "the schema registry at {url} refused to register {file} under subject `{subject}` \
         ({status}): {body}"
    )]
    NotRegistered {
        url: String,
        subject: String,
        /// The key that names the file, then its path.
        file: String,
        status: StatusCode,
        body: String,
    },
    #[error("the schema registry at {url} answered {status} to {what}: {body}")]
    Unexpected {
        url: String,
        what: String,
        status: StatusCode,
        body: String,
    },
}

impl RegistryError {
    /// The subject's own fault (missing, without the version asked for, or
    /// a schema that does not parse): the error of the event that needs it,
    /// which follows `relay.on_error`; any other is the registry's.
    pub(crate) fn is_subjects_fault(&self) -> bool {
        matches!(
            self,
            RegistryError::SubjectNotFound { .. }
                | RegistryError::VersionNotFound { .. }
                | RegistryError::BadSchema { .. }
        )
    }

    /// Worth asking again later (the registry is down or overloaded).
    pub fn is_retryable(&self) -> bool {
        matches!(self, RegistryError::Unavailable { .. })
    }
}
