#!/bin/sh
# Entry point of the test PostgreSQL image: the part of the official postgres image's interface
# the compose file uses. POSTGRES_USER, POSTGRES_PASSWORD and POSTGRES_DB create the cluster on
# first start (an empty $PGDATA); password authentication over TCP. Like the official image, the
# first start runs a temporary server on the Unix socket only while it creates the database,
# so a health check that does not use TCP would pass too early (the compose file's uses -h).
set -eu
: "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}"
: "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD must be set}"
if [ "${1:-}" = postgres ] && [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
    initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pwfile" -E UTF8 --locale=C.UTF-8 \
        --auth-local=trust --auth-host=scram-sha-256 >/dev/null
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
    echo "listen_addresses = '*'" >>"$PGDATA/postgresql.conf"
    pg_ctl -D "$PGDATA" -o "-c listen_addresses=''" -w -t 60 start >/dev/null
    if [ "$POSTGRES_DB" != postgres ]; then
        psql -XAtq -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d postgres \
            -c "CREATE DATABASE \"$POSTGRES_DB\""
    fi
    pg_ctl -D "$PGDATA" -m fast -w -t 60 stop >/dev/null
    echo "postgres-start: cluster created for user $POSTGRES_USER, database $POSTGRES_DB"
fi
exec "$@"
