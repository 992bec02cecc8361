//! The schema registry's checks, for tables with a registry value format:
//! the registry answers and takes the credentials (`registry`); per route
//! the subject, the schema id and version the relay would use, whether the
//! schema parses, and the subject's compatibility level (`schema`). With
//! `--sample N`, the newest N rows of each outbox table are mapped and
//! encoded as the relay would, nothing sent, and the rows that would fail
//! are listed with the reason (`sample`).

use std::collections::VecDeque;

use tokio_postgres::Client;

use super::line::{Line, Verdict};
use crate::config::{Config, OutboxTable};
use crate::outbox::mapper::MappingError;
use crate::outbox::registered::SchemaSet;
use crate::outbox::{registry_subjects, KafkaRecord, OutboxEvent, RecordMapper};
use crate::registry::{read_schema_files, RegistryError, SchemaRegistry};
use crate::source::outbox_rows::{ReadOptions, RowReader};

/// The registry's lines, and the schemas fetched (for the sample); `None`
/// when the registry is not usable. No lines when no table needs it.
pub(super) async fn check(cfg: &Config) -> (Vec<Line>, Option<SchemaSet>) {
    let tables = cfg.tables();
    if !tables.iter().any(|t| t.routing.uses_registry()) {
        return (Vec::new(), Some(SchemaSet::new()));
    }
    let reg = &cfg.schema_registry;
    let mut registry = match SchemaRegistry::new(reg) {
        Ok(r) => r,
        Err(e) => return (vec![Line::fail("registry", e)], None),
    };
    let mut lines = Vec::new();
    // The global level asks the registry something every registry answers,
    // with the credentials: reachable, and the credentials work.
    let global = match registry.compatibility(None).await {
        Ok(level) => {
            let auth = match &reg.username {
                Some(u) => format!("credentials of {u:?} accepted"),
                None => "no credentials configured".to_owned(),
            };
            lines.push(Line::ok(
                "registry",
                format!(
                    "{} answers, {auth}; global compatibility {}",
                    reg.urls().join(", "),
                    level.as_deref().unwrap_or("(not reported)")
                ),
            ));
            level
        }
        Err(e) => {
            lines.push(Line::fail("registry", unusable(&e)));
            lines.push(Line::skip(
                "schema",
                "the registry is not usable (see registry)",
            ));
            return (lines, None);
        }
    };
    let mut schemas = SchemaSet::new();
    let mut usable = true;
    for t in &tables {
        // `routing.auto_register`: what `run` would register (nothing is
        // registered here).
        let files = match read_schema_files(&t.routing) {
            Ok(f) => f,
            Err(e) => {
                usable = false;
                lines.push(Line::fail("schema", format!("{}: {e}", t.table)));
                continue;
            }
        };
        for subject in registry_subjects(&t.routing, &t.columns) {
            let version = t.routing.schema_version;
            let file = files.iter().find(|f| f.subject == subject);
            if let Some(f) = file {
                lines.push(Line::warn(
                    "register",
                    format!(
                        "{}: `outboxd run` would register {} ({}) under subject `{subject}` \
                         at start ({}.auto_register = true: for development only)",
                        t.table, f.path, f.key, t.routing_key
                    ),
                ));
            }
            let line = match registry.resolve(&subject, version).await {
                Ok(schema) => {
                    let level = match registry.compatibility(Some(&subject)).await {
                        Ok(Some(own)) => format!("{own} (the subject's own)"),
                        Ok(None) => format!(
                            "{} (the global level)",
                            global.as_deref().unwrap_or("not reported")
                        ),
                        Err(e) => format!("unknown ({e})"),
                    };
                    let line = Line::ok(
                        "schema",
                        format!(
                            "{} -> subject `{subject}` ({}.schema_version = {version}): schema \
                             id {}, version {}, parses ({} schema); compatibility {level}",
                            t.table,
                            t.routing_key,
                            schema.id,
                            schema.version,
                            schema.schema.type_name()
                        ),
                    );
                    schemas.insert(subject, schema);
                    line
                }
                // Registered by `run` before it reads the subject.
                Err(RegistryError::SubjectNotFound { .. }) if file.is_some() => {
                    usable = false;
                    Line::skip(
                        "schema",
                        &format!(
                            "{}: subject `{subject}` does not exist yet; `outboxd run` \
                             registers it (see register)",
                            t.table
                        ),
                    )
                }
                Err(e) => {
                    usable = false;
                    Line::fail("schema", format!("{}: {}", t.table, unusable(&e)))
                }
            };
            lines.push(line);
        }
    }
    (lines, usable.then_some(schemas))
}

/// An error that stops the registry's checks, with the fix.
fn unusable(e: &RegistryError) -> String {
    match e {
        RegistryError::Unavailable { .. } => format!(
            "{e}; check schema_registry.url, that the registry runs, and \
             schema_registry.request_timeout"
        ),
        e => e.to_string(),
    }
}

