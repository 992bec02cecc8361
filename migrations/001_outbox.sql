-- 001_outbox.sql: the outbox table that outboxd relays to Kafka.
--
-- Write one row per event in the same transaction as the business change it describes
-- (directly, or through outbox_emit() from 002_outbox_emit.sql).
--
-- outboxd does not poll this table: it reads the INSERTs from the WAL through logical
-- replication (publication `outboxd`, 003_publication.sql). The row only has to exist long
-- enough to be written to the WAL, so it may be deleted right after the insert in the same
-- transaction (outbox_emit() does that by default) and the table stays empty. The publication
-- publishes inserts only, so such deletes are never relayed. No cleanup job is needed; rows that
-- are kept (keep => true, or plain INSERTs) can be deleted whenever convenient.
--
-- Idempotent: safe to apply again. gen_random_uuid() is built in since PostgreSQL 13.

CREATE TABLE IF NOT EXISTS public.outbox (
    id             uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    aggregate_type text        NOT NULL,
    aggregate_id   text        NOT NULL,
    event_type     text        NOT NULL,
    payload        jsonb       NOT NULL,
    headers        jsonb,
    created_at     timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE public.outbox IS
    'Transactional outbox relayed to Kafka by outboxd from the WAL; rows may be deleted right after insert.';
