-- examples/seed_outbox.sql: the polling-style ("seed") outbox table from the article, for
-- comparison and for tests. It is NOT applied by the migrations (only top-level files are).
--
-- A poller selects unpublished rows, publishes them, then sets published_at (or bumps attempts
-- and last_error on failure), so rows must be kept until published and cleaned up later.
-- outboxd does not need published_at / attempts / last_error: it reads inserts from the WAL.

CREATE TABLE IF NOT EXISTS public.outbox_seed (
    id             uuid         PRIMARY KEY DEFAULT gen_random_uuid(),
    aggregate_type varchar(255) NOT NULL,
    aggregate_id   uuid         NOT NULL,
    event_type     varchar(255) NOT NULL,
    payload        jsonb        NOT NULL,
    created_at     timestamptz  NOT NULL DEFAULT now(),
    published_at   timestamptz,
    attempts       int          NOT NULL DEFAULT 0,
    last_error     text
);

CREATE INDEX IF NOT EXISTS outbox_seed_unpublished_idx
    ON public.outbox_seed (created_at) WHERE published_at IS NULL;
