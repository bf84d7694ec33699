#include "diagnose.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Each condition of SQL_FLOOR_CHECK in a column of its own. to_regclass, not ::regclass, so a
 * missing table is an answer and not an error; the sequence is looked up only once the column is
 * known to exist (pg_get_serial_sequence raises on a missing column). The grantee proposed is
 * outbox_relay when the session's role is one of its members (the least-privileged setup of
 * migrations/0006), else the session's role itself. */
const char *const diagnose_floor_sql =
    "SELECT t.oid IS NOT NULL, c.relkind, a.attname IS NOT NULL, a.attidentity, s.seq::text,"
    " q.seqcache, q.seqcycle,"
    " CASE WHEN s.seq IS NOT NULL THEN has_sequence_privilege(s.seq, 'SELECT, USAGE') END,"
    " current_user,"
    " CASE WHEN to_regrole('outbox_relay') IS NOT NULL"
    " AND pg_has_role(current_user, 'outbox_relay', 'MEMBER') THEN 'outbox_relay'"
    " ELSE quote_ident(current_user) END"
    " FROM (SELECT to_regclass({table_text}) AS oid) t"
    " LEFT JOIN pg_class c ON c.oid = t.oid"
    " LEFT JOIN pg_attribute a ON a.attrelid = t.oid AND a.attname = {seq_text}"
    " AND a.attnum > 0 AND NOT a.attisdropped"
    " LEFT JOIN LATERAL (SELECT pg_get_serial_sequence(t.oid::regclass::text, {seq_text})::regclass"
    " AS seq WHERE a.attname IS NOT NULL) s ON true"
    " LEFT JOIN pg_sequence q ON q.seqrelid = s.seq";

enum {
    COL_TABLE,
    COL_RELKIND,
    COL_COLUMN,
    COL_IDENTITY,
    COL_SEQUENCE,
    COL_CACHE,
    COL_CYCLE,
    COL_PRIVILEGE,
    COL_USER,
    COL_GRANTEE,
    N_COLS
};

static bool is_true(const PGresult *res, int col)
{
    return !PQgetisnull(res, 0, col) && strcmp(PQgetvalue(res, 0, col), "t") == 0;
}

bool diagnose_floor(const PGresult *res, const TableMap *map, char *why, size_t whylen)
{
    char table[160];
    table_map_display(map, table, sizeof(table));
    if (!res || PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1 ||
        PQnfields(res) != N_COLS) {
        snprintf(why, whylen, "the claim floor's diagnosis failed: %s",
                 res ? PQresultErrorMessage(res) : "no result");
        why[strcspn(why, "\n")] = '\0';
        return false;
    }
    const char *user = PQgetvalue(res, 0, COL_USER);
    const char *sequence = PQgetvalue(res, 0, COL_SEQUENCE);
    if (!is_true(res, COL_TABLE))
        snprintf(why, whylen,
                 "the outbox table %s does not exist, or role %s may not see it (no USAGE on its "
                 "schema): run `outbox-relay migrate` as the database owner",
                 table, user);
    else if (strcmp(PQgetvalue(res, 0, COL_RELKIND), "r") != 0)
        snprintf(why, whylen,
                 "the outbox table %s is not a plain table (a partitioned one is locked per "
                 "partition): the claim floor needs a plain table",
                 table);
    else if (!is_true(res, COL_COLUMN))
        snprintf(why, whylen, "the outbox table %s has no column %s (seq-column)", table, map->seq);
    else if (strcmp(PQgetvalue(res, 0, COL_IDENTITY), "a") != 0 || PQgetisnull(res, 0, COL_CACHE))
        snprintf(why, whylen,
                 "the order column %s of %s is not an identity column GENERATED ALWAYS: "
                 "ALTER TABLE %s ALTER COLUMN %s ADD GENERATED ALWAYS AS IDENTITY (an existing "
                 "default must be dropped first)",
                 map->seq, table, table, map->seq);
    else if (strcmp(PQgetvalue(res, 0, COL_CACHE), "1") != 0)
        snprintf(why, whylen,
                 "the order column's sequence %s caches %s values per session, so ids are not "
                 "drawn in order: ALTER SEQUENCE %s CACHE 1",
                 sequence, PQgetvalue(res, 0, COL_CACHE), sequence);
    else if (is_true(res, COL_CYCLE))
        snprintf(why, whylen, "the order column's sequence %s cycles: ALTER SEQUENCE %s NO CYCLE",
                 sequence, sequence);
    else if (!is_true(res, COL_PRIVILEGE))
        snprintf(why, whylen,
                 "role %s may not read the order column's sequence %s: as its owner, GRANT SELECT "
                 "ON SEQUENCE %s TO %s (or run `outbox-relay migrate` again, which grants it to "
                 "outbox_relay)",
                 user, sequence, sequence, PQgetvalue(res, 0, COL_GRANTEE));
    else
        return true;
    return false;
}
