/* diagnose: why the claim floor is off, said so an operator can act on it.
 *
 * SQL_FLOOR_CHECK (statements.h) answers only yes or no: "{seq} is drawn in order from a sequence
 * the relay may read". When it says no, the start-up warning used to blame the column whatever the
 * cause; the usual cause is a missing grant (SELECT on the order column's sequence, which
 * `migrate` gives outbox_relay only when that role exists), or no table at all. This query looks at
 * each condition on its own and the function below turns the first one that fails into a sentence
 * with the statement that fixes it. `outbox-relay check` runs it; the relay can send it beside
 * SQL_FLOOR_CHECK and log its sentence in place of the generic one. */
#ifndef OUTBOX_DIAGNOSE_H
#define OUTBOX_DIAGNOSE_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>

#include "table.h"

/* Each condition of SQL_FLOOR_CHECK in a column of its own. to_regclass, not ::regclass, so a
 * missing table is an answer and not an error; the sequence is looked up only once the column is
 * known to exist (pg_get_serial_sequence raises on a missing column). The grantee proposed is
 * outbox_relay when the session's role is one of its members (the least-privileged setup of
 * migrations/0006), else the session's role itself. The table and the sequence come
 * schema-qualified and quoted (format %I.%I, not regclass's text, which leaves out a schema on the
 * session's search_path: the relay's is pinned to --schema, psql's is not), for the statements. */
#define DIAGNOSE_FLOOR_SQL                                                                         \
    "SELECT t.oid IS NOT NULL, c.relkind, a.attname IS NOT NULL, a.attidentity,"                   \
    " (SELECT pg_catalog.format('%I.%I', sn.nspname, sc.relname) FROM pg_catalog.pg_class sc"      \
    " JOIN pg_catalog.pg_namespace sn ON sn.oid = sc.relnamespace WHERE sc.oid = s.seq::oid),"     \
    " q.seqcache, q.seqcycle,"                                                                     \
    " CASE WHEN s.seq IS NOT NULL THEN pg_catalog.has_sequence_privilege(s.seq, 'SELECT, USAGE') " \
    "END,"                                                                                         \
    " current_user,"                                                                               \
    " CASE WHEN pg_catalog.to_regrole('outbox_relay') IS NOT NULL"                                 \
    " AND pg_catalog.pg_has_role(current_user, 'outbox_relay', 'MEMBER') THEN 'outbox_relay'"      \
    " ELSE pg_catalog.quote_ident(current_user) END,"                                              \
    " (SELECT pg_catalog.format('%I.%I', n.nspname, c.relname) FROM pg_catalog.pg_namespace n"     \
    " WHERE n.oid = c.relnamespace)"                                                               \
    " FROM (SELECT pg_catalog.to_regclass({table_text})::oid AS oid) t"                            \
    " LEFT JOIN pg_class c ON c.oid = t.oid"                                                       \
    " LEFT JOIN pg_attribute a ON a.attrelid = t.oid AND a.attname = {seq_text}"                   \
    " AND a.attnum > 0 AND NOT a.attisdropped"                                                     \
    " LEFT JOIN LATERAL (SELECT pg_catalog.pg_get_serial_sequence(t.oid::regclass::text, "         \
    "{seq_text})::regclass"                                                                        \
    " AS seq WHERE a.attname IS NOT NULL) s ON true"                                               \
    " LEFT JOIN pg_sequence q ON q.seqrelid = s.seq::oid"

/* A template for table_sql (placeholders {table_text}, {seq_text}): one row, never an error for a
 * missing table or column, and readable by any role (catalogs and has_*_privilege only). The
 * sessions send it as SQL_FLOOR_CHECK. */
extern const char *const diagnose_floor_sql;

/* Room for one identifier quoted by diagnose_quote_ident (every name of a TableMap is at most 63
 * bytes: each doubled quote and the two around it), and for a table's schema-qualified name. */
#define DIAGNOSE_IDENT_MAX (63 * 2 + 3)
#define DIAGNOSE_TABLE_MAX (DIAGNOSE_IDENT_MAX * 2)

/* Writes name into buf as an SQL identifier, as PostgreSQL's quote_ident would: as it is when it
 * is a lower-case word of [a-z0-9_] not starting with a digit and not a keyword PostgreSQL
 * reserves in any position, else between double quotes with each double quote doubled. For the
 * statements the messages suggest, which an operator pastes into psql: without a connection at
 * hand, so no PQescapeIdentifier. buf must hold DIAGNOSE_IDENT_MAX bytes (a longer name is cut
 * and then not valid SQL, but never overruns buf); returns buf. */
const char *diagnose_quote_ident(const char *name, char *buf, size_t buflen);

/* map's table as diagnose_quote_ident writes each part: "outbox", "app"."Outbox Events"; an
 * unqualified one qualified with schema when not NULL (--schema, which pins the relay's
 * search_path: the table is found there, and psql's search_path is another). buf must hold
 * DIAGNOSE_TABLE_MAX bytes; returns buf. */
const char *diagnose_quote_table(const TableMap *map, const char *schema, char *buf, size_t buflen);

/* Reads a result of diagnose_floor_sql for map's table. Returns true when the claim floor can be
 * on (the same answer as SQL_FLOOR_CHECK); otherwise false with one sentence in why naming the
 * cause and the statement that fixes it, names quoted as needed (no trailing newline). A result
 * that is not one row of the expected shape (the query failed) gives false and says so. */
bool diagnose_floor(const PGresult *res, const TableMap *map, char *why, size_t whylen);

#endif
