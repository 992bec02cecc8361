//! From the configuration file to the settings each component takes, so the
//! components do not depend on the file format.

use crate::config::postgres::PasswordSource;
use crate::config::{Config, ConfigError};
use crate::source::replication::ConnParams;
use crate::source::session::SourceSettings;
use crate::source::table::SourceTable;

pub fn source_settings(cfg: &Config) -> Result<SourceSettings, ConfigError> {
    let mut conn = ConnParams::from_url(&cfg.postgres.url)
        .map_err(|e| ConfigError::invalid("postgres.url", e.to_string()))?;
    if let Some(pw) = cfg.postgres.resolve_password()? {
        conn.password = Some(pw);
    }
    if let PasswordSource::File(path) = cfg.postgres.password_source() {
        conn.password_file = Some(path.to_owned());
    }
    if conn.connect_timeout.is_none() {
        conn.connect_timeout = Some(cfg.postgres.connect_timeout);
    }
    Ok(SourceSettings {
        conn,
        slot: cfg.postgres.slot.clone(),
        publication: cfg.postgres.publication.clone(),
        tables: cfg
            .tables()
            .into_iter()
            .map(|t| SourceTable {
                schema: t.table.schema().to_owned(),
                name: t.table.name().to_owned(),
                message_prefix: t.message_prefix,
            })
            .collect(),
        create_slot: cfg.postgres.create_slot,
        create_publication: cfg.postgres.create_publication,
        failover_slot: cfg.postgres.failover_slot,
        status_interval: cfg.postgres.status_interval,
    })
}