/// The newest `n` rows of each table mapped and encoded with `schemas`:
/// one line per table, listing every row that would fail. Subjects that
/// vary per event and the schema ids `framed` rows name are asked of the
/// registry as the relay would.
pub(super) async fn sample(
    client: &Client,
    cfg: &Config,
    schemas: &SchemaSet,
    n: usize,
) -> Vec<Line> {
    let tables = cfg.tables();
    let mut registry = if tables.iter().any(|t| t.routing.uses_registry()) {
        match SchemaRegistry::new(&cfg.schema_registry) {
            Ok(r) => Some(r),
            Err(e) => return vec![Line::fail("sample", e)],
        }
    } else {
        None
    };
    let mut lines = Vec::new();
    for t in &tables {
        lines.push(
            match sample_table(client, t, schemas, registry.as_mut(), n).await {
                Ok(line) => line,
                Err(e) => Line::fail("sample", format!("{}: {e}", t.table)),
            },
        );
    }
    lines
}

async fn sample_table(
    client: &Client,
    t: &OutboxTable,
    schemas: &SchemaSet,
    mut registry: Option<&mut SchemaRegistry>,
    n: usize,
) -> Result<Line, String> {
    let mut mapper = RecordMapper::with_schemas(&t.columns, &t.routing, &t.ce_source(), schemas)
        .map_err(|e| e.to_string())?;
    let rows = newest_rows(client, t, n).await?;
    let mut failures = Vec::new();
    for event in &rows {
        if let Err(e) = map_asking(&mut mapper, registry.as_deref_mut(), event).await? {
            let (_, id) = mapper.key_and_id(event);
            let id = id.map_or_else(
                || "(no id)".to_owned(),
                |b| String::from_utf8_lossy(&b).into_owned(),
            );
            failures.push(format!("id {id}: {e}"));
        }
    }
    let what = format!(
        "{}: the newest {} row(s), encoded as `outboxd run` would (nothing sent)",
        t.table,
        rows.len()
    );
    Ok(if failures.is_empty() {
        Line::ok("sample", format!("{what}: all encode"))
    } else {
        Line::new(
            Verdict::Fail,
            "sample",
            format!(
                "{what}: {} would fail (relay.on_error applies to each):\n{}",
                failures.len(),
                failures.join("\n")
            ),
        )
    })
}

/// The event mapped as the relay maps it: a subject or schema id met for
/// the first time is asked of the registry, then remembered. `Err` when the
/// registry cannot answer.
async fn map_asking(
    mapper: &mut RecordMapper,
    mut registry: Option<&mut SchemaRegistry>,
    event: &OutboxEvent,
) -> Result<Result<KafkaRecord, MappingError>, String> {
    loop {
        let mapped = mapper.map(event);
        let Some(registry) = registry.as_deref_mut() else {
            return Ok(mapped);
        };
        match mapped {
            Err(MappingError::SchemaIdUnchecked { event_id, id }) => {
                match registry.has_schema_id(id).await.map_err(|e| unusable(&e))? {
                    Ok(schema) => mapper.learn_schema_id(id, schema),
                    Err(url) => {
                        return Ok(Err(MappingError::UnknownSchemaId { event_id, id, url }))
                    }
                }
            }
            Err(MappingError::SchemaSubjectUnchecked {
                event_id,
                subject,
                version,
            }) => match registry.resolve(&subject, version).await {
                Ok(schema) => mapper.learn_subject(&subject, &schema),
                Err(e) if e.is_subjects_fault() => {
                    return Ok(Err(MappingError::SchemaUnavailable {
                        event_id,
                        reason: e.to_string(),
                    }))
                }
                Err(e) => return Err(unusable(&e)),
            },
            other => return Ok(other),
        }
    }
}

/// The newest `n` rows, oldest first, by the time column `outboxd
/// backfill` reads by (`outbox.columns.timestamp`, else `created_at`), then
/// storage order. Rows sharing the oldest time read are read whole, then
/// cut to `n`.
async fn newest_rows(
    client: &Client,
    t: &OutboxTable,
    n: usize,
) -> Result<Vec<OutboxEvent>, String> {
    let open = |since: String| {
        let opts = ReadOptions {
            since,
            until: None,
            time_column: None,
            batch: n.max(1),
        };
        async move {
            RowReader::open(client, t.table.schema(), t.table.name(), &t.columns, &opts)
                .await
                .map_err(|e| e.to_string())
        }
    };
    let probe = open("-infinity".to_owned()).await?;
    let column = crate::source::admin::quote_ident(probe.time_column());
    let table = format!(
        "{}.{}",
        crate::source::admin::quote_ident(t.table.schema()),
        crate::source::admin::quote_ident(t.table.name())
    );
    let sql = format!(
        "SELECT min(t)::text FROM (SELECT {column} AS t FROM {table} \
         ORDER BY {column} DESC LIMIT {n}) newest"
    );
    let since = client
        .query_one(&sql, &[])
        .await
        .map_err(|e| format!("reading the newest rows' time: {e}"))?
        .get::<_, Option<String>>(0);
    let Some(since) = since else {
        return Ok(Vec::new());
    };
    let mut reader = open(since).await?;
    let mut newest = VecDeque::with_capacity(n);
    loop {
        let page = reader.next_page(client).await.map_err(|e| e.to_string())?;
        if page.is_empty() {
            break;
        }
        for event in page {
            if newest.len() == n {
                newest.pop_front();
            }
            newest.push_back(event);
        }
    }
    Ok(newest.into())
}
