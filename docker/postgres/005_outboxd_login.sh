#!/bin/sh
# Runs once, when the postgres image initialises an empty data directory,
# after the migrations (001-004): gives the outboxd role its password and lets
# it open replication connections from the other containers.
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
  -v pw="$OUTBOXD_PG_PASSWORD" <<'SQL'
ALTER ROLE outboxd PASSWORD :'pw';
SQL
# The image allows "host all all all" but "all" does not cover replication.
echo "host replication outboxd all scram-sha-256" >>"$PGDATA/pg_hba.conf"
