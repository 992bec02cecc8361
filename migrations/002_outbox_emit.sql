-- 002_outbox_emit.sql: outbox_emit(), one call per event, inside the caller's transaction.
--
--   SELECT outbox_emit('order', '42', 'OrderPlaced', '{"total": 10}'::jsonb);
--   SELECT outbox_emit('order', '42', 'OrderPlaced', '{"total": 10}'::jsonb,
--                      headers => '{"trace_id": "abc"}'::jsonb, keep => true);
--
-- It inserts into public.outbox and, unless keep is true, deletes the row again right away in
-- the same transaction: the INSERT is in the WAL, which is all outboxd needs (see 001_outbox.sql),
-- and the table does not grow. If the caller's transaction rolls back, nothing is relayed.
-- Returns the event id.
--
-- Idempotent: CREATE OR REPLACE.

CREATE OR REPLACE FUNCTION public.outbox_emit(
    aggregate_type text,
    aggregate_id   text,
    event_type     text,
    payload        jsonb,
    headers        jsonb   DEFAULT NULL,
    keep           boolean DEFAULT false
) RETURNS uuid
LANGUAGE plpgsql
VOLATILE
SET search_path = pg_catalog, public
AS $$
DECLARE
    new_id uuid;
BEGIN
    INSERT INTO public.outbox (aggregate_type, aggregate_id, event_type, payload, headers)
    VALUES (outbox_emit.aggregate_type, outbox_emit.aggregate_id, outbox_emit.event_type,
            outbox_emit.payload, outbox_emit.headers)
    RETURNING id INTO new_id;

    IF NOT keep THEN
        DELETE FROM public.outbox WHERE id = new_id;
    END IF;

    RETURN new_id;
END;
$$;

COMMENT ON FUNCTION public.outbox_emit(text, text, text, jsonb, jsonb, boolean) IS
    'Insert an outbox event (and delete it again in the same transaction unless keep); returns its id.';
