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
    COL_QUALIFIED, /* the table, schema-qualified and quoted; NULL when it does not exist */
    N_COLS
};

/* The keywords quote_ident quotes (pg_get_keywords() of catcode R, C and T, PostgreSQL 15, and
 * those 16 and 17 added): unquoted, each is a syntax error or another meaning where a name goes.
 * The unreserved ones are names as they are. Quoting one that a server does not reserve is still
 * the same name, so a newer server's additions can only make a statement quote more. Each word
 * between spaces. */
static const char reserved[] =
    " all analyse analyze and any array as asc asymmetric authorization between bigint binary"
    " bit boolean both case cast char character check coalesce collate collation column"
    " concurrently constraint create cross current_catalog current_date current_role"
    " current_schema current_time current_timestamp current_user dec decimal default deferrable"
    " desc distinct do else end except exists extract false fetch float for foreign freeze from"
    " full grant greatest group grouping having ilike in initially inner inout int integer"
    " intersect interval into is isnull join json json_array json_arrayagg json_exists"
    " json_object json_objectagg json_query json_scalar json_serialize json_table json_value"
    " lateral leading least left like limit localtime localtimestamp merge_action national"
    " natural nchar none normalize not notnull null nullif numeric offset on only or order out"
    " outer overlaps overlay placing position precision primary real references returning right"
    " row select session_user setof similar smallint some substring symmetric system_user table"
    " tablesample then time timestamp to trailing treat trim true union unique user using"
    " values varchar variadic verbose when where window with xmlattributes xmlconcat xmlelement"
    " xmlexists xmlforest xmlnamespaces xmlparse xmlpi xmlroot xmlserialize xmltable ";

static bool needs_quotes(const char *name)
{
    if (!((*name >= 'a' && *name <= 'z') || *name == '_'))
        return true; /* also the empty name, which only quoted is one */
    for (const char *p = name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_'))
            return true;
    char word[DIAGNOSE_IDENT_MAX];
    if (strlen(name) + 3 > sizeof(word))
        return false; /* longer than any keyword */
    snprintf(word, sizeof(word), " %s ", name);
    return strstr(reserved, word) != NULL;
}

const char *diagnose_quote_ident(const char *name, char *buf, size_t buflen)
{
    if (buflen == 0)
        return buf;
    if (!needs_quotes(name)) {
        snprintf(buf, buflen, "%s", name);
        return buf;
    }
    size_t n = 0;
    buf[n++] = '"';
    for (const char *p = name; *p; p++) {
        /* Room is kept for the closing quote and the NUL. */
        if (n + (*p == '"' ? 2 : 1) + 2 > buflen)
            break;
        if (*p == '"')
            buf[n++] = '"';
        buf[n++] = *p;
    }
    if (n + 2 <= buflen)
        buf[n++] = '"';
    buf[n < buflen ? n : buflen - 1] = '\0';
    return buf;
}

const char *diagnose_quote_table(const TableMap *map, const char *schema, char *buf, size_t buflen)
{
    char quoted[DIAGNOSE_IDENT_MAX], name[DIAGNOSE_IDENT_MAX];
    const char *in = map->schema ? map->schema : schema;
    diagnose_quote_ident(map->name, name, sizeof(name));
    if (in)
        snprintf(buf, buflen, "%s.%s", diagnose_quote_ident(in, quoted, sizeof(quoted)), name);
    else
        snprintf(buf, buflen, "%s", name);
    return buf;
}

static bool is_true(const PGresult *res, int col)
{
    return !PQgetisnull(res, 0, col) && strcmp(PQgetvalue(res, 0, col), "t") == 0;
}

bool diagnose_floor(const PGresult *res, const TableMap *map, char *why, size_t whylen)
{
    /* Quoted as needed: the names go into the statements an operator is told to run. The table
     * (once it exists) and the sequence come schema-qualified and quoted from the server, the
     * grantee quoted (quote_ident). */
    char configured[DIAGNOSE_TABLE_MAX], seq[DIAGNOSE_IDENT_MAX];
    diagnose_quote_ident(map->seq, seq, sizeof(seq));
    if (!res || PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1 ||
        PQnfields(res) != N_COLS) {
        snprintf(why, whylen, "the claim floor's diagnosis failed: %s",
                 res ? PQresultErrorMessage(res) : "no result");
        why[strcspn(why, "\n")] = '\0';
        return false;
    }
    const char *table = PQgetisnull(res, 0, COL_QUALIFIED)
                            ? diagnose_quote_table(map, NULL, configured, sizeof(configured))
                            : PQgetvalue(res, 0, COL_QUALIFIED);
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
        snprintf(why, whylen, "the outbox table %s has no column %s (seq-column)", table, seq);
    else if (strcmp(PQgetvalue(res, 0, COL_IDENTITY), "d") == 0)
        /* ADD GENERATED ALWAYS would fail on it: it is an identity column already. */
        snprintf(why, whylen,
                 "the order column %s of %s is an identity column GENERATED BY DEFAULT, whose "
                 "values an INSERT or UPDATE may choose: ALTER TABLE %s ALTER COLUMN %s SET "
                 "GENERATED ALWAYS",
                 seq, table, table, seq);
    else if (strcmp(PQgetvalue(res, 0, COL_IDENTITY), "a") != 0 || PQgetisnull(res, 0, COL_CACHE))
        snprintf(why, whylen,
                 "the order column %s of %s is not an identity column GENERATED ALWAYS: "
                 "ALTER TABLE %s ALTER COLUMN %s ADD GENERATED ALWAYS AS IDENTITY (an existing "
                 "default must be dropped first)",
                 seq, table, table, seq);
    else if (strcmp(PQgetvalue(res, 0, COL_CACHE), "1") != 0)
        snprintf(why, whylen,
                 "the order column's sequence %s caches %s values per session, so ids are not "
                 "drawn in order: ALTER SEQUENCE %s CACHE 1",
                 sequence, PQgetvalue(res, 0, COL_CACHE), sequence);
    else if (is_true(res, COL_CYCLE))
        snprintf(why, whylen, "the order column's sequence %s cycles: ALTER SEQUENCE %s NO CYCLE",
                 sequence, sequence);
    else if (!is_true(res, COL_PRIVILEGE) &&
             strcmp(PQgetvalue(res, 0, COL_GRANTEE), "outbox_relay") == 0)
        snprintf(why, whylen,
                 "role %s may not read the order column's sequence %s: as its owner, GRANT SELECT "
                 "ON SEQUENCE %s TO outbox_relay (or run `outbox-relay migrate` again, which "
                 "grants it to outbox_relay)",
                 user, sequence, sequence);
    /* Not outbox_relay nor a member of it (the grantee is the role itself, quoted): what migrate
     * grants outbox_relay does not reach it, so running migrate again would not help. */
    else if (!is_true(res, COL_PRIVILEGE))
        snprintf(why, whylen,
                 "role %s may not read the order column's sequence %s: as its owner, GRANT SELECT "
                 "ON SEQUENCE %s TO %s (or make it a member of outbox_relay, to which "
                 "`outbox-relay migrate` grants it: GRANT outbox_relay TO %s)",
                 user, sequence, sequence, PQgetvalue(res, 0, COL_GRANTEE),
                 PQgetvalue(res, 0, COL_GRANTEE));
    else
        return true;
    return false;
}
