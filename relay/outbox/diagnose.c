#include "diagnose.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const diagnose_floor_sql = DIAGNOSE_FLOOR_SQL;

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
