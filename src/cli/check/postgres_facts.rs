//! What the PostgreSQL half of `outboxd check` reads, on one SQL
//! connection, before it decides anything: the server, the outbox table,
//! the publication and the slot. Both the PostgreSQL lines (`postgres`) and
//! the columns line (`columns`) are decided from it.

use crate::source::admin::{
    self, AdminError, PublicationFacts, ServerFacts, SlotInfo, SyncFacts, TableFacts, Target,
};

/// What one gathering found, for one outbox table's target.
pub(super) struct Facts {
    pub server: ServerFacts,
    pub table: Option<TableFacts>,
    pub publication: Option<PublicationFacts>,
    pub slot: Option<SlotInfo>,
    pub lag_bytes: Option<i64>,
    pub sync: Option<SyncFacts>,
}

/// Reads the facts, the server's and one outbox table's.
pub(super) async fn gather(
    client: &tokio_postgres::Client,
    t: &Target<'_>,
) -> Result<Facts, AdminError> {
    let server = admin::server_facts(client).await?;
    let table = admin::table_facts(client, t).await?;
    let publication = admin::publication_facts(client, t, server.version_num).await?;
    let slot = admin::slot_info(client, t.slot).await?;
    let lag_bytes = admin::slot_lag_bytes(client, t.slot).await?;
    let sync = if server.version_num >= admin::FAILOVER_SLOT_VERSION_NUM {
        Some(admin::sync_facts(client).await?)
    } else {
        None
    };
    Ok(Facts {
        server,
        table,
        publication,
        slot,
        lag_bytes,
        sync,
    })
}
