/* migrate: applies the SQL files of migrations/, embedded into the binary at build time.
 *
 * Each file runs in its own transaction and is recorded in schema_migrations; an advisory lock
 * serialises concurrent migrators, so running migrate twice, or twice at once, is safe. This is a
 * one-shot command, not part of the relay's event loop, so it uses blocking libpq calls. */
#ifndef OUTBOX_MIGRATE_H
#define OUTBOX_MIGRATE_H

#include <stdbool.h>
#include <stddef.h>

#include <libpq-fe.h>

#include "db.h"
#include "table.h"

typedef struct MigrationFile {
    const char *name; /* file name, e.g. "0001_outbox.sql"; also the recorded version */
    const char *sql;
} MigrationFile;

/* Generated from the files in migrations/ by tools/embed-migrations.sh, in file-name order. */
extern const MigrationFile migration_files[];
extern const size_t migration_count;

/* Connects to conninfo and applies every migration not yet recorded, in schema (--schema: the
 * first of the pinned search_path, db.h), which must exist (else one error line, 1: objects would
 * go to pg_temp). When map names another
 * table than the relay's own, adopts that table instead: sets up the wakeup, adds the relay's
 * bookkeeping columns, indexes and wakeup trigger where missing (idempotent), and checks that
 * every mapped column exists. Then, on every run, gives the roles outbox_relay and
 * outbox_producer what they need on the table (grants.h: created when missing and the session
 * may), and reads it back. Every NOTICE and WARNING of the server is logged (stderr) with its
 * step. Connecting is retried for up to wait_s seconds (0: tried once), each attempt bounded by
 * connect_timeout (10 s unless conninfo sets a positive one). Every statement is given up when
 * PostgreSQL has not answered it within answer_s seconds (--migrate-timeout: a server that
 * stopped answering would otherwise hold migrate for ever). Returns 0 on success, 1 on failure,
 * including a role or grant that is missing afterwards (logged, one line saying what to create or
 * grant and how; passwords masked). A table already adopted gets no DDL again (migrate.c,
 * adoption_in_place), so its writers never wait behind migrate. With dry_run, says what it
 * would apply or adopt and, once none is pending, each grant a run would give and each role it
 * would create, and changes nothing (no DDL, no grant; 0 when it could read that). A
 * database whose schema_migrations records a migration this binary does not have (a newer
 * relay's) is refused, with or without dry_run: one line, nothing applied, no grant, 2; with
 * allow_newer (--allow-newer-schema, a rollback) a warning, nothing applied, no grant, 0. */
int migrate_run(const char *conninfo, const TableMap *map, const char *schema, long wait_s,
                long answer_s, bool dry_run, bool allow_newer);

/* How many migrations conn's schema_migrations records that this binary does not have (recorded
 * by a newer outbox-relay's migrate), the latest of them (in file-name order) copied to newest
 * when any. Only rows named as a migration file is (NNNN_name.sql) count: the adoptions'
 * "adopted ..." records are not migrations, nor are an application's own rows in a table it
 * shares with the relay (Rails' and dbmate's schema_migrations: one timestamp a row, version a
 * text column, so the relay's records went in beside them and worked; taken for a newer relay's,
 * every migrate of such a database was refused); nor the names of renamed migrations this binary
 * still knows (migrate.c's retired_migrations). -1 with e filled when the
 * read failed (schema_migrations missing or unreadable by the role, or no answer within
 * answer_s: e->conn_lost). Reads only. */
int migrate_unknown(PGconn *conn, long answer_s, char *newest, size_t len, DbError *e);

/* A table template (table_sql, table.h) that reads the catalogs only: one row for each index
 * name the relay gives the table's indexes that no index of the table holds ("another
 * relation's": missing, or another relation's) or that an index of the table holds with another
 * definition than the relay's ("another definition": its columns, uniqueness, predicate,
 * operator classes, collations or sort options), in columns: the name, which of the two, and
 * the definition expected. migrate refuses to adopt a table with such a row; check reports the
 * second kind. */
extern const char *const migrate_index_check_sql;

/* A statement template (relay/outbox/table.h) of the indexes the relay wants on the table that no
 * valid index of it serves, whatever its name (the relay's own table serves the order column's
 * uniqueness with its primary key; another of the same definition serves as well): in columns
 * the relay's name for it, the definition expected (as migrate_index_check_sql's), whether an
 * index of the table holds the name (with another definition, then), and which index it is: 1
 * the order column's unique one, 2 the unsent rows', 3 the failed rows', 4 the sent rows'. Reads
 * catalogs only. */
extern const char *const migrate_index_served_sql;

#endif
