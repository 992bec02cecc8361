-- 004_replication_role.sql: a least-privilege role for outboxd.
--
-- LOGIN REPLICATION lets it open a replication connection and create/use its logical replication
-- slot; it is not a superuser and owns nothing. It may read public.outbox (startup checks, any
-- snapshot of the table) and nothing else.
--
-- The password is set by the operator, never in this file:
--     \password outboxd              (psql)
--     ALTER ROLE outboxd PASSWORD '...';
-- pg_hba.conf must allow it both for the database ("host <db> outboxd ...") and for
-- replication connections ("host replication outboxd ...").
--
-- Creating a publication FOR TABLE needs ownership of the table, which this role does not have:
-- the admin applies 003_publication.sql and outboxd runs with create_publication = false. (The
-- alternative is to run outboxd as the owner of public.outbox.)
--
-- Idempotent: the role is created only if it is missing; the grants can be repeated. Roles are
-- cluster-wide, grants are per database: apply this file in each database that has an outbox.

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'outboxd') THEN
        CREATE ROLE outboxd LOGIN REPLICATION NOSUPERUSER NOCREATEDB NOCREATEROLE;
    END IF;
END
$$;

GRANT USAGE ON SCHEMA public TO outboxd;
GRANT SELECT ON TABLE public.outbox TO outboxd;
