-- 003_publication.sql: the publication outboxd subscribes to.
--
-- Inserts only: deletes of outbox rows (outbox_emit() deletes right away) are not relayed.
-- CREATE PUBLICATION ... FOR TABLE needs ownership of the table, so the admin (the owner of
-- public.outbox) applies this file; outboxd itself then runs with create_publication = false.
--
-- Idempotent: creates the publication only if it is missing (an existing one is left as it is).

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = 'outboxd') THEN
        CREATE PUBLICATION outboxd FOR TABLE public.outbox WITH (publish = 'insert');
    END IF;
END
$$;
